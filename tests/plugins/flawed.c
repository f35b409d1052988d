/* Strategy plugins with the defects plugin authors make, for the conformance suite's own tests:
 * one source, built once per defect (tests/conformance/CMakeLists.txt, FLAW_NAME and FLAW_DIM
 * set there), each of which `tessera conform` must fail by default, in the test and with the
 * message that names the defect (docs/conformance.md). Each owns FLAW_DIM and declares that the
 * dim splits the batch, as data parallelism does (tests/plugins/zdp.c), so that the model reaches
 * its rules at L3.
 *   FLAW_SCALE      an add rule whose forward is off by a relative 1e-5 everywhere (a rounding
 *                   constant off by one digit): within the rtol 1e-4 of a comparison with
 *                   another f32 run, far outside what f32 rounding explains;
 *   FLAW_STALE      a before-step optimizer hook that keeps each rank's gradients (error
 *                   feedback, say) and from the third step on hands back the kept ones instead
 *                   of the new: the first step is right, the fifth is not;
 *   FLAW_STATIC     an add rule that reads its job's state through a static pointer which init
 *                   sets and fini clears: right while one job exists, a crash in the first job
 *                   once a second was made and freed;
 *   FLAW_LEAK_INIT  init allocates 64 KiB that fini never frees;
 *   FLAW_LEAK_RULE  an add rule whose free_saved releases its record but not the buffer the
 *                   record points to: 4 KiB lost per forward;
 *   FLAW_GROUP      a cross_entropy rule that counts the valid tokens over the data dims it
 *                   knows by name (its own, dp, ring_cp, ...) instead of every dim that splits
 *                   the labels: right beside every in-tree plugin, wrong beside a data split on
 *                   a dim of another name;
 *   FLAW_TRANSITION a redistribute transition R -> S(1) that takes every batch row's slice from
 *                   the first batch row (an index without its batch stride), and a rope rule
 *                   on S(1) whose inputs it moves;
 *   FLAW_SKIP       a before-step optimizer hook that all-reduces a gradient statistic over the
 *                   plugin's dim, except on the ranks whose shard of it is zero, which skip the
 *                   call: every rank has one at step 1, rank 1 of the dim has none at step 2.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/plugin.h"

#ifndef FLAW_NAME
#error "FLAW_NAME must name the plugin"
#endif
#ifndef FLAW_DIM
#error "FLAW_DIM must name the plugin's dim"
#endif

static const char *const flaw_dims[] = {FLAW_DIM, NULL};

/* Per-job state, reached through the rules' ctx as the contract says (FLAW_STATIC aside). */
typedef struct flaw_job {
  float one;
  void *table; /* FLAW_LEAK_INIT */
} flaw_job;

#ifdef FLAW_STATIC
static flaw_job *current; /* the defect: one job's state where every job finds it */
#endif

static tsr_status flaw_init(const tsr_plugin_args *args, void **state) {
  (void)args;
  flaw_job *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "%s: out of memory", FLAW_NAME);
  s->one = 1.0f;
#ifdef FLAW_STATIC
  current = s;
#endif
#ifdef FLAW_LEAK_INIT
  /* a table for the job, which fini forgets to free */
  s->table = malloc(64 * 1024);
  if (s->table) memset(s->table, 1, 64 * 1024);
#endif
  *state = s;
  return TSR_OK;
}

static void flaw_fini(void *state) {
#ifdef FLAW_STATIC
  current = NULL;
#endif
  free(state);
}

#if defined(FLAW_SCALE) || defined(FLAW_STATIC) || defined(FLAW_LEAK_RULE)
/* What the add rule keeps for its backward (nothing it needs; FLAW_LEAK_RULE's defect). */
typedef struct add_saved {
  void *scratch;
} add_saved;

static void add_saved_free(void *p) {
  /* the defect of FLAW_LEAK_RULE: the record goes, its scratch buffer does not */
  free(p);
}

/* out = a + b on the local shards, elementwise. */
static tsr_status add_forward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                              const void *attrs, int noutputs, tsr_dtensor **out, void **saved,
                              void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)ctx;
  *saved = NULL;
  float scale = 1.0f;
#ifdef FLAW_SCALE
  scale = 1.0f + 1e-5f; /* meant to be 1 */
#endif
#ifdef FLAW_STATIC
  scale = current->one; /* the job's state, from a static another job's fini cleared */
#endif
#ifdef FLAW_LEAK_RULE
  add_saved *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "%s: out of memory", FLAW_NAME);
  s->scratch = malloc(4096);
  *saved = s;
#endif
  tsr_tensor *sum = NULL;
  TSR_CHECK(tsr_tensor_clone(in[0]->local, &sum));
  float *ps = tsr_tensor_data(sum);
  const float *pb = tsr_tensor_data(in[1]->local);
  for (int64_t i = 0; i < tsr_tensor_numel(sum); i++) ps[i] = (ps[i] + pb[i]) * scale;
  return tsr_dtensor_from_local(r, in[0]->mesh, sum, in[0]->shape, in[0]->placements, &out[0]);
}

/* d(a + b) = (g, g): the output gradient to both inputs. */
static tsr_status add_backward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                               const void *attrs, int noutputs, const tsr_dtensor *const *outs,
                               const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                               void *ctx) {
  (void)dim, (void)attrs, (void)noutputs, (void)outs, (void)saved, (void)ctx;
  for (int i = 0; i < ninputs; i++) {
    tsr_tensor *g = NULL;
    TSR_CHECK(tsr_tensor_clone(gout[0]->local, &g));
    TSR_CHECK(
        tsr_dtensor_from_local(r, in[i]->mesh, g, in[i]->shape, gout[0]->placements, &gin[i]));
  }
  return TSR_OK;
}
#endif

#ifdef FLAW_STALE
/* Each rank's kept gradients, one local tensor per parameter. */
typedef struct stale_rank {
  int n;
  tsr_tensor **kept;
} stale_rank;

static tsr_status stale_setup(tsr_rank_t *r, void *ctx, void **state) {
  (void)r, (void)ctx;
  *state = calloc(1, sizeof(stale_rank));
  return *state ? TSR_OK : tsr_error(TSR_ENOMEM, "%s: out of memory", FLAW_NAME);
}

static void stale_teardown(tsr_rank_t *r, void *state, void *ctx) {
  (void)r, (void)ctx;
  stale_rank *s = state;
  for (int i = 0; i < s->n; i++) tsr_tensor_free(s->kept[i]);
  free(s->kept);
  free(s);
}

static tsr_status stale_hook(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step,
                             void *ctx) {
  (void)when, (void)ctx;
  stale_rank *s;
  TSR_CHECK(tsr_rank_state(r, FLAW_NAME ".kept", (void **)&s));
  if (!s->kept) {
    s->kept = calloc((size_t)step->nparams, sizeof *s->kept);
    if (!s->kept) return tsr_error(TSR_ENOMEM, "%s: out of memory", FLAW_NAME);
    s->n = step->nparams;
  }
  for (int i = 0; i < step->nparams && i < s->n; i++) {
    tsr_tensor *g = step->grads[i] ? step->grads[i]->local : NULL;
    if (!g) continue;
    if (step->step <= 2) { /* the defect: the copy is refreshed on the first two steps only */
      tsr_tensor_free(s->kept[i]);
      s->kept[i] = NULL;
      TSR_CHECK(tsr_tensor_clone(g, &s->kept[i]));
    } else {
      TSR_CHECK(tsr_tensor_copy(g, s->kept[i]));
    }
  }
  return TSR_OK;
}
#endif

#ifdef FLAW_SKIP
static tsr_status skip_hook(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step,
                            void *ctx) {
  (void)when, (void)ctx;
  int d = tsr_mesh_find_dim(step->mesh, FLAW_DIM);
  if (d < 0 || tsr_mesh_dim_size(step->mesh, d) < 2) return TSR_OK;
  int coords[TSR_MAX_MESH_DIMS] = {0};
  tsr_mesh_coords(step->mesh, tsr_rank_id(r), coords);
  /* the defect: a rank with nothing to add leaves the collective out */
  float mine = step->step == 2 && coords[d] == 1 ? 0.0f : 1.0f, sum = 0;
  if (mine == 0.0f) return TSR_OK;
  tsr_group_t *g;
  TSR_CHECK(tsr_mesh_group(step->mesh, tsr_rank_comm(r), 1u << d, &g));
  return tsr_comm_all_reduce(g, &mine, &sum, 1, TSR_F32, TSR_REDUCE_SUM);
}
#endif

#ifdef FLAW_GROUP
/* The dims this plugin's author knew to split the data. */
static const char *const known_data_dims[] = {FLAW_DIM,  "dp",         "dp_shard", "dp_replicate",
                                              "ring_cp", "ulysses_cp", NULL};

typedef struct loss_saved {
  int64_t valid;
} loss_saved;

static bool known(const char *dim) {
  for (int i = 0; known_data_dims[i]; i++)
    if (!strcmp(known_data_dims[i], dim)) return true;
  return false;
}

/* The mean loss over the batch's valid tokens, each shard's share Partial(sum) on the dims that
 * split the labels. */
static tsr_status loss_forward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                               const void *attrs, int noutputs, tsr_dtensor **out, void **saved,
                               void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)ctx;
  const tsr_dtensor *logits = in[0], *labels = in[1];
  const tsr_mesh_t *m = logits->mesh;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  uint32_t mask = 0;
  for (int i = 0; i < tsr_mesh_ndim(m); i++) {
    bool split = tsr_mesh_dim_size(m, i) > 1 && labels->placements[i].kind == TSR_SHARD;
    p[i] = split ? tsr_partial(TSR_REDUCE_SUM) : tsr_replicate();
    /* the defect: the count is summed only over the splitting dims it knows by name */
    if (split && known(tsr_mesh_dim_name(m, i))) mask |= 1u << i;
  }
  TSR_CHECK(tsr_dtensor_zeros(r, m, TSR_F32, 0, NULL, p, out));
  if (!logits->local) return TSR_OK;
  loss_saved *s = calloc(1, sizeof *s);
  if (!s) return tsr_error(TSR_ENOMEM, "%s: out of memory", FLAW_NAME);
  *saved = s;
  const tsr_tensor *z = logits->local;
  int64_t V = z->shape[z->ndim - 1], N = tsr_tensor_numel(z) / V;
  const float *pz = tsr_tensor_data(z);
  const int32_t *py = tsr_tensor_data(labels->local);
  double total = 0;
  for (int64_t n = 0; n < N; n++) {
    if (py[n] < 0) continue;
    double mx = -INFINITY, se = 0;
    for (int64_t j = 0; j < V; j++) mx = pz[n * V + j] > mx ? pz[n * V + j] : mx;
    for (int64_t j = 0; j < V; j++) se += exp(pz[n * V + j] - mx);
    total += log(se) + mx - pz[n * V + py[n]];
    s->valid++;
  }
  if (mask) {
    tsr_group_t *g;
    TSR_CHECK(tsr_mesh_group(m, tsr_rank_comm(r), mask, &g));
    TSR_CHECK(tsr_comm_all_reduce(g, &s->valid, &s->valid, 1, TSR_I64, TSR_REDUCE_SUM));
  }
  tsr_tensor_set((*out)->local, NULL, s->valid ? total / (double)s->valid : NAN);
  return TSR_OK;
}

static tsr_status loss_backward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                                const void *attrs, int noutputs, const tsr_dtensor *const *outs,
                                const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                                void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)outs, (void)ctx;
  const tsr_dtensor *logits = in[0];
  const loss_saved *s = saved;
  TSR_CHECK(tsr_dtensor_zeros(r, logits->mesh, TSR_F32, logits->ndim, logits->shape,
                              logits->placements, &gin[0]));
  if (!logits->local || !gout[0] || !s || !s->valid) return TSR_OK;
  double g = tsr_tensor_get(gout[0]->local, NULL) / (double)s->valid;
  const tsr_tensor *z = logits->local;
  int64_t V = z->shape[z->ndim - 1], N = tsr_tensor_numel(z) / V;
  const float *pz = tsr_tensor_data(z);
  const int32_t *py = tsr_tensor_data(in[1]->local);
  float *dz = tsr_tensor_data(gin[0]->local);
  for (int64_t n = 0; n < N; n++) {
    if (py[n] < 0) continue;
    double mx = -INFINITY, se = 0;
    for (int64_t j = 0; j < V; j++) mx = pz[n * V + j] > mx ? pz[n * V + j] : mx;
    for (int64_t j = 0; j < V; j++) se += exp(pz[n * V + j] - mx);
    for (int64_t j = 0; j < V; j++)
      dz[n * V + j] = (float)(g * (exp(pz[n * V + j] - mx) / se - (j == py[n])));
  }
  return TSR_OK;
}
#endif

#ifdef FLAW_TRANSITION
static bool scatter_match(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst,
                          void *ctx) {
  (void)dim, (void)ctx;
  return x->dtype == TSR_F32 && x->ndim >= 3 && src.kind == TSR_REPLICATE &&
         dst.kind == TSR_SHARD && dst.dim == 1;
}

/* This rank's slice of dim 1, taken from the replicated tensor without copying. */
static tsr_status scatter_apply(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement dst,
                                tsr_dtensor **out, void *ctx) {
  (void)ctx;
  tsr_placement p[TSR_MAX_MESH_DIMS];
  memcpy(p, x->placements, sizeof p);
  p[dim] = dst;
  int64_t shape[TSR_MAX_DIMS], start[TSR_MAX_DIMS];
  if (!tsr_dtensor_local_shape(x->mesh, p, x->ndim, x->shape, tsr_rank_id(r), shape, start))
    return tsr_dtensor_from_local(r, x->mesh, NULL, x->shape, p, out);
  tsr_tensor *local = NULL;
  TSR_CHECK(tsr_tensor_new(NULL, TSR_F32, x->ndim, shape, &local));
  const tsr_tensor *src = x->local;
  int64_t B = src->shape[0], L = src->shape[1], inner = tsr_tensor_numel(src) / (B * L);
  int64_t rows = shape[1];
  const float *ps = tsr_tensor_data(src);
  float *pd = tsr_tensor_data(local);
  int64_t off = start[1];
  for (int64_t b = 0; b < B; b++)
    for (int64_t l = 0; l < rows; l++)
      /* the defect: the source row lacks b * L * inner, so every batch row reads row 0's */
      memcpy(pd + (b * rows + l) * inner, ps + (off + l) * inner, (size_t)inner * sizeof(float));
  return tsr_dtensor_from_local(r, x->mesh, local, x->shape, p, out);
}
#endif

static tsr_status flaw_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)state;
  const tsr_placement S0 = tsr_shard(0);
#if defined(FLAW_SCALE) || defined(FLAW_STATIC) || defined(FLAW_LEAK_RULE)
  tsr_op_rule add = {.name = FLAW_NAME ".add",
                     .op = TSR_OP_ADD,
                     .mesh_dim = FLAW_DIM,
                     .ninputs = 2,
                     .inputs = {S0, S0},
                     .noutputs = 1,
                     .outputs = {S0},
                     .grads = {S0, S0},
                     .compute = add_forward,
                     .backward = add_backward,
                     .free_saved = add_saved_free,
                     .ctx = state};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &add));
#endif
#ifdef FLAW_STALE
  tsr_rank_state_spec kept = {FLAW_NAME ".kept", stale_setup, stale_teardown, state};
  TSR_CHECK(tsr_registry_add_rank_state(reg, &kept));
  tsr_optim_hook hook = {FLAW_NAME ".feedback", TSR_HOOK_BEFORE_STEP, stale_hook, state};
  TSR_CHECK(tsr_registry_add_optim_hook(reg, &hook));
#endif
#ifdef FLAW_SKIP
  tsr_optim_hook skip = {FLAW_NAME ".sync", TSR_HOOK_BEFORE_STEP, skip_hook, state};
  TSR_CHECK(tsr_registry_add_optim_hook(reg, &skip));
#endif
#ifdef FLAW_GROUP
  tsr_op_rule loss = {.name = FLAW_NAME ".cross_entropy",
                      .op = TSR_OP_CROSS_ENTROPY,
                      .mesh_dim = FLAW_DIM,
                      .ninputs = 2,
                      .inputs = {S0, S0},
                      .noutputs = 1,
                      .outputs = {tsr_partial(TSR_REDUCE_SUM)},
                      .grads = {S0, S0},
                      .compute = loss_forward,
                      .backward = loss_backward,
                      .ctx = state};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &loss));
#endif
#ifdef FLAW_TRANSITION
  tsr_redistribute_rule scatter = {FLAW_NAME ".scatter", FLAW_DIM, scatter_match, scatter_apply,
                                   state};
  TSR_CHECK(tsr_registry_add_redistribute(reg, &scatter));
  tsr_op_rule rope = {.name = FLAW_NAME ".rope",
                      .op = TSR_OP_ROPE,
                      .mesh_dim = FLAW_DIM,
                      .ninputs = 1,
                      .inputs = {tsr_shard(1)},
                      .noutputs = 1,
                      .outputs = {tsr_shard(1)},
                      .grads = {tsr_shard(1)}};
  TSR_CHECK(tsr_registry_add_op_rule(reg, &rope));
#endif
  return tsr_registry_add_data_split(reg, args->name, FLAW_DIM, S0);
}

static const tsr_strategy flaw_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = sizeof(tsr_strategy),
    .name = FLAW_NAME,
    .version = "0.0.1",
    .description = "a plugin with one deliberate defect, for the conformance suite's tests",
    .dims = flaw_dims,
    .init = flaw_init,
    .fini = flaw_fini,
    .register_rules = flaw_register,
};

TSR_PLUGIN_DEFINE(flaw_desc);
