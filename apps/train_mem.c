/* Per-rank training state: predicted by `tessera plan`, measured by `tessera run`. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "train_mem.h"

static int64_t local_bytes(const tsr_dtensor *d) {
  return d && d->local ? (int64_t)tsr_tensor_nbytes(d->local) : 0;
}

tsr_train_mem tsr_train_mem_measure(tsr_train_rank *t) {
  tsr_train_mem m = {0, 0, 0};
  /* nopt: the tied embedding's last-stage replica (pp > 1) is held like a parameter */
  for (int i = 0; i < t->nopt; i++) {
    m.params += local_bytes(t->params[i]->value);
    m.grads += local_bytes(t->params[i]->grad);
  }
  for (int i = 0; i < tsr_adamw_param_count(t->opt); i++)
    m.optim +=
        local_bytes(tsr_adamw_exp_avg(t->opt, i)) + local_bytes(tsr_adamw_exp_avg_sq(t->opt, i));
  return m;
}

typedef struct plan_ctx {
  const tsr_app_job *job;
  tsr_train_mem *per_rank;
  char *params_text;    /* rank 0's parameter table, malloc'd */
  pthread_mutex_t lock; /* one rank's model at a time: the plan's footprint is one rank's */
} plan_ctx;

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "(");
  for (int i = 0; i < ndim && n < len; i++)
    n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < len) snprintf(buf + n, len - n, ")");
}

/* Which experts each rank holds, from the placement of the first MoE layer's stacked experts
 * (every MoE layer is placed alike): one line per distinct range. */
static void experts_table(FILE *f, tsr_llama_t *model) {
  for (int i = 0; i < tsr_llama_param_count(model); i++) {
    const tsr_dtensor *d = tsr_llama_param(model, i)->value;
    const char *name = tsr_llama_param_name(model, i);
    const char *tail = strstr(name, ".experts.w13");
    if (!tail || tail[strlen(".experts.w13")]) continue;
    int64_t E = d->shape[0];
    fprintf(f, "experts (%lld per MoE layer, placed as %.*s):\n", (long long)E, (int)(tail - name),
            name);
    int world = tsr_mesh_nranks(d->mesh), shown = 0;
    for (int r = 0; r < world && shown < 16; r++) {
      int64_t ls[TSR_MAX_DIMS], off[TSR_MAX_DIMS];
      int rank = tsr_mesh_ranks(d->mesh)[r];
      if (!tsr_dtensor_local_shape(d->mesh, d->placements, d->ndim, d->shape, rank, ls, off))
        continue;
      fprintf(f, "  rank %3d: experts %lld..%lld\n", rank, (long long)off[0],
              (long long)(off[0] + ls[0] - 1));
      shown++;
    }
    if (world > shown) fprintf(f, "  (%d more ranks)\n", world - shown);
    return;
  }
}

/* Rank 0's parameters: global shape, local shape and placement per mesh dim. Layers after the
 * first one this rank holds are placed alike, so they are counted, not listed. */
static char *params_table(tsr_llama_t *model) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  if (!f) return NULL;
  int first_layer = -1, more_layers = 0, last_layer = -1, elsewhere = 0;
  for (int i = 0; i < tsr_llama_param_count(model); i++) {
    const tsr_dtensor *d = tsr_llama_param(model, i)->value;
    const char *name = tsr_llama_param_name(model, i);
    if (!d->local) {
      elsewhere++;
      continue;
    }
    int layer = -1;
    if (sscanf(name, "model.layers.%d.", &layer) == 1) {
      if (first_layer < 0) first_layer = layer;
      if (layer != first_layer) {
        if (layer != last_layer) more_layers++;
        last_layer = layer;
        continue;
      }
    }
    char g[96], l[96], p[160] = "";
    shape_str(d->ndim, d->shape, g, sizeof g);
    shape_str(d->local->ndim, d->local->shape, l, sizeof l);
    size_t n = 0;
    for (int k = 0; k < tsr_mesh_ndim(d->mesh) && n < sizeof p; k++) {
      char b[32];
      n += (size_t)snprintf(p + n, sizeof p - n, "%s%s=%s", k ? " " : "",
                            tsr_mesh_dim_name(d->mesh, k),
                            tsr_placement_str(d->placements[k], b, sizeof b));
    }
    fprintf(f, "  %-48s %-12s -> %-12s %s\n", name, g, l, p[0] ? p : "(a stage of one rank)");
  }
  if (more_layers == 1)
    fprintf(f, "  (layer %d on this rank is placed as layer %d)\n", last_layer, first_layer);
  else if (more_layers)
    fprintf(f, "  (layers %d..%d on this rank are placed as layer %d)\n", first_layer + 1,
            last_layer, first_layer);
  if (elsewhere) fprintf(f, "  (%d parameters live on other pipeline stages)\n", elsewhere);
  experts_table(f, model);
  fclose(f);
  return text;
}

static tsr_status plan_rank(tsr_comm_t *comm, void *arg) {
  plan_ctx *p = arg;
  tsr_rank_t *r = NULL;
  tsr_llama_t *model = NULL;
  /* Building a model is local work (each rank initialises and keeps its own shards), so ranks
   * may take turns without a collective waiting on a rank that holds the lock. */
  pthread_mutex_lock(&p->lock);
  tsr_status st = tsr_rank_new(comm, p->job->reg, &r);
  if (st == TSR_OK) st = tsr_train_model_new(p->job, r, &model);
  if (st == TSR_OK) {
    tsr_train_mem m = {0, 0, 0};
    for (int i = 0; i < tsr_llama_param_count(model); i++)
      m.params += local_bytes(tsr_llama_param(model, i)->value);
    if (tsr_llama_tied_replica(model))
      m.params += local_bytes(tsr_llama_tied_replica(model)->value);
    /* Gradients take their parameter's placement (the Partial sums are reduced into it, under
     * FSDP by reduce-scatter), and AdamW keeps two moments shaped like each local shard. */
    m.grads = m.params;
    m.optim = 2 * m.params;
    p->per_rank[tsr_comm_rank(comm)] = m;
    if (tsr_comm_rank(comm) == 0) p->params_text = params_table(model);
  }
  tsr_llama_free(model);
  tsr_rank_free(r);
  pthread_mutex_unlock(&p->lock);
  return st;
}

tsr_status tsr_train_mem_plan(const tsr_app_job *job, tsr_train_mem *per_rank, char **params_text) {
  tsr_llama_config mc = tsr_train_model_config(job->cfg);
  int64_t n = tsr_llama_num_params(&mc);
  if (n > TSR_TRAIN_MEM_PLAN_MAX_PARAMS)
    return TSR_ERROR(TSR_ENOTSUP,
                     "%lld parameters: plan builds each rank's model to lay it out and stops at "
                     "%lld; `tessera run` measures the state per rank after its first step",
                     (long long)n, (long long)TSR_TRAIN_MEM_PLAN_MAX_PARAMS);
  plan_ctx p = {job, per_rank, NULL, PTHREAD_MUTEX_INITIALIZER};
  tsr_status st =
      tsr_local_launch((int)job->cfg->mesh.world, job->cfg->job.timeout_s, plan_rank, &p);
  if (params_text)
    *params_text = p.params_text;
  else
    free(p.params_text);
  return st;
}

tsr_status tsr_train_mem_gather(tsr_group_t *all, const tsr_train_mem *mine,
                                tsr_train_mem *per_rank) {
  int64_t v[3] = {mine->params, mine->grads, mine->optim};
  int world = tsr_group_size(all);
  int64_t *every = malloc((size_t)world * 3 * sizeof *every);
  if (!every) return TSR_ERROR(TSR_ENOMEM, "out of memory gathering %d ranks' state bytes", world);
  tsr_status st = tsr_comm_all_gather(all, v, 3, every, NULL, TSR_I64);
  for (int r = 0; st == TSR_OK && r < world; r++)
    per_rank[r] = (tsr_train_mem){every[3 * r], every[3 * r + 1], every[3 * r + 2]};
  free(every);
  return st;
}

static const char *mib(int64_t b, char *buf, size_t len) {
  snprintf(buf, len, "%.3f MiB", (double)b / (1024.0 * 1024.0));
  return buf;
}

static int64_t total(const tsr_train_mem *m) {
  return m->params + m->grads + m->optim;
}

void tsr_train_rank_group(FILE *f, int r, int world, bool *done,
                          bool (*same)(const void *ctx, int a, int b), const void *ctx) {
  fprintf(f, "  rank %d", r);
  int shown = 0, more = 0;
  for (int q = r + 1; done && q < world; q++) {
    if (done[q] || !same(ctx, r, q)) continue;
    done[q] = true;
    if (shown < 15)
      fprintf(f, ",%d", q), shown++;
    else
      more++;
  }
  if (more) fprintf(f, " (+%d more)", more);
}

static bool same_state(const void *ctx, int a, int b) {
  const tsr_train_mem *m = ctx;
  return m[a].params == m[b].params && m[a].grads == m[b].grads && m[a].optim == m[b].optim;
}

void tsr_train_mem_print(FILE *f, const tsr_app_job *job, const tsr_train_mem *per_rank,
                         const char *what) {
  int world = (int)job->cfg->mesh.world;
  tsr_llama_config mc = tsr_train_model_config(job->cfg);
  /* One rank, f32: parameters, gradients, and AdamW's two moments. */
  int64_t one = 4 * tsr_llama_num_params(&mc) * (int64_t)sizeof(float);
  char a[32], b[32], c[32], d[32];
  fprintf(f, "state per rank, %s (parameters + gradients + AdamW moments, f32; 1 rank: %s):\n",
          what, mib(one, a, sizeof a));
  bool *done = calloc((size_t)world, sizeof *done);
  for (int r = 0; r < world; r++) {
    if (done && done[r]) continue;
    const tsr_train_mem *m = &per_rank[r];
    /* ranks holding the same bytes share one line: the pattern over the mesh is the point */
    tsr_train_rank_group(f, r, world, done, same_state, per_rank);
    fprintf(f, ": params %s  grads %s  adamw %s  total %s = %.4f of 1 rank\n",
            mib(m->params, a, sizeof a), mib(m->grads, b, sizeof b), mib(m->optim, c, sizeof c),
            mib(total(m), d, sizeof d), one ? (double)total(m) / (double)one : 0.0);
  }
  free(done);
}
