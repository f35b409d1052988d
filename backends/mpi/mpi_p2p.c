/* Point to point for the `mpi` backend: send, recv and sendrecv between members of a group.
 *
 * Each transfer is a rendezvous: the sender announces count and dtype, the receiver answers with
 * its verdict, and only a match moves the payload. That costs one round trip, which pipeline and
 * ring traffic (large tensors) does not notice, and buys what comm.h promises: a count or dtype
 * mismatch is TSR_ECOMM on both sides, a missing peer is a timeout naming it, and the pair stays
 * in step after a mismatch because no payload was sent. */
#include <stdio.h>
#include <string.h>

#include "mpi_backend.h"

typedef enum p2p_phase { P2P_HANDSHAKE, P2P_DATA, P2P_FAILING, P2P_DONE } p2p_phase;

/* One direction of a transfer. `slot` picks the header and ack words in the group. */
typedef struct p2p_op {
  bool send;
  int peer, slot;
  void *buf;
  size_t count;
  tsr_dtype dt;
  p2p_phase phase;
  double deadline;
  tsr_status status; /* of a mismatch found in the handshake, with its message */
  char err[TSR_MPI_MSG_LEN];
  char what[256]; /* "send of 12 f32 from rank 0 to rank 1 on group 'pp' [0,1]" */
} p2p_op;

static void op_init(tsr_group_t *g, p2p_op *op, bool send, int peer, int slot, void *buf,
                    size_t count, tsr_dtype dt) {
  char rs[128];
  memset(op, 0, sizeof *op);
  op->send = send;
  op->peer = peer;
  op->slot = slot;
  op->buf = buf;
  op->count = count;
  op->dt = dt;
  int from = g->ranks[send ? g->index : peer], to = g->ranks[send ? peer : g->index];
  snprintf(op->what, sizeof op->what, "%s of %zu %s from rank %d to rank %d on group '%s' %s",
           send ? "send" : "recv", count, tsr_dtype_name(dt), from, to, g->label,
           tsr_ranks_format(g->n, g->ranks, rs, sizeof rs));
}

static tsr_status op_start(tsr_group_t *g, p2p_op *op) {
  mpi_group *mg = tsr_mpi_group(g);
  mpi_xfer *x = &mg->px[op->slot];
  op->deadline = MPI_Wtime() + g->comm->timeout_s;
  op->phase = P2P_HANDSHAKE;
  if (!op->send)
    return tsr_mpi_post(g, x, false, op->peer, mg->p2p_hdr[op->slot], sizeof mg->p2p_hdr[0],
                        TSR_MPI_TAG_P2P_HDR);
  mg->p2p_hdr[op->slot][0] = op->count;
  mg->p2p_hdr[op->slot][1] = (uint64_t)op->dt;
  TSR_CHECK(tsr_mpi_post(g, x, true, op->peer, mg->p2p_hdr[op->slot], sizeof mg->p2p_hdr[0],
                         TSR_MPI_TAG_P2P_HDR));
  return tsr_mpi_post(g, x, false, op->peer, mg->p2p_ack[op->slot], sizeof mg->p2p_ack[0],
                      TSR_MPI_TAG_P2P_ACK);
}

/* The message both sides of a mismatched pair report. */
static tsr_status mismatch(tsr_group_t *g, int sender, size_t scount, tsr_dtype sdt, int receiver,
                           size_t rcount, tsr_dtype rdt) {
  char rs[128];
  return tsr_error(TSR_ECOMM,
                   "point-to-point mismatch on group '%s' %s: rank %d sends %zu %s to rank %d, "
                   "which receives %zu %s",
                   g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs), g->ranks[sender],
                   scount, tsr_dtype_name(sdt), g->ranks[receiver], rcount, tsr_dtype_name(rdt));
}

/* Moves op to its next phase once its requests are complete. */
static tsr_status op_advance(tsr_group_t *g, p2p_op *op) {
  mpi_group *mg = tsr_mpi_group(g);
  mpi_xfer *x = &mg->px[op->slot];
  size_t bytes = op->count * tsr_dtype_size(op->dt);
  op->deadline = MPI_Wtime() + g->comm->timeout_s;
  if (op->phase == P2P_DATA || op->phase == P2P_FAILING) {
    op->phase = P2P_DONE;
    return TSR_OK;
  }
  if (op->send) {
    const uint64_t *ack = mg->p2p_ack[op->slot];
    if (!ack[0]) {
      op->status =
          mismatch(g, g->index, op->count, op->dt, op->peer, (size_t)ack[1], (tsr_dtype)ack[2]);
      snprintf(op->err, sizeof op->err, "%s", tsr_last_error());
      op->phase = P2P_DONE;
      return TSR_OK;
    }
    op->phase = P2P_DATA;
    return tsr_mpi_post(g, x, true, op->peer, op->buf, bytes, TSR_MPI_TAG_P2P_DATA);
  }
  const uint64_t *hdr = mg->p2p_hdr[op->slot];
  uint64_t *ack = mg->p2p_ack[op->slot];
  bool ok = hdr[0] == op->count && hdr[1] == (uint64_t)op->dt;
  ack[0] = ok;
  ack[1] = op->count;
  ack[2] = (uint64_t)op->dt;
  TSR_CHECK(tsr_mpi_post(g, x, true, op->peer, ack, sizeof mg->p2p_ack[0], TSR_MPI_TAG_P2P_ACK));
  if (!ok) {
    op->status =
        mismatch(g, op->peer, (size_t)hdr[0], (tsr_dtype)hdr[1], g->index, op->count, op->dt);
    snprintf(op->err, sizeof op->err, "%s", tsr_last_error());
    op->phase = P2P_FAILING;
    return TSR_OK;
  }
  op->phase = P2P_DATA;
  return tsr_mpi_post(g, x, false, op->peer, op->buf, bytes, TSR_MPI_TAG_P2P_DATA);
}

/* Why op's peer is late, for the timeout message. */
static const char *op_stall(const p2p_op *op) {
  if (op->phase != P2P_HANDSHAKE) return "stopped in the middle of the transfer (died or hung?)";
  return op->send ? "never posted the matching recv" : "never sent";
}

/* A timeout or MPI error: every op's requests are abandoned and the group is broken. */
static tsr_status ops_fail(tsr_group_t *g, p2p_op *ops, int nops, const p2p_op *bad, int rc) {
  mpi_group *mg = tsr_mpi_group(g);
  char msg[TSR_MPI_MSG_LEN], es[MPI_MAX_ERROR_STRING];
  int peer = g->ranks[bad->peer];
  if (rc == MPI_SUCCESS) {
    snprintf(msg, sizeof msg,
             "%s timed out after %g s: rank %d %s; the group is unusable from now on", bad->what,
             g->comm->timeout_s, peer, op_stall(bad));
  } else {
    tsr_mpi_error_string(rc, es, sizeof es);
    snprintf(msg, sizeof msg,
             "%s failed in MPI: %s (did rank %d die?); the group is unusable from now on",
             bad->what, es, peer);
  }
  for (int i = 0; i < nops; i++) tsr_mpi_xfer_abandon(&mg->px[ops[i].slot]);
  return tsr_mpi_break(mg, rc == MPI_SUCCESS ? TSR_ETIMEDOUT : TSR_ECOMM, msg);
}

/* Drives every op to completion. Both directions of a sendrecv progress together, so a ring of
 * sendrecvs cannot deadlock; a mismatch on one still lets the other finish. */
static tsr_status ops_run(tsr_group_t *g, p2p_op *ops, int nops) {
  mpi_group *mg = tsr_mpi_group(g);
  if (mg->broken) return tsr_mpi_broken_error(g, ops[0].what);
  for (int i = 0; i < nops; i++) {
    tsr_status st = op_start(g, &ops[i]);
    if (st != TSR_OK) {
      for (int k = 0; k <= i; k++) tsr_mpi_xfer_abandon(&mg->px[ops[k].slot]);
      return tsr_mpi_break(mg, st, tsr_last_error());
    }
  }
  int spins = 0;
  for (;;) {
    bool all_done = true, moved = false;
    for (int i = 0; i < nops; i++) {
      p2p_op *op = &ops[i];
      if (op->phase == P2P_DONE) continue;
      mpi_xfer *x = &mg->px[op->slot];
      bool progress;
      int rc = tsr_mpi_xfer_test(x, &progress);
      if (rc != MPI_SUCCESS) return ops_fail(g, ops, nops, op, rc);
      moved = moved || progress;
      if (x->active == 0) {
        x->n = 0;
        tsr_status st = op_advance(g, op);
        if (st != TSR_OK) return ops_fail(g, ops, nops, op, MPI_ERR_OTHER);
        moved = true;
      } else if (MPI_Wtime() > op->deadline) {
        return ops_fail(g, ops, nops, op, MPI_SUCCESS);
      }
      all_done = all_done && op->phase == P2P_DONE;
    }
    if (all_done) break;
    if (moved)
      spins = 0;
    else
      tsr_mpi_backoff(&spins);
  }
  /* Each op kept its own message: the other direction may have set the last error since. */
  for (int i = 0; i < nops; i++)
    if (ops[i].status != TSR_OK) return tsr_error(ops[i].status, "%s", ops[i].err);
  return TSR_OK;
}

tsr_status tsr_mpi_send(tsr_group_t *g, int peer, const void *buf, size_t count, tsr_dtype dt) {
  p2p_op op;
  op_init(g, &op, true, peer, 0, (void *)buf, count, dt);
  return ops_run(g, &op, 1);
}

tsr_status tsr_mpi_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt) {
  p2p_op op;
  op_init(g, &op, false, peer, 0, buf, count, dt);
  return ops_run(g, &op, 1);
}

tsr_status tsr_mpi_sendrecv(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                            int recv_peer, void *recv, size_t recv_count, tsr_dtype dt) {
  p2p_op ops[2];
  op_init(g, &ops[0], true, send_peer, 0, (void *)send, send_count, dt);
  op_init(g, &ops[1], false, recv_peer, 1, recv, recv_count, dt);
  return ops_run(g, ops, 2);
}
