/* Internal to the tp plugin: its state and the communicating rules of tp_loss.c, tp_attention.c
 * and tp_linear.c. Every rule here runs on the `tp` mesh dim; `dim` is its index in the mesh. */
#ifndef TESSERA_PLUGIN_TP_IMPL_H
#define TESSERA_PLUGIN_TP_IMPL_H

#include <stdbool.h>

#include "tessera/ops.h"
#include "tessera/plugin.h"

/* One job's settings, decided once from the job file. */
typedef struct tp_state {
  bool loss_parallel; /* [strategy.tp] loss_parallel */
  bool kv_replicated; /* tp > num_key_value_heads: every rank keeps every kv head's weights */
  bool sp;            /* the job also loads sp, which places the norm regions */
} tp_state;

/* Checks that on every mesh dim but `dim` the inputs of a rule (the first `n`) agree and are
 * Replicate or Shard of a dim below `max_shard_dim`, which is what the rules' local math supports
 * beside tp (data parallel batches, sequence shards where allowed). Names the rule and dim. */
tsr_status tp_check_other_dims(const char *rule, int dim, int n, const tsr_dtensor *const *in,
                               int max_shard_dim);

/* cross_entropy on vocabulary-sharded logits (S(2), labels R): the vocabulary-parallel loss, or
 * with loss_parallel = false the logits gathered first. */
tsr_status tp_loss_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                           const void *attrs, int nout, tsr_dtensor **out, void **saved, void *ctx);
tsr_status tp_loss_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                            const void *attrs, int nout, const tsr_dtensor *const *outs,
                            const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                            void *ctx);
void tp_loss_saved_free(void *saved);

/* sdpa with q split by heads (S(2)) and k, v replicated: each rank attends with the one kv head
 * its query heads read. */
tsr_status tp_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                           const void *attrs, int nout, tsr_dtensor **out, void **saved, void *ctx);
tsr_status tp_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                            const void *attrs, int nout, const tsr_dtensor *const *outs,
                            const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                            void *ctx);
void tp_sdpa_saved_free(void *saved);

/* linear with a replicated input and a weight split along its input dim (S(1)): the tied lm_head,
 * whose weight the embedding style placed. Each rank multiplies its slice of the input. */
tsr_status tp_linear_in_split_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                                      const void *attrs, int nout, tsr_dtensor **out, void **saved,
                                      void *ctx);
tsr_status tp_linear_in_split_backward(tsr_rank_t *r, int dim, int nin,
                                       const tsr_dtensor *const *in, const void *attrs, int nout,
                                       const tsr_dtensor *const *outs,
                                       const tsr_dtensor *const *gout, tsr_dtensor **gin,
                                       void *saved, void *ctx);
void tp_linear_saved_free(void *saved);

/* This rank's index along mesh dim `dim` of x's mesh. */
int tp_coord(tsr_rank_t *r, const tsr_dtensor *x, int dim);

#endif
