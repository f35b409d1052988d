/* linear(x, W) with x replicated over tp and W split along its input features, S(1): the tied
 * lm_head, whose weight is the embedding's and therefore placed by the embedding style (split by
 * hidden, as EmbeddingWithReplicateOutput splits it).
 *
 * Each rank multiplies the columns of x that match its columns of W; the products are partial
 * sums of the logits (P(sum) over tp), which the column style then reduce-scatters to the
 * vocabulary shards the loss expects. The input's gradient is this rank's columns, S(last).
 * The core's kernel cannot do this on the local tensors because x's local is whole, hence a rule
 * that slices.
 */
#include <stdlib.h>
#include <string.h>

#include "tessera/device.h"
#include "tp_impl.h"

typedef struct linear_saved {
  tsr_tensor *x; /* x with this rank's Cl columns only, contiguous, on x's device */
  int rows, Cl, OC;
} linear_saved;

static const char rule_name[] = "tp.linear.tied";

void tp_linear_saved_free(void *p) {
  linear_saved *s = p;
  if (!s) return;
  tsr_tensor_free(s->x);
  free(s);
}

tsr_status tp_linear_in_split_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                                      const void *attrs, int nout, tsr_dtensor **out, void **saved,
                                      void *ctx) {
  const tsr_dtensor *x = in[0], *w = in[1];
  int last = x->ndim - 1;
  TSR_CHECK(tp_check_other_dims(rule_name, dim, 1, &x, last));
  for (int i = 0; i < tsr_mesh_ndim(w->mesh); i++)
    if (i != dim && tsr_mesh_dim_size(w->mesh, i) > 1 && w->placements[i].kind != TSR_REPLICATE)
      return TSR_ERROR(TSR_ENOTSUP,
                       "%s: weight is not replicated on mesh dim '%s'; a tied lm_head under tp "
                       "takes a weight split over tp only",
                       rule_name, tsr_mesh_dim_name(w->mesh, i));
  int64_t shape[TSR_MAX_DIMS];
  memcpy(shape, x->shape, sizeof shape);
  shape[last] = w->shape[0];
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = tsr_partial(TSR_REDUCE_SUM);
  TSR_CHECK(tsr_dtensor_zeros(r, x->mesh, TSR_F32, x->ndim, shape, p, out));
  if (!x->local) return TSR_OK;
  linear_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "out of memory saving %s", rule_name);
  *saved = s;
  int n = tsr_mesh_dim_size(x->mesh, dim), C = (int)x->shape[last];
  int c0 = (int)tsr_chunk_start(C, n, tp_coord(r, x, dim));
  s->Cl = (int)w->local->shape[1];
  s->OC = (int)w->local->shape[0];
  s->rows = (int)(tsr_tensor_numel(x->local) / C);
  /* the kernel reads x's rows whole: pack the columns into a contiguous copy, which backward
   * needs too */
  tsr_tensor *cols;
  TSR_CHECK(tsr_tensor_narrow(x->local, last, c0, s->Cl, &cols));
  tsr_status st = tsr_tensor_to(cols, tsr_tensor_scratch_allocator(x->local), &s->x);
  tsr_tensor_free(cols);
  TSR_CHECK(st);
  /* at the rank's precision, so a tied lm_head under tp rounds as on one rank */
  return tsr_linear_forward(r, tsr_kernel_table_of(x->local), tsr_tensor_data((*out)->local),
                            tsr_tensor_data(s->x), tsr_tensor_data(w->local), NULL, s->rows, s->Cl,
                            s->OC);
}

tsr_status tp_linear_in_split_backward(tsr_rank_t *r, int dim, int nin,
                                       const tsr_dtensor *const *in, const void *attrs, int nout,
                                       const tsr_dtensor *const *outs,
                                       const tsr_dtensor *const *gout, tsr_dtensor **gin,
                                       void *saved, void *ctx) {
  const linear_saved *s = saved;
  const tsr_dtensor *x = in[0], *w = in[1];
  tsr_placement px[TSR_MAX_MESH_DIMS], pw[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < tsr_mesh_ndim(x->mesh); i++) {
    px[i] = x->placements[i];
    /* rows split beside tp: each shard's weight gradient is part of the sum over rows */
    pw[i] = x->placements[i].kind == TSR_SHARD ? tsr_partial(TSR_REDUCE_SUM) : w->placements[i];
  }
  px[dim] = tsr_shard(x->ndim - 1);
  pw[dim] = w->placements[dim];
  TSR_CHECK(tsr_dtensor_zeros(r, x->mesh, TSR_F32, x->ndim, x->shape, px, &gin[0]));
  TSR_CHECK(tsr_dtensor_zeros(r, w->mesh, TSR_F32, w->ndim, w->shape, pw, &gin[1]));
  if (!s || !gout[0]) return TSR_OK;
  return tsr_linear_backward(r, tsr_kernel_table_of(s->x), tsr_tensor_data(gin[0]->local),
                             tsr_tensor_data(gin[1]->local), NULL, tsr_tensor_data(gout[0]->local),
                             tsr_tensor_data(s->x), tsr_tensor_data(w->local), s->rows, s->Cl,
                             s->OC);
}
