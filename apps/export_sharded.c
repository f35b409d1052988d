/* `tessera export` of a sharded checkpoint folder ([checkpoint] dir): the full tensors under
 * Hugging Face's names, read out of the folder's slices. The folder holds the model's own
 * names, which are Hugging Face's except for an MoE layer's stacked experts
 * ("...block_sparse_moe.experts.w13", (E, 2I, C): expert e's w1 is rows [0, I) of [e], its w3
 * rows [I, 2I); "...experts.w2", (E, C, I): w2 is [e]), so each per-expert tensor is read as its
 * box of the stacked one. The AdamW moments in the folder are not read. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_shard.h"
#include "hf.h"

/* The stacked tensor, and the box in it, of a per-expert name
 * "<prefix>experts.<e>.w1|w2|w3.weight"; false for any other name. */
static bool expert_box(const char *name, char *stacked, size_t len, int64_t *e, int *which) {
  const char *p = strstr(name, ".experts.");
  if (!p) return false;
  p += strlen(".experts.");
  char *end;
  long long v = strtoll(p, &end, 10);
  if (end == p || v < 0 || *end != '.') return false;
  int w = !strcmp(end, ".w1.weight")   ? 1
          : !strcmp(end, ".w2.weight") ? 2
          : !strcmp(end, ".w3.weight") ? 3
                                       : 0;
  if (!w) return false;
  snprintf(stacked, len, "%.*s%s", (int)(p - name), name, w == 2 ? "w2" : "w13");
  *e = v;
  *which = w;
  return true;
}

/* Tensor `name` of the index has exactly `ndim` dims of `shape`, else TSR_EINVAL naming both. */
static tsr_status same_shape(const char *folder, const tsr_ckpt_tensor *t, int ndim,
                             const int64_t *shape) {
  bool same = t->ndim == ndim;
  for (int d = 0; same && d < ndim; d++) same = t->shape[d] == shape[d];
  if (same) return TSR_OK;
  char a[160], b[160];
  return TSR_ERROR(TSR_EINVAL,
                   "%s: tensor '%s' has shape %s, the job's model needs %s; the checkpoint does "
                   "not match the model (check [model] against the one that saved it)",
                   folder, t->name, tsr_shape_str(t->ndim, t->shape, a, sizeof a),
                   tsr_shape_str(ndim, shape, b, sizeof b));
}

/* Fills ts[i] (full, f32) with tensor names[i]. */
static tsr_status read_one(tsr_ckpt_reader *rd, const char *folder, const char *name,
                           tsr_tensor *dst) {
  int64_t start[TSR_MAX_DIMS] = {0};
  const tsr_ckpt_tensor *t = tsr_ckpt_index_find(rd->ix, name);
  if (t) {
    TSR_CHECK(same_shape(folder, t, dst->ndim, dst->shape));
    return tsr_ckpt_read_box(rd, name, start, dst);
  }
  char stacked[512];
  int64_t e;
  int which;
  if (!expert_box(name, stacked, sizeof stacked, &e, &which) ||
      !(t = tsr_ckpt_index_find(rd->ix, stacked)))
    return TSR_ERROR(TSR_EINVAL,
                     "%s: no tensor '%s' in the index; the checkpoint does not match the model "
                     "(check [model] against the one that saved it)",
                     folder, name);
  /* the stacked tensor's shape the job's model implies: (E, 2 rows, cols) or (E, rows, cols) */
  int64_t rows = dst->shape[0], cols = dst->shape[1];
  int64_t want[3] = {t->ndim == 3 ? t->shape[0] : 0, which == 2 ? rows : 2 * rows, cols};
  TSR_CHECK(same_shape(folder, t, 3, want));
  if (e >= t->shape[0])
    return TSR_ERROR(TSR_EINVAL, "%s: '%s' has %lld experts, the model's %s needs expert %lld",
                     folder, stacked, (long long)t->shape[0], name, (long long)e);
  start[0] = e;
  start[1] = which == 3 ? rows : 0;
  int64_t shape3[3] = {1, rows, cols};
  tsr_tensor *view = NULL;
  TSR_CHECK(tsr_tensor_reshape(dst, 3, shape3, &view));
  tsr_status st = tsr_ckpt_read_box(rd, stacked, start, view);
  tsr_tensor_free(view);
  return st;
}

tsr_status tsr_hf_sharded_load(const char *folder, int n, const char *const *names,
                               tsr_tensor *const *ts) {
  tsr_ckpt_index ix;
  tsr_ckpt_reader rd = {0};
  TSR_CHECK(tsr_ckpt_index_read(folder, &ix));
  tsr_status st = tsr_ckpt_reader_init(&rd, folder, &ix);
  for (int i = 0; st == TSR_OK && i < n; i++) st = read_one(&rd, folder, names[i], ts[i]);
  tsr_ckpt_reader_close(&rd);
  tsr_ckpt_index_free(&ix);
  return st;
}
