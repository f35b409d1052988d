/* A schedule's action list run on this rank's pipeline stage (see llama_pipe.h).
 *
 * Transfers are blocking point-to-point messages between the ranks at the same coordinates of two
 * neighbouring stages. A send followed by a receive from the same neighbour (the forward output
 * going down while the next gradient comes up, in 1F1B's steady state) runs as one sendrecv: with
 * sends that wait for their receive, two neighbours each sending first would deadlock.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llama_pipe.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Per microbatch state on this rank. */
typedef struct mb_state {
  int64_t row0, rows, valid;
  tsr_tape_t *tape;
  tsr_var *ids, *labels; /* leaves on this stage's mesh, when the stage needs them */
  tsr_var *in;           /* input activation (stages > 0) */
  tsr_var *out;          /* forward output, owned by the tape */
  tsr_var *loss;         /* last stage */
  tsr_dtensor *gout;     /* gradient of out received from the next stage */
  tsr_dtensor *gin;      /* gradient of in to send to the previous stage */
} mb_state;

typedef struct pipe_ctx {
  tsr_llama_t *m;
  tsr_rank_t *r;
  int stage, nstages, M;
  int64_t seq;
  const tsr_mesh_t *mesh; /* this stage's */
  tsr_group_t *prev, *next;
  mb_state *mb;
  double w_total; /* valid tokens of the step */
  double loss;
  bool train, want_logits;
  tsr_tensor **parts; /* (M) full logits per microbatch, untracked */
  int in_flight, peak;
} pipe_ctx;

static tsr_status pair_group(tsr_rank_t *r, const tsr_mesh_t *other_mesh, const int *coords,
                             tsr_group_t **out) {
  int me = tsr_rank_id(r), peer = tsr_mesh_rank_at(other_mesh, coords);
  int pair[2] = {me < peer ? me : peer, me < peer ? peer : me};
  return tsr_comm_group(tsr_rank_comm(r), 2, pair, "pp", out);
}

static int peer_index(tsr_group_t *g) {
  return 1 - tsr_group_index(g);
}

/* A (rows, seq, C) f32 DTensor on this stage's mesh placed as the stage-boundary placements of
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
  int64_t shape[2] = {b->rows, p->seq};
  tsr_tensor *full = NULL;
  tsr_dtensor *d = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_I32, 2, shape, &full));
  memcpy(tsr_tensor_data(full), data + b->row0 * p->seq,
         (size_t)(b->rows * p->seq) * sizeof(int32_t));
  tsr_placement rep[TSR_MAX_MESH_DIMS];
  for (int k = 0; k < tsr_mesh_ndim(p->mesh); k++) rep[k] = tsr_replicate();
  tsr_status st = tsr_dtensor_distribute(p->r, p->mesh, full, rep, &d);
  tsr_tensor_free(full);
  if (st != TSR_OK) return st;
  st = tsr_var_new_leaf(d, false, NULL, out);
  if (st != TSR_OK) tsr_dtensor_free(d);
  return st;
}

static void mb_release(mb_state *b) {
  if (b->tape) tsr_tape_reset(b->tape);
  tsr_var_free(b->ids);
  tsr_var_free(b->labels);
  tsr_var_free(b->in);
  tsr_dtensor_free(b->gout);
  b->ids = b->labels = b->in = b->out = b->loss = NULL;
  b->gout = NULL;
}

static tsr_status do_forward(pipe_ctx *p, int k, const int32_t *ids, const int32_t *labels) {
  mb_state *b = &p->mb[k];
  int last = p->nstages - 1;
  if (p->stage == 0) TSR_CHECK(host_leaf(p, ids, b, &b->ids));
  if (p->stage == last) TSR_CHECK(host_leaf(p, labels, b, &b->labels));
  tsr_var *logits = NULL;
  TSR_CHECK(tsr_llama_forward_stage(p->m, b->tape, p->stage, b->ids, b->in, b->labels, &b->out,
                                    &logits, &b->loss));
  if (p->stage == last) {
    tsr_tensor *full = NULL;
    TSR_CHECK(tsr_dtensor_full_tensor(p->r, b->loss->value, &full));
    double w = p->w_total > 0 ? (double)b->valid / p->w_total : 0.0;
    p->loss += w * *(const float *)tsr_tensor_data(full);
    tsr_tensor_free(full);
    if (p->want_logits) {
      TSR_CHECK(tsr_dtensor_full_tensor(p->r, logits->value, &full));
      tsr_status st = tsr_tensor_cast(full, TSR_F32, &p->parts[k]);
      tsr_tensor_free(full);
      TSR_CHECK(st);
    }
  }
  if (++p->in_flight > p->peak) p->peak = p->in_flight;
  /* without backward, the last stage is done with it; others once it is sent */
  if (!p->train && p->stage == last) {
    mb_release(b);
    p->in_flight--;
  }
  return TSR_OK;
}

static tsr_status do_backward(pipe_ctx *p, int k) {
  mb_state *b = &p->mb[k];
  if (p->stage == p->nstages - 1) {
    /* the microbatch's mean loss weighs as its share of the step's valid tokens */
    tsr_tensor *one = NULL;
    tsr_dtensor *seed = NULL;
    TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, 0, NULL, &one));
    *(float *)tsr_tensor_data(one) = (float)(p->w_total > 0 ? (double)b->valid / p->w_total : 0.0);
    tsr_placement rep[TSR_MAX_MESH_DIMS];
    for (int i = 0; i < tsr_mesh_ndim(p->mesh); i++) rep[i] = tsr_replicate();
    tsr_status st = tsr_dtensor_distribute(p->r, b->loss->value->mesh, one, rep, &seed);
    tsr_tensor_free(one);
    TSR_CHECK(st);
    TSR_CHECK(tsr_tape_backward_with(b->tape, b->loss, seed));
  } else {
    if (!b->gout)
      return TSR_ERROR(TSR_EINVAL,
                       "pipeline schedule: backward of microbatch %d on stage %d "
                       "before its gradient was received",
                       k, p->stage);
    tsr_dtensor *g = b->gout;
    b->gout = NULL;
    TSR_CHECK(tsr_tape_backward_with(b->tape, b->out, g));
  }
  if (p->stage > 0) {
    tsr_placement pl[TSR_MAX_MESH_DIMS];
    tsr_llama_stage_io_placements(p->m, p->stage - 1, pl);
    if (b->in->grad)
      TSR_CHECK(tsr_dtensor_redistribute(p->r, b->in->grad, p->mesh, pl, &b->gin));
    else
      TSR_CHECK(tsr_dtensor_zeros(p->r, p->mesh, TSR_F32, 3, b->in->value->shape, pl, &b->gin));
  }
  mb_release(b);
  p->in_flight--;
  return TSR_OK;
}

static bool is_send(tsr_pipe_action_kind k) {
  return k == TSR_PIPE_SEND_ACT || k == TSR_PIPE_SEND_GRAD;
}

/* The neighbour an action talks to: the next stage for activations going down and gradients
 * coming up, the previous one otherwise. */
static tsr_group_t *action_group(const pipe_ctx *p, tsr_pipe_action_kind k) {
  return k == TSR_PIPE_SEND_ACT || k == TSR_PIPE_RECV_GRAD ? p->next : p->prev;
}

/* Buffer of a send action, or a freshly made receive target. */
static tsr_status comm_buffer(pipe_ctx *p, const tsr_pipe_action *a, void **buf, size_t *count) {
  mb_state *b = &p->mb[a->microbatch];
  const tsr_tensor *t = NULL;
  switch (a->kind) {
    case TSR_PIPE_SEND_ACT:
      if (!b->out) break;
      t = b->out->value->local;
      break;
    case TSR_PIPE_SEND_GRAD:
      if (!b->gin) break;
      t = b->gin->local;
      break;
    case TSR_PIPE_RECV_ACT: {
      tsr_dtensor *d = NULL;
      TSR_CHECK(boundary_tensor(p, p->stage - 1, b->rows, &d));
      tsr_status st = tsr_var_new_leaf(d, p->train, NULL, &b->in);
      if (st != TSR_OK) {
        tsr_dtensor_free(d);
        return st;
      }
      t = d->local;
      break;
    }
    case TSR_PIPE_RECV_GRAD:
      TSR_CHECK(boundary_tensor(p, p->stage, b->rows, &b->gout));
      t = b->gout->local;
      break;
    default:
      break;
  }
  if (!t)
    return TSR_ERROR(TSR_EINVAL,
                     "pipeline schedule: stage %d sends microbatch %d before "
                     "computing it",
                     p->stage, a->microbatch);
  *buf = tsr_tensor_data(t);
  *count = (size_t)tsr_tensor_numel(t);
  return TSR_OK;
}

static void after_send(pipe_ctx *p, const tsr_pipe_action *a) {
  mb_state *b = &p->mb[a->microbatch];
  if (a->kind == TSR_PIPE_SEND_ACT && !p->train) {
    mb_release(b);
    p->in_flight--;
  }
  if (a->kind == TSR_PIPE_SEND_GRAD) {
    tsr_dtensor_free(b->gin);
    b->gin = NULL;
  }
}

static bool stage_has(const pipe_ctx *p, tsr_pipe_action_kind k) {
  int last = p->nstages - 1;
  if (k == TSR_PIPE_RECV_ACT || k == TSR_PIPE_SEND_GRAD) return p->stage > 0;
  if (k == TSR_PIPE_SEND_ACT || k == TSR_PIPE_RECV_GRAD) return p->stage < last;
  return true;
}

static tsr_status run_actions(pipe_ctx *p, const tsr_pipe_action *acts, int n, const int32_t *ids,
                              const int32_t *labels, tsr_pipe_result *res) {
  for (int i = 0; i < n; i++) {
    const tsr_pipe_action *a = &acts[i];
    double t0 = now_s();
    int done = 1;
    if (a->kind == TSR_PIPE_FORWARD) {
      TSR_CHECK(do_forward(p, a->microbatch, ids, labels));
    } else if (a->kind == TSR_PIPE_BACKWARD) {
      TSR_CHECK(do_backward(p, a->microbatch));
    } else {
      tsr_group_t *g = action_group(p, a->kind);
      void *buf = NULL, *rbuf = NULL;
      size_t count = 0, rcount = 0;
      TSR_CHECK(comm_buffer(p, a, &buf, &count));
      const tsr_pipe_action *b = i + 1 < n ? &acts[i + 1] : NULL;
      if (is_send(a->kind) && b && !is_send(b->kind) && b->kind != TSR_PIPE_FORWARD &&
          b->kind != TSR_PIPE_BACKWARD && action_group(p, b->kind) == g) {
        TSR_CHECK(comm_buffer(p, b, &rbuf, &rcount));
        TSR_CHECK(
            tsr_comm_sendrecv(g, peer_index(g), buf, count, peer_index(g), rbuf, rcount, TSR_F32));
        after_send(p, a);
        done = 2;
      } else if (is_send(a->kind)) {
        TSR_CHECK(tsr_comm_send(g, peer_index(g), buf, count, TSR_F32));
        after_send(p, a);
      } else {
        TSR_CHECK(tsr_comm_recv(g, peer_index(g), buf, count, TSR_F32));
      }
    }
    double t1 = now_s();
    for (int j = 0; j < done; j++)
      res->events[res->nevents++] =
          (tsr_pipe_event){(int)acts[i + j].kind, acts[i + j].microbatch, t0, t1};
    i += done - 1;
  }
  return TSR_OK;
}

/* This rank's actions: the schedule's, checked, without those its stage or mode has no use for. */
static tsr_status stage_actions(const pipe_ctx *p, const tsr_schedule *sched, tsr_pipe_action **out,
                                int *n) {
  int cap = 8 * p->M + 16, got = 0, k = 0;
  tsr_pipe_action *acts = malloc((size_t)cap * sizeof *acts);
  if (!acts) return TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for %d actions", cap);
  tsr_status st = sched->build(p->nstages, p->M, p->stage, acts, cap, &got, sched->ctx);
  if (st != TSR_OK) {
    free(acts);
    return tsr_error_prefix(st, "pipeline schedule '%s'", sched->name);
  }
  for (int i = 0; i < got; i++) {
    tsr_pipe_action_kind kind = acts[i].kind;
    if (acts[i].microbatch < 0 || acts[i].microbatch >= p->M || acts[i].chunk != 0) {
      int mb = acts[i].microbatch, chunk = acts[i].chunk;
      free(acts);
      return TSR_ERROR(TSR_EINVAL,
                       "pipeline schedule '%s': action %d of stage %d names microbatch "
                       "%d chunk %d (have %d microbatches, 1 chunk)",
                       sched->name, i, p->stage, mb, chunk, p->M);
    }
    bool grad =
        kind == TSR_PIPE_BACKWARD || kind == TSR_PIPE_SEND_GRAD || kind == TSR_PIPE_RECV_GRAD;
    if (!stage_has(p, kind) || (grad && !p->train)) continue;
    acts[k++] = acts[i];
  }
  *out = acts;
  *n = k;
  return TSR_OK;
}

static tsr_status broadcast_results(pipe_ctx *p, const tsr_mesh_t *job_mesh, int64_t rows,
                                    tsr_pipe_result *res) {
  int dim = tsr_mesh_find_dim(job_mesh, "pp");
  res->loss = p->loss;
  if (dim < 0 || p->nstages == 1) {
    if (p->want_logits) return tsr_tensor_cat(p->parts, p->M, 0, &res->logits);
    return TSR_OK;
  }
  tsr_group_t *g = NULL;
  TSR_CHECK(tsr_mesh_group(job_mesh, tsr_rank_comm(p->r), 1u << dim, &g));
  int root = p->nstages - 1;     /* members are in pp order */
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
                .nstages = tsr_llama_stage_count(m),
                .M = microbatches,
                .seq = seq,
                .train = train,
                .want_logits = want_logits};
  int me = tsr_rank_id(p.r), coords[TSR_MAX_MESH_DIMS];
  p.stage = -1;
  for (int s = 0; s < p.nstages && p.stage < 0; s++)
    if (tsr_mesh_contains(tsr_llama_stage_mesh(m, s), me)) p.stage = s;
  if (p.stage < 0) return TSR_ERROR(TSR_EINVAL, "pipeline: rank %d is on no stage", me);
  res->stage = p.stage;
  p.mesh = tsr_llama_stage_mesh(m, p.stage);
  tsr_mesh_coords(p.mesh, me, coords);
  if (p.stage > 0)
    TSR_CHECK(pair_group(p.r, tsr_llama_stage_mesh(m, p.stage - 1), coords, &p.prev));
  if (p.stage < p.nstages - 1)
    TSR_CHECK(pair_group(p.r, tsr_llama_stage_mesh(m, p.stage + 1), coords, &p.next));
  tsr_pipe_action *acts = NULL;
  int n = 0;
  tsr_status st = TSR_OK;
  p.mb = calloc((size_t)p.M, sizeof *p.mb);
  p.parts = calloc((size_t)p.M, sizeof *p.parts);
  if (!p.mb || !p.parts) {
    st = TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for %d microbatches", p.M);
    goto cleanup;
  }
  int64_t base = rows / p.M, extra = rows % p.M, row = 0;
  for (int k = 0; k < p.M; k++) {
    mb_state *b = &p.mb[k];
    b->row0 = row;
    b->rows = base + (k < extra);
    row += b->rows;
    for (int64_t i = b->row0 * seq; i < (b->row0 + b->rows) * seq; i++)
      b->valid += labels[i] != -100;
    p.w_total += (double)b->valid;
    TSR_CHECK_GOTO(tsr_tape_new(p.r, &b->tape), st);
    tsr_tape_set_recording(b->tape, train);
  }
  TSR_CHECK_GOTO(stage_actions(&p, sched, &acts, &n), st);
  res->events = calloc((size_t)n + 1, sizeof *res->events);
  if (!res->events) {
    st = TSR_ERROR(TSR_ENOMEM, "pipeline: out of memory for %d events", n);
    goto cleanup;
  }
  TSR_CHECK_GOTO(run_actions(&p, acts, n, ids, labels, res), st);
  if (p.in_flight != 0) {
    st = TSR_ERROR(TSR_EINVAL,
                   "pipeline schedule '%s': stage %d ends the step with %d microbatches "
                   "not backwarded",
                   sched->name, p.stage, p.in_flight);
    goto cleanup;
  }
  res->peak_in_flight = p.peak;
  st = broadcast_results(&p, job_mesh, rows, res);
cleanup:
  for (int k = 0; p.mb && k < p.M; k++) {
    mb_release(&p.mb[k]);
    tsr_dtensor_free(p.mb[k].gin);
    tsr_tape_free(p.mb[k].tape);
  }
  for (int k = 0; p.parts && k < p.M; k++) tsr_tensor_free(p.parts[k]);
  free(p.mb);
  free(p.parts);
  free(acts);
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

/* ---- analytic timeline ---- */

double tsr_pipe_simulate(const tsr_schedule *sched, int S, int M, double tf, double tb,
                         double *start, double *span) {
  int cap = 8 * M + 16;
  tsr_pipe_action *acts = malloc((size_t)S * (size_t)cap * sizeof *acts);
  int *n = calloc((size_t)S, sizeof *n), *pos = calloc((size_t)S, sizeof *pos);
  double *end = malloc((size_t)S * (size_t)M * 2 * sizeof *end), *clock = calloc((size_t)S, 8);
  double bubble = -1.0;
  if (!acts || !n || !pos || !end || !clock) goto cleanup;
  for (int i = 0; i < S * M * 2; i++) end[i] = -1.0;
  for (int s = 0; s < S; s++) {
    if (sched->build(S, M, s, acts + (size_t)s * cap, cap, &n[s], sched->ctx) != TSR_OK)
      goto cleanup;
  }
#define END(s, k, b) end[((s)*M + (k)) * 2 + (b)]
  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < S; s++)
      while (pos[s] < n[s]) {
        const tsr_pipe_action *a = &acts[(size_t)s * cap + pos[s]];
        if (a->kind != TSR_PIPE_FORWARD && a->kind != TSR_PIPE_BACKWARD) {
          pos[s]++;
          continue;
        }
        int k = a->microbatch, bwd = a->kind == TSR_PIPE_BACKWARD;
        double dep = bwd ? (s == S - 1 ? END(s, k, 0) : END(s + 1, k, 1))
                         : (s == 0 ? 0.0 : END(s - 1, k, 0));
        if (dep < 0 || (bwd && END(s, k, 0) < 0)) break;
        double t0 = clock[s] > dep ? clock[s] : dep;
        if (start) start[(s * M + k) * 2 + bwd] = t0;
        END(s, k, bwd) = clock[s] = t0 + (bwd ? tb : tf);
        pos[s]++;
        progress = true;
      }
  }
#undef END
  double t = 0;
  for (int s = 0; s < S; s++) {
    if (pos[s] < n[s]) goto cleanup; /* stuck: the lists wait on each other */
    t = clock[s] > t ? clock[s] : t;
  }
  if (span) *span = t;
  bubble = t > 0 ? 1.0 - (double)M * (tf + tb) / t : 0.0;
cleanup:
  free(acts);
  free(n);
  free(pos);
  free(end);
  free(clock);
  return bubble;
}

void tsr_pipe_print_timeline(const tsr_schedule *sched, int S, int M, FILE *f) {
  double *start = malloc((size_t)S * (size_t)M * 2 * sizeof *start), span = 0;
  double bubble = start ? tsr_pipe_simulate(sched, S, M, 1.0, 2.0, start, &span) : -1.0;
  if (bubble < 0) {
    fprintf(f, "  schedule %s: no timeline (%d stages, %d microbatches)\n", sched->name, S, M);
    free(start);
    return;
  }
  int T = (int)lround(span);
  fprintf(f, "  schedule %s, %d stages, %d microbatches (time units: forward 1, backward 2)\n",
          sched->name, S, M);
  for (int s = 0; s < S; s++) {
    fprintf(f, "  stage %d |", s);
    for (int u = 0; u < T; u++) {
      const char *kind = "  .";
      int mb = -1;
      for (int k = 0; k < M && mb < 0; k++) {
        double f0 = start[(s * M + k) * 2], b0 = start[(s * M + k) * 2 + 1];
        if (u >= f0 && u < f0 + 1) kind = "F", mb = k;
        if (u >= b0 && u < b0 + 2) kind = "B", mb = k;
      }
      if (mb < 0)
        fputs(kind, f);
      else
        fprintf(f, " %s%d", kind, mb % 10);
    }
    fputs("\n", f);
  }
  fprintf(f, "  bubble fraction %.3f (analytic: idle / (stages x span))\n", bubble);
  free(start);
}
