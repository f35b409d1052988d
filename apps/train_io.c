/* Files of the training loop: checkpoints in and out, and the first-step dump. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hf.h"
#include "tessera/io.h"
#include "train.h"
#include "train_ckpt.h"

const char *tsr_train_path(const tsr_config *cfg, const char *value, char *buf, size_t len) {
  if (value[0] == '/' || !strcmp(cfg->dir, "."))
    snprintf(buf, len, "%s", value);
  else
    snprintf(buf, len, "%s/%s", cfg->dir, value);
  return buf;
}

/* One full f32 tensor per parameter, shaped as its global value. */
static tsr_status alloc_full(tsr_train_rank *t, tsr_tensor ***out) {
  tsr_tensor **full = calloc((size_t)t->nparams + 1, sizeof *full);
  if (!full) return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
  for (int i = 0; i < t->nparams; i++) {
    const tsr_dtensor *v = t->params[i]->value;
    tsr_status st = tsr_tensor_new(NULL, TSR_F32, v->ndim, v->shape, &full[i]);
    if (st != TSR_OK) {
      for (int k = 0; k < i; k++) tsr_tensor_free(full[k]);
      free(full);
      return st;
    }
  }
  *out = full;
  return TSR_OK;
}

static void free_full(tsr_tensor **full, int n) {
  if (!full) return;
  for (int i = 0; i < n; i++) tsr_tensor_free(full[i]);
  free(full);
}

/* Copies this rank's shard of `full` into `dst` (placed like `like`). */
static tsr_status scatter_into(tsr_train_rank *t, const tsr_dtensor *like, const tsr_tensor *full,
                               tsr_dtensor *dst) {
  if (!dst || !dst->local) return TSR_OK;
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_dtensor_distribute(t->r, like->mesh, full, like->placements, &d));
  tsr_status st = tsr_tensor_copy(dst->local, d->local);
  tsr_dtensor_free(d);
  return st;
}

/* Index of the parameter the tied replica copies (model.embed_tokens.weight); -1 without one. */
static int tied_source(const tsr_train_rank *t) {
  if (t->nopt <= t->nparams) return -1;
  for (int i = 0; i < t->nparams; i++)
    if (!strcmp(t->names[i], "model.embed_tokens.weight")) return i;
  return -1;
}

tsr_status tsr_train_load_checkpoint(tsr_train_rank *t, bool *resumed) {
  const tsr_config *cfg = t->job->cfg;
  *resumed = false;
  if (!cfg->checkpoint.load[0]) return TSR_OK;
  if (tsr_train_ckpt_wants_load(cfg)) return tsr_train_ckpt_load(t, resumed); /* sharded */
  char path[TSR_TRAIN_PATH_LEN], optim[TSR_TRAIN_PATH_LEN + 16], where[TSR_MAX_PATH + 160];
  tsr_train_path(cfg, cfg->checkpoint.load, path, sizeof path);
  if (tsr_hf_is_folder(path)) return tsr_hf_train_load(t, path); /* weights only (docs/hf.md) */
  tsr_tensor **full = NULL, **ea = NULL, **eas = NULL;
  tsr_train_hf hf = {0}, hf2 = {0}; /* the files' tensors: views into full, or ea and eas */
  char *model_file = NULL;
  tsr_status st = TSR_OK;
  const char *ignore[16];
  int nignore = 0;
  for (int i = 0; i < tsr_checkpoint_hf_buffers_count && nignore < 15; i++)
    ignore[nignore++] = tsr_checkpoint_hf_buffers[i];
  /* Tied models have no lm_head parameter; HF checkpoints of them may still store the copy. */
  if (cfg->model.tie_word_embeddings) ignore[nignore++] = "lm_head.weight";
  tsr_checkpoint_opts opts = {nignore, ignore};
  TSR_CHECK_GOTO(tsr_checkpoint_optim_path(path, optim, sizeof optim), st);
  /* With the optimizer file beside it, the two must be one save's (or the model file that save
   * left as a temporary when it was killed between its two renames). */
  bool has_optim = access(optim, F_OK) == 0;
  if (has_optim) {
    st = tsr_checkpoint_pair(path, optim, &model_file);
    if (st != TSR_OK) {
      st = tsr_error_prefix(st, "%s",
                            tsr_config_where(cfg, "checkpoint", "load", where, sizeof where));
      goto cleanup;
    }
    if (strcmp(model_file, path) && tsr_rank_id(t->r) == 0)
      fprintf(t->opts->out ? t->opts->out : stdout,
              "checkpoint: the save of %s was killed before it renamed %s into place; loading "
              "its complete model file %s\n",
              optim, path, model_file);
  }
  TSR_CHECK_GOTO(alloc_full(t, &full), st);
  TSR_CHECK_GOTO(tsr_train_hf_split(t, full, &hf), st);
  st = tsr_checkpoint_load_model(model_file ? model_file : path, hf.n,
                                 (const char *const *)hf.names, hf.views, &opts);
  tsr_train_hf_free(&hf);
  if (st != TSR_OK) {
    st = tsr_error_prefix(st, "%s",
                          tsr_config_where(cfg, "checkpoint", "load", where, sizeof where));
    goto cleanup;
  }
  for (int i = 0; i < t->nparams; i++)
    TSR_CHECK_GOTO(scatter_into(t, t->params[i]->value, full[i], t->params[i]->value), st);
  /* the tied replica (last stage) takes the embedding's values: the file has one copy */
  int src = tied_source(t);
  for (int i = t->nparams; i < t->nopt && src >= 0; i++)
    TSR_CHECK_GOTO(scatter_into(t, t->params[i]->value, full[src], t->params[i]->value), st);

  if (!has_optim) goto cleanup; /* weights only: a fresh optimizer */
  int64_t step = 0;
  TSR_CHECK_GOTO(alloc_full(t, &ea), st);
  TSR_CHECK_GOTO(alloc_full(t, &eas), st);
  TSR_CHECK_GOTO(tsr_train_hf_split(t, ea, &hf), st);
  TSR_CHECK_GOTO(tsr_train_hf_split(t, eas, &hf2), st);
  st = tsr_checkpoint_load_optim(optim, hf.n, (const char *const *)hf.names, hf.views, hf2.views,
                                 &step);
  if (st != TSR_OK) {
    st = tsr_error_prefix(st,
                          "%s: optimizer state beside the model file (remove it to start the "
                          "optimizer afresh)",
                          tsr_config_where(cfg, "checkpoint", "load", where, sizeof where));
    goto cleanup;
  }
  for (int i = 0; i < t->nparams; i++) {
    const tsr_dtensor *v = t->params[i]->value;
    TSR_CHECK_GOTO(scatter_into(t, v, ea[i], tsr_adamw_exp_avg(t->opt, i)), st);
    TSR_CHECK_GOTO(scatter_into(t, v, eas[i], tsr_adamw_exp_avg_sq(t->opt, i)), st);
  }
  for (int i = t->nparams; i < t->nopt && src >= 0; i++) {
    const tsr_dtensor *v = t->params[i]->value;
    TSR_CHECK_GOTO(scatter_into(t, v, ea[src], tsr_adamw_exp_avg(t->opt, i)), st);
    TSR_CHECK_GOTO(scatter_into(t, v, eas[src], tsr_adamw_exp_avg_sq(t->opt, i)), st);
  }
  tsr_adamw_set_step(t->opt, step);
  t->start_step = step;
  *resumed = true;
cleanup:
  tsr_train_hf_free(&hf);
  tsr_train_hf_free(&hf2);
  free(model_file);
  free_full(full, t->nparams);
  free_full(ea, t->nparams);
  free_full(eas, t->nparams);
  return st;
}

/* Full copies of each parameter's `which` (0 value, 1 exp_avg, 2 exp_avg_sq), on rank 0 also
 * for the parameters of pipeline stages it does not hold. Collective. */
static tsr_status gather_all(tsr_train_rank *t, int which, tsr_tensor ***out) {
  tsr_tensor **full = calloc((size_t)t->nparams + 1, sizeof *full);
  if (!full) return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
  for (int i = 0; i < t->nparams; i++) {
    const tsr_dtensor *x = which == 0   ? t->params[i]->value
                           : which == 1 ? tsr_adamw_exp_avg(t->opt, i)
                                        : tsr_adamw_exp_avg_sq(t->opt, i);
    /* a rank off the parameter's stage has no optimizer state for it, but joins the move with
     * the parameter's (local-less) value */
    if (!x && !t->params[i]->value->local) x = t->params[i]->value;
    if (!x) continue;
    tsr_status st = TSR_OK;
    if (!tsr_mesh_equal(x->mesh, t->job->mesh) && tsr_mesh_unbound_dim(x->mesh)) {
      /* on one pipeline stage: every rank joins the move to the whole mesh, so that rank 0
       * gets it from whichever stage holds it (the others drop their copy) */
      tsr_placement rep[TSR_MAX_MESH_DIMS];
      for (int d = 0; d < tsr_mesh_ndim(t->job->mesh); d++) rep[d] = tsr_replicate();
      tsr_dtensor *y = NULL;
      st = tsr_dtensor_redistribute(t->r, x, t->job->mesh, rep, &y);
      if (st == TSR_OK) st = tsr_dtensor_full_tensor(t->r, y, &full[i]);
      tsr_dtensor_free(y);
      if (st == TSR_OK && tsr_rank_id(t->r) != 0) {
        tsr_tensor_free(full[i]);
        full[i] = NULL;
      }
    } else if (x->local) {
      st = tsr_dtensor_full_tensor(t->r, x, &full[i]);
    }
    if (st != TSR_OK) {
      free_full(full, t->nparams);
      return st;
    }
  }
  *out = full;
  return TSR_OK;
}

tsr_status tsr_train_save_checkpoint(tsr_train_rank *t) {
  const tsr_config *cfg = t->job->cfg;
  if (!cfg->checkpoint.save[0]) return TSR_OK;
  tsr_tensor **p = NULL, **ea = NULL, **eas = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(gather_all(t, 0, &p), st);
  TSR_CHECK_GOTO(gather_all(t, 1, &ea), st);
  TSR_CHECK_GOTO(gather_all(t, 2, &eas), st);
  if (tsr_rank_id(t->r) == 0) {
    char path[TSR_TRAIN_PATH_LEN], where[TSR_MAX_PATH + 160];
    tsr_train_path(cfg, cfg->checkpoint.save, path, sizeof path);
    tsr_train_hf hp, hm, hv;
    st = tsr_train_hf_split(t, p, &hp);
    if (st == TSR_OK) st = tsr_train_hf_split(t, ea, &hm);
    if (st == TSR_OK) st = tsr_train_hf_split(t, eas, &hv);
    if (st == TSR_OK)
      st = tsr_checkpoint_save(path, NULL, hp.n, (const char *const *)hp.names,
                               (const tsr_tensor *const *)hp.views,
                               (const tsr_tensor *const *)hm.views,
                               (const tsr_tensor *const *)hv.views, tsr_adamw_get_step(t->opt));
    tsr_train_hf_free(&hp);
    tsr_train_hf_free(&hm);
    tsr_train_hf_free(&hv);
    if (st != TSR_OK)
      st = tsr_error_prefix(st, "%s",
                            tsr_config_where(cfg, "checkpoint", "save", where, sizeof where));
  }
cleanup:
  free_full(p, t->nparams);
  free_full(ea, t->nparams);
  free_full(eas, t->nparams);
  return st;
}

/* ---- dump ---- */

tsr_status tsr_train_dump_add_full(tsr_train_dump *d, const char *name, tsr_tensor *full) {
  if (d->n == d->cap) {
    int cap = d->cap ? 2 * d->cap : 64;
    char **names = realloc(d->names, (size_t)cap * sizeof *names);
    if (names) d->names = names;
    tsr_tensor **ts = realloc(d->tensors, (size_t)cap * sizeof *ts);
    if (ts) d->tensors = ts;
    if (!names || !ts) {
      tsr_tensor_free(full);
      return TSR_ERROR(TSR_ENOMEM, "dump: out of memory");
    }
    d->cap = cap;
  }
  d->names[d->n] = strdup(name);
  if (!d->names[d->n]) {
    tsr_tensor_free(full);
    return TSR_ERROR(TSR_ENOMEM, "dump: out of memory");
  }
  d->tensors[d->n++] = full;
  return TSR_OK;
}

tsr_status tsr_train_dump_add_batch(tsr_train_dump *d, tsr_tensor *const *parts, int n,
                                    double loss) {
  tsr_tensor *all = NULL, *scalar = NULL;
  TSR_CHECK(tsr_tensor_cat(parts, n, 0, &all));
  TSR_CHECK(tsr_train_dump_add_full(d, "logits", all));
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 0, NULL, &scalar));
  *(float *)tsr_tensor_data(scalar) = (float)loss;
  return tsr_train_dump_add_full(d, "loss", scalar);
}

/* x's full tensor in *full on rank 0 (NULL on the others and where nothing holds x). */
static tsr_status dump_full(tsr_train_rank *t, const tsr_dtensor *x, tsr_tensor **out) {
  tsr_tensor *full = NULL;
  *out = NULL;
  if (!tsr_mesh_equal(x->mesh, t->job->mesh) && tsr_mesh_unbound_dim(x->mesh)) {
    /* on one pipeline stage: every rank joins the move to the whole mesh (a broadcast along
     * the unbound dim), so that rank 0 gets it from whichever stage holds it */
    tsr_placement rep[TSR_MAX_MESH_DIMS];
    for (int i = 0; i < tsr_mesh_ndim(t->job->mesh); i++) rep[i] = tsr_replicate();
    tsr_dtensor *y = NULL;
    TSR_CHECK(tsr_dtensor_redistribute(t->r, x, t->job->mesh, rep, &y));
    tsr_status st = tsr_dtensor_full_tensor(t->r, y, &full);
    tsr_dtensor_free(y);
    TSR_CHECK(st);
  } else {
    if (!x->local) return TSR_OK;
    TSR_CHECK(tsr_dtensor_full_tensor(t->r, x, &full));
  }
  if (tsr_rank_id(t->r) != 0) {
    tsr_tensor_free(full);
    return TSR_OK;
  }
  *out = full;
  return TSR_OK;
}

tsr_status tsr_train_dump_add(tsr_train_rank *t, tsr_train_dump *d, const char *name,
                              const tsr_dtensor *x) {
  tsr_tensor *full = NULL;
  TSR_CHECK(dump_full(t, x, &full));
  return full ? tsr_train_dump_add_full(d, name, full) : TSR_OK;
}

tsr_status tsr_train_dump_add_param(tsr_train_rank *t, tsr_train_dump *d, const char *prefix, int i,
                                    const tsr_dtensor *x) {
  char name[512];
  if (tsr_llama_hf_count(t->model, i) == 1) {
    snprintf(name, sizeof name, "%s%s", prefix, t->names[i]);
    return tsr_train_dump_add(t, d, name, x);
  }
  tsr_tensor *full = NULL;
  tsr_status st = dump_full(t, x, &full);
  if (st != TSR_OK || !full) return st;
  for (int j = 0; st == TSR_OK && j < tsr_llama_hf_count(t->model, i); j++) {
    char hf[256];
    tsr_tensor *view = NULL, *copy = NULL;
    st = tsr_train_hf_view(t, i, j, full, hf, sizeof hf, &view);
    snprintf(name, sizeof name, "%s%s", prefix, hf);
    if (st == TSR_OK) st = tsr_tensor_clone(view, &copy);
    if (st == TSR_OK) st = tsr_train_dump_add_full(d, name, copy);
    tsr_tensor_free(view);
  }
  tsr_tensor_free(full);
  return st;
}

tsr_status tsr_train_dump_write(tsr_train_rank *t, tsr_train_dump *d) {
  const tsr_config *cfg = t->job->cfg;
  if (tsr_rank_id(t->r) != 0 || !cfg->output.dump[0]) return TSR_OK;
  char path[TSR_TRAIN_PATH_LEN], where[TSR_MAX_PATH + 160];
  tsr_train_path(cfg, cfg->output.dump, path, sizeof path);
  tsr_status st = tsr_dump_save(path, d->n, (const char *const *)d->names,
                                (const tsr_tensor *const *)d->tensors);
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s", tsr_config_where(cfg, "output", "dump", where, sizeof where));
  return TSR_OK;
}

void tsr_train_dump_free(tsr_train_dump *d) {
  for (int i = 0; i < d->n; i++) {
    free(d->names[i]);
    tsr_tensor_free(d->tensors[i]);
  }
  free(d->names);
  free(d->tensors);
  memset(d, 0, sizeof *d);
}
