/* Communicator: the collectives every backend (local, mpi, nccl) provides.
 *
 * A tsr_comm_t is one rank's handle on the job's communicator. Collectives run on a group: an
 * ordered set of global ranks (typically the ranks that share every mesh coordinate but those of
 * one dim, see tsr_mesh_group). Each rank holds its own tsr_group_t for a group; all members call
 * the same collectives on it in the same order.
 *
 * Every call is checked against its peers: operation, dtype, element counts and the group's
 * sequence number. A mismatch is an error (TSR_ECOMM) on every member, naming both calls. A wait
 * longer than the communicator's timeout is TSR_ETIMEDOUT, listing the ranks that never arrived;
 * the group is then broken and later calls on it fail at once. A hang is a bug.
 *
 * Buffers are host memory for the CPU backends. `send` and `recv` may alias (in place) where the
 * call says so.
 *
 * Byte counters. Each call adds to the calling rank's counter for the group's label the bytes a
 * direct algorithm must send from this rank, whatever algorithm the backend uses, so that the
 * counters are comparable across backends and against analytic minima:
 *   all_reduce     (total - own chunk) + own chunk * (n - 1), own chunk from tsr_chunk_size
 *                  over the element count, i.e. 2 (n-1)/n * bytes when n divides the count
 *   all_gather     own contribution * (n - 1)
 *   reduce_scatter total - own chunk
 *   all_to_all     sum of send counts to the other members
 *   broadcast      root: bytes * (n - 1); others: 0
 *   send           bytes; sendrecv: the bytes it sends
 *   barrier        0
 * A group of one member moves nothing and counts nothing.
 */
#ifndef TESSERA_COMM_H
#define TESSERA_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tsr_reduce_op {
  TSR_REDUCE_SUM = 0,
  TSR_REDUCE_AVG = 1,
  TSR_REDUCE_MAX = 2
} tsr_reduce_op;

TSR_API const char *tsr_reduce_op_name(tsr_reduce_op op); /* "sum", "avg", "max" */

typedef struct tsr_comm_t tsr_comm_t;   /* one rank's communicator handle */
typedef struct tsr_group_t tsr_group_t; /* one rank's handle on a group; owned by its comm */

/* Size of chunk `i` of `n` when `total` elements are split as torch.chunk does: chunks of
 * ceil(total / n), the trailing ones shorter or empty (5 over 4 -> 2, 2, 1, 0). */
TSR_API int64_t tsr_chunk_size(int64_t total, int n, int i);
/* Start of chunk `i` under the same split. */
TSR_API int64_t tsr_chunk_start(int64_t total, int n, int i);

TSR_API int tsr_comm_rank(const tsr_comm_t *c);            /* global rank id of this handle */
TSR_API int tsr_comm_world(const tsr_comm_t *c);           /* number of ranks in the job */
TSR_API const char *tsr_comm_backend(const tsr_comm_t *c); /* "local", "mpi", ... */

/* The group of `n` global ranks `ranks` (in group order; the caller must be one of them).
 * `label` names what the group spans, e.g. "tp" or "dp+tp"; byte counters are kept per label.
 * Not collective: every member calls it with the same list and gets its own handle to the same
 * group. The same list (and label) returns the same handle; another label over the same list is
 * another handle on the same group, counting bytes under its own label. */
TSR_API tsr_status tsr_comm_group(tsr_comm_t *c, int n, const int *ranks, const char *label,
                                  tsr_group_t **out);
TSR_API int tsr_group_size(const tsr_group_t *g);
TSR_API int tsr_group_index(const tsr_group_t *g);       /* this rank's position in the group */
TSR_API int tsr_group_rank(const tsr_group_t *g, int i); /* global rank of member i */
TSR_API const char *tsr_group_label(const tsr_group_t *g);

/* recv[k] = op over members of send[k], k < count. In place allowed. */
TSR_API tsr_status tsr_comm_all_reduce(tsr_group_t *g, const void *send, void *recv, size_t count,
                                       tsr_dtype dt, tsr_reduce_op op);
/* Member i contributes counts[i] elements; recv is their concatenation in member order.
 * counts == NULL means every member contributes `send_count`. */
TSR_API tsr_status tsr_comm_all_gather(tsr_group_t *g, const void *send, size_t send_count,
                                       void *recv, const size_t *counts, tsr_dtype dt);
/* send holds sum(counts) elements, chunk i (counts[i] elements) destined for member i; this
 * member receives the reduction of every member's chunk index(self). counts == NULL: even split of
 * `recv_count * n`. */
TSR_API tsr_status tsr_comm_reduce_scatter(tsr_group_t *g, const void *send, void *recv,
                                           size_t recv_count, const size_t *counts, tsr_dtype dt,
                                           tsr_reduce_op op);
/* send is the concatenation of send_counts[j] elements for each member j; recv receives the
 * concatenation of recv_counts[j] elements from each member j. Member i's send_counts[j] must
 * equal member j's recv_counts[i] (checked). */
TSR_API tsr_status tsr_comm_all_to_all(tsr_group_t *g, const void *send, const size_t *send_counts,
                                       void *recv, const size_t *recv_counts, tsr_dtype dt);
/* buf on member `root` (a member index) is copied to every member's buf. */
TSR_API tsr_status tsr_comm_broadcast(tsr_group_t *g, void *buf, size_t count, tsr_dtype dt,
                                      int root);
/* Point-to-point between members of a group, matched in order per (sender, receiver) pair.
 * Peers are member indices in g (0 ..< tsr_group_size), not global ranks. Count and dtype must
 * match on both sides (else TSR_ECOMM on both). send may block until the receive is posted: ring
 * exchanges use sendrecv, which may name this member on both sides (a local copy). */
TSR_API tsr_status tsr_comm_send(tsr_group_t *g, int peer, const void *buf, size_t count,
                                 tsr_dtype dt);
TSR_API tsr_status tsr_comm_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt);
TSR_API tsr_status tsr_comm_sendrecv(tsr_group_t *g, int send_peer, const void *send,
                                     size_t send_count, int recv_peer, void *recv,
                                     size_t recv_count, tsr_dtype dt);
TSR_API tsr_status tsr_comm_barrier(tsr_group_t *g);

/* Bytes this rank has sent under `label` since the last reset (0 for an unknown label). */
TSR_API uint64_t tsr_comm_bytes(const tsr_comm_t *c, const char *label);
/* Calls fn for each label with a counter on this rank. */
TSR_API void tsr_comm_bytes_foreach(const tsr_comm_t *c,
                                    void (*fn)(const char *label, uint64_t bytes, void *arg),
                                    void *arg);
TSR_API void tsr_comm_bytes_reset(tsr_comm_t *c);

/* ---- The `local` backend: ranks are threads of this process. ---- */

/* Body of one rank. Runs on its own thread with its own tsr_comm_t (valid for the call). */
typedef tsr_status (*tsr_rank_fn)(tsr_comm_t *comm, void *arg);

/* The most ranks tsr_local_launch starts: they are threads of one process. */
#define TSR_LOCAL_MAX_RANKS 1024

/* Starts `world` threads (1 ..= TSR_LOCAL_MAX_RANKS), runs fn on each with its rank's
 * communicator and joins them. Collectives wait at most `timeout_s` seconds. Returns TSR_OK when
 * every rank returned TSR_OK; otherwise the status of the rank whose error was written first (the
 * cause: its peers fail after it returns), with the calling thread's last error set to "rank R:
 * <that rank's message>" and, when other ranks failed too, a second line "  then ranks ... failed
 * after it" with the first of their messages that differs (ties in time go to the lower rank). Each
 * rank's thread starts with its breadcrumb's rank set (tessera/breadcrumb.h). */
TSR_API tsr_status tsr_local_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif
