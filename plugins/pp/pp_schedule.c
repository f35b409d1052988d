/* The pipeline schedules of the pp plugin, as action lists per stage (tessera/registry.h).
 *
 * Every forward is written as receive-compute-send and every backward likewise, with the stage's
 * first and last transfers included even where the executor drops them (stage 0 receives no
 * activation): the lists then read the same on every stage. */
#include <stdlib.h>

#include "pp_schedule.h"

typedef struct emitter {
  tsr_pipe_action *a;
  int cap, n;
} emitter;

static void emit(emitter *e, tsr_pipe_action_kind kind, int mb, int chunk) {
  if (e->n < e->cap) e->a[e->n] = (tsr_pipe_action){kind, mb, chunk};
  e->n++;
}

static void forward_c(emitter *e, int mb, int chunk) {
  emit(e, TSR_PIPE_RECV_ACT, mb, chunk);
  emit(e, TSR_PIPE_FORWARD, mb, chunk);
  emit(e, TSR_PIPE_SEND_ACT, mb, chunk);
}

static void backward_c(emitter *e, tsr_pipe_action_kind kind, int mb, int chunk) {
  emit(e, TSR_PIPE_RECV_GRAD, mb, chunk);
  emit(e, kind, mb, chunk);
  emit(e, TSR_PIPE_SEND_GRAD, mb, chunk);
}

static void forward(emitter *e, int mb) {
  forward_c(e, mb, 0);
}

static void backward(emitter *e, int mb) {
  backward_c(e, TSR_PIPE_BACKWARD, mb, 0);
}

static tsr_status check_args(const char *name, int stages, int microbatches, int stage) {
  if (stages < 1 || microbatches < 1 || stage < 0 || stage >= stages)
    return tsr_error(TSR_EINVAL, "%s: stage %d of %d with %d microbatches is out of range", name,
                     stage, stages, microbatches);
  return TSR_OK;
}

static tsr_status finish(const char *name, const emitter *e, int *n) {
  *n = e->n;
  if (e->n > e->cap)
    return tsr_error(TSR_EINVAL, "%s: %d actions do not fit in %d", name, e->n, e->cap);
  return TSR_OK;
}

tsr_status tsr_pp_gpipe(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                        int *n, void *ctx) {
  (void)ctx;
  TSR_CHECK(check_args("gpipe", stages, microbatches, stage));
  emitter e = {actions, cap, 0};
  for (int k = 0; k < microbatches; k++) forward(&e, k);
  /* backward in reverse, as autograd over the concatenated batch would run it */
  for (int k = microbatches - 1; k >= 0; k--) backward(&e, k);
  return finish("gpipe", &e, n);
}

tsr_status tsr_pp_1f1b(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                       int *n, void *ctx) {
  (void)ctx;
  TSR_CHECK(check_args("1f1b", stages, microbatches, stage));
  emitter e = {actions, cap, 0};
  /* Stage s starts the first backward after stages - s forwards, then alternates: at most
   * stages - s microbatches hold activations at once. */
  int warm = stages - stage - 1 < microbatches ? stages - stage - 1 : microbatches;
  for (int k = 0; k < warm; k++) forward(&e, k);
  for (int j = 0; j < microbatches - warm; j++) {
    forward(&e, warm + j);
    backward(&e, j);
  }
  for (int j = microbatches - warm; j < microbatches; j++) backward(&e, j);
  return finish("1f1b", &e, n);
}

/* Megatron's order of a rank's i-th forward (backward: chunks in reverse) over its chunks:
 * `stages` microbatches through chunk 0, the same through chunk 1, ..., then the next group. */
static void unit(int i, int stages, int chunks, bool backward_order, int *mb, int *chunk) {
  int c = (i / stages) % chunks;
  *chunk = backward_order ? chunks - 1 - c : c;
  *mb = (i / (stages * chunks)) * stages + i % stages;
}

tsr_status tsr_pp_interleaved(int stages, int microbatches, int stage, tsr_pipe_action *actions,
                              int cap, int *n, void *ctx) {
  int chunks = (int)(intptr_t)ctx;
  TSR_CHECK(check_args("interleaved_1f1b", stages, microbatches, stage));
  if (chunks < 2)
    return tsr_error(TSR_EINVAL,
                     "interleaved_1f1b: %d model chunks per rank; it needs at least 2 "
                     "(stages_per_rank)",
                     chunks);
  if (microbatches % stages)
    return tsr_error(TSR_EINVAL,
                     "interleaved_1f1b: %d microbatches are not a multiple of the %d pipeline "
                     "ranks",
                     microbatches, stages);
  emitter e = {actions, cap, 0};
  int total = microbatches * chunks, mb, c;
  int warm = (stages - stage - 1) * 2 + (chunks - 1) * stages;
  if (warm > total) warm = total;
  for (int i = 0; i < warm; i++) {
    unit(i, stages, chunks, false, &mb, &c);
    forward_c(&e, mb, c);
  }
  for (int j = 0; j < total - warm; j++) {
    unit(warm + j, stages, chunks, false, &mb, &c);
    forward_c(&e, mb, c);
    unit(j, stages, chunks, true, &mb, &c);
    backward_c(&e, TSR_PIPE_BACKWARD, mb, c);
  }
  for (int j = total - warm; j < total; j++) {
    unit(j, stages, chunks, true, &mb, &c);
    backward_c(&e, TSR_PIPE_BACKWARD, mb, c);
  }
  return finish("interleaved_1f1b", &e, n);
}

/* Stage `stage`'s j-th input part, then the weight part it lets run: stage s holds back s
 * weight parts, so the last stage's fill its cool-down, while F - W stays at most pp. */
static void zb_backward(emitter *e, int stage, int j) {
  backward_c(e, TSR_PIPE_BACKWARD_INPUT, j, 0);
  if (j - stage >= 0) emit(e, TSR_PIPE_BACKWARD_WEIGHT, j - stage, 0);
}

tsr_status tsr_pp_zero_bubble(int stages, int microbatches, int stage, tsr_pipe_action *actions,
                              int cap, int *n, void *ctx) {
  (void)ctx;
  TSR_CHECK(check_args("zero_bubble", stages, microbatches, stage));
  emitter e = {actions, cap, 0};
  int M = microbatches;
  int warm = stages - stage - 1 < M ? stages - stage - 1 : M;
  for (int k = 0; k < warm; k++) forward(&e, k);
  for (int j = 0; j < M - warm; j++) {
    forward(&e, warm + j);
    zb_backward(&e, stage, j);
  }
  for (int j = M - warm; j < M; j++) zb_backward(&e, stage, j);
  /* the weight parts still held back */
  for (int k = M - stage > 0 ? M - stage : 0; k < M; k++) emit(&e, TSR_PIPE_BACKWARD_WEIGHT, k, 0);
  return finish("zero_bubble", &e, n);
}
