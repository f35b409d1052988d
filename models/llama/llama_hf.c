/* The model's parameters as Hugging Face files name them (llama.h, tsr_llama_hf_tensor): one
 * tensor per parameter, except the stacked experts of an MoE layer, which Mixtral's files hold
 * one tensor per expert and weight. Written against the model's public accessors. */
#include <stdio.h>
#include <string.h>

#include "llama.h"

#define W13_SUFFIX ".experts.w13"
#define W2_SUFFIX  ".experts.w2"

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && !strcmp(s + n - k, suffix);
}

/* Which stacked expert weight parameter i is: 1 for w13, 2 for w2, 0 for any other. */
static int stacked_kind(const tsr_llama_t *m, int i) {
  const char *name = tsr_llama_param_name(m, i);
  return ends_with(name, W13_SUFFIX) ? 1 : ends_with(name, W2_SUFFIX) ? 2 : 0;
}

int tsr_llama_hf_count(const tsr_llama_t *m, int i) {
  int kind = stacked_kind(m, i), E = tsr_llama_get_config(m)->num_local_experts;
  return kind == 1 ? 2 * E : kind == 2 ? E : 1;
}

void tsr_llama_hf_tensor(const tsr_llama_t *m, int i, int j, char *buf, size_t len, int64_t *offset,
                         int *ndim, int64_t *shape) {
  const tsr_dtensor *v = tsr_llama_param((tsr_llama_t *)m, i)->value;
  const char *name = tsr_llama_param_name(m, i);
  int kind = stacked_kind(m, i);
  if (!kind) {
    snprintf(buf, len, "%s", name);
    *offset = 0;
    *ndim = v->ndim;
    for (int d = 0; d < v->ndim; d++) shape[d] = v->shape[d];
    return;
  }
  /* "model.layers.N.block_sparse_moe.experts.w13": the prefix up to "experts." is Mixtral's */
  int prefix =
      (int)(strlen(name) - strlen(kind == 1 ? W13_SUFFIX : W2_SUFFIX)) + (int)strlen(".experts.");
  int64_t rows = v->shape[1], cols = v->shape[2], per = rows * cols;
  *ndim = 2;
  shape[1] = cols;
  if (kind == 1) { /* expert j / 2: w1 is its first half of rows, w3 its second */
    int e = j / 2;
    snprintf(buf, len, "%.*s%d.%s.weight", prefix, name, e, j % 2 ? "w3" : "w1");
    shape[0] = rows / 2;
    *offset = e * per + (j % 2) * (rows / 2) * cols;
  } else {
    snprintf(buf, len, "%.*s%d.w2.weight", prefix, name, j);
    shape[0] = rows;
    *offset = j * per;
  }
}
