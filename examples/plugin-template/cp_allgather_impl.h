/* Private to the cp_allgather plugin: its state and the attention rule. */
#ifndef CP_ALLGATHER_IMPL_H
#define CP_ALLGATHER_IMPL_H

#include <stdbool.h>

#include "tessera/ops.h"
#include "tessera/registry.h"

/* The mesh dim this plugin owns, under a name of its own. The model knows no dim by name:
 * register_rules declares that this one splits the sequence (tsr_registry_add_data_split with
 * Shard(1)), and the model places the token ids, the labels and the hidden states between
 * pipeline stages accordingly. So the plugin loads beside cp_ring and cp_ulysses, each on its own
 * dim. See README.md. */
#define AG_DIM "ag_cp"

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
