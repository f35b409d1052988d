/* Private to the mpi backend: per-process and per-group state, and the transfer helpers the
 * collectives (mpi_coll.c) share with the group and point-to-point code (mpi_comm.c).
 *
 * The backend includes core/comm_impl.h, the private vtable of the core, because it is built in
 * this tree against that exact header (see docs/mpi.md); only the opaque handles of comm.h are
 * public. */
#ifndef TESSERA_MPI_BACKEND_H
#define TESSERA_MPI_BACKEND_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm_impl.h"
#include "tessera_mpi.h"

/* Tags on a group's communicator. Each phase of a call has its own tag, so that a fast member's
 * messages for a later phase can never match a slow member's receive for an earlier one. */
enum {
  TSR_MPI_TAG_ARRIVE = 1, /* call descriptors */
  TSR_MPI_TAG_DATA_A,     /* first data phase of a collective */
  TSR_MPI_TAG_DATA_B,     /* second data phase (all_reduce's gather) */
  TSR_MPI_TAG_P2P_HDR,    /* send -> recv: count and dtype */
  TSR_MPI_TAG_P2P_ACK,    /* recv -> send: verdict */
  TSR_MPI_TAG_P2P_DATA,   /* the payload */
  TSR_MPI_TAG_CREATE,     /* group creation handshake, on the world control communicator */
};

#define TSR_MPI_MSG_LEN 1024
/* Words at the end of each call descriptor for the caller's whereabouts (mpi_comm.c). */
#define TSR_MPI_CRUMB_WORDS 48

/* A set of outstanding requests, each with the member it talks to (for the messages). */
typedef struct mpi_xfer {
  MPI_Request *req;
  int *peer;
  int *idx; /* MPI_Testsome's output */
  int n, cap;
  int active; /* requests not yet complete */
} mpi_xfer;

/* One group's state, shared by every handle (label) on the same rank list. */
typedef struct mpi_group {
  int n, me;
  int *ranks;
  MPI_Comm comm; /* member index == rank in comm */
  uint64_t seq;  /* collectives made on the group */
  tsr_call cur;  /* the collective in progress and its sequence number, for messages */
  uint64_t cur_seq;
  bool broken;
  tsr_status broken_status;
  char why[TSR_MPI_MSG_LEN];
  /* Call descriptors: this member's (desc_words words) and every member's (n * desc_words);
   * the last TSR_MPI_CRUMB_WORDS of each are the caller's whereabouts as text. */
  size_t desc_words;
  uint64_t *desc_out, *desc_in;
  tsr_call *calls; /* decoded descriptors */
  const tsr_call **call_ptrs;
  uint64_t *seqs;
  size_t *call_counts; /* 2 n per member */
  /* Point to point: headers and acks of at most two transfers at once (sendrecv). */
  uint64_t p2p_hdr[2][2], p2p_ack[2][3];
  void *scratch;
  size_t scratch_len;
  mpi_xfer x;     /* the collectives' requests */
  mpi_xfer px[2]; /* point to point: one per direction of a sendrecv */
} mpi_group;

/* One process's state. */
typedef struct mpi_proc {
  int rank, world;
  double timeout_s;
  MPI_Comm ctl; /* duplicate of MPI_COMM_WORLD for the group handshakes */
  mpi_group **groups;
  int n_groups, cap_groups;
  uint64_t calls;   /* collectives made on every group, for fault injection */
  int64_t fault_at; /* fault injection: fail at this call (-1: never) */
  bool fault_kill;  /* die (else hang) */
} mpi_proc;

static inline mpi_group *tsr_mpi_group(const tsr_group_t *g) {
  return g->context;
}

/* ---- mpi_comm.c ---- */

/* The iface's group_init: finds or creates (collectively over the members) the group's state. */
tsr_status tsr_mpi_group_init(tsr_comm_t *c, tsr_group_t *g);
/* Frees a group's state, unless it is broken (its requests may still be pending). */
void tsr_mpi_group_destroy(mpi_group *mg);

/* Marks the group broken (later calls fail at once) and sets `why` as the last error. */
tsr_status tsr_mpi_break(mpi_group *mg, tsr_status st, const char *why);

/* The group's error for a call on a broken group. */
tsr_status tsr_mpi_broken_error(const tsr_group_t *g, const char *what);

/* Exchanges call descriptors with every member, waits for all of them up to the timeout and
 * checks them with tsr_call_check. On return TSR_OK every member is in the same call. */
tsr_status tsr_mpi_arrive(tsr_group_t *g, const tsr_call *call);

/* Scratch of at least `bytes` for this group; allocate before arriving. */
tsr_status tsr_mpi_scratch(tsr_group_t *g, size_t bytes, void **out);

/* Posts a send or receive of `bytes` with member `peer` on the group's communicator (split into
 * pieces MPI's int counts can hold). */
tsr_status tsr_mpi_post(tsr_group_t *g, mpi_xfer *x, bool send, int peer, void *buf, size_t bytes,
                        int tag);
tsr_status tsr_mpi_post_on(MPI_Comm comm, mpi_xfer *x, bool send, int peer, void *buf, size_t bytes,
                           int tag);
/* Polls x once: the MPI code, and whether a request completed. */
int tsr_mpi_xfer_test(mpi_xfer *x, bool *progress);
/* Cancels or releases x's pending requests and empties it. */
void tsr_mpi_xfer_abandon(mpi_xfer *x);
void tsr_mpi_xfer_free(mpi_xfer *x);
/* "rank 2" or "ranks 1, 3": ranks[peer] of the pending requests' peers. */
void tsr_mpi_xfer_pending(const mpi_xfer *x, int n, const int *ranks, char *buf, size_t len);
/* Between two polls that found nothing: spin, then yield, then sleep. */
void tsr_mpi_backoff(int *spins);
void tsr_mpi_error_string(int rc, char *buf, size_t len);

/* Waits for every request of x, at most the communicator's timeout. On a timeout or an MPI error
 * the group is broken and the message reads "<call> timed out after T s: rank R <verb>", the
 * ranks being the members whose requests are still pending. Empties x either way. */
tsr_status tsr_mpi_wait(tsr_group_t *g, mpi_xfer *x, const char *verb);

/* dst[i] = op over members k = 0 .. n-1 (in that order) of srcs[k][i], i < len. Accumulates in f32
 * for floats and in wrapping 64 bits for integers, as the local backend does, so both backends
 * give bit-identical results. dst may alias srcs[k] for one k. */
void tsr_mpi_reduce(int n, const void *const *srcs, size_t len, tsr_dtype dt, tsr_reduce_op op,
                    void *dst);

/* ---- mpi_p2p.c ---- */

tsr_status tsr_mpi_send(tsr_group_t *g, int peer, const void *buf, size_t count, tsr_dtype dt);
tsr_status tsr_mpi_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt);
tsr_status tsr_mpi_sendrecv(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                            int recv_peer, void *recv, size_t recv_count, tsr_dtype dt);

/* ---- mpi_coll.c ---- */

tsr_status tsr_mpi_all_reduce(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_mpi_all_gather(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_mpi_reduce_scatter(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_mpi_all_to_all(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_mpi_broadcast(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_mpi_barrier(tsr_group_t *g, const tsr_call *call);

#endif
