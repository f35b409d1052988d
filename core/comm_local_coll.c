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
 *
 * Device buffers (virtual ranks on one device, every rank's memory in one address space) move
 * without the host: copies are the device's copies, and an f32 sum is the device's add, peer by
 * peer in the same order, so it rounds as the host sum does. Other reductions on device memory
 * (max, avg, bf16, integers: small in practice, a loss's row maxima) read and write it through
 * host blocks. A member's queued device work is waited for before it posts its buffers and before
 * each later rendezvous, so a peer never reads what is not yet written, nor a member reuses a
 * buffer a peer is still reading.
 */
#include <stdlib.h>
#include <string.h>

#include "comm_local.h"
#include "kernel_table.h"

/* Elements reduced at a time: the accumulator stays in L1 while the peers stream through. */
#define TSR_REDUCE_BLOCK 512
/* Bytes of the host all-reduce's chunk reduced at a time before their copy to the peers: small
 * enough to be in L1/L2 still when it is copied. */
#define TSR_FUSED_BLOCK_BYTES ((size_t)16 << 10)

tsr_status tsr_device_wait(const void *a, const void *b) {
  tsr_status st = TSR_OK;
  if (tsr_on_device(a)) st = tsr_kernel_table_of_ptr(a)->sync();
  if (st == TSR_OK && tsr_on_device(b) &&
      (!a || tsr_kernel_table_of_ptr(a) != tsr_kernel_table_of_ptr(b)))
    st = tsr_kernel_table_of_ptr(b)->sync();
  return st;
}

/* The rendezvous that ends a phase, after this member's device work of the phase is done. A
 * failure of that work is kept in *st; the member takes part in the rendezvous regardless, as its
 * peers wait for it. */
static void phase_end(tsr_group_t *g, const void *a, const void *b, tsr_status *st) {
  tsr_status w = tsr_device_wait(a, b);
  if (*st == TSR_OK) *st = w;
  tsr_local_sync(g);
}

/* Host view of `len` elements at element `off` of src: src itself on the host, else a copy in
 * `stage` (TSR_REDUCE_BLOCK * 8 bytes). */
static const void *host_block(const void *src, size_t off, size_t len, size_t es, void *stage) {
  if (!tsr_on_device(src)) return (const char *)src + off * es;
  tsr_memcpy_any(stage, (const char *)src + off * es, len * es);
  return stage;
}

static void load_f32(tsr_dtype dt, const void *src, size_t off, size_t len, float *out) {
  uint64_t stage[TSR_REDUCE_BLOCK];
  src = host_block(src, off, len, tsr_dtype_size(dt), stage);
  off = 0;
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
  uint64_t stage[TSR_REDUCE_BLOCK];
  void *out = tsr_on_device(dst) ? (void *)stage : dst;
  if (dt == TSR_F32) {
    memcpy(out, acc, len * sizeof *acc);
  } else if (dt == TSR_BF16) {
    uint16_t *d = out;
    for (size_t i = 0; i < len; i++) d[i] = tsr_f32_to_bf16(acc[i]);
  } else {
    uint16_t *d = out;
    for (size_t i = 0; i < len; i++) d[i] = tsr_f32_to_f16(acc[i]);
  }
  if (out != dst) tsr_memcpy_any(dst, out, len * tsr_dtype_size(dt));
}

/* Hot loops carry an AVX2 clone picked at load time where the compiler can (as the CPU kernels
 * do): an add is an add at any vector width, so both clones give the same bits. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) &&                             \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TSR_LOCAL_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define TSR_LOCAL_CLONES
#endif

/* One block of an f32 reduction of host memory: acc[i] = s[0][i] op s[1][i] op ... in member
 * order, then the average's division. Written for a constant `m` (the full block, which the -O2
 * vectoriser takes) and for the tail. */
static inline void f32_block(int n, const float *const *s, size_t off, size_t m, tsr_reduce_op op,
                             float *restrict acc) {
  const float *restrict a = s[0] + off;
  if (op == TSR_REDUCE_MAX) {
    for (size_t i = 0; i < m; i++) acc[i] = a[i];
    for (int k = 1; k < n; k++) {
      const float *restrict b = s[k] + off;
      /* NaN wins, as torch.max does. */
      for (size_t i = 0; i < m; i++) acc[i] = (b[i] > acc[i] || b[i] != b[i]) ? b[i] : acc[i];
    }
    return;
  }
  if (n == 1) {
    for (size_t i = 0; i < m; i++) acc[i] = a[i];
  } else {
    const float *restrict b = s[1] + off;
    for (size_t i = 0; i < m; i++) acc[i] = a[i] + b[i];
  }
  for (int k = 2; k < n; k++) {
    const float *restrict b = s[k] + off;
    for (size_t i = 0; i < m; i++) acc[i] += b[i];
  }
  if (op == TSR_REDUCE_AVG)
    for (size_t i = 0; i < m; i++) acc[i] /= (float)n;
}

/* dst[i] = op over k of srcs[k][off + i] for f32 host memory, block by block so that every block
 * of every source is read before the block of dst (which may be one of them) is written. */
TSR_LOCAL_CLONES static void reduce_f32_host(int n, const void *const *srcs, size_t off, size_t len,
                                             tsr_reduce_op op, float *dst) {
  float acc[TSR_REDUCE_BLOCK];
  const float *const *s = (const float *const *)srcs;
  size_t b = 0;
  for (; b + TSR_REDUCE_BLOCK <= len; b += TSR_REDUCE_BLOCK) {
    f32_block(n, s, off + b, TSR_REDUCE_BLOCK, op, acc);
    memcpy(dst + b, acc, sizeof acc);
  }
  if (b < len) {
    f32_block(n, s, off + b, len - b, op, acc);
    memcpy(dst + b, acc, (len - b) * sizeof *acc);
  }
}

static void reduce_float(int n, const void *const *srcs, size_t off, size_t len, tsr_dtype dt,
                         tsr_reduce_op op, void *dst) {
  float acc[TSR_REDUCE_BLOCK], tmp[TSR_REDUCE_BLOCK];
  size_t es = tsr_dtype_size(dt);
  bool host = dt == TSR_F32 && !tsr_on_device(dst);
  for (int k = 0; host && k < n; k++) host = !tsr_on_device(srcs[k]);
  if (host) {
    reduce_f32_host(n, srcs, off, len, op, dst);
    return;
  }
  for (size_t b = 0; b < len; b += TSR_REDUCE_BLOCK) {
    size_t m = len - b < TSR_REDUCE_BLOCK ? len - b : TSR_REDUCE_BLOCK;
    load_f32(dt, srcs[0], off + b, m, acc);
    for (int k = 1; k < n; k++) {
      const float *s = tmp;
      if (dt == TSR_F32 && !tsr_on_device(srcs[k]))
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
  uint64_t stage[TSR_REDUCE_BLOCK];
  src = host_block(src, off, len, tsr_dtype_size(dt), stage);
  off = 0;
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
    void *out = tsr_on_device(dst) ? (void *)tmp : (char *)dst + b * tsr_dtype_size(dt);
    if (dt == TSR_I64) {
      memcpy(out, acc, m * sizeof *acc);
    } else {
      int32_t *d = out;
      for (size_t i = 0; i < m; i++) d[i] = (int32_t)(uint32_t)(uint64_t)acc[i];
    }
    if (out == tmp)
      tsr_memcpy_any((char *)dst + b * tsr_dtype_size(dt), out, m * tsr_dtype_size(dt));
  }
}

/* Whether a reduction into `recv` may run on the device as an f32 sum (reduce_device). */
static bool sum_on_device(const tsr_call *call) {
  return call->dt == TSR_F32 && call->op == TSR_REDUCE_SUM && tsr_on_device(call->recv);
}

/* The f32 sum on the device when every buffer is memory of one device: srcs[0], then + srcs[1],
 * + srcs[2], ..., the host loop's order. A dst that is one of the later sources (in place) is
 * summed in `tmp` (device memory of len floats) first; without tmp that case is left to the
 * host blocks. */
static bool reduce_device(int n, const void *const *srcs, size_t off, size_t len, tsr_dtype dt,
                          tsr_reduce_op op, void *dst, void *tmp) {
  if (dt != TSR_F32 || op != TSR_REDUCE_SUM || !tsr_on_device(dst)) return false;
  const tsr_kernel_table *k = tsr_kernel_table_of_ptr(dst);
  bool aliased = false;
  for (int j = 0; j < n; j++) {
    if (tsr_kernel_table_of_ptr(srcs[j]) != k) return false;
    aliased = aliased || (j > 0 && dst == (const float *)srcs[j] + off);
  }
  if (aliased && !tmp) return false;
  float *d = aliased ? tmp : dst;
  if (d != (const float *)srcs[0] + off) k->copy_d2d(d, (const float *)srcs[0] + off, len * 4);
  for (int j = 1; j < n; j++) k->add(d, d, (const float *)srcs[j] + off, (int64_t)len);
  if (aliased) k->copy_d2d(dst, d, len * 4);
  return true;
}

/* dst[i] = op over k of srcs[k][off + i], i < len. dst may be srcs[self] + off; `dev_tmp`, NULL
 * or len elements of device memory, serves reduce_device then. */
static void reduce(int n, const void *const *srcs, size_t off, size_t len, tsr_dtype dt,
                   tsr_reduce_op op, void *dst, void *dev_tmp) {
  if (!len || reduce_device(n, srcs, off, len, dt, op, dst, dev_tmp)) return;
  if (dt == TSR_I32 || dt == TSR_I64)
    reduce_int(n, srcs, off, len, dt, op, dst);
  else
    reduce_float(n, srcs, off, len, dt, op, dst);
}

/* Whether any member's buffers of the entered call are device memory: the same answer on every
 * member, so all take the same algorithm. */
static bool group_on_device(tsr_group_t *g) {
  local_group *lg = tsr_local_group(g);
  for (int j = 0; j < g->n; j++)
    if (tsr_on_device(lg->m[j].call.send) || tsr_on_device(lg->m[j].call.recv)) return true;
  return false;
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
  void *dst = call->recv, *dev_tmp = NULL;
  size_t off = (size_t)tsr_chunk_start((int64_t)call->count, n, me);
  size_t len = (size_t)tsr_chunk_size((int64_t)call->count, n, me);
  TSR_CHECK(srcs_prepare(g, &srcs));
  /* In place, the latency algorithm would overwrite a buffer its peers are still reading. */
  if (small && call->send == call->recv && bytes) TSR_CHECK(tsr_local_scratch(g, bytes, &dst));
  if (call->send == call->recv && sum_on_device(call) && len)
    TSR_CHECK(tsr_local_device_scratch(g, len * es, &dev_tmp));
  TSR_CHECK(tsr_device_wait(call->send, call->recv));
  TSR_CHECK(tsr_local_enter(g, call));
  srcs_fill(g, srcs);
  tsr_status st = TSR_OK;
  bool on_device = group_on_device(g);
  /* On a device the bandwidth algorithm always: its in-place safety needs no host scratch, and
   * the rendezvous it adds cost nothing beside the device waits. */
  if (small && !on_device) {
    reduce(n, srcs, 0, call->count, call->dt, call->op, dst, NULL);
    tsr_local_sync(g);
    if (dst != call->recv) memcpy(call->recv, dst, bytes);
    return TSR_OK;
  }
  if (!on_device) {
    /* Bandwidth algorithm on the host: member i reduces chunk i of every member's send, a block
     * at a time, into its own recv and copies the block, still in cache, into every peer's recv.
     * No peer reads chunk i of any buffer (in place included), so nothing waits between the two;
     * each byte of the sends is read once and each byte of the recvs written once, with one
     * rendezvous after the entry. */
    size_t step = TSR_FUSED_BLOCK_BYTES / es;
    char *own = (char *)call->recv;
    for (size_t b = 0; b < len; b += step) {
      size_t m = len - b < step ? len - b : step, at = (off + b) * es;
      reduce(n, srcs, off + b, m, call->dt, call->op, own + at, NULL);
      /* Starting after itself, so that the members write to different peers at a time. */
      for (int t = 1; t < n; t++)
        memcpy((char *)lg->m[(me + t) % n].call.recv + at, own + at, m * es);
    }
    tsr_local_sync(g);
    return TSR_OK;
  }
  /* Bandwidth algorithm on a device: member i reduces chunk i of every peer's send into its own
   * recv (no peer reads that chunk of its send, so in place is safe), then copies the other chunks
   * from the members that reduced them. */
  reduce(n, srcs, off, len, call->dt, call->op, (char *)call->recv + off * es, dev_tmp);
  phase_end(g, call->recv, NULL, &st);
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    size_t jo = (size_t)tsr_chunk_start((int64_t)call->count, n, j);
    size_t jl = (size_t)tsr_chunk_size((int64_t)call->count, n, j);
    if (jl)
      tsr_memcpy_any((char *)call->recv + jo * es, (const char *)lg->m[j].call.recv + jo * es,
                     jl * es);
  }
  phase_end(g, call->recv, NULL, &st);
  return st;
}

tsr_status tsr_local_all_gather(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  size_t es = tsr_dtype_size(call->dt), off = 0;
  tsr_status st = TSR_OK;
  TSR_CHECK(tsr_device_wait(call->send, call->recv));
  TSR_CHECK(tsr_local_enter(g, call));
  for (int j = 0; j < g->n; j++) {
    size_t bytes = call->counts[j] * es;
    char *dst = (char *)call->recv + off * es;
    const void *src = lg->m[j].call.send;
    /* In place is the own contribution already at its offset in recv. */
    if (bytes && src != dst) tsr_memcpy_any(dst, src, bytes);
    off += call->counts[j];
  }
  phase_end(g, call->recv, NULL, &st);
  return st;
}

tsr_status tsr_local_reduce_scatter(tsr_group_t *g, const tsr_call *call) {
  const void **srcs = NULL;
  size_t off = 0;
  for (int j = 0; j < g->index; j++) off += call->counts[j];
  size_t es = tsr_dtype_size(call->dt), len = call->counts[g->index];
  void *dev_tmp = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK(srcs_prepare(g, &srcs));
  if ((const char *)call->recv == (const char *)call->send + off * es && sum_on_device(call) && len)
    TSR_CHECK(tsr_local_device_scratch(g, len * es, &dev_tmp));
  TSR_CHECK(tsr_device_wait(call->send, call->recv));
  TSR_CHECK(tsr_local_enter(g, call));
  srcs_fill(g, srcs);
  reduce(g->n, srcs, off, len, call->dt, call->op, call->recv, dev_tmp);
  phase_end(g, call->recv, NULL, &st);
  return st;
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
  tsr_status st = TSR_OK;
  TSR_CHECK(tsr_device_wait(call->send, call->recv));
  TSR_CHECK(tsr_local_enter(g, call));
  size_t off = 0;
  for (int j = 0; j < g->n; j++) {
    const local_member *peer = &lg->m[j];
    size_t bytes = call->recv_counts[j] * es;
    if (bytes)
      tsr_memcpy_any((char *)call->recv + off * es,
                     (const char *)peer->call.send + peer->displs[g->index] * es, bytes);
    off += call->recv_counts[j];
  }
  phase_end(g, call->recv, NULL, &st);
  return st;
}

tsr_status tsr_local_broadcast(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  tsr_status st = TSR_OK;
  TSR_CHECK(tsr_device_wait(call->send, call->recv));
  TSR_CHECK(tsr_local_enter(g, call));
  if (g->index != call->root && call->count)
    tsr_memcpy_any(call->recv, lg->m[call->root].call.send, call->count * tsr_dtype_size(call->dt));
  phase_end(g, call->recv, NULL, &st);
  return st;
}

tsr_status tsr_local_barrier(tsr_group_t *g, const tsr_call *call) {
  return tsr_local_enter(g, call);
}
