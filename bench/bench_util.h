/* Shared by the benchmarks that run the Llama step on the local backend: the training preset,
 * a clock and token batches (plugins load with tsr_plugin_job_load_string). */
#ifndef TESSERA_BENCH_UTIL_H
#define TESSERA_BENCH_UTIL_H

#include "llama.h"
#include "tessera/config.h"
#include "tessera/plugin.h"
#include "tessera/registry.h"

/* The model issue's training preset: vocab 8192, hidden 512, intermediate 1408, 8 layers, 8
 * heads, 8 kv heads (run at batch 4, seq 256). */
extern const tsr_llama_config tsr_bench_preset;

/* Seconds on the monotonic clock. */
double tsr_bench_now(void);

/* A leaf var holding a (B, L) batch of token ids in [0, vocab), a hash of the position and
 * `shift` (ids and labels differ by shift), replicated on every dim of `m`. */
tsr_status tsr_bench_tokens(tsr_rank_t *r, const tsr_mesh_t *m, int B, int L, int vocab, int shift,
                            tsr_var **out);

#endif
