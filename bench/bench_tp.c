/* Tensor-parallel training step against one rank, on the same cores.
 *
 * The training preset (vocab 8192, hidden 512, intermediate 1408, 8 layers, 8 heads, 8 kv heads,
 * batch 4, seq 256) runs one step (forward, backward, gradient resolve, AdamW) on 1 rank with
 * T threads, and on tp = T ranks of the local backend with 1 thread each (tp and tp+sp, the tp
 * and sp plugins loaded from the build tree as a job loads them). Each row prints the step time,
 * tokens/s and the bytes one rank sent on the tp dim per step, against the analytic minimum of
 * Megatron tensor parallelism: 2 all-reduces of b·s·h per layer forward and 2 backward, each
 * 2 (n-1)/n · 4 b s h bytes per rank (sequence parallelism replaces each all-reduce by an
 * all-gather and a reduce-scatter of the same total). What the step moves beyond that is the
 * embedding's gather, the lm_head input's gradient and the loss's row statistics (and, with sp,
 * the norm weights' gradients).
 *
 *   bench_tp [--steps N] [--threads T]     defaults: 2 timed steps after 1 warm-up, T = 2
 * The last lines are machine-readable: bench_tp config=... step_s=... tp_bytes=... min_bytes=...
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

typedef struct run {
  const char *name;
  int tp, threads, steps, batch, seq;
  const tsr_registry_t *reg;
  double step_s;     /* best timed step */
  uint64_t tp_bytes; /* rank 0, per step */
  float loss;
} run;

static tsr_status bench_rank(tsr_comm_t *comm, void *arg) {
  run *b = arg;
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *lm = NULL;
  tsr_tape_t *t = NULL;
  tsr_adamw_t *opt = NULL;
  tsr_var *ids = NULL, *labels = NULL, *logits, *loss, *params[MAX_PARAMS];
  tsr_status st = TSR_OK;
  const char *names[1] = {"tp"};
  tsr_kernel_set_threads(b->threads);
  TSR_CHECK_GOTO(tsr_rank_new(comm, b->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(tsr_comm_world(comm), 1, &b->tp, names, &m), st);
  TSR_CHECK_GOTO(tsr_llama_new(r, m, &tsr_bench_preset, 1, &lm), st);
  TSR_CHECK_GOTO(tsr_bench_tokens(r, m, b->batch, b->seq, tsr_bench_preset.vocab_size, 0, &ids),
                 st);
  TSR_CHECK_GOTO(tsr_bench_tokens(r, m, b->batch, b->seq, tsr_bench_preset.vocab_size, 1, &labels),
                 st);
  TSR_CHECK_GOTO(tsr_tape_new(r, &t), st);
  int np = tsr_llama_param_count(lm);
  for (int i = 0; i < np; i++) params[i] = tsr_llama_param(lm, i);
  tsr_adamw_config ac = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  TSR_CHECK_GOTO(tsr_adamw_new(r, np, params, &ac, &opt), st);
  bool me0 = tsr_comm_rank(comm) == 0;
  if (me0) b->step_s = 1e30;
  for (int s = 0; s <= b->steps; s++) {
    tsr_group_t *all;
    TSR_CHECK_GOTO(tsr_mesh_group(m, comm, 1u, &all), st);
    TSR_CHECK_GOTO(tsr_comm_barrier(all), st);
    tsr_comm_bytes_reset(comm);
    double t0 = tsr_bench_now();
    TSR_CHECK_GOTO(tsr_llama_forward(lm, t, ids, labels, &logits, &loss), st);
    TSR_CHECK_GOTO(tsr_tape_backward(t, loss), st);
    for (int i = 0; i < np; i++) TSR_CHECK_GOTO(tsr_var_resolve_grad(t, params[i]), st);
    TSR_CHECK_GOTO(tsr_adamw_step(opt, 1e-4), st);
    TSR_CHECK_GOTO(tsr_comm_barrier(all), st);
    double dt = tsr_bench_now() - t0;
    if (me0 && s > 0 && dt < b->step_s) b->step_s = dt; /* step 0 warms up */
    if (me0) {
      b->tp_bytes = tsr_comm_bytes(comm, "tp");
      b->loss = *(const float *)tsr_tensor_data(loss->value->local);
    }
    for (int i = 0; i < np; i++) tsr_var_zero_grad(params[i]);
    tsr_tape_reset(t);
  }
cleanup:
  tsr_adamw_free(opt);
  tsr_tape_free(t);
  tsr_var_free(ids);
  tsr_var_free(labels);
  tsr_llama_free(lm);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  return st;
}

/* The job's plugins, as `tessera run` loads them. */
static tsr_status load(int tp, bool sp, const run *b, tsr_plugin_job *out) {
  char text[1024];
  snprintf(text, sizeof text,
           "[mesh]\ndims = tp\nshape = %d\n[plugins]\nload = %s\n[model]\nvocab_size = %d\n"
           "hidden_size = %d\nintermediate_size = %d\nnum_hidden_layers = %d\n"
           "num_attention_heads = %d\nnum_key_value_heads = %d\n[data]\nbatch_size = %d\n"
           "seq_len = %d\n",
           tp, sp ? "tp, sp" : "tp", tsr_bench_preset.vocab_size, tsr_bench_preset.hidden_size,
           tsr_bench_preset.intermediate_size, tsr_bench_preset.num_hidden_layers,
           tsr_bench_preset.num_attention_heads, tsr_bench_preset.num_key_value_heads, b->batch,
           b->seq);
  return tsr_plugin_job_load_string(text, "bench_tp", out);
}

int main(int argc, char **argv) {
  tsr_kernel_blas_reexec(argv); /* the product's own setting (tessera run does the same) */
  int steps = 2, threads = 2;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: bench_tp [--steps N] [--threads T]\n");
      return 2;
    }
  }
  if (steps < 1 || threads < 2) {
    fprintf(stderr, "bench_tp: --steps >= 1 and --threads >= 2 (tp = threads)\n");
    return 2;
  }
  run runs[3] = {
      {"1 rank", 1, threads, steps, 4, 256, NULL, 0, 0, 0},
      {"tp", threads, 1, steps, 4, 256, NULL, 0, 0, 0},
      {"tp+sp", threads, 1, steps, 4, 256, NULL, 0, 0, 0},
  };
  tsr_plugin_job plugins[3] = {0};
  int rc = 0;
  for (int k = 0; k < 3 && rc == 0; k++) {
    if (k > 0 && load(runs[k].tp, k == 2, &runs[k], &plugins[k]) != TSR_OK) {
      fprintf(stderr, "bench_tp: %s\n", tsr_last_error());
      rc = 1;
      break;
    }
    runs[k].reg = plugins[k].reg;
    if (tsr_local_launch(runs[k].tp, 600.0, bench_rank, &runs[k]) != TSR_OK) {
      fprintf(stderr, "bench_tp: %s: %s\n", runs[k].name, tsr_last_error());
      rc = 1;
    }
  }
  if (rc == 0) {
    int n = threads;
    double X = 4.0 * runs[0].batch * runs[0].seq * tsr_bench_preset.hidden_size;
    double min = 4.0 * tsr_bench_preset.num_hidden_layers * 2.0 * (n - 1) / n * X;
    double tokens = (double)runs[0].batch * runs[0].seq;
    printf("Llama preset: vocab %d, hidden %d, intermediate %d, %d layers, %d heads, %d kv heads, "
           "batch %d x seq %d; %d cores (tsr_kernel_num_cores: %d)\n",
           tsr_bench_preset.vocab_size, tsr_bench_preset.hidden_size,
           tsr_bench_preset.intermediate_size, tsr_bench_preset.num_hidden_layers,
           tsr_bench_preset.num_attention_heads, tsr_bench_preset.num_key_value_heads,
           runs[0].batch, runs[0].seq, threads, tsr_kernel_num_cores());
    printf("%-8s %5s %8s %10s %9s %8s %14s %14s %7s\n", "config", "ranks", "threads", "step_s",
           "tokens/s", "speedup", "tp MB/step", "min MB/step", "ratio");
    for (int k = 0; k < 3; k++) {
      const run *b = &runs[k];
      printf("%-8s %5d %8d %10.3f %9.0f %7.2fx", b->name, b->tp, b->threads, b->step_s,
             tokens / b->step_s, runs[0].step_s / b->step_s);
      if (k == 0)
        printf(" %14s %14s %7s\n", "-", "-", "-");
      else
        printf(" %14.3f %14.3f %7.3f\n", b->tp_bytes / 1e6, min / 1e6, b->tp_bytes / min);
    }
    printf("loss (last step): 1 rank %.6f, tp %.6f, tp+sp %.6f\n", runs[0].loss, runs[1].loss,
           runs[2].loss);
    for (int k = 0; k < 3; k++)
      printf("bench_tp config=%s ranks=%d step_s=%.4f tp_bytes=%llu min_bytes=%.0f\n",
             k == 0   ? "single"
             : k == 1 ? "tp"
                      : "tp_sp",
             runs[k].tp, runs[k].step_s, (unsigned long long)runs[k].tp_bytes, k ? min : 0.0);
  }
  for (int k = 0; k < 3; k++) tsr_plugin_job_free(&plugins[k]);
  return rc;
}
