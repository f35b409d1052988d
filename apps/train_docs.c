/* [data] mask = document in the training loop (docs/data.md): the data source reads its document
 * index, and each step's batch comes with the segment ids and positions the model's attention and
 * RoPE take, made into leaves per microbatch as the token ids are. */
#include <stdlib.h>
#include <string.h>

#include "llama_pipe.h"
#include "train.h"

struct tsr_train_docs {
  int32_t *seg, *pos; /* (batch_size, seq_len) of the step's batch */
};

/* The document index of `source`, the training data's ([data]) or [eval]'s: [data] index for the
 * training data when set, else the token file's path + ".idx". */
static tsr_status use_index(const tsr_config *c, tsr_data_t *data, const char *section,
                            const char *source) {
  const tsr_config_ext *x = tsr_config_ext_of(c);
  char where[TSR_MAX_PATH + 160], path[TSR_TRAIN_PATH_LEN], index[TSR_TRAIN_PATH_LEN + 8];
  const char *colon = strchr(source, ':');
  if (!strcmp(section, "data") && x->data_docs.index[0]) {
    tsr_train_path(c, x->data_docs.index, index, sizeof index);
  } else {
    tsr_train_path(c, colon ? colon + 1 : source, path, sizeof path);
    snprintf(index, sizeof index, "%s.idx", path);
  }
  tsr_status st = tsr_data_use_documents(data, index);
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s%s", tsr_config_where(c, "data", "mask", where, sizeof where),
                            strcmp(section, "data") ? ", for [eval] source" : "");
  return TSR_OK;
}

tsr_status tsr_train_docs_open(tsr_train_rank *t, tsr_data_t *data) {
  const tsr_config *c = t->job->cfg;
  if (tsr_config_ext_of(c)->data_docs.mask != TSR_MASK_DOCUMENT) return TSR_OK;
  TSR_CHECK(use_index(c, data, "data", c->data.source));
  size_t n = (size_t)(c->data.batch_size * c->data.seq_len);
  t->docs = calloc(1, sizeof *t->docs);
  if (t->docs) {
    t->docs->seg = malloc(n * sizeof(int32_t));
    t->docs->pos = malloc(n * sizeof(int32_t));
  }
  if (!t->docs || !t->docs->seg || !t->docs->pos)
    return TSR_ERROR(TSR_ENOMEM, "out of memory for the documents of a batch");
  return TSR_OK;
}

tsr_status tsr_train_docs_open_eval(tsr_train_rank *t, tsr_data_t *data) {
  const tsr_config *c = t->job->cfg;
  if (tsr_config_ext_of(c)->data_docs.mask != TSR_MASK_DOCUMENT) return TSR_OK;
  return use_index(c, data, "eval", tsr_config_ext_of(c)->eval.source);
}

tsr_status tsr_train_docs_fetch(tsr_train_rank *t, const tsr_data_t *data) {
  if (!t->docs) return TSR_OK;
  return tsr_data_documents(data, t->docs->seg, t->docs->pos);
}

tsr_status tsr_train_docs_begin(tsr_train_rank *t, int64_t k, tsr_var **seg, tsr_var **pos) {
  *seg = *pos = NULL;
  if (!t->docs) return TSR_OK;
  const tsr_config *c = t->job->cfg;
  int64_t accum = c->job.mode == TSR_MODE_TRAIN ? c->optimizer.grad_accum_steps : 1;
  int64_t rows = c->data.batch_size / accum, seq = c->data.seq_len, at = k * rows * seq;
  TSR_CHECK(tsr_llama_batch(t->r, t->job->mesh, rows, seq, t->docs->seg + at, seg));
  TSR_CHECK(tsr_llama_batch(t->r, t->job->mesh, rows, seq, t->docs->pos + at, pos));
  return tsr_llama_set_documents(t->model, *seg, *pos);
}

void tsr_train_docs_end(tsr_train_rank *t, tsr_var *seg, tsr_var *pos) {
  if (seg) tsr_llama_set_documents(t->model, NULL, NULL);
  tsr_var_free(seg);
  tsr_var_free(pos);
}

tsr_status tsr_train_docs_pipe(tsr_train_rank *t, int64_t offset) {
  if (!t->docs) return TSR_OK;
  return tsr_llama_pipe_documents(t->model, t->docs->seg + offset, t->docs->pos + offset);
}

void tsr_train_docs_free(tsr_train_rank *t) {
  if (!t->docs) return;
  tsr_llama_pipe_documents(t->model, NULL, NULL);
  free(t->docs->seg);
  free(t->docs->pos);
  free(t->docs);
  t->docs = NULL;
}
