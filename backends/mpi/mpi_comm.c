/* The `mpi` backend: start-up, groups, the arrival check, transfers and point to point.
 *
 * MPI's blocking calls cannot time out, so nothing here blocks in MPI: every transfer is a
 * nonblocking send or receive polled with MPI_Testsome against a deadline. Each collective
 * starts with an arrival exchange (every member sends its call descriptor to every other), which
 * is what lets a timeout name the ranks that never arrived and lets every member compare every
 * call with tsr_call_check, exactly as the local backend does. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "mpi_backend.h"

/* Largest piece of one message: MPI counts are int. */
#define TSR_MPI_PIECE ((size_t)1 << 30)

/* ---- Transfers ---- */

static tsr_status xfer_reserve(mpi_xfer *x, int more) {
  if (x->n + more <= x->cap) return TSR_OK;
  int cap = x->cap ? x->cap : 8;
  while (cap < x->n + more) cap *= 2;
  MPI_Request *req = realloc(x->req, (size_t)cap * sizeof *req);
  if (req) x->req = req;
  int *peer = req ? realloc(x->peer, (size_t)cap * sizeof *peer) : NULL;
  if (peer) x->peer = peer;
  int *idx = peer ? realloc(x->idx, (size_t)cap * sizeof *idx) : NULL;
  if (!idx) return TSR_ERROR(TSR_ENOMEM, "mpi backend: out of memory for %d requests", cap);
  x->idx = idx;
  x->cap = cap;
  return TSR_OK;
}

void tsr_mpi_xfer_free(mpi_xfer *x) {
  free(x->req);
  free(x->peer);
  free(x->idx);
  memset(x, 0, sizeof *x);
}

tsr_status tsr_mpi_post_on(MPI_Comm comm, mpi_xfer *x, bool send, int peer, void *buf, size_t bytes,
                           int tag) {
  /* An empty message still goes: the receiver counts on it to complete its phase. */
  int pieces = bytes ? (int)((bytes + TSR_MPI_PIECE - 1) / TSR_MPI_PIECE) : 1;
  TSR_CHECK(xfer_reserve(x, pieces));
  for (int k = 0; k < pieces; k++) {
    size_t off = (size_t)k * TSR_MPI_PIECE;
    int len = (int)(bytes - off < TSR_MPI_PIECE ? bytes - off : TSR_MPI_PIECE);
    char *p = (char *)buf + off;
    MPI_Request *r = &x->req[x->n];
    int rc = send ? MPI_Isend(p, len, MPI_BYTE, peer, tag, comm, r)
                  : MPI_Irecv(p, len, MPI_BYTE, peer, tag, comm, r);
    if (rc != MPI_SUCCESS) {
      char es[MPI_MAX_ERROR_STRING];
      int el = 0;
      MPI_Error_string(rc, es, &el);
      return TSR_ERROR(TSR_ECOMM, "mpi backend: %s of %d bytes with member %d failed: %s",
                       send ? "MPI_Isend" : "MPI_Irecv", len, peer, es);
    }
    x->peer[x->n++] = peer;
    x->active++;
  }
  return TSR_OK;
}

tsr_status tsr_mpi_post(tsr_group_t *g, mpi_xfer *x, bool send, int peer, void *buf, size_t bytes,
                        int tag) {
  return tsr_mpi_post_on(tsr_mpi_group(g)->comm, x, send, peer, buf, bytes, tag);
}

/* Polls once; returns the MPI code and whether anything completed. */
int tsr_mpi_xfer_test(mpi_xfer *x, bool *progress) {
  *progress = false;
  if (x->active == 0) return MPI_SUCCESS;
  int out = 0;
  int rc = MPI_Testsome(x->n, x->req, &out, x->idx, MPI_STATUSES_IGNORE);
  if (rc != MPI_SUCCESS) return rc;
  if (out == MPI_UNDEFINED) {
    x->active = 0;
  } else if (out > 0) {
    x->active -= out;
    *progress = true;
  }
  return MPI_SUCCESS;
}

/* Gives up on the pending requests of x: receives are cancelled so that nothing lands in a buffer
 * the caller is about to reuse; the rest are released to MPI. */
void tsr_mpi_xfer_abandon(mpi_xfer *x) {
  for (int i = 0; i < x->n; i++) {
    if (x->req[i] == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&x->req[i]);
    int done = 0;
    MPI_Test(&x->req[i], &done, MPI_STATUS_IGNORE);
    if (!done) MPI_Request_free(&x->req[i]);
  }
  x->n = x->active = 0;
}

/* "rank 2" or "ranks 1, 3": the global ranks of the members with a pending request. */
void tsr_mpi_xfer_pending(const mpi_xfer *x, int n, const int *ranks, char *buf, size_t len) {
  bool seen[1024] = {false};
  int count = 0;
  for (int i = 0; i < x->n; i++)
    if (x->req[i] != MPI_REQUEST_NULL && x->peer[i] < 1024 && !seen[x->peer[i]]) {
      seen[x->peer[i]] = true;
      count++;
    }
  size_t pos = 0;
  int w = snprintf(buf, len, "%s", count == 1 ? "rank" : "ranks");
  pos = w > 0 ? (size_t)w : 0;
  for (int m = 0, shown = 0; m < n && m < 1024 && pos < len; m++) {
    if (!seen[m]) continue;
    if (shown == 16) {
      snprintf(buf + pos, len - pos, " and %d more", count - shown);
      return;
    }
    w = snprintf(buf + pos, len - pos, "%s %d", shown++ ? "," : "", ranks[m]);
    pos += w > 0 ? (size_t)w : 0;
  }
}

/* Between polls: spin briefly (the answer is usually microseconds away), then yield, then sleep,
 * so that ranks oversubscribing the cores leave them to the peers they wait for. */
void tsr_mpi_backoff(int *spins) {
  int s = ++*spins;
  if (s < 32) return;
  if (s < 2048) {
    sched_yield();
    return;
  }
  struct timespec t = {0, 100000};
  nanosleep(&t, NULL);
}

void tsr_mpi_error_string(int rc, char *buf, size_t len) {
  char es[MPI_MAX_ERROR_STRING];
  int el = 0;
  MPI_Error_string(rc, es, &el);
  snprintf(buf, len, "%s", es);
}

/* Drains x until it is empty, the deadline passes (*timed_out) or MPI fails (the code). */
static int xfer_drain(mpi_xfer *x, double timeout_s, bool *timed_out) {
  double deadline = MPI_Wtime() + timeout_s;
  int spins = 0;
  *timed_out = false;
  while (x->active > 0) {
    bool progress;
    int rc = tsr_mpi_xfer_test(x, &progress);
    if (rc != MPI_SUCCESS) return rc;
    if (progress) {
      spins = 0;
      continue;
    }
    if (x->active > 0 && MPI_Wtime() > deadline) {
      *timed_out = true;
      return MPI_SUCCESS;
    }
    tsr_mpi_backoff(&spins);
  }
  x->n = 0;
  return MPI_SUCCESS;
}

/* ---- Failure ---- */

tsr_status tsr_mpi_break(mpi_group *mg, tsr_status st, const char *why) {
  if (!mg->broken) {
    mg->broken = true;
    mg->broken_status = st;
    snprintf(mg->why, sizeof mg->why, "%s", why);
  }
  return tsr_error(st, "%s", why);
}

tsr_status tsr_mpi_broken_error(const tsr_group_t *g, const char *what) {
  char rs[128];
  return tsr_error(TSR_ECOMM, "%s on group '%s' %s: the group is broken by an earlier failure: %s",
                   what, g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs),
                   tsr_mpi_group(g)->why);
}

tsr_status tsr_mpi_wait(tsr_group_t *g, mpi_xfer *x, const char *verb) {
  mpi_group *mg = tsr_mpi_group(g);
  bool timed_out;
  int rc = xfer_drain(x, g->comm->timeout_s, &timed_out);
  if (rc == MPI_SUCCESS && !timed_out) return TSR_OK;
  char what[256], rs[128], who[256], es[MPI_MAX_ERROR_STRING], msg[TSR_MPI_MSG_LEN];
  tsr_call_format(&mg->cur, g->n, what, sizeof what);
  tsr_ranks_format(g->n, g->ranks, rs, sizeof rs);
  tsr_mpi_xfer_pending(x, g->n, g->ranks, who, sizeof who);
  tsr_status st = TSR_ETIMEDOUT;
  if (timed_out) {
    snprintf(msg, sizeof msg,
             "%s on group '%s' %s (seq %" PRIu64 ") timed out after %g s: %s %s; the group is "
             "unusable from now on",
             what, g->label, rs, mg->cur_seq, g->comm->timeout_s, who, verb);
  } else {
    tsr_mpi_error_string(rc, es, sizeof es);
    snprintf(msg, sizeof msg,
             "%s on group '%s' %s (seq %" PRIu64 ") failed in MPI while waiting for %s: %s (did "
             "that process die?); the group is unusable from now on",
             what, g->label, rs, mg->cur_seq, who, es);
    st = TSR_ECOMM;
  }
  tsr_mpi_xfer_abandon(x);
  return tsr_mpi_break(mg, st, msg);
}

/* ---- Groups ---- */

void tsr_mpi_group_destroy(mpi_group *mg) {
  if (!mg) return;
  /* A broken group may still have requests on its buffers and communicator: the process is
   * about to end, so they are left to it rather than freed under MPI's feet. */
  if (mg->broken) return;
  if (mg->comm != MPI_COMM_NULL) MPI_Comm_free(&mg->comm);
  tsr_mpi_xfer_free(&mg->x);
  tsr_mpi_xfer_free(&mg->px[0]);
  tsr_mpi_xfer_free(&mg->px[1]);
  free(mg->ranks);
  free(mg->desc_out);
  free(mg->desc_in);
  free(mg->calls);
  free(mg->call_ptrs);
  free(mg->seqs);
  free(mg->call_counts);
  free(mg->scratch);
  free(mg);
}

/* Every member tells every other which group it is creating, so that creation (collective under
 * MPI) times out with the missing ranks named, and two ranks creating shared groups in different
 * orders get an error instead of a deadlock. */
static tsr_status create_handshake(mpi_proc *p, tsr_group_t *g) {
  int n = g->n, stride = p->world + 1;
  int *out = malloc((size_t)(n + 1) * sizeof *out);
  int *in = malloc((size_t)n * (size_t)stride * sizeof *in);
  mpi_xfer x = {0};
  tsr_status st = TSR_OK;
  char rs[128], os[128], who[256], msg[TSR_MPI_MSG_LEN];
  tsr_ranks_format(n, g->ranks, rs, sizeof rs);
  if (!out || !in) {
    st = TSR_ERROR(TSR_ENOMEM, "group '%s' %s: out of memory", g->label, rs);
    goto cleanup;
  }
  out[0] = n;
  memcpy(out + 1, g->ranks, (size_t)n * sizeof *out);
  for (int j = 0; j < n; j++) {
    if (j == g->index) continue;
    TSR_CHECK_GOTO(tsr_mpi_post_on(p->ctl, &x, true, g->ranks[j], out,
                                   (size_t)(n + 1) * sizeof *out, TSR_MPI_TAG_CREATE),
                   st);
    TSR_CHECK_GOTO(tsr_mpi_post_on(p->ctl, &x, false, g->ranks[j], in + (size_t)j * stride,
                                   (size_t)stride * sizeof *in, TSR_MPI_TAG_CREATE),
                   st);
  }
  bool timed_out;
  int rc = xfer_drain(&x, p->timeout_s, &timed_out);
  if (rc != MPI_SUCCESS || timed_out) {
    /* The peers in x are world ranks here. */
    int *world_ranks = malloc((size_t)p->world * sizeof *world_ranks);
    if (world_ranks)
      for (int r = 0; r < p->world; r++) world_ranks[r] = r;
    if (world_ranks)
      tsr_mpi_xfer_pending(&x, p->world, world_ranks, who, sizeof who);
    else
      snprintf(who, sizeof who, "some ranks");
    free(world_ranks);
    if (timed_out) {
      snprintf(msg, sizeof msg,
               "creating group '%s' %s timed out after %g s: %s never created it (under the mpi "
               "backend every member must call tsr_comm_group for the groups it shares)",
               g->label, rs, p->timeout_s, who);
    } else {
      char es[MPI_MAX_ERROR_STRING];
      tsr_mpi_error_string(rc, es, sizeof es);
      snprintf(msg, sizeof msg, "creating group '%s' %s failed in MPI while waiting for %s: %s",
               g->label, rs, who, es);
    }
    tsr_mpi_xfer_abandon(&x);
    /* The buffers may still be written to by a late message: leave them to the process. */
    out = in = NULL;
    st = tsr_error(timed_out ? TSR_ETIMEDOUT : TSR_ECOMM, "%s", msg);
    goto cleanup;
  }
  for (int j = 0; j < n; j++) {
    if (j == g->index) continue;
    const int *got = in + (size_t)j * stride;
    if (got[0] == n && memcmp(got + 1, g->ranks, (size_t)n * sizeof *got) == 0) continue;
    int gn = got[0] >= 0 && got[0] <= p->world ? got[0] : 0;
    st =
        tsr_error(TSR_ECOMM,
                  "group creation out of order: rank %d is creating group %s while rank %d "
                  "creates group '%s' %s; ranks that share several groups must create them in "
                  "the same order (tsr_comm_group is collective under the mpi backend)",
                  g->ranks[j], tsr_ranks_format(gn, got + 1, os, sizeof os), p->rank, g->label, rs);
    goto cleanup;
  }
cleanup:
  tsr_mpi_xfer_free(&x);
  free(out);
  free(in);
  return st;
}

static tsr_status group_create(mpi_proc *p, tsr_group_t *g, mpi_group **out) {
  int n = g->n;
  tsr_status st = TSR_OK;
  MPI_Group world_group = MPI_GROUP_NULL, sub = MPI_GROUP_NULL;
  mpi_group *mg = calloc(1, sizeof *mg);
  if (!mg) return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory", g->label);
  mg->comm = MPI_COMM_NULL;
  mg->n = n;
  mg->me = g->index;
  mg->desc_words = 6 + 2 * (size_t)n + TSR_MPI_CRUMB_WORDS;
  mg->ranks = malloc((size_t)n * sizeof *mg->ranks);
  mg->desc_out = calloc(mg->desc_words, sizeof *mg->desc_out);
  mg->desc_in = calloc(mg->desc_words * (size_t)n, sizeof *mg->desc_in);
  mg->calls = calloc((size_t)n, sizeof *mg->calls);
  mg->call_ptrs = calloc((size_t)n, sizeof *mg->call_ptrs);
  mg->seqs = calloc((size_t)n, sizeof *mg->seqs);
  mg->call_counts = calloc(2 * (size_t)n * (size_t)n, sizeof *mg->call_counts);
  if (!mg->ranks || !mg->desc_out || !mg->desc_in || !mg->calls || !mg->call_ptrs || !mg->seqs ||
      !mg->call_counts) {
    st = TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for a group of %d", g->label, n);
    goto cleanup;
  }
  memcpy(mg->ranks, g->ranks, (size_t)n * sizeof *g->ranks);
  TSR_CHECK_GOTO(create_handshake(p, g), st);
  /* Every member is here now, so the collective creation completes promptly. Member order is
   * rank order in the new communicator. */
  int rc = MPI_Comm_group(p->ctl, &world_group);
  if (rc == MPI_SUCCESS) rc = MPI_Group_incl(world_group, n, g->ranks, &sub);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_create_group(p->ctl, sub, TSR_MPI_TAG_CREATE, &mg->comm);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(mg->comm, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    char es[MPI_MAX_ERROR_STRING], rs[128];
    tsr_mpi_error_string(rc, es, sizeof es);
    st = TSR_ERROR(TSR_ECOMM, "group '%s' %s: MPI could not create its communicator: %s", g->label,
                   tsr_ranks_format(n, g->ranks, rs, sizeof rs), es);
    goto cleanup;
  }
  *out = mg;
  mg = NULL;
cleanup:
  if (sub != MPI_GROUP_NULL) MPI_Group_free(&sub);
  if (world_group != MPI_GROUP_NULL) MPI_Group_free(&world_group);
  tsr_mpi_group_destroy(mg);
  return st;
}

/* One MPI communicator per rank list, shared by every label over it, as in the local backend. */
tsr_status tsr_mpi_group_init(tsr_comm_t *c, tsr_group_t *g) {
  mpi_proc *p = c->context;
  for (int i = 0; i < p->n_groups; i++) {
    mpi_group *mg = p->groups[i];
    if (mg->n == g->n && memcmp(mg->ranks, g->ranks, (size_t)g->n * sizeof *g->ranks) == 0) {
      g->context = mg;
      return TSR_OK;
    }
  }
  if (p->n_groups == p->cap_groups) {
    int cap = p->cap_groups ? 2 * p->cap_groups : 16;
    mpi_group **q = realloc(p->groups, (size_t)cap * sizeof *q);
    if (!q) return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for the group table", g->label);
    p->groups = q;
    p->cap_groups = cap;
  }
  mpi_group *mg = NULL;
  TSR_CHECK(group_create(p, g, &mg));
  p->groups[p->n_groups++] = mg;
  g->context = mg;
  return TSR_OK;
}

/* ---- Arrival ---- */

/* The caller's whereabouts travel with the descriptor as text, so that a mismatch between
 * processes names the plugin callback or op on each side as the local backend does: a flag word,
 * the step, then "label\0op\0op_pass\0plugin\0callback\0name\0phase\0", each cut to fit. */
#define CRUMB_FIELDS 7

static void crumb_encode(uint64_t *w, const tsr_call *call) {
  memset(w, 0, TSR_MPI_CRUMB_WORDS * sizeof *w);
  if (!call->label) return;
  const tsr_breadcrumb *b = &call->crumb;
  const char *f[CRUMB_FIELDS] = {call->label, b->op,   b->op_pass, b->plugin,
                                 b->callback, b->name, b->phase};
  w[0] = 1;
  w[1] = (uint64_t)b->step;
  char *text = (char *)(w + 2);
  size_t room = (TSR_MPI_CRUMB_WORDS - 2) * sizeof *w, at = 0, each = room / CRUMB_FIELDS;
  for (int i = 0; i < CRUMB_FIELDS; i++) {
    size_t n = f[i] ? strlen(f[i]) : 0;
    if (n > each - 1) n = each - 1;
    memcpy(text + at, f[i] ? f[i] : "", n);
    text[at + n] = '\0';
    at += n + 1;
  }
}

static void crumb_decode(const uint64_t *w, tsr_call *call) {
  if (w[0] != 1) return;
  const char *f[CRUMB_FIELDS], *text = (const char *)(w + 2);
  size_t room = (TSR_MPI_CRUMB_WORDS - 2) * sizeof *w, at = 0;
  for (int i = 0; i < CRUMB_FIELDS; i++) {
    size_t n = at < room ? strnlen(text + at, room - at) : 0;
    f[i] = at < room && n < room - at && n ? text + at : NULL;
    at += n + 1;
  }
  call->label = f[0] ? f[0] : "";
  call->crumb.step = (int64_t)w[1];
  call->crumb.op = f[1];
  call->crumb.op_pass = f[2];
  call->crumb.plugin = f[3];
  call->crumb.callback = f[4];
  call->crumb.name = f[5];
  call->crumb.phase = f[6];
}

static void desc_encode(uint64_t *w, const tsr_call *call, uint64_t seq, int n) {
  w[0] = seq;
  w[1] = (uint64_t)call->kind;
  w[2] = (uint64_t)call->dt;
  w[3] = (uint64_t)call->op;
  w[4] = (uint64_t)call->root;
  w[5] = (uint64_t)call->count;
  for (int i = 0; i < n; i++) {
    w[6 + i] = call->counts ? (uint64_t)call->counts[i] : 0;
    w[6 + n + i] = call->recv_counts ? (uint64_t)call->recv_counts[i] : 0;
  }
  crumb_encode(w + 6 + 2 * (size_t)n, call);
}

static void desc_decode(const uint64_t *w, int n, size_t *counts, tsr_call *call, uint64_t *seq) {
  *seq = w[0];
  memset(call, 0, sizeof *call);
  call->kind = (tsr_coll)w[1];
  call->dt = (tsr_dtype)w[2];
  call->op = (tsr_reduce_op)w[3];
  call->root = (int)w[4];
  call->count = (size_t)w[5];
  for (int i = 0; i < 2 * n; i++) counts[i] = (size_t)w[6 + i];
  call->counts = counts;
  call->recv_counts = counts + n;
  crumb_decode(w + 6 + 2 * (size_t)n, call);
}

tsr_status tsr_mpi_arrive(tsr_group_t *g, const tsr_call *call) {
  mpi_group *mg = tsr_mpi_group(g);
  mpi_proc *p = g->comm->context;
  int n = g->n, me = g->index;
  if (mg->broken) {
    char what[256];
    return tsr_mpi_broken_error(g, tsr_call_format(call, n, what, sizeof what));
  }
#ifdef TSR_MPI_FAULTS
  /* Test builds only: this rank dies or hangs here, as a crashed or stuck process would. */
  if (p->fault_at >= 0 && (int64_t)p->calls == p->fault_at) {
    if (p->fault_kill) raise(SIGKILL);
    for (;;) {
      struct timespec t = {1, 0};
      nanosleep(&t, NULL);
    }
  }
#endif
  p->calls++;
  mg->cur = *call;
  mg->cur_seq = mg->seq++;
  size_t w = mg->desc_words;
  desc_encode(mg->desc_out, call, mg->cur_seq, n);
  memcpy(mg->desc_in + (size_t)me * w, mg->desc_out, w * sizeof *mg->desc_out);
  for (int j = 0; j < n; j++) {
    if (j == me) continue;
    TSR_CHECK(tsr_mpi_post(g, &mg->x, true, j, mg->desc_out, w * sizeof *mg->desc_out,
                           TSR_MPI_TAG_ARRIVE));
    TSR_CHECK(tsr_mpi_post(g, &mg->x, false, j, mg->desc_in + (size_t)j * w,
                           w * sizeof *mg->desc_in, TSR_MPI_TAG_ARRIVE));
  }
  TSR_CHECK(tsr_mpi_wait(g, &mg->x, "never arrived"));
  for (int j = 0; j < n; j++) {
    desc_decode(mg->desc_in + (size_t)j * w, n, mg->call_counts + 2 * (size_t)n * (size_t)j,
                &mg->calls[j], &mg->seqs[j]);
    mg->call_ptrs[j] = &mg->calls[j];
  }
  char msg[TSR_MPI_MSG_LEN];
  tsr_status st = tsr_call_check(g, mg->call_ptrs, mg->seqs, msg, sizeof msg);
  /* Every member compared the same descriptors, so every member reports the same message. */
  if (st != TSR_OK) return tsr_error(st, "%s", msg);
  return TSR_OK;
}

tsr_status tsr_mpi_scratch(tsr_group_t *g, size_t bytes, void **out) {
  mpi_group *mg = tsr_mpi_group(g);
  if (mg->scratch_len < bytes) {
    void *q = realloc(mg->scratch, bytes);
    if (!q)
      return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for %zu bytes of scratch", g->label,
                       bytes);
    mg->scratch = q;
    mg->scratch_len = bytes;
  }
  *out = mg->scratch;
  return TSR_OK;
}
