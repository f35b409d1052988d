/* Training-step benchmark: the Llama preset on one rank, with the machine's sgemm peak measured
 * in the same run.
 *
 * Prints tokens/s, achieved GFLOP/s and MFU against that peak, and where a step's time goes:
 * forward, backward, gradient resolve + clip + AdamW, and the time the step's GEMMs alone take
 * when run back to back through the same CBLAS calls (the floor the model's matmuls set; the
 * rest of the step is everything else: attention, norms, element-wise ops, allocation), and the
 * time the attention kernels alone take; and the in-step breakdown by kernel kind
 * (tsr_kernel_profile_*: GEMM, attention, cross-entropy, the per-token layers, the optimizer) with
 * what is left outside kernels (op layer: allocation, zeroing, copies, tape).
 *
 * FLOPs per token are 6·N + 6·L·h·s (docs/design.md §8) with N the parameters in matrix
 * products: the input embedding is a lookup and is left out (`tessera run` counts the same
 * way). The PyTorch peer (bench/pytorch_llama.py) counts N with the embedding, so compare
 * tokens/s, not GFLOP/s.
 *
 *   bench_train [--steps N] [--threads T]     defaults: 3 timed steps after 1 warm-up, 2 threads
 * The last line is machine-readable: bench_train tokens_per_s=... step_s=... gflops=... mfu=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama.h"
#include "tessera/io.h"
#include "tessera/kernels.h"
#include "tessera/optim.h"
#include "tessera/tessera.h"

#define MAX_STEPS 64

typedef struct bench {
  tsr_llama_config cfg;
  int batch, seq, steps, threads;
  double fwd[MAX_STEPS], bwd[MAX_STEPS], opt[MAX_STEPS], total[MAX_STEPS];
  double kernel_s[TSR_KERNEL_KINDS]; /* summed over the timed steps */
  int64_t system_allocs;             /* host buffers asked of the system in the timed steps */
  double loss;
} bench;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tsr_status input_var(tsr_rank_t *r, const tsr_mesh_t *mesh, const int32_t *data, int b,
                            int s, tsr_var **out) {
  int64_t shape[2] = {b, s};
  tsr_tensor *full = NULL;
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &full));
  memcpy(tsr_tensor_data(full), data, (size_t)b * s * sizeof(int32_t));
  tsr_placement rep[1] = {tsr_replicate()};
  tsr_status st = tsr_dtensor_distribute(r, mesh, full, rep, &d);
  tsr_tensor_free(full);
  if (st == TSR_OK) st = tsr_var_new_leaf(d, false, NULL, out);
  return st;
}

static tsr_status bench_rank(tsr_comm_t *comm, void *arg) {
  bench *b = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *mesh = NULL;
  tsr_llama_t *m = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_tape_t *tape = NULL;
  tsr_data_t *data = NULL;
  tsr_var **params = NULL;
  int32_t *ids = NULL, *labels = NULL;
  tsr_status st = TSR_OK;
  const char *names[] = {"dp"};
  int one[] = {1};
  tsr_kernel_set_threads(b->threads);
  TSR_CHECK_GOTO(tsr_rank_new(comm, NULL, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(1, 1, one, names, &mesh), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, mesh, &b->cfg, 1234, &m), st);
  int n = tsr_llama_param_count(m);
  params = calloc((size_t)n, sizeof *params);
  ids = malloc((size_t)b->batch * b->seq * sizeof *ids);
  labels = malloc((size_t)b->batch * b->seq * sizeof *labels);
  if (!params || !ids || !labels) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory");
    goto cleanup;
  }
  for (int i = 0; i < n; i++) params[i] = tsr_llama_param(m, i);
  tsr_adamw_config oc = {0.9, 0.95, 1e-8, 0.1};
  TSR_CHECK_GOTO(tsr_adamw_new(r, n, params, &oc, &opt), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &tape), st);
  TSR_CHECK_GOTO(tsr_data_open("synthetic", b->cfg.vocab_size, b->batch, b->seq, 1234, &data), st);
  for (int k = -1; k < b->steps; k++) { /* step -1 warms up allocator and caches */
    tsr_var *x = NULL, *y = NULL, *logits, *loss;
    TSR_CHECK_GOTO(tsr_data_next(data, ids, labels), st);
    TSR_CHECK_GOTO(input_var(r, mesh, ids, b->batch, b->seq, &x), st);
    TSR_CHECK_GOTO(input_var(r, mesh, labels, b->batch, b->seq, &y), st);
    double ks[TSR_KERNEL_KINDS];
    tsr_kernel_profile_enable(k >= 0);
    tsr_kernel_profile_read(ks, true);
    tsr_host_pool_stats p0;
    tsr_host_pool_read(&p0);
    double t0 = now_s();
    st = tsr_llama_forward(m, tape, x, y, &logits, &loss);
    double t1 = now_s();
    if (st == TSR_OK) st = tsr_tape_backward(tape, loss);
    if (st == TSR_OK) b->loss = *(const float *)tsr_tensor_data(loss->value->local);
    tsr_tape_reset(tape);
    tsr_var_free(x);
    tsr_var_free(y);
    if (st != TSR_OK) goto cleanup;
    double t2 = now_s(), norm;
    for (int i = 0; i < n; i++) TSR_CHECK_GOTO(tsr_var_resolve_grad(tape, params[i]), st);
    TSR_CHECK_GOTO(tsr_clip_grad_norm(r, mesh, n, params, 1.0, &norm), st);
    TSR_CHECK_GOTO(tsr_adamw_step(opt, 1e-3), st);
    for (int i = 0; i < n; i++) tsr_var_zero_grad(params[i]);
    double t3 = now_s();
    tsr_host_pool_stats p1;
    tsr_host_pool_read(&p1);
    if (k >= 0) b->system_allocs += p1.system_allocations - p0.system_allocations;
    tsr_kernel_profile_enable(false);
    tsr_kernel_profile_read(ks, true);
    if (k >= 0) {
      for (int q = 0; q < TSR_KERNEL_KINDS; q++) b->kernel_s[q] += ks[q];
      b->fwd[k] = t1 - t0;
      b->bwd[k] = t2 - t1;
      b->opt[k] = t3 - t2;
      b->total[k] = t3 - t0;
    }
  }
cleanup:
  tsr_data_close(data);
  tsr_tape_free(tape);
  tsr_adamw_free(opt);
  tsr_llama_free(m);
  tsr_mesh_free(mesh);
  tsr_rank_free(r);
  free(params);
  free(ids);
  free(labels);
  return st;
}

/* Seconds the step's GEMMs take on their own: every linear's forward and backward at its shape. */
static double gemm_floor(const bench *b) {
  const tsr_llama_config *c = &b->cfg;
  int T = b->batch * b->seq, h = c->hidden_size, I = c->intermediate_size;
  int kv = h / c->num_attention_heads * c->num_key_value_heads;
  int shapes[][2] = {{h, h}, {kv, h}, {kv, h}, {h, h}, {I, h}, {I, h}, {h, I}}; /* (OC, C) */
  size_t big = (size_t)T * (size_t)(c->vocab_size > I ? c->vocab_size : I);
  size_t wbig =
      (size_t)c->vocab_size * h > (size_t)I * h ? (size_t)c->vocab_size * h : (size_t)I * h;
  float *x = calloc(big, sizeof *x), *dx = calloc(big, sizeof *dx), *out = calloc(big, sizeof *out);
  float *w = calloc(wbig, sizeof *w), *dw = calloc(wbig, sizeof *dw);
  if (!x || !dx || !out || !w || !dw) {
    free(x), free(dx), free(out), free(w), free(dw);
    return -1;
  }
  double best = 1e30;
  for (int rep = 0; rep < 2; rep++) {
    double t0 = now_s();
    for (int l = 0; l < c->num_hidden_layers; l++)
      for (int k = 0; k < 7; k++) {
        int OC = shapes[k][0], C = shapes[k][1];
        tsr_kernel_matmul_forward(out, x, w, NULL, T, C, OC);
        tsr_kernel_matmul_backward(dx, dw, NULL, out, x, w, T, C, OC);
      }
    tsr_kernel_matmul_forward(out, x, w, NULL, T, h, c->vocab_size);
    tsr_kernel_matmul_backward(dx, dw, NULL, out, x, w, T, h, c->vocab_size);
    double t = now_s() - t0;
    if (t < best) best = t;
  }
  free(x), free(dx), free(out), free(w), free(dw);
  return best;
}

/* Seconds the step's attention kernels take on their own (forward and backward, every layer). */
static double attention_alone(const bench *b) {
  const tsr_llama_config *c = &b->cfg;
  int B = b->batch, L = b->seq, H = c->num_attention_heads, Hk = c->num_key_value_heads;
  int D = c->hidden_size / H;
  size_t nq = (size_t)B * H * L * D, nk = (size_t)B * Hk * L * D;
  float *q = calloc(nq, 4), *k = calloc(nk, 4), *v = calloc(nk, 4), *o = calloc(nq, 4);
  float *lse = calloc((size_t)B * H * L, 4), *dq = calloc(nq, 4), *dk = calloc(nk, 4);
  float *dv = calloc(nk, 4), *dout = calloc(nq, 4);
  double t = -1;
  if (q && k && v && o && lse && dq && dk && dv && dout) {
    for (size_t i = 0; i < nq; i++) q[i] = dout[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < nk; i++) k[i] = v[i] = (float)((i * 5) % 11) * 0.01f;
    double t0 = now_s();
    for (int l = 0; l < c->num_hidden_layers; l++) {
      tsr_kernel_attention_forward(o, lse, q, k, v, NULL, NULL, B, H, Hk, L, L, D, true);
      tsr_kernel_attention_backward(dq, dk, dv, dout, q, k, v, o, lse, NULL, NULL, B, H, Hk, L, L,
                                    D, true);
    }
    t = now_s() - t0;
  }
  free(q), free(k), free(v), free(o), free(lse), free(dq), free(dk), free(dv), free(dout);
  return t;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
  double s[MAX_STEPS];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

int main(int argc, char **argv) {
  tsr_kernel_blas_reexec(argv); /* the product's own setting (tessera run does the same) */
  bench b = {
      .cfg = {.vocab_size = 8192,
              .hidden_size = 512,
              .intermediate_size = 1408,
              .num_hidden_layers = 8,
              .num_attention_heads = 8,
              .num_key_value_heads = 8,
              .rms_norm_eps = 1e-5f,
              .rope_theta = 10000.0f},
      .batch = 4,
      .seq = 256,
      .steps = 3,
      .threads = 2,
  };
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--steps"))
      b.steps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads"))
      b.threads = atoi(argv[i + 1]);
  }
  if (b.steps < 1 || b.steps > MAX_STEPS || b.threads < 1) {
    fprintf(stderr, "usage: bench_train [--steps 1..%d] [--threads T]\n", MAX_STEPS);
    return 2;
  }
  tsr_kernel_set_threads(b.threads);
  double peak = tsr_kernel_sgemm_peak_gflops(b.threads, 1.0);
  tsr_kernel_set_threads(b.threads);
  const tsr_llama_config *c = &b.cfg;
  double nmat = (double)tsr_llama_num_params(c) - (double)c->vocab_size * c->hidden_size;
  double tokens = (double)b.batch * b.seq;
  double flops = (6.0 * nmat + 6.0 * c->num_hidden_layers * c->hidden_size * b.seq) * tokens;
  printf("preset: vocab %d hidden %d intermediate %d layers %d heads %d/%d, batch %d x %d, "
         "%d threads, 1 rank\n",
         c->vocab_size, c->hidden_size, c->intermediate_size, c->num_hidden_layers,
         c->num_attention_heads, c->num_key_value_heads, b.batch, b.seq, b.threads);
  printf("sgemm peak (1024^3, %d threads, measured now): %.1f GFLOP/s\n", b.threads, peak);
  printf("FLOPs per step: %.1f G = (6*%.0f + 6*L*h*s) * %.0f tokens\n", flops / 1e9, nmat, tokens);
  tsr_status st = tsr_local_launch(1, 600, bench_rank, &b);
  if (st != TSR_OK) {
    fprintf(stderr, "bench_train: %s\n", tsr_last_error());
    return 1;
  }
  double step = median(b.total, b.steps), fwd = median(b.fwd, b.steps);
  double bwd = median(b.bwd, b.steps), opt = median(b.opt, b.steps);
  double floor_s = gemm_floor(&b);
  double gflops = flops / step / 1e9;
  printf("step times (s):");
  for (int k = 0; k < b.steps; k++) printf(" %.3f", b.total[k]);
  printf("; last loss %.4f\n", b.loss);
  printf("median step %.3f s: forward %.3f, backward %.3f, resolve+clip+adamw %.3f\n", step, fwd,
         bwd, opt);
  if (floor_s > 0)
    printf("the step's GEMMs alone: %.3f s (%.0f%% of the step); everything else %.3f s\n", floor_s,
           100 * floor_s / step, step - floor_s);
  double attn_s = attention_alone(&b);
  if (attn_s > 0)
    printf("the step's attention kernels alone: %.3f s (%.0f%% of the step)\n", attn_s,
           100 * attn_s / step);
  const char *kind_name[TSR_KERNEL_KINDS] = {"GEMM", "attention", "cross-entropy",
                                             "norm/rope/swiglu/embedding", "clip+adamw"};
  double mean_step = 0, in_kernels = 0;
  for (int k = 0; k < b.steps; k++) mean_step += b.total[k] / b.steps;
  printf("in-step breakdown (mean of %d steps, %.3f s):", b.steps, mean_step);
  for (int q = 0; q < TSR_KERNEL_KINDS; q++) {
    double t = b.kernel_s[q] / b.steps;
    in_kernels += t;
    printf("%s %s %.3f s (%.0f%%)", q ? "," : "", kind_name[q], t, 100 * t / mean_step);
  }
  printf(", outside kernels %.3f s (%.0f%%)\n", mean_step - in_kernels,
         100 * (mean_step - in_kernels) / mean_step);
  tsr_host_pool_stats ps;
  tsr_host_pool_read(&ps);
  printf("host buffers asked of the system in the %d timed steps: %lld (the rest reused); the "
         "pool holds %.1f MiB, its bound %.1f MiB\n",
         b.steps, (long long)b.system_allocs, (double)(ps.kept_bytes + ps.live_bytes) / 1048576.0,
         (double)ps.bound_bytes / 1048576.0);
  printf("%.1f tokens/s, %.1f GFLOP/s, MFU %.1f%% of the measured sgemm peak\n", tokens / step,
         gflops, 100 * gflops / peak);
  printf("bench_train tokens_per_s=%.1f step_s=%.4f gflops=%.2f mfu=%.4f\n", tokens / step, step,
         gflops, gflops / peak);
  return 0;
}
