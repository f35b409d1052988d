/* Pipeline bubble: measured from the executed schedule's events (what [output] trace writes)
 * against the schedule's analytic bubble, for gpipe, 1f1b, interleaved_1f1b (2 chunks per rank)
 * and zero_bubble at pp = 2 and 4 with 8 microbatches. One training step of a small Llama per
 * row, after a warm-up step; ranks are threads of the local backend with one kernel thread each,
 * so the figures are only meaningful with at least pp free cores.
 *
 * measured = 1 - mean over ranks of (compute time: forwards, backwards and their parts) / (the
 *            step's span over all ranks)
 * analytic = the schedule simulated with backward = 2 x forward (each half of a split backward
 *            1 x), free transfers
 * W share  = zero_bubble: time in weight parts / time in input and weight parts, over all ranks
 *            (the work the split really moves out of the input part)
 *
 * usage: bench_pp [hidden] [seq]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../plugins/pp/pp_schedule.c"
#include "llama_pipe.h"
#include "tessera/kernels.h"

#define ROWS 8
#define MB   8

typedef struct bench_ctx {
  int pp, hidden, seq;
  const tsr_schedule *sched;
  const tsr_registry_t *reg; /* declares pp the stage dim, as the pipeline plugin does */
  int chunks;
  double busy[8], t0[8], t1[8];
  double input_s[8], weight_s[8]; /* time in the split backward's parts */
} bench_ctx;

static tsr_status run(tsr_comm_t *comm, void *arg) {
  bench_ctx *b = arg;
  int me = tsr_comm_rank(comm), shape[1] = {b->pp};
  const char *names[1] = {"pp"};
  tsr_llama_config c = {.vocab_size = 256,
                        .hidden_size = b->hidden,
                        .intermediate_size = b->hidden * 8 / 3,
                        .num_hidden_layers = 8,
                        .num_attention_heads = 4,
                        .num_key_value_heads = 2,
                        .rms_norm_eps = 1e-5f,
                        .rope_theta = 10000.0f};
  tsr_rank_t *r = NULL;
  tsr_mesh_t *m = NULL;
  tsr_llama_t *model = NULL;
  int32_t *ids = malloc(sizeof(int32_t) * ROWS * (size_t)b->seq);
  int32_t *labels = malloc(sizeof(int32_t) * ROWS * (size_t)b->seq);
  tsr_status st = TSR_OK;
  tsr_kernel_set_threads(1);
  if (!ids || !labels) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory");
    goto cleanup;
  }
  for (int i = 0; i < ROWS * b->seq; i++) ids[i] = (i * 7) % 256, labels[i] = (i * 7 + 1) % 256;
  TSR_CHECK_GOTO(tsr_rank_new(comm, b->reg, &r), st);
  TSR_CHECK_GOTO(tsr_mesh_init(b->pp, 1, shape, names, &m), st);
  tsr_llama_layout layout = {b->chunks, NULL, 0};
  TSR_CHECK_GOTO(tsr_llama_new_staged(r, m, &c, 1, &layout, &model), st);
  for (int step = 0; step < 2; step++) {
    tsr_pipe_result res;
    TSR_CHECK_GOTO(
        tsr_llama_pipe_step(model, m, b->sched, MB, ids, labels, ROWS, b->seq, true, false, &res),
        st);
    double busy = 0, t0 = res.events[0].t0, t1 = res.events[res.nevents - 1].t1;
    b->input_s[me] = b->weight_s[me] = 0;
    for (int i = 0; i < res.nevents; i++) {
      double d = res.events[i].t1 - res.events[i].t0;
      if (res.events[i].kind == TSR_PIPE_BACKWARD_INPUT) b->input_s[me] += d;
      if (res.events[i].kind == TSR_PIPE_BACKWARD_WEIGHT) b->weight_s[me] += d;
    }
    for (int i = 0; i < res.nevents; i++)
      if (res.events[i].kind == TSR_PIPE_FORWARD || res.events[i].kind == TSR_PIPE_BACKWARD ||
          res.events[i].kind == TSR_PIPE_BACKWARD_INPUT ||
          res.events[i].kind == TSR_PIPE_BACKWARD_WEIGHT)
        busy += res.events[i].t1 - res.events[i].t0;
    b->busy[me] = busy, b->t0[me] = t0, b->t1[me] = t1;
    tsr_pipe_result_free(&res);
    for (int i = 0; i < tsr_llama_param_count(model); i++)
      tsr_var_zero_grad(tsr_llama_param(model, i));
  }
cleanup:
  tsr_llama_free(model);
  tsr_mesh_free(m);
  tsr_rank_free(r);
  free(ids);
  free(labels);
  return st;
}

int main(int argc, char **argv) {
  tsr_kernel_blas_reexec(argv); /* the product's own setting (tessera run does the same) */
  int hidden = argc > 1 ? atoi(argv[1]) : 128, seq = argc > 2 ? atoi(argv[2]) : 64;
  static const tsr_schedule scheds[4] = {
      {"gpipe", "bench", tsr_pp_gpipe, NULL},
      {"1f1b", "bench", tsr_pp_1f1b, NULL},
      {"interleaved_1f1b", "bench", tsr_pp_interleaved, (void *)(intptr_t)2},
      {"zero_bubble", "bench", tsr_pp_zero_bubble, NULL}};
  static const int chunks[4] = {1, 1, 2, 1};
  tsr_registry_t *reg = NULL;
  if (tsr_registry_new(&reg) != TSR_OK ||
      tsr_registry_set_stage_dim(reg, "bench", "pp") != TSR_OK) {
    fprintf(stderr, "bench_pp: %s\n", tsr_last_error());
    return 1;
  }
  printf("pipeline bubble, %d microbatches of %d rows x %d tokens, hidden %d, 8 layers, %d "
         "cores\n",
         MB, ROWS / MB, seq, hidden, tsr_kernel_num_cores());
  printf("%-18s %3s %6s %10s %10s %12s %8s\n", "schedule", "pp", "chunks", "analytic", "measured",
         "step ms", "W share");
  for (int s = 0; s < 4; s++)
    for (int pp = 2; pp <= 4; pp *= 2) {
      bench_ctx b = {.pp = pp,
                     .hidden = hidden,
                     .seq = seq,
                     .sched = &scheds[s],
                     .reg = reg,
                     .chunks = chunks[s]};
      if (tsr_local_launch(pp, 120.0, run, &b) != TSR_OK) {
        fprintf(stderr, "bench_pp: %s\n", tsr_last_error());
        return 1;
      }
      double t0 = b.t0[0], t1 = b.t1[0], busy = 0, in_s = 0, w_s = 0;
      for (int r = 0; r < pp; r++) {
        t0 = b.t0[r] < t0 ? b.t0[r] : t0;
        t1 = b.t1[r] > t1 ? b.t1[r] : t1;
        busy += b.busy[r] / pp;
        in_s += b.input_s[r], w_s += b.weight_s[r];
      }
      char share[16] = "-";
      if (in_s + w_s > 0) snprintf(share, sizeof share, "%.2f", w_s / (in_s + w_s));
      double analytic = tsr_pipe_simulate(&scheds[s], pp, chunks[s], MB, 1.0, 2.0, NULL);
      printf("%-18s %3d %6d %10.3f %10.3f %12.1f %8s\n", scheds[s].name, pp, chunks[s], analytic,
             1.0 - busy / (t1 - t0), (t1 - t0) * 1e3, share);
    }
  tsr_registry_free(reg);
  return 0;
}
