/* Point to point for the `nccl` backend: send, recv and sendrecv between members of a group.
 *
 * Host buffers (and empty transfers) go through the mpi backend's send/recv/sendrecv unchanged.
 * Device buffers use the same rendezvous on the same tags, so both kinds stay in one ordered
 * stream per pair: the sender announces count and a word holding the dtype and the memory kind,
 * the receiver answers with its verdict, and only a match moves the payload, through
 * ncclSend/ncclRecv. For host or empty buffers that word is exactly the mpi backend's (the dtype
 * alone), so a device-side peer and an mpi-side peer can tell each other apart: a transfer whose
 * two sides disagree on host or device memory is TSR_ECOMM on both, as a count mismatch is, and
 * moves nothing. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "nccl_backend.h"

typedef enum p2p_phase { P2P_HANDSHAKE, P2P_ACKING, P2P_READY, P2P_DONE } p2p_phase;

/* One direction of a device-path transfer; `slot` picks its words and requests in the group. */
typedef struct dev_op {
  bool send;
  int peer, slot;
  void *buf;
  size_t count;
  tsr_dtype dt;
  nccl_mem mem; /* DEVICE: payload by NCCL; NONE (empty): the mpi backend's empty message */
  p2p_phase phase;
  double deadline;
  tsr_status status; /* of a mismatch found in the handshake, with its message */
  char err[TSR_NCCL_MSG_LEN];
  char what[256]; /* "send of 12 f32 from rank 0 to rank 1 on group 'pp' [0,1]" */
} dev_op;

/* The second header word: the dtype in the low bits (all the mpi backend sends), the memory kind
 * above them, 0 for host or empty buffers. */
#define KIND_SHIFT 16

static uint64_t kind_word(tsr_dtype dt, nccl_mem m) {
  uint64_t code = m == NCCL_MEM_DEVICE ? 1 : m == NCCL_MEM_BAD ? 2 : 0;
  return (uint64_t)dt | code << KIND_SHIFT;
}

static tsr_dtype word_dtype(uint64_t w) {
  return (tsr_dtype)(w & ((1u << KIND_SHIFT) - 1));
}

static nccl_mem word_mem(uint64_t w) {
  uint64_t code = w >> KIND_SHIFT;
  return code == 0 ? NCCL_MEM_HOST : code == 1 ? NCCL_MEM_DEVICE : NCCL_MEM_BAD;
}

/* The message both sides of a mismatched pair report: the mpi backend's, plus each side's memory
 * kind when that is what differs. */
static tsr_status mismatch(tsr_group_t *g, int sender, size_t scount, uint64_t sword, int receiver,
                           size_t rcount, uint64_t rword) {
  char rs[128], sk[96] = "", rk[96] = "";
  nccl_mem sm = word_mem(sword), rm = word_mem(rword);
  if (sm != rm || sm == NCCL_MEM_BAD) {
    /* Code 0 is also what an empty direction of a device call sends. */
    snprintf(sk, sizeof sk, " (%s)",
             scount || sm != NCCL_MEM_HOST ? tsr_nccl_mem_name(sm) : "empty");
    snprintf(rk, sizeof rk, " (%s)",
             rcount || rm != NCCL_MEM_HOST ? tsr_nccl_mem_name(rm) : "empty");
  }
  return tsr_error(TSR_ECOMM,
                   "point-to-point mismatch on group '%s' %s: rank %d sends %zu %s%s to rank %d, "
                   "which receives %zu %s%s",
                   g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs), g->ranks[sender],
                   scount, tsr_dtype_name(word_dtype(sword)), sk, g->ranks[receiver], rcount,
                   tsr_dtype_name(word_dtype(rword)), rk);
}

static void op_init(tsr_group_t *g, dev_op *op, bool send, int peer, int slot, void *buf,
                    size_t count, tsr_dtype dt, nccl_mem call_mem) {
  char rs[128];
  memset(op, 0, sizeof *op);
  op->send = send;
  op->peer = peer;
  op->slot = slot;
  op->buf = buf;
  op->count = count;
  op->dt = dt;
  /* An empty direction of a device call moves nothing: it speaks the host protocol. */
  op->mem = call_mem == NCCL_MEM_BAD ? NCCL_MEM_BAD : count ? NCCL_MEM_DEVICE : NCCL_MEM_NONE;
  int from = g->ranks[send ? g->index : peer], to = g->ranks[send ? peer : g->index];
  snprintf(op->what, sizeof op->what, "%s of %zu %s from rank %d to rank %d on group '%s' %s",
           send ? "send" : "recv", count, tsr_dtype_name(dt), from, to, g->label,
           tsr_ranks_format(g->n, g->ranks, rs, sizeof rs));
}

static tsr_status op_start(tsr_group_t *g, dev_op *op) {
  nccl_handle *h = tsr_nccl_handle(g);
  nccl_shared *sh = h->sh;
  mpi_xfer *x = &sh->px[op->slot];
  op->deadline = MPI_Wtime() + g->comm->timeout_s;
  op->phase = P2P_HANDSHAKE;
  if (!op->send)
    return tsr_mpi_post(h->inner, x, false, op->peer, sh->hdr[op->slot], sizeof sh->hdr[0],
                        TSR_MPI_TAG_P2P_HDR);
  sh->hdr[op->slot][0] = op->count;
  sh->hdr[op->slot][1] = kind_word(op->dt, op->mem);
  TSR_CHECK(tsr_mpi_post(h->inner, x, true, op->peer, sh->hdr[op->slot], sizeof sh->hdr[0],
                         TSR_MPI_TAG_P2P_HDR));
  return tsr_mpi_post(h->inner, x, false, op->peer, sh->ack[op->slot], sizeof sh->ack[0],
                      TSR_MPI_TAG_P2P_ACK);
}

/* Moves op to its next phase once its requests are complete. */
static tsr_status op_advance(tsr_group_t *g, dev_op *op) {
  nccl_handle *h = tsr_nccl_handle(g);
  nccl_shared *sh = h->sh;
  uint64_t mine = kind_word(op->dt, op->mem);
  op->deadline = MPI_Wtime() + g->comm->timeout_s;
  if (op->phase == P2P_ACKING) {
    op->phase = op->status == TSR_OK ? P2P_READY : P2P_DONE;
    return TSR_OK;
  }
  if (op->send) {
    const uint64_t *ack = sh->ack[op->slot];
    op->phase = P2P_READY;
    if (!ack[0]) {
      op->status = mismatch(g, g->index, op->count, mine, op->peer, (size_t)ack[1], ack[2]);
      snprintf(op->err, sizeof op->err, "%s", tsr_last_error());
      op->phase = P2P_DONE;
    }
    return TSR_OK;
  }
  const uint64_t *hdr = sh->hdr[op->slot];
  uint64_t *ack = sh->ack[op->slot];
  bool ok = hdr[0] == op->count && hdr[1] == mine && op->mem != NCCL_MEM_BAD;
  ack[0] = ok;
  ack[1] = op->count;
  ack[2] = mine;
  if (!ok) {
    op->status = mismatch(g, op->peer, (size_t)hdr[0], hdr[1], g->index, op->count, mine);
    snprintf(op->err, sizeof op->err, "%s", tsr_last_error());
  }
  op->phase = P2P_ACKING;
  return tsr_mpi_post(h->inner, &sh->px[op->slot], true, op->peer, ack, sizeof sh->ack[0],
                      TSR_MPI_TAG_P2P_ACK);
}

static const char *op_stall(const dev_op *op) {
  if (op->phase != P2P_HANDSHAKE) return "stopped in the middle of the transfer (died or hung?)";
  return op->send ? "never posted the matching recv" : "never sent";
}

/* A timeout or MPI error: every op's requests are abandoned and the group is broken. */
static tsr_status ops_fail(tsr_group_t *g, dev_op *ops, int nops, const dev_op *bad, int rc) {
  nccl_shared *sh = tsr_nccl_handle(g)->sh;
  char msg[TSR_NCCL_MSG_LEN], es[MPI_MAX_ERROR_STRING];
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
  for (int i = 0; i < nops; i++) tsr_mpi_xfer_abandon(&sh->px[ops[i].slot]);
  return TSR_NCCL_FAIL(g, rc == MPI_SUCCESS ? TSR_ETIMEDOUT : TSR_ECOMM, msg);
}

/* Posting a request failed (the message is the last error): the group is broken with it. */
static tsr_status post_failed(tsr_group_t *g, dev_op *ops, int nops) {
  nccl_shared *sh = tsr_nccl_handle(g)->sh;
  char msg[TSR_NCCL_MSG_LEN];
  snprintf(msg, sizeof msg, "%s", tsr_last_error());
  for (int i = 0; i < nops; i++) tsr_mpi_xfer_abandon(&sh->px[ops[i].slot]);
  return tsr_nccl_fail_at(g, TSR_ECOMM, msg, __FILE__, __LINE__);
}

/* Drives the ops' requests: the handshake (until every op is READY or DONE), or the payload
 * messages (until none is pending). */
static tsr_status ops_poll(tsr_group_t *g, dev_op *ops, int nops, bool handshake) {
  nccl_shared *sh = tsr_nccl_handle(g)->sh;
  int spins = 0;
  for (;;) {
    bool all_done = true, moved = false;
    for (int i = 0; i < nops; i++) {
      dev_op *op = &ops[i];
      mpi_xfer *x = &sh->px[op->slot];
      bool pending =
          handshake ? op->phase == P2P_HANDSHAKE || op->phase == P2P_ACKING : x->active > 0;
      if (!pending) continue;
      bool progress;
      int rc = tsr_mpi_xfer_test(x, &progress);
      if (rc != MPI_SUCCESS) return ops_fail(g, ops, nops, op, rc);
      moved = moved || progress;
      if (x->active == 0) {
        x->n = 0;
        if (handshake && op_advance(g, op) != TSR_OK) return post_failed(g, ops, nops);
        moved = true;
      } else if (MPI_Wtime() > op->deadline) {
        return ops_fail(g, ops, nops, op, MPI_SUCCESS);
      }
      all_done = false;
    }
    if (all_done) return TSR_OK;
    if (moved)
      spins = 0;
    else
      tsr_nccl_backoff(&spins);
  }
}

/* The rendezvous of every op, then the payloads of those that matched: NCCL for device ones, the
 * mpi backend's empty message for empty ones. Both directions of a sendrecv progress together,
 * so a ring cannot deadlock; a mismatch on one still lets the other finish. */
static tsr_status ops_run(tsr_group_t *g, dev_op *ops, int nops, const char *what) {
  nccl_handle *h = tsr_nccl_handle(g);
  nccl_shared *sh = h->sh;
  if (sh->mg->broken) return tsr_mpi_broken_error(h->inner, ops[0].what);
  for (int i = 0; i < nops; i++)
    if (op_start(g, &ops[i]) != TSR_OK) return post_failed(g, ops, i + 1);
  TSR_CHECK(ops_poll(g, ops, nops, true));
  bool device = false;
  for (int i = 0; i < nops; i++) {
    dev_op *op = &ops[i];
    if (op->phase != P2P_READY) continue;
    if (op->mem == NCCL_MEM_DEVICE) {
      device = true;
    } else if (tsr_mpi_post(h->inner, &sh->px[op->slot], op->send, op->peer, sh->hdr[op->slot], 0,
                            TSR_MPI_TAG_P2P_DATA) != TSR_OK) {
      return post_failed(g, ops, nops);
    }
  }
  if (device) {
    nccl_run run;
    snprintf(run.what, sizeof run.what, "%s", what);
    tsr_status st = tsr_nccl_begin(g, &run);
    ncclResult_t r = st == TSR_OK ? ncclGroupStart() : ncclSuccess;
    if (st == TSR_OK && r == ncclSuccess) {
      for (int i = 0; i < nops && r == ncclSuccess; i++) {
        dev_op *op = &ops[i];
        if (op->phase != P2P_READY || op->mem != NCCL_MEM_DEVICE) continue;
        ncclDataType_t dt = tsr_nccl_dtype(op->dt);
        r = op->send ? ncclSend(op->buf, op->count, dt, op->peer, sh->comm, run.stream)
                     : ncclRecv(op->buf, op->count, dt, op->peer, sh->comm, run.stream);
      }
      r = tsr_nccl_group_end(r);
    }
    if (st == TSR_OK) st = tsr_nccl_finish(g, &run, "ncclSend/ncclRecv", r);
    if (st != TSR_OK) {
      /* The group is broken already; the empty messages are dropped with it. */
      for (int i = 0; i < nops; i++) tsr_mpi_xfer_abandon(&sh->px[ops[i].slot]);
      return st;
    }
  }
  for (int i = 0; i < nops; i++) ops[i].deadline = MPI_Wtime() + g->comm->timeout_s;
  TSR_CHECK(ops_poll(g, ops, nops, false));
  /* Each op kept its own message: the other direction may have set the last error since. */
  for (int i = 0; i < nops; i++)
    if (ops[i].status != TSR_OK) return tsr_error(ops[i].status, "%s", ops[i].err);
  return TSR_OK;
}

/* After a host-path transfer failed with a mismatch against a device-path peer, the mpi backend's
 * message shows the peer's raw header word as a dtype; this says what differs instead. */
static tsr_status host_result(tsr_group_t *g, tsr_status st, int send_slot, int send_peer,
                              size_t send_count, int recv_slot, int recv_peer, size_t recv_count,
                              tsr_dtype dt) {
  mpi_group *mg = tsr_nccl_handle(g)->sh->mg;
  if (st != TSR_ECOMM || mg->broken) return st;
  uint64_t mine = kind_word(dt, NCCL_MEM_HOST);
  if (send_slot >= 0) {
    const uint64_t *ack = mg->p2p_ack[send_slot];
    if (!ack[0] && word_mem(ack[2]) != NCCL_MEM_HOST)
      return mismatch(g, g->index, send_count, mine, send_peer, (size_t)ack[1], ack[2]);
  }
  if (recv_slot >= 0) {
    const uint64_t *hdr = mg->p2p_hdr[recv_slot];
    if (word_mem(hdr[1]) != NCCL_MEM_HOST)
      return mismatch(g, recv_peer, (size_t)hdr[0], hdr[1], g->index, recv_count, mine);
  }
  return st;
}

/* Adds what only this member knows to the mismatch of a call it made with unusable buffers. */
static tsr_status bad_result(tsr_status st, nccl_mem m, const char *detail) {
  if (st != TSR_ECOMM || m != NCCL_MEM_BAD) return st;
  char msg[TSR_NCCL_MSG_LEN];
  snprintf(msg, sizeof msg, "%s", tsr_last_error()); /* the format must not read what it writes */
  return tsr_error(st, "%s (on this rank: %s)", msg, detail);
}

tsr_status tsr_nccl_send(tsr_group_t *g, int peer, const void *buf, size_t count, tsr_dtype dt) {
  char detail[160];
  nccl_mem m =
      tsr_nccl_mem_of(tsr_nccl_proc(g), buf, count * tsr_dtype_size(dt), detail, sizeof detail);
  if (m != NCCL_MEM_DEVICE && m != NCCL_MEM_BAD) {
    tsr_status st = tsr_mpi_send(tsr_nccl_handle(g)->inner, peer, buf, count, dt);
    return host_result(g, st, 0, peer, count, -1, 0, 0, dt);
  }
  dev_op op;
  op_init(g, &op, true, peer, 0, (void *)buf, count, dt, m);
  return bad_result(ops_run(g, &op, 1, op.what), m, detail);
}

tsr_status tsr_nccl_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt) {
  char detail[160];
  nccl_mem m =
      tsr_nccl_mem_of(tsr_nccl_proc(g), buf, count * tsr_dtype_size(dt), detail, sizeof detail);
  if (m != NCCL_MEM_DEVICE && m != NCCL_MEM_BAD) {
    tsr_status st = tsr_mpi_recv(tsr_nccl_handle(g)->inner, peer, buf, count, dt);
    return host_result(g, st, -1, 0, 0, 0, peer, count, dt);
  }
  dev_op op;
  op_init(g, &op, false, peer, 0, buf, count, dt, m);
  return bad_result(ops_run(g, &op, 1, op.what), m, detail);
}

tsr_status tsr_nccl_sendrecv(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                             int recv_peer, void *recv, size_t recv_count, tsr_dtype dt) {
  char detail[300], rs[128], what[384];
  size_t es = tsr_dtype_size(dt);
  nccl_mem m = tsr_nccl_buffers_mem(tsr_nccl_proc(g), send, send_count * es, recv, recv_count * es,
                                    detail, sizeof detail);
  if (m != NCCL_MEM_DEVICE && m != NCCL_MEM_BAD) {
    tsr_status st = tsr_mpi_sendrecv(tsr_nccl_handle(g)->inner, send_peer, send, send_count,
                                     recv_peer, recv, recv_count, dt);
    return host_result(g, st, 0, send_peer, send_count, 1, recv_peer, recv_count, dt);
  }
  dev_op ops[2];
  op_init(g, &ops[0], true, send_peer, 0, (void *)send, send_count, dt, m);
  op_init(g, &ops[1], false, recv_peer, 1, recv, recv_count, dt, m);
  snprintf(what, sizeof what,
           "sendrecv on group '%s' %s (send of %zu %s to rank %d, recv of %zu %s from rank %d)",
           g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs), send_count,
           tsr_dtype_name(dt), g->ranks[send_peer], recv_count, tsr_dtype_name(dt),
           g->ranks[recv_peer]);
  return bad_result(ops_run(g, ops, 2, what), m, detail);
}
