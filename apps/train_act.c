/* Activation memory of a step, replayed from shapes (train_act.h, docs/training.md).
 *
 * The tape keeps every op's output until the microbatch's backward has ended, frees an
 * intermediate's gradient once the node that made it has run its backward, and keeps the
 * parameters' gradients to the optimizer step. So the replay walks the model's ops as llama.c
 * records them, with each output's local bytes under the job's placements, then the nodes in
 * reverse: a node's backward makes one gradient per input that needs one (adding it into a
 * gradient already there frees it again), then frees its outputs' gradients. The peak of the
 * running sum, over the microbatches a schedule holds at once, is the figure. Buffers the CPU
 * kernels take from malloc (attention's saved output and log-sum-exp, RoPE tables, ring
 * attention's blocks) are not counted by the allocator and not here either. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "train_act.h"

#define F32 4
/* vars and nodes a decoder layer (or the embedding and head) records, at most (about 25) */
#define PER_LAYER 64

typedef struct svar {
  int64_t bytes;  /* the value, held until the tape is reset */
  int64_t gbytes; /* its gradient */
  bool rg;        /* requires grad */
  bool has_grad;
  bool alone;    /* a parameter dp cannot bucket: its gradient is reduced alone when ready */
  bool borrowed; /* its gradient shares another's buffer (an add's inputs): freeing it frees none */
  bool recomp;   /* an element-wise op's output in a selective layer */
  bool dropped;  /* released until a backward reads it (selective checkpointing) */
} svar;

typedef struct snode {
  int in[6], nin, out[2], nout;
  int64_t saved;  /* bytes the node keeps beside its outputs (rmsnorm's row scales, ...) */
  int64_t fwd_ws; /* transient in its forward */
  int64_t bwd_ws; /* transient in its backward (a weight gathered again, scratch) */
  int layer;      /* >= 0: a recomputed layer (activation checkpointing) */
  bool alias;     /* an add or a view: its inputs' gradients share its output's buffer */
} snode;

typedef struct stape {
  svar *v;    /* (cap) */
  snode *n;   /* (cap) */
  int nv, nn; /* used */
  int cap;
} stape;

/* Sizes of one rank's tensors and the running count. Params: ids PARAM + k. */
#define PARAM 1000
typedef struct sim {
  int64_t live, peak;
  svar *p;          /* (layers + 1) x 16 parameters: layer l's k-th at 16 l + k, the others last */
  int cur;          /* the layer whose parameters param() names; num_hidden_layers: the others */
  bool grads_exist; /* a later microbatch: every parameter's gradient is there already */
  bool sync;        /* the step's last backward: dp's gradient hooks flush their buckets */
  bool nested;      /* in a recomputed layer's backward, whose tape fires no hooks */
  int64_t bucket_cap; /* dp's bucket_mb in bytes; 0: no dp dim syncs */
  int64_t bucket_now; /* gradients in the bucket */
  bool recording;
  bool failed; /* a tape ran out of room: the figure is not given */
  /* shapes */
  int64_t T, Tl;         /* tokens in the residual stream / at the linears' inputs */
  int64_t C, Cq, Ckv, I; /* hidden; local q, k/v and MLP widths */
  int64_t E, topk;       /* experts (router width), experts per token */
  int64_t Eloc;          /* experts on this rank */
  int tp, uly, fsdp;     /* sizes that change the ops' shapes */
  bool sp, moe_ep;       /* sequence parallelism; experts split over ep */
  bool kv_whole;         /* tp > kv heads: k_proj and v_proj stay whole on every tp rank */
  bool fsdp_tp_rows;     /* dp_shard before tp in the mesh: tp's column weights sync alone */
  int64_t ckv_expand;    /* Ulysses: kv heads repeated to its degree */
  const tsr_llama_config *mc;
  int every;         /* checkpoint_every; 0: none */
  bool selective;    /* the layers every picks keep GEMM and attention outputs only */
  bool in_selective; /* recording such a layer */
  bool rope_kept;    /* a plugin's rule computes RoPE: its output is not recomputable */
  int64_t lin_out;   /* bytes of the linears' outputs (a split backward keeps their gradients) */
  int64_t layer_max; /* the most one decoder layer adds to the tape */
} sim;

static void bump(sim *s, int64_t extra) {
  if (s->live + extra > s->peak) s->peak = s->live + extra;
}

static svar *var(sim *s, stape *t, int id) {
  return id >= PARAM ? &s->p[id - PARAM] : &t->v[id];
}

/* Parameter k of the current layer, whose gradient takes `grad` bytes. */
static int param(sim *s, int k, int64_t grad) {
  svar *v = &s->p[16 * s->cur + k];
  v->gbytes = grad;
  v->rg = true;
  return PARAM + 16 * s->cur + k;
}

/* A tape with room for `layers` decoder layers and the embedding and head, or NULL. */
static stape *tape_new(int layers) {
  stape *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->cap = PER_LAYER * (layers + 2);
  t->v = calloc((size_t)t->cap, sizeof *t->v);
  t->n = calloc((size_t)t->cap, sizeof *t->n);
  if (!t->v || !t->n) {
    free(t->v);
    free(t->n);
    free(t);
    return NULL;
  }
  return t;
}

static void tape_free(stape *t) {
  if (!t) return;
  free(t->v);
  free(t->n);
  free(t);
}

/* Var 0 stands in for any var past the tape's room (never reached: PER_LAYER bounds it), so
 * that the replay stays in bounds; the result is then marked failed. */
static int room(sim *s, stape *t) {
  if (t->nv < t->cap && t->nn < t->cap) return 1;
  s->failed = true;
  return 0;
}

static int leaf(sim *s, stape *t, int64_t bytes) {
  if (!room(s, t)) return 0;
  t->v[t->nv] = (svar){bytes, bytes, false, false, false, false, false, false};
  return t->nv++;
}

/* Records an op: its output of `out` bytes (and `saved`) is held from here on. */
static int op(sim *s, stape *t, int64_t out, int64_t saved, int nin, const int *in) {
  if (!room(s, t)) return 0;
  snode *n = &t->n[t->nn];
  memset(n, 0, sizeof *n);
  n->layer = -1;
  bool rg = false;
  for (int i = 0; i < nin; i++) {
    n->in[i] = in[i];
    rg = rg || var(s, t, in[i])->rg;
  }
  n->nin = nin;
  t->v[t->nv] = (svar){out, out, rg && s->recording, false, false, false, false, false};
  n->out[0] = t->nv;
  n->nout = 1;
  s->live += out;
  /* a tape not recording drops what the op saved at once */
  bump(s, saved);
  if (s->recording && rg) {
    n->saved = saved;
    s->live += saved;
    t->nn++;
  }
  return t->nv++;
}

#define OP(s, t, out, saved, ...)                                                                  \
  op(s, t, out, saved, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__})

/* Drops v's gradient; a borrowed one leaves its buffer to the var that owns it. */
static void grad_free(sim *s, svar *v) {
  if (v->has_grad && !v->borrowed) s->live -= v->gbytes;
  v->has_grad = v->borrowed = false;
}

/* The node that made var y, or NULL when the op recorded none (a tape not recording, or no input
 * that needs a gradient). */
static snode *made_by(stape *t, int y) {
  return t->nn && t->n[t->nn - 1].out[0] == y ? &t->n[t->nn - 1] : NULL;
}

/* A view (split or merge of heads): no bytes of its own, a gradient of `bytes`. */
static int view(sim *s, stape *t, int x, int64_t bytes) {
  int y = OP(s, t, 0, 0, x);
  t->v[y].gbytes = bytes;
  snode *n = made_by(t, y);
  if (n) n->alias = true;
  return y;
}

static int add(sim *s, stape *t, int a, int b) {
  int y = OP(s, t, s->T * s->C * F32, 0, a, b);
  snode *n = made_by(t, y);
  if (n) n->alias = true;
  return y;
}

/* An element-wise op's output: recomputable in a selective layer (tsr_tape_set_selective). */
static int recomputable(sim *s, stape *t, int v) {
  if (s->in_selective && s->recording) t->v[v].recomp = true;
  return v;
}

/* Selective checkpointing makes a released input again before the backward that reads it. */
static void recompute_inputs(sim *s, stape *t, const snode *n) {
  for (int j = 0; j < n->nin; j++)
    if (n->in[j] < PARAM && t->v[n->in[j]].dropped) {
      t->v[n->in[j]].dropped = false;
      s->live += t->v[n->in[j]].bytes;
    }
}

static void release(sim *s, svar *v) {
  if (v->dropped) return;
  v->dropped = true;
  s->live -= v->bytes;
}

static void tape_reset(sim *s, stape *t) {
  for (int i = 0; i < t->nv; i++) {
    if (!t->v[i].dropped) s->live -= t->v[i].bytes;
    grad_free(s, &t->v[i]);
  }
  for (int i = 0; i < t->nn; i++) s->live -= t->n[i].saved;
  t->nv = t->nn = 0;
}

static void layer_ops(sim *s, stape *t, int l, int h, int *out);
static void backward(sim *s, stape *t);

/* dp's gradient hook (dp_bucket.c), in the step's last backward: a parameter's final gradient
 * joins the bucket, and a bucket of bucket_mb goes out at once: all-reduced through one flat
 * copy, or (FSDP) reduce-scattered from one into a buffer of 1 / dp_shard of it, after which
 * each whole gradient gives way to its shard. */
static void bucket_flush(sim *s) {
  int64_t b = s->bucket_now, shard = s->fsdp > 1 ? b / s->fsdp : 0;
  bump(s, b + shard);
  if (s->fsdp > 1) s->live -= b - shard;
  s->bucket_now = 0;
}

static void bucket_add(sim *s, const svar *v) {
  if (!s->sync || s->bucket_cap <= 0) return;
  int64_t bytes = v->gbytes;
  if (v->alone) {
    /* FSDP beside a later dim that splits rows too (tp's column weights): dp reduces the
     * gradient on its own at once, into its shard */
    int64_t shard = s->fsdp > 1 ? bytes / s->fsdp : bytes;
    bump(s, shard);
    s->live -= bytes - shard;
    return;
  }
  s->bucket_now += bytes;
  if (s->bucket_now >= s->bucket_cap) bucket_flush(s);
}

/* Adds a gradient of `bytes` into v's: kept when v had none, freed again otherwise. */
static void accumulate(sim *s, svar *v, int64_t bytes) {
  if (!v->rg) return;
  if (!v->has_grad) {
    v->has_grad = true;
    v->gbytes = bytes;
    s->live += bytes;
  }
}

/* The backward of a recomputed layer (llama_ckpt.c): a copy of its input, the layer run again on
 * a recording tape, a copy of the output's gradient, that tape's backward. */
static void ckpt_backward(sim *s, stape *t, snode *n) {
  stape *sub = tape_new(1);
  if (!sub) {
    s->failed = true;
    return;
  }
  int64_t hb = var(s, t, n->in[0])->bytes;
  int hx = leaf(s, sub, hb);
  sub->v[hx].rg = true;
  s->live += hb;
  bool rec = s->recording;
  int64_t lin = s->lin_out; /* the recomputed linears are not on the outer tape */
  s->recording = true;
  int o;
  layer_ops(s, sub, n->layer, hx, &o);
  s->recording = rec;
  s->lin_out = lin;
  sub->v[o].has_grad = true;
  s->live += sub->v[o].gbytes;
  backward(s, sub);
  svar *h = var(s, t, n->in[0]);
  bump(s, 0);
  if (sub->v[hx].has_grad) {
    grad_free(s, &sub->v[hx]);
    accumulate(s, h, hb);
  }
  tape_reset(s, sub);
  tape_free(sub);
}

static void backward(sim *s, stape *t) {
  for (int i = t->nn - 1; i >= 0; i--) {
    snode *n = &t->n[i];
    bool reached = false;
    for (int k = 0; k < n->nout; k++) reached = reached || t->v[n->out[k]].has_grad;
    if (!reached) continue;
    if (n->layer >= 0) {
      /* the inner tape fires no gradient hooks: the node's weights are ready after it */
      bool nested = s->nested;
      s->nested = true;
      ckpt_backward(s, t, n);
      s->nested = nested;
      for (int k = 0; !nested && k < 16; k++)
        if (s->p[16 * n->layer + k].rg) bucket_add(s, &s->p[16 * n->layer + k]);
    } else if (n->alias) {
      /* the first input without a gradient takes the output's buffer, later ones share it;
       * one with a gradient already adds into it in place */
      svar *o = &t->v[n->out[0]];
      bool moved = false;
      for (int j = 0; j < n->nin; j++) {
        svar *v = var(s, t, n->in[j]);
        if (!v->rg || v->has_grad) continue;
        v->has_grad = true;
        v->gbytes = o->gbytes;
        v->borrowed = moved || o->borrowed;
        moved = true;
      }
      if (moved) o->has_grad = o->borrowed = false;
    } else {
      recompute_inputs(s, t, n);
      int64_t fresh = 0;
      for (int j = 0; j < n->nin; j++) {
        svar *v = var(s, t, n->in[j]);
        if (v->rg) fresh += n->in[j] >= PARAM ? v->gbytes : v->bytes;
      }
      bump(s, fresh + n->bwd_ws);
      for (int j = 0; j < n->nin; j++) {
        svar *v = var(s, t, n->in[j]);
        int64_t b = n->in[j] >= PARAM ? v->gbytes : v->bytes;
        if (n->in[j] >= PARAM) {
          /* parameters' gradients stay to the optimizer step */
          if (v->rg && !v->has_grad) s->live += b;
          v->has_grad = v->rg;
          if (v->rg && !s->nested) bucket_add(s, v);
        } else {
          accumulate(s, v, b);
        }
      }
    }
    for (int k = 0; k < n->nout; k++) grad_free(s, &t->v[n->out[k]]);
    /* nothing reads a recomputable output after the backward of the node that made it */
    if (t->v[n->out[0]].recomp) release(s, &t->v[n->out[0]]);
  }
}

/* A linear on x with a weight of w_elems local elements. FSDP gathers the weight for the
 * forward (dropped once the op has run) and again for the backward, where the whole weight's
 * gradient exists before it is split. */
static int linear(sim *s, stape *t, int x, int k, int64_t out, int64_t w_elems, bool column) {
  int64_t full = w_elems * F32;
  /* under FSDP the gradient stays whole (a Partial sum) until dp's bucket reduce-scatters it */
  int w = param(s, k, full);
  s->p[w - PARAM].alone = column && s->fsdp_tp_rows;
  if (s->fsdp > 1) bump(s, full + out);
  int y = OP(s, t, out, 0, x, w);
  snode *n = made_by(t, y);
  if (n && s->fsdp > 1) n->bwd_ws = full;
  s->lin_out += out;
  return y;
}

/* Moves an activation between placements (tp's all-reduce, sp's gathers): a new var. */
static int move(sim *s, stape *t, int x, int64_t bytes) {
  return OP(s, t, bytes, 0, x);
}

static int rmsnorm(sim *s, stape *t, int x, int k, int64_t rows) {
  int w = param(s, k, s->C * F32);
  return recomputable(s, t, OP(s, t, rows * s->C * F32, rows * F32, x, w));
}

static void attention(sim *s, stape *t, int x, int *out) {
  int64_t Tl = s->Tl, C = s->C;
  if (s->sp) x = move(s, t, x, Tl * C * F32); /* gathered from the sequence shards */
  int q = linear(s, t, x, 1, Tl * s->Cq * F32, s->Cq * C, true);
  int k = linear(s, t, x, 2, Tl * s->Ckv * F32, s->Ckv * C, !s->kv_whole);
  int v = linear(s, t, x, 3, Tl * s->Ckv * F32, s->Ckv * C, !s->kv_whole);
  int qh = view(s, t, q, Tl * s->Cq * F32), kh = view(s, t, k, Tl * s->Ckv * F32);
  int vh = view(s, t, v, Tl * s->Ckv * F32);
  int qr = OP(s, t, Tl * s->Cq * F32, 0, qh), kr = OP(s, t, Tl * s->Ckv * F32, 0, kh);
  if (!s->rope_kept) {
    recomputable(s, t, qr);
    recomputable(s, t, kr);
  }
  /* Ulysses keeps its all-to-all'd q, k, v (kv heads repeated to its degree) and output */
  int64_t kept = s->uly > 1 ? Tl * F32 * (2 * s->Cq + 2 * s->Ckv * s->ckv_expand) : 0;
  int a = OP(s, t, Tl * s->Cq * F32, kept, qr, kr, vh);
  int am = view(s, t, a, Tl * s->Cq * F32);
  int o = linear(s, t, am, 4, Tl * C * F32, C * s->Cq, false);
  if (s->tp > 1) o = move(s, t, o, s->T * C * F32); /* all-reduce, or sp's reduce-scatter */
  *out = o;
}

static int mlp(sim *s, stape *t, int x) {
  int64_t Tl = s->Tl, C = s->C;
  if (s->sp) x = move(s, t, x, Tl * C * F32);
  int g = linear(s, t, x, 6, Tl * s->I * F32, s->I * C, true);
  int u = linear(s, t, x, 7, Tl * s->I * F32, s->I * C, true);
  int w = recomputable(s, t, OP(s, t, Tl * s->I * F32, 0, g, u));
  int d = linear(s, t, w, 8, Tl * C * F32, C * s->I, false);
  if (s->tp > 1) d = move(s, t, d, s->T * C * F32);
  return d;
}

/* Mixtral's block: router logits, routing (combine weights, stats; softmax kept), experts
 * (routed rows, their hidden activations and outputs kept). Rows per rank assume an even
 * routing: the measured peak moves with the data here. */
static int moe(sim *s, stape *t, int x) {
  /* the experts are not split by tp: every tp rank runs the block whole */
  int64_t T = s->T, C = s->C, E = s->E, M = T * s->topk, I = s->mc->intermediate_size;
  int r = param(s, 9, E * C * F32);
  int logits = OP(s, t, T * E * F32, 0, x, r);
  int combine = OP(s, t, T * E * F32, T * E * F32 + 2 * E * F32, logits);
  int w13 = param(s, 10, s->Eloc * 2 * I * C * F32), w2 = param(s, 11, s->Eloc * C * I * F32);
  if (!s->moe_ep) {
    int64_t saved = (E + 1) * 8 + T * E * 4 + M * C * F32 * 2 + M * 2 * I * F32;
    return OP(s, t, T * C * F32, saved, x, combine, w13, w2);
  }
  /* ep (ep_dispatch.c): the rows sent, received and their outputs in the forward; kept: the
   * outputs back home and the expert side's inputs and hidden activations; the backward moves
   * four row buffers. Rows received assume an even routing. */
  bump(s, T * C * F32 + 3 * M * C * F32);
  int y = OP(s, t, T * C * F32, 2 * M * C * F32 + M * 2 * I * F32, x, combine, w13, w2);
  snode *n = made_by(t, y);
  if (n) n->bwd_ws = 4 * M * C * F32;
  return y;
}

static void layer_ops(sim *s, stape *t, int l, int h, int *out) {
  s->cur = l;
  int n = rmsnorm(s, t, h, 0, s->T), a, f;
  attention(s, t, n, &a);
  int h2 = add(s, t, h, a);
  int n2 = rmsnorm(s, t, h2, 5, s->T);
  f = tsr_llama_layer_is_moe(s->mc, l) ? moe(s, t, n2) : mlp(s, t, n2);
  *out = add(s, t, h2, f);
}

/* A layer on the outer tape: as it is, or checkpointed (its ops on a tape that records nothing,
 * freed at once, and one node that keeps a copy of the output). */
static int decoder_layer(sim *s, stape *t, int l, int h) {
  int out;
  /* as the model: a tape that records nothing (mode = forward) checkpoints nothing */
  if (!(s->every > 0 && (l + 1) % s->every == 0) || !s->recording) {
    layer_ops(s, t, l, h, &out);
    return out;
  }
  if (s->selective) {
    /* its element-wise outputs are released at the layer's end */
    int from = t->nv;
    s->in_selective = true;
    layer_ops(s, t, l, h, &out);
    s->in_selective = false;
    for (int i = from; i < t->nv; i++)
      if (t->v[i].recomp) release(s, &t->v[i]);
    return out;
  }
  stape *sub = tape_new(1);
  if (!sub) {
    s->failed = true;
    return h;
  }
  bool rec = s->recording;
  int64_t lin = s->lin_out; /* its linears are not on the outer tape */
  s->recording = false;
  layer_ops(s, sub, l, h, &out);
  s->recording = rec;
  s->lin_out = lin;
  int64_t ob = sub->v[out].bytes;
  bump(s, ob);
  tape_reset(s, sub);
  tape_free(sub);
  int o = OP(s, t, ob, 0, h);
  snode *n = made_by(t, o);
  if (n) n->layer = l;
  /* the node lists the layer's weights: mark them for gradients */
  return o;
}

/* ---- one rank's step ---- */

/* The model's sizes on one rank, from the mesh dims' owners and sizes. */
typedef struct rank_shape {
  int64_t rows, seq; /* local rows and tokens of a microbatch */
  int tp, dp, fsdp, ring, uly, ep, pp;
  bool sp;
  int64_t bucket; /* dp's bucket_mb in bytes; 0 without a dp dim of size > 1 */
} rank_shape;

static int owned_size(const tsr_app_job *job, const char *plugin, const char *dim) {
  int n = 1;
  const tsr_config *c = job->cfg;
  for (int d = 0; d < c->mesh.ndim; d++) {
    const char *owner = tsr_plugin_set_owner(job->plugins, c->mesh.names[d]);
    if (owner && !strcmp(owner, plugin) && (!dim || !strcmp(dim, c->mesh.names[d])))
      n *= c->mesh.shape[d];
  }
  return n;
}

static int64_t ceil_div(int64_t a, int64_t b) {
  return b > 0 ? (a + b - 1) / b : a;
}

/* One microbatch through the stages `mine` (a mask over the stages, 0: the whole model) of a
 * rank: forward, then backward; *tape gets the bytes its tape held at the forward's end. */
static void microbatch(sim *s, const rank_shape *r, const int *layer_stage, int stage, bool first,
                       bool last, int64_t *tape) {
  stape *t = tape_new(s->mc->num_hidden_layers);
  if (!t) {
    s->failed = true;
    return;
  }
  const tsr_llama_config *mc = s->mc;
  int64_t C = s->C, V = mc->vocab_size, start = s->live;
  int64_t Tfull = r->rows * r->seq; /* the tokens before the sequence split of sp */
  int h, nl = mc->num_hidden_layers;
  for (int i = 0; i < 16 * (nl + 1); i++) s->p[i].has_grad = s->grads_exist;
  s->cur = nl;
  if (first) {
    /* the ids, whole on each rank, then placed as the data layout says */
    int ids = leaf(s, t, r->rows * r->dp * r->seq * r->ring * r->uly * 4);
    s->live += t->v[ids].bytes;
    int x = OP(s, t, Tfull * 4, 0, ids);
    int w = param(s, 12, V * C * F32 / r->tp / (r->fsdp > 1 ? r->fsdp : 1));
    h = OP(s, t, Tfull * (C / r->tp) * F32, 0, x, w);
    if (r->tp > 1) h = move(s, t, h, s->T * C * F32);
  } else {
    h = leaf(s, t, s->T * C * F32); /* received from the previous stage */
    t->v[h].rg = true;
    s->live += t->v[h].bytes;
  }
  for (int l = 0; l < mc->num_hidden_layers; l++)
    if (stage < 0 || layer_stage[l] == stage) {
      int64_t at = s->live;
      h = decoder_layer(s, t, l, h);
      if (s->live - at > s->layer_max) s->layer_max = s->live - at;
    }
  if (last) {
    s->cur = nl;
    int n = rmsnorm(s, t, h, 13, s->T);
    if (s->sp) n = move(s, t, n, s->Tl * C * F32);
    int64_t Vl = V / r->tp;
    int logits = linear(s, t, n, 14, s->Tl * Vl * F32, Vl * C, true);
    int labels = leaf(s, t, r->rows * r->dp * r->seq * r->ring * r->uly * 4);
    s->live += t->v[labels].bytes;
    int lab = OP(s, t, Tfull * 4, 0, labels);
    int loss = OP(s, t, F32, 0, logits, lab);
    *tape = s->live - start;
    t->v[loss].has_grad = true;
    s->live += F32;
  } else {
    *tape = s->live - start;
    t->v[h].has_grad = true; /* the gradient received from the next stage */
    s->live += t->v[h].gbytes;
  }
  backward(s, t);
  /* dp's last bucket goes out at the end of the backward, before the tape is reset */
  if (s->sync && s->bucket_now > 0) bucket_flush(s);
  tape_reset(s, t);
  tape_free(t);
}

/* What the other microbatches of this rank hold at worst while one runs, from the schedule's
 * timeline: a forward opens a tape, a whole or weight backward closes it; between a split
 * backward's input and weight parts the linears' output gradients wait too. *open gets the most
 * tapes open at once. */
static int64_t held(const tsr_pipe_timeline *tl, int prank, int64_t tape, int64_t lin, int *open) {
  int n = 0, pending = 0;
  int64_t most = 0;
  *open = 1;
  for (int i = 0; i < tl->nops[prank]; i++) {
    int k = tl->ops[prank][i].kind;
    /* what the others hold while this action runs: a forward's own tape and a backward's own
     * gradients are the replayed microbatch's */
    int64_t now = (int64_t)(k == TSR_PIPE_FORWARD ? n : n - 1) * tape + pending * lin;
    if (k == TSR_PIPE_BACKWARD_INPUT) now += lin; /* its own, kept to its weight part */
    if (k != TSR_PIPE_BACKWARD_WEIGHT && now > most) most = now;
    if (k == TSR_PIPE_FORWARD && ++n > *open) *open = n;
    if (k == TSR_PIPE_BACKWARD_INPUT) pending++;
    if (k == TSR_PIPE_BACKWARD || k == TSR_PIPE_BACKWARD_WEIGHT) n--;
    if (k == TSR_PIPE_BACKWARD_WEIGHT) pending--;
  }
  return most;
}

/* Whether cp_ring computes RoPE itself (load_balance = zigzag on a ring of 2 or more): its rule's
 * output is not an element-wise op's local one, and selective checkpointing keeps it. */
static bool ring_ropes(const tsr_app_job *job) {
  if (owned_size(job, "cp_ring", NULL) < 2) return false;
  for (int i = 0; i < tsr_plugin_set_count(job->plugins); i++) {
    const tsr_strategy *st = tsr_plugin_set_strategy(job->plugins, i);
    if (!st || strcmp(st->name, "cp_ring")) continue;
    const char *v = tsr_config_get(job->cfg, "cp_ring", st->keys, "load_balance");
    return v && !strcmp(v, "zigzag");
  }
  return false;
}

/* [strategy.dp] bucket_mb in bytes, 0 without a dp dim that syncs. */
static int64_t dp_bucket(const tsr_app_job *job) {
  if (owned_size(job, "dp", NULL) < 2) return 0;
  double mb = 25;
  for (int i = 0; i < tsr_plugin_set_count(job->plugins); i++) {
    const tsr_strategy *st = tsr_plugin_set_strategy(job->plugins, i);
    if (!st || strcmp(st->name, "dp")) continue;
    const char *v = tsr_config_get(job->cfg, "dp", st->keys, "bucket_mb");
    if (v) mb = atof(v);
  }
  return (int64_t)(mb * 1048576.0);
}

tsr_status tsr_train_act_plan(const tsr_app_job *job, tsr_train_act *out) {
  const tsr_config *c = job->cfg;
  tsr_llama_config mc = tsr_train_model_config(c);
  const tsr_schedule *sched = NULL;
  int mb = 1, spr = 1, n = 0, counts[1024];
  TSR_CHECK(tsr_train_pipe_info(job, &sched, &mb, &spr, counts, 1024, &n));
  const char *sdim = tsr_registry_stage_dim(job->reg);
  rank_shape r = {0};
  r.tp = owned_size(job, "tp", "tp");
  r.dp = owned_size(job, "dp", NULL) * owned_size(job, "ep", NULL);
  r.fsdp = owned_size(job, "dp", "dp_shard");
  r.ring = owned_size(job, "cp_ring", NULL);
  r.uly = owned_size(job, "cp_ulysses", NULL);
  r.ep = owned_size(job, "ep", NULL);
  r.pp = sched ? tsr_mesh_size_of(job->mesh, sdim) : 1;
  r.sp = r.tp > 1 && tsr_config_loads_plugin(c, "sp");
  r.bucket = dp_bucket(job);
  bool train = c->job.mode == TSR_MODE_TRAIN;
  int passes = sched ? mb : (train ? (int)c->optimizer.grad_accum_steps : 1);
  r.rows = ceil_div(c->data.batch_size / passes, r.dp);
  r.seq = ceil_div(c->data.seq_len, (int64_t)r.ring * r.uly);
  int S = r.pp * (spr > 1 ? spr : 1);
  int *layer_stage = calloc((size_t)mc.num_hidden_layers, sizeof *layer_stage);
  if (!layer_stage) return TSR_ERROR(TSR_ENOMEM, "out of memory");
  if (n == S) {
    for (int s = 0, l = 0; s < S; s++)
      for (int i = 0; i < counts[s] && l < mc.num_hidden_layers; i++) layer_stage[l++] = s;
  } else {
    tsr_llama_assign_layers(mc.num_hidden_layers, S, layer_stage);
  }
  tsr_pipe_timeline tl = {0};
  bool have_tl = false;
  if (sched && train) {
    tsr_status st = tsr_pipe_timeline_build(sched, r.pp, spr > 1 ? spr : 1, mb, true, 1, 2, &tl);
    if (st != TSR_OK) {
      free(layer_stage);
      return st;
    }
    have_tl = true;
  }
  int64_t D = mc.hidden_size / mc.num_attention_heads;
  int hkv = mc.num_key_value_heads % r.tp ? mc.num_key_value_heads : mc.num_key_value_heads / r.tp;
  for (int rank = 0; rank < (int)c->mesh.world; rank++) {
    int coords[TSR_MAX_MESH_DIMS] = {0};
    tsr_mesh_coords(job->mesh, rank, coords);
    int sd = sdim ? tsr_mesh_find_dim(job->mesh, sdim) : -1, prank = sd >= 0 ? coords[sd] : 0;
    sim s = {0};
    s.p = calloc((size_t)(16 * (mc.num_hidden_layers + 1)), sizeof *s.p);
    if (!s.p) {
      free(layer_stage);
      if (have_tl) tsr_pipe_timeline_free(&tl);
      return TSR_ERROR(TSR_ENOMEM, "out of memory");
    }
    s.mc = &mc;
    s.recording = train;
    s.every = mc.checkpoint_every;
    s.selective = mc.checkpoint_selective;
    s.rope_kept = ring_ropes(job);
    s.C = mc.hidden_size;
    s.tp = r.tp;
    s.sp = r.sp;
    s.uly = r.uly;
    s.fsdp = r.fsdp;
    s.Tl = r.rows * r.seq;
    s.T = r.sp ? ceil_div(s.Tl, r.tp) : s.Tl;
    s.Cq = mc.num_attention_heads / r.tp * D;
    s.Ckv = hkv * D;
    s.ckv_expand = r.uly > 1 && hkv % r.uly ? r.uly / hkv : 1;
    s.I = mc.intermediate_size / r.tp;
    s.E = mc.num_local_experts;
    s.topk = mc.num_experts_per_tok;
    s.Eloc = r.ep > 1 ? s.E / r.ep : s.E;
    s.moe_ep = r.ep > 1;
    s.bucket_cap = r.bucket;
    s.kv_whole = r.tp > mc.num_key_value_heads;
    int ds = tsr_mesh_find_dim(job->mesh, "dp_shard"), dt = tsr_mesh_find_dim(job->mesh, "tp");
    s.fsdp_tp_rows = r.fsdp > 1 && r.tp > 1 && ds >= 0 && dt > ds;
    tsr_train_act *a = &out[rank];
    memset(a, 0, sizeof *a);
    a->microbatches = passes;
    a->in_flight = 1;
    int chunks = spr > 1 ? spr : 1;
    int64_t lin = 0;
    /* the first microbatch makes the gradients; the next ones add into them while the other
     * microbatches in flight hold their tapes */
    for (int k = 0; k < (passes > 1 ? 2 : 1); k++) {
      s.grads_exist = k > 0;
      s.sync = k == (passes > 1 ? 1 : 0);
      /* the first stage's input part does nothing (no input needs a gradient): its weight
       * part runs the whole backward, and no output gradient waits between them */
      int64_t others =
          have_tl && k > 0 ? held(&tl, prank, a->tape, prank > 0 ? lin : 0, &a->in_flight) : 0;
      s.live += others;
      for (int ch = 0; ch < (sched ? chunks : 1); ch++) {
        int stage = sched ? ch * r.pp + prank : -1;
        int64_t tape = 0;
        s.lin_out = 0;
        microbatch(&s, &r, layer_stage, stage, stage <= 0, !sched || stage == S - 1, &tape);
        if (tape > a->tape) a->tape = tape;
        if (s.lin_out > lin) lin = s.lin_out;
      }
      s.live -= others;
    }
    free(s.p);
    if (s.failed) {
      if (have_tl) tsr_pipe_timeline_free(&tl);
      free(layer_stage);
      return TSR_ERROR(TSR_ENOMEM, "out of memory replaying rank %d's step", rank);
    }
    a->peak = s.peak;
    a->grads = s.live; /* after the last backward: the parameters' gradients */
    a->layer = s.layer_max;
    a->logits = s.Tl * (mc.vocab_size / r.tp) * F32;
  }
  if (have_tl) tsr_pipe_timeline_free(&tl);
  free(layer_stage);
  return TSR_OK;
}

int64_t tsr_train_act_total(const tsr_train_mem *state, const tsr_train_act *act) {
  int64_t step = state->params + state->optim + act->peak;
  int64_t opt = state->params + state->grads + state->optim;
  return step > opt ? step : opt;
}

static double mib(int64_t b) {
  return (double)b / (1024.0 * 1024.0);
}

typedef struct act_table {
  const tsr_train_mem *state;
  const tsr_train_act *act;
} act_table;

static bool same_act(const void *ctx, int a, int b) {
  const act_table *t = ctx;
  return t->act[a].peak == t->act[b].peak && t->act[a].tape == t->act[b].tape &&
         tsr_train_act_total(&t->state[a], &t->act[a]) ==
             tsr_train_act_total(&t->state[b], &t->act[b]);
}

void tsr_train_act_print(FILE *f, const tsr_app_job *job, const tsr_train_mem *state,
                         const tsr_train_act *act) {
  int world = (int)job->cfg->mesh.world;
  const char *modes[] = {"none", "full", "selective"};
  int mode = tsr_config_ext_of(job->cfg)->model_memory.activation_checkpointing;
  fprintf(f,
          "activations per rank, planned (checkpointing %s, %d microbatch%s per step; tape: one "
          "microbatch's; beyond the state: what the step's peak holds on top of parameters, "
          "gradients and AdamW moments; total: the allocator peak `run` logs):\n",
          mode >= 0 && mode < 3 ? modes[mode] : "?", act[0].microbatches,
          act[0].microbatches == 1 ? "" : "es");
  bool *done = calloc((size_t)world, sizeof *done);
  for (int r = 0; r < world; r++) {
    if (done && done[r]) continue;
    const tsr_train_act *a = &act[r];
    int64_t tot = tsr_train_act_total(&state[r], a);
    act_table tab = {state, act};
    tsr_train_rank_group(f, r, world, done, same_act, &tab);
    fprintf(f,
            ": tape %.3f MiB x %d in flight  beyond the state %.3f MiB  predicted total %.3f MiB "
            "(%lld bytes)\n",
            mib(a->tape), a->in_flight,
            mib(tot - state[r].params - state[r].grads - state[r].optim), mib(tot), (long long)tot);
  }
  free(done);
}

tsr_status tsr_train_memory_limit(const tsr_config *c, int64_t *bytes) {
  const char *v = tsr_config_ext_of(c)->job_memory.memory_limit;
  *bytes = 0;
  if (!v[0]) return TSR_OK;
  char *end = NULL;
  double x = strtod(v, &end);
  double scale = 1;
  while (end && *end == ' ') end++;
  const char *units = "KMGT";
  const char *u = end && *end ? strchr(units, toupper((unsigned char)*end)) : NULL;
  if (u && *end) {
    for (const char *k = units; k <= u; k++) scale *= 1024.0;
    end++;
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
  } else if (end && (*end == 'b' || *end == 'B')) {
    end++;
  }
  if (!end || end == v || *end || !(x > 0) || x * scale > 9.2e18)
    return tsr_config_error(c, TSR_EINVAL, "job", "memory_limit",
                            "'%s' is not a size in bytes; write a positive number with an "
                            "optional K, M, G or T (powers of 1024, e.g. 512M, 4G, 1.5GiB), or "
                            "leave it empty for no limit",
                            v);
  *bytes = (int64_t)(x * scale);
  return TSR_OK;
}

tsr_status tsr_train_act_limit_check(const tsr_app_job *job, const tsr_train_mem *state,
                                     const tsr_train_act *act) {
  const tsr_config *c = job->cfg;
  int64_t limit = 0;
  TSR_CHECK(tsr_train_memory_limit(c, &limit));
  if (limit <= 0) return TSR_OK;
  int worst = 0;
  int64_t top = -1;
  for (int r = 0; r < (int)c->mesh.world; r++) {
    int64_t t = tsr_train_act_total(&state[r], &act[r]);
    if (t > top) top = t, worst = r;
  }
  if (top <= limit) return TSR_OK;
  const tsr_train_mem *m = &state[worst];
  const tsr_train_act *a = &act[worst];
  char where[TSR_MAX_PATH + 160];
  tsr_config_where(c, "job", "memory_limit", where, sizeof where);
  return tsr_error(
      TSR_ENOMEM,
      "%s = %s (%.1f MiB): rank %d is predicted to need %.1f MiB at the peak of its step. "
      "Its largest items: activations and the step's workspace %.1f MiB (one microbatch's "
      "tape %.1f MiB x %d in flight, of which the logits %.1f MiB and a decoder layer %.1f MiB), "
      "AdamW moments %.1f MiB, parameters %.1f MiB, gradients %.1f MiB. Nothing was "
      "run; raise memory_limit, use activation_checkpointing = full, more "
      "microbatches, or a mesh that splits the batch, sequence or model further",
      where, tsr_config_ext_of(c)->job_memory.memory_limit, mib(limit), worst, mib(top),
      mib(top - m->params - m->grads - m->optim), mib(a->tape), a->in_flight, mib(a->logits),
      mib(a->layer), mib(m->optim), mib(m->params), mib(m->grads));
}

void tsr_train_act_state_estimate(const tsr_app_job *job, tsr_train_mem *state) {
  tsr_llama_config mc = tsr_train_model_config(job->cfg);
  int64_t n = tsr_llama_num_params(&mc);
  int64_t split = (int64_t)owned_size(job, "tp", "tp") * owned_size(job, "dp", "dp_shard");
  const char *sdim = tsr_registry_stage_dim(job->reg);
  if (sdim) split *= tsr_mesh_size_of(job->mesh, sdim);
  int64_t p = (int64_t)F32 * n / (split > 0 ? split : 1);
  for (int r = 0; r < (int)job->cfg->mesh.world; r++) state[r] = (tsr_train_mem){p, p, 2 * p};
}

tsr_status tsr_train_act_check(const tsr_app_job *job) {
  const tsr_config *c = job->cfg;
  int64_t limit = 0;
  TSR_CHECK(tsr_train_memory_limit(c, &limit));
  if (limit <= 0) return TSR_OK;
  int world = (int)c->mesh.world;
  tsr_train_mem *state = calloc((size_t)world, sizeof *state);
  tsr_train_act *act = calloc((size_t)world, sizeof *act);
  tsr_status st =
      state && act ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "out of memory for %d ranks", world);
  tsr_llama_config mc = tsr_train_model_config(c);
  int64_t n = tsr_llama_num_params(&mc);
  if (st == TSR_OK && n <= TSR_TRAIN_MEM_PLAN_MAX_PARAMS && world <= TSR_LOCAL_MAX_RANKS)
    st = tsr_train_mem_plan(job, state, NULL);
  else if (st == TSR_OK)
    tsr_train_act_state_estimate(job, state);
  if (st == TSR_OK) st = tsr_train_act_plan(job, act);
  if (st == TSR_OK) st = tsr_train_act_limit_check(job, state, act);
  free(state);
  free(act);
  return st;
}
