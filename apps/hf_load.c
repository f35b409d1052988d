/* [checkpoint] load = DIR: a Hugging Face folder's weights into the training job's parameters.
 * The job's [model] keys already come from its config.json (tsr_hf_job_apply); a folder holds
 * weights only, so the optimizer starts afresh. */
#include <stdlib.h>
#include <string.h>

#include "hf.h"
#include "train.h"

tsr_status tsr_hf_train_load(tsr_train_rank *t, const char *dir) {
  const tsr_config *cfg = t->job->cfg;
  char where[TSR_MAX_PATH + 160];
  tsr_tensor **full = calloc((size_t)t->nparams + 1, sizeof *full);
  tsr_train_hf hf = {0};
  tsr_hf_weights *w = NULL;
  tsr_status st = TSR_OK;
  if (!full) return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
  for (int i = 0; i < t->nparams && st == TSR_OK; i++) {
    const tsr_dtensor *v = t->params[i]->value;
    st = tsr_tensor_new(NULL, TSR_F32, v->ndim, v->shape, &full[i]);
  }
  if (st == TSR_OK) st = tsr_train_hf_split(t, full, &hf);
  if (st == TSR_OK) st = tsr_hf_weights_open(dir, &w);
  if (st == TSR_OK) {
    const char *ignore[4];
    int nignore = 0;
    for (int i = 0; i < tsr_checkpoint_hf_buffers_count && nignore < 3; i++)
      ignore[nignore++] = tsr_checkpoint_hf_buffers[i];
    /* tied models have no lm_head parameter; HF folders of them may still store the copy */
    if (cfg->model.tie_word_embeddings) ignore[nignore++] = "lm_head.weight";
    st = tsr_hf_weights_load(w, hf.n, (const char *const *)hf.names, hf.views, nignore, ignore);
  }
  if (st != TSR_OK) {
    st = tsr_error_prefix(st, "%s",
                          tsr_config_where(cfg, "checkpoint", "load", where, sizeof where));
    goto cleanup;
  }
  /* the tied replica (last pipeline stage) takes the embedding's values */
  int src = -1;
  for (int i = 0; i < t->nparams; i++)
    if (!strcmp(t->names[i], "model.embed_tokens.weight")) src = i;
  for (int i = 0; i < t->nopt && st == TSR_OK; i++) {
    tsr_dtensor *v = t->params[i]->value;
    const tsr_tensor *from = i < t->nparams ? full[i] : src >= 0 ? full[src] : NULL;
    if (!from || !v->local) continue;
    tsr_dtensor *d = NULL;
    st = tsr_dtensor_distribute(t->r, v->mesh, from, v->placements, &d);
    if (st == TSR_OK) st = tsr_tensor_copy(v->local, d->local);
    tsr_dtensor_free(d);
  }
cleanup:
  tsr_hf_weights_close(w);
  tsr_train_hf_free(&hf);
  for (int i = 0; i < t->nparams; i++) tsr_tensor_free(full[i]);
  free(full);
  return st;
}
