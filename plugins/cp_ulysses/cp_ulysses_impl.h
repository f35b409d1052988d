/* Private to the cp_ulysses plugin. */
#ifndef CP_ULYSSES_IMPL_H
#define CP_ULYSSES_IMPL_H

#include "tessera/device.h"
#include "tessera/ops.h"

#define ULYSSES_DIM "ulysses_cp"

/* Attention on q, k, v (B, L, H, D) sequence-sharded on the Ulysses dim. */
tsr_status ulysses_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                                const void *attrs, int nout, tsr_dtensor **out, void **saved,
                                void *ctx);
tsr_status ulysses_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                                 const void *attrs, int nout, const tsr_dtensor *const *outs,
                                 const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                                 void *ctx);
void ulysses_sdpa_saved_free(void *p);

#endif
