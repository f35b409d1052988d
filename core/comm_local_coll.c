/* Data movement of the local backend's collectives.
 *
 * After the rendezvous every member can read every peer's buffers, so each collective is a
 * "direct" one: a member pulls exactly what it needs from its peers and writes only its own
 * buffers. A second rendezvous keeps the send buffers alive until every peer has read them.
 *
 * Anything that can fail (scratch allocation) happens before the rendezvous: once a member has
 * entered, it must take part in every later phase or its peers would wait for it forever.
 *
 * Reductions visit members in group order 0, 1, ..., n-1 on every member and in both all-reduce
 * algorithms, so that every member gets bit-identical floats whatever the algorithm.
 */
#include <stdlib.h>
#include <string.h>

#include "comm_local.h"

/* Elements reduced at a time: the accumulator stays in L1 while the peers stream through. */
#define TSR_REDUCE_BLOCK 512

static void load_f32(tsr_dtype dt, const void *src, size_t off, size_t len, float *out) {
  if (dt == TSR_F32) {
    memcpy(out, (const float *)src + off, len * sizeof *out);
  } else if (dt == TSR_BF16) {
    const uint16_t *s = (const uint16_t *)src + off;
    for (size_t i = 0; i < len; i++) out[i] = tsr_bf16_to_f32(s[i]);
  } else {
    const uint16_t *s = (const uint16_t *)src + off;
    for (size_t i = 0; i < len; i++) out[i] = tsr_f16_to_f32(s[i]);
  }
}

/* The only rounding of a bf16/f16 reduction: accumulation is in f32. */
static void store_f32(tsr_dtype dt, const float *acc, size_t len, void *dst) {
  if (dt == TSR_F32) {
    memcpy(dst, acc, len * sizeof *acc);
  } else if (dt == TSR_BF16) {
    uint16_t *d = dst;
    for (size_t i = 0; i < len; i++) d[i] = tsr_f32_to_bf16(acc[i]);
  } else {
    uint16_t *d = dst;
    for (size_t i = 0; i < len; i++) d[i] = tsr_f32_to_f16(acc[i]);
  }
}

static void reduce_float(int n, const void *const *srcs, size_t off, size_t len, tsr_dtype dt,
                         tsr_reduce_op op, void *dst) {
  float acc[TSR_REDUCE_BLOCK], tmp[TSR_REDUCE_BLOCK];
  size_t es = tsr_dtype_size(dt);
  for (size_t b = 0; b < len; b += TSR_REDUCE_BLOCK) {
    size_t m = len - b < TSR_REDUCE_BLOCK ? len - b : TSR_REDUCE_BLOCK;
    load_f32(dt, srcs[0], off + b, m, acc);
    for (int k = 1; k < n; k++) {
      const float *s = tmp;
      if (dt == TSR_F32)
        s = (const float *)srcs[k] + off + b;
      else
        load_f32(dt, srcs[k], off + b, m, tmp);
      if (op == TSR_REDUCE_MAX) {
        /* NaN wins, as torch.max does. */
        for (size_t i = 0; i < m; i++) acc[i] = (s[i] > acc[i] || s[i] != s[i]) ? s[i] : acc[i];
      } else {
        for (size_t i = 0; i < m; i++) acc[i] += s[i];
      }
    }
    if (op == TSR_REDUCE_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= (float)n;
    store_f32(dt, acc, m, (char *)dst + b * es);
  }
}

static void load_i64(tsr_dtype dt, const void *src, size_t off, size_t len, int64_t *out) {
  if (dt == TSR_I64) {
    memcpy(out, (const int64_t *)src + off, len * sizeof *out);
  } else {
    const int32_t *s = (const int32_t *)src + off;
    for (size_t i = 0; i < len; i++) out[i] = s[i];
  }
}

/* Integers accumulate in 64 bits with wrap-around (unsigned arithmetic, so overflow is defined),
 * which keeps the i32 average exact. AVG is the sum divided by n, truncated toward zero. */
static void reduce_int(int n, const void *const *srcs, size_t off, size_t len, tsr_dtype dt,
                       tsr_reduce_op op, void *dst) {
  int64_t acc[TSR_REDUCE_BLOCK], tmp[TSR_REDUCE_BLOCK];
  for (size_t b = 0; b < len; b += TSR_REDUCE_BLOCK) {
    size_t m = len - b < TSR_REDUCE_BLOCK ? len - b : TSR_REDUCE_BLOCK;
    load_i64(dt, srcs[0], off + b, m, acc);
    for (int k = 1; k < n; k++) {
      load_i64(dt, srcs[k], off + b, m, tmp);
      if (op == TSR_REDUCE_MAX) {
        for (size_t i = 0; i < m; i++) acc[i] = tmp[i] > acc[i] ? tmp[i] : acc[i];
      } else {
        for (size_t i = 0; i < m; i++) acc[i] = (int64_t)((uint64_t)acc[i] + (uint64_t)tmp[i]);
      }
    }
    if (op == TSR_REDUCE_AVG)
      for (size_t i = 0; i < m; i++) acc[i] /= n;
    if (dt == TSR_I64) {
      memcpy((int64_t *)dst + b, acc, m * sizeof *acc);
    } else {
      int32_t *d = (int32_t *)dst + b;
      for (size_t i = 0; i < m; i++) d[i] = (int32_t)(uint32_t)(uint64_t)acc[i];
    }
  }
}

/* dst[i] = op over k of srcs[k][off + i], i < len. dst may be srcs[self] + off. */
static void reduce(int n, const void *const *srcs, size_t off, size_t len, tsr_dtype dt,
                   tsr_reduce_op op, void *dst) {
  if (dt == TSR_I32 || dt == TSR_I64)
    reduce_int(n, srcs, off, len, dt, op, dst);
  else
    reduce_float(n, srcs, off, len, dt, op, dst);
}

/* This member's array of peer send pointers, allocated before the rendezvous. */
static tsr_status srcs_prepare(tsr_group_t *g, const void ***out) {
  local_member *m = &tsr_local_group(g)->m[g->index];
  if (!m->srcs) {
    m->srcs = calloc((size_t)g->n, sizeof *m->srcs);
    if (!m->srcs)
      return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for %d pointers", g->label, g->n);
  }
  *out = m->srcs;
  return TSR_OK;
}

static void srcs_fill(tsr_group_t *g, const void **srcs) {
  local_group *lg = tsr_local_group(g);
  for (int k = 0; k < g->n; k++) srcs[k] = lg->m[k].call.send;
}

tsr_status tsr_local_all_reduce(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  int n = g->n, me = g->index;
  size_t es = tsr_dtype_size(call->dt), bytes = call->count * es;
  bool small = bytes <= tsr_local_world(g)->small_bytes / (size_t)(n - 1);
  const void **srcs = NULL;
  void *dst = call->recv;
  TSR_CHECK(srcs_prepare(g, &srcs));
  /* In place, the latency algorithm would overwrite a buffer its peers are still reading. */
  if (small && call->send == call->recv && bytes) TSR_CHECK(tsr_local_scratch(g, bytes, &dst));
  TSR_CHECK(tsr_local_enter(g, call));
  srcs_fill(g, srcs);
  if (small) {
    reduce(n, srcs, 0, call->count, call->dt, call->op, dst);
    tsr_local_sync(g);
    if (dst != call->recv) memcpy(call->recv, dst, bytes);
    return TSR_OK;
  }
  /* Bandwidth algorithm: member i reduces chunk i of every peer's send into its own recv (no peer
   * reads that chunk of its send, so in place is safe), then copies the other chunks from the
   * members that reduced them. */
  size_t off = (size_t)tsr_chunk_start((int64_t)call->count, n, me);
  size_t len = (size_t)tsr_chunk_size((int64_t)call->count, n, me);
  reduce(n, srcs, off, len, call->dt, call->op, (char *)call->recv + off * es);
  tsr_local_sync(g);
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    size_t jo = (size_t)tsr_chunk_start((int64_t)call->count, n, j);
    size_t jl = (size_t)tsr_chunk_size((int64_t)call->count, n, j);
    if (jl)
      memcpy((char *)call->recv + jo * es, (const char *)lg->m[j].call.recv + jo * es, jl * es);
  }
  tsr_local_sync(g);
  return TSR_OK;
}

tsr_status tsr_local_all_gather(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  size_t es = tsr_dtype_size(call->dt), off = 0;
  TSR_CHECK(tsr_local_enter(g, call));
  for (int j = 0; j < g->n; j++) {
    size_t bytes = call->counts[j] * es;
    char *dst = (char *)call->recv + off * es;
    const void *src = lg->m[j].call.send;
    /* In place is the own contribution already at its offset in recv. */
    if (bytes && src != dst) memcpy(dst, src, bytes);
    off += call->counts[j];
  }
  tsr_local_sync(g);
  return TSR_OK;
}

tsr_status tsr_local_reduce_scatter(tsr_group_t *g, const tsr_call *call) {
  const void **srcs = NULL;
  size_t off = 0;
  for (int j = 0; j < g->index; j++) off += call->counts[j];
  TSR_CHECK(srcs_prepare(g, &srcs));
  TSR_CHECK(tsr_local_enter(g, call));
  srcs_fill(g, srcs);
  reduce(g->n, srcs, off, call->counts[g->index], call->dt, call->op, call->recv);
  tsr_local_sync(g);
  return TSR_OK;
}

tsr_status tsr_local_all_to_all(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  local_member *self = &lg->m[g->index];
  size_t es = tsr_dtype_size(call->dt);
  if (!self->displs) {
    self->displs = calloc((size_t)g->n + 1, sizeof *self->displs);
    if (!self->displs)
      return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for %d offsets", g->label, g->n);
  }
  /* Peers read these offsets into this member's send buffer after the rendezvous. */
  self->displs[0] = 0;
  for (int j = 0; j < g->n; j++) self->displs[j + 1] = self->displs[j] + call->counts[j];
  TSR_CHECK(tsr_local_enter(g, call));
  size_t off = 0;
  for (int j = 0; j < g->n; j++) {
    const local_member *peer = &lg->m[j];
    size_t bytes = call->recv_counts[j] * es;
    if (bytes)
      memcpy((char *)call->recv + off * es,
             (const char *)peer->call.send + peer->displs[g->index] * es, bytes);
    off += call->recv_counts[j];
  }
  tsr_local_sync(g);
  return TSR_OK;
}

tsr_status tsr_local_broadcast(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  TSR_CHECK(tsr_local_enter(g, call));
  if (g->index != call->root && call->count)
    memcpy(call->recv, lg->m[call->root].call.send, call->count * tsr_dtype_size(call->dt));
  tsr_local_sync(g);
  return TSR_OK;
}

tsr_status tsr_local_barrier(tsr_group_t *g, const tsr_call *call) {
  return tsr_local_enter(g, call);
}
