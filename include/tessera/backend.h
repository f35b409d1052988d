/* What a communicator backend calls in libtessera.
 *
 * The `local` backend lives in the core; `mpi` and `nccl` are separate libraries
 * (libtessera-mpi.so, libtessera-nccl.so) that the core reaches through dlopen, so the few core
 * functions they call must be exported. They are declared here and nowhere else.
 *
 * The structs these functions take, tsr_comm_iface (the backend's entry points) and tsr_call (one
 * member's view of one collective), are defined by the core's private comm_impl.h, not here:
 * their layouts carry no ABI promise, so a backend is built in the same tree as the core it runs
 * against. Plugins and applications never need this header; comm.h is their interface.
 */
#ifndef TESSERA_BACKEND_H
#define TESSERA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "tessera/comm.h"
#include "tessera/export.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_comm_iface tsr_comm_iface; /* defined in the core's comm_impl.h */
typedef struct tsr_call tsr_call;             /* defined in the core's comm_impl.h */

/* A communicator for `rank` of `world` over `iface`. `context` stays owned by the backend. */
TSR_API tsr_status tsr_comm_create(const tsr_comm_iface *iface, void *context, int rank, int world,
                                   double timeout_s, tsr_comm_t **out);
/* Frees the comm, its group handles (through iface->group_free) and its counters. */
TSR_API void tsr_comm_destroy(tsr_comm_t *c);

/* "all_reduce(f32, 1024, sum)" into buf for a group of n members. Returns buf. */
TSR_API const char *tsr_call_format(const tsr_call *call, int n, char *buf, size_t len);

/* "[0,1,2,3]" into buf, elided in the middle for long lists. Returns buf. */
TSR_API const char *tsr_ranks_format(int n, const int *ranks, char *buf, size_t len);

/* Compares every member's call (calls[i], seqs[i]: member i's call and sequence number) and
 * returns TSR_OK, or TSR_ECOMM with the message that every member must report written to msg:
 * the group, the sequence number and the first disagreeing pair of calls. */
TSR_API tsr_status tsr_call_check(const tsr_group_t *g, const tsr_call *const *calls,
                                  const uint64_t *seqs, char *msg, size_t len);

#ifdef __cplusplus
}
#endif
#endif
