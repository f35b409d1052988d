/* Generation: the Llama forward for one sequence on one rank, with a KV cache.
 *
 * A separate forward from tsr_llama_forward, for inference only: no tape, no mesh, no gradient;
 * the weights are full f32 host tensors under their Hugging Face names, and each call runs the
 * tokens it is given after those already in the cache. It computes what tsr_llama_forward
 * computes for a batch of one (RMSNorm, RoPE of the token's position, causal grouped-query
 * attention, SwiGLU or Mixtral's sparse MoE block, the final norm and lm_head) through the same
 * public CPU kernels for the projections, norms, rotations and activations; attention runs one
 * query row at a time against the cache. The training forward's numerics are not touched. */
#ifndef TESSERA_LLAMA_GENERATE_H
#define TESSERA_LLAMA_GENERATE_H

#include <stdint.h>

#include "llama.h"
#include "tessera/comm.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_llama_gen tsr_llama_gen;

/* A generator for model `cfg` holding up to `max_len` tokens. `tensors` (n, under `names`) are
 * the model's weights as Hugging Face files name them (Mixtral's per-expert names for MoE
 * layers; no lm_head.weight needed when the embeddings are tied): contiguous f32 CPU tensors of
 * the model's shapes, borrowed until tsr_llama_gen_free. TSR_EINVAL naming a tensor that is
 * missing or of the wrong shape or dtype. */
tsr_status tsr_llama_gen_new(const tsr_llama_config *cfg, int n, const char *const *names,
                             const tsr_tensor *const *tensors, int max_len, tsr_llama_gen **out);
/* The same under tensor parallelism over the ranks of `tp` (NULL or a group of one: one rank),
 * Megatron's split: each rank keeps its heads (rows of q_proj, k_proj, v_proj and columns of
 * o_proj) and its chunk of the MLP width (rows of gate_proj and up_proj, columns of down_proj;
 * the same of each expert's w1, w3 and w2), and sums the attention's and the MLP's outputs over
 * the group (an all-reduce of (tokens, hidden) after each); embeddings, norms, the router and
 * lm_head stay whole, so every rank ends a step with the same logits. Every rank of the group
 * calls every function with the same arguments. tp must divide both head counts. */
tsr_status tsr_llama_gen_new_tp(const tsr_llama_config *cfg, int n, const char *const *names,
                                const tsr_tensor *const *tensors, int max_len, tsr_group_t *tp,
                                tsr_llama_gen **out);
/* NULL is a no-op. */
void tsr_llama_gen_free(tsr_llama_gen *g);

/* Tokens in the cache. */
int tsr_llama_gen_len(const tsr_llama_gen *g);
/* Empties the cache: the next step starts at position 0. */
void tsr_llama_gen_reset(tsr_llama_gen *g);

/* Runs `n` tokens at positions len .. len + n - 1, adding their keys and values to the cache,
 * and writes the logits (vocab_size values) of the last of them to `logits`. TSR_EINVAL when an
 * id is outside the vocabulary or the cache would pass max_len (nothing is added then). */
tsr_status tsr_llama_gen_step(tsr_llama_gen *g, const int32_t *ids, int n, float *logits);

#ifdef __cplusplus
}
#endif
#endif
