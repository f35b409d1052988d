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

static tsr_status keep_events(tsr_train_rank *t, int64_t step, const tsr_pipe_result *res) {
  if (!t->job->cfg->output.trace[0]) return TSR_OK;
  if (t->nevents + res->nevents > t->cap_events) {
    int cap = 2 * (t->nevents + res->nevents) + 64;
    tsr_pipe_event *e = realloc(t->events, (size_t)cap * sizeof *e);
    if (!e) return TSR_ERROR(TSR_ENOMEM, "trace: out of memory for %d events", cap);
    t->events = e;
    int64_t *s = realloc(t->event_steps, (size_t)cap * sizeof *s);
    if (!s) return TSR_ERROR(TSR_ENOMEM, "trace: out of memory for %d events", cap);
    t->event_steps = s;
    t->cap_events = cap;
  }
  for (int i = 0; i < res->nevents; i++) {
    t->events[t->nevents] = res->events[i];
    t->event_steps[t->nevents++] = step;
  }
  return TSR_OK;
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
  *loss = 0.0;
  if (dump && accum > 64)
    return TSR_ERROR(TSR_EINVAL, "dumps support at most 64 accumulation steps");
  for (int64_t k = 0; k < accum; k++) {
    tsr_pipe_result res;
    TSR_CHECK_GOTO(tsr_llama_pipe_step(t->model, t->job->mesh, t->pipe, t->microbatches,
                                       ids + k * rows * seq, labels + k * rows * seq, rows, seq,
                                       train, dump != NULL, &res),
                   st);
    /* as in train.c: a microbatch of ignored labels only adds nothing */
    if (tsr_train_any_label(labels + k * rows * seq, rows * seq))
      *loss += tsr_train_part_loss(t, k, res.loss) / (double)accum;
    if (res.peak_in_flight > t->peak_in_flight) t->peak_in_flight = res.peak_in_flight;
    st = keep_events(t, step, &res);
    if (lead && dump) {
      parts[k] = res.logits;
      res.logits = NULL;
    }
    tsr_pipe_result_free(&res);
    TSR_CHECK_GOTO(st, st);
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
  const tsr_config *c = t->job->cfg;
  if (!t->pipe) return TSR_OK;
  TSR_CHECK(report_in_flight(t, all, out));
  if (!c->output.trace[0]) return TSR_OK;
  int world = tsr_group_size(all), me = tsr_group_index(all);
  /* each event as 6 integers: step, kind, microbatch, stage, t0 and t1 in ns */
  size_t *counts = calloc((size_t)world, sizeof *counts);
  int64_t *mine = malloc(((size_t)t->nevents * 6 + 1) * sizeof *mine), *every = NULL;
  int64_t n = t->nevents, *ns = calloc((size_t)world, sizeof *ns);
  /* the rank's pp index: its first stage; an event's stage is chunk * pp + that */
  int stage = 0, P = tsr_llama_stage_count(t->model) / tsr_llama_stages_per_rank(t->model);
  for (int s = P - 1; s >= 0; s--)
    if (tsr_mesh_contains(tsr_llama_stage_mesh(t->model, s), tsr_rank_id(t->r))) stage = s;
  tsr_status st = TSR_OK;
  if (!counts || !mine || !ns) {
    st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
    goto cleanup;
  }
  for (int i = 0; i < t->nevents; i++) {
    int64_t *e = mine + 6 * i;
    e[0] = t->event_steps[i], e[1] = t->events[i].kind, e[2] = t->events[i].microbatch;
    e[3] = t->events[i].chunk * P + stage, e[4] = (int64_t)(t->events[i].t0 * 1e9),
    e[5] = (int64_t)(t->events[i].t1 * 1e9);
  }
  TSR_CHECK_GOTO(tsr_comm_all_gather(all, &n, 1, ns, NULL, TSR_I64), st);
  size_t total = 0;
  for (int r = 0; r < world; r++) total += (counts[r] = (size_t)ns[r] * 6);
  every = malloc((total + 1) * sizeof *every);
  if (!every) {
    st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory for %zu values", total);
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_comm_all_gather(all, mine, (size_t)n * 6, every, counts, TSR_I64), st);
  if (me == 0) {
    /* built in memory, then written as every output is: a temporary beside the path, renamed
     * over it, so that a symlink there is replaced rather than followed and a failed write
     * leaves the old file */
    char path[TSR_TRAIN_PATH_LEN], *text = NULL, where[TSR_MAX_PATH + 160];
    size_t len = 0;
    tsr_train_path(c, c->output.trace, path, sizeof path);
    FILE *f = open_memstream(&text, &len);
    if (!f) {
      st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
      goto cleanup;
    }
    int64_t t0 = 0;
    for (size_t i = 0; i < total; i += 6)
      if (i == 0 || every[i + 4] < t0) t0 = every[i + 4];
    fprintf(f, "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n");
    size_t at = 0;
    for (int r = 0; r < world; r++) {
      int st_r = ns[r] ? (int)every[at + 3] : 0;
      fprintf(f,
              "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, "
              "\"args\": {\"name\": \"rank %d (stage %d)\"}},\n",
              r, r, st_r);
      for (int64_t i = 0; i < ns[r]; i++, at += 6) {
        const int64_t *e = every + at;
        fprintf(f,
                "{\"name\": \"%s %d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, "
                "\"ts\": %.3f, \"dur\": %.3f, \"args\": {\"step\": %d, \"microbatch\": %d, "
                "\"stage\": %d}},\n",
                kind_name((int)e[1]), (int)e[2], kind_name((int)e[1]), r,
                (double)(e[4] - t0) * 1e-3, (double)(e[5] - e[4]) * 1e-3, (int)e[0], (int)e[2],
                (int)e[3]);
      }
    }
    fprintf(f, "{\"name\": \"end\", \"ph\": \"i\", \"pid\": 0, \"tid\": 0, \"ts\": 0, \"s\": "
               "\"g\"}\n]}\n");
    if (fclose(f) != 0) {
      free(text);
      st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
      goto cleanup;
    }
    st = tsr_file_write_atomic(path, text, len);
    free(text);
    if (st != TSR_OK)
      st = tsr_error_prefix(st, "%s", tsr_config_where(c, "output", "trace", where, sizeof where));
  }
cleanup:
  free(counts);
  free(mine);
  free(every);
  free(ns);
  return st;
}
