/* Cross-entropy on logits split by vocabulary over tp (the lm_head is column-parallel).
 *
 * loss_parallel = true: no rank ever holds a full row of logits. Each rank takes the max of its
 * columns, the max is reduced over tp, then the sum of exp(logit - max) of its columns and the
 * target's logit (non-zero only on the rank whose columns hold the target) are summed over tp in
 * one all-reduce of 2N values. The loss of row i is log(sumexp_i) + max_i - target_i.
 * loss_parallel = false: the logits are gathered over tp first and the same pieces are taken
 * over the whole vocabulary, without communication.
 *
 * Either way the backward needs no communication: softmax - onehot on the local columns from the
 * saved global max and sum-exp. Beside tp, batch or sequence shards (dp, cp) are handled as the
 * core's rule does: the loss is each shard's share of the mean over all valid tokens, Partial
 * over those dims.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/device.h"
#include "tp_impl.h"

typedef struct loss_saved {
  tsr_dtensor *logits; /* with loss_parallel = false: the gathered logits; else NULL */
  /* (3, N) on the logits' device: the global row max, then the sum-exp and the target's logit,
   * adjacent so that one all-reduce sums both */
  tsr_tensor *stats;
  int64_t valid; /* valid tokens of the whole batch */
} loss_saved;

void tp_loss_saved_free(void *p) {
  loss_saved *s = p;
  if (!s) return;
  tsr_dtensor_free(s->logits);
  tsr_tensor_free(s->stats);
  free(s);
}

/* `t` itself when it is host memory, else a host copy in *tmp, which the caller frees. */
static tsr_status host_of(const tsr_tensor *t, tsr_tensor **tmp, const tsr_tensor **host) {
  *tmp = NULL;
  *host = t;
  if (tsr_tensor_device(t).kind == TSR_DEVICE_CPU) return TSR_OK;
  TSR_CHECK(tsr_tensor_to(t, NULL, tmp));
  *host = *tmp;
  return TSR_OK;
}

/* Mask of the mesh dims that split the labels (batch or sequence shards). */
static uint32_t label_shard_mask(const tsr_dtensor *labels) {
  uint32_t mask = 0;
  for (int i = 0; i < tsr_mesh_ndim(labels->mesh); i++)
    if (tsr_mesh_dim_size(labels->mesh, i) > 1 && labels->placements[i].kind == TSR_SHARD)
      mask |= 1u << i;
  return mask;
}

/* `lab` is the host copy of the labels' local values. */
static tsr_status count_valid(tsr_rank_t *r, const tsr_dtensor *labels, const int32_t *lab, int V,
                              int64_t *local, int64_t *global) {
  int64_t n = tsr_tensor_numel(labels->local);
  *local = 0;
  for (int64_t i = 0; i < n; i++) {
    if (lab[i] == TSR_IGNORE_INDEX) continue;
    if (lab[i] < 0 || lab[i] >= V)
      return TSR_ERROR(TSR_EINVAL,
                       "cross_entropy: label %d at local position %lld is outside [0, %d) and is "
                       "not the ignore index %d",
                       (int)lab[i], (long long)i, V, TSR_IGNORE_INDEX);
    (*local)++;
  }
  *global = *local;
  uint32_t mask = label_shard_mask(labels);
  if (!mask) return TSR_OK;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(labels->mesh, tsr_rank_comm(r), mask, &g));
  return tsr_comm_all_reduce(g, global, global, 1, TSR_I64, TSR_REDUCE_SUM);
}

/* The logits' local columns, their first global column and the local row count. */
static void local_view(tsr_rank_t *r, const tsr_dtensor *logits, int dim, int *N, int *Vl,
                       int *v0) {
  const tsr_tensor *l = logits->local;
  *N = (int)(l->shape[0] * l->shape[1]);
  *Vl = (int)l->shape[2];
  int n = tsr_mesh_dim_size(logits->mesh, dim);
  *v0 = (int)tsr_chunk_start(logits->shape[2], n, tp_coord(r, logits, dim));
}

tsr_status tp_loss_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                           const void *attrs, int nout, tsr_dtensor **out, void **saved,
                           void *ctx) {
  const tp_state *tp = ctx;
  const tsr_dtensor *logits = in[0], *labels = in[1];
  TSR_CHECK(tp_check_other_dims("tp.cross_entropy.vocab", dim, 2, in, 2));
  tsr_placement p[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(logits->mesh); i++)
    p[i] = (label_shard_mask(labels) >> i) & 1 ? tsr_partial(TSR_REDUCE_SUM) : tsr_replicate();
  TSR_CHECK(tsr_dtensor_zeros(r, logits->mesh, TSR_F32, 0, NULL, p, out));
  if (!logits->local) return TSR_OK;

  loss_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "out of memory saving the loss");
  *saved = s; /* freed by the core when this fails */
  tsr_status st = TSR_OK;
  tsr_tensor *lab_tmp = NULL, *stats_tmp = NULL;
  const tsr_tensor *lab_host, *stats_host;
  int V = (int)logits->shape[2], N, Vl, v0;
  int64_t local;
  /* the host counts the labels and sums the loss: one transfer each of the labels and the stats */
  TSR_CHECK_GOTO(host_of(labels->local, &lab_tmp, &lab_host), st);
  const int32_t *lab = tsr_tensor_data(lab_host);
  TSR_CHECK_GOTO(count_valid(r, labels, lab, V, &local, &s->valid), st);
  const tsr_dtensor *x = logits;
  if (!tp->loss_parallel) {
    tsr_placement full[TSR_MAX_MESH_DIMS];
    memcpy(full, logits->placements, sizeof full);
    full[dim] = tsr_replicate();
    TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, logits, logits->mesh, full, &s->logits), st);
    x = s->logits;
  }
  local_view(r, x, dim, &N, &Vl, &v0);
  if (!tp->loss_parallel) v0 = 0;
  const int64_t stats_shape[2] = {3, N};
  TSR_CHECK_GOTO(
      tsr_tensor_new(tsr_tensor_scratch_allocator(x->local), TSR_F32, 2, stats_shape, &s->stats),
      st);
  float *row_max = tsr_tensor_data(s->stats), *sumexp = row_max + N, *target = sumexp + N;
  const float *lg = tsr_tensor_data(x->local);
  const tsr_kernel_table *kt = tsr_kernel_table_of(x->local);
  kt->logits_row_max(row_max, lg, N, Vl);
  tsr_group_t *g = NULL;
  if (tp->loss_parallel) {
    TSR_CHECK_GOTO(tsr_mesh_group(logits->mesh, tsr_rank_comm(r), 1u << dim, &g), st);
    TSR_CHECK_GOTO(tsr_comm_all_reduce(g, row_max, row_max, (size_t)N, TSR_F32, TSR_REDUCE_MAX),
                   st);
  }
  kt->logits_row_sumexp(sumexp, lg, row_max, N, Vl);
  kt->logits_target(target, lg, tsr_tensor_data(labels->local), N, Vl, v0);
  if (g)
    TSR_CHECK_GOTO(tsr_comm_all_reduce(g, sumexp, sumexp, (size_t)2 * N, TSR_F32, TSR_REDUCE_SUM),
                   st);
  TSR_CHECK_GOTO(host_of(s->stats, &stats_tmp, &stats_host), st);
  const float *hmax = tsr_tensor_data(stats_host), *hsum = hmax + N, *htarget = hsum + N;
  double total = 0.0;
  for (int i = 0; i < N; i++)
    if (lab[i] != TSR_IGNORE_INDEX)
      total += (double)hmax[i] + log((double)hsum[i]) - (double)htarget[i];
  /* each shard's sum over the batch's valid count: the pieces add up to the mean */
  tsr_tensor_set((*out)->local, NULL, s->valid > 0 ? (float)(total / (double)s->valid) : NAN);
cleanup:
  tsr_tensor_free(lab_tmp);
  tsr_tensor_free(stats_tmp);
  return st;
}

tsr_status tp_loss_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                            const void *attrs, int nout, const tsr_dtensor *const *outs,
                            const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                            void *ctx) {
  const loss_saved *s = saved;
  const tsr_dtensor *logits = in[0];
  TSR_CHECK(tsr_dtensor_zeros(r, logits->mesh, TSR_F32, logits->ndim, logits->shape,
                              logits->placements, &gin[0]));
  if (!logits->local || !gout[0] || !s || s->valid == 0) return TSR_OK;
  int N, Vl, v0;
  local_view(r, logits, dim, &N, &Vl, &v0);
  float dloss = (float)tsr_tensor_get(gout[0]->local, NULL);
  const float *row_max = tsr_tensor_data(s->stats), *sumexp = row_max + N;
  /* with the logits gathered, row_max and sumexp cover the whole vocabulary just the same */
  tsr_kernel_table_of(logits->local)
      ->cross_entropy_shard_backward(tsr_tensor_data(gin[0]->local), tsr_tensor_data(logits->local),
                                     tsr_tensor_data(in[1]->local), row_max, sumexp, N, Vl, v0,
                                     dloss / (float)s->valid);
  return TSR_OK;
}
