/* Benchmark helpers (see bench_util.h). */
#include <stdlib.h>
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
  int32_t *p = malloc((size_t)B * (size_t)L * sizeof *p);
  if (!p) return TSR_ERROR(TSR_ENOMEM, "out of memory for a batch of %d x %d tokens", B, L);
  for (int i = 0; i < B * L; i++)
    p[i] = (int32_t)(((uint32_t)(i + shift) * 2654435761u >> 7) % (uint32_t)vocab);
  tsr_status st = tsr_llama_batch(r, m, B, L, p, out);
  free(p);
  return st;
}
