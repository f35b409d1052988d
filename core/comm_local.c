/* The `local` backend: ranks are threads of this process, collectives read each other's buffers.
 *
 * Synchronisation is one mutex and one condition variable per group (a waiter yields its core a
 * few times before it sleeps, see yield_while). Every wait is a
 * pthread_cond_timedwait on CLOCK_MONOTONIC so that a missing peer turns into TSR_ETIMEDOUT
 * instead of a hang, and a rank whose function returns wakes every group it belongs to so that
 * peers waiting for it fail at once instead of at the timeout. */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_local.h"
#include "kernel_table.h"
#include "status_impl.h"
#include "tessera/breadcrumb.h"

/* ---- Time ---- */

static struct timespec deadline_after(double seconds) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  double whole = (double)(time_t)seconds;
  t.tv_sec += (time_t)seconds;
  t.tv_nsec += (long)((seconds - whole) * 1e9);
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec += 1;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

/* The data phases never time out, but still wake now and then so that no wait is unbounded in
 * form. */
#define TSR_LOCAL_POLL_S 1.0

/* ---- Groups ---- */

static void group_destroy(local_group *lg) {
  if (!lg) return;
  for (int i = 0; lg->m && i < lg->n; i++) {
    free(lg->m[i].scratch);
    free(lg->m[i].srcs);
    free(lg->m[i].displs);
  }
  free(lg->m);
  free(lg->calls);
  free(lg->seqs);
  free(lg->ranks);
  pthread_cond_destroy(&lg->cv);
  pthread_mutex_destroy(&lg->mu);
  free(lg);
}

static tsr_status group_create(local_world *w, int n, const int *ranks, local_group **out) {
  local_group *lg = calloc(1, sizeof *lg);
  if (!lg) return TSR_ERROR(TSR_ENOMEM, "local backend: out of memory for a group of %d", n);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  int rc = pthread_cond_init(&lg->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (rc != 0) {
    free(lg);
    return TSR_ERROR(TSR_ENOMEM, "local backend: pthread_cond_init failed (%s)", strerror(rc));
  }
  pthread_mutex_init(&lg->mu, NULL);
  lg->n = n;
  lg->ranks = malloc((size_t)n * sizeof *lg->ranks);
  lg->m = calloc((size_t)n, sizeof *lg->m);
  lg->calls = calloc((size_t)n, sizeof *lg->calls);
  lg->seqs = calloc((size_t)n, sizeof *lg->seqs);
  if (!lg->ranks || !lg->m || !lg->calls || !lg->seqs) {
    group_destroy(lg);
    return TSR_ERROR(TSR_ENOMEM, "local backend: out of memory for a group of %d", n);
  }
  memcpy(lg->ranks, ranks, (size_t)n * sizeof *ranks);
  for (int i = 0; i < n; i++) lg->m[i].exited = w->exited[ranks[i]];
  *out = lg;
  return TSR_OK;
}

/* Finds or creates the shared state for g's rank list. Groups are few and made once, so a linear
 * scan of the world's table is enough. */
static tsr_status local_group_init(tsr_comm_t *c, tsr_group_t *g) {
  local_world *w = ((local_rank *)c->context)->w;
  tsr_status st = TSR_OK;
  pthread_mutex_lock(&w->mu);
  for (int i = 0; i < w->n_groups; i++) {
    local_group *lg = w->groups[i];
    if (lg->n == g->n && memcmp(lg->ranks, g->ranks, (size_t)g->n * sizeof *g->ranks) == 0) {
      g->context = lg;
      goto cleanup;
    }
  }
  if (w->n_groups == w->cap_groups) {
    int cap = w->cap_groups ? 2 * w->cap_groups : 16;
    local_group **p = realloc(w->groups, (size_t)cap * sizeof *p);
    if (!p) {
      st = TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for the group table", g->label);
      goto cleanup;
    }
    w->groups = p;
    w->cap_groups = cap;
  }
  local_group *lg = NULL;
  TSR_CHECK_GOTO(group_create(w, g->n, g->ranks, &lg), st);
  w->groups[w->n_groups++] = lg;
  g->context = lg;
cleanup:
  pthread_mutex_unlock(&w->mu);
  return st;
}

/* ---- Failure ---- */

/* Marks the group broken. Called with lg->mu held. */
static void group_break(local_group *lg, tsr_status st, const char *why) {
  if (lg->broken) return;
  lg->broken = true;
  lg->broken_status = st;
  snprintf(lg->why, sizeof lg->why, "%s", why);
  pthread_cond_broadcast(&lg->cv);
}

/* The error of a call that finds the group already broken. */
static tsr_status broken_error(const tsr_group_t *g, const char *what) {
  local_group *lg = tsr_local_group(g);
  char rs[128];
  return tsr_error(TSR_ECOMM, "%s on group '%s' %s: the group is broken by an earlier failure: %s",
                   what, g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs), lg->why);
}

/* "rank 2" or "ranks 2, 5" for the members in `missing` (n flags). */
static void format_missing(const tsr_group_t *g, const bool *missing, char *buf, size_t len) {
  size_t pos = 0;
  int count = 0, shown = 0;
  for (int i = 0; i < g->n; i++) count += missing[i];
  int w = snprintf(buf, len, "%s", count == 1 ? "rank" : "ranks");
  pos = w > 0 ? (size_t)w : 0;
  for (int i = 0; i < g->n && pos < len; i++) {
    if (!missing[i]) continue;
    if (shown == 16) {
      snprintf(buf + pos, len - pos, " and %d more", count - shown);
      return;
    }
    w = snprintf(buf + pos, len - pos, "%s %d", shown ? "," : "", g->ranks[i]);
    pos += w > 0 ? (size_t)w : 0;
    shown++;
  }
}

/* Members that have not arrived at the rendezvous of generation `gen`. Called with lg->mu held;
 * uses the member's scratch flags in `missing` (n entries). Returns whether one of them exited. */
static bool find_missing(local_group *lg, uint64_t gen, bool *missing) {
  bool exited = false;
  for (int i = 0; i < lg->n; i++) {
    missing[i] = lg->m[i].stamp != gen + 1;
    exited = exited || (missing[i] && lg->m[i].exited);
  }
  return exited;
}

/* ---- Where each rank is ---- */

static local_rank *rank_of(const tsr_group_t *g, int member) {
  return &((local_rank *)g->comm->context)->w->ranks[g->ranks[member]];
}

/* Records that this rank waits in `call` (or, waiting = false, no longer does). */
static void where_set(tsr_group_t *g, const tsr_call *call, bool waiting) {
  local_rank *lr = rank_of(g, g->index);
  pthread_mutex_lock(&lr->where_mu);
  if (waiting) {
    lr->where = *call;
    lr->where.counts = lr->where.recv_counts = NULL; /* the caller's arrays do not outlive it */
    lr->where.send = lr->where.recv = NULL;
    lr->called = true;
  }
  lr->waiting = waiting;
  pthread_mutex_unlock(&lr->where_mu);
}

/* "; rank 3 waits in all_gather on group 'tp' in op linear (forward), step 2" for each missing
 * member (the first few): where the ranks that never arrived are instead, which names the
 * collective a plugin callback made on one side only. */
static void describe_missing(const tsr_group_t *g, const bool *missing, char *buf, size_t len) {
  size_t pos = strlen(buf);
  int shown = 0;
  for (int i = 0; i < g->n && shown < 4 && pos + 1 < len; i++) {
    if (!missing[i]) continue;
    local_rank *lr = rank_of(g, i);
    char where[384] = "";
    pthread_mutex_lock(&lr->where_mu);
    tsr_call c = lr->where;
    bool waiting = lr->waiting, called = lr->called;
    pthread_mutex_unlock(&lr->where_mu);
    if (called) tsr_call_where(&c, where, sizeof where);
    int w;
    if (!called)
      w = snprintf(buf + pos, len - pos, "; rank %d has made no collective call", g->ranks[i]);
    else
      w = snprintf(buf + pos, len - pos, "; rank %d %s %s on group '%s'%s", g->ranks[i],
                   waiting ? "waits in" : "is in no collective, its last was",
                   tsr_coll_name(c.kind), c.label ? c.label : "?", where);
    pos += w > 0 ? (size_t)w : 0;
    shown++;
  }
}

/* ---- Rendezvous ---- */

/* Yields before a waiter sleeps on the condition variable. */
#define TSR_LOCAL_YIELDS 64

/* Thread ranks that share few cores wait for each other through the scheduler: before sleeping,
 * a waiter hands its core to whoever can run a few times, so that the members still working (or
 * arriving) run at once instead of after a sleep and a wake-up. Called with lg->mu held, which it
 * drops meanwhile; `gen` is written under lg->mu, atomically so that it can be read here. */
static void yield_while(local_group *lg, uint64_t gen) {
  pthread_mutex_unlock(&lg->mu);
  for (int i = 0; i < TSR_LOCAL_YIELDS && __atomic_load_n(&lg->gen, __ATOMIC_ACQUIRE) == gen; i++)
    sched_yield();
  pthread_mutex_lock(&lg->mu);
}

tsr_status tsr_local_enter(tsr_group_t *g, const tsr_call *call) {
  local_group *lg = tsr_local_group(g);
  int me = g->index;
  /* Formatted only for messages: this is the hot path of every small collective. */
  char what[256] = "", rs[128];
  bool *missing = malloc((size_t)g->n * sizeof *missing);
  if (!missing)
    return TSR_ERROR(TSR_ENOMEM, "%s on group '%s': out of memory", tsr_coll_name(call->kind),
                     g->label);
  struct timespec deadline = deadline_after(g->comm->timeout_s);
  tsr_status st = TSR_OK;
  where_set(g, call, true);
  pthread_mutex_lock(&lg->mu);
  if (lg->broken) {
    st = broken_error(g, tsr_call_format(call, g->n, what, sizeof what));
    goto cleanup;
  }
  uint64_t gen = lg->gen, seq = lg->m[me].seq++;
  lg->m[me].call = *call;
  lg->m[me].stamp = gen + 1;
  if (++lg->arrived == g->n) {
    for (int i = 0; i < g->n; i++) {
      lg->calls[i] = &lg->m[i].call;
      /* The counter was bumped on arrival; compare the value each member had on entry. */
      lg->seqs[i] = lg->m[i].seq - 1;
    }
    lg->verdict = tsr_call_check(g, lg->calls, lg->seqs, lg->verdict_msg, sizeof lg->verdict_msg);
    lg->arrived = 0;
    __atomic_store_n(&lg->gen, gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&lg->cv);
  } else if (!lg->broken) {
    yield_while(lg, gen);
  }
  while (lg->gen == gen) {
    if (lg->broken) {
      st = tsr_error(lg->broken_status, "%s", lg->why);
      goto cleanup;
    }
    char who[256], msg[TSR_LOCAL_MSG_LEN];
    if (find_missing(lg, gen, missing)) {
      tsr_call_format(call, g->n, what, sizeof what);
      for (int i = 0; i < g->n; i++) missing[i] = missing[i] && lg->m[i].exited;
      format_missing(g, missing, who, sizeof who);
      snprintf(msg, sizeof msg,
               "%s on group '%s' %s (seq %llu) cannot complete: %s returned from its rank "
               "function without making this call",
               what, g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs),
               (unsigned long long)seq, who);
      group_break(lg, TSR_ECOMM, msg);
      continue;
    }
    int rc = pthread_cond_timedwait(&lg->cv, &lg->mu, &deadline);
    if (rc == ETIMEDOUT && lg->gen == gen && !lg->broken) {
      find_missing(lg, gen, missing);
      tsr_call_format(call, g->n, what, sizeof what);
      format_missing(g, missing, who, sizeof who);
      snprintf(msg, sizeof msg,
               "%s on group '%s' %s (seq %llu) timed out after %g s: %s never arrived; the group "
               "is unusable from now on",
               what, g->label, tsr_ranks_format(g->n, g->ranks, rs, sizeof rs),
               (unsigned long long)seq, g->comm->timeout_s, who);
      describe_missing(g, missing, msg, sizeof msg);
      group_break(lg, TSR_ETIMEDOUT, msg);
    }
  }
  if (lg->verdict != TSR_OK) st = tsr_error(lg->verdict, "%s", lg->verdict_msg);
cleanup:
  pthread_mutex_unlock(&lg->mu);
  where_set(g, call, false);
  free(missing);
  return st;
}

void tsr_local_sync(tsr_group_t *g) {
  local_group *lg = tsr_local_group(g);
  pthread_mutex_lock(&lg->mu);
  uint64_t gen = lg->gen;
  if (++lg->arrived == g->n) {
    lg->arrived = 0;
    __atomic_store_n(&lg->gen, gen + 1, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&lg->cv);
  } else {
    yield_while(lg, gen);
  }
  while (lg->gen == gen) {
    struct timespec t = deadline_after(TSR_LOCAL_POLL_S);
    pthread_cond_timedwait(&lg->cv, &lg->mu, &t);
  }
  pthread_mutex_unlock(&lg->mu);
}

tsr_status tsr_local_scratch(tsr_group_t *g, size_t bytes, void **out) {
  local_member *m = &tsr_local_group(g)->m[g->index];
  if (m->scratch_len < bytes) {
    void *p = realloc(m->scratch, bytes);
    if (!p)
      return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for %zu bytes of scratch", g->label,
                       bytes);
    m->scratch = p;
    m->scratch_len = bytes;
  }
  *out = m->scratch;
  return TSR_OK;
}

tsr_status tsr_local_device_scratch(tsr_group_t *g, size_t bytes, void **out) {
  local_member *m = &tsr_local_group(g)->m[g->index];
  tsr_allocator *a = g->comm->device_alloc;
  *out = NULL;
  if (!a) return TSR_OK;
  if (m->dev_scratch_len < bytes) {
    void *p = tsr_allocator_alloc(a, bytes);
    if (!p)
      return TSR_ERROR(TSR_ENOMEM, "group '%s': out of device memory for %zu bytes of scratch",
                       g->label, bytes);
    if (m->dev_scratch) tsr_allocator_free(a, m->dev_scratch, m->dev_scratch_len);
    m->dev_scratch = p;
    m->dev_scratch_len = bytes;
  }
  *out = m->dev_scratch;
  return TSR_OK;
}

/* The member's device scratch of every group, before the rank's allocator goes. */
static void local_release_device(tsr_comm_t *c) {
  for (int i = 0; i < c->n_groups; i++) {
    tsr_group_t *g = c->groups[i];
    if (!g->context) continue;
    local_member *m = &tsr_local_group(g)->m[g->index];
    if (m->dev_scratch) tsr_allocator_free(c->device_alloc, m->dev_scratch, m->dev_scratch_len);
    m->dev_scratch = NULL;
    m->dev_scratch_len = 0;
  }
}

/* ---- Point to point ---- */

/* Adds `msg` to `to`'s inbox. Called with lg->mu held. */
static void msg_post(local_group *lg, int to, local_msg *msg) {
  local_member *m = &lg->m[to];
  msg->next = NULL;
  if (m->inbox_tail)
    m->inbox_tail->next = msg;
  else
    m->inbox_head = msg;
  m->inbox_tail = msg;
  pthread_cond_broadcast(&lg->cv);
}

/* Removes `msg` from `to`'s inbox if it is there. Called with lg->mu held. */
static void msg_unlink(local_group *lg, int to, local_msg *msg) {
  local_member *m = &lg->m[to];
  local_msg *prev = NULL;
  for (local_msg *p = m->inbox_head; p; prev = p, p = p->next) {
    if (p != msg) continue;
    if (prev)
      prev->next = p->next;
    else
      m->inbox_head = p->next;
    if (m->inbox_tail == p) m->inbox_tail = prev;
    return;
  }
}

/* Waits until the receiver has finished with `msg`. Called with lg->mu held. */
static tsr_status msg_wait(tsr_group_t *g, int peer, local_msg *msg,
                           const struct timespec *deadline) {
  local_group *lg = tsr_local_group(g);
  char rs[128], why[TSR_LOCAL_MSG_LEN];
  tsr_ranks_format(g->n, g->ranks, rs, sizeof rs);
  while (msg->state != LOCAL_MSG_DONE) {
    /* Once the receiver has claimed the message it is copying: wait it out. */
    if (msg->state == LOCAL_MSG_POSTED) {
      if (lg->broken) {
        msg_unlink(lg, peer, msg);
        return tsr_error(lg->broken_status, "%s", lg->why);
      }
      if (lg->m[peer].exited) {
        msg_unlink(lg, peer, msg);
        snprintf(why, sizeof why,
                 "send of %zu %s from rank %d to rank %d on group '%s' %s cannot complete: rank %d "
                 "returned from its rank function without receiving it",
                 msg->count, tsr_dtype_name(msg->dt), g->ranks[g->index], g->ranks[peer], g->label,
                 rs, g->ranks[peer]);
        group_break(lg, TSR_ECOMM, why);
        return tsr_error(TSR_ECOMM, "%s", why);
      }
    }
    int rc = pthread_cond_timedwait(&lg->cv, &lg->mu, deadline);
    if (rc == ETIMEDOUT && msg->state == LOCAL_MSG_POSTED) {
      msg_unlink(lg, peer, msg);
      snprintf(why, sizeof why,
               "send of %zu %s from rank %d to rank %d on group '%s' %s timed out after %g s: "
               "rank %d never posted the matching recv; the group is unusable from now on",
               msg->count, tsr_dtype_name(msg->dt), g->ranks[g->index], g->ranks[peer], g->label,
               rs, g->comm->timeout_s, g->ranks[peer]);
      group_break(lg, TSR_ETIMEDOUT, why);
      return tsr_error(TSR_ETIMEDOUT, "%s", why);
    }
  }
  if (msg->status != TSR_OK) return tsr_error(msg->status, "%s", msg->err);
  return TSR_OK;
}

/* Receives the oldest message from `peer` into buf. Called with lg->mu held; drops it while
 * copying. */
static tsr_status msg_take(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt,
                           const struct timespec *deadline) {
  local_group *lg = tsr_local_group(g);
  local_member *me = &lg->m[g->index];
  char rs[128], why[TSR_LOCAL_MSG_LEN];
  tsr_ranks_format(g->n, g->ranks, rs, sizeof rs);
  for (;;) {
    local_msg *msg = me->inbox_head;
    while (msg && msg->from != peer) msg = msg->next;
    if (msg) {
      msg_unlink(lg, g->index, msg);
      if (msg->count != count || msg->dt != dt) {
        snprintf(msg->err, sizeof msg->err,
                 "point-to-point mismatch on group '%s' %s: rank %d sends %zu %s to rank %d, "
                 "which receives %zu %s",
                 g->label, rs, g->ranks[peer], msg->count, tsr_dtype_name(msg->dt),
                 g->ranks[g->index], count, tsr_dtype_name(dt));
        msg->status = TSR_ECOMM;
        msg->state = LOCAL_MSG_DONE;
        pthread_cond_broadcast(&lg->cv);
        return tsr_error(TSR_ECOMM, "%s", msg->err);
      }
      msg->state = LOCAL_MSG_CLAIMED;
      pthread_mutex_unlock(&lg->mu);
      tsr_status st = TSR_OK;
      if (count) {
        tsr_memcpy_any(buf, msg->buf, count * tsr_dtype_size(dt));
        /* the sender may reuse its buffer once the message is done */
        st = tsr_device_wait(buf, msg->buf);
      }
      pthread_mutex_lock(&lg->mu);
      /* a failed copy is this rank's to report: the sender's part went through */
      msg->status = TSR_OK;
      msg->state = LOCAL_MSG_DONE;
      pthread_cond_broadcast(&lg->cv);
      return st;
    }
    if (lg->broken) return tsr_error(lg->broken_status, "%s", lg->why);
    if (lg->m[peer].exited) {
      snprintf(why, sizeof why,
               "recv of %zu %s by rank %d from rank %d on group '%s' %s cannot complete: rank %d "
               "returned from its rank function without sending it",
               count, tsr_dtype_name(dt), g->ranks[g->index], g->ranks[peer], g->label, rs,
               g->ranks[peer]);
      group_break(lg, TSR_ECOMM, why);
      return tsr_error(TSR_ECOMM, "%s", why);
    }
    int rc = pthread_cond_timedwait(&lg->cv, &lg->mu, deadline);
    if (rc == ETIMEDOUT && !lg->broken) {
      msg = me->inbox_head;
      while (msg && msg->from != peer) msg = msg->next;
      if (msg) continue;
      snprintf(why, sizeof why,
               "recv of %zu %s by rank %d from rank %d on group '%s' %s timed out after %g s: "
               "rank %d never sent; the group is unusable from now on",
               count, tsr_dtype_name(dt), g->ranks[g->index], g->ranks[peer], g->label, rs,
               g->comm->timeout_s, g->ranks[peer]);
      group_break(lg, TSR_ETIMEDOUT, why);
      return tsr_error(TSR_ETIMEDOUT, "%s", why);
    }
  }
}

static tsr_status local_send(tsr_group_t *g, int peer, const void *buf, size_t count,
                             tsr_dtype dt) {
  local_group *lg = tsr_local_group(g);
  local_msg msg = {.from = g->index, .buf = buf, .count = count, .dt = dt};
  /* the receiver copies from buf as soon as it is posted */
  TSR_CHECK(tsr_device_wait(buf, NULL));
  struct timespec deadline = deadline_after(g->comm->timeout_s);
  tsr_status st;
  pthread_mutex_lock(&lg->mu);
  if (lg->broken) {
    st = broken_error(g, "send");
  } else {
    msg_post(lg, peer, &msg);
    st = msg_wait(g, peer, &msg, &deadline);
  }
  pthread_mutex_unlock(&lg->mu);
  return st;
}

static tsr_status local_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt) {
  local_group *lg = tsr_local_group(g);
  struct timespec deadline = deadline_after(g->comm->timeout_s);
  tsr_status st;
  pthread_mutex_lock(&lg->mu);
  st = lg->broken ? broken_error(g, "recv") : msg_take(g, peer, buf, count, dt, &deadline);
  pthread_mutex_unlock(&lg->mu);
  return st;
}

/* Posts the send before receiving so that a ring of sendrecvs cannot deadlock. */
static tsr_status local_sendrecv(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                                 int recv_peer, void *recv, size_t recv_count, tsr_dtype dt) {
  local_group *lg = tsr_local_group(g);
  local_msg msg = {.from = g->index, .buf = send, .count = send_count, .dt = dt};
  TSR_CHECK(tsr_device_wait(send, recv));
  struct timespec deadline = deadline_after(g->comm->timeout_s);
  tsr_status st;
  pthread_mutex_lock(&lg->mu);
  if (lg->broken) {
    st = broken_error(g, "sendrecv");
    goto cleanup;
  }
  msg_post(lg, send_peer, &msg);
  st = msg_take(g, recv_peer, recv, recv_count, dt, &deadline);
  /* The posted send lives on this stack: wait for it even when the receive failed. */
  tsr_status sst = msg_wait(g, send_peer, &msg, &deadline);
  if (st == TSR_OK) st = sst;
cleanup:
  pthread_mutex_unlock(&lg->mu);
  return st;
}

/* ---- Launch ---- */

static const tsr_comm_iface local_iface = {
    .name = "local",
    .group_init = local_group_init,
    .group_free = NULL,
    .all_reduce = tsr_local_all_reduce,
    .all_gather = tsr_local_all_gather,
    .reduce_scatter = tsr_local_reduce_scatter,
    .all_to_all = tsr_local_all_to_all,
    .broadcast = tsr_local_broadcast,
    .barrier = tsr_local_barrier,
    .send = local_send,
    .recv = local_recv,
    .sendrecv = local_sendrecv,
    .device_memory = true,
    .release_device = local_release_device,
};

/* Records that `rank` will make no more calls and wakes every group waiting on it. */
static void mark_exited(local_world *w, int rank) {
  pthread_mutex_lock(&w->mu);
  w->exited[rank] = true;
  for (int i = 0; i < w->n_groups; i++) {
    local_group *lg = w->groups[i];
    for (int j = 0; j < lg->n; j++) {
      if (lg->ranks[j] != rank) continue;
      pthread_mutex_lock(&lg->mu);
      lg->m[j].exited = true;
      pthread_cond_broadcast(&lg->cv);
      pthread_mutex_unlock(&lg->mu);
      break;
    }
  }
  pthread_mutex_unlock(&w->mu);
}

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec + 1;
}

static void *rank_main(void *p) {
  local_rank *r = p;
  tsr_clear_error();
  *tsr_breadcrumb_here() = (tsr_breadcrumb){.rank = r->rank, .microbatch = -1};
  r->status = r->fn(r->comm, r->arg);
  if (r->status != TSR_OK) {
    snprintf(r->msg, sizeof r->msg, "%s", tsr_last_error());
    /* when the failure was written; a status returned without a message, when it returned */
    r->failed_ns = tsr_last_error_ns();
    if (!r->failed_ns) r->failed_ns = now_ns();
  }
  mark_exited(r->w, r->rank);
  return NULL;
}

/* ---- The launch's error: the first failure, then the others in brief ---- */

/* "0, 2-3, 7" for the failed ranks other than `first`, cut with "..." when long. */
static void format_others(const local_world *w, int first, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int r = 0; r < w->world; r++) {
    if (r == first || w->ranks[r].status == TSR_OK) continue;
    int e = r;
    while (e + 1 < w->world && e + 1 != first && w->ranks[e + 1].status != TSR_OK) e++;
    char one[32];
    if (e == r)
      snprintf(one, sizeof one, "%s%d", o ? ", " : "", r);
    else
      snprintf(one, sizeof one, "%s%d%s%d", o ? ", " : "", r, e == r + 1 ? ", " : "-", e);
    if (o + strlen(one) + 5 >= len) {
      snprintf(buf + o, len - o, ", ...");
      return;
    }
    o += (size_t)snprintf(buf + o, len - o, "%s", one);
    r = e;
  }
}

/* At most `max` bytes of s, not cutting a UTF-8 sequence, with "..." when cut. */
static void cut(const char *s, size_t max, char *buf, size_t len) {
  size_t n = strlen(s);
  if (n <= max) {
    snprintf(buf, len, "%s", s);
    return;
  }
  while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80) max--;
  snprintf(buf, len, "%.*s...", (int)max, s);
}

/* Sets the launch's error and returns its status. The cause is the failure written first: a
 * rank that fails makes its peers fail only after it returns (they find it gone from a
 * collective, or the group broken), so their messages, usually "rank R returned ... without
 * making this call", come later in time. Ties go to the lower rank. The others are summarised on
 * a second line: their ranks, and the first message that is not the cause's. */
static tsr_status launch_error(const local_world *w) {
  int first = -1, nfailed = 0;
  for (int r = 0; r < w->world; r++) {
    const local_rank *lr = &w->ranks[r];
    if (lr->status == TSR_OK) continue;
    nfailed++;
    if (first < 0 || lr->failed_ns < w->ranks[first].failed_ns) first = r;
  }
  if (first < 0) return TSR_OK;
  const local_rank *cause = &w->ranks[first];
  if (nfailed == 1) return tsr_error(cause->status, "rank %d: %s", first, cause->msg);
  int next = -1, other = -1;
  for (int r = 0; r < w->world; r++) {
    const local_rank *lr = &w->ranks[r];
    if (r == first || lr->status == TSR_OK) continue;
    if (next < 0 || lr->failed_ns < w->ranks[next].failed_ns) next = r;
    if (strcmp(lr->msg, cause->msg) && (other < 0 || lr->failed_ns < w->ranks[other].failed_ns))
      other = r;
  }
  char ranks[400], said[256];
  format_others(w, first, ranks, sizeof ranks);
  const char *s = nfailed > 2 ? "s" : "";
  if (other < 0)
    return tsr_error(cause->status,
                     "rank %d: %s\n  then rank%s %s failed after it, with the same "
                     "message",
                     first, cause->msg, s, ranks);
  cut(w->ranks[other].msg, 200, said, sizeof said);
  if (nfailed == 2)
    return tsr_error(cause->status, "rank %d: %s\n  then rank %d failed after it: %s", first,
                     cause->msg, other, said);
  return tsr_error(
      cause->status, "rank %d: %s\n  then ranks %s failed after it; the first %s, rank %d: %s",
      first, cause->msg, ranks, other == next ? "of them" : "with another message", other, said);
}

static void world_destroy(local_world *w) {
  if (!w) return;
  for (int i = 0; w->ranks && i < w->world; i++) {
    tsr_comm_destroy(w->ranks[i].comm);
    if (w->ranks[i].w) pthread_mutex_destroy(&w->ranks[i].where_mu);
  }
  for (int i = 0; i < w->n_groups; i++) group_destroy(w->groups[i]);
  pthread_mutex_destroy(&w->mu);
  free(w->groups);
  free(w->exited);
  free(w->ranks);
  free(w);
}

static size_t small_bytes_from_env(void) {
  const char *s = getenv("TESSERA_LOCAL_SMALL_BYTES");
  if (!s || !*s) return TSR_LOCAL_SMALL_BYTES_DEFAULT;
  char *end = NULL;
  unsigned long long v = strtoull(s, &end, 10);
  return end && *end == '\0' ? (size_t)v : TSR_LOCAL_SMALL_BYTES_DEFAULT;
}

tsr_status tsr_local_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg) {
  if (world < 1 || world > TSR_LOCAL_MAX_RANKS)
    return TSR_ERROR(TSR_EINVAL, "tsr_local_launch: world size %d is outside 1 ..= %d", world,
                     TSR_LOCAL_MAX_RANKS);
  if (!(timeout_s > 0) || timeout_s > 1e6)
    return TSR_ERROR(TSR_EINVAL, "tsr_local_launch: timeout %g s must be in (0, 1e6]", timeout_s);
  if (!fn) return TSR_ERROR(TSR_EINVAL, "tsr_local_launch: rank function is NULL");
  tsr_status st = TSR_OK;
  local_world *w = calloc(1, sizeof *w);
  if (!w) return TSR_ERROR(TSR_ENOMEM, "tsr_local_launch: out of memory");
  pthread_mutex_init(&w->mu, NULL);
  w->world = world;
  w->timeout_s = timeout_s;
  w->small_bytes = small_bytes_from_env();
  w->exited = calloc((size_t)world, sizeof *w->exited);
  w->ranks = calloc((size_t)world, sizeof *w->ranks);
  if (!w->exited || !w->ranks) {
    st = TSR_ERROR(TSR_ENOMEM, "tsr_local_launch: out of memory for %d ranks", world);
    goto cleanup;
  }
  for (int r = 0; r < world; r++) {
    local_rank *lr = &w->ranks[r];
    lr->w = w;
    lr->rank = r;
    pthread_mutex_init(&lr->where_mu, NULL);
    lr->fn = fn;
    lr->arg = arg;
    TSR_CHECK_GOTO(tsr_comm_create(&local_iface, lr, r, world, timeout_s, &lr->comm), st);
  }
  for (int r = 0; r < world; r++) {
    int rc = pthread_create(&w->ranks[r].thread, NULL, rank_main, &w->ranks[r]);
    if (rc != 0) {
      /* The ranks already running must not wait for the ones that never will. */
      for (int q = r; q < world; q++) mark_exited(w, q);
      st = TSR_ERROR(TSR_ENOMEM, "tsr_local_launch: cannot start the thread of rank %d of %d (%s)",
                     r, world, strerror(rc));
      break;
    }
    w->ranks[r].started = true;
  }
  for (int r = 0; r < world; r++)
    if (w->ranks[r].started) pthread_join(w->ranks[r].thread, NULL);
  if (st != TSR_OK) goto cleanup;
  st = launch_error(w);
cleanup:
  world_destroy(w);
  return st;
}
