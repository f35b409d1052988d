/* The collectives of the `nccl` backend.
 *
 * Each call starts with the arrival (tsr_nccl_arrive): the mpi backend's exchange of call
 * descriptors, which proves every member is in the same call before anything moves and tells
 * every member whether the call is on host or device memory. Host calls then run the mpi
 * backend's implementation unchanged (it arrives once more: host calls are small scalars, and a
 * second round trip keeps that code as it is). Device calls are queued on this rank's stream
 * through NCCL and waited for with a timeout (tsr_nccl_finish).
 *
 * Per-member counts: equal counts take NCCL's own collective; uneven ones are one NCCL call per
 * member inside a group (broadcast for all_gather, reduce for reduce_scatter), which moves exactly
 * the data of the direct algorithm with no padding or extra copy. Every member knows every count
 * from the matched descriptors, so all of them skip the same empty parts. */
#include <inttypes.h>
#include <stdio.h>

#include "nccl_backend.h"

static size_t sum_counts(int n, const size_t *v) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return s;
}

static bool equal_counts(const tsr_group_t *g, const size_t *v) {
  if (tsr_nccl_proc(g)->force_grouped) return false;
  for (int i = 1; i < g->n; i++)
    if (v[i] != v[0]) return false;
  return true;
}

/* "all_reduce(f32, 1024, sum) on group 'dp' [0,1] (seq 7)": the call being run, for messages. */
static void describe(tsr_group_t *g, nccl_run *run) {
  mpi_group *mg = tsr_nccl_handle(g)->sh->mg;
  char what[256], rs[128];
  tsr_call_format(&mg->cur, g->n, what, sizeof what);
  tsr_ranks_format(g->n, g->ranks, rs, sizeof rs);
  snprintf(run->what, sizeof run->what, "%s on group '%s' %s (seq %" PRIu64 ")", what, g->label, rs,
           mg->cur_seq);
}

static ncclComm_t comm_of(const tsr_group_t *g) {
  return tsr_nccl_handle(g)->sh->comm;
}

tsr_status tsr_nccl_all_reduce(tsr_group_t *g, const tsr_call *call) {
  bool device;
  TSR_CHECK(tsr_nccl_arrive(g, call, &device));
  if (!device) return tsr_mpi_all_reduce(tsr_nccl_handle(g)->inner, call);
  if (!call->count) return TSR_OK;
  nccl_run run;
  describe(g, &run);
  TSR_CHECK(tsr_nccl_begin(g, &run));
  /* In place (send == recv) is NCCL's own in-place all-reduce. */
  ncclResult_t r = ncclAllReduce(call->send, call->recv, call->count, tsr_nccl_dtype(call->dt),
                                 tsr_nccl_op(call->op), comm_of(g), run.stream);
  return tsr_nccl_finish(g, &run, "ncclAllReduce", r);
}

tsr_status tsr_nccl_all_gather(tsr_group_t *g, const tsr_call *call) {
  bool device;
  TSR_CHECK(tsr_nccl_arrive(g, call, &device));
  if (!device) return tsr_mpi_all_gather(tsr_nccl_handle(g)->inner, call);
  const size_t *c = call->counts;
  size_t es = tsr_dtype_size(call->dt);
  if (!sum_counts(g->n, c)) return TSR_OK;
  ncclDataType_t dt = tsr_nccl_dtype(call->dt);
  nccl_run run;
  describe(g, &run);
  TSR_CHECK(tsr_nccl_begin(g, &run));
  if (equal_counts(g, c)) {
    /* In place is send at this member's offset in recv, which NCCL supports as is. */
    ncclResult_t r = ncclAllGather(call->send, call->recv, c[0], dt, comm_of(g), run.stream);
    return tsr_nccl_finish(g, &run, "ncclAllGather", r);
  }
  /* Member j broadcasts its part straight to its place in every member's recv. */
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess) {
    size_t off = 0;
    for (int j = 0; j < g->n && r == ncclSuccess; off += c[j], j++) {
      if (!c[j]) continue;
      char *dst = (char *)call->recv + off * es;
      const void *src = j == g->index ? call->send : dst; /* only read on the root */
      r = ncclBroadcast(src, dst, c[j], dt, j, comm_of(g), run.stream);
    }
    r = tsr_nccl_group_end(r);
  }
  return tsr_nccl_finish(g, &run, "ncclBroadcast", r);
}

tsr_status tsr_nccl_reduce_scatter(tsr_group_t *g, const tsr_call *call) {
  bool device;
  TSR_CHECK(tsr_nccl_arrive(g, call, &device));
  if (!device) return tsr_mpi_reduce_scatter(tsr_nccl_handle(g)->inner, call);
  const size_t *c = call->counts;
  size_t es = tsr_dtype_size(call->dt);
  if (!sum_counts(g->n, c)) return TSR_OK;
  ncclDataType_t dt = tsr_nccl_dtype(call->dt);
  ncclRedOp_t op = tsr_nccl_op(call->op);
  nccl_run run;
  describe(g, &run);
  TSR_CHECK(tsr_nccl_begin(g, &run));
  if (equal_counts(g, c)) {
    /* In place (recv at this member's chunk of send) is NCCL's in-place layout. */
    ncclResult_t r =
        ncclReduceScatter(call->send, call->recv, c[0], dt, op, comm_of(g), run.stream);
    return tsr_nccl_finish(g, &run, "ncclReduceScatter", r);
  }
  /* Chunk j is reduced onto member j: the bytes of the direct algorithm, no padding. */
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess) {
    size_t off = 0;
    for (int j = 0; j < g->n && r == ncclSuccess; off += c[j], j++) {
      if (!c[j]) continue;
      const char *src = (const char *)call->send + off * es;
      void *dst = j == g->index ? call->recv : (void *)src; /* only written on the root */
      r = ncclReduce(src, dst, c[j], dt, op, j, comm_of(g), run.stream);
    }
    r = tsr_nccl_group_end(r);
  }
  return tsr_nccl_finish(g, &run, "ncclReduce", r);
}

tsr_status tsr_nccl_all_to_all(tsr_group_t *g, const tsr_call *call) {
  bool device;
  TSR_CHECK(tsr_nccl_arrive(g, call, &device));
  if (!device) return tsr_mpi_all_to_all(tsr_nccl_handle(g)->inner, call);
  const size_t *sc = call->counts, *rc = call->recv_counts;
  size_t es = tsr_dtype_size(call->dt);
  if (!sum_counts(g->n, sc) && !sum_counts(g->n, rc)) return TSR_OK;
  ncclDataType_t dt = tsr_nccl_dtype(call->dt);
  nccl_run run;
  describe(g, &run);
  TSR_CHECK(tsr_nccl_begin(g, &run));
  size_t soff = 0, roff = 0;
  for (int j = 0; j < g->index; j++) {
    soff += sc[j];
    roff += rc[j];
  }
  /* This member's own part is a device copy on the same stream (the arrival proved
   * sc[me] == rc[me]). */
  if (sc[g->index]) {
    cudaError_t e =
        cudaMemcpyAsync((char *)call->recv + roff * es, (const char *)call->send + soff * es,
                        sc[g->index] * es, cudaMemcpyDeviceToDevice, run.stream);
    if (e != cudaSuccess) {
      char msg[TSR_NCCL_MSG_LEN];
      snprintf(msg, sizeof msg, "%s: cudaMemcpyAsync of this member's own part failed: %s (%s)",
               run.what, cudaGetErrorString(e), cudaGetErrorName(e));
      return TSR_NCCL_FAIL(g, TSR_ECOMM, msg);
    }
  }
  ncclResult_t r = ncclGroupStart();
  if (r == ncclSuccess) {
    soff = roff = 0;
    for (int j = 0; j < g->n && r == ncclSuccess; soff += sc[j], roff += rc[j], j++) {
      if (j == g->index) continue;
      if (sc[j])
        r = ncclSend((const char *)call->send + soff * es, sc[j], dt, j, comm_of(g), run.stream);
      if (r == ncclSuccess && rc[j])
        r = ncclRecv((char *)call->recv + roff * es, rc[j], dt, j, comm_of(g), run.stream);
    }
    r = tsr_nccl_group_end(r);
  }
  return tsr_nccl_finish(g, &run, "ncclSend/ncclRecv", r);
}

tsr_status tsr_nccl_broadcast(tsr_group_t *g, const tsr_call *call) {
  bool device;
  TSR_CHECK(tsr_nccl_arrive(g, call, &device));
  if (!device) return tsr_mpi_broadcast(tsr_nccl_handle(g)->inner, call);
  if (!call->count) return TSR_OK;
  nccl_run run;
  describe(g, &run);
  TSR_CHECK(tsr_nccl_begin(g, &run));
  ncclResult_t r = ncclBroadcast(call->recv, call->recv, call->count, tsr_nccl_dtype(call->dt),
                                 call->root, comm_of(g), run.stream);
  return tsr_nccl_finish(g, &run, "ncclBroadcast", r);
}

/* No data: the mpi backend's arrival is the barrier. Device work is not waited for; every device
 * call of this backend has completed before it returns anyway. */
tsr_status tsr_nccl_barrier(tsr_group_t *g, const tsr_call *call) {
  return tsr_mpi_barrier(tsr_nccl_handle(g)->inner, call);
}
