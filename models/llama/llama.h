/* Llama, with Hugging Face LlamaForCausalLM semantics, written once against the public API.
 *
 * Parameters carry HF names (model.layers.3.self_attn.q_proj.weight) and are placed by the
 * module styles that the loaded strategies registered for each mesh dim (column_linear,
 * row_linear, embedding, rmsnorm, and kv_linear for k_proj/v_proj, column_linear where a dim has
 * no kv_linear); with no strategy for a dim they are dense and replicated.
 * The model code never changes when the mesh does.
 */
#ifndef TESSERA_LLAMA_H
#define TESSERA_LLAMA_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/autograd.h"
#include "tessera/dtensor.h"
#include "tessera/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

/* HF LlamaConfig names. */
typedef struct tsr_llama_config {
  int vocab_size;
  int hidden_size;
  int intermediate_size;
  int num_hidden_layers;
  int num_attention_heads;
  int num_key_value_heads;
  float rms_norm_eps;
  float rope_theta;
  bool tie_word_embeddings;
  /* Sparse mixture of experts (Mixtral): layer l is an MoE layer when num_local_experts > 0 and
   * (l + 1) % decoder_sparse_step == 0; its MLP becomes a router over num_local_experts SwiGLU
   * experts of width intermediate_size, num_experts_per_tok of them per token. */
  int num_local_experts;      /* 0: every layer has a dense MLP */
  int num_experts_per_tok;    /* top-k */
  int decoder_sparse_step;    /* 0 or 1: every layer */
  float router_aux_loss_coef; /* load-balancing loss weight, added to the loss when > 0 */
  /* Activation checkpointing of layer l when checkpoint_every > 0 and (l + 1) %
   * checkpoint_every == 0; 0: none. Full: the layer keeps only its input in the forward and is
   * recomputed in the backward. Selective (checkpoint_selective): it keeps its GEMMs' and
   * attention's outputs, and its norms, RoPE and SwiGLU are recomputed (tsr_tape_set_selective).
   * The results are bit-identical to none. */
  int checkpoint_every;
  bool checkpoint_selective;
} tsr_llama_config;

typedef struct tsr_llama_t tsr_llama_t;

/* Checks the config on its own (positive sizes, hidden % heads, heads % kv heads, even head
 * dim): TSR_EINVAL naming the key and the fix. */
tsr_status tsr_llama_config_check(const tsr_llama_config *cfg);

/* Builds this rank's model on `mesh`: parameters placed by the registry's module styles and
 * initialised with normal(0, 0.02) for matrices and embeddings and 1 for norm weights, from
 * `seed`, identically whatever the mesh (load a checkpoint to start from given weights). */
tsr_status tsr_llama_new(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_llama_config *cfg,
                         uint64_t seed, tsr_llama_t **out);
void tsr_llama_free(tsr_llama_t *m);

/* How the layers are laid over the pipeline stages. With pp ranks along the mesh's `pp` dim and
 * stages_per_rank = v, there are pp * v stages; the rank at pp index r holds stages r, r + pp,
 * r + 2 pp, ... (virtual stages, as interleaved schedules want them). */
typedef struct tsr_llama_layout {
  int stages_per_rank;         /* v; 0 or 1: one stage per pp rank */
  const int *layers_per_stage; /* (nlayers_per_stage) layers of each stage in order; borrowed */
  int nlayers_per_stage;       /* 0: as even as possible (tsr_llama_assign_layers) */
} tsr_llama_layout;

/* TSR_EINVAL, naming the key and the fix, unless `layout` (NULL: the default) fits pp ranks and
 * num_layers layers: one count per stage, each >= 1, summing to num_layers; at least one layer
 * per stage. */
tsr_status tsr_llama_layout_check(const tsr_llama_layout *layout, int pp, int num_layers);
/* tsr_llama_new with the layers placed by `layout` (NULL: as tsr_llama_new); the parameters'
 * values do not depend on the layout. stages_per_rank > 1 needs pp >= 2. */
tsr_status tsr_llama_new_staged(tsr_rank_t *r, const tsr_mesh_t *mesh, const tsr_llama_config *cfg,
                                uint64_t seed, const tsr_llama_layout *layout, tsr_llama_t **out);

const tsr_llama_config *tsr_llama_get_config(const tsr_llama_t *m);
/* Parameters in HF order (embed_tokens, layers..., norm, lm_head unless tied). */
int tsr_llama_param_count(const tsr_llama_t *m);
tsr_var *tsr_llama_param(tsr_llama_t *m, int i);
const char *tsr_llama_param_name(const tsr_llama_t *m, int i);
/* Tied embeddings over several pipeline stages (Megatron's layout): model.embed_tokens.weight
 * lives on the first stage and the last stage holds a replica of it, placed and initialised
 * identically, which its lm_head uses in tsr_llama_forward_stage. The replica is not among
 * tsr_llama_param (one name for checkpoints and dumps): the caller steps it with the same
 * optimizer as the embedding and sums the two gradients before the step
 * (tsr_llama_tied_grad_sync), so both copies stay bit-identical. Ranks off the last stage hold
 * no local of it. NULL when the embeddings are not tied or there is one stage. */
tsr_var *tsr_llama_tied_replica(tsr_llama_t *m);
/* Sums the gradients of model.embed_tokens.weight and its replica over each pair of ranks at
 * the first and the last pp coordinate with the same other coordinates (a group of the pp dim
 * restricted to them, bytes under label "pp"), in place, so that both hold the tied weight's
 * whole gradient. Call once per optimizer step, after the backward of every microbatch and
 * tsr_var_resolve_grad of both. No-op without a replica and on ranks of other pp coordinates;
 * collective over the first and last stage. */
tsr_status tsr_llama_tied_grad_sync(tsr_llama_t *m);
/* Pipeline stages: the model unbinds the mesh's `pp` dim (one stage without it) and lays its
 * layers over pp x stages_per_rank stages (tsr_llama_layout). Embeddings live on stage 0, the
 * final norm and lm_head on the last, layer l on tsr_llama_assign_layers' stage or the layout's;
 * a rank holds only its stages' parameters (the others have no local tensor), and activations
 * cross stages by cross-mesh redistribute. */
int tsr_llama_stage_count(const tsr_llama_t *m);
/* The mesh of `stage`: the pp coordinate stage % pp of the job's mesh. */
const tsr_mesh_t *tsr_llama_stage_mesh(const tsr_llama_t *m, int stage);
/* Stages per pp rank (tsr_llama_layout.stages_per_rank; 1 by default). */
int tsr_llama_stages_per_rank(const tsr_llama_t *m);
/* The stage that holds layer `layer`. */
int tsr_llama_layer_stage(const tsr_llama_t *m, int layer);
/* Layers as evenly as possible over the stages, earlier stages taking the extra layer:
 * (4, 2) -> [0, 0, 1, 1], (3, 2) -> [0, 0, 1]. num_stages <= num_layers. */
void tsr_llama_assign_layers(int num_layers, int num_stages, int *stage_of_layer);

/* Whether layer `layer` is a mixture-of-experts layer under `cfg`. */
bool tsr_llama_layer_is_moe(const tsr_llama_config *cfg, int layer);

/* How parameters are written in Hugging Face files. A parameter is one tensor of its name, except
 * an MoE layer's stacked experts: "model.layers.N.block_sparse_moe.experts.w13" (E, 2I, C) is
 * written as experts.E.w1.weight and experts.E.w3.weight (I, C) of each expert, and
 * "...experts.w2" (E, C, I) as experts.E.w2.weight (C, I), Mixtral's names. */
/* The number of Hugging Face tensors parameter i is written as (1 for all but stacked experts). */
int tsr_llama_hf_count(const tsr_llama_t *m, int i);
/* Tensor j of parameter i: its name (into buf), its first element in the parameter's global
 * row-major layout and its shape (2 dims at most; *ndim set). The tensors of a parameter are
 * contiguous, disjoint and cover it. */
void tsr_llama_hf_tensor(const tsr_llama_t *m, int i, int j, char *buf, size_t len, int64_t *offset,
                         int *ndim, int64_t *shape);

/* Parameter count of the full (unsharded) model, embeddings included. */
int64_t tsr_llama_num_params(const tsr_llama_config *cfg);

/* A (B, L) i32 batch of token ids or labels from host memory `data`, as the leaf var that
 * tsr_llama_forward takes: replicated on every dim of `mesh` (the model's input styles shard it
 * over the batch and sequence dims). */
tsr_status tsr_llama_batch(tsr_rank_t *r, const tsr_mesh_t *mesh, int64_t B, int64_t L,
                           const int32_t *data, tsr_var **out);

/* Forward on the global batch `ids` (B, L) i32: logits (B, L, V) and, when labels (B, L) i32
 * is given, the mean cross-entropy (-100 ignored). Both vars belong to the tape and live on the
 * last pipeline stage's mesh. Tied over several stages, lm_head is the first stage's weight moved
 * to the last on the tape (its gradient comes back the same way; the replica is unused). */
tsr_status tsr_llama_forward(tsr_llama_t *m, tsr_tape_t *t, tsr_var *ids, tsr_var *labels,
                             tsr_var **logits, tsr_var **loss);

/* Document masking ([data] mask = document, docs/data.md): seg and pos, (B, L) i32 leaves as
 * tsr_llama_batch makes them on the mesh the forward runs on (a stage's mesh under a pipeline),
 * are the segment ids and positions of the batch the following forwards take: RoPE rotates by
 * pos and attention stays inside each segment. NULL, NULL: causal over the row. The vars stay
 * the caller's and must outlive the forward and its backward, during which they stay set: a
 * checkpointed layer recomputes its forward there (llama_ckpt.c) and masks as the forward did. */
tsr_status tsr_llama_set_documents(tsr_llama_t *m, tsr_var *seg, tsr_var *pos);

/* ---- Stage by stage, for pipeline schedules ---- */

/* The mesh dim the layers are split over in stages (tsr_registry_stage_dim), "" for none. */
const char *tsr_llama_stage_dim(const tsr_llama_t *m);
tsr_rank_t *tsr_llama_rank(const tsr_llama_t *m);
/* Placements (one per dim of the stage's mesh) of the activation that leaves `stage` and enters
 * the next: the data layout's hidden-state placement, the output of the embedding style each
 * dim's owner registered (Replicate on a dim without one). */
void tsr_llama_stage_io_placements(const tsr_llama_t *m, int stage, tsr_placement *p);
/* The part of the forward that `stage` computes; only that stage's ranks call it, so the
 * caller moves activations and gradients between stages (tsr_llama_pipe_step does). Stage 0
 * embeds `ids` (replicated on the stage's mesh; `in` unused); later stages start from `in`, a var
 * on their mesh placed as tsr_llama_stage_io_placements of the previous stage. *out is the
 * activation for the next stage, placed as tsr_llama_stage_io_placements(stage); on the last
 * stage it is the logits, also in *logits, and with labels *loss is the mean cross-entropy of
 * this microbatch. With tied embeddings the last stage's lm_head is the replica
 * (tsr_llama_tied_replica). */
tsr_status tsr_llama_forward_stage(tsr_llama_t *m, tsr_tape_t *t, int stage, tsr_var *ids,
                                   tsr_var *in, tsr_var *labels, tsr_var **out, tsr_var **logits,
                                   tsr_var **loss);

#ifdef __cplusplus
}
#endif
#endif
