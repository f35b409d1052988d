/* Periodic sharded checkpoints of a training run: save (each rank its shards), load onto any
 * mesh (each rank the slices it needs), the folders of [checkpoint] dir. */
#include "train_ckpt.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_shard.h"
#include "ckpt_writer.h"

#define LATEST "latest"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *ckpt_dir(const tsr_config *c, char *buf, size_t len) {
  return tsr_train_path(c, tsr_config_ext_of(c)->checkpoint.dir, buf, len);
}

/* ---- the job's keys ---- */

tsr_status tsr_train_ckpt_check(const tsr_config *c) {
  const tsr_config_ext *x = tsr_config_ext_of(c);
  bool dir = x->checkpoint.dir[0] != '\0';
  if (!dir && x->checkpoint.every > 0)
    return tsr_config_error(c, TSR_EINVAL, "checkpoint", "every",
                            "%lld without [checkpoint] dir: set dir to the folder the "
                            "checkpoints go to, or remove every",
                            (long long)x->checkpoint.every);
  if (!dir && x->checkpoint.keep_last > 0)
    return tsr_config_error(c, TSR_EINVAL, "checkpoint", "keep_last",
                            "%lld without [checkpoint] dir: set dir to the folder the "
                            "checkpoints go to, or remove keep_last",
                            (long long)x->checkpoint.keep_last);
  if (!dir && !strcmp(c->checkpoint.load, LATEST))
    return tsr_config_error(c, TSR_EINVAL, "checkpoint", "load",
                            "latest without [checkpoint] dir: set dir to the folder of the run's "
                            "checkpoints, or give a checkpoint file or folder");
  if (!dir && x->checkpoint_async.async)
    return tsr_config_error(c, TSR_EINVAL, "checkpoint", "async",
                            "true without [checkpoint] dir: async applies to the sharded saves "
                            "of dir; set dir, or remove async");
  if (!dir) return TSR_OK;
  char path[TSR_TRAIN_PATH_LEN];
  ckpt_dir(c, path, sizeof path);
  /* a forward job only reads dir (load = latest) */
  return tsr_app_check_out_folder(c, "checkpoint", "dir", path, c->job.mode == TSR_MODE_TRAIN);
}

bool tsr_train_ckpt_wants_load(const tsr_config *c) {
  if (!c->checkpoint.load[0]) return false;
  if (!strcmp(c->checkpoint.load, LATEST)) return true;
  char path[TSR_TRAIN_PATH_LEN];
  return tsr_ckpt_is_folder(tsr_train_path(c, c->checkpoint.load, path, sizeof path));
}

bool tsr_train_ckpt_due(const tsr_config *c, int64_t step) {
  const tsr_config_ext *x = tsr_config_ext_of(c);
  return x->checkpoint.dir[0] && x->checkpoint.every > 0 && step % x->checkpoint.every == 0;
}

/* ---- which rank writes which slice ---- */

typedef struct box {
  int64_t off[TSR_MAX_DIMS], shape[TSR_MAX_DIMS], numel;
} box;

static bool box_of(const tsr_dtensor *v, int rank, box *b) {
  if (!tsr_dtensor_local_shape(v->mesh, v->placements, v->ndim, v->shape, rank, b->shape, b->off))
    return false;
  b->numel = 1;
  for (int d = 0; d < v->ndim; d++) b->numel *= b->shape[d];
  return true;
}

static bool same_box(const box *a, const box *b, int ndim) {
  for (int d = 0; d < ndim; d++)
    if (a->off[d] != b->off[d] || a->shape[d] != b->shape[d]) return false;
  return true;
}

/* True when `rank` writes its box of v: it holds a non-empty one that no lower rank holds
 * (replicas are written once). */
static bool writes(const tsr_dtensor *v, int rank, box *mine) {
  if (!box_of(v, rank, mine) || mine->numel == 0) return false;
  const int *ranks = tsr_mesh_ranks(v->mesh);
  for (int k = 0; k < tsr_mesh_nranks(v->mesh); k++) {
    box other;
    if (ranks[k] < rank && box_of(v, ranks[k], &other) && same_box(mine, &other, v->ndim))
      return false;
  }
  return true;
}

static tsr_status check_placements(const tsr_train_rank *t, int i) {
  const tsr_dtensor *v = t->params[i]->value;
  for (int d = 0; d < tsr_mesh_ndim(v->mesh); d++)
    if (v->placements[d].kind == TSR_PARTIAL)
      return TSR_ERROR(TSR_EINVAL,
                       "checkpoint: parameter '%s' is Partial on mesh dim %s: a parameter must "
                       "be sharded or replicated to be saved",
                       t->names[i], tsr_mesh_dim_name(v->mesh, d));
  return TSR_OK;
}

static const char *const suffixes[3] = {"", ".exp_avg", ".exp_avg_sq"};

static const tsr_dtensor *state_of(const tsr_train_rank *t, int i, int which) {
  return which == 0   ? t->params[i]->value
         : which == 1 ? tsr_adamw_exp_avg(t->opt, i)
                      : tsr_adamw_exp_avg_sq(t->opt, i);
}

/* ---- save ---- */

static void kill_point(const char *point) {
  const char *want = getenv("TESSERA_TEST_SAVE_KILL");
  if (want && !strcmp(want, point)) raise(SIGKILL);
}

static tsr_status agree(tsr_group_t *all, tsr_status st) {
  int32_t mine = (int32_t)st, worst = 0;
  tsr_status cs = tsr_comm_all_reduce(all, &mine, &worst, 1, TSR_I32, TSR_REDUCE_MAX);
  if (cs != TSR_OK) return cs;
  if (st == TSR_OK && worst != TSR_OK)
    return tsr_error((tsr_status)worst, "checkpoint: another rank failed; see its message");
  return st;
}

/* The slices this rank writes, as tensor names and its shards (borrowed): what its file holds. */
typedef struct mine_list {
  int n;
  char **names;          /* (n) owned */
  const tsr_tensor **ts; /* (n) the rank's local shards */
  int64_t bytes;         /* of all n */
} mine_list;

static void mine_free(mine_list *m) {
  for (int k = 0; m->names && k < m->n; k++) free(m->names[k]);
  free(m->names);
  free(m->ts);
  memset(m, 0, sizeof *m);
}

static tsr_status collect_mine(tsr_train_rank *t, mine_list *m) {
  int me = tsr_rank_id(t->r);
  memset(m, 0, sizeof *m);
  m->names = calloc(3 * (size_t)t->nparams + 1, sizeof *m->names);
  m->ts = calloc(3 * (size_t)t->nparams + 1, sizeof *m->ts);
  if (!m->names || !m->ts) return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
  for (int i = 0; i < t->nparams; i++) {
    const tsr_dtensor *v = t->params[i]->value;
    box mine;
    if (!v->local || !writes(v, me, &mine)) continue;
    TSR_CHECK(check_placements(t, i));
    for (int w = 0; w < 3; w++) {
      const tsr_dtensor *x = state_of(t, i, w);
      if (!x || !x->local || tsr_tensor_numel(x->local) != mine.numel)
        return TSR_ERROR(TSR_EINTERNAL, "checkpoint: '%s%s' is not placed like its parameter",
                         t->names[i], suffixes[w]);
      size_t len = strlen(t->names[i]) + 16;
      if (!(m->names[m->n] = malloc(len)))
        return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
      snprintf(m->names[m->n], len, "%s%s", t->names[i], suffixes[w]);
      m->ts[m->n++] = x->local;
      m->bytes += (int64_t)tsr_tensor_nbytes(x->local);
    }
  }
  return TSR_OK;
}

/* This rank's file in the folder `tmp`, and the step in its metadata. */
static void rank_file(const tsr_train_rank *t, const char *tmp, int64_t step, char *path,
                      size_t len, char *step_str, size_t slen) {
  snprintf(path, len, "%s/rank-%05d.safetensors", tmp, tsr_rank_id(t->r));
  snprintf(step_str, slen, "%lld", (long long)step);
}

/* This rank's file: the slices it writes, straight from its shards (no copy on the CPU). */
static tsr_status write_mine(tsr_train_rank *t, const char *tmp, int64_t step, int64_t *bytes) {
  mine_list m;
  tsr_status st = collect_mine(t, &m);
  *bytes = m.bytes;
  if (st == TSR_OK && m.n > 0) {
    char path[TSR_TRAIN_PATH_LEN + 128], step_str[32];
    rank_file(t, tmp, step, path, sizeof path, step_str, sizeof step_str);
    const char *keys[2] = {"format", "step"}, *vals[2] = {TSR_CKPT_FORMAT, step_str};
    st = tsr_safetensors_save(path, m.n, (const char *const *)m.names, m.ts, 2, keys, vals);
  }
  mine_free(&m);
  return st;
}

/* A rank's box of a parameter, for sorting the mesh's boxes (then ranks) in order. */
typedef struct rank_box {
  box b;
  int rank;
} rank_box;

static int cmp_rank_box(const void *pa, const void *pb) {
  const rank_box *a = pa, *b = pb;
  for (int d = 0; d < TSR_MAX_DIMS; d++) {
    if (a->b.off[d] != b->b.off[d]) return a->b.off[d] < b->b.off[d] ? -1 : 1;
    if (a->b.shape[d] != b->b.shape[d]) return a->b.shape[d] < b->b.shape[d] ? -1 : 1;
  }
  return (a->rank > b->rank) - (a->rank < b->rank);
}

/* Rank 0: the index, from every parameter's placement (the same on every rank, whichever
 * stage holds it). The mesh's boxes are sorted, so that the lowest rank of each distinct box
 * (the one that writes it, as `writes` decides on that rank) comes first: O(m log m) for m
 * ranks. */
static tsr_status build_index(tsr_train_rank *t, int64_t step, tsr_ckpt_index *ix) {
  const tsr_config *c = t->job->cfg;
  memset(ix, 0, sizeof *ix);
  ix->step = ix->data_step = step;
  ix->world = (int)c->mesh.world;
  size_t used = 0;
  for (int d = 0; d < c->mesh.ndim && used < sizeof ix->mesh; d++)
    used += (size_t)snprintf(ix->mesh + used, sizeof ix->mesh - used, "%s%s=%d", d ? ", " : "",
                             c->mesh.names[d], c->mesh.shape[d]);
  rank_box *hs = calloc((size_t)ix->world + 1, sizeof *hs);
  int *file_of = malloc(((size_t)ix->world + 1) * sizeof *file_of);
  tsr_status st = hs && file_of ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
  for (int r = 0; st == TSR_OK && r < ix->world; r++) file_of[r] = -1;
  for (int i = 0; st == TSR_OK && i < t->nparams; i++) {
    const tsr_dtensor *v = t->params[i]->value;
    if ((st = check_placements(t, i)) != TSR_OK) break;
    int ti[3];
    char name[512];
    for (int w = 0; st == TSR_OK && w < 3; w++) {
      snprintf(name, sizeof name, "%s%s", t->names[i], suffixes[w]);
      st = tsr_ckpt_index_add_tensor(ix, name, w ? TSR_F32 : v->dtype, v->ndim, v->shape, &ti[w]);
    }
    const int *ranks = tsr_mesh_ranks(v->mesh);
    int m = 0;
    for (int k = 0; k < tsr_mesh_nranks(v->mesh) && m < ix->world; k++) {
      memset(&hs[m], 0, sizeof hs[m]);
      hs[m].rank = ranks[k];
      if (box_of(v, ranks[k], &hs[m].b) && hs[m].b.numel > 0) m++;
    }
    qsort(hs, (size_t)m, sizeof *hs, cmp_rank_box);
    for (int k = 0; st == TSR_OK && k < m; k++) {
      if (k > 0 && same_box(&hs[k].b, &hs[k - 1].b, v->ndim)) continue; /* a replica */
      int r = hs[k].rank;
      if (r < 0 || r >= ix->world) {
        st = TSR_ERROR(TSR_EINTERNAL, "checkpoint: rank %d outside the job's %d", r, ix->world);
        break;
      }
      if (file_of[r] < 0) {
        char file[64];
        snprintf(file, sizeof file, "rank-%05d.safetensors", r);
        if ((st = tsr_ckpt_index_add_file(ix, file, &file_of[r])) != TSR_OK) break;
      }
      for (int w = 0; st == TSR_OK && w < 3; w++)
        st = tsr_ckpt_index_add_slice(ix, ti[w], file_of[r], hs[k].b.off, hs[k].b.shape);
    }
  }
  free(hs);
  free(file_of);
  return st;
}

/* Rank 0, before the ranks write: the dir, and an empty temporary folder for this step. */
static tsr_status prepare(const char *dir, const char *tmp) {
  if (mkdir(dir, 0777) != 0 && errno != EEXIST)
    return TSR_ERROR(TSR_EIO, "%s: cannot create: %s", dir, strerror(errno));
  TSR_CHECK(tsr_ckpt_remove_folder(tmp)); /* a killed save's */
  if (mkdir(tmp, 0777) != 0)
    return TSR_ERROR(TSR_EIO, "%s: cannot create: %s", tmp, strerror(errno));
  return TSR_OK;
}

/* Rank 0, after every rank's file is written and synced: the index, then the rename that makes
 * the folder a checkpoint. */
static tsr_status publish(tsr_train_rank *t, int64_t step, const char *dir, const char *tmp,
                          const char *final) {
  tsr_ckpt_index ix;
  tsr_status st = build_index(t, step, &ix);
  if (st == TSR_OK) st = tsr_ckpt_index_write(tmp, &ix);
  tsr_ckpt_index_free(&ix);
  TSR_CHECK(st);
  tsr_ckpt_sync_dir(tmp);
  kill_point("index-written");
  /* a folder of this step already there (a run resumed from an earlier one) is replaced */
  char old[TSR_TRAIN_PATH_LEN + 64];
  snprintf(old, sizeof old, "%s/.step-%06lld.old.tmp", dir, (long long)step);
  bool replaced = false;
  if (tsr_ckpt_remove_folder(old) == TSR_OK && rename(final, old) == 0) replaced = true;
  if (rename(tmp, final) != 0) {
    int err = errno;
    if (replaced) rename(old, final); /* the folder it was to replace stays */
    return TSR_ERROR(TSR_EIO, "cannot rename %s to %s: %s", tmp, final, strerror(err));
  }
  tsr_ckpt_sync_dir(dir);
  kill_point("renamed");
  if (replaced) tsr_ckpt_remove_folder(old);
  tsr_ckpt_prune(dir, tsr_config_ext_of(t->job->cfg)->checkpoint.keep_last);
  return TSR_OK;
}

/* A field of /proc/self/status in bytes ("VmRSS", "VmHWM"), -1 where there is none. */
static int64_t proc_status_bytes(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long long kib = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, field, n) && line[n] == ':' && sscanf(line + n + 1, "%lld", &kib) == 1)
      break;
  fclose(f);
  return kib < 0 ? -1 : (int64_t)kib * 1024;
}

/* Resets the process's resident high-water mark (VmHWM) to its current size. */
static bool reset_hwm(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  bool ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok;
}

/* ---- [checkpoint] async ---- */

/* This rank's save whose file a thread writes from a snapshot, while the run goes on. */
struct tsr_train_ckpt_async {
  tsr_ckpt_writer *w; /* the snapshot and the thread; kept, buffers and all, between saves */
  int64_t step;       /* the step being written; -1: none */
  double t0;          /* when its save began (monotonic seconds) */
};

static void after_shard(void) {
  kill_point("shard-written");
}

/* The temporary and the final folder of step `step` of dir. */
static void step_paths(const char *dir, int64_t step, char *tmp, size_t tlen, char *final,
                       size_t flen) {
  snprintf(tmp, tlen, "%s/.step-%06lld.tmp", dir, (long long)step);
  snprintf(final, flen, "%s/step-%06lld", dir, (long long)step);
}

/* Test hook: TESSERA_TEST_SAVE_FAIL=STEP:RANK sends that rank's background file of that step
 * into a folder that does not exist, so that its write fails as a full disk would. */
static void fail_point(const tsr_train_rank *t, int64_t step, char *path, size_t len) {
  const char *want = getenv("TESSERA_TEST_SAVE_FAIL");
  long long s, r;
  if (!want || sscanf(want, "%lld:%lld", &s, &r) != 2 || s != step || r != tsr_rank_id(t->r))
    return;
  char *slash = strrchr(path, '/');
  if (!slash) return;
  char file[256];
  snprintf(file, sizeof file, "%s", slash + 1);
  snprintf(slash, len - (size_t)(slash - path), "/missing/%s", file);
}

/* This rank's writer, made at the first call. */
static tsr_status async_state(tsr_train_rank *t, tsr_train_ckpt_async **out) {
  tsr_train_ckpt_async *a = t->ckpt_async;
  if (!a) {
    if (!(a = calloc(1, sizeof *a))) return TSR_ERROR(TSR_ENOMEM, "checkpoint: out of memory");
    tsr_status st = tsr_ckpt_writer_new(&a->w);
    if (st != TSR_OK) {
      free(a);
      return st;
    }
    a->step = -1;
    t->ckpt_async = a;
  }
  *out = a;
  return TSR_OK;
}

tsr_status tsr_train_ckpt_async_begin(tsr_train_rank *t) {
  const tsr_config_ext *x = tsr_config_ext_of(t->job->cfg);
  if (!x->checkpoint.dir[0] || !x->checkpoint_async.async) return TSR_OK;
  tsr_train_ckpt_async *a;
  mine_list m;
  TSR_CHECK(async_state(t, &a));
  tsr_status st = collect_mine(t, &m);
  if (st == TSR_OK) st = tsr_ckpt_writer_reserve(a->w, m.n, m.ts);
  mine_free(&m);
  return st;
}

/* Every rank snapshots its slices and starts its writer; rank 0 made the temporary folder. */
static tsr_status save_async(tsr_train_rank *t, tsr_group_t *all, int64_t step, const char *dir,
                             const char *tmp, FILE *out) {
  bool lead = tsr_rank_id(t->r) == 0;
  tsr_train_ckpt_async *a = NULL;
  tsr_status st = async_state(t, &a);
  double t0 = now_s();
  if (st == TSR_OK && lead) st = prepare(dir, tmp);
  st = agree(all, st);
  int64_t bytes = 0;
  mine_list m = {0};
  if (st == TSR_OK) st = collect_mine(t, &m);
  if (st == TSR_OK) {
    char path[TSR_TRAIN_PATH_LEN + 128], step_str[32];
    rank_file(t, tmp, step, path, sizeof path, step_str, sizeof step_str);
    fail_point(t, step, path, sizeof path);
    const char *keys[2] = {"format", "step"}, *vals[2] = {TSR_CKPT_FORMAT, step_str};
    st = tsr_ckpt_writer_start(a->w, path, m.n, (const char *const *)m.names, m.ts, 2, keys, vals,
                               lead ? after_shard : NULL, &bytes);
  }
  mine_free(&m);
  st = agree(all, st);
  if (st != TSR_OK) {
    if (a) (void)tsr_ckpt_writer_wait(a->w); /* a started thread ends before the run does */
    return st;
  }
  a->step = step;
  a->t0 = t0;
  /* the largest rank's snapshot: its bytes and time */
  int64_t mine[2] = {bytes, (int64_t)((now_s() - t0) * 1e6)}, mx[2];
  TSR_CHECK(tsr_comm_all_reduce(all, mine, mx, 2, TSR_I64, TSR_REDUCE_MAX));
  if (lead && !t->opts->json)
    fprintf(out,
            "checkpoint: step %lld copied to host memory in %.3f s (largest rank %lld bytes); "
            "writing it in the background\n",
            (long long)step, 1e-6 * (double)mx[1], (long long)mx[0]);
  return TSR_OK;
}

tsr_status tsr_train_ckpt_pending(tsr_train_rank *t, tsr_group_t *all, bool wait, FILE *out) {
  tsr_train_ckpt_async *a = t->ckpt_async;
  if (!a || a->step < 0) return TSR_OK;
  if (!wait) {
    int32_t busy = tsr_ckpt_writer_done(a->w) ? 0 : 1, any = 0;
    TSR_CHECK(tsr_comm_all_reduce(all, &busy, &any, 1, TSR_I32, TSR_REDUCE_MAX));
    if (any) return TSR_OK; /* a rank is still writing: ask again after the next step */
  }
  const tsr_config *c = t->job->cfg;
  bool lead = tsr_rank_id(t->r) == 0;
  int64_t step = a->step;
  a->step = -1;
  char dir[TSR_TRAIN_PATH_LEN], tmp[TSR_TRAIN_PATH_LEN + 64], final[TSR_TRAIN_PATH_LEN + 64];
  char where[TSR_MAX_PATH + 160];
  ckpt_dir(c, dir, sizeof dir);
  step_paths(dir, step, tmp, sizeof tmp, final, sizeof final);
  double w0 = now_s();
  tsr_status st = tsr_ckpt_writer_wait(a->w);
  int64_t waited = (int64_t)((now_s() - w0) * 1e6);
  st = agree(all, st);
  if (lead && st == TSR_OK) {
    kill_point("shards-written");
    st = publish(t, step, dir, tmp, final);
  } else if (lead) {
    tsr_ckpt_remove_folder(tmp); /* no half checkpoint stays, not even under its temporary */
  }
  st = agree(all, st);
  if (st != TSR_OK)
    return tsr_error_prefix(st,
                            "%s: the background save of step %lld failed, so %s was not written "
                            "(the checkpoint before it is still the latest)",
                            tsr_config_where(c, "checkpoint", "async", where, sizeof where),
                            (long long)step, final);
  int64_t mx = 0;
  TSR_CHECK(tsr_comm_all_reduce(all, &waited, &mx, 1, TSR_I64, TSR_REDUCE_MAX));
  if (lead && !t->opts->json)
    fprintf(out,
            "checkpoint: step %lld saved to %s in %.3f s in the background; the training waited "
            "%.3f s for it\n",
            (long long)step, final, now_s() - a->t0, 1e-6 * (double)mx);
  return TSR_OK;
}

void tsr_train_ckpt_async_free(tsr_train_rank *t) {
  tsr_train_ckpt_async *a = t->ckpt_async;
  if (!a) return;
  tsr_ckpt_writer_free(a->w); /* waits for a write under way: it reads only its snapshot */
  free(a);
  t->ckpt_async = NULL;
}

tsr_status tsr_train_ckpt_save(tsr_train_rank *t, tsr_group_t *all, int64_t step, bool last,
                               FILE *out) {
  const tsr_config *c = t->job->cfg;
  char dir[TSR_TRAIN_PATH_LEN], tmp[TSR_TRAIN_PATH_LEN + 64], final[TSR_TRAIN_PATH_LEN + 64];
  char where[TSR_MAX_PATH + 160];
  ckpt_dir(c, dir, sizeof dir);
  step_paths(dir, step, tmp, sizeof tmp, final, sizeof final);
  bool lead = tsr_rank_id(t->r) == 0;
  /* one save at a time: the one under way completes (or fails) first */
  TSR_CHECK(tsr_train_ckpt_pending(t, all, true, out));
  /* the last save has no step to overlap, so it writes straight from the shards */
  if (tsr_config_ext_of(c)->checkpoint_async.async && !last) {
    tsr_status st = save_async(t, all, step, dir, tmp, out);
    if (st != TSR_OK)
      return tsr_error_prefix(st, "%s",
                              tsr_config_where(c, "checkpoint", "dir", where, sizeof where));
    return TSR_OK;
  }
  double t0 = now_s();
  /* the rank's memory during the save: the allocator's peak from here, put back after */
  tsr_allocator *a = tsr_rank_allocator(t->r);
  size_t before = a->bytes_in_use, old_peak = a->peak_bytes;
  a->peak_bytes = before;
  /* and the process's resident memory (all ranks of a local job, one under mpi) */
  bool proc = lead || strcmp(c->job.backend, "local");
  int64_t rss0 = proc && reset_hwm() ? proc_status_bytes("VmRSS") : -1;
  int64_t written = 0;
  tsr_status st = lead ? prepare(dir, tmp) : TSR_OK;
  st = agree(all, st);
  if (st == TSR_OK) st = write_mine(t, tmp, step, &written);
  if (lead && st == TSR_OK) kill_point("shard-written");
  st = agree(all, st);
  double t_files = now_s() - t0;
  if (lead && st == TSR_OK) {
    kill_point("shards-written");
    st = publish(t, step, dir, tmp, final);
  }
  st = agree(all, st);
  int64_t extra = (int64_t)(a->peak_bytes - before);
  int64_t hwm = rss0 >= 0 ? proc_status_bytes("VmHWM") : -1;
  int64_t rss_extra = rss0 >= 0 && hwm >= rss0 ? hwm - rss0 : -1;
  if (a->peak_bytes < old_peak) a->peak_bytes = old_peak;
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s",
                            tsr_config_where(c, "checkpoint", "dir", where, sizeof where));
  /* each rank's state (parameters and moments it holds), what it wrote and what the save added
   * to its memory: the largest of each, and the bytes of all files */
  int64_t held = 0;
  for (int i = 0; i < t->nparams; i++)
    for (int w = 0; w < 3; w++) {
      const tsr_dtensor *x = state_of(t, i, w);
      if (x && x->local) held += (int64_t)tsr_tensor_nbytes(x->local);
    }
  int64_t total = 0, mx[4] = {held, written, extra, rss_extra}, v[4];
  TSR_CHECK(tsr_comm_all_reduce(all, &written, &total, 1, TSR_I64, TSR_REDUCE_SUM));
  TSR_CHECK(tsr_comm_all_reduce(all, mx, v, 4, TSR_I64, TSR_REDUCE_MAX));
  if (lead && !t->opts->json) {
    char rss[64] = "n/a";
    if (v[3] >= 0) snprintf(rss, sizeof rss, "%lld", (long long)v[3]);
    fprintf(out,
            "checkpoint: step %lld saved to %s in %.3f s (files %.3f s): %lld bytes from %d "
            "rank%s; largest rank: state %lld bytes, wrote %lld, allocator +%lld during the "
            "save; process resident peak +%s\n",
            (long long)step, final, now_s() - t0, t_files, (long long)total, tsr_group_size(all),
            tsr_group_size(all) == 1 ? "" : "s", (long long)v[0], (long long)v[1], (long long)v[2],
            rss);
  }
  return TSR_OK;
}

/* ---- load ---- */

/* Every tensor of the index is one of the model's (parameter or moment) with its global shape. */
static tsr_status check_names(tsr_train_rank *t, const tsr_ckpt_index *ix, const char *folder) {
  for (int k = 0; k < ix->n; k++) {
    const tsr_ckpt_tensor *x = &ix->tensors[k];
    int found = -1;
    for (int i = 0; found < 0 && i < t->nparams; i++)
      for (int w = 0; w < 3; w++) {
        size_t len = strlen(t->names[i]);
        if (!strncmp(x->name, t->names[i], len) && !strcmp(x->name + len, suffixes[w])) found = i;
      }
    if (found < 0)
      return TSR_ERROR(TSR_EINVAL,
                       "%s: tensor '%s' is not one the model has; the checkpoint does not match "
                       "the model (check [model] against the one that saved it)",
                       folder, x->name);
    const tsr_dtensor *v = t->params[found]->value;
    bool same = v->ndim == x->ndim;
    for (int d = 0; same && d < v->ndim; d++) same = v->shape[d] == x->shape[d];
    if (!same) {
      char a[160], b[160];
      return TSR_ERROR(TSR_EINVAL,
                       "%s: tensor '%s' has shape %s, the model's is %s; the checkpoint does "
                       "not match the model (check [model] against the one that saved it)",
                       folder, x->name, tsr_shape_str(x->ndim, x->shape, a, sizeof a),
                       tsr_shape_str(v->ndim, v->shape, b, sizeof b));
    }
  }
  return TSR_OK;
}

/* Parameter `i`'s value and moments (or, for the tied replica, `src`'s from the files). */
static tsr_status load_param(tsr_train_rank *t, tsr_ckpt_reader *rd, int i, int src) {
  char name[512];
  for (int w = 0; w < 3; w++) {
    const tsr_dtensor *x = state_of(t, i, w);
    if (!x || !x->local) continue;
    box b;
    if (!box_of(x, tsr_rank_id(t->r), &b)) continue;
    snprintf(name, sizeof name, "%s%s", t->names[src], suffixes[w]);
    TSR_CHECK(tsr_ckpt_read_box(rd, name, b.off, x->local));
  }
  return TSR_OK;
}

/* Index of the parameter the tied replica copies (model.embed_tokens.weight); -1 without one. */
static int tied_source(const tsr_train_rank *t) {
  if (t->nopt <= t->nparams) return -1;
  for (int i = 0; i < t->nparams; i++)
    if (!strcmp(t->names[i], "model.embed_tokens.weight")) return i;
  return -1;
}

tsr_status tsr_train_ckpt_load(tsr_train_rank *t, bool *resumed) {
  const tsr_config *c = t->job->cfg;
  *resumed = false;
  char folder[TSR_TRAIN_PATH_LEN + 64], where[TSR_MAX_PATH + 160];
  bool lead = tsr_rank_id(t->r) == 0;
  FILE *out = t->opts->out ? t->opts->out : stdout;
  if (!strcmp(c->checkpoint.load, LATEST)) {
    char dir[TSR_TRAIN_PATH_LEN];
    int64_t step;
    tsr_ckpt_latest(ckpt_dir(c, dir, sizeof dir), folder, sizeof folder, &step);
    if (!folder[0]) {
      if (lead && !t->opts->json)
        fprintf(out, "checkpoint: no complete checkpoint in %s yet; starting from step 0\n", dir);
      return TSR_OK;
    }
  } else {
    tsr_train_path(c, c->checkpoint.load, folder, sizeof folder);
  }
  double t0 = now_s();
  tsr_ckpt_index ix;
  tsr_ckpt_reader rd = {0};
  tsr_status st = tsr_ckpt_index_read(folder, &ix);
  if (st != TSR_OK)
    return tsr_error_prefix(st, "%s",
                            tsr_config_where(c, "checkpoint", "load", where, sizeof where));
  TSR_CHECK_GOTO(check_names(t, &ix, folder), st);
  TSR_CHECK_GOTO(tsr_ckpt_reader_init(&rd, folder, &ix), st);
  for (int i = 0; i < t->nparams; i++) TSR_CHECK_GOTO(load_param(t, &rd, i, i), st);
  int src = tied_source(t);
  for (int i = t->nparams; i < t->nopt && src >= 0; i++)
    TSR_CHECK_GOTO(load_param(t, &rd, i, src), st);
  tsr_adamw_set_step(t->opt, ix.step);
  t->start_step = ix.step;
  *resumed = true;
  if (lead && !t->opts->json)
    fprintf(out,
            "checkpoint: loaded %s (step %lld, saved by %d rank%s on %s) in %.3f s; rank 0 read "
            "%lld bytes from %lld of the %d files\n",
            folder, (long long)ix.step, ix.world, ix.world == 1 ? "" : "s", ix.mesh, now_s() - t0,
            (long long)rd.bytes_read, (long long)rd.files_opened, ix.nfiles);
cleanup:
  tsr_ckpt_reader_close(&rd);
  tsr_ckpt_index_free(&ix);
  if (st != TSR_OK)
    st = tsr_error_prefix(st, "%s", tsr_config_where(c, "checkpoint", "load", where, sizeof where));
  return st;
}
