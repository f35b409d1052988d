/* Context parallelism at sequence length 4096: batch 1, hidden 512, 8 heads (8 kv heads, head
 * dim 64), one layer, vocab 512, intermediate 1408.
 *
 * 1. Attention forward + backward (the sdpa op on q, k, v of the layer's shape, causal) on one
 *    rank with T threads and on cp = T ranks of the local backend with 1 thread each: ring
 *    (load_balance none and zigzag) and Ulysses, the plugins loaded from the build tree as a job
 *    loads them. Best of the timed repetitions after a warm-up.
 * 2. Per-rank causal attention FLOPs, max / min over the ring: each rank's query positions are
 *    read back from an arange of the sequence placed as the model's input ids are (so zigzag
 *    goes through the plugin's own transition); a query at position p sees p + 1 keys, and each
 *    visible (query, key) pair costs 4 D FLOPs per head forward.
 * 3. Bytes rank 0 sends on each cp dim in one training step of the layer (forward, backward,
 *    gradient resolve), against the analytic count: ring attention sends K, V n-1 times forward
 *    and K, V, dK, dV n-1 times plus dK, dV once backward, Ulysses moves q, k, v, out and their
 *    gradients once each with (n-1)/n of each leaving the rank; on top, every parameter gradient
 *    is all-reduced over the dim (2 (n-1)/n of its bytes, as comm.h counts it) and the loss's
 *    valid-token count (one i64) is all-reduced.
 *
 *   bench_cp [--reps N] [--threads T]      defaults: 2 timed repetitions, T = 2
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "llama.h"
#include "tessera/kernels.h"
#include "tessera/ops.h"
#include "tessera/plugin.h"
#include "tessera/tessera.h"

#define MAX_PARAMS 32

static const tsr_llama_config preset = {.vocab_size = 512,
                                        .hidden_size = 512,
                                        .intermediate_size = 1408,
                                        .num_hidden_layers = 1,
                                        .num_attention_heads = 8,
                                        .num_key_value_heads = 8,
                                        .rms_norm_eps = 1e-5f,
                                        .rope_theta = 10000.0f};
enum { B = 1, L = 4096 };

typedef struct run {
  const char *name, *dim, *balance; /* dim NULL: one rank */
  int n, threads, reps;
  const tsr_registry_t *reg;
  double attn_s; /* best forward + backward of the sdpa op */
  double flops_max, flops_min;
  uint64_t step_bytes; /* rank 0, one training step, on `dim` */
  uint64_t param_bytes;
} run;

static tsr_status placed_var(tsr_rank_t *r, const tsr_mesh_t *m, tsr_dtype dt, int ndim,
                             const int64_t *shape, bool grad, int seed, tsr_var **out) {
  tsr_tensor *t;
  TSR_CHECK(tsr_tensor_new(NULL, dt, ndim, shape, &t));
  int64_t n = tsr_tensor_numel(t);
  for (int64_t i = 0; i < n; i++) {
    uint32_t h = (uint32_t)(i + seed) * 2654435761u >> 7;
    if (dt == TSR_I32)
      ((int32_t *)tsr_tensor_data(t))[i] = (int32_t)(h % (uint32_t)preset.vocab_size);
    else
      ((float *)tsr_tensor_data(t))[i] = (float)(h % 1000) / 1000.0f - 0.5f;
  }
  tsr_placement p[TSR_MAX_MESH_DIMS] = {tsr_replicate()};
  if (ndim == 4) p[0] = tsr_shard(1);
  tsr_dtensor *d;
  tsr_status st = tsr_dtensor_distribute(r, m, t, p, &d);
  tsr_tensor_free(t);
  TSR_CHECK(st);
  return tsr_var_new_leaf(d, grad, NULL, out);
}

/* Causal forward FLOPs of this rank's queries: the positions come from an arange placed as the
 * model places its input ids. */
static tsr_status rank_flops(tsr_rank_t *r, const tsr_mesh_t *m, int64_t *flops) {
  int64_t shape[2] = {B, L};
  tsr_tensor *t;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &t));
  for (int i = 0; i < L; i++) ((int32_t *)tsr_tensor_data(t))[i] = i;
  tsr_placement rep[1] = {tsr_replicate()}, s1[1] = {tsr_shard(1)};
  tsr_dtensor *d = NULL, *x = NULL;
  tsr_status st = tsr_dtensor_distribute(r, m, t, rep, &d);
  tsr_tensor_free(t);
  if (st == TSR_OK) st = tsr_dtensor_redistribute(r, d, m, s1, &x);
  tsr_dtensor_free(d);
  TSR_CHECK(st);
  const int32_t *pos = tsr_tensor_data(x->local);
  int64_t pairs = 0;
  for (int64_t i = 0; i < tsr_tensor_numel(x->local); i++) pairs += pos[i] + 1;
  tsr_dtensor_free(x);
  int D = preset.hidden_size / preset.num_attention_heads;
  *flops = (int64_t)4 * D * preset.num_attention_heads * B * pairs;
  return TSR_OK;
}

static tsr_status bench_rank(tsr_comm_t *comm, void *arg) {
  run *b = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_tape_t *t = NULL;
  tsr_llama_t *lm = NULL;
  tsr_var *q = NULL, *k = NULL, *v = NULL, *ids = NULL, *labels = NULL, *o, *logits, *loss;
  tsr_status st = TSR_OK;
  bool me0 = tsr_comm_rank(comm) == 0;
  const char *names[1] = {b->dim ? b->dim : "dp"};
  int H = preset.num_attention_heads, D = preset.hidden_size / H;
  int64_t qs[4] = {B, L, H, D}, is[2] = {B, L};
  tsr_kernel_set_threads(b->threads);
  TSR_CHECK_GOTO(tsr_rank_new(comm, b->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(b->n, 1, &b->n, names, &m), st);
  TSR_CHECK_GOTO(placed_var(r, m, TSR_F32, 4, qs, true, 1, &q), st);
  TSR_CHECK_GOTO(placed_var(r, m, TSR_F32, 4, qs, true, 2, &k), st);
  TSR_CHECK_GOTO(placed_var(r, m, TSR_F32, 4, qs, true, 3, &v), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  tsr_group_t *all;
  TSR_CHECK_GOTO(tsr_mesh_group(m, comm, 1u, &all), st);
  if (me0) b->attn_s = 1e30;
  for (int rep = 0; rep <= b->reps; rep++) {
    TSR_CHECK_GOTO(tsr_comm_barrier(all), st);
    double t0 = tsr_bench_now();
    TSR_CHECK_GOTO(tsr_op_sdpa(t, q, k, v, true, &o), st);
    tsr_dtensor *g = NULL;
    TSR_CHECK_GOTO(tsr_dtensor_clone(r, o->value, &g), st);
    TSR_CHECK_GOTO(tsr_tape_backward_with(t, o, g), st);
    TSR_CHECK_GOTO(tsr_comm_barrier(all), st);
    double dt = tsr_bench_now() - t0;
    if (me0 && rep > 0 && dt < b->attn_s) b->attn_s = dt;
    tsr_var_zero_grad(q);
    tsr_var_zero_grad(k);
    tsr_var_zero_grad(v);
    tsr_tape_reset(t);
  }
  int64_t f = 0, fmax = 0, fmin = 0;
  if (b->dim && strcmp(b->dim, "ring_cp") == 0) {
    TSR_CHECK_GOTO(rank_flops(r, m, &f), st);
    TSR_CHECK_GOTO(tsr_comm_all_reduce(all, &f, &fmax, 1, TSR_I64, TSR_REDUCE_MAX), st);
    f = -f;
    TSR_CHECK_GOTO(tsr_comm_all_reduce(all, &f, &fmin, 1, TSR_I64, TSR_REDUCE_MAX), st);
    if (me0) {
      b->flops_max = (double)fmax;
      b->flops_min = (double)-fmin;
    }
  }
  if (!b->dim) goto cleanup;
  /* one training step of the layer, for its bytes */
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &preset, 1, &lm), st);
  TSR_CHECK_GOTO(placed_var(r, m, TSR_I32, 2, is, false, 0, &ids), st);
  TSR_CHECK_GOTO(placed_var(r, m, TSR_I32, 2, is, false, 1, &labels), st);
  tsr_comm_bytes_reset(comm);
  TSR_CHECK_GOTO(tsr_llama_forward(lm, t, ids, labels, &logits, &loss), st);
  TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
  uint64_t pb = 0;
  for (int i = 0; i < tsr_llama_param_count(lm); i++) {
    tsr_var *p = tsr_llama_param(lm, i);
    TSR_CHECK_GOTO(tsr_var_resolve_grad(t, p), st);
    pb += tsr_tensor_nbytes(p->value->local);
  }
  if (me0) {
    b->step_bytes = tsr_comm_bytes(comm, b->dim);
    b->param_bytes = pb;
  }
cleanup:
  tsr_tape_free(t);
  tsr_var_free(q);
  tsr_var_free(k);
  tsr_var_free(v);
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(lm);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

static tsr_status load(const run *b, tsr_plugin_job *out) {
  char text[1024];
  bool ring = strcmp(b->dim, "ring_cp") == 0;
  snprintf(text, sizeof text,
           "[mesh]\ndims = %s\nshape = %d\n[plugins]\nload = %s\n%s%s%s[model]\nvocab_size = %d\n"
           "hidden_size = %d\nintermediate_size = %d\nnum_hidden_layers = %d\n"
           "num_attention_heads = %d\nnum_key_value_heads = %d\n[data]\nbatch_size = %d\n"
           "seq_len = %d\n",
           b->dim, b->n, ring ? "cp_ring" : "cp_ulysses",
           ring ? "[strategy.cp_ring]\nload_balance = " : "", ring ? b->balance : "",
           ring ? "\n" : "", preset.vocab_size, preset.hidden_size, preset.intermediate_size,
           preset.num_hidden_layers, preset.num_attention_heads, preset.num_key_value_heads, B, L);
  return tsr_plugin_job_load_string(text, "bench_cp", out);
}

/* Bytes of rank 0's all-reduce of `count` elements of `size` bytes over n, as comm.h counts. */
static double all_reduce_bytes(int64_t count, int n, size_t size) {
  int64_t own = tsr_chunk_size(count, n, 0);
  return (double)((count - own) + own * (n - 1)) * (double)size;
}

static double analytic_bytes(const run *b) {
  int n = b->n, D = preset.hidden_size / preset.num_attention_heads;
  double local = (double)B * (L / n) * preset.num_attention_heads * D * sizeof(float);
  double kv = (double)B * (L / n) * preset.num_key_value_heads * D * sizeof(float);
  double attn = strcmp(b->dim, "ring_cp") == 0 ? (n - 1) * 2 * kv + (n - 1) * 4 * kv + 2 * kv
                                               : (4 * local + 4 * kv) * (n - 1) / n;
  double grads = all_reduce_bytes((int64_t)(b->param_bytes / sizeof(float)), n, sizeof(float));
  return preset.num_hidden_layers * attn + grads + all_reduce_bytes(1, n, sizeof(int64_t));
}

int main(int argc, char **argv) {
  tsr_kernel_blas_reexec(argv); /* the product's own setting (tessera run does the same) */
  int reps = 2, threads = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_cp [--reps N] [--threads T]\n");
      return 2;
    }
  }
  if (reps < 1 || threads < 2 || L % (2 * threads)) {
    fprintf(stderr, "bench_cp: --reps >= 1, --threads >= 2 dividing %d (cp = threads)\n", L / 2);
    return 2;
  }
  int T = threads;
  run runs[] = {
      {"1 rank", NULL, NULL, 1, T, reps, NULL, 0, 0, 0, 0, 0},
      {"ring", "ring_cp", "none", T, 1, reps, NULL, 0, 0, 0, 0, 0},
      {"ring zigzag", "ring_cp", "zigzag", T, 1, reps, NULL, 0, 0, 0, 0, 0},
      {"ulysses", "ulysses_cp", NULL, T, 1, reps, NULL, 0, 0, 0, 0, 0},
  };
  int nruns = (int)(sizeof runs / sizeof runs[0]), rc = 0;
  for (int k = 0; k < nruns && rc == 0; k++) {
    tsr_plugin_job plugins = {0};
    if (runs[k].dim && load(&runs[k], &plugins) != TSR_OK) {
      fprintf(stderr, "bench_cp: %s\n", tsr_last_error());
      rc = 1;
    }
    runs[k].reg = plugins.reg;
    if (rc == 0 && tsr_local_launch(runs[k].n, 1200.0, bench_rank, &runs[k]) != TSR_OK) {
      fprintf(stderr, "bench_cp: %s: %s\n", runs[k].name, tsr_last_error());
      rc = 1;
    }
    tsr_plugin_job_free(&plugins);
  }
  if (rc) return rc;
  int D = preset.hidden_size / preset.num_attention_heads;
  double full = 4.0 * D * preset.num_attention_heads * B * ((double)L * (L + 1) / 2);
  printf("Context parallelism: batch %d x seq %d, hidden %d, %d heads (%d kv, head dim %d), "
         "%d layer, vocab %d; %d cores (tsr_kernel_num_cores: %d)\n",
         B, L, preset.hidden_size, preset.num_attention_heads, preset.num_key_value_heads, D,
         preset.num_hidden_layers, preset.vocab_size, T, tsr_kernel_num_cores());
  printf("%-12s %5s %7s %12s %8s %9s %12s %12s %7s %12s %12s %7s\n", "config", "ranks", "threads",
         "attn f+b s", "speedup", "GFLOP/s", "fwd GF max", "fwd GF min", "max/min", "cp MB/step",
         "formula MB", "ratio");
  for (int k = 0; k < nruns; k++) {
    const run *b = &runs[k];
    printf("%-12s %5d %7d %12.3f %7.2fx %9.2f", b->name, b->n, b->threads, b->attn_s,
           runs[0].attn_s / b->attn_s, 3.5 * full / b->attn_s / 1e9);
    if (b->flops_max > 0)
      printf(" %12.3f %12.3f %7.3f", b->flops_max / 1e9, b->flops_min / 1e9,
             b->flops_max / b->flops_min);
    else
      printf(" %12.3f %12.3f %7s", full / b->n / 1e9, full / b->n / 1e9, "1.000");
    if (b->dim)
      printf(" %12.3f %12.3f %7.4f\n", b->step_bytes / 1e6, analytic_bytes(b) / 1e6,
             b->step_bytes / analytic_bytes(b));
    else
      printf(" %12s %12s %7s\n", "-", "-", "-");
  }
  for (int k = 1; k < nruns; k++)
    printf("bench_cp config=%s%s%s n=%d attn_s=%.4f bytes=%llu formula=%.0f\n", runs[k].dim,
           runs[k].balance ? ":" : "", runs[k].balance ? runs[k].balance : "", runs[k].n,
           runs[k].attn_s, (unsigned long long)runs[k].step_bytes, analytic_bytes(&runs[k]));
  return 0;
}
