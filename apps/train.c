/* The training loop: every rank runs run_rank; rank 0 also writes the log and the files. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tessera/breadcrumb.h"
#include "tessera/io.h"
#include "tessera/kernels.h"
#include "tessera_mpi.h"
#include "tessera_nccl.h"
#include "train.h"
#include "train_ckpt.h"
#include "train_log.h"
#include "train_mem.h"

/* Shared read-only by the rank threads, except `log`, which only rank 0 touches. */
typedef struct run_ctx {
  const tsr_app_job *job;
  const tsr_train_opts *opts;
  int threads;
  tsr_train_log log;
  bool check; /* tsr_train_check_first_step: one step on local threads, nothing written */
} run_ctx;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

tsr_llama_config tsr_train_model_config(const tsr_config *c) {
  tsr_llama_config m = {
      .vocab_size = (int)c->model.vocab_size,
      .hidden_size = (int)c->model.hidden_size,
      .intermediate_size = (int)c->model.intermediate_size,
      .num_hidden_layers = (int)c->model.num_hidden_layers,
      .num_attention_heads = (int)c->model.num_attention_heads,
      .num_key_value_heads = (int)(c->model.num_key_value_heads ? c->model.num_key_value_heads
                                                                : c->model.num_attention_heads),
      .rms_norm_eps = (float)c->model.rms_norm_eps,
      .rope_theta = (float)c->model.rope_theta,
      .tie_word_embeddings = c->model.tie_word_embeddings,
      .num_local_experts = (int)tsr_config_ext_of(c)->model.num_local_experts,
      .num_experts_per_tok = (int)tsr_config_ext_of(c)->model.num_experts_per_tok,
      .decoder_sparse_step = (int)tsr_config_ext_of(c)->model.decoder_sparse_step,
      .router_aux_loss_coef = (float)tsr_config_ext_of(c)->model.router_aux_loss_coef,
      .checkpoint_every =
          tsr_config_ext_of(c)->model_memory.activation_checkpointing != TSR_ACT_CKPT_NONE
              ? (int)tsr_config_ext_of(c)->model_memory.checkpoint_every
              : 0,
      .checkpoint_selective =
          tsr_config_ext_of(c)->model_memory.activation_checkpointing == TSR_ACT_CKPT_SELECTIVE,
  };
  return m;
}

/* Every rank ends up with the worst status of any rank: rank-0-only work (writing files) must not
 * leave the others waiting in the next collective until the timeout. */
static tsr_status agree(tsr_group_t *all, tsr_status st) {
  int32_t mine = (int32_t)st, worst = 0;
  tsr_status cs = tsr_comm_all_reduce(all, &mine, &worst, 1, TSR_I32, TSR_REDUCE_MAX);
  if (cs != TSR_OK) return cs;
  if (st == TSR_OK && worst != TSR_OK)
    return tsr_error((tsr_status)worst, "another rank failed (rank 0 writes the files); see its "
                                        "message");
  return st;
}

/* The scalar value of a loss var on every rank (collective over its mesh). */
static tsr_status loss_value(tsr_train_rank *t, const tsr_var *loss, double *out) {
  tsr_tensor *full = NULL;
  TSR_CHECK(tsr_dtensor_full_tensor(t->r, loss->value, &full));
  *out = tsr_tensor_get(full, NULL);
  tsr_tensor_free(full);
  return TSR_OK;
}

bool tsr_train_any_label(const int32_t *labels, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (labels[i] != -100) return true;
  return false;
}

/* One optimizer step's worth of forward (and, when training, backward) over the microbatches of
 * one global batch. Fills *loss with the mean microbatch loss; on the dump step adds the logits
 * and the loss to `dump`. */
static tsr_status forward_backward(tsr_train_rank *t, tsr_tape_t *tape, const int32_t *ids,
                                   const int32_t *labels, bool train, tsr_train_dump *dump,
                                   double *loss) {
  const tsr_config *c = t->job->cfg;
  int64_t accum = train ? c->optimizer.grad_accum_steps : 1;
  int64_t rows = c->data.batch_size / accum, seq = c->data.seq_len;
  tsr_tensor *parts[64] = {0};
  tsr_var *x = NULL, *y = NULL, *dseg = NULL, *dpos = NULL; /* dseg, dpos: mask = document */
  tsr_status st = TSR_OK;
  bool cat = dump && accum > 1 && accum <= 64;
  *loss = 0.0;
  for (int64_t k = 0; k < accum; k++) {
    tsr_var *logits = NULL, *l = NULL;
    tsr_breadcrumb_here()->microbatch = (int)k;
    TSR_CHECK_GOTO(tsr_llama_batch(t->r, t->job->mesh, rows, seq, ids + k * rows * seq, &x), st);
    TSR_CHECK_GOTO(tsr_llama_batch(t->r, t->job->mesh, rows, seq, labels + k * rows * seq, &y), st);
    TSR_CHECK_GOTO(tsr_train_docs_begin(t, k, &dseg, &dpos), st);
    TSR_CHECK_GOTO(tsr_llama_forward(t->model, tape, x, y, &logits, &l), st);
    double v;
    TSR_CHECK_GOTO(loss_value(t, l, &v), st);
    /* a microbatch whose labels are all ignored has no loss (NaN, as F.cross_entropy) and no
     * gradient: it weighs nothing, so it adds nothing */
    if (tsr_train_any_label(labels + k * rows * seq, rows * seq))
      *loss += tsr_train_part_loss(t, k, v) / (double)accum;
    if (dump && accum == 1) {
      TSR_CHECK_GOTO(tsr_train_dump_add(t, dump, "logits", logits->value), st);
      TSR_CHECK_GOTO(tsr_train_dump_add(t, dump, "loss", l->value), st);
    } else if (cat && logits->value->local) {
      TSR_CHECK_GOTO(tsr_dtensor_full_tensor(t->r, logits->value, &parts[k]), st);
    }
    if (train) TSR_CHECK_GOTO(tsr_tape_backward(tape, l), st);
    tsr_tape_reset(tape);
    tsr_var_free(x);
    tsr_var_free(y);
    x = y = NULL;
    tsr_train_docs_end(t, dseg, dpos);
    dseg = dpos = NULL;
  }
  if (cat && tsr_rank_id(t->r) == 0 && parts[0]) {
    TSR_CHECK_GOTO(tsr_train_dump_add_batch(dump, parts, (int)accum, *loss), st);
  }
cleanup:
  tsr_breadcrumb_here()->microbatch = -1;
  tsr_tape_reset(tape);
  tsr_var_free(x);
  tsr_var_free(y);
  tsr_train_docs_end(t, dseg, dpos);
  for (int k = 0; k < 64; k++) tsr_tensor_free(parts[k]);
  return st;
}

/* Adds "<prefix><name>" for every parameter's value (grads: which = 1) to the dump. */
static tsr_status dump_params(tsr_train_rank *t, tsr_train_dump *d, const char *prefix,
                              bool grads) {
  for (int i = 0; i < t->nparams; i++) {
    const tsr_dtensor *x = grads ? t->params[i]->grad : t->params[i]->value;
    TSR_CHECK(tsr_train_dump_add_param(t, d, prefix, i, x));
  }
  return TSR_OK;
}

/* `mem`, when not NULL, receives the state bytes while gradients and moments both exist. */
static tsr_status optimizer_step(tsr_train_rank *t, tsr_group_t *all, tsr_tape_t *tape,
                                 int64_t step, double lr, tsr_train_dump *dump, tsr_train_mem *mem,
                                 double *gnorm, bool *skip) {
  const tsr_config *c = t->job->cfg;
  const tsr_registry_t *reg = tsr_rank_registry(t->r);
  for (int i = 0; i < t->nopt; i++) {
    tsr_status st = tsr_var_resolve_grad(tape, t->params[i]);
    if (st != TSR_OK) return tsr_error_prefix(st, "gradient of %s", t->params[i]->name);
  }
  TSR_CHECK(tsr_train_tied_grad_sync(t));
  int64_t accum = c->optimizer.grad_accum_steps;
  if (accum > 1)
    for (int i = 0; i < t->nopt; i++) {
      tsr_dtensor *g = t->params[i]->grad;
      if (g->local) TSR_CHECK(tsr_tensor_scale(g->local, (float)(1.0 / (double)accum)));
    }
  if (dump) TSR_CHECK(dump_params(t, dump, "grad.", true));
  TSR_CHECK(tsr_train_clip_grads(t, c->optimizer.max_norm, gnorm));
  /* every rank has the same norm: all stop (or skip the update) here, before a NaN reaches a
   * weight */
  if (!isfinite(*gnorm)) {
    TSR_CHECK(tsr_train_nonfinite(t, all, NULL, step, "gradient norm", *gnorm, skip));
    if (dump) TSR_CHECK(dump_params(t, dump, "after.", false));
    return TSR_OK;
  }
  tsr_dtensor *vals[1024], *grads[1024];
  int nh = t->nparams < 1024 ? t->nparams : 1024;
  for (int i = 0; i < nh; i++) vals[i] = t->params[i]->value, grads[i] = t->params[i]->grad;
  tsr_optim_step info = {step, lr, t->job->mesh, nh, t->names, vals, grads};
  if (reg) TSR_CHECK(tsr_registry_run_optim_hooks(reg, t->r, TSR_HOOK_BEFORE_STEP, &info));
  TSR_CHECK(tsr_adamw_step(t->opt, lr));
  if (reg) TSR_CHECK(tsr_registry_run_optim_hooks(reg, t->r, TSR_HOOK_AFTER_STEP, &info));
  if (dump) TSR_CHECK(dump_params(t, dump, "after.", false));
  if (mem) *mem = tsr_train_mem_measure(t);
  for (int i = 0; i < t->nopt; i++) tsr_var_zero_grad(t->params[i]);
  return TSR_OK;
}

/* The allocator peak of the least and the most loaded rank (pipeline stages and uneven shards
 * differ). Collective over `all`. */
static void peak_range(tsr_train_rank *t, tsr_group_t *all, int64_t *lo, int64_t *hi) {
  int64_t mine = (int64_t)tsr_rank_allocator(t->r)->peak_bytes;
  int64_t v[2] = {mine, -mine}, r[2] = {mine, -mine};
  if (tsr_comm_all_reduce(all, v, r, 2, TSR_I64, TSR_REDUCE_MAX) != TSR_OK) r[0] = r[1] = 0;
  *hi = r[0];
  *lo = -r[1];
}

/* Rank 0 prints every rank's state bytes as measured after the first step. Collective. */
static tsr_status report_mem(tsr_train_rank *t, tsr_group_t *all, const tsr_train_mem *mine,
                             FILE *out) {
  int world = tsr_group_size(all);
  tsr_train_mem *every = calloc((size_t)world, sizeof *every);
  if (!every) return TSR_ERROR(TSR_ENOMEM, "out of memory");
  tsr_status st = tsr_train_mem_gather(all, mine, every);
  if (st == TSR_OK && tsr_group_index(all) == 0 && !t->opts->json)
    tsr_train_mem_print(out, t->job, every, "measured after step 1");
  free(every);
  return st;
}

static tsr_status open_data(tsr_train_rank *t, tsr_data_t **data) {
  const tsr_config *c = t->job->cfg;
  /* the kind (at most a value long), ':' and the resolved path: nothing is cut */
  char src[TSR_TRAIN_PATH_LEN + TSR_MAX_VALUE], path[TSR_TRAIN_PATH_LEN], where[TSR_MAX_PATH + 160];
  const char *colon = strchr(c->data.source, ':');
  if (colon)
    snprintf(src, sizeof src, "%.*s:%s", (int)(colon - c->data.source), c->data.source,
             tsr_train_path(c, colon + 1, path, sizeof path));
  else
    snprintf(src, sizeof src, "%s", c->data.source);
  tsr_status st = tsr_data_open(src, (int)c->model.vocab_size, (int)c->data.batch_size,
                                (int)c->data.seq_len, (uint64_t)c->job.seed, data);
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s", tsr_config_where(c, "data", "source", where, sizeof where));
  return TSR_OK;
}

static tsr_status run_steps(tsr_train_rank *t, run_ctx *ctx, tsr_group_t *all) {
  const tsr_config *c = t->job->cfg;
  bool train = c->job.mode == TSR_MODE_TRAIN, lead = tsr_rank_id(t->r) == 0;
  int64_t end = ctx->opts->stop_at > 0 ? ctx->opts->stop_at : c->job.steps;
  bool check = ctx->check; /* one step, nothing written */
  if (check && end > t->start_step + 1) end = t->start_step + 1;
  int64_t n = c->data.batch_size * c->data.seq_len;
  tsr_data_t *data = NULL;
  tsr_tape_t *tape = NULL;
  int32_t *ids = NULL, *labels = NULL;
  tsr_train_dump dump = {0};
  tsr_train_mem mem = {0, 0, 0};
  tsr_train_eval ev = {0};
  int64_t saved = -1; /* the step of the last periodic checkpoint ([checkpoint] dir) */
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(open_data(t, &data), st);
  TSR_CHECK_GOTO(tsr_train_docs_open(t, data), st);
  if (train) TSR_CHECK_GOTO(tsr_train_eval_open(t, &ev), st);
  tsr_data_set_step(data, t->start_step);
  TSR_CHECK_GOTO(tsr_tape_new(t->r, &tape), st);
  tsr_tape_set_recording(tape, train);
  ids = malloc((size_t)n * sizeof *ids);
  labels = malloc((size_t)n * sizeof *labels);
  if (!ids || !labels) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory for a batch of %lld tokens", (long long)n);
    goto cleanup;
  }
  tsr_lr_config lrc = {c->optimizer.lr_schedule, c->optimizer.lr, c->optimizer.min_lr,
                       c->optimizer.warmup_steps, c->job.steps};
  /* the check step writes nothing: no trace, no metrics, no evaluation */
  if (!check) TSR_CHECK_GOTO(tsr_train_trace_begin(t), st);
  if (lead && !check) st = tsr_train_metrics_open(&ctx->log, c, t->start_step);
  if (lead && !check && st == TSR_OK) st = tsr_train_tboard_open(&ctx->log, c);
  TSR_CHECK_GOTO(agree(all, st), st);
  if (train && !check) TSR_CHECK_GOTO(tsr_train_ckpt_async_begin(t), st);
  if (lead) tsr_train_log_begin(&ctx->log, t->start_step, end);
  for (int64_t step = t->start_step + 1; step <= end; step++) {
    /* the dump's step: --dump-step, else the run's first */
    int64_t dump_step = ctx->opts->dump_step ? ctx->opts->dump_step : t->start_step + 1;
    bool first = step == dump_step && c->output.dump[0] && !check;
    double t0 = now_s(), loss = 0, gnorm = 0, lr = train ? tsr_lr_at(&lrc, step) : 0;
    tsr_breadcrumb_here()->step = step; /* a crash report names the step */
    int64_t trace_step = tsr_trace_clock(), trace_at = trace_step;
    tsr_comm_bytes_reset(tsr_rank_comm(t->r));
    t->bad_parts = 0;
    TSR_CHECK_GOTO(tsr_data_next(data, ids, labels), st);
    TSR_CHECK_GOTO(tsr_train_docs_fetch(t, data), st);
    if (t->pipe)
      TSR_CHECK_GOTO(
          tsr_train_pipe_forward_backward(t, step, ids, labels, train, first ? &dump : NULL, &loss),
          st);
    else
      TSR_CHECK_GOTO(forward_backward(t, tape, ids, labels, train, first ? &dump : NULL, &loss),
                     st);
    tsr_trace_add("phase", train ? "forward_backward" : "forward", trace_at, step, -1);
    TSR_CHECK_GOTO(tsr_train_test_poison(t, step), st);
    /* every rank has the batch's loss: all stop at once, with nothing saved over a good
     * checkpoint, or all skip the update ([job] on_nonfinite) */
    bool skip = false;
    if (!isfinite(loss)) {
      TSR_CHECK_GOTO(tsr_train_nonfinite(t, all, tape, step, "loss", loss, &skip), st);
      gnorm = NAN;
    }
    trace_at = tsr_trace_clock();
    if (train && !skip)
      TSR_CHECK_GOTO(optimizer_step(t, all, tape, step, lr, first ? &dump : NULL,
                                    step == t->start_step + 1 ? &mem : NULL, &gnorm, &skip),
                     st);
    if (train) tsr_trace_add("phase", "optimizer", trace_at, step, -1);
    if (first) {
      st = tsr_train_dump_write(t, &dump);
      tsr_train_dump_free(&dump);
      TSR_CHECK_GOTO(agree(all, st), st);
    }
    tsr_train_step_stats s = {.step = step,
                              .loss = loss,
                              .lr = lr,
                              .grad_norm = gnorm,
                              .secs = now_s() - t0,
                              .train = train,
                              .skipped = skip ? t->skipped : NULL};
    if (lead) tsr_train_log_comm(&ctx->log, tsr_rank_comm(t->r));
    peak_range(t, all, &s.peak_bytes_min, &s.peak_bytes);
    if (lead) tsr_train_log_step(&ctx->log, &s);
    if (!check && tsr_train_eval_due(&ev, step, end)) {
      tsr_train_eval_result er;
      trace_at = tsr_trace_clock();
      TSR_CHECK_GOTO(tsr_train_eval_run(t, &ev, step, ids, labels, &er), st);
      tsr_trace_add("phase", "eval", trace_at, step, -1);
      if (lead) tsr_train_log_eval(&ctx->log, &er);
    }
    tsr_trace_add("step", "step", trace_step, step, -1);
    if (train && !check && step < end && tsr_train_ckpt_due(c, step)) {
      TSR_CHECK_GOTO(tsr_train_ckpt_save(t, all, step, false, ctx->log.out), st);
      saved = step;
    }
    /* [checkpoint] async: a save whose files every rank has written is completed here, and a
     * write that failed stops the run at this step */
    TSR_CHECK_GOTO(tsr_train_ckpt_pending(t, all, false, ctx->log.out), st);
    /* SIGINT or SIGTERM on any rank: every rank stops after this step, and what follows the
     * last step (the checkpoint) is done here */
    int sig = 0;
    TSR_CHECK_GOTO(tsr_train_stop_agree(all, &sig), st);
    if (sig && step < end) {
      /* one rank per process but under local, where rank 0 speaks for the threads */
      if (lead || strcmp(c->job.backend, "local")) tsr_app_stop_note(sig, step, end);
      end = step;
      break;
    }
  }
  if (lead) tsr_train_log_end(&ctx->log);
  if (lead) st = tsr_train_metrics_close(&ctx->log, c);
  if (lead) {
    tsr_status tb = tsr_train_tboard_close(&ctx->log, c);
    if (st == TSR_OK) st = tb;
  }
  TSR_CHECK_GOTO(agree(all, st), st);
  if (check) goto cleanup;
  if (train && end > t->start_step) TSR_CHECK_GOTO(report_mem(t, all, &mem, ctx->log.out), st);
  st = tsr_train_pipe_finish(t, all, ctx->log.out);
  TSR_CHECK_GOTO(agree(all, st), st);
  if (train) {
    int64_t trace_at = tsr_trace_clock();
    st = tsr_train_save_checkpoint(t);
    TSR_CHECK_GOTO(agree(all, st), st);
    if (c->checkpoint.save[0]) tsr_trace_add("phase", "checkpoint", trace_at, end, -1);
    /* the end of the run waits for a save under way in the background */
    TSR_CHECK_GOTO(tsr_train_ckpt_pending(t, all, true, ctx->log.out), st);
    /* the last step goes to [checkpoint] dir too, unless a periodic save just wrote it */
    if (tsr_config_ext_of(c)->checkpoint.dir[0] && saved != end)
      TSR_CHECK_GOTO(tsr_train_ckpt_save(t, all, end, true, ctx->log.out), st);
  }
  st = tsr_train_trace_write(t, all, ctx->log.out);
  TSR_CHECK_GOTO(agree(all, st), st);
cleanup:
  tsr_train_ckpt_async_free(t); /* a background write under way ends before the rank does */
  if (lead) tsr_train_metrics_close(&ctx->log, c); /* after a failure: the lines so far */
  if (lead) tsr_train_tboard_close(&ctx->log, c);  /* and the events */
  tsr_train_trace_end(t);
  tsr_train_eval_close(&ev);
  tsr_train_docs_free(t);
  tsr_train_dump_free(&dump);
  tsr_tape_free(tape);
  tsr_data_close(data);
  free(ids);
  free(labels);
  return st;
}

static tsr_status run_rank(tsr_comm_t *comm, void *arg) {
  run_ctx *ctx = arg;
  const tsr_app_job *job = ctx->job;
  const tsr_config *c = job->cfg;
  tsr_train_rank t = {.job = job, .opts = ctx->opts};
  tsr_status st = TSR_OK;
  /* a stack overflow on this rank's thread is reported too (crash.c) */
  void *crash_stack = tsr_app_crash_thread_begin();
  tsr_kernel_set_threads(ctx->threads); /* the hand kernels' count is per thread */
  TSR_CHECK_GOTO(tsr_rank_new(comm, job->reg, &t.r), st);
  /* every rank of a local job shares device 0 (N virtual ranks on one GPU); under nccl each
   * process has the GPU the backend chose for it */
  int ordinal = !strcmp(c->job.backend, "nccl") && !ctx->check ? tsr_nccl_loader_device(comm) : 0;
  /* the check step lays the job out as it would run, on the CPU: the rules are the same */
  tsr_device_kind dev = ctx->check ? TSR_DEVICE_CPU : c->job.device;
  TSR_CHECK_GOTO(tsr_rank_set_device(t.r, (tsr_device){dev, ordinal}), st);
  TSR_CHECK_GOTO(tsr_rank_set_matmul_dtype(t.r, c->job.dtype), st);
  TSR_CHECK_GOTO(tsr_train_model_new(job, t.r, &t.model), st);
  TSR_CHECK_GOTO(tsr_train_pipe_setup(&t), st);
  t.nparams = tsr_llama_param_count(t.model);
  t.params = calloc((size_t)t.nparams + 1, sizeof *t.params);
  t.names = calloc((size_t)t.nparams + 1, sizeof *t.names);
  if (!t.params || !t.names) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory");
    goto cleanup;
  }
  for (int i = 0; i < t.nparams; i++) {
    t.params[i] = tsr_llama_param(t.model, i);
    t.names[i] = tsr_llama_param_name(t.model, i);
  }
  tsr_adamw_config oc = {c->optimizer.beta1, c->optimizer.beta2, c->optimizer.eps,
                         c->optimizer.weight_decay};
  /* the tied replica takes the same AdamW steps as the embedding it copies */
  t.nopt = t.nparams;
  if (tsr_llama_tied_replica(t.model)) t.params[t.nopt++] = tsr_llama_tied_replica(t.model);
  TSR_CHECK_GOTO(tsr_adamw_new(t.r, t.nopt, t.params, &oc, &t.opt), st);
  bool resumed = false;
  TSR_CHECK_GOTO(tsr_train_load_checkpoint(&t, &resumed), st);
  if (c->job.mode == TSR_MODE_FORWARD) t.start_step = 0;
  int world = tsr_comm_world(comm);
  int *ranks = malloc((size_t)world * sizeof *ranks);
  if (!ranks) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory");
    goto cleanup;
  }
  for (int i = 0; i < world; i++) ranks[i] = i;
  /* Its own label keeps the log's few bytes out of the per-dim figures. */
  tsr_group_t *all = NULL;
  st = tsr_comm_group(comm, world, ranks, "log", &all);
  free(ranks);
  if (st != TSR_OK) goto cleanup;
  if (tsr_rank_id(t.r) == 0) {
    ctx->log.nparams = tsr_llama_num_params(tsr_llama_get_config(t.model));
    tsr_train_log_resume(&ctx->log, c, resumed ? t.start_step : -1);
  }
  int64_t end = ctx->opts->stop_at > 0 ? ctx->opts->stop_at : c->job.steps;
  if (c->job.mode == TSR_MODE_TRAIN && t.start_step >= end) {
    if (tsr_rank_id(t.r) == 0)
      fprintf(ctx->log.out, "nothing to run: the checkpoint is at step %lld of %lld\n",
              (long long)t.start_step, (long long)end);
    goto cleanup;
  }
  if (ctx->opts->dump_step && ctx->opts->dump_step <= t.start_step && c->output.dump[0]) {
    st = tsr_error(TSR_EINVAL,
                   "--dump-step %lld: the run resumes after step %lld ([checkpoint] load); dump "
                   "a step after it, or load an earlier checkpoint",
                   (long long)ctx->opts->dump_step, (long long)t.start_step);
    goto cleanup;
  }
  st = run_steps(&t, ctx, all);
cleanup:
  tsr_adamw_free(t.opt);
  tsr_llama_free(t.model);
  free(t.params);
  free(t.names);
  tsr_rank_free(t.r);
  tsr_app_crash_thread_end(crash_stack);
  return st;
}

tsr_status tsr_train_check_config(const tsr_config *c) {
  if (c->data.batch_size % c->optimizer.grad_accum_steps)
    return tsr_config_error(c, TSR_EINVAL, "optimizer", "grad_accum_steps",
                            "%lld does not divide [data] batch_size = %lld; pick a divisor so "
                            "every microbatch has the same rows",
                            (long long)c->optimizer.grad_accum_steps,
                            (long long)c->data.batch_size);
  if (c->optimizer.grad_accum_steps > 64 && c->output.dump[0])
    return tsr_config_error(c, TSR_EINVAL, "optimizer", "grad_accum_steps",
                            "dumps support at most 64 microbatches, got %lld",
                            (long long)c->optimizer.grad_accum_steps);
  tsr_llama_config mc = tsr_train_model_config(c);
  if (mc.num_local_experts > 0) {
    if (mc.num_experts_per_tok > mc.num_local_experts)
      return tsr_config_error(c, TSR_EINVAL, "model", "num_experts_per_tok",
                              "%d is more than num_local_experts = %d; each token goes to at "
                              "most every expert",
                              mc.num_experts_per_tok, mc.num_local_experts);
    if (c->job.dtype != TSR_F32)
      return tsr_config_error(c, TSR_EINVAL, "job", "dtype",
                              "bf16 with num_local_experts = %d: the experts run in f32 only so "
                              "far; set dtype = f32 or num_local_experts = 0",
                              mc.num_local_experts);
    if (c->job.device != TSR_DEVICE_CPU)
      return tsr_config_error(c, TSR_EINVAL, "job", "device",
                              "%s with num_local_experts = %d: the mixture-of-experts kernels run "
                              "on the CPU only so far; set device = cpu",
                              tsr_device_name(c->job.device), mc.num_local_experts);
  }
  tsr_status st = tsr_llama_config_check(&mc);
  if (st != TSR_OK) return tsr_error_prefix(st, "%s: [model]", c->path);
  return TSR_OK;
}

static tsr_status launch(const tsr_app_job *job, const tsr_train_opts *opts, bool check) {
  const tsr_config *c = job->cfg;
  TSR_CHECK(tsr_train_check_config(c));
  if (opts->stop_at > c->job.steps)
    return tsr_error(TSR_EINVAL,
                     "--stop-at %lld is past [job] steps = %lld; stop at or before the last step",
                     (long long)opts->stop_at, (long long)c->job.steps);
  int64_t last = opts->stop_at > 0 ? opts->stop_at : c->job.steps;
  if (opts->dump_step && !c->output.dump[0])
    return tsr_error(TSR_EINVAL,
                     "--dump-step %lld: there is no dump to write; give --dump PATH or [output] "
                     "dump",
                     (long long)opts->dump_step);
  if (opts->dump_step > last)
    return tsr_error(TSR_EINVAL,
                     "--dump-step %lld is past the run's last step, %lld (%s); dump a step the "
                     "run takes",
                     (long long)opts->dump_step, (long long)last,
                     opts->stop_at > 0 ? "--stop-at" : "[job] steps");
  int world = (int)c->mesh.world, cores = tsr_kernel_num_cores();
  run_ctx ctx = {job, opts, tsr_kernel_thread_budget(cores, world), {0}, check};
  ctx.log.out = opts->out ? opts->out : stdout;
  ctx.log.progress = opts->progress;
  ctx.log.json = opts->json;
  ctx.log.tokens_per_step = c->data.batch_size * c->data.seq_len;
  /* Set before any rank computes: OpenBLAS's pool is process-wide. */
  tsr_kernel_set_threads(ctx.threads);
  int used = ctx.threads * world < cores ? ctx.threads * world : cores;
  if (opts->peak_secs > 0) {
    ctx.log.peak_gflops = tsr_kernel_sgemm_peak_gflops(used, opts->peak_secs);
    tsr_kernel_set_threads(ctx.threads);
  }
  ctx.log.peak_threads = used;
  tsr_llama_config mc = tsr_train_model_config(c);
  ctx.log.flops_per_token = tsr_train_flops_per_token(&mc, c->data.seq_len);
  tsr_train_log_header(&ctx.log, job, ctx.threads);
  /* The check step runs every rank as a thread of this process, whatever the backend. */
  if (check) return tsr_local_launch(world, c->job.timeout_s, run_rank, &ctx);
  /* Under mpi this process is one rank of the job (docs/mpi.md). */
  if (!strcmp(c->job.backend, "mpi"))
    return tsr_mpi_loader_launch(world, c->job.timeout_s, run_rank, &ctx);
  if (!strcmp(c->job.backend, "nccl"))
    return tsr_nccl_loader_launch(world, c->job.timeout_s, run_rank, &ctx);
  return tsr_local_launch(world, c->job.timeout_s, run_rank, &ctx);
}

tsr_status tsr_train_run(const tsr_app_job *job, const tsr_train_opts *opts) {
  return launch(job, opts, false);
}

tsr_status tsr_train_check_first_step(const tsr_app_job *job) {
  FILE *null = fopen("/dev/null", "w");
  if (!null) return TSR_ERROR(TSR_EIO, "cannot open /dev/null for the check step's log");
  tsr_train_opts opts = {.out = null};
  tsr_status st = launch(job, &opts, true);
  fclose(null);
  return st;
}
