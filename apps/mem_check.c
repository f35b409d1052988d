/* The up-front memory check of `plan` and `run`: the training state the job's ranks will hold in
 * this process against the memory this process may use, before any model is built. */
#define _GNU_SOURCE /* pthread_getattr_default_np */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "tessera/comm.h"
#include "tessera/kernels.h"
#include "train.h"
#include "train_act.h"
#include "train_mem.h"

/* The least of the limits found, and what it is as the start of a sentence that ends with the
 * bytes it leaves ("the machine's physical memory is"). */
typedef struct mem_limit {
  int64_t bytes; /* INT64_MAX: none found */
  char what[1400];
} mem_limit;

static void take(mem_limit *m, int64_t bytes, const char *what) {
  if (bytes >= 0 && bytes < m->bytes) {
    m->bytes = bytes;
    snprintf(m->what, sizeof m->what, "%s", what);
  }
}

/* The first integer in a file, or -1 ("max", missing, unreadable). */
static int64_t read_bytes(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  long long v = -1;
  if (fscanf(f, "%lld", &v) != 1) v = -1;
  fclose(f);
  return v;
}

/* cgroup v2: memory.max of this process's cgroup and of every cgroup above it; v1: the memory
 * controller's limit_in_bytes (values near 2^63 mean none). */
static void cgroup_limits(mem_limit *m) {
  FILE *f = fopen("/proc/self/cgroup", "r");
  if (!f) return;
  char line[1024];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    char path[1200], dir[1024];
    if (!strncmp(line, "0::", 3)) {
      snprintf(dir, sizeof dir, "%s", line + 3);
      for (;;) {
        /* the unified hierarchy: at the root, or beside v1 controllers (hybrid) */
        for (int u = 0; u < 2; u++) {
          snprintf(path, sizeof path, "/sys/fs/cgroup%s%s%smemory.max", u ? "/unified" : "", dir,
                   dir[strlen(dir) - 1] == '/' ? "" : "/");
          char what[1300];
          snprintf(what, sizeof what, "the cgroup limit %s is", path);
          take(m, read_bytes(path), what);
        }
        char *slash = strrchr(dir, '/');
        if (!slash || slash == dir) break;
        *slash = '\0';
      }
    } else if (strstr(line, ":memory:")) {
      snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes",
               strstr(line, ":memory:") + 8);
      int64_t v = read_bytes(path);
      if (v < 0) {
        snprintf(path, sizeof path, "/sys/fs/cgroup/memory/memory.limit_in_bytes");
        v = read_bytes(path);
      }
      char what[1300];
      snprintf(what, sizeof what, "the cgroup limit %s is", path);
      if (v < ((int64_t)1 << 60)) take(m, v, what);
    }
  }
  fclose(f);
}

/* Address space a rank thread of this process takes before its first tensor: the BLAS library's
 * per-thread GEMM buffer (OpenBLAS's BUFFER_SIZE, 128 MiB on x86-64; it retries a failed
 * allocation of it forever, so a process short of it hangs rather than fails), a malloc arena
 * (glibc reserves 64 MiB of address space for each, made when threads contend) and its stack. A
 * kernel thread of a rank adds a stack. Only the ulimits count reservations: physical memory and
 * cgroups count what is touched. */
#define TSR_MEM_BLAS_BUFFER_BYTES ((int64_t)128 << 20)
#define TSR_MEM_ARENA_BYTES       ((int64_t)64 << 20)

typedef struct thread_space {
  int64_t rank_threads;   /* ranks of this process (one thread each) */
  int64_t kernel_threads; /* the ranks' extra kernel threads */
  int64_t stack;          /* a new thread's stack (pthread's default) */
} thread_space;

static int64_t reserved(const thread_space *t, bool arenas) {
  int64_t per_rank = TSR_MEM_BLAS_BUFFER_BYTES + t->stack + (arenas ? TSR_MEM_ARENA_BYTES : 0);
  return t->rank_threads * per_rank + t->kernel_threads * t->stack;
}

/* ulimit -v (RLIMIT_AS) and ulimit -d (RLIMIT_DATA), less what this process maps already and what
 * its threads will reserve. */
static void rlimits(mem_limit *m, const thread_space *t) {
  long page = sysconf(_SC_PAGESIZE);
  int64_t mapped = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f) {
    long long pages = 0;
    if (fscanf(f, "%lld", &pages) == 1) mapped = (int64_t)pages * page;
    fclose(f);
  }
  static const struct {
    int resource;
    const char *name;
    bool arenas; /* an arena's reservation is PROT_NONE: address space, not data */
  } limits[] = {{RLIMIT_AS, "ulimit -v", true}, {RLIMIT_DATA, "ulimit -d", false}};
  for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
    struct rlimit rl;
    if (getrlimit(limits[i].resource, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) continue;
    int64_t cur = rl.rlim_cur > (rlim_t)INT64_MAX ? INT64_MAX : (int64_t)rl.rlim_cur;
    int64_t threads = reserved(t, limits[i].arenas);
    char what[512];
    snprintf(what, sizeof what,
             "%s = %.1f MiB, less the %.1f MiB this process maps already and the %.1f MiB its %lld "
             "rank thread%s reserve%s before any tensor (a %lld MiB BLAS buffer, %sa %.1f MiB "
             "stack each, and the kernel threads' stacks), leaves",
             limits[i].name, (double)cur / 1048576.0, (double)mapped / 1048576.0,
             (double)threads / 1048576.0, (long long)t->rank_threads,
             t->rank_threads == 1 ? "" : "s", t->rank_threads == 1 ? "s" : "",
             (long long)(TSR_MEM_BLAS_BUFFER_BYTES >> 20),
             limits[i].arenas ? "a 64 MiB malloc arena, " : "", (double)t->stack / 1048576.0);
    int64_t left = cur - mapped - threads;
    take(m, left > 0 ? left : 0, what);
  }
}

/* pthread's default stack for new threads (RLIMIT_STACK, or glibc's default when unlimited). */
static int64_t default_stack(void) {
  pthread_attr_t attr;
  size_t size = 8 << 20;
  if (pthread_getattr_default_np(&attr) == 0) {
    pthread_attr_getstacksize(&attr, &size);
    pthread_attr_destroy(&attr);
  }
  return (int64_t)size;
}

static mem_limit available(const thread_space *t) {
  mem_limit m = {INT64_MAX, ""};
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0) take(&m, (int64_t)pages * page, "the machine's physical memory is");
  cgroup_limits(&m);
  rlimits(&m, t);
  return m;
}

static const char *gib(double b, char *buf, size_t len) {
  if (b >= 1073741824.0)
    snprintf(buf, len, "%.2f GiB", b / 1073741824.0);
  else
    snprintf(buf, len, "%.1f MiB", b / 1048576.0);
  return buf;
}

/* The model's largest parameters by the state they carry (bytes per element: `per`), as text. */
static void largest_items(const tsr_llama_config *mc, double per, char *out, size_t len) {
  double C = mc->hidden_size, I = mc->intermediate_size, V = mc->vocab_size;
  double kv = (double)mc->num_key_value_heads * (mc->hidden_size / mc->num_attention_heads);
  double L = mc->num_hidden_layers;
  char a[32], b[32], c[32], d[32];
  snprintf(out, len,
           "the %lld layers' MLP weights (3 x %lld x %lld each) %s, their attention weights %s, "
           "model.embed_tokens.weight (%lld x %lld) %s%s%s",
           (long long)L, (long long)I, (long long)C, gib(per * L * 3 * I * C, a, sizeof a),
           gib(per * L * (2 * C * C + 2 * kv * C), b, sizeof b), (long long)V, (long long)C,
           gib(per * V * C, c, sizeof c), mc->tie_word_embeddings ? "" : ", lm_head.weight ",
           mc->tie_word_embeddings ? "" : gib(per * V * C, d, sizeof d));
}

tsr_status tsr_train_mem_check(const tsr_app_job *job, bool force, FILE *note) {
  const tsr_config *c = job->cfg;
  /* device memory holds the state of a cuda job; the host only stages it */
  if (c->job.device == TSR_DEVICE_CUDA) return TSR_OK;
  bool train = c->job.mode == TSR_MODE_TRAIN;
  /* f32 parameter and AdamW's two moments (made in either mode), and the gradient in training */
  int64_t per = (int64_t)sizeof(float) * (train ? 4 : 3);
  /* [checkpoint] async keeps a host copy of each rank's parameters and moments for its writer */
  const tsr_config_ext *x = tsr_config_ext_of(c);
  bool async = train && x->checkpoint.dir[0] && x->checkpoint_async.async;
  if (async) per += 3 * (int64_t)sizeof(float);
  int64_t world = c->mesh.world;
  /* local: every rank is a thread of this process; mpi, nccl: one rank per process */
  bool local = !strcmp(c->job.backend, "local");
  int64_t here = local ? world : 1;
  tsr_llama_config mc = tsr_train_model_config(c);
  int64_t n = tsr_llama_num_params(&mc);
  /* every element lives on some rank: this process holds at least its ranks' share of one copy,
   * and at most a whole copy per rank (the tied embedding's replica on the last stage too); in
   * double, as the largest models times the ranks pass 2^63 bytes */
  double low = (double)per * (double)n / (double)world * (double)here;
  double high = (double)per * ((double)n + (double)mc.vocab_size * mc.hidden_size) * (double)here;
  /* and the step's activations on top, predicted from shapes alone (train_act.c) */
  tsr_train_act *act = calloc((size_t)world, sizeof *act);
  if (!act) return TSR_ERROR(TSR_ENOMEM, "out of memory for %lld ranks", (long long)world);
  int64_t act_hi = 0; /* 0 for a schedule the run will refuse with its own message */
  if (tsr_train_act_plan(job, act) == TSR_OK)
    for (int64_t r = 0; r < world; r++)
      if (act[r].peak > act_hi) act_hi = act[r].peak;
  high += (double)act_hi * (double)here;
  int64_t threads =
      tsr_kernel_thread_budget(tsr_kernel_num_cores(), (int)(here < INT32_MAX ? here : INT32_MAX));
  thread_space space = {here, here * (threads - 1), default_stack()};
  mem_limit m = available(&space);
  char where[TSR_MAX_PATH + 160], ha[32], hb[32], hc[32], hd[32], items[512];
  snprintf(where, sizeof where, "%s: [model] and [mesh] shape", c->path);
  /* an address-space limit is also met by raising it: reservations are not resident memory */
  const char *fix = strncmp(m.what, "ulimit", 6)
                        ? "use a smaller model, more ranks (over backend = mpi, one process per "
                          "rank), a strategy that shards the state (FSDP: dp_shard), or --force "
                          "to try anyway"
                        : "raise the ulimit (address space reserved is not memory used), use a "
                          "smaller model, more ranks (over backend = mpi, one process per rank), "
                          "a strategy that shards the state (FSDP: dp_shard), or --force to try "
                          "anyway";
  if (m.bytes == INT64_MAX || high <= (double)m.bytes) {
    free(act);
    return TSR_OK;
  }
  if (low > (double)m.bytes) {
    free(act);
    largest_items(&mc, (double)per, items, sizeof items);
    if (force) {
      fprintf(note, "memory: --force: the state needs at least %s, more than the %s available\n",
              gib(low, ha, sizeof ha), gib((double)m.bytes, hb, sizeof hb));
      return TSR_OK;
    }
    char ranks[96];
    if (!local)
      snprintf(ranks, sizeof ranks, "each rank (one process each, as this one)");
    else if (world == 1)
      snprintf(ranks, sizeof ranks, "rank 0");
    else
      snprintf(ranks, sizeof ranks, "ranks 0..%lld (threads of this process)",
               (long long)world - 1);
    return tsr_error(TSR_ENOMEM,
                     "%s: the training state of %s needs at least %s (%.3g G parameters x %lld "
                     "bytes: f32 parameter, %sAdamW's two moments%s, split at best evenly over "
                     "the %lld ranks), but %s %s. The largest items: %s. No model was built; %s",
                     where, ranks, gib(low, ha, sizeof ha), (double)n / 1e9, (long long)per,
                     train ? "gradient, " : "",
                     async ? ", [checkpoint] async's copy of the parameter and moments" : "",
                     (long long)world, m.what, gib((double)m.bytes, hb, sizeof hb), items, fix);
  }
  /* between the bounds: the layout decides, and plan's per-rank figures are exact */
  tsr_train_mem *per_rank = NULL;
  if (n > TSR_TRAIN_MEM_PLAN_MAX_PARAMS || world > TSR_LOCAL_MAX_RANKS ||
      !(per_rank = calloc((size_t)world, sizeof *per_rank))) {
    free(act);
    return per_rank || n > TSR_TRAIN_MEM_PLAN_MAX_PARAMS || world > TSR_LOCAL_MAX_RANKS
               ? TSR_OK
               : TSR_ERROR(TSR_ENOMEM, "out of memory for %lld ranks", (long long)world);
  }
  tsr_status st = tsr_train_mem_plan(job, per_rank, NULL);
  int64_t sum = 0, top = 0;
  int worst = 0;
  for (int r = 0; st == TSR_OK && r < world; r++) {
    if (!train) per_rank[r].grads = 0;
    int64_t t = tsr_train_act_total(&per_rank[r], &act[r]) +
                (async ? per_rank[r].params + per_rank[r].optim : 0);
    sum += t;
    if (t > top) top = t, worst = r;
  }
  if (st != TSR_OK) {
    free(per_rank);
    free(act);
    return st;
  }
  int64_t need = here == 1 ? top : sum;
  tsr_train_mem w = per_rank[worst];
  /* beyond the state: the tapes and the step's workspace (the peak counts the gradients made) */
  int64_t wact = tsr_train_act_total(&w, &act[worst]) - w.params - w.grads - w.optim;
  char he[32], hf[32];
  free(per_rank);
  free(act);
  if (need <= m.bytes) return TSR_OK;
  if (force) {
    fprintf(note, "memory: --force: the state needs %s, more than the %s available\n",
            gib((double)need, ha, sizeof ha), gib((double)m.bytes, hb, sizeof hb));
    return TSR_OK;
  }
  char ranks[96];
  if (!local || world == 1)
    snprintf(ranks, sizeof ranks, "rank %d%s holds", worst,
             local ? "" : ", the largest (one rank per process),");
  else
    snprintf(ranks, sizeof ranks, "ranks 0..%lld (threads of this process) hold",
             (long long)here - 1);
  return tsr_error(TSR_ENOMEM,
                   "%s: %s %s at the peak of a step (training state and activations) as `plan` "
                   "lays it out, but %s %s. The largest rank, %d: parameters %s, gradients %s, "
                   "AdamW moments %s, activations and the step's workspace %s%s%s. No step was "
                   "run; %s",
                   where, ranks, gib((double)need, ha, sizeof ha), m.what,
                   gib((double)m.bytes, hb, sizeof hb), worst, gib((double)w.params, hc, sizeof hc),
                   gib((double)w.grads, hd, sizeof hd), gib((double)w.optim, items, sizeof items),
                   gib((double)wact, he, sizeof he),
                   async ? ", [checkpoint] async's snapshot " : "",
                   async ? gib((double)(w.params + w.optim), hf, sizeof hf) : "", fix);
}
