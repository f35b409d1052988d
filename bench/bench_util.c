/* Benchmark helpers (see bench_util.h). */
#include <string.h>
#include <time.h>

#include "bench_util.h"

const tsr_llama_config tsr_bench_preset = {.vocab_size = 8192,
                                           .hidden_size = 512,
                                           .intermediate_size = 1408,
                                           .num_hidden_layers = 8,
                                           .num_attention_heads = 8,
                                           .num_key_value_heads = 8,
                                           .rms_norm_eps = 1e-5f,
                                           .rope_theta = 10000.0f};

double tsr_bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tsr_status tsr_bench_tokens(tsr_rank_t *r, const tsr_mesh_t *m, int B, int L, int vocab, int shift,
                            tsr_var **out) {
  int64_t shape[2] = {B, L};
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &t));
  int32_t *p = tsr_tensor_data(t);
  for (int i = 0; i < B * L; i++)
    p[i] = (int32_t)(((uint32_t)(i + shift) * 2654435761u >> 7) % (uint32_t)vocab);
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(m); i++) rep[i] = tsr_replicate();
  tsr_dtensor *d = NULL;
  tsr_status st = tsr_dtensor_distribute(r, m, t, rep, &d);
  tsr_tensor_free(t);
  TSR_CHECK(st);
  st = tsr_var_new_leaf(d, false, NULL, out);
  if (st != TSR_OK) tsr_dtensor_free(d);
  return st;
}
