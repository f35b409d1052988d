/* The parameters as Hugging Face files name them. A parameter is one tensor of its own name,
 * except an MoE layer's stacked experts, which Mixtral's files hold one tensor per expert and
 * weight (tsr_llama_hf_tensor): checkpoints and dumps read and write those, through views into
 * the stacked tensors, so the files load in Hugging Face tools as they are. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train.h"

void tsr_train_hf_free(tsr_train_hf *h) {
  for (int j = 0; j < h->n; j++) {
    free(h->names[j]);
    tsr_tensor_free(h->views[j]);
  }
  free(h->names);
  free(h->views);
  free(h->param);
  memset(h, 0, sizeof *h);
}

tsr_status tsr_train_hf_view(const tsr_train_rank *t, int i, int j, const tsr_tensor *full,
                             char *name, size_t len, tsr_tensor **view) {
  int64_t offset, shape[2];
  int ndim;
  *view = NULL;
  tsr_llama_hf_tensor(t->model, i, j, name, len, &offset, &ndim, shape);
  if (!full) return TSR_OK;
  /* a run of the parameter's row-major elements: flatten, narrow, shape (views, no copy) */
  int64_t numel = tsr_tensor_numel(full), count = ndim == 2 ? shape[0] * shape[1] : shape[0];
  tsr_tensor *flat = NULL, *piece = NULL;
  tsr_status st = tsr_tensor_reshape(full, 1, &numel, &flat);
  if (st == TSR_OK) st = tsr_tensor_narrow(flat, 0, offset, count, &piece);
  if (st == TSR_OK) st = tsr_tensor_reshape(piece, ndim, shape, view);
  tsr_tensor_free(piece);
  tsr_tensor_free(flat);
  return st;
}

tsr_status tsr_train_hf_split(const tsr_train_rank *t, tsr_tensor *const *full, tsr_train_hf *h) {
  memset(h, 0, sizeof *h);
  int n = 0;
  for (int i = 0; i < t->nparams; i++) n += tsr_llama_hf_count(t->model, i);
  h->names = calloc((size_t)n + 1, sizeof *h->names);
  h->views = calloc((size_t)n + 1, sizeof *h->views);
  h->param = calloc((size_t)n + 1, sizeof *h->param);
  tsr_status st = TSR_OK;
  if (!h->names || !h->views || !h->param) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory naming %d tensors", n);
    goto fail;
  }
  for (int i = 0; i < t->nparams; i++) {
    for (int j = 0; j < tsr_llama_hf_count(t->model, i); j++, h->n++) {
      char name[256];
      h->param[h->n] = i;
      st = tsr_train_hf_view(t, i, j, full ? full[i] : NULL, name, sizeof name, &h->views[h->n]);
      if (st == TSR_OK && !(h->names[h->n] = strdup(name)))
        st = TSR_ERROR(TSR_ENOMEM, "out of memory naming tensor %s", name);
      if (st != TSR_OK) goto fail;
    }
  }
  return TSR_OK;
fail:
  tsr_train_hf_free(h);
  return st;
}
