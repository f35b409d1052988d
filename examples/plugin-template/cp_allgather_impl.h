/* Private to the cp_allgather plugin: its state and the attention rule. */
#ifndef CP_ALLGATHER_IMPL_H
#define CP_ALLGATHER_IMPL_H

#include <stdbool.h>

#include "tessera/ops.h"
#include "tessera/registry.h"

/* The mesh dim this plugin owns. The Llama model splits the sequence of its inputs over the two
 * context-parallel dims it knows (ulysses_cp, ring_cp); all-gather attention is another way to
 * run attention on ring_cp, so the plugin owns that dim and cannot be loaded beside cp_ring
 * (the loader refuses two owners of one dim). See README.md. */
#define AG_DIM "ring_cp"

typedef struct ag_state {
  /* true: backward all-gathers K and V again instead of keeping the gathered copies from forward
   * (less memory per layer, one more all-gather of K and V) */
  bool regather;
} ag_state;

/* Attention with q, k, v (B, L, H, D) sequence-sharded on the plugin's dim: K and V are
 * all-gathered, each rank attends from its own queries, dK and dV are reduce-scattered back. */
tsr_status ag_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                           const void *attrs, int nout, tsr_dtensor **out, void **saved, void *ctx);
tsr_status ag_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                            const void *attrs, int nout, const tsr_dtensor *const *outs,
                            const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                            void *ctx);
void ag_sdpa_saved_free(void *saved);

#endif
