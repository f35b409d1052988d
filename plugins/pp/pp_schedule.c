/* The pipeline schedules of the pp plugin, as action lists per stage (tessera/registry.h).
 *
 * Every forward is written as receive-compute-send and every backward likewise, with the stage's
 * first and last transfers included even where the executor drops them (stage 0 receives no
 * activation): the lists then read the same on every stage. */
#include "pp_schedule.h"

typedef struct emitter {
  tsr_pipe_action *a;
  int cap, n;
} emitter;

static void emit(emitter *e, tsr_pipe_action_kind kind, int mb) {
  if (e->n < e->cap) e->a[e->n] = (tsr_pipe_action){kind, mb, 0};
  e->n++;
}

static void forward(emitter *e, int mb) {
  emit(e, TSR_PIPE_RECV_ACT, mb);
  emit(e, TSR_PIPE_FORWARD, mb);
  emit(e, TSR_PIPE_SEND_ACT, mb);
}

static void backward(emitter *e, int mb) {
  emit(e, TSR_PIPE_RECV_GRAD, mb);
  emit(e, TSR_PIPE_BACKWARD, mb);
  emit(e, TSR_PIPE_SEND_GRAD, mb);
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
