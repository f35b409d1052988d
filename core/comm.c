/* The backend-independent half of the communicator: argument checks, groups of one, byte
 * counters, and the call comparison every backend reports mismatches with. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "kernel_table.h"
#include "trace_impl.h"

int64_t tsr_chunk_size(int64_t total, int n, int i) {
  if (n <= 0 || i < 0 || i >= n || total <= 0) return 0;
  int64_t per = (total + n - 1) / n;
  int64_t start = per * i;
  if (start >= total) return 0;
  return total - start < per ? total - start : per;
}

int64_t tsr_chunk_start(int64_t total, int n, int i) {
  if (n <= 0 || i <= 0 || total <= 0) return 0;
  int64_t per = (total + n - 1) / n;
  int64_t start = per * i;
  return start < total ? start : total;
}

const char *tsr_reduce_op_name(tsr_reduce_op op) {
  switch (op) {
    case TSR_REDUCE_SUM:
      return "sum";
    case TSR_REDUCE_AVG:
      return "avg";
    case TSR_REDUCE_MAX:
      return "max";
  }
  return "?";
}

const char *tsr_coll_name(tsr_coll kind) {
  static const char *const names[TSR_COLL_COUNT] = {"all_reduce", "all_gather", "reduce_scatter",
                                                    "all_to_all", "broadcast",  "barrier"};
  return (unsigned)kind < TSR_COLL_COUNT ? names[kind] : "?";
}

/* ---- Formatting shared by every backend's messages ---- */

static void buf_printf(char *buf, size_t len, size_t *pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void buf_printf(char *buf, size_t len, size_t *pos, const char *fmt, ...) {
  if (*pos >= len) return;
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(buf + *pos, len - *pos, fmt, ap);
  va_end(ap);
  if (w > 0) *pos = *pos + (size_t)w < len ? *pos + (size_t)w : len;
}

/* Lists longer than this print their head and tail only: a 1024-rank list helps nobody. */
#define TSR_LIST_SHOWN 8

static void format_sizes(char *buf, size_t len, size_t *pos, int n, const size_t *v) {
  bool uniform = true;
  for (int i = 1; i < n; i++) uniform = uniform && v[i] == v[0];
  if (uniform) {
    buf_printf(buf, len, pos, "%zu", n > 0 ? v[0] : (size_t)0);
    return;
  }
  buf_printf(buf, len, pos, "[");
  for (int i = 0; i < n; i++) {
    if (n > TSR_LIST_SHOWN && i == TSR_LIST_SHOWN / 2) {
      buf_printf(buf, len, pos, "...,");
      i = n - TSR_LIST_SHOWN / 2;
    }
    buf_printf(buf, len, pos, "%zu%s", v[i], i + 1 < n ? "," : "]");
  }
}

const char *tsr_ranks_format(int n, const int *ranks, char *buf, size_t len) {
  size_t pos = 0;
  if (len == 0) return buf;
  buf[0] = '\0';
  buf_printf(buf, len, &pos, "[");
  for (int i = 0; i < n; i++) {
    if (n > TSR_LIST_SHOWN && i == TSR_LIST_SHOWN / 2) {
      buf_printf(buf, len, &pos, "...,");
      i = n - TSR_LIST_SHOWN / 2;
    }
    buf_printf(buf, len, &pos, "%d%s", ranks[i], i + 1 < n ? "," : "");
  }
  buf_printf(buf, len, &pos, "]");
  return buf;
}

const char *tsr_call_format(const tsr_call *call, int n, char *buf, size_t len) {
  size_t pos = 0;
  if (len == 0) return buf;
  buf[0] = '\0';
  const char *dt = tsr_dtype_name(call->dt);
  buf_printf(buf, len, &pos, "%s(", tsr_coll_name(call->kind));
  switch (call->kind) {
    case TSR_COLL_ALL_REDUCE:
      buf_printf(buf, len, &pos, "%s, %zu, %s", dt, call->count, tsr_reduce_op_name(call->op));
      break;
    case TSR_COLL_ALL_GATHER:
    case TSR_COLL_REDUCE_SCATTER:
      buf_printf(buf, len, &pos, "%s, ", dt);
      format_sizes(buf, len, &pos, n, call->counts);
      if (call->kind == TSR_COLL_REDUCE_SCATTER)
        buf_printf(buf, len, &pos, ", %s", tsr_reduce_op_name(call->op));
      break;
    case TSR_COLL_ALL_TO_ALL:
      buf_printf(buf, len, &pos, "%s, send ", dt);
      format_sizes(buf, len, &pos, n, call->counts);
      buf_printf(buf, len, &pos, ", recv ");
      format_sizes(buf, len, &pos, n, call->recv_counts);
      break;
    case TSR_COLL_BROADCAST:
      buf_printf(buf, len, &pos, "%s, %zu, root %d", dt, call->count, call->root);
      break;
    case TSR_COLL_BARRIER:
    case TSR_COLL_COUNT:
      break;
  }
  buf_printf(buf, len, &pos, ")");
  return buf;
}

/* The same text (or both NULL)? Calls decoded from another process carry their own copies. */
static bool str_differs(const char *a, const char *b) {
  return a != b && (!a || !b || strcmp(a, b));
}

/* Records on `call` where its caller is: the group handle's label and the thread's breadcrumb. */
static void stamp(tsr_call *call, const tsr_group_t *g) {
  call->label = g->label;
  call->crumb = *tsr_breadcrumb_here();
}

/* " (on group 'fk') in plugin P, optimizer hook H (before step), step 2" for a mismatch message:
 * the caller's group label when it is not `label`, then what it was running. Empty for a call
 * that carries neither (from a backend that moved it between processes). */
static const char *call_where(const tsr_call *c, const char *label, char *buf, size_t len) {
  const tsr_breadcrumb *b = &c->crumb;
  size_t pos = 0;
  buf[0] = '\0';
  if (c->label && label && strcmp(c->label, label))
    buf_printf(buf, len, &pos, " on group '%s'", c->label);
  if (!c->label) return buf;
  if (b->plugin || b->callback) {
    buf_printf(buf, len, &pos, " in");
    if (b->plugin) buf_printf(buf, len, &pos, " plugin %s", b->plugin);
    if (b->callback) buf_printf(buf, len, &pos, "%s %s", b->plugin ? "," : "", b->callback);
    if (b->callback && b->name) buf_printf(buf, len, &pos, " %s", b->name);
    if (b->phase) buf_printf(buf, len, &pos, " (%s)", b->phase);
    if (b->op) buf_printf(buf, len, &pos, ", during op %s", b->op);
  } else if (b->op) {
    buf_printf(buf, len, &pos, " in op %s%s%s%s, no plugin callback", b->op, b->op_pass ? " (" : "",
               b->op_pass ? b->op_pass : "", b->op_pass ? ")" : "");
  } else {
    buf_printf(buf, len, &pos, " outside any op or plugin callback (the program's own call)");
  }
  if (b->step > 0) buf_printf(buf, len, &pos, ", step %lld", (long long)b->step);
  return buf;
}

const char *tsr_call_where(const tsr_call *call, char *buf, size_t len) {
  return call_where(call, NULL, buf, len);
}

/* Whether two members made the same call. all_to_all counts legitimately differ per member and
 * are cross-checked separately. */
static bool call_same(const tsr_call *a, const tsr_call *b, int n) {
  if (a->kind != b->kind || a->dt != b->dt) return false;
  switch (a->kind) {
    case TSR_COLL_ALL_REDUCE:
      return a->count == b->count && a->op == b->op;
    case TSR_COLL_REDUCE_SCATTER:
      if (a->op != b->op) return false;
      /* fallthrough */
    case TSR_COLL_ALL_GATHER:
      return memcmp(a->counts, b->counts, (size_t)n * sizeof *a->counts) == 0;
    case TSR_COLL_BROADCAST:
      return a->count == b->count && a->root == b->root;
    case TSR_COLL_ALL_TO_ALL:
    case TSR_COLL_BARRIER:
    case TSR_COLL_COUNT:
      return true;
  }
  return true;
}

tsr_status tsr_call_check(const tsr_group_t *g, const tsr_call *const *calls, const uint64_t *seqs,
                          char *msg, size_t len) {
  int n = g->n;
  char rs[128], ca[256], cb[256];
  tsr_ranks_format(n, g->ranks, rs, sizeof rs);
  for (int j = 1; j < n; j++) {
    if (seqs[j] == seqs[0] && call_same(calls[0], calls[j], n)) continue;
    tsr_call_format(calls[0], n, ca, sizeof ca);
    tsr_call_format(calls[j], n, cb, sizeof cb);
    char wa[512], wb[512];
    call_where(calls[0], g->label, wa, sizeof wa);
    call_where(calls[j], g->label, wb, sizeof wb);
    if (seqs[j] != seqs[0]) {
      snprintf(msg, len,
               "collective sequence mismatch on group '%s' %s: rank %d is at call %" PRIu64
               " (%s%s), rank %d at call %" PRIu64 " (%s%s); every member must make the same "
               "calls on a group in the same order",
               g->label, rs, g->ranks[0], seqs[0], ca, wa, g->ranks[j], seqs[j], cb, wb);
    } else {
      snprintf(msg, len,
               "collective mismatch on group '%s' %s (seq %" PRIu64
               "): rank %d called %s%s, rank %d called %s%s",
               g->label, rs, seqs[0], g->ranks[0], ca, wa, g->ranks[j], cb, wb);
    }
    const tsr_breadcrumb *x = &calls[0]->crumb, *y = &calls[j]->crumb;
    if (calls[0]->label && calls[j]->label &&
        (str_differs(x->callback, y->callback) || str_differs(x->name, y->name) ||
         str_differs(x->op, y->op))) {
      size_t l = strlen(msg);
      snprintf(msg + l, len - l,
               "; the two were running different code: a callback or op made a collective call "
               "that not every member of the group made, or made it in another order");
    }
    return TSR_ECOMM;
  }
  if (calls[0]->kind != TSR_COLL_ALL_TO_ALL) return TSR_OK;
  for (int i = 0; i < n; i++) {
    for (int j = 0; j < n; j++) {
      size_t s = calls[i]->counts[j], r = calls[j]->recv_counts[i];
      if (s == r) continue;
      tsr_call_format(calls[i], n, ca, sizeof ca);
      tsr_call_format(calls[j], n, cb, sizeof cb);
      snprintf(msg, len,
               "collective mismatch on group '%s' %s (seq %" PRIu64
               "): rank %d sends %zu elements to rank %d, which expects %zu; rank %d called %s, "
               "rank %d called %s",
               g->label, rs, seqs[0], g->ranks[i], s, g->ranks[j], r, g->ranks[i], ca, g->ranks[j],
               cb);
      return TSR_ECOMM;
    }
  }
  return TSR_OK;
}

/* ---- Communicator and group handles ---- */

tsr_status tsr_comm_create(const tsr_comm_iface *iface, void *context, int rank, int world,
                           double timeout_s, tsr_comm_t **out) {
  *out = NULL;
  tsr_comm_t *c = calloc(1, sizeof *c);
  if (!c) return TSR_ERROR(TSR_ENOMEM, "rank %d: out of memory for its communicator", rank);
  c->iface = iface;
  c->context = context;
  c->rank = rank;
  c->world = world;
  c->timeout_s = timeout_s;
  *out = c;
  return TSR_OK;
}

static void group_free(tsr_comm_t *c, tsr_group_t *g) {
  if (!g) return;
  if (g->context && c->iface->group_free) c->iface->group_free(g);
  free(g->ranks);
  free(g->label);
  free(g);
}

void tsr_comm_destroy(tsr_comm_t *c) {
  if (!c) return;
  for (int i = 0; i < c->n_groups; i++) group_free(c, c->groups[i]);
  for (int i = 0; i < c->n_counters; i++) free(c->counters[i].label);
  free(c->groups);
  free(c->counters);
  free(c);
}

void tsr_comm_set_device_allocator(tsr_comm_t *c, tsr_allocator *a) {
  if (c->device_alloc && c->iface->release_device) c->iface->release_device(c);
  c->device_alloc = a;
}

int tsr_comm_rank(const tsr_comm_t *c) {
  return c->rank;
}
int tsr_comm_world(const tsr_comm_t *c) {
  return c->world;
}
const char *tsr_comm_backend(const tsr_comm_t *c) {
  return c->iface->name;
}

static char *str_dup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

static int counter_find(const tsr_comm_t *c, const char *label) {
  for (int i = 0; i < c->n_counters; i++)
    if (strcmp(c->counters[i].label, label) == 0) return i;
  return -1;
}

static tsr_status counter_get(tsr_comm_t *c, const char *label, int *out) {
  int i = counter_find(c, label);
  if (i < 0) {
    if (c->n_counters == c->cap_counters) {
      int cap = c->cap_counters ? 2 * c->cap_counters : 8;
      tsr_comm_counter *p = realloc(c->counters, (size_t)cap * sizeof *p);
      if (!p) return TSR_ERROR(TSR_ENOMEM, "rank %d: out of memory for byte counters", c->rank);
      c->counters = p;
      c->cap_counters = cap;
    }
    char *l = str_dup(label);
    if (!l) return TSR_ERROR(TSR_ENOMEM, "rank %d: out of memory for byte counters", c->rank);
    i = c->n_counters++;
    c->counters[i].label = l;
    c->counters[i].bytes = 0;
  }
  *out = i;
  return TSR_OK;
}

tsr_status tsr_comm_group(tsr_comm_t *c, int n, const int *ranks, const char *label,
                          tsr_group_t **out) {
  if (!out) return TSR_ERROR(TSR_EINVAL, "tsr_comm_group: out is NULL");
  *out = NULL;
  if (!c || !ranks || !label || !label[0])
    return TSR_ERROR(TSR_EINVAL, "tsr_comm_group: comm, ranks and a non-empty label are required");
  if (n < 1 || n > c->world)
    return TSR_ERROR(TSR_EINVAL, "group '%s': %d members for a world of %d ranks", label, n,
                     c->world);
  int self = -1;
  for (int i = 0; i < n; i++) {
    if (ranks[i] < 0 || ranks[i] >= c->world)
      return TSR_ERROR(TSR_EINVAL, "group '%s': member %d is rank %d, outside the world [0, %d)",
                       label, i, ranks[i], c->world);
    if (ranks[i] == c->rank) self = i;
    for (int j = 0; j < i; j++)
      if (ranks[j] == ranks[i])
        return TSR_ERROR(TSR_EINVAL, "group '%s': rank %d is listed twice (members %d and %d)",
                         label, ranks[i], j, i);
  }
  if (self < 0) {
    char rs[128];
    return TSR_ERROR(TSR_EINVAL, "group '%s' %s does not contain the calling rank %d", label,
                     tsr_ranks_format(n, ranks, rs, sizeof rs), c->rank);
  }
  for (int i = 0; i < c->n_groups; i++) {
    tsr_group_t *g = c->groups[i];
    if (g->n == n && strcmp(g->label, label) == 0 &&
        memcmp(g->ranks, ranks, (size_t)n * sizeof *ranks) == 0) {
      *out = g;
      return TSR_OK;
    }
  }
  tsr_status st = TSR_OK;
  tsr_group_t *g = calloc(1, sizeof *g);
  if (!g) return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory", label);
  g->comm = c;
  g->n = n;
  g->index = self;
  g->ranks = malloc((size_t)n * sizeof *g->ranks);
  g->label = str_dup(label);
  if (!g->ranks || !g->label) {
    st = TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory", label);
    goto cleanup;
  }
  memcpy(g->ranks, ranks, (size_t)n * sizeof *ranks);
  TSR_CHECK_GOTO(counter_get(c, label, &g->counter), st);
  if (n > 1) TSR_CHECK_GOTO(c->iface->group_init(c, g), st);
  if (c->n_groups == c->cap_groups) {
    int cap = c->cap_groups ? 2 * c->cap_groups : 8;
    tsr_group_t **p = realloc(c->groups, (size_t)cap * sizeof *p);
    if (!p) {
      st = TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory", label);
      goto cleanup;
    }
    c->groups = p;
    c->cap_groups = cap;
  }
  c->groups[c->n_groups++] = g;
  *out = g;
  return TSR_OK;
cleanup:
  group_free(c, g);
  return st;
}

int tsr_group_size(const tsr_group_t *g) {
  return g->n;
}
int tsr_group_index(const tsr_group_t *g) {
  return g->index;
}
int tsr_group_rank(const tsr_group_t *g, int i) {
  return i >= 0 && i < g->n ? g->ranks[i] : -1;
}
const char *tsr_group_label(const tsr_group_t *g) {
  return g->label;
}

/* ---- Byte counters ---- */

uint64_t tsr_comm_bytes(const tsr_comm_t *c, const char *label) {
  int i = label ? counter_find(c, label) : -1;
  return i < 0 ? 0 : c->counters[i].bytes;
}

void tsr_comm_bytes_foreach(const tsr_comm_t *c,
                            void (*fn)(const char *label, uint64_t bytes, void *arg), void *arg) {
  for (int i = 0; i < c->n_counters; i++) fn(c->counters[i].label, c->counters[i].bytes, arg);
}

void tsr_comm_bytes_reset(tsr_comm_t *c) {
  for (int i = 0; i < c->n_counters; i++) c->counters[i].bytes = 0;
}

/* Adds the bytes this member sent to the group's counter and, when the thread records a trace,
 * the call from t0 (tsr_trace_clock at its start) to now. */
static void count_bytes(tsr_group_t *g, uint64_t bytes, const char *call, int64_t t0) {
  g->comm->counters[g->counter].bytes += bytes;
  if (t0 >= 0) tsr_trace_comm(call, g->label, t0, bytes);
}

/* ---- Argument checks ---- */

static tsr_status check_common(const tsr_group_t *g, const char *what, tsr_dtype dt) {
  if (!g) return TSR_ERROR(TSR_EINVAL, "%s: group is NULL", what);
  if ((unsigned)dt >= TSR_DTYPE_COUNT)
    return TSR_ERROR(TSR_EINVAL, "%s on group '%s': invalid dtype %d", what, g->label, (int)dt);
  return TSR_OK;
}

static tsr_status check_op(const tsr_group_t *g, const char *what, tsr_reduce_op op) {
  if (op != TSR_REDUCE_SUM && op != TSR_REDUCE_AVG && op != TSR_REDUCE_MAX)
    return TSR_ERROR(TSR_EINVAL, "%s on group '%s': invalid reduce op %d (sum, avg or max)", what,
                     g->label, (int)op);
  return TSR_OK;
}

static tsr_status check_buf(const tsr_group_t *g, const char *what, const char *name, const void *p,
                            size_t count) {
  if (count > 0 && !p)
    return TSR_ERROR(TSR_EINVAL, "%s on group '%s': %s is NULL for %zu elements", what, g->label,
                     name, count);
  return TSR_OK;
}

static tsr_status check_peer(const tsr_group_t *g, const char *what, const char *name, int peer) {
  if (peer < 0 || peer >= g->n)
    return TSR_ERROR(TSR_EINVAL,
                     "%s on group '%s': %s %d is not a member index (the group has %d members; "
                     "peers are indices into the group, not global ranks)",
                     what, g->label, name, peer, g->n);
  return TSR_OK;
}

static size_t sum_sizes(int n, const size_t *v) {
  size_t s = 0;
  for (int i = 0; i < n; i++) s += v[i];
  return s;
}

/* The explicit per-member counts of a call made with counts == NULL. */
static tsr_status uniform_counts(const tsr_group_t *g, size_t count, size_t **out) {
  size_t *v = malloc((size_t)g->n * sizeof *v);
  if (!v) return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for %d counts", g->label, g->n);
  for (int i = 0; i < g->n; i++) v[i] = count;
  *out = v;
  return TSR_OK;
}

/* ---- Collectives ---- */

tsr_status tsr_comm_all_reduce(tsr_group_t *g, const void *send, void *recv, size_t count,
                               tsr_dtype dt, tsr_reduce_op op) {
  TSR_CHECK(check_common(g, "all_reduce", dt));
  TSR_CHECK(check_op(g, "all_reduce", op));
  TSR_CHECK(check_buf(g, "all_reduce", "send", send, count));
  TSR_CHECK(check_buf(g, "all_reduce", "recv", recv, count));
  size_t es = tsr_dtype_size(dt);
  if (g->n == 1) {
    if (count && send != recv) tsr_memcpy_any(recv, send, count * es);
    return TSR_OK;
  }
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK(tsr_stage_begin(g, &send, count * es, &recv, count * es, &sg));
  tsr_call call = {
      .kind = TSR_COLL_ALL_REDUCE, .dt = dt, .op = op, .count = count, .send = send, .recv = recv};
  stamp(&call, g);
  TSR_CHECK(tsr_stage_end(&sg, g->comm->iface->all_reduce(g, &call)));
  uint64_t own = (uint64_t)tsr_chunk_size((int64_t)count, g->n, g->index) * es;
  count_bytes(g, (uint64_t)count * es - own + own * (uint64_t)(g->n - 1), "all_reduce", t0);
  return TSR_OK;
}

tsr_status tsr_comm_all_gather(tsr_group_t *g, const void *send, size_t send_count, void *recv,
                               const size_t *counts, tsr_dtype dt) {
  TSR_CHECK(check_common(g, "all_gather", dt));
  if (counts && counts[g->index] != send_count)
    return TSR_ERROR(TSR_EINVAL,
                     "all_gather on group '%s': send_count %zu but counts[%d] (this member) is %zu",
                     g->label, send_count, g->index, counts[g->index]);
  TSR_CHECK(check_buf(g, "all_gather", "send", send, send_count));
  size_t es = tsr_dtype_size(dt), total = counts ? sum_sizes(g->n, counts) : send_count * g->n;
  TSR_CHECK(check_buf(g, "all_gather", "recv", recv, total));
  if (g->n == 1) {
    if (send_count && send != recv) tsr_memcpy_any(recv, send, send_count * es);
    return TSR_OK;
  }
  tsr_status st = TSR_OK;
  size_t *owned = NULL;
  if (!counts) TSR_CHECK_GOTO(uniform_counts(g, send_count, &owned), st);
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK_GOTO(tsr_stage_begin(g, &send, send_count * es, &recv, total * es, &sg), st);
  tsr_call call = {.kind = TSR_COLL_ALL_GATHER,
                   .dt = dt,
                   .counts = counts ? counts : owned,
                   .send = send,
                   .recv = recv};
  stamp(&call, g);
  TSR_CHECK_GOTO(tsr_stage_end(&sg, g->comm->iface->all_gather(g, &call)), st);
  count_bytes(g, (uint64_t)send_count * es * (uint64_t)(g->n - 1), "all_gather", t0);
cleanup:
  free(owned);
  return st;
}

tsr_status tsr_comm_reduce_scatter(tsr_group_t *g, const void *send, void *recv, size_t recv_count,
                                   const size_t *counts, tsr_dtype dt, tsr_reduce_op op) {
  TSR_CHECK(check_common(g, "reduce_scatter", dt));
  TSR_CHECK(check_op(g, "reduce_scatter", op));
  if (counts && counts[g->index] != recv_count)
    return TSR_ERROR(TSR_EINVAL,
                     "reduce_scatter on group '%s': recv_count %zu but counts[%d] (this member) "
                     "is %zu",
                     g->label, recv_count, g->index, counts[g->index]);
  size_t es = tsr_dtype_size(dt), total = counts ? sum_sizes(g->n, counts) : recv_count * g->n;
  TSR_CHECK(check_buf(g, "reduce_scatter", "send", send, total));
  TSR_CHECK(check_buf(g, "reduce_scatter", "recv", recv, recv_count));
  if (g->n == 1) {
    if (recv_count && send != recv) tsr_memcpy_any(recv, send, recv_count * es);
    return TSR_OK;
  }
  tsr_status st = TSR_OK;
  size_t *owned = NULL;
  if (!counts) TSR_CHECK_GOTO(uniform_counts(g, recv_count, &owned), st);
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK_GOTO(tsr_stage_begin(g, &send, total * es, &recv, recv_count * es, &sg), st);
  tsr_call call = {.kind = TSR_COLL_REDUCE_SCATTER,
                   .dt = dt,
                   .op = op,
                   .counts = counts ? counts : owned,
                   .send = send,
                   .recv = recv};
  stamp(&call, g);
  TSR_CHECK_GOTO(tsr_stage_end(&sg, g->comm->iface->reduce_scatter(g, &call)), st);
  count_bytes(g, (uint64_t)(total - recv_count) * es, "reduce_scatter", t0);
cleanup:
  free(owned);
  return st;
}

tsr_status tsr_comm_all_to_all(tsr_group_t *g, const void *send, const size_t *send_counts,
                               void *recv, const size_t *recv_counts, tsr_dtype dt) {
  TSR_CHECK(check_common(g, "all_to_all", dt));
  if (!send_counts || !recv_counts)
    return TSR_ERROR(TSR_EINVAL,
                     "all_to_all on group '%s': send_counts and recv_counts are "
                     "required",
                     g->label);
  size_t es = tsr_dtype_size(dt);
  size_t sent = sum_sizes(g->n, send_counts), got = sum_sizes(g->n, recv_counts);
  TSR_CHECK(check_buf(g, "all_to_all", "send", send, sent));
  TSR_CHECK(check_buf(g, "all_to_all", "recv", recv, got));
  if (g->n == 1) {
    if (send_counts[0] != recv_counts[0])
      return TSR_ERROR(TSR_ECOMM,
                       "collective mismatch on group '%s' [%d]: all_to_all sends %zu elements to "
                       "itself but expects %zu",
                       g->label, g->ranks[0], send_counts[0], recv_counts[0]);
    if (sent && send != recv) tsr_memcpy_any(recv, send, sent * es);
    return TSR_OK;
  }
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK(tsr_stage_begin(g, &send, sent * es, &recv, got * es, &sg));
  tsr_call call = {.kind = TSR_COLL_ALL_TO_ALL,
                   .dt = dt,
                   .counts = send_counts,
                   .recv_counts = recv_counts,
                   .send = send,
                   .recv = recv};
  stamp(&call, g);
  TSR_CHECK(tsr_stage_end(&sg, g->comm->iface->all_to_all(g, &call)));
  count_bytes(g, (uint64_t)(sent - send_counts[g->index]) * es, "all_to_all", t0);
  return TSR_OK;
}

tsr_status tsr_comm_broadcast(tsr_group_t *g, void *buf, size_t count, tsr_dtype dt, int root) {
  TSR_CHECK(check_common(g, "broadcast", dt));
  TSR_CHECK(check_peer(g, "broadcast", "root", root));
  TSR_CHECK(check_buf(g, "broadcast", "buf", buf, count));
  if (g->n == 1) return TSR_OK;
  size_t bytes = count * tsr_dtype_size(dt);
  const void *send = buf;
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK(tsr_stage_begin(g, &send, bytes, &buf, bytes, &sg));
  tsr_call call = {
      .kind = TSR_COLL_BROADCAST, .dt = dt, .root = root, .count = count, .send = buf, .recv = buf};
  stamp(&call, g);
  TSR_CHECK(tsr_stage_end(&sg, g->comm->iface->broadcast(g, &call)));
  /* the root sends to every other member; the others send nothing */
  uint64_t sent =
      g->index == root ? (uint64_t)count * tsr_dtype_size(dt) * (uint64_t)(g->n - 1) : 0;
  count_bytes(g, sent, "broadcast", t0);
  return TSR_OK;
}

tsr_status tsr_comm_barrier(tsr_group_t *g) {
  if (!g) return TSR_ERROR(TSR_EINVAL, "barrier: group is NULL");
  if (g->n == 1) return TSR_OK;
  tsr_call call = {.kind = TSR_COLL_BARRIER, .dt = TSR_F32};
  stamp(&call, g);
  int64_t t0 = tsr_trace_clock();
  TSR_CHECK(g->comm->iface->barrier(g, &call));
  count_bytes(g, 0, "barrier", t0);
  return TSR_OK;
}

/* ---- Point to point ---- */

tsr_status tsr_comm_send(tsr_group_t *g, int peer, const void *buf, size_t count, tsr_dtype dt) {
  TSR_CHECK(check_common(g, "send", dt));
  TSR_CHECK(check_peer(g, "send", "peer", peer));
  TSR_CHECK(check_buf(g, "send", "buf", buf, count));
  if (peer == g->index)
    return TSR_ERROR(TSR_EINVAL, "send on group '%s': rank %d sends to itself; use sendrecv",
                     g->label, g->ranks[peer]);
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK(tsr_stage_begin(g, &buf, count * tsr_dtype_size(dt), NULL, 0, &sg));
  TSR_CHECK(tsr_stage_end(&sg, g->comm->iface->send(g, peer, buf, count, dt)));
  count_bytes(g, (uint64_t)count * tsr_dtype_size(dt), "send", t0);
  return TSR_OK;
}

tsr_status tsr_comm_recv(tsr_group_t *g, int peer, void *buf, size_t count, tsr_dtype dt) {
  TSR_CHECK(check_common(g, "recv", dt));
  TSR_CHECK(check_peer(g, "recv", "peer", peer));
  TSR_CHECK(check_buf(g, "recv", "buf", buf, count));
  if (peer == g->index)
    return TSR_ERROR(TSR_EINVAL, "recv on group '%s': rank %d receives from itself; use sendrecv",
                     g->label, g->ranks[peer]);
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK(tsr_stage_begin(g, NULL, 0, &buf, count * tsr_dtype_size(dt), &sg));
  TSR_CHECK(tsr_stage_end(&sg, g->comm->iface->recv(g, peer, buf, count, dt)));
  count_bytes(g, 0, "recv", t0);
  return TSR_OK;
}

tsr_status tsr_comm_sendrecv(tsr_group_t *g, int send_peer, const void *send, size_t send_count,
                             int recv_peer, void *recv, size_t recv_count, tsr_dtype dt) {
  TSR_CHECK(check_common(g, "sendrecv", dt));
  TSR_CHECK(check_peer(g, "sendrecv", "send_peer", send_peer));
  TSR_CHECK(check_peer(g, "sendrecv", "recv_peer", recv_peer));
  TSR_CHECK(check_buf(g, "sendrecv", "send", send, send_count));
  TSR_CHECK(check_buf(g, "sendrecv", "recv", recv, recv_count));
  size_t es = tsr_dtype_size(dt);
  /* A ring of one (or a member talking to itself) is a local copy that moves nothing. */
  if (send_peer == g->index && recv_peer == g->index) {
    if (send_count != recv_count)
      return TSR_ERROR(TSR_ECOMM,
                       "sendrecv on group '%s': rank %d sends %zu elements to itself but expects "
                       "%zu",
                       g->label, g->ranks[g->index], send_count, recv_count);
    if (send_count && send != recv) tsr_memcpy_any(recv, send, send_count * es);
    return TSR_OK;
  }
  if (send_peer == g->index || recv_peer == g->index)
    return TSR_ERROR(TSR_EINVAL,
                     "sendrecv on group '%s': rank %d exchanges with itself on one side only "
                     "(send_peer %d, recv_peer %d)",
                     g->label, g->ranks[g->index], send_peer, recv_peer);
  int64_t t0 = tsr_trace_clock();
  tsr_stage sg;
  TSR_CHECK(tsr_stage_begin(g, &send, send_count * es, &recv, recv_count * es, &sg));
  TSR_CHECK(tsr_stage_end(&sg, g->comm->iface->sendrecv(g, send_peer, send, send_count, recv_peer,
                                                        recv, recv_count, dt)));
  count_bytes(g, (uint64_t)send_count * es, "sendrecv", t0);
  return TSR_OK;
}
