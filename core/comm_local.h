/* Private to the local backend: the state shared by the threads of one tsr_local_launch.
 *
 * comm_local.c owns the world, the group table, the rendezvous and point to point;
 * comm_local_coll.c owns the data movement of each collective. */
#ifndef TESSERA_COMM_LOCAL_H
#define TESSERA_COMM_LOCAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "comm_impl.h"

#define TSR_LOCAL_MSG_LEN 1024

/* An all-reduce of `bytes` over n members takes the latency-optimal algorithm (every member reads
 * every peer's whole buffer: two rendezvous, n * bytes read per member) when bytes * (n - 1), the
 * data it pulls from its peers, is at most this; otherwise the bandwidth-optimal one (each member
 * reduces one chunk and writes it into every member's recv: two rendezvous on the host, three on
 * a device, bytes read and bytes written per member).
 * Scaling with n - 1 matches the measured crossover, which falls as the group grows (bench_comm,
 * docs/comm.md). Overridden by the environment variable TESSERA_LOCAL_SMALL_BYTES, read once per
 * launch. */
#define TSR_LOCAL_SMALL_BYTES_DEFAULT ((size_t)32 << 10)

/* A pending send, living on the sender's stack until the receiver marks it done. */
typedef struct local_msg {
  int from; /* member index of the sender */
  const void *buf;
  size_t count;
  tsr_dtype dt;
  int state; /* LOCAL_MSG_POSTED, _CLAIMED (receiver copying), _DONE */
  tsr_status status;
  char err[TSR_LOCAL_MSG_LEN];
  struct local_msg *next;
} local_msg;

enum { LOCAL_MSG_POSTED = 0, LOCAL_MSG_CLAIMED = 1, LOCAL_MSG_DONE = 2 };

/* One member's slot. `call`, `seq` and `stamp` are written by the member under the group mutex
 * and read by peers after the rendezvous; the scratch buffers are the member's alone. */
typedef struct local_member {
  tsr_call call;
  uint64_t seq;   /* collectives this member has entered */
  uint64_t stamp; /* generation + 1 of the rendezvous this member last arrived at */
  bool exited;    /* its rank function has returned */
  local_msg *inbox_head, *inbox_tail; /* sends addressed to this member, oldest first */
  void *scratch;
  size_t scratch_len;
  void *dev_scratch; /* from the rank's device allocator (tsr_comm_t.device_alloc) */
  size_t dev_scratch_len;
  const void **srcs; /* n pointers, for reductions */
  size_t *displs;    /* n + 1 prefix sums of this member's all_to_all send counts */
} local_member;

/* A group's shared state: one per distinct ordered rank list, owned by the world. */
typedef struct local_group {
  int n;
  int *ranks;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;        /* members at the current rendezvous */
  uint64_t gen;       /* completed rendezvous */
  tsr_status verdict; /* of the last arrival check, read by members after it */
  char verdict_msg[TSR_LOCAL_MSG_LEN];
  bool broken;
  tsr_status broken_status;
  char why[TSR_LOCAL_MSG_LEN];
  local_member *m;
  const tsr_call **calls; /* n, for the arrival check (under mu) */
  uint64_t *seqs;
} local_group;

typedef struct local_world local_world;

/* What the backend hangs on each rank's tsr_comm_t. */
typedef struct local_rank {
  local_world *w;
  int rank;
  tsr_comm_t *comm;
  pthread_t thread;
  bool started;
  tsr_rank_fn fn;
  void *arg;
  tsr_status status;
  char msg[2048];
  uint64_t failed_ns; /* when its error was written (tsr_last_error_ns), or it returned */
  /* Where the rank is, for a peer's timeout message: the collective it waits in (waiting) or
   * made last, with its caller's breadcrumb. Guarded by where_mu: peers read it. */
  pthread_mutex_t where_mu;
  tsr_call where;
  bool waiting, called;
} local_rank;

struct local_world {
  int world;
  double timeout_s;
  size_t small_bytes;
  pthread_mutex_t mu; /* the group table and `exited` */
  local_group **groups;
  int n_groups, cap_groups;
  bool *exited;
  local_rank *ranks;
};

/* The rendezvous every collective starts with: posts `call`, waits for every member (or the
 * timeout), and checks the calls against each other. */
tsr_status tsr_local_enter(tsr_group_t *g, const tsr_call *call);
/* A rendezvous inside a collective that every member has entered: waits for the others to finish
 * the current phase. Cannot time out, because the others are copying memory, not waiting. */
void tsr_local_sync(tsr_group_t *g);
/* This member's scratch of at least `bytes`. */
tsr_status tsr_local_scratch(tsr_group_t *g, size_t bytes, void **out);
/* The same in the rank's device memory; *out is NULL when the rank has no device allocator. */
tsr_status tsr_local_device_scratch(tsr_group_t *g, size_t bytes, void **out);

/* Waits for the calling member's queued work on the devices of `a` and `b` (either may be NULL or
 * host memory): before its buffers are posted to peers, and before a peer may reuse a buffer this
 * member copied from. */
tsr_status tsr_device_wait(const void *a, const void *b);

/* Data movement, in comm_local_coll.c. */
tsr_status tsr_local_all_reduce(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_local_all_gather(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_local_reduce_scatter(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_local_all_to_all(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_local_broadcast(tsr_group_t *g, const tsr_call *call);
tsr_status tsr_local_barrier(tsr_group_t *g, const tsr_call *call);

static inline local_group *tsr_local_group(const tsr_group_t *g) {
  return (local_group *)g->context;
}
static inline local_world *tsr_local_world(const tsr_group_t *g) {
  return ((local_rank *)g->comm->context)->w;
}

#endif
