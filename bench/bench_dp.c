/* Data-parallel training step against one rank, on the same cores.
 *
 * The training preset (vocab 8192, hidden 512, intermediate 1408, 8 layers, 8 heads, 8 kv heads,
 * batch 4, seq 256) runs full steps (forward, backward with the dp plugin's bucketed gradient
 * sync, resolve, global-norm clipping, AdamW) on 1 rank with T threads and on n = T ranks of the
 * local backend with 1 thread each: DDP over dp, FSDP over dp_shard. The dp plugin is loaded from
 * the build tree as a job loads it. Each row prints the step time, tokens/s, the speed-up over 1
 * rank, the bytes one rank sent on the dp dim per step against the analytic figure, and the
 * rank's peak and state bytes:
 *   DDP   one all-reduce of the gradients:                2 (n-1)/n · 4 P
 *   FSDP  all-gather forward, again backward, reduce-scatter: 3 (n-1)/n · 4 P
 * (P parameters; the loss adds one 8-byte count of valid tokens.)
 *
 *   bench_dp [--steps N] [--threads T] [--layers L] [--bucket-mb M]
 *       defaults: 1 timed step after 1 warm-up, T = 2, the preset's 8 layers, 25 MiB buckets
 * The last lines are machine-readable: bench_dp config=... step_s=... dp_bytes=... model_bytes=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_util.h"
#include "llama.h"
#include "tessera/kernels.h"
#include "tessera/optim.h"
#include "tessera/plugin.h"
#include "tessera/tessera.h"

#define MAX_PARAMS 128

typedef struct bench_run {
  const char *name, *dim; /* dim: the mesh dim, NULL for 1 rank */
  int ranks, threads, steps, batch, seq;
  tsr_llama_config cfg;
  const tsr_registry_t *reg;
  double step_s;       /* best timed step, slowest rank */
  uint64_t dp_bytes;   /* rank 0, per step */
  int64_t peak, state; /* rank 0 */
  float loss;
} bench_run;

static int64_t bytes_of(const tsr_dtensor *x) {
  return x && x->local ? (int64_t)tsr_tensor_nbytes(x->local) : 0;
}

static tsr_status bench_rank(tsr_comm_t *comm, void *arg) {
  bench_run *b = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  tsr_tape_t *t = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_var *ids = NULL, *labels = NULL, *logits, *loss, *params[MAX_PARAMS];
  tsr_group_t *all = NULL;
  bool lead = tsr_comm_rank(comm) == 0;
  tsr_status st = TSR_OK;
  tsr_kernel_set_threads(b->threads);
  const char *name = b->dim ? b->dim : "dp";
  int shape[1] = {b->ranks};
  TSR_CHECK_GOTO(tsr_rank_new(comm, b->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(b->ranks, 1, shape, &name, &m), st);
  TSR_CHECK_GOTO(tsr_mesh_group(m, comm, 1u, &all), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &b->cfg, 1, &model), st);
  int n = tsr_llama_param_count(model);
  for (int i = 0; i < n; i++) params[i] = tsr_llama_param(model, i);
  tsr_adamw_config oc = {0.9, 0.95, 1e-8, 0.1};
  TSR_CHECK_GOTO(tsr_adamw_new(r, n, params, &oc, &opt), st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  TSR_CHECK_GOTO(tsr_bench_tokens(r, m, b->batch, b->seq, b->cfg.vocab_size, 0, &ids), st);
  TSR_CHECK_GOTO(tsr_bench_tokens(r, m, b->batch, b->seq, b->cfg.vocab_size, 1, &labels), st);
  b->step_s = 1e30;
  for (int step = 0; step <= b->steps; step++) { /* step 0 warms up */
    TSR_CHECK_GOTO(tsr_comm_barrier(all), st);
    tsr_comm_bytes_reset(comm);
    double t0 = tsr_bench_now();
    TSR_CHECK_GOTO(tsr_llama_forward(model, t, ids, labels, &logits, &loss), st);
    TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
    tsr_tensor *full = NULL; /* the loss is a Partial sum over the batch shards */
    TSR_CHECK_GOTO(tsr_dtensor_full_tensor(r, loss->value, &full), st);
    if (lead) b->loss = *(const float *)tsr_tensor_data(full);
    tsr_tensor_free(full);
    for (int i = 0; i < n; i++) TSR_CHECK_GOTO(tsr_var_resolve_grad(t, params[i]), st);
    double norm;
    TSR_CHECK_GOTO(tsr_clip_grad_norm(r, m, n, params, 1.0, &norm), st);
    TSR_CHECK_GOTO(tsr_adamw_step(opt, 1e-4), st);
    tsr_tape_reset(t);
    float dt = (float)(tsr_bench_now() - t0), worst = dt;
    uint64_t bytes = tsr_comm_bytes(comm, name);
    if (lead && step == b->steps) {
      b->state = 0;
      for (int i = 0; i < n; i++)
        b->state += bytes_of(params[i]->value) + bytes_of(params[i]->grad) +
                    bytes_of(tsr_adamw_exp_avg(opt, i)) + bytes_of(tsr_adamw_exp_avg_sq(opt, i));
    }
    for (int i = 0; i < n; i++) tsr_var_zero_grad(params[i]);
    TSR_CHECK_GOTO(tsr_comm_all_reduce(all, &dt, &worst, 1, TSR_F32, TSR_REDUCE_MAX), st);
    if (step > 0 && worst < b->step_s) b->step_s = worst;
    if (lead) b->dp_bytes = bytes;
  }
  if (lead) b->peak = (int64_t)tsr_rank_allocator(r)->peak_bytes;
cleanup:
  tsr_tape_free(t);
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_adamw_free(opt);
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

/* The dp plugin loaded for a one-dim mesh, as `tessera run` loads it for a job. */
static tsr_status load_dp(const char *dim, int n, double bucket_mb, tsr_plugin_job *out) {
  char text[512];
  snprintf(text, sizeof text,
           "[mesh]\ndims = %s\nshape = %d\n[plugins]\nload = dp\n[strategy.dp]\nbucket_mb = %g\n",
           dim, n, bucket_mb);
  return tsr_plugin_job_load_string(text, "bench_dp.ini", out);
}

static double mib(int64_t bytes) {
  return (double)bytes / 1048576.0;
}

int main(int argc, char **argv) {
  tsr_kernel_blas_reexec(argv); /* the product's own setting (tessera run does the same) */
  int steps = 1, threads = 2, layers = 8;
  double bucket_mb = 25;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--layers") && i + 1 < argc)
      layers = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bucket-mb") && i + 1 < argc)
      bucket_mb = atof(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_dp [--steps N] [--threads T] [--layers L] [--bucket-mb M]\n");
      return 2;
    }
  }
  if (steps < 1 || threads < 2 || layers < 1) {
    fprintf(stderr, "bench_dp: --steps >= 1, --threads >= 2 (the dp degree), --layers >= 1\n");
    return 2;
  }
  tsr_llama_config cfg = tsr_bench_preset;
  cfg.num_hidden_layers = layers;
  int64_t P = tsr_llama_num_params(&cfg);
  int n = threads;
  bench_run runs[3] = {
      {.name = "1 rank", .ranks = 1, .threads = threads},
      {.name = "DDP", .dim = "dp", .ranks = n, .threads = 1},
      {.name = "FSDP", .dim = "dp_shard", .ranks = n, .threads = 1},
  };
  for (int k = 0; k < 3; k++) {
    runs[k].steps = steps;
    runs[k].batch = 4;
    runs[k].seq = 256;
    runs[k].cfg = cfg;
  }
  tsr_plugin_job plugins[3] = {0};
  printf("bench_dp: %lld parameters (%.1f MiB f32), batch 4 x 256 tokens, %d timed step(s), "
         "buckets of %g MiB\n",
         (long long)P, mib(P * 4), steps, bucket_mb);
  printf("%-7s %-10s %5s %8s %9s %8s %8s %12s %12s %6s %10s %11s\n", "run", "mesh", "ranks",
         "thr/rank", "step s", "tok/s", "speedup", "dp MiB/step", "analytic", "ratio", "peak MiB",
         "state MiB");
  int code = 0;
  for (int k = 0; k < 3; k++) {
    bench_run *b = &runs[k];
    if (b->dim && load_dp(b->dim, n, bucket_mb, &plugins[k]) != TSR_OK) {
      fprintf(stderr, "bench_dp: %s\n", tsr_last_error());
      code = 1;
      break;
    }
    b->reg = plugins[k].reg;
    if (tsr_local_launch(b->ranks, 600.0, bench_rank, b) != TSR_OK) {
      fprintf(stderr, "bench_dp: %s: %s\n", b->name, tsr_last_error());
      code = 1;
      break;
    }
    double analytic = !b->dim  ? 0
                      : k == 1 ? 2.0 * (n - 1) / n * 4.0 * (double)P
                               : 3.0 * (n - 1) / n * 4.0 * (double)P;
    char mesh[32];
    snprintf(mesh, sizeof mesh, "%s=%d", b->dim ? b->dim : "-", b->ranks);
    printf("%-7s %-10s %5d %8d %9.3f %8.0f %8.2f %12.2f %12.2f %6.3f %10.1f %11.1f\n", b->name,
           mesh, b->ranks, b->threads, b->step_s, 4 * 256 / b->step_s, runs[0].step_s / b->step_s,
           mib((int64_t)b->dp_bytes), mib((int64_t)analytic),
           analytic > 0 ? (double)b->dp_bytes / analytic : 0.0, mib(b->peak), mib(b->state));
  }
  for (int k = 0; code == 0 && k < 3; k++)
    printf("bench_dp config=%s ranks=%d step_s=%.4f dp_bytes=%llu model_bytes=%lld loss=%.5f "
           "state_bytes=%lld peak_bytes=%lld\n",
           runs[k].dim ? runs[k].dim : "single", runs[k].ranks, runs[k].step_s,
           (unsigned long long)runs[k].dp_bytes, (long long)(P * 4), runs[k].loss,
           (long long)runs[k].state, (long long)runs[k].peak);
  for (int k = 0; k < 3; k++) tsr_plugin_job_free(&plugins[k]);
  return code;
}
