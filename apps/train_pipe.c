/* The training loop's pipeline path: the schedule of the plugin that owns `pp`, run per
 * accumulation step by tsr_llama_pipe_step; the dump's logits and loss of the whole batch; the
 * [output] trace; the timeline `tessera plan` prints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/io.h"
#include "tessera/kernels.h"
#include "train.h"

/* The mesh dim the pipeline stages are on, as its owner declared it; "" when none did. */
static const char *stage_dim(const tsr_app_job *job) {
  const char *d = tsr_registry_stage_dim(job->reg);
  return d ? d : "";
}

/* [strategy.OWNER] `key` of the plugin that owns the stage dim, defaults applied; NULL when none
 * does. */
static const char *owner_key(const tsr_app_job *job, const char *key) {
  const char *owner = tsr_plugin_set_owner(job->plugins, stage_dim(job));
  if (!owner) return NULL;
  for (int i = 0; i < tsr_plugin_set_count(job->plugins); i++) {
    const tsr_strategy *s = tsr_plugin_set_strategy(job->plugins, i);
    if (s && strcmp(s->name, owner) == 0) return tsr_config_get(job->cfg, owner, s->keys, key);
  }
  return NULL;
}

static tsr_status find_pipe(const tsr_app_job *job, const tsr_schedule **sched, int *mb) {
  *sched = NULL;
  *mb = 1;
  const char *dim = stage_dim(job);
  if (tsr_mesh_size_of(job->mesh, dim) <= 1) return TSR_OK;
  const char *name = owner_key(job, "schedule"), *m = owner_key(job, "microbatches");
  const char *owner = tsr_plugin_set_owner(job->plugins, dim);
  if (!name || !m)
    return tsr_error(TSR_EINVAL,
                     "mesh dim %s has %d stages but its owner (%s) declares no "
                     "'schedule' and 'microbatches' keys to run them with",
                     dim, tsr_mesh_size_of(job->mesh, dim), owner ? owner : "none");
  *sched = tsr_registry_find_schedule(job->reg, name);
  if (!*sched)
    return tsr_error(TSR_EINVAL,
                     "[strategy.%s] schedule = %s: no such pipeline schedule is "
                     "registered",
                     owner, name);
  *mb = atoi(m);
  return TSR_OK;
}

/* The stage layout of [strategy.OWNER] stages_per_rank and layers_per_stage (validated by the
 * owner at plan time); *n = 0 for an even split. */
static void pipe_layout(const tsr_app_job *job, int *spr, int *counts, int cap, int *n) {
  const char *v = owner_key(job, "stages_per_rank"), *l = owner_key(job, "layers_per_stage");
  *spr = v ? atoi(v) : 1;
  *n = 0;
  for (const char *at = l; at && *at && *n < cap;) {
    char *end = NULL;
    long x = strtol(at, &end, 10);
    if (end == at) break;
    counts[(*n)++] = (int)x;
    for (at = end; *at == ',' || *at == ' ' || *at == '\t'; at++) {
    }
  }
}

tsr_status tsr_train_model_new(const tsr_app_job *job, tsr_rank_t *r, tsr_llama_t **out) {
  int spr = 1, n = 0, counts[1024];
  pipe_layout(job, &spr, counts, 1024, &n);
  tsr_llama_config mc = tsr_train_model_config(job->cfg);
  tsr_llama_layout layout = {spr, counts, n};
  tsr_status st = tsr_llama_new_staged(r, job->mesh, &mc, (uint64_t)job->cfg->job.seed,
                                       spr <= 1 && n == 0 ? NULL : &layout, out);
  if (st != TSR_OK && (spr > 1 || n > 0)) return tsr_error_prefix(st, "[strategy.pp] stage layout");
  return st;
}

tsr_status tsr_train_pipe_setup(tsr_train_rank *t) {
  return find_pipe(t->job, &t->pipe, &t->microbatches);
}

tsr_status tsr_train_tied_grad_sync(tsr_train_rank *t) {
  if (t->nopt <= t->nparams) return TSR_OK;
  tsr_status st = tsr_llama_tied_grad_sync(t->model);
  return st == TSR_OK ? st : tsr_error_prefix(st, "[model] tie_word_embeddings over pp stages");
}

tsr_status tsr_train_clip_grads(tsr_train_rank *t, double max_norm, double *gnorm) {
  /* the norm over the parameters alone: the replica's gradient equals the embedding's */
  TSR_CHECK(tsr_grad_norm(t->r, t->job->mesh, t->nparams, t->params, gnorm));
  /* a NaN or Inf norm scales nothing: the gradients stay as they were, so that [job]
   * on_nonfinite can name the first one that is not finite */
  if (max_norm <= 0.0 || !isfinite(*gnorm)) return TSR_OK;
  float coef = tsr_kernel_clip_coef(*gnorm, max_norm);
  if (coef >= 1.0f) return TSR_OK; /* as tsr_clip_grad_norm: x * 1 is x */
  /* every gradient, the replica's too, scaled as tsr_clip_grad_norm scales them, on its device */
  for (int i = 0; i < t->nopt; i++) {
    tsr_dtensor *g = t->params[i]->grad;
    if (g && g->local) TSR_CHECK(tsr_tensor_scale(g->local, coef));
  }
  return TSR_OK;
}

static const char *kind_name(int kind);

/* The schedule's actions of this rank into its trace ([output] trace), with the microbatch and
 * the stage (chunk * pp + the rank's pp index). */
static void trace_actions(tsr_train_rank *t, const tsr_pipe_result *res) {
  if (!t->trace) return;
  int P = tsr_llama_stage_count(t->model) / tsr_llama_stages_per_rank(t->model), stage = 0;
  for (int s = P - 1; s >= 0; s--)
    if (tsr_mesh_contains(tsr_llama_stage_mesh(t->model, s), tsr_rank_id(t->r))) stage = s;
  for (int i = 0; i < res->nevents; i++) {
    const tsr_pipe_event *e = &res->events[i];
    tsr_trace_add_span("pipeline", kind_name(e->kind), (int64_t)(e->t0 * 1e9),
                       (int64_t)(e->t1 * 1e9), e->microbatch, e->chunk * P + stage);
  }
}

tsr_status tsr_train_pipe_forward_backward(tsr_train_rank *t, int64_t step, const int32_t *ids,
                                           const int32_t *labels, bool train, tsr_train_dump *dump,
                                           double *loss) {
  const tsr_config *c = t->job->cfg;
  int64_t accum = train ? c->optimizer.grad_accum_steps : 1;
  int64_t rows = c->data.batch_size / accum, seq = c->data.seq_len;
  tsr_tensor *parts[64] = {0};
  tsr_status st = TSR_OK;
  bool lead = tsr_rank_id(t->r) == 0;
  (void)step; /* the trace's step event holds the step's actions */
  *loss = 0.0;
  if (dump && accum > 64)
    return TSR_ERROR(TSR_EINVAL, "dumps support at most 64 accumulation steps");
  for (int64_t k = 0; k < accum; k++) {
    tsr_pipe_result res;
    TSR_CHECK_GOTO(tsr_train_docs_pipe(t, k * rows * seq), st);
    TSR_CHECK_GOTO(tsr_llama_pipe_step(t->model, t->job->mesh, t->pipe, t->microbatches,
                                       ids + k * rows * seq, labels + k * rows * seq, rows, seq,
                                       train, dump != NULL, &res),
                   st);
    /* as in train.c: a microbatch of ignored labels only adds nothing */
    if (tsr_train_any_label(labels + k * rows * seq, rows * seq))
      *loss += tsr_train_part_loss(t, k, res.loss) / (double)accum;
    if (res.peak_in_flight > t->peak_in_flight) t->peak_in_flight = res.peak_in_flight;
    trace_actions(t, &res);
    if (lead && dump) {
      parts[k] = res.logits;
      res.logits = NULL;
    }
    tsr_pipe_result_free(&res);
  }
  if (lead && dump) {
    TSR_CHECK_GOTO(tsr_train_dump_add_batch(dump, parts, (int)accum, *loss), st);
  }
cleanup:
  for (int k = 0; k < 64; k++) tsr_tensor_free(parts[k]);
  return st;
}

void tsr_train_pipe_print_plan(const tsr_app_job *job, FILE *f) {
  const tsr_schedule *sched = NULL;
  int mb = 1;
  if (find_pipe(job, &sched, &mb) != TSR_OK) {
    fprintf(f, "pipeline: %s\n", tsr_last_error());
    return;
  }
  if (!sched) return;
  int spr = 1, n = 0, counts[1024];
  pipe_layout(job, &spr, counts, 1024, &n);
  fprintf(f, "pipeline:\n");
  if (n) {
    fprintf(f, "  layers per stage:");
    for (int i = 0; i < n; i++) fprintf(f, " %d", counts[i]);
    fprintf(f, "\n");
  }
  tsr_pipe_print_timeline(sched, tsr_mesh_size_of(job->mesh, stage_dim(job)), spr > 1 ? spr : 1, mb,
                          f);
}

static const char *kind_name(int kind) {
  static const char *const names[] = {"forward",        "backward",       "send_act",
                                      "recv_act",       "send_grad",      "recv_grad",
                                      "backward_input", "backward_weight"};
  return kind >= 0 && kind < 8 ? names[kind] : "?";
}

/* Rank 0 prints each rank's peak of microbatches in flight (activations held at once). */
static tsr_status report_in_flight(tsr_train_rank *t, tsr_group_t *all, FILE *out) {
  int world = tsr_group_size(all);
  int32_t mine = t->peak_in_flight, *every = calloc((size_t)world, sizeof *every);
  if (!every) return TSR_ERROR(TSR_ENOMEM, "out of memory");
  tsr_status st = tsr_comm_all_gather(all, &mine, 1, every, NULL, TSR_I32);
  if (st == TSR_OK && tsr_group_index(all) == 0) {
    if (tsr_llama_stages_per_rank(t->model) > 1)
      fprintf(out,
              "pipeline: schedule %s, %d microbatches, %d chunks per rank; peak (microbatch, "
              "chunk) activation sets in flight per rank:",
              t->pipe->name, t->microbatches, tsr_llama_stages_per_rank(t->model));
    else
      fprintf(out, "pipeline: schedule %s, %d microbatches; peak microbatches in flight per rank:",
              t->pipe->name, t->microbatches);
    for (int r = 0; r < world; r++) fprintf(out, " %d", every[r]);
    fprintf(out, "\n");
  }
  free(every);
  return st;
}

tsr_status tsr_train_pipe_finish(tsr_train_rank *t, tsr_group_t *all, FILE *out) {
  if (!t->pipe) return TSR_OK;
  return report_in_flight(t, all, out);
}

tsr_status tsr_train_pipe_info(const tsr_app_job *job, const tsr_schedule **sched, int *mb,
                               int *spr, int *counts, int cap, int *n) {
  pipe_layout(job, spr, counts, cap, n);
  return find_pipe(job, sched, mb);
}
