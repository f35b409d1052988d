/* The sequence layout on the ring dim.
 *
 * With load_balance = none, Shard(1) on ring_cp is torch.chunk's contiguous split, and the core's
 * rules (RoPE from the shard's offset among them) apply unchanged. With zigzag, Shard(1) on
 * ring_cp means: of the extent the outer sharders of dim 1 leave, ring coordinate c holds the
 * chunks c and 2n-1-c of 2n, in that order. Under a causal mask the early chunks see few keys and
 * the late ones many, so each rank then does the same attention work. Every transition into or
 * out of that placement is this plugin's (the core's gather and chunk assume contiguous shards),
 * and so is RoPE on it, since the rows' positions no longer follow from the shard's offset.
 */
#include <stdlib.h>
#include <string.h>

#include "cp_ring_impl.h"

static bool is_seq_shard(tsr_placement p) {
  return p.kind == TSR_SHARD && p.dim == 1;
}

static bool zigzag_dim(const ring_state *s, const tsr_mesh_t *m, int i) {
  return s->balance == RING_BALANCE_ZIGZAG && !strcmp(tsr_mesh_dim_name(m, i), RING_DIM);
}

tsr_status ring_positions(const ring_state *s, const tsr_mesh_t *m, const tsr_placement *p,
                          int64_t L, int rank, int32_t **pos, int *n) {
  *pos = NULL;
  *n = 0;
  int coords[TSR_MAX_MESH_DIMS];
  if (!tsr_mesh_coords(m, rank, coords))
    return TSR_ERROR(TSR_EINVAL, "cp_ring: rank %d is not in the attention's mesh", rank);
  int32_t *a = malloc(sizeof(int32_t) * (size_t)(2 * L + 1)), *tmp = a + L;
  if (!a) return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory for %lld positions", (long long)L);
  for (int64_t i = 0; i < L; i++) a[i] = (int32_t)i;
  int64_t E = L;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    int size = tsr_mesh_dim_size(m, i), c = coords[i];
    if (size == 1 || !is_seq_shard(p[i])) continue;
    if (zigzag_dim(s, m, i)) {
      if (E % (2 * size)) {
        free(a);
        return TSR_ERROR(TSR_EINVAL,
                         "cp_ring: a sequence extent of %lld rows cannot be laid out zigzag over "
                         "ring_cp = %d; it needs a multiple of 2 x %d = %d rows",
                         (long long)E, size, size, 2 * size);
      }
      int64_t h = E / (2 * size);
      memcpy(tmp, a + c * h, sizeof(int32_t) * (size_t)h);
      memcpy(tmp + h, a + (2 * size - 1 - c) * h, sizeof(int32_t) * (size_t)h);
      memcpy(a, tmp, sizeof(int32_t) * (size_t)(2 * h));
      E = 2 * h;
    } else {
      int64_t start = tsr_chunk_start(E, size, c);
      E = tsr_chunk_size(E, size, c);
      memmove(a, a + start, sizeof(int32_t) * (size_t)E);
    }
  }
  *pos = a;
  *n = (int)E;
  return TSR_OK;
}

/* ---- transitions ---- */

bool ring_zigzag_match(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst,
                       void *ctx) {
  (void)x, (void)dim, (void)ctx;
  return !tsr_placement_equal(src, dst) && (is_seq_shard(src) || is_seq_shard(dst));
}

static int coord_of(tsr_rank_t *r, const tsr_mesh_t *m, int dim) {
  int c[TSR_MAX_MESH_DIMS] = {0};
  tsr_mesh_coords(m, tsr_rank_id(r), c);
  return c[dim];
}

/* Rows [start, start + len) of dim 1 of src copied to rows [at, at + len) of dst. */
static tsr_status copy_rows(tsr_tensor *dst, int64_t at, const tsr_tensor *src, int64_t start,
                            int64_t len) {
  tsr_tensor *a = NULL, *b = NULL;
  tsr_status st = tsr_tensor_narrow(dst, 1, at, len, &a);
  if (st == TSR_OK) st = tsr_tensor_narrow(src, 1, start, len, &b);
  if (st == TSR_OK) st = tsr_tensor_copy(a, b);
  tsr_tensor_free(a);
  tsr_tensor_free(b);
  return st;
}

static tsr_status zigzag_extent_check(const tsr_dtensor *x, int64_t E, int n) {
  if (E % (2 * n) == 0) return TSR_OK;
  char b[128];
  return TSR_ERROR(TSR_EINVAL,
                   "cp_ring: tensor %s has %lld sequence rows here, which zigzag over ring_cp = "
                   "%d cannot split into %d equal chunks; use a sequence length that is a "
                   "multiple of %d",
                   tsr_shape_str(x->ndim, x->shape, b, sizeof b), (long long)E, n, 2 * n, 2 * n);
}

/* Replicate -> zigzag Shard(1): keep chunks c and 2n-1-c of the local rows. */
static tsr_status zigzag_chunk(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_dtensor **out) {
  int n = tsr_mesh_dim_size(x->mesh, dim), c = coord_of(r, x->mesh, dim);
  const tsr_tensor *loc = x->local;
  int64_t E = loc->shape[1], h = E / (2 * n);
  TSR_CHECK(zigzag_extent_check(x, E, n));
  int64_t shape[TSR_MAX_DIMS];
  memcpy(shape, loc->shape, sizeof shape);
  shape[1] = 2 * h;
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_rank_allocator(r), x->dtype, loc->ndim, shape, &t));
  tsr_status st = copy_rows(t, 0, loc, c * h, h);
  if (st == TSR_OK) st = copy_rows(t, h, loc, (2 * n - 1 - c) * h, h);
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = tsr_shard(1);
  if (st == TSR_OK) return tsr_dtensor_from_local(r, x->mesh, t, x->shape, p, out);
  tsr_tensor_free(t);
  return st;
}

/* zigzag Shard(1) -> Replicate: all-gather, then put member j's halves at chunks j and 2n-1-j. */
static tsr_status zigzag_gather(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_dtensor **out) {
  int n = tsr_mesh_dim_size(x->mesh, dim);
  const tsr_tensor *loc = x->local;
  int64_t h = loc->shape[1] / 2, count = tsr_tensor_numel(loc), total = count * n;
  int64_t shape[TSR_MAX_DIMS];
  memcpy(shape, loc->shape, sizeof shape);
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(x->mesh, tsr_rank_comm(r), 1u << dim, &g));
  tsr_tensor *flat = NULL, *src = NULL, *t = NULL, *piece = NULL, *blk = NULL;
  tsr_status st = TSR_OK;
  /* beside loc, so that placing the members' halves copies within the device */
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_tensor_scratch_allocator(loc), x->dtype, 1, &total, &flat), st);
  TSR_CHECK_GOTO(tsr_tensor_clone(loc, &src), st);
  TSR_CHECK_GOTO(tsr_comm_all_gather(g, tsr_tensor_data(src), (size_t)count, tsr_tensor_data(flat),
                                     NULL, x->dtype),
                 st);
  shape[1] = 2 * h * n;
  TSR_CHECK_GOTO(tsr_tensor_new(tsr_rank_allocator(r), x->dtype, loc->ndim, shape, &t), st);
  for (int j = 0; j < n; j++) {
    TSR_CHECK_GOTO(tsr_tensor_narrow(flat, 0, j * count, count, &piece), st);
    TSR_CHECK_GOTO(tsr_tensor_reshape(piece, loc->ndim, loc->shape, &blk), st);
    TSR_CHECK_GOTO(copy_rows(t, j * h, blk, 0, h), st);
    TSR_CHECK_GOTO(copy_rows(t, (2 * n - 1 - j) * h, blk, h, h), st);
    tsr_tensor_free(blk);
    tsr_tensor_free(piece);
    blk = piece = NULL;
  }
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = tsr_replicate();
  st = tsr_dtensor_from_local(r, x->mesh, t, x->shape, p, out);
  t = NULL;
cleanup:
  tsr_tensor_free(blk);
  tsr_tensor_free(piece);
  tsr_tensor_free(src);
  tsr_tensor_free(flat);
  tsr_tensor_free(t);
  return st;
}

/* Replaces *y by its redistribute to `p` (the core planner; the ring dim does not change there
 * unless it goes between placements other than Shard(1), which this rule leaves to the core). */
static tsr_status move_to(tsr_rank_t *r, tsr_dtensor **y, const tsr_placement *p) {
  tsr_dtensor *z = NULL;
  TSR_CHECK(tsr_dtensor_redistribute(r, *y, (*y)->mesh, p, &z));
  tsr_dtensor_free(*y);
  *y = z;
  return TSR_OK;
}

typedef tsr_status (*zigzag_step)(tsr_rank_t *, const tsr_dtensor *, int, tsr_dtensor **);

static tsr_status step_with(tsr_rank_t *r, tsr_dtensor **y, int dim, zigzag_step f) {
  tsr_dtensor *z = NULL;
  TSR_CHECK(f(r, *y, dim, &z));
  tsr_dtensor_free(*y);
  *y = z;
  return TSR_OK;
}

/* Any change of the ring dim into or out of zigzag Shard(1) goes through Replicate on it. Mesh
 * dims after the ring dim that shard the sequence split the ring's rows, so they are gathered
 * first and split again at the end, keeping the nesting that the placements describe. */
tsr_status ring_zigzag_apply(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement dst,
                             tsr_dtensor **out, void *ctx) {
  (void)ctx;
  *out = NULL;
  const tsr_mesh_t *m = x->mesh;
  tsr_placement src = x->placements[dim], p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  bool inner[TSR_MAX_MESH_DIMS] = {false};
  for (int i = dim + 1; i < tsr_mesh_ndim(m); i++)
    if (tsr_mesh_dim_size(m, i) > 1 && is_seq_shard(p[i])) {
      inner[i] = true;
      p[i] = tsr_replicate();
    }
  tsr_dtensor *y = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_dtensor_redistribute(r, x, m, p, &y), st);
  if (is_seq_shard(src)) {
    TSR_CHECK_GOTO(step_with(r, &y, dim, zigzag_gather), st);
  } else if (src.kind != TSR_REPLICATE) {
    p[dim] = tsr_replicate();
    TSR_CHECK_GOTO(move_to(r, &y, p), st);
  }
  p[dim] = dst;
  if (is_seq_shard(dst))
    TSR_CHECK_GOTO(step_with(r, &y, dim, zigzag_chunk), st);
  else if (dst.kind != TSR_REPLICATE)
    TSR_CHECK_GOTO(move_to(r, &y, p), st);
  bool any = false;
  for (int i = dim + 1; i < tsr_mesh_ndim(m); i++)
    if (inner[i]) {
      p[i] = tsr_shard(1);
      any = true;
    }
  if (any) TSR_CHECK_GOTO(move_to(r, &y, p), st);
  *out = y;
  return TSR_OK;
cleanup:
  tsr_dtensor_free(y);
  return st;
}

/* ---- RoPE on zigzag rows ---- */

typedef struct rope_saved {
  tsr_tensor *cos_t, *sin_t; /* (L, D), on x's device */
} rope_saved;

void ring_rope_saved_free(void *p) {
  rope_saved *s = p;
  if (!s) return;
  tsr_tensor_free(s->cos_t);
  tsr_tensor_free(s->sin_t);
  free(s);
}

tsr_status ring_rope_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                             const void *attrs, int nout, tsr_dtensor **out, void **saved,
                             void *ctx) {
  (void)dim, (void)nin, (void)nout;
  const tsr_dtensor *x = in[0];
  const tsr_rope_attrs *a = attrs;
  TSR_CHECK(tsr_dtensor_zeros(r, x->mesh, TSR_F32, 4, x->shape, x->placements, out));
  if (!x->local) return TSR_OK;
  const int64_t *ls = x->local->shape;
  int B = (int)ls[0], L = (int)ls[1], H = (int)ls[2], D = (int)ls[3], n = 0;
  rope_saved *s = calloc(1, sizeof *s);
  if (!s) return TSR_ERROR(TSR_ENOMEM, "cp_ring: out of memory saving rope");
  *saved = s;
  const tsr_kernel_table *kt = tsr_kernel_table_of(x->local);
  tsr_allocator *alloc = tsr_tensor_scratch_allocator(x->local);
  int64_t tshape[2] = {L, D};
  int32_t *pos = NULL;
  tsr_tensor *pos_t = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(ring_positions(ctx, x->mesh, x->placements, x->shape[1], tsr_rank_id(r), &pos, &n),
                 st);
  if (n != L) {
    st = TSR_ERROR(TSR_EINTERNAL, "cp_ring: %d positions for %d local rows", n, L);
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_tensor_from_i32(alloc, n, pos, &pos_t), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 2, tshape, &s->cos_t), st);
  TSR_CHECK_GOTO(tsr_tensor_new(alloc, TSR_F32, 2, tshape, &s->sin_t), st);
  TSR_CHECK_GOTO(kt->rope_tables(tsr_tensor_data(s->cos_t), tsr_tensor_data(s->sin_t),
                                 tsr_tensor_data(pos_t), L, D, a->theta),
                 st);
  kt->rope_forward(tsr_tensor_data((*out)->local), tsr_tensor_data(x->local),
                   tsr_tensor_data(s->cos_t), tsr_tensor_data(s->sin_t), B, L, H, D);
cleanup:
  tsr_tensor_free(pos_t);
  free(pos);
  return st;
}

tsr_status ring_rope_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, const tsr_dtensor *const *outs,
                              const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                              void *ctx) {
  (void)dim, (void)nin, (void)attrs, (void)nout, (void)outs, (void)ctx;
  const tsr_dtensor *x = in[0];
  if (!gouts[0]) return TSR_OK;
  TSR_CHECK(tsr_dtensor_zeros(r, x->mesh, TSR_F32, 4, x->shape, x->placements, &gins[0]));
  if (!x->local) return TSR_OK;
  const rope_saved *s = saved;
  const int64_t *ls = x->local->shape;
  tsr_kernel_table_of(x->local)->rope_backward(
      tsr_tensor_data(gins[0]->local), tsr_tensor_data(gouts[0]->local), tsr_tensor_data(s->cos_t),
      tsr_tensor_data(s->sin_t), (int)ls[0], (int)ls[1], (int)ls[2], (int)ls[3]);
  return TSR_OK;
}
