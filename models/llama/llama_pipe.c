/* A schedule's action list run on this rank's pipeline stages (see llama_pipe.h).
 *
 * The schedule orders each rank's forwards and backwards; the transfers between stages follow
 * from its simulated timeline (tsr_pipe_timeline_build). Every message (an activation going to
 * the next stage, a gradient coming back) gets the simulated time its producer ends at, and each
 * rank runs the messages it takes part in in one global order, by (time, neighbour pair), before
 * the first computation that starts at or after that time. Sends may wait for their receive
 * (the local backend, MPI for large messages), and a rank may talk to both neighbours, and with
 * interleaved chunks round the ring, so an order of its own per rank could wait in a cycle; one
 * order that every rank follows cannot. A pair's two messages at one time (1F1B's steady state:
 * an activation down while a gradient comes up) run as one sendrecv.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama_impl.h"
#include "llama_pipe.h"
#include "tessera/breadcrumb.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Per (microbatch, chunk) state on this rank. */
typedef struct mb_state {
  int64_t row0, rows, valid; /* shared by the chunks of a microbatch */
  tsr_tape_t *tape;
  tsr_var *ids, *labels; /* leaves on this stage's mesh, when the stage needs them */
  tsr_var *seg, *pos;    /* (rows, seq) document leaves on this stage's mesh, or NULL */
  tsr_var *in;           /* input activation (stages > 0) */
  tsr_var *out;          /* forward output, owned by the tape */
  tsr_var *loss;         /* last stage */
  tsr_dtensor *gout;     /* gradient of out received from the next stage */
  tsr_dtensor *gin;      /* gradient of in to send to the previous stage */
  bool live;             /* forwarded and its tape not yet released */
} mb_state;

/* A transfer between two ranks' stages: time and pair order it; up to one message each way. */
typedef struct pipe_msg {
  double time;
  int pair;      /* neighbour pair index (see pair_index) */
  int peer;      /* the other rank's pp index */
  int send_kind; /* TSR_PIPE_SEND_ACT / SEND_GRAD, or -1 */
  int send_mb, send_chunk;
  int recv_kind; /* TSR_PIPE_RECV_ACT / RECV_GRAD, or -1 */
  int recv_mb, recv_chunk;
} pipe_msg;

typedef struct pipe_ctx {
  tsr_llama_t *m;
  tsr_rank_t *r;
  int stage;      /* pp index of this rank */
  int P, v, V, M; /* pp ranks, chunks per rank, stages P * v, microbatches */
  int64_t seq;
  const tsr_mesh_t *mesh; /* this rank's */
  const int *coords;
  mb_state *mb;   /* (M * v) index k * v + chunk */
  double w_total; /* valid tokens of the step */
  double loss;
  bool train, want_logits;
  tsr_tensor **parts; /* (M) full logits per microbatch, untracked */
  int in_flight, peak;
} pipe_ctx;

static mb_state *state(pipe_ctx *p, int k, int chunk) {
  return &p->mb[k * p->v + chunk];
}

static int vstage(const pipe_ctx *p, int chunk) {
  return chunk * p->P + p->stage;
}

/* Pairs (i, i + 1 mod P) are numbered i; with P = 2 both directions are pair 0. */
static int pair_index(int a, int b, int P) {
  int lo = a < b ? a : b, hi = a < b ? b : a;
  return hi == lo + 1 ? lo : P - 1;
}

static tsr_status peer_group(pipe_ctx *p, int peer_pp, tsr_group_t **out) {
  const tsr_mesh_t *other = tsr_llama_stage_mesh(p->m, peer_pp);
  int me = tsr_rank_id(p->r), peer = tsr_mesh_rank_at(other, p->coords);
  int pair[2] = {me < peer ? me : peer, me < peer ? peer : me};
  return tsr_comm_group(tsr_rank_comm(p->r), 2, pair, tsr_llama_stage_dim(p->m), out);
}

/* A (rows, seq, C) f32 DTensor on this rank's mesh placed as the stage-boundary placements of
 * `boundary`, with an uninitialised local from the rank's allocator, to receive into. */
static tsr_status boundary_tensor(pipe_ctx *p, int boundary, int64_t rows, tsr_dtensor **out) {
  int64_t shape[3] = {rows, p->seq, tsr_llama_get_config(p->m)->hidden_size}, ls[TSR_MAX_DIMS];
  tsr_placement pl[TSR_MAX_MESH_DIMS];
  tsr_llama_stage_io_placements(p->m, boundary, pl);
  tsr_dtensor_local_shape(p->mesh, pl, 3, shape, tsr_rank_id(p->r), ls, NULL);
  tsr_tensor *local = NULL;
  TSR_CHECK(tsr_tensor_new(tsr_rank_allocator(p->r), TSR_F32, 3, ls, &local));
  tsr_status st = tsr_dtensor_from_local(p->r, p->mesh, local, shape, pl, out);
  if (st != TSR_OK) tsr_tensor_free(local);
  return st;
}

static tsr_status host_leaf(pipe_ctx *p, const int32_t *data, const mb_state *b, tsr_var **out) {
  return tsr_llama_batch(p->r, p->mesh, b->rows, p->seq, data + b->row0 * p->seq, out);
}

static void mb_release(pipe_ctx *p, mb_state *b) {
  if (b->tape) tsr_tape_reset(b->tape);
  tsr_var_free(b->ids);
  tsr_var_free(b->labels);
  tsr_var_free(b->seg);
  tsr_var_free(b->pos);
  b->seg = b->pos = NULL;
  tsr_var_free(b->in);
  tsr_dtensor_free(b->gout);
  b->ids = b->labels = b->in = b->out = b->loss = NULL;
  b->gout = NULL;
  if (b->live) p->in_flight--;
  b->live = false;
}

static double weight_of(const pipe_ctx *p, const mb_state *b) {
  return p->w_total > 0 ? (double)b->valid / p->w_total : 0.0;
}

static tsr_status do_forward(pipe_ctx *p, int k, int chunk, const int32_t *ids,
                             const int32_t *labels) {
  mb_state *b = state(p, k, chunk);
  int s = vstage(p, chunk), last = p->V - 1;
  if (s > 0 && !b->in)
    return TSR_ERROR(TSR_EINVAL,
                     "pipeline schedule: forward of microbatch %d on stage %d before its input "
                     "was received",
                     k, s);
  if (s == 0) TSR_CHECK(host_leaf(p, ids, b, &b->ids));
  if (s == last) TSR_CHECK(host_leaf(p, labels, b, &b->labels));
  tsr_var *logits = NULL;
  if (p->m->doc_host_seg) { /* every stage's attention reads the documents */
    TSR_CHECK(host_leaf(p, p->m->doc_host_seg, b, &b->seg));
    TSR_CHECK(host_leaf(p, p->m->doc_host_pos, b, &b->pos));
  }
  TSR_CHECK(tsr_llama_set_documents(p->m, b->seg, b->pos));
  tsr_status fst = tsr_llama_forward_stage(p->m, b->tape, s, b->ids, b->in, b->labels, &b->out,
                                           &logits, &b->loss);
  tsr_llama_set_documents(p->m, NULL, NULL);
  TSR_CHECK(fst);
  b->live = true;
  if (++p->in_flight > p->peak) p->peak = p->in_flight;
  if (s == last) {
    tsr_tensor *full = NULL;
    TSR_CHECK(tsr_dtensor_full_tensor(p->r, b->loss->value, &full));
    p->loss += weight_of(p, b) * tsr_tensor_get(full, NULL);
    tsr_tensor_free(full);
    if (p->want_logits) {
      TSR_CHECK(tsr_dtensor_full_tensor(p->r, logits->value, &full));
      tsr_status st = tsr_tensor_cast(full, TSR_F32, &p->parts[k]);
      tsr_tensor_free(full);
      TSR_CHECK(st);
    }
    /* without backward, the last stage is done with it; others once it is sent */
    if (!p->train) mb_release(p, b);
  }
  return TSR_OK;
}

/* The backward of one (microbatch, chunk): whole (kind BACKWARD), its input part
 * (BACKWARD_INPUT: the gradient the previous stage waits for, weight gradients deferred on the
 * tape) or its weight part (BACKWARD_WEIGHT). */
static tsr_status backward_of(pipe_ctx *p, int k, int chunk, int kind) {
  mb_state *b = state(p, k, chunk);
  int s = vstage(p, chunk);
  if (kind == TSR_PIPE_BACKWARD_WEIGHT) {
    TSR_CHECK(tsr_tape_backward_weight(b->tape));
    mb_release(p, b);
    return TSR_OK;
  }
  tsr_var *from = NULL;
  tsr_dtensor *g = NULL;
  if (s == p->V - 1) {
    /* the microbatch's mean loss weighs as its share of the step's valid tokens */
    tsr_tensor *one = NULL;
    TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 0, NULL, &one));
    *(float *)tsr_tensor_data(one) = (float)weight_of(p, b);
    tsr_placement rep[TSR_MAX_MESH_DIMS];
    for (int i = 0; i < tsr_mesh_ndim(p->mesh); i++) rep[i] = tsr_replicate();
    tsr_status st = tsr_dtensor_distribute(p->r, b->loss->value->mesh, one, rep, &g);
    tsr_tensor_free(one);
    TSR_CHECK(st);
    from = b->loss;
  } else {
    if (!b->gout)
      return TSR_ERROR(TSR_EINVAL,
                       "pipeline schedule: backward of microbatch %d on stage %d "
                       "before its gradient was received",
                       k, s);
    g = b->gout;
    b->gout = NULL;
    from = b->out;
  }
  if (kind == TSR_PIPE_BACKWARD_INPUT)
    TSR_CHECK(tsr_tape_backward_input(b->tape, from, g, &b->in, s > 0 ? 1 : 0));
  else
    TSR_CHECK(tsr_tape_backward_with(b->tape, from, g));
  if (s > 0) {
    tsr_placement pl[TSR_MAX_MESH_DIMS];
    tsr_llama_stage_io_placements(p->m, s - 1, pl);
    if (b->in->grad)
      TSR_CHECK(tsr_dtensor_redistribute(p->r, b->in->grad, p->mesh, pl, &b->gin));
    else
      TSR_CHECK(tsr_dtensor_zeros(p->r, p->mesh, TSR_F32, 3, b->in->value->shape, pl, &b->gin));
  }
  if (kind == TSR_PIPE_BACKWARD) mb_release(p, b);
  return TSR_OK;
}

/* backward_of with the microbatch's documents set: a checkpointed layer recomputes its forward
 * in the backward, and must mask as the forward did. */
static tsr_status do_backward(pipe_ctx *p, int k, int chunk, int kind) {
  mb_state *b = state(p, k, chunk);
  TSR_CHECK(tsr_llama_set_documents(p->m, b->seg, b->pos));
  tsr_status st = backward_of(p, k, chunk, kind);
  tsr_llama_set_documents(p->m, NULL, NULL); /* the leaves may be released by now */
  return st;
}

/* The buffer a message sends, or a fresh one it receives into. */
static tsr_status msg_buffer(pipe_ctx *p, int kind, int k, int chunk, void **buf, size_t *count) {
  mb_state *b = state(p, k, chunk);
  const tsr_tensor *t = NULL;
  int s = vstage(p, chunk);
  if (kind == TSR_PIPE_SEND_ACT && b->out) {
    t = b->out->value->local;
  } else if (kind == TSR_PIPE_SEND_GRAD && b->gin) {
    t = b->gin->local;
  } else if (kind == TSR_PIPE_RECV_ACT) {
    tsr_dtensor *d = NULL;
    TSR_CHECK(boundary_tensor(p, s - 1, b->rows, &d));
    tsr_status st = tsr_var_new_leaf(d, p->train, NULL, &b->in);
    if (st != TSR_OK) {
      tsr_dtensor_free(d);
      return st;
    }
    t = d->local;
  } else if (kind == TSR_PIPE_RECV_GRAD) {
    TSR_CHECK(boundary_tensor(p, s, b->rows, &b->gout));
    t = b->gout->local;
  }
  if (!t)
    return TSR_ERROR(TSR_EINVAL,
                     "pipeline schedule: stage %d sends microbatch %d before computing it", s, k);
  *buf = tsr_tensor_data(t);
  *count = (size_t)tsr_tensor_numel(t);
  return TSR_OK;
}

static void after_send(pipe_ctx *p, int kind, int k, int chunk) {
  mb_state *b = state(p, k, chunk);
  if (kind == TSR_PIPE_SEND_ACT && !p->train) mb_release(p, b);
  if (kind == TSR_PIPE_SEND_GRAD) {
    tsr_dtensor_free(b->gin);
    b->gin = NULL;
  }
}

static tsr_status run_msg(pipe_ctx *p, const pipe_msg *g, tsr_pipe_result *res) {
  double t0 = now_s();
  tsr_group_t *grp = NULL;
  TSR_CHECK(peer_group(p, g->peer, &grp));
  int peer = 1 - tsr_group_index(grp);
  void *sbuf = NULL, *rbuf = NULL;
  size_t sn = 0, rn = 0;
  if (g->send_kind >= 0)
    TSR_CHECK(msg_buffer(p, g->send_kind, g->send_mb, g->send_chunk, &sbuf, &sn));
  if (g->recv_kind >= 0)
    TSR_CHECK(msg_buffer(p, g->recv_kind, g->recv_mb, g->recv_chunk, &rbuf, &rn));
  if (g->send_kind >= 0 && g->recv_kind >= 0)
    TSR_CHECK(tsr_comm_sendrecv(grp, peer, sbuf, sn, peer, rbuf, rn, TSR_F32));
  else if (g->send_kind >= 0)
    TSR_CHECK(tsr_comm_send(grp, peer, sbuf, sn, TSR_F32));
  else
    TSR_CHECK(tsr_comm_recv(grp, peer, rbuf, rn, TSR_F32));
  double t1 = now_s();
  if (g->send_kind >= 0) {
    after_send(p, g->send_kind, g->send_mb, g->send_chunk);
    res->events[res->nevents++] = (tsr_pipe_event){g->send_kind, g->send_mb, g->send_chunk, t0, t1};
  }
  if (g->recv_kind >= 0)
    res->events[res->nevents++] = (tsr_pipe_event){g->recv_kind, g->recv_mb, g->recv_chunk, t0, t1};
  return TSR_OK;
}

static int by_time_then_pair(const void *a, const void *b) {
  const pipe_msg *x = a, *y = b;
  if (x->time != y->time) return x->time < y->time ? -1 : 1;
  return x->pair - y->pair;
}

static bool is_backward(int kind) {
  return kind == TSR_PIPE_BACKWARD || kind == TSR_PIPE_BACKWARD_INPUT;
}

/* The messages this rank takes part in, from every rank's simulated actions, in run order. */
static tsr_status rank_messages(const pipe_ctx *p, const tsr_pipe_timeline *tl, pipe_msg **out,
                                int *n) {
  int cap = 2 * p->M * p->V + 1, k = 0;
  pipe_msg *g = calloc((size_t)cap, sizeof *g);
  if (!g) return TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for %d messages", cap);
  for (int r = 0; r < p->P; r++)
    for (int i = 0; i < tl->nops[r]; i++) {
      const tsr_pipe_event *e = &tl->ops[r][i];
      int s = e->chunk * p->P + r, to;
      int send = -1, recv = -1;
      if (e->kind == TSR_PIPE_FORWARD && s < p->V - 1)
        to = s + 1, send = TSR_PIPE_SEND_ACT, recv = TSR_PIPE_RECV_ACT;
      else if (is_backward(e->kind) && s > 0)
        to = s - 1, send = TSR_PIPE_SEND_GRAD, recv = TSR_PIPE_RECV_GRAD;
      else
        continue;
      int tr = to % p->P, tc = to / p->P;
      if (r != p->stage && tr != p->stage) continue;
      pipe_msg m = {e->t1, pair_index(r, tr, p->P), r == p->stage ? tr : r, -1, 0, 0, -1, 0, 0};
      if (r == p->stage)
        m.send_kind = send, m.send_mb = e->microbatch, m.send_chunk = e->chunk;
      else
        m.recv_kind = recv, m.recv_mb = e->microbatch, m.recv_chunk = tc;
      g[k++] = m;
    }
  qsort(g, (size_t)k, sizeof *g, by_time_then_pair);
  /* a pair's two messages at one time travel as one sendrecv */
  int j = 0;
  for (int i = 0; i < k; i++) {
    if (j > 0 && g[j - 1].time == g[i].time && g[j - 1].pair == g[i].pair) {
      if ((g[i].send_kind >= 0 && g[j - 1].send_kind >= 0) ||
          (g[i].recv_kind >= 0 && g[j - 1].recv_kind >= 0)) {
        free(g);
        return TSR_ERROR(TSR_EINTERNAL, "pipeline: two messages one way between a pair at once");
      }
      if (g[i].send_kind >= 0)
        g[j - 1].send_kind = g[i].send_kind, g[j - 1].send_mb = g[i].send_mb,
              g[j - 1].send_chunk = g[i].send_chunk;
      else
        g[j - 1].recv_kind = g[i].recv_kind, g[j - 1].recv_mb = g[i].recv_mb,
              g[j - 1].recv_chunk = g[i].recv_chunk;
      continue;
    }
    g[j++] = g[i];
  }
  *out = g;
  *n = j;
  return TSR_OK;
}

static tsr_status run_rank(pipe_ctx *p, const tsr_pipe_timeline *tl, const int32_t *ids,
                           const int32_t *labels, tsr_pipe_result *res) {
  pipe_msg *msgs = NULL;
  int nmsg = 0, next = 0;
  TSR_CHECK(rank_messages(p, tl, &msgs, &nmsg));
  res->events = calloc((size_t)(tl->nops[p->stage] + 2 * nmsg) + 1, sizeof *res->events);
  tsr_status st = TSR_OK;
  if (!res->events) {
    free(msgs);
    return TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for the trace events");
  }
  for (int i = 0; i < tl->nops[p->stage] && st == TSR_OK; i++) {
    const tsr_pipe_event *a = &tl->ops[p->stage][i];
    while (st == TSR_OK && next < nmsg && msgs[next].time <= a->t0)
      st = run_msg(p, &msgs[next++], res);
    if (st != TSR_OK) break;
    double t0 = now_s();
    tsr_breadcrumb_here()->microbatch = a->microbatch;
    if (a->kind == TSR_PIPE_FORWARD)
      st = do_forward(p, a->microbatch, a->chunk, ids, labels);
    else
      st = do_backward(p, a->microbatch, a->chunk, a->kind);
    tsr_breadcrumb_here()->microbatch = -1;
    res->events[res->nevents++] = (tsr_pipe_event){a->kind, a->microbatch, a->chunk, t0, now_s()};
  }
  while (st == TSR_OK && next < nmsg) st = run_msg(p, &msgs[next++], res);
  free(msgs);
  return st;
}

static tsr_status broadcast_results(pipe_ctx *p, const tsr_mesh_t *job_mesh, int64_t rows,
                                    tsr_pipe_result *res) {
  int dim = tsr_mesh_find_dim(job_mesh, tsr_llama_stage_dim(p->m));
  res->loss = p->loss;
  if (dim < 0 || p->P == 1) {
    if (p->want_logits) return tsr_tensor_cat(p->parts, p->M, 0, &res->logits);
    return TSR_OK;
  }
  tsr_group_t *g = NULL;
  TSR_CHECK(tsr_mesh_group(job_mesh, tsr_rank_comm(p->r), 1u << dim, &g));
  int root = p->P - 1;           /* members are in pp order; the last stage is on the last */
  float loss = (float)res->loss; /* the comm has no f64; the loss is logged and dumped as f32 */
  TSR_CHECK(tsr_comm_broadcast(g, &loss, 1, TSR_F32, root));
  res->loss = loss;
  if (!p->want_logits) return TSR_OK;
  if (p->stage == root) {
    TSR_CHECK(tsr_tensor_cat(p->parts, p->M, 0, &res->logits));
  } else {
    int64_t shape[3] = {rows, p->seq, tsr_llama_get_config(p->m)->vocab_size};
    TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 3, shape, &res->logits));
  }
  return tsr_comm_broadcast(g, tsr_tensor_data(res->logits), (size_t)tsr_tensor_numel(res->logits),
                            TSR_F32, root);
}

tsr_status tsr_llama_pipe_documents(tsr_llama_t *m, const int32_t *seg, const int32_t *pos) {
  if (!seg != !pos)
    return TSR_ERROR(TSR_EINVAL, "document masking takes both segment ids and positions");
  m->doc_host_seg = seg;
  m->doc_host_pos = pos;
  return TSR_OK;
}

tsr_status tsr_llama_pipe_step(tsr_llama_t *m, const tsr_mesh_t *job_mesh,
                               const tsr_schedule *sched, int microbatches, const int32_t *ids,
                               const int32_t *labels, int64_t rows, int64_t seq, bool train,
                               bool want_logits, tsr_pipe_result *res) {
  memset(res, 0, sizeof *res);
  if (microbatches < 1 || microbatches > rows)
    return TSR_ERROR(TSR_EINVAL,
                     "pipeline: %d microbatches for a batch of %lld rows; use 1 ..= "
                     "%lld",
                     microbatches, (long long)rows, (long long)rows);
  pipe_ctx p = {.m = m,
                .r = tsr_llama_rank(m),
                .v = tsr_llama_stages_per_rank(m),
                .V = tsr_llama_stage_count(m),
                .M = microbatches,
                .seq = seq,
                .train = train,
                .want_logits = want_logits};
  p.P = p.V / p.v;
  int me = tsr_rank_id(p.r), coords[TSR_MAX_MESH_DIMS];
  p.stage = -1;
  for (int s = 0; s < p.P && p.stage < 0; s++)
    if (tsr_mesh_contains(tsr_llama_stage_mesh(m, s), me)) p.stage = s;
  if (p.stage < 0) return TSR_ERROR(TSR_EINVAL, "pipeline: rank %d is on no stage", me);
  res->stage = p.stage;
  p.mesh = tsr_llama_stage_mesh(m, p.stage);
  tsr_mesh_coords(p.mesh, me, coords);
  p.coords = coords;
  tsr_pipe_timeline tl = {0};
  tsr_status st = tsr_pipe_timeline_build(sched, p.P, p.v, p.M, train, 1.0, 2.0, &tl);
  if (st != TSR_OK) return st;
  p.mb = calloc((size_t)p.M * (size_t)p.v, sizeof *p.mb);
  p.parts = calloc((size_t)p.M, sizeof *p.parts);
  if (!p.mb || !p.parts) {
    st = TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for %d microbatches", p.M);
    goto cleanup;
  }
  int64_t base = rows / p.M, extra = rows % p.M, row = 0;
  for (int k = 0; k < p.M; k++) {
    int64_t rows_k = base + (k < extra), valid = 0;
    for (int64_t i = row * seq; i < (row + rows_k) * seq; i++) valid += labels[i] != -100;
    for (int c = 0; c < p.v; c++) {
      mb_state *b = state(&p, k, c);
      b->row0 = row, b->rows = rows_k, b->valid = valid;
      TSR_CHECK_GOTO(tsr_tape_new(p.r, &b->tape), st);
      tsr_tape_set_recording(b->tape, train);
    }
    p.w_total += (double)valid;
    row += rows_k;
  }
  TSR_CHECK_GOTO(run_rank(&p, &tl, ids, labels, res), st);
  if (p.in_flight != 0) {
    st = TSR_ERROR(TSR_EINVAL,
                   "pipeline schedule '%s': rank %d ends the step holding %d microbatches' "
                   "activations",
                   sched->name, p.stage, p.in_flight);
    goto cleanup;
  }
  res->peak_in_flight = p.peak;
  st = broadcast_results(&p, job_mesh, rows, res);
cleanup:
  for (int k = 0; p.mb && k < p.M * p.v; k++) {
    mb_release(&p, &p.mb[k]);
    tsr_dtensor_free(p.mb[k].gin);
    tsr_tape_free(p.mb[k].tape);
  }
  for (int k = 0; p.parts && k < p.M; k++) tsr_tensor_free(p.parts[k]);
  free(p.mb);
  free(p.parts);
  tsr_pipe_timeline_free(&tl);
  if (st != TSR_OK) tsr_pipe_result_free(res);
  return st;
}

void tsr_pipe_result_free(tsr_pipe_result *res) {
  tsr_tensor_free(res->logits);
  free(res->events);
  res->logits = NULL;
  res->events = NULL;
  res->nevents = 0;
}

/* ---- simulated timeline ---- */

static bool is_compute(int kind) {
  return kind == TSR_PIPE_FORWARD || kind == TSR_PIPE_BACKWARD || kind == TSR_PIPE_BACKWARD_INPUT ||
         kind == TSR_PIPE_BACKWARD_WEIGHT;
}

void tsr_pipe_timeline_free(tsr_pipe_timeline *tl) {
  for (int s = 0; tl->ops && s < tl->stages; s++) free(tl->ops[s]);
  free(tl->ops);
  free(tl->nops);
  tl->ops = NULL;
  tl->nops = NULL;
}

/* Builds rank r's list into tl->ops[r], compute actions only, checked. */
static tsr_status rank_list(const tsr_schedule *sched, int r, bool train, tsr_pipe_timeline *tl,
                            int *seen) {
  int S = tl->stages, v = tl->chunks, M = tl->microbatches, cap = 8 * M * v + 16, got = 0;
  tsr_pipe_action *acts = malloc((size_t)cap * sizeof *acts);
  tl->ops[r] = calloc((size_t)cap, sizeof *tl->ops[r]);
  if (!acts || !tl->ops[r]) {
    free(acts);
    return TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for %d actions", cap);
  }
  tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(sched->owner, "schedule", sched->name, "build");
  tsr_status st = sched->build(S, M, r, acts, cap, &got, sched->ctx);
  tsr_breadcrumb_leave(&crumb);
  if (st != TSR_OK) {
    free(acts);
    return tsr_error_prefix(st, "pipeline schedule '%s'", sched->name);
  }
  /* seen[(k * v + c) * 4 + part]: forward, whole backward, input part, weight part */
  memset(seen, 0, sizeof *seen * (size_t)M * (size_t)v * 4);
  int n = 0;
  for (int i = 0; i < got && st == TSR_OK; i++) {
    const tsr_pipe_action *a = &acts[i];
    if (a->microbatch < 0 || a->microbatch >= M || a->chunk < 0 || a->chunk >= v ||
        (int)a->kind < 0 || (int)a->kind > TSR_PIPE_BACKWARD_WEIGHT) {
      st = TSR_ERROR(TSR_EINVAL,
                     "pipeline schedule '%s': action %d of rank %d (kind %d) names microbatch %d "
                     "chunk %d (have %d microbatches, %d chunks)",
                     sched->name, i, r, (int)a->kind, a->microbatch, a->chunk, M, v);
      break;
    }
    if (!is_compute(a->kind) || (!train && a->kind != TSR_PIPE_FORWARD)) continue;
    int part = a->kind == TSR_PIPE_FORWARD          ? 0
               : a->kind == TSR_PIPE_BACKWARD       ? 1
               : a->kind == TSR_PIPE_BACKWARD_INPUT ? 2
                                                    : 3;
    int *c = &seen[(a->microbatch * v + a->chunk) * 4];
    if (c[part]++ || (part > 0 && !c[0]) || (part == 3 && !c[2]) || (part == 1 && c[2]) ||
        (part == 2 && c[1]))
      st = TSR_ERROR(TSR_EINVAL,
                     "pipeline schedule '%s': rank %d runs %s of microbatch %d chunk %d out of "
                     "order (each is forwarded once, then backwarded once, whole or input part "
                     "before weight part)",
                     sched->name, r,
                     part == 0   ? "the forward"
                     : part == 3 ? "a weight part"
                                 : "a backward",
                     a->microbatch, a->chunk);
    tl->ops[r][n++] = (tsr_pipe_event){a->kind, a->microbatch, a->chunk, -1, -1};
  }
  for (int k = 0; k < M * v && st == TSR_OK; k++) {
    const int *c = &seen[k * 4];
    if (!c[0] || (train && !(c[1] || (c[2] && c[3]))))
      st = TSR_ERROR(TSR_EINVAL, "pipeline schedule '%s': rank %d never %s microbatch %d chunk %d",
                     sched->name, r, c[0] ? "finishes the backward of" : "forwards", k / v, k % v);
  }
  tl->nops[r] = n;
  free(acts);
  return st;
}

tsr_status tsr_pipe_timeline_build(const tsr_schedule *sched, int S, int v, int M, bool train,
                                   double tf, double tb, tsr_pipe_timeline *tl) {
  memset(tl, 0, sizeof *tl);
  if (S < 1 || v < 1 || M < 1)
    return TSR_ERROR(TSR_EINVAL, "pipeline: %d ranks, %d chunks, %d microbatches", S, v, M);
  tl->stages = S, tl->chunks = v, tl->microbatches = M;
  int V = S * v;
  tl->nops = calloc((size_t)S, sizeof *tl->nops);
  tl->ops = calloc((size_t)S, sizeof *tl->ops);
  int *seen = malloc(sizeof *seen * (size_t)M * (size_t)v * 4), *pos = calloc((size_t)S, 4);
  double *end = malloc(sizeof *end * (size_t)V * (size_t)M * 3),
         *clock = calloc((size_t)S, sizeof *clock);
  tsr_status st = TSR_OK;
  if (!tl->nops || !tl->ops || !seen || !pos || !end || !clock) {
    st = TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory simulating %d ranks", S);
    goto cleanup;
  }
  for (int r = 0; r < S && st == TSR_OK; r++) st = rank_list(sched, r, train, tl, seen);
  if (st != TSR_OK) goto cleanup;
  for (int i = 0; i < V * M * 3; i++) end[i] = -1.0;
#define END(s, k, part) end[((s)*M + (k)) * 3 + (part)]
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < S; r++)
      while (pos[r] < tl->nops[r]) {
        tsr_pipe_event *a = &tl->ops[r][pos[r]];
        int s = a->chunk * S + r, k = a->microbatch;
        double dep, dur;
        if (a->kind == TSR_PIPE_FORWARD) {
          dep = s == 0 ? 0.0 : END(s - 1, k, 0), dur = tf;
        } else if (a->kind == TSR_PIPE_BACKWARD_WEIGHT) {
          dep = END(s, k, 1), dur = tb / 2;
        } else {
          double next = s == V - 1 ? 0.0 : END(s + 1, k, 1);
          dep = END(s, k, 0) < 0 || next < 0 ? -1.0 : fmax(END(s, k, 0), next);
          dur = a->kind == TSR_PIPE_BACKWARD ? tb : tb / 2;
        }
        if (dep < 0) break;
        a->t0 = fmax(clock[r], dep);
        a->t1 = clock[r] = a->t0 + dur;
        END(s, k,
            a->kind == TSR_PIPE_FORWARD           ? 0
            : a->kind == TSR_PIPE_BACKWARD_WEIGHT ? 2
                                                  : 1) = a->t1;
        pos[r]++;
        progress = true;
      }
  }
#undef END
  double busy = 0;
  for (int r = 0; r < S; r++) {
    if (pos[r] < tl->nops[r]) {
      const tsr_pipe_event *a = &tl->ops[r][pos[r]];
      st = TSR_ERROR(TSR_EINVAL,
                     "pipeline schedule '%s' never finishes: rank %d waits forever at its action "
                     "%d (kind %d, microbatch %d, chunk %d) for another stage's",
                     sched->name, r, pos[r], a->kind, a->microbatch, a->chunk);
      goto cleanup;
    }
    tl->span = fmax(tl->span, clock[r]);
    for (int i = 0; i < tl->nops[r]; i++) busy += tl->ops[r][i].t1 - tl->ops[r][i].t0;
  }
  tl->bubble = tl->span > 0 ? 1.0 - busy / ((double)S * tl->span) : 0.0;
cleanup:
  free(seen);
  free(pos);
  free(end);
  free(clock);
  if (st != TSR_OK) tsr_pipe_timeline_free(tl);
  return st;
}

double tsr_pipe_simulate(const tsr_schedule *sched, int S, int v, int M, double tf, double tb,
                         double *span) {
  tsr_pipe_timeline tl;
  if (tsr_pipe_timeline_build(sched, S, v, M, true, tf, tb, &tl) != TSR_OK) return -1.0;
  if (span) *span = tl.span;
  double bubble = tl.bubble;
  tsr_pipe_timeline_free(&tl);
  return bubble;
}

void tsr_pipe_print_timeline(const tsr_schedule *sched, int S, int v, int M, FILE *f) {
  tsr_pipe_timeline tl;
  if (tsr_pipe_timeline_build(sched, S, v, M, true, 1.0, 2.0, &tl) != TSR_OK) {
    fprintf(f, "  schedule %s: no timeline (%d stages x %d chunks, %d microbatches): %s\n",
            sched->name, S, v, M, tsr_last_error());
    return;
  }
  int T = (int)lround(tl.span);
  if (v == 1)
    fprintf(f, "  schedule %s, %d stages, %d microbatches (time units: forward 1, backward 2",
            sched->name, S, M);
  else
    fprintf(f,
            "  schedule %s, %d ranks x %d chunks (stage = chunk x %d + rank; cells: kind, "
            "microbatch, chunk a, b, ...), %d microbatches (time units: forward 1, backward 2",
            sched->name, S, v, S, M);
  fprintf(f, "%s)\n",
          sched->name && strcmp(sched->name, "zero_bubble") == 0
              ? "; I input part 1, W weight part 1"
              : "");
  for (int r = 0; r < S; r++) {
    fprintf(f, v == 1 ? "  stage %d |" : "  rank %d |", r);
    for (int u = 0; u < T; u++) {
      const tsr_pipe_event *hit = NULL;
      for (int i = 0; i < tl.nops[r] && !hit; i++)
        if (u >= tl.ops[r][i].t0 && u < tl.ops[r][i].t1) hit = &tl.ops[r][i];
      if (!hit) {
        fputs(v == 1 ? "  ." : "   .", f);
        continue;
      }
      char kind = hit->kind == TSR_PIPE_FORWARD          ? 'F'
                  : hit->kind == TSR_PIPE_BACKWARD       ? 'B'
                  : hit->kind == TSR_PIPE_BACKWARD_INPUT ? 'I'
                                                         : 'W';
      if (v == 1)
        fprintf(f, " %c%d", kind, hit->microbatch % 10);
      else
        fprintf(f, " %c%d%c", kind, hit->microbatch % 10, 'a' + hit->chunk % 26);
    }
    fputs("\n", f);
  }
  fprintf(f, "  bubble fraction %.3f (analytic: idle / (stages x span))\n", tl.bubble);
  tsr_pipe_timeline_free(&tl);
}
