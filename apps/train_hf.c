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
    int count = tsr_llama_hf_count(t->model, i);
    for (int j = 0; j < count; j++, h->n++) {
      char name[256];
      int64_t offset, shape[2];
      int ndim;
      tsr_llama_hf_tensor(t->model, i, j, name, sizeof name, &offset, &ndim, shape);
      h->param[h->n] = i;
      h->names[h->n] = strdup(name);
      if (!h->names[h->n]) {
        st = TSR_ERROR(TSR_ENOMEM, "out of memory naming tensor %s", name);
        goto fail;
      }
      if (!full || !full[i]) continue;
      if (count == 1) {
        /* the whole tensor: a view of itself, so that freeing views never frees `full` */
        st = tsr_tensor_narrow(full[i], 0, 0, full[i]->shape[0], &h->views[h->n]);
      } else {
        int64_t numel = tsr_tensor_numel(full[i]), len = ndim == 2 ? shape[0] * shape[1] : shape[0];
        tsr_tensor *flat = NULL, *piece = NULL;
        st = tsr_tensor_reshape(full[i], 1, &numel, &flat);
        if (st == TSR_OK) st = tsr_tensor_narrow(flat, 0, offset, len, &piece);
        if (st == TSR_OK) st = tsr_tensor_reshape(piece, ndim, shape, &h->views[h->n]);
        tsr_tensor_free(piece);
        tsr_tensor_free(flat);
      }
      if (st != TSR_OK) goto fail;
    }
  }
  return TSR_OK;
fail:
  tsr_train_hf_free(h);
  return st;
}
