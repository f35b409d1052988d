/* Data movement of the `mpi` backend's collectives.
 *
 * Every collective is the "direct" algorithm that comm.h's byte counters describe: a member sends
 * each peer exactly the part that peer needs, with nonblocking point to point, after the arrival
 * exchange has proven that every member is in the same call. Reductions are computed here, not by
 * MPI: MPI has no bf16, and reducing in member order 0 .. n-1 with the local backend's arithmetic
 * gives results bit-identical to `local` on every member, so replicated parameters never drift
 * apart and a run under mpi reproduces the same run under local.
 *
 * Anything that can fail for lack of memory happens before the arrival: once a member has
 * arrived, its peers count on it for every later phase.
 */
#include <stdlib.h>
#include <string.h>

#include "mpi_backend.h"

/* ---- Reduction ---- */

/* Elements per block: the accumulator and one operand stay in L1. */
#define TSR_MPI_BLOCK 1024

static void widen_float(tsr_dtype dt, const void *src, size_t m, float *out) {
  const uint16_t *h = src;
  switch (dt) {
    case TSR_BF16:
      for (size_t i = 0; i < m; i++) out[i] = tsr_bf16_to_f32(h[i]);
      break;
    case TSR_F16:
      for (size_t i = 0; i < m; i++) out[i] = tsr_f16_to_f32(h[i]);
      break;
    default:
      memcpy(out, src, m * sizeof *out);
      break;
  }
}

static void narrow_float(tsr_dtype dt, const float *acc, size_t m, void *dst) {
  uint16_t *h = dst;
  switch (dt) {
    case TSR_BF16:
      for (size_t i = 0; i < m; i++) h[i] = tsr_f32_to_bf16(acc[i]);
      break;
    case TSR_F16:
      for (size_t i = 0; i < m; i++) h[i] = tsr_f32_to_f16(acc[i]);
      break;
    default:
      memcpy(dst, acc, m * sizeof *acc);
      break;
  }
}

static void widen_int(tsr_dtype dt, const void *src, size_t m, int64_t *out) {
  if (dt == TSR_I64) {
    memcpy(out, src, m * sizeof *out);
    return;
  }
  const int32_t *s = src;
  for (size_t i = 0; i < m; i++) out[i] = s[i];
}

static void narrow_int(tsr_dtype dt, const int64_t *acc, size_t m, void *dst) {
  if (dt == TSR_I64) {
    memcpy(dst, acc, m * sizeof *acc);
    return;
  }
  int32_t *d = dst;
  for (size_t i = 0; i < m; i++) d[i] = (int32_t)(uint32_t)(uint64_t)acc[i];
}

static void reduce_block_float(int n, const void *const *srcs, size_t at, size_t m, tsr_dtype dt,
                               tsr_reduce_op op, void *dst) {
  float acc[TSR_MPI_BLOCK], x[TSR_MPI_BLOCK];
  size_t es = tsr_dtype_size(dt);
  widen_float(dt, (const char *)srcs[0] + at * es, m, acc);
  for (int k = 1; k < n; k++) {
    widen_float(dt, (const char *)srcs[k] + at * es, m, x);
    if (op == TSR_REDUCE_MAX) {
      /* A NaN operand wins, as torch.max does. */
      for (size_t i = 0; i < m; i++)
        if (x[i] != x[i] || x[i] > acc[i]) acc[i] = x[i];
    } else {
      for (size_t i = 0; i < m; i++) acc[i] += x[i];
    }
  }
  if (op == TSR_REDUCE_AVG)
    for (size_t i = 0; i < m; i++) acc[i] /= (float)n;
  narrow_float(dt, acc, m, (char *)dst + at * es);
}

/* Unsigned addition keeps overflow defined (wrap-around); AVG truncates toward zero. */
static void reduce_block_int(int n, const void *const *srcs, size_t at, size_t m, tsr_dtype dt,
                             tsr_reduce_op op, void *dst) {
  int64_t acc[TSR_MPI_BLOCK], x[TSR_MPI_BLOCK];
  size_t es = tsr_dtype_size(dt);
  widen_int(dt, (const char *)srcs[0] + at * es, m, acc);
  for (int k = 1; k < n; k++) {
    widen_int(dt, (const char *)srcs[k] + at * es, m, x);
    for (size_t i = 0; i < m; i++)
      acc[i] = op == TSR_REDUCE_MAX ? (x[i] > acc[i] ? x[i] : acc[i])
                                    : (int64_t)((uint64_t)acc[i] + (uint64_t)x[i]);
  }
  if (op == TSR_REDUCE_AVG)
    for (size_t i = 0; i < m; i++) acc[i] /= n;
  narrow_int(dt, acc, m, (char *)dst + at * es);
}

void tsr_mpi_reduce(int n, const void *const *srcs, size_t len, tsr_dtype dt, tsr_reduce_op op,
                    void *dst) {
  bool integer = dt == TSR_I32 || dt == TSR_I64;
  /* Each block reads every source before it writes dst, which is what makes aliasing safe. */
  for (size_t at = 0; at < len; at += TSR_MPI_BLOCK) {
    size_t m = len - at < TSR_MPI_BLOCK ? len - at : TSR_MPI_BLOCK;
    if (integer)
      reduce_block_int(n, srcs, at, m, dt, op, dst);
    else
      reduce_block_float(n, srcs, at, m, dt, op, dst);
  }
}

/* ---- Helpers ---- */

#define DATA_STALL "stopped in the middle of the collective (died or hung?)"

static size_t chunk_off(size_t count, int n, int i) {
  return (size_t)tsr_chunk_start((int64_t)count, n, i);
}
static size_t chunk_len(size_t count, int n, int i) {
  return (size_t)tsr_chunk_size((int64_t)count, n, i);
}

/* Scratch for one `bytes` piece from every peer, and the array of n reduction sources, in one
 * allocation made before the arrival. */
static tsr_status recv_slots(tsr_group_t *g, size_t bytes, char **slots, const void ***srcs) {
  size_t ptrs = (size_t)g->n * sizeof(void *);
  size_t head = (ptrs + 63) & ~(size_t)63;
  void *s = NULL;
  TSR_CHECK(tsr_mpi_scratch(g, head + bytes * (size_t)(g->n - 1), &s));
  *srcs = s;
  *slots = (char *)s + head;
  return TSR_OK;
}

/* The slot that holds member j's piece (this member has none). */
static char *slot_of(tsr_group_t *g, char *slots, size_t bytes, int j) {
  return slots + bytes * (size_t)(j < g->index ? j : j - 1);
}

/* Posts "send piece j to member j, receive this member's piece from member j into its slot" for
 * every peer j: the first phase of all_reduce and all of reduce_scatter. */
static tsr_status exchange_pieces(tsr_group_t *g, const char *send, const size_t *offs,
                                  const size_t *lens, size_t es, char *slots) {
  mpi_group *mg = tsr_mpi_group(g);
  size_t mine = lens[g->index] * es;
  for (int j = 0; j < g->n; j++) {
    if (j == g->index) continue;
    TSR_CHECK(tsr_mpi_post(g, &mg->x, true, j, (void *)(send + offs[j] * es), lens[j] * es,
                           TSR_MPI_TAG_DATA_A));
    TSR_CHECK(
        tsr_mpi_post(g, &mg->x, false, j, slot_of(g, slots, mine, j), mine, TSR_MPI_TAG_DATA_A));
  }
  return tsr_mpi_wait(g, &mg->x, DATA_STALL);
}

/* Reduces this member's piece (own data at `own`) with the peers' slots into dst. */
static void reduce_pieces(tsr_group_t *g, const tsr_call *call, const void **srcs, char *slots,
                          const void *own, size_t len, void *dst) {
  size_t bytes = len * tsr_dtype_size(call->dt);
  for (int k = 0; k < g->n; k++) srcs[k] = k == g->index ? own : slot_of(g, slots, bytes, k);
  tsr_mpi_reduce(g->n, srcs, len, call->dt, call->op, dst);
}

/* Offsets and lengths of every member's chunk, in a small array on the caller's stack when n is
 * small. */
#define TSR_MPI_STACK_MEMBERS 64

/* ---- Collectives ---- */

tsr_status tsr_mpi_all_reduce(tsr_group_t *g, const tsr_call *call) {
  mpi_group *mg = tsr_mpi_group(g);
  int n = g->n, me = g->index;
  size_t es = tsr_dtype_size(call->dt), count = call->count;
  size_t stack_offs[TSR_MPI_STACK_MEMBERS], stack_lens[TSR_MPI_STACK_MEMBERS];
  size_t *offs = stack_offs, *lens = stack_lens;
  char *slots = NULL;
  const void **srcs = NULL;
  tsr_status st = TSR_OK;
  if (n > TSR_MPI_STACK_MEMBERS) {
    offs = malloc(2 * (size_t)n * sizeof *offs);
    if (!offs) return TSR_ERROR(TSR_ENOMEM, "all_reduce on group '%s': out of memory", g->label);
    lens = offs + n;
  }
  for (int j = 0; j < n; j++) {
    offs[j] = chunk_off(count, n, j);
    lens[j] = chunk_len(count, n, j);
  }
  TSR_CHECK_GOTO(recv_slots(g, lens[me] * es, &slots, &srcs), st);
  TSR_CHECK_GOTO(tsr_mpi_arrive(g, call), st);
  /* Reduce-scatter: member i reduces chunk i. In place is safe: chunk j of send has gone to
   * member j before anything is written to recv. */
  TSR_CHECK_GOTO(exchange_pieces(g, call->send, offs, lens, es, slots), st);
  char *mine = (char *)call->recv + offs[me] * es;
  reduce_pieces(g, call, srcs, slots, (const char *)call->send + offs[me] * es, lens[me], mine);
  /* All-gather of the reduced chunks. */
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    TSR_CHECK_GOTO(tsr_mpi_post(g, &mg->x, true, j, mine, lens[me] * es, TSR_MPI_TAG_DATA_B), st);
    TSR_CHECK_GOTO(tsr_mpi_post(g, &mg->x, false, j, (char *)call->recv + offs[j] * es,
                                lens[j] * es, TSR_MPI_TAG_DATA_B),
                   st);
  }
  st = tsr_mpi_wait(g, &mg->x, DATA_STALL);
cleanup:
  if (offs != stack_offs) free(offs);
  return st;
}

tsr_status tsr_mpi_reduce_scatter(tsr_group_t *g, const tsr_call *call) {
  int n = g->n, me = g->index;
  size_t es = tsr_dtype_size(call->dt);
  size_t stack_offs[TSR_MPI_STACK_MEMBERS], *offs = stack_offs;
  char *slots = NULL;
  const void **srcs = NULL;
  tsr_status st = TSR_OK;
  if (n > TSR_MPI_STACK_MEMBERS) {
    offs = malloc((size_t)n * sizeof *offs);
    if (!offs)
      return TSR_ERROR(TSR_ENOMEM, "reduce_scatter on group '%s': out of memory", g->label);
  }
  for (int j = 0; j < n; j++) offs[j] = j ? offs[j - 1] + call->counts[j - 1] : 0;
  TSR_CHECK_GOTO(recv_slots(g, call->counts[me] * es, &slots, &srcs), st);
  TSR_CHECK_GOTO(tsr_mpi_arrive(g, call), st);
  TSR_CHECK_GOTO(exchange_pieces(g, call->send, offs, call->counts, es, slots), st);
  /* In place (recv at this member's chunk of send) reads and writes the same block at once. */
  reduce_pieces(g, call, srcs, slots, (const char *)call->send + offs[me] * es, call->counts[me],
                call->recv);
cleanup:
  if (offs != stack_offs) free(offs);
  return st;
}

tsr_status tsr_mpi_all_gather(tsr_group_t *g, const tsr_call *call) {
  mpi_group *mg = tsr_mpi_group(g);
  int n = g->n, me = g->index;
  size_t es = tsr_dtype_size(call->dt), off = 0, mine = 0;
  for (int j = 0; j < me; j++) mine += call->counts[j];
  TSR_CHECK(tsr_mpi_arrive(g, call));
  char *own = (char *)call->recv + mine * es;
  /* In place is the own contribution already at its offset in recv. */
  if (call->counts[me] && call->send != own) memcpy(own, call->send, call->counts[me] * es);
  for (int j = 0; j < n; j++) {
    if (j != me) {
      TSR_CHECK(tsr_mpi_post(g, &mg->x, true, j, (void *)call->send, call->counts[me] * es,
                             TSR_MPI_TAG_DATA_A));
      TSR_CHECK(tsr_mpi_post(g, &mg->x, false, j, (char *)call->recv + off * es,
                             call->counts[j] * es, TSR_MPI_TAG_DATA_A));
    }
    off += call->counts[j];
  }
  return tsr_mpi_wait(g, &mg->x, DATA_STALL);
}

tsr_status tsr_mpi_all_to_all(tsr_group_t *g, const tsr_call *call) {
  mpi_group *mg = tsr_mpi_group(g);
  int n = g->n, me = g->index;
  size_t es = tsr_dtype_size(call->dt), soff = 0, roff = 0;
  TSR_CHECK(tsr_mpi_arrive(g, call));
  for (int j = 0; j < n; j++) {
    const char *s = (const char *)call->send + soff * es;
    char *r = (char *)call->recv + roff * es;
    if (j == me) {
      /* The arrival check proved counts[me] == recv_counts[me]. */
      if (call->counts[j]) memcpy(r, s, call->counts[j] * es);
    } else {
      TSR_CHECK(
          tsr_mpi_post(g, &mg->x, true, j, (void *)s, call->counts[j] * es, TSR_MPI_TAG_DATA_A));
      TSR_CHECK(
          tsr_mpi_post(g, &mg->x, false, j, r, call->recv_counts[j] * es, TSR_MPI_TAG_DATA_A));
    }
    soff += call->counts[j];
    roff += call->recv_counts[j];
  }
  return tsr_mpi_wait(g, &mg->x, DATA_STALL);
}

tsr_status tsr_mpi_broadcast(tsr_group_t *g, const tsr_call *call) {
  mpi_group *mg = tsr_mpi_group(g);
  size_t bytes = call->count * tsr_dtype_size(call->dt);
  TSR_CHECK(tsr_mpi_arrive(g, call));
  if (g->index == call->root) {
    for (int j = 0; j < g->n; j++)
      if (j != call->root)
        TSR_CHECK(tsr_mpi_post(g, &mg->x, true, j, call->recv, bytes, TSR_MPI_TAG_DATA_A));
  } else {
    TSR_CHECK(tsr_mpi_post(g, &mg->x, false, call->root, call->recv, bytes, TSR_MPI_TAG_DATA_A));
  }
  return tsr_mpi_wait(g, &mg->x, DATA_STALL);
}

/* The arrival exchange is itself the barrier: it completes only once every member is in it. */
tsr_status tsr_mpi_barrier(tsr_group_t *g, const tsr_call *call) {
  return tsr_mpi_arrive(g, call);
}
