/* Private to the nccl backend: per-process and per-group state, and what the collectives
 * (nccl_coll.c) and point to point (nccl_p2p.c) share with the group code (nccl_group.c).
 *
 * The backend is the mpi backend plus NCCL. Its communicator wraps an mpi communicator (`inner`
 * below, built by tsr_mpi_comm_new), and each of its group handles wraps the inner handle on the
 * same ranks and label. Every call first goes through the mpi backend's arrival exchange on the
 * inner handle, which matches the calls of all members exactly as under backend = mpi; then host
 * buffers go through the mpi backend's own collective and device buffers through NCCL. */
#ifndef TESSERA_NCCL_BACKEND_H
#define TESSERA_NCCL_BACKEND_H

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "mpi_backend.h"
#include "tessera_cuda.h"
#include "tessera_nccl.h"

/* Nonblocking communicators (config.blocking, ncclInProgress, ncclCommGetAsyncError polling) are
 * what lets every wait time out; they came with 2.14. */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the nccl backend needs NCCL 2.14 or later"
#endif

/* A tag of the group's MPI communicator the mpi backend does not use: member 0's unique id. */
enum { TSR_NCCL_TAG_ID = 64 };

#define TSR_NCCL_MSG_LEN TSR_MPI_MSG_LEN

/* What one member's buffers are, as its peers learn it in the call descriptor. */
typedef enum nccl_mem {
  NCCL_MEM_NONE = 0, /* no buffer with elements: follows the others */
  NCCL_MEM_HOST,
  NCCL_MEM_DEVICE, /* device memory of this rank's GPU (or managed memory) */
  NCCL_MEM_BAD     /* host and device buffers in one call, or memory of another GPU */
} nccl_mem;

/* The functions of libtessera-cuda that order the backend's stream after the rank's kernels,
 * resolved from the copy the core loaded (nccl_group.c). */
typedef struct nccl_cuda_fns {
  tsr_cuda_ctx *(*current)(void);
  int (*device)(const tsr_cuda_ctx *ctx);
  void *(*comm_stream)(tsr_cuda_ctx *ctx);
  tsr_status (*comm_waits_compute)(tsr_cuda_ctx *ctx);
} nccl_cuda_fns;

/* The NCCL side of one rank list, shared by every label over it as the mpi group is. */
typedef struct nccl_shared {
  mpi_group *mg;   /* the mpi backend's state for the same list: seq, broken, descriptors */
  ncclComm_t comm; /* member i is NCCL rank i; NULL once aborted */
  int n, me;
  /* Device point to point: handshake words and requests, one slot per direction of a sendrecv. */
  uint64_t hdr[2][2], ack[2][3];
  mpi_xfer px[2];
} nccl_shared;

/* What a group handle of the nccl communicator points to (g->context). */
typedef struct nccl_handle {
  tsr_group_t *inner; /* the mpi communicator's handle on the same ranks and label */
  nccl_shared *sh;
} nccl_handle;

/* One process's state. */
typedef struct nccl_proc {
  tsr_comm_t *mpi; /* the inner communicator: control plane and host path */
  int rank, world;
  int device;          /* CUDA ordinal of this rank */
  cudaStream_t stream; /* used when no tessera CUDA context is current on the thread */
  cudaEvent_t order;   /* orders `stream` after the legacy default stream */
  nccl_shared **shared;
  int n_shared, cap_shared;
  void *cuda_lib; /* libtessera-cuda.so, once the core has loaded it */
  nccl_cuda_fns cuda;
  uint64_t device_calls; /* device collectives made on every group, for fault injection */
  int64_t fault_at;      /* test builds: stall at this device call (-1: never) */
  bool force_grouped;    /* test builds: even counts take the per-member path too */
} nccl_proc;

/* A device call in flight: the stream it was queued on, and what to call it in messages. */
typedef struct nccl_run {
  cudaStream_t stream;
  char what[512];
} nccl_run;

static inline nccl_handle *tsr_nccl_handle(const tsr_group_t *g) {
  return g->context;
}
static inline nccl_proc *tsr_nccl_proc(const tsr_group_t *g) {
  return g->comm->context;
}

/* ---- nccl_group.c ---- */

/* The iface's group_init: the inner mpi group (collective over the members under MPI), then, the
 * first time a rank list is seen, its NCCL communicator. */
tsr_status tsr_nccl_group_init(tsr_comm_t *c, tsr_group_t *g);
/* Frees the handle only: the shared state lives until tsr_nccl_comm_free. */
void tsr_nccl_group_free(tsr_group_t *g);
/* Finalises and destroys the NCCL communicator (aborts it when the group is broken). */
void tsr_nccl_shared_destroy(nccl_shared *sh, double timeout_s);

/* NCCL's names for a dtype and a reduction (avg is ncclAvg). */
ncclDataType_t tsr_nccl_dtype(tsr_dtype dt);
ncclRedOp_t tsr_nccl_op(tsr_reduce_op op);

/* What `bytes` at `ptr` are; a description for messages in what[len]. */
nccl_mem tsr_nccl_mem_of(const nccl_proc *p, const void *ptr, size_t bytes, char *what, size_t len);
/* The kind of a call's two buffers together (either may be NULL or empty); BAD when they
 * disagree, with the reason in detail[len]. */
nccl_mem tsr_nccl_buffers_mem(const nccl_proc *p, const void *send, size_t send_bytes,
                              const void *recv, size_t recv_bytes, char *detail, size_t len);
/* "host memory", "device memory", ... for messages. */
const char *tsr_nccl_mem_name(nccl_mem m);

/* The arrival of a collective: the mpi backend's exchange of call descriptors (tsr_mpi_arrive,
 * tsr_call_check) with this member's memory kind carried in a field the check ignores, then the
 * same verdict on every member: TSR_ECOMM naming the call when some member mixes host and device
 * buffers or host and device members meet; else *device says which path all members take. */
tsr_status tsr_nccl_arrive(tsr_group_t *g, const tsr_call *call, bool *device);

/* Before a device call is queued: this rank's stream, ordered after the kernels the thread queued
 * (the tessera CUDA context's comm stream waiting on its compute stream; with no context, the
 * backend's own stream waiting on the legacy default stream). A failure breaks the group. */
tsr_status tsr_nccl_begin(tsr_group_t *g, nccl_run *run);
/* After a device call was queued with result r: waits, polling ncclCommGetAsyncError and
 * cudaStreamQuery, for the transfer to complete, at most the communicator's timeout. A timeout
 * aborts the NCCL communicator, breaks the group and returns TSR_ETIMEDOUT; an NCCL or CUDA
 * error does the same with TSR_ECOMM. `fn` names the NCCL function for messages. */
tsr_status tsr_nccl_finish(tsr_group_t *g, const nccl_run *run, const char *fn, ncclResult_t r);
/* ncclGroupEnd, keeping the first error of the calls made inside the group. */
ncclResult_t tsr_nccl_group_end(ncclResult_t first);

/* Aborts the group's NCCL communicator, marks the mpi group broken (later calls, host or device,
 * fail at once) and sets msg, with file:line, as the last error. */
tsr_status tsr_nccl_fail_at(tsr_group_t *g, tsr_status st, const char *msg, const char *file,
                            int line);
#define TSR_NCCL_FAIL(g, st, msg) tsr_nccl_fail_at((g), (st), (msg), __FILE__, __LINE__)

/* Between two polls that found nothing (the mpi backend's spin, yield, sleep). */
static inline void tsr_nccl_backoff(int *spins) {
  tsr_mpi_backoff(spins);
}

/* ---- nccl_coll.c ---- */

tsr_status tsr_nccl_all_reduce(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_nccl_all_gather(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_nccl_reduce_scatter(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_nccl_all_to_all(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_nccl_broadcast(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_nccl_barrier(tsr_group_t *g, const tsr_call *call);

/* ---- nccl_p2p.c ---- */

tsr_status tsr_nccl_send(tsr_group_t *g, int peer, const void *buf, size_t count, tsr_dtype dt);
tsr_status tsr_nccl_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt);
tsr_status tsr_nccl_sendrecv(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                             int recv_peer, void *recv, size_t recv_count, tsr_dtype dt);

#endif
