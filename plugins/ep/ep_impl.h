/* Private to the ep plugin: the expert-parallel rule for moe_experts (ep_dispatch.c). */
#ifndef EP_IMPL_H
#define EP_IMPL_H

#include "tessera/ops.h"

#define EP_DIM "ep"
#ifndef EP_NAME
#define EP_NAME "ep" /* the conformance tests build faulty copies under other names */
#endif

/* moe_experts on ep: x, combine, w13, w2 all Shard(0); the tokens go to the ranks that hold
 * their experts and come back. */
tsr_status ep_experts_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, tsr_dtensor **out, void **saved,
                              void *ctx);
tsr_status ep_experts_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                               const void *attrs, int nout, const tsr_dtensor *const *outs,
                               const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                               void *ctx);
void ep_experts_saved_free(void *p);

#endif
