/* Private: the interface a communicator backend implements, and the handles the front owns.
 *
 * Kept out of include/tessera/ on purpose. Every backend (local here, mpi and nccl under
 * backends/) is built in this tree against this exact header, so the struct layouts below can
 * change without an ABI promise; plugins and users see only the opaque handles of comm.h. The
 * core functions a backend library calls are exported and declared in tessera/backend.h. If a
 * backend ever has to build out of tree, the layouts move there too, with an abi version field
 * at the head of tsr_comm_iface.
 *
 * Split of work. The front (comm.c) checks arguments, turns a NULL count array into an explicit
 * one, short-cuts groups of one member, counts bytes and hands the backend a tsr_call that
 * fully describes the call. The backend matches the call against its peers' (tsr_call_check
 * below does the comparison and writes the message every backend should report), moves the
 * data, and enforces the timeout.
 */
#ifndef TESSERA_COMM_IMPL_H
#define TESSERA_COMM_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/backend.h"
#include "tessera/breadcrumb.h"
#include "tessera/comm.h"

typedef enum tsr_coll {
  TSR_COLL_ALL_REDUCE = 0,
  TSR_COLL_ALL_GATHER,
  TSR_COLL_REDUCE_SCATTER,
  TSR_COLL_ALL_TO_ALL,
  TSR_COLL_BROADCAST,
  TSR_COLL_BARRIER,
  TSR_COLL_COUNT
} tsr_coll;

/* One member's view of one collective call: what peers compare, and where the data is. Count
 * arrays have one entry per member and stay valid for the duration of the call. */
struct tsr_call {
  tsr_coll kind;
  tsr_dtype dt;
  tsr_reduce_op op;          /* all_reduce, reduce_scatter */
  int root;                  /* broadcast: member index of the root */
  size_t count;              /* all_reduce, broadcast: elements */
  const size_t *counts;      /* all_gather, reduce_scatter: per member; all_to_all: send */
  const size_t *recv_counts; /* all_to_all */
  const void *send;
  void *recv; /* broadcast: the buffer */
  /* Where the caller was, for mismatch messages: its handle's label and its thread's breadcrumb
   * (the plugin callback or op it ran). Not compared; a backend that moves calls between
   * processes may leave them zero. */
  const char *label;
  tsr_breadcrumb crumb;
};

/* " in plugin P, optimizer hook H (before step), step 2": what the caller of `call` was running,
 * as mismatch messages give it; "" for a call that carries no breadcrumb. */
const char *tsr_call_where(const tsr_call *call, char *buf, size_t len);

/* Backend entry points. Called only for groups of two or more members with arguments already
 * checked. On failure the backend leaves the message in this thread's last error. */
struct tsr_comm_iface {
  const char *name; /* "local", "mpi", ... */
  /* Attaches the backend's state for the group to g->context. Not collective. */
  tsr_status (*group_init)(tsr_comm_t *c, tsr_group_t *g);
  /* Releases what group_init attached to this handle (may be NULL). */
  void (*group_free)(tsr_group_t *g);
  tsr_status (*all_reduce)(tsr_group_t *g, const tsr_call *call);
  tsr_status (*all_gather)(tsr_group_t *g, const tsr_call *call);
  tsr_status (*reduce_scatter)(tsr_group_t *g, const tsr_call *call);
  tsr_status (*all_to_all)(tsr_group_t *g, const tsr_call *call);
  tsr_status (*broadcast)(tsr_group_t *g, const tsr_call *call);
  tsr_status (*barrier)(tsr_group_t *g, const tsr_call *call);
  /* Point to point; peers are member indices, never this member. */
  tsr_status (*send)(tsr_group_t *g, int peer, const void *buf, size_t count, tsr_dtype dt);
  tsr_status (*recv)(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt);
  tsr_status (*sendrecv)(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                         int recv_peer, void *recv, size_t recv_count, tsr_dtype dt);
  /* Optional. True when the backend moves device memory itself. Otherwise the front stages a
   * call whose buffers are device memory through host copies around the backend's call. */
  bool device_memory;
  /* Optional. Frees the device memory the backend holds for this member (scratch made from
   * c->device_alloc), before that allocator is released. */
  void (*release_device)(tsr_comm_t *c);
};

typedef struct tsr_comm_counter {
  char *label;
  uint64_t bytes;
} tsr_comm_counter;

struct tsr_comm_t {
  const tsr_comm_iface *iface;
  void *context; /* backend's per-rank state */
  int rank;
  int world;
  double timeout_s;
  tsr_group_t **groups; /* handles made by tsr_comm_group, freed with the comm */
  int n_groups, cap_groups;
  tsr_comm_counter *counters;
  int n_counters, cap_counters;
  /* The rank's device allocator, for a backend's device scratch (the local backend's in-place
   * sums); NULL while the rank is on the CPU. Set and cleared by the rank (core/rank.c). */
  tsr_allocator *device_alloc;
};

/* Gives the backend the allocator of the rank's device (NULL: none, after releasing what the
 * backend made from the previous one). Called on the rank's thread. */
void tsr_comm_set_device_allocator(tsr_comm_t *c, tsr_allocator *a);

struct tsr_group_t {
  tsr_comm_t *comm;
  int n;
  int index; /* this rank's position */
  int *ranks;
  char *label;
  int counter;   /* index into comm->counters */
  void *context; /* backend's state for the group */
};

/* tsr_comm_create and tsr_comm_destroy: tessera/backend.h. */

/* Host copies of a call's device buffers (comm_stage.c), for backends without device_memory. */
typedef struct tsr_stage {
  void *send_host, *recv_host; /* one buffer when the call is in place */
  void *recv_device;           /* where recv_host goes back to */
  size_t recv_bytes;
} tsr_stage;

/* When the backend moves host memory only and *send or *recv is device memory, points them at
 * host copies (the send side filled). Otherwise changes nothing. Either may be NULL with 0 bytes.
 */
tsr_status tsr_stage_begin(const tsr_group_t *g, const void **send, size_t send_bytes, void **recv,
                           size_t recv_bytes, tsr_stage *s);
/* After the backend's call: copies the received bytes back to the device when `st` is TSR_OK,
 * frees the host copies, and returns `st`. */
tsr_status tsr_stage_end(tsr_stage *s, tsr_status st);

const char *tsr_coll_name(tsr_coll kind);

/* tsr_call_format, tsr_ranks_format and tsr_call_check: tessera/backend.h. */

#endif
