/* `tessera conform`, level L3: the Llama model end to end.
 *
 * Each test trains the tiny model of cf_job_text's model 2 for L3_STEPS optimizer steps (forward,
 * backward, clipping, AdamW) twice through the training loop of `tessera run`: on one rank
 * without plugins, and on a mesh that puts the plugin to work, alone (each of its dims at 2 and 4
 * ranks) or beside one other plugin (both dims at 2): each in-tree plugin, and zdp, the suite's
 * data split on a dim of a name no plugin knows, whose ranks hold different rows, so that a
 * collective on the wrong group, or on a group chosen by dim names, changes the result. Checked
 * against the 1-rank run: the first step's dump (logits, loss, every gradient and every
 * parameter after the step) element by element, every step's loss, and the parameters and AdamW
 * moments of the checkpoint written after the last step, tensor by tensor; and bytes must have
 * crossed the plugin's dim (the comm counters of the training log): a dim over which nothing
 * moves ran the model replicated, which matches the 1-rank run without splitting anything. A
 * combination that the plugins' validate refuses, or that finds no sharding rule, is NOTSUP; on
 * its own dims the plugin must run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conform.h"
#include "tessera/io.h"
#include "train.h"

#define L3_STEPS 5
/* The first step's dump against the 1-rank run's: every element. */
#define L3_RTOL 1e-4
#define L3_ATOL 1e-4
/* The loss of every step, and after the last step each parameter and its AdamW moments, as
 * tensors: ||got - ref|| <= L3_REL_L2 ||ref||. On every L3 mesh of the in-tree plugins the losses
 * stay within 3e-7 of the 1-rank run's and the state within 6e-5 after five steps (parameters
 * 2.5e-5, exp_avg 3.3e-5, exp_avg_sq 5.7e-5: AdamW's update is nearly the gradient's sign, so
 * rounding differences grow from step to step); TESSERA_CONFORM_ERRORS=1 prints each run's. The
 * bounds leave a factor of 30 and 9. A step whose update went wrong moves the next loss by 1e-2
 * and more. */
#define L3_LOSS_RTOL 1e-5
#define L3_REL_L2    5e-4

/* The files of one run, in the test's own directory (the driver removes it even if this child is
 * killed): the first step's dump, the training log (one JSON object per step) and the checkpoint
 * written after the last step (parameters, and beside them the AdamW moments). */
typedef struct l3_files {
  char dump[TSR_MAX_PATH + 32], log[TSR_MAX_PATH + 32], ckpt[TSR_MAX_PATH + 32];
  char optim[TSR_MAX_PATH + 48];
} l3_files;

static void l3_files_in_tmp(l3_files *f, const char *tag) {
  snprintf(f->dump, sizeof f->dump, "%s/%s.dump.safetensors", cf_tmpdir, tag);
  snprintf(f->log, sizeof f->log, "%s/%s.log", cf_tmpdir, tag);
  snprintf(f->ckpt, sizeof f->ckpt, "%s/%s.safetensors", cf_tmpdir, tag);
  tsr_checkpoint_optim_path(f->ckpt, f->optim, sizeof f->optim);
}

static void l3_files_remove(const l3_files *f) {
  unlink(f->dump);
  unlink(f->log);
  unlink(f->ckpt);
  unlink(f->optim);
}

static void l3_close(tsr_app_job *job);

/* Parses `text`, sets the run's steps and files, loads its plugins and makes its mesh.
 * *rejected: the plugins refused the job. On failure everything made is freed. */
static tsr_status l3_open_steps(const char *text, const l3_files *f, int steps, tsr_app_job *job,
                                bool *rejected) {
  memset(job, 0, sizeof *job);
  tsr_status st = TSR_OK;
  char set[3][TSR_MAX_PATH + 64];
  *rejected = false;
  snprintf(set[0], sizeof set[0], "job.steps=%d", steps);
  snprintf(set[1], sizeof set[1], "output.dump=%s", f ? f->dump : "");
  snprintf(set[2], sizeof set[2], "checkpoint.save=%s", f ? f->ckpt : "");
  TSR_CHECK_GOTO(tsr_config_parse_string(text, "conform-l3.ini", &job->cfg), st);
  for (int i = 0; i < (f ? 3 : 1); i++) TSR_CHECK_GOTO(tsr_config_set(job->cfg, set[i]), st);
  /* with the suite's watch of the rank allocators (cf_rank_leftover) */
  TSR_CHECK_GOTO(cf_watched_registry_new(&job->reg), st);
  st = tsr_plugin_set_load(job->cfg, job->reg, &job->plugins);
  if (st != TSR_OK) {
    *rejected = true;
    goto cleanup;
  }
  const char *names[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < job->cfg->mesh.ndim; i++) names[i] = job->cfg->mesh.names[i];
  TSR_CHECK_GOTO(tsr_mesh_init((int)job->cfg->mesh.world, job->cfg->mesh.ndim, job->cfg->mesh.shape,
                               names, &job->mesh),
                 st);
  return TSR_OK;
cleanup : {
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  l3_close(job);
  tsr_error(st, "%s", keep);
}
  return st;
}

static tsr_status l3_open(const char *text, const l3_files *f, tsr_app_job *job, bool *rejected) {
  return l3_open_steps(text, f, L3_STEPS, job, rejected);
}

static void l3_close(tsr_app_job *job) {
  tsr_mesh_free(job->mesh);
  tsr_registry_free(job->reg); /* before the plugins: it points into them */
  tsr_plugin_set_free(job->plugins);
  tsr_config_free(job->cfg);
  memset(job, 0, sizeof *job);
}

/* Trains the opened job, writing its files (f NULL: none, and no log). */
static tsr_status l3_train(const tsr_app_job *job, const l3_files *f) {
  FILE *out = fopen(f ? f->log : "/dev/null", "w");
  tsr_train_opts opts = {.json = true, .out = out ? out : stdout};
  tsr_status st = tsr_train_run(job, &opts);
  if (out) fclose(out);
  return st;
}

/* ---- What the runs reached ---- */

static void reach_path(char *buf, size_t len) {
  snprintf(buf, len, "%s/reach", cf_suite_dir);
}

/* Appends to the run's reach file the index of every op rule and transition of the plugin (its
 * items) that `reg` used. */
static void record_reach(const cf_plugin *p, const tsr_registry_t *reg) {
  char path[TSR_MAX_PATH + 16];
  if (!cf_suite_dir[0]) return;
  reach_path(path, sizeof path);
  FILE *f = fopen(path, "a");
  if (!f) return;
  for (int k = 0; k < p->nitems; k++) {
    const cf_item *it = &p->items[k];
    int64_t uses = 0;
    for (int i = 0; it->kind == CF_ITEM_OP && i < tsr_registry_op_rule_count(reg); i++) {
      const tsr_op_rule *r = tsr_registry_op_rule_at(reg, i);
      if (!strcmp(r->name, it->name) && !strcmp(r->op, it->op))
        uses += tsr_registry_op_rule_uses(reg, i);
    }
    for (int i = 0; it->kind == CF_ITEM_REDIST && i < tsr_registry_redistribute_count(reg); i++)
      if (!strcmp(tsr_registry_redistribute_at(reg, i)->name, it->name))
        uses += tsr_registry_redistribute_uses(reg, i);
    if (uses) fprintf(f, "%d\n", k);
  }
  fclose(f);
}

/* Which items the run's L3 tests reached so far. */
static void read_reach(const cf_plugin *p, bool *reached) {
  char path[TSR_MAX_PATH + 16], line[64];
  memset(reached, 0, (size_t)p->nitems * sizeof *reached);
  if (!cf_suite_dir[0]) return;
  reach_path(path, sizeof path);
  FILE *f = fopen(path, "r");
  if (!f) return;
  while (fgets(line, sizeof line, f)) {
    int k = atoi(line);
    if (k >= 0 && k < p->nitems) reached[k] = true;
  }
  fclose(f);
}

/* One job from text, opened, trained and closed; with p, what it reached of p's registrations is
 * recorded. */
static tsr_status l3_run(const char *text, const l3_files *f, bool *rejected, const cf_plugin *p) {
  tsr_app_job job;
  TSR_CHECK(l3_open(text, f, &job, rejected));
  tsr_status st = l3_train(&job, f);
  if (p && st == TSR_OK) record_reach(p, job.reg);
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  l3_close(&job);
  if (st != TSR_OK) tsr_error(st, "%s", keep);
  return st;
}

tsr_status cf_train_text(const char *text, int steps) {
  tsr_app_job job;
  bool rejected;
  TSR_CHECK(l3_open_steps(text, NULL, steps, &job, &rejected));
  tsr_status st = l3_train(&job, NULL);
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  l3_close(&job);
  if (st != TSR_OK) tsr_error(st, "%s", keep);
  return st;
}

/* How many tensors a dump has, and whether it has what a training step's dump must. */
static bool dump_complete(const char *path, int *n) {
  tsr_safetensors_t *f = NULL;
  *n = 0;
  if (tsr_safetensors_open(path, &f) != TSR_OK) return false;
  bool logits = false, loss = false, grad = false, after = false;
  *n = tsr_safetensors_count(f);
  for (int i = 0; i < *n; i++) {
    const char *name = tsr_safetensors_name(f, i);
    logits |= !strcmp(name, "logits");
    loss |= !strcmp(name, "loss");
    grad |= !strncmp(name, "grad.", 5);
    after |= !strncmp(name, "after.", 6);
  }
  tsr_safetensors_close(f);
  return logits && loss && grad && after;
}

/* The training log's steps: each one's loss and, of the last, its "comm" value ("label size
 * unit, ..." with one label per group: a mesh dim, or dims joined by '+'). Returns the number of
 * steps read. */
static int read_log(const char *log, double *loss, int cap, char *comm, size_t len) {
  comm[0] = '\0';
  FILE *f = fopen(log, "r");
  if (!f) return 0;
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    const char *l = strstr(line, "\"loss\": "), *c = strstr(line, "\"comm\": \"");
    if (!l) continue;
    if (n < cap) loss[n] = strtod(l + strlen("\"loss\": "), NULL);
    n++;
    if (c) {
      c += strlen("\"comm\": \"");
      snprintf(comm, len, "%.*s", (int)strcspn(c, "\""), c);
    }
  }
  fclose(f);
  return n;
}

/* Bytes that crossed mesh dim `dim` by `comm` (read_log): its own group's and those of groups
 * over it and other dims. */
static double dim_bytes(const char *comm, const char *dim) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  char buf[2048];
  double total = 0;
  snprintf(buf, sizeof buf, "%s", comm);
  for (char *s = NULL, *e = strtok_r(buf, ",", &s); e; e = strtok_r(NULL, ",", &s)) {
    char label[256], unit[16];
    double v;
    if (sscanf(e, " %255s %lf %15s", label, &v, unit) != 3) continue;
    bool over = false;
    for (char *s2 = NULL, *d = strtok_r(label, "+", &s2); d; d = strtok_r(NULL, "+", &s2))
      over |= !strcmp(d, dim);
    for (int u = 0; over && u < 5; u++, v *= 1024)
      if (!strcmp(unit, units[u])) total += v;
  }
  return total;
}

/* Every tensor of file `ref` against the same in `got`: ||got - ref|| <= bound ||ref||. Writes
 * the first that misses (or is missing) into msg; *worst gets the largest ratio seen. */
static int compare_state(const char *got, const char *ref, double bound, double *worst, char *msg,
                         size_t len) {
  tsr_safetensors_t *a = NULL, *b = NULL;
  int nbad = 0;
  if (tsr_safetensors_open(got, &a) != TSR_OK || tsr_safetensors_open(ref, &b) != TSR_OK) {
    snprintf(msg, len, "cannot read %s: %s", a ? ref : got, tsr_last_error());
    tsr_safetensors_close(a);
    return -1;
  }
  for (int i = 0; i < tsr_safetensors_count(b); i++) {
    const char *name = tsr_safetensors_name(b, i);
    tsr_tensor *x = NULL, *y = NULL;
    double d2 = 0, r2 = 0;
    bool ok = tsr_safetensors_has(a, name) &&
              tsr_safetensors_read_as(a, name, TSR_F32, &x) == TSR_OK &&
              tsr_safetensors_read_as(b, name, TSR_F32, &y) == TSR_OK &&
              tsr_tensor_numel(x) == tsr_tensor_numel(y);
    const float *px = ok ? tsr_tensor_data(x) : NULL, *py = ok ? tsr_tensor_data(y) : NULL;
    for (int64_t k = 0; ok && k < tsr_tensor_numel(y); k++) {
      double d = (double)px[k] - py[k];
      d2 += d * d;
      r2 += (double)py[k] * py[k];
    }
    double ratio = !ok ? INFINITY : r2 > 0 ? sqrt(d2 / r2) : d2 > 0 ? INFINITY : 0;
    if (ratio > *worst) *worst = ratio;
    if (!(ratio <= bound) && !nbad++) {
      if (!ok)
        snprintf(msg, len, "%s: missing, or of another shape", name);
      else
        snprintf(msg, len, "%s: ||got - 1 rank|| = %.2g ||1 rank||", name, ratio);
    }
    tsr_tensor_free(x);
    tsr_tensor_free(y);
  }
  tsr_safetensors_close(a);
  tsr_safetensors_close(b);
  return nbad;
}

/* The run `got` (on `world` ranks) against the 1-rank run `ref`: the first step's dump, every
 * step's loss, the parameters and AdamW moments after the last step, and, unless `dim` is NULL,
 * bytes over the plugin's dim `dim`. */
static cf_result l3_compare(const l3_files *got, const l3_files *ref, const char *dim, int world,
                            char *msg, size_t len) {
  int nref = 0, ngot = 0, nbad = 0;
  if (!dump_complete(ref->dump, &nref) || !dump_complete(got->dump, &ngot))
    return cf_say(msg, len, CF_FAIL,
                  "a dump lacks logits, loss, grad.* or after.* (%d and %d tensors)", nref, ngot);
  char report[2048] = "";
  if (tsr_dump_compare(got->dump, ref->dump, L3_RTOL, L3_ATOL, report, sizeof report, &nbad) !=
      TSR_OK)
    return cf_say(msg, len, CF_FAIL, "cannot compare the dumps: %s", tsr_last_error());
  report[strcspn(report, "\n")] = '\0';
  if (nbad)
    return cf_say(msg, len, CF_FAIL,
                  "step 1: %d tensors differ from the 1-rank run (rtol %g, atol %g); first: %s",
                  nbad, L3_RTOL, L3_ATOL, report);
  double lg[L3_STEPS], lr[L3_STEPS];
  char comm[1024], comm_ref[1024];
  int sg = read_log(got->log, lg, L3_STEPS, comm, sizeof comm);
  int sr = read_log(ref->log, lr, L3_STEPS, comm_ref, sizeof comm_ref);
  if (sg != L3_STEPS || sr != L3_STEPS)
    return cf_say(msg, len, CF_FAIL, "suite error: the training logs have %d and %d of %d steps",
                  sg, sr, L3_STEPS);
  for (int k = 0; k < L3_STEPS; k++)
    if (getenv("TESSERA_CONFORM_ERRORS")) /* for measuring the bounds */
      fprintf(stderr, "conform-l3-loss %.3g\n", fabs(lg[k] - lr[k]) / fabs(lr[k]));
  for (int k = 0; k < L3_STEPS; k++)
    if (!(fabs(lg[k] - lr[k]) <= L3_LOSS_RTOL * fabs(lr[k])))
      return cf_say(msg, len, CF_FAIL, "step %d: loss %.7g, the 1-rank run's %.7g (rtol %g)%s",
                    k + 1, lg[k], lr[k], L3_LOSS_RTOL,
                    k ? ": the parameters the step before left differ; the losses before agree"
                      : "");
  double worst = 0;
  char what[512];
  const char *files[2][2] = {{got->ckpt, ref->ckpt}, {got->optim, ref->optim}};
  for (int k = 0; k < 2; k++) {
    nbad = compare_state(files[k][0], files[k][1], L3_REL_L2, &worst, what, sizeof what);
    if (nbad < 0) return cf_say(msg, len, CF_FAIL, "after step %d: %s", L3_STEPS, what);
    if (nbad)
      return cf_say(msg, len, CF_FAIL,
                    "after step %d, %d %s differ from the 1-rank run (relative L2 error above "
                    "%g); first: %s",
                    L3_STEPS, nbad, k ? "AdamW moments (exp_avg, exp_avg_sq)" : "parameters",
                    L3_REL_L2, what);
  }
  if (getenv("TESSERA_CONFORM_ERRORS")) fprintf(stderr, "conform-l3-state %.3g\n", worst);
  if (dim && !(dim_bytes(comm, dim) > 0))
    return cf_say(msg, len, CF_FAIL,
                  "%d steps match the 1-rank run on %d ranks, but no bytes crossed %s (comm: "
                  "%s): the model ran replicated on it, so the plugin split nothing over its dim",
                  L3_STEPS, world, dim, comm[0] ? comm : "none");
  return cf_say(msg, len, CF_PASS,
                "%d steps match the 1-rank run on %d ranks (step 1's %d tensors, every loss, the "
                "parameters and AdamW moments after step %d to %.1g); comm %s",
                L3_STEPS, world, nref, L3_STEPS, worst, comm);
}

/* True when the job's plugins split the model into pipeline stages (a stage dim of size > 1), over
 * which the MoE model refuses its load-balancing loss ([model] router_aux_loss_coef > 0). */
static bool over_stages(int nd, const char *const *dims, const int *shape, const char *load,
                        const char *extra) {
  static char text[8192];
  tsr_app_job job;
  bool rejected, staged = false;
  cf_job_text(text, sizeof text, nd, dims, shape, load, CF_MODEL_MOE_NOAUX, "train", extra);
  if (l3_open_steps(text, NULL, 1, &job, &rejected) != TSR_OK) return false;
  const char *stage = tsr_registry_stage_dim(job.reg);
  for (int i = 0; stage && i < nd; i++) staged |= !strcmp(dims[i], stage) && shape[i] > 1;
  l3_close(&job);
  return staged;
}

/* t->arg: "dims|shape|load|combo[|model]" with ';' between list entries; the first dim is the
 * plugin's, model the cf_job_text model (default 2, the L3 model). */
static cf_result l3_model(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  if (!p->loaded) return cf_say(msg, len, CF_FAIL, "does not load: %s", p->load_msg);
  char arg[128], *save = NULL;
  snprintf(arg, sizeof arg, "%s", t->arg);
  char *dl = strtok_r(arg, "|", &save), *sl = strtok_r(NULL, "|", &save);
  char *load = strtok_r(NULL, "|", &save), *combo = strtok_r(NULL, "|", &save);
  char *model_arg = strtok_r(NULL, "|", &save);
  int l3m = model_arg ? atoi(model_arg) : 2;
  const char *dims[TSR_MAX_MESH_DIMS];
  int shape[TSR_MAX_MESH_DIMS], nd = 0, world = 1;
  for (char *s2 = NULL, *d = strtok_r(dl, ";", &s2); d && nd < TSR_MAX_MESH_DIMS;
       d = strtok_r(NULL, ";", &s2))
    dims[nd++] = d;
  int k = 0;
  for (char *s2 = NULL, *s = strtok_r(sl, ";", &s2); s && k < nd; s = strtok_r(NULL, ";", &s2))
    world *= shape[k++] = atoi(s);
  for (char *c = load; *c; c++)
    if (*c == ';') *c = ',';
  bool combination = combo && !strcmp(combo, "combo");
  l3_files ref, got;
  l3_files_in_tmp(&ref, "ref");
  l3_files_in_tmp(&got, "got");
  static char text[8192];
  char extra[512] = "";
  int model;
  if (t->item > 0) cf_variant(p, 2 * t->item, &model, extra, sizeof extra);
  cf_result res = CF_PASS;
  bool rejected;
  bool noaux = l3m == CF_MODEL_MOE && over_stages(nd, dims, shape, load, extra);
  if (noaux) l3m = CF_MODEL_MOE_NOAUX;
  cf_job_text(text, sizeof text, 0, NULL, NULL, "", l3m, "train", "");
  if (l3_run(text, &ref, &rejected, NULL) != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL, "suite error: the 1-rank run failed: %s", tsr_last_error());
    goto done;
  }
  cf_job_text(text, sizeof text, nd, dims, shape, load, l3m, "train", extra);
  cf_rank_leftover = 0;
  tsr_status st = l3_run(text, &got, &rejected, p);
  if (st != TSR_OK) {
    /* beside other plugins, or with its keys changed, a refusal is a claim not made */
    bool unclaimed = (rejected || st == TSR_ENOTSUP) && (combination || t->item > 0);
    res = cf_say(msg, len, unclaimed ? CF_NOTSUP : CF_FAIL, "%s on %d ranks: %s",
                 rejected ? "job refused" : "run failed", world, tsr_last_error());
    goto done;
  }
  res = l3_compare(&got, &ref, dims[0], world, msg, len);
  if (noaux && res == CF_PASS)
    snprintf(msg + strlen(msg), len - strlen(msg),
             "; without the load-balancing loss, which the model does not run over pipeline "
             "stages");
  if (res != CF_FAIL && cf_rank_leftover)
    res = cf_say(msg, len, CF_FAIL,
                 "the rank allocators still held %lld bytes when the ranks were freed after the "
                 "run: tensors a rule, transition, hook or rank state made and never freed",
                 (long long)cf_rank_leftover);
done:
  l3_files_remove(&ref);
  l3_files_remove(&got);
  return res;
}

cf_result cf_jobs_isolated_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (!p->loaded) return cf_say(msg, len, CF_FAIL, "does not load: %s", p->load_msg);
  if (!p->ntest_dims) return cf_say(msg, len, CF_NOTSUP, "no dim to run the model on");
  char load[512];
  cf_load_list(p, load, sizeof load);
  const char *dims[1] = {p->test_dims[0]};
  int shape[1] = {2};
  l3_files ref, got, other;
  l3_files_in_tmp(&ref, "ref");
  l3_files_in_tmp(&got, "job1");
  l3_files_in_tmp(&other, "job2");
  static char text[8192];
  cf_result res;
  bool rejected;
  tsr_app_job job1, job2;
  cf_job_text(text, sizeof text, 0, NULL, NULL, "", 2, "train", "");
  if (l3_run(text, &ref, &rejected, NULL) != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL, "suite error: the 1-rank run failed: %s", tsr_last_error());
    goto done;
  }
  cf_job_text(text, sizeof text, 1, dims, shape, load, 2, "train", "");
  if (l3_open(text, &got, &job1, &rejected) != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL, "job 1 (%s = 2) is refused: %s", dims[0], tsr_last_error());
    goto done;
  }
  if (l3_open(text, &other, &job2, &rejected) != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL, "job 2, made while job 1 exists, is refused: %s",
                 tsr_last_error());
    l3_close(&job1);
    goto done;
  }
  l3_close(&job2); /* fini of job 2 */
  /* a crash from here on is reported with this line */
  printf("running job 1 (%s = 2, %d steps) after job 2 was made and freed\n", dims[0], L3_STEPS);
  fflush(stdout);
  tsr_status st = l3_train(&job1, &got);
  if (st != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL,
                 "job 1 fails after a second job was made and freed (per-job state kept in a "
                 "static?): %s",
                 tsr_last_error());
    l3_close(&job1);
    goto done;
  }
  l3_close(&job1);
  char why[CF_MSG];
  res = l3_compare(&got, &ref, NULL, 2, why, sizeof why);
  if (res == CF_FAIL)
    res = cf_say(msg, len, CF_FAIL,
                 "job 1, run after a second job was made and freed, no longer matches the 1-rank "
                 "run (per-job state kept in a static?): %s",
                 why);
  else
    res = cf_say(msg, len, res,
                 "job 1 made, job 2 made and freed, then job 1's registrations run: %s", why);
done:
  l3_files_remove(&ref);
  l3_files_remove(&got);
  l3_files_remove(&other);
  return res;
}

/* L3.reach: every op rule and transition of the plugin must have run in some L3 run, so that
 * the comparisons with the 1-rank run (beside zdp included) covered its groups. What the L3 tests
 * before it did not reach is run for: the L3 model, then with tied embeddings, then with a single
 * kv head, then with MoE layers, then on packed documents with [data] mask = document, on each of
 * the plugin's dims at 2, alone and beside zdp, until everything is reached. */
static cf_result l3_reach(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (!p->loaded) return cf_say(msg, len, CF_FAIL, "does not load: %s", p->load_msg);
  bool reached[CF_MAX_ITEMS];
  int wanted = 0, before = 0, got_now = 0;
  read_reach(p, reached);
  for (int k = 0; k < p->nitems; k++) {
    bool counts = p->items[k].kind == CF_ITEM_OP || p->items[k].kind == CF_ITEM_REDIST;
    wanted += counts;
    before += counts && reached[k];
  }
  if (!wanted) return cf_say(msg, len, CF_NOTSUP, "registers no op rule or transition");
  static const int models[] = {2, 3, 4, CF_MODEL_MOE, CF_MODEL_DOCS};
  static const char *const model_names[] = {"the L3 model", "tied embeddings", "one kv head",
                                            "MoE layers", "document masking"};
  char req[256] = "", tried[512] = "", extra_runs[512] = "";
  for (int i = 0; i < p->nrequired; i++)
    snprintf(req + strlen(req), sizeof req - strlen(req), "%s,", p->required[i]);
  char zdp_path[TSR_MAX_PATH];
  bool has_zdp = strcmp(p->name, "zdp") && cf_find_plugin("zdp", zdp_path, sizeof zdp_path);
  for (int m = 0; m < 5 && before + got_now < wanted; m++)
    for (int d = 0; d < p->ntest_dims && before + got_now < wanted; d++)
      for (int z = 0; z < (has_zdp ? 2 : 1) && before + got_now < wanted; z++) {
        const char *dims[2] = {p->test_dims[d], "zdp"};
        int shape[2] = {2, 2};
        char load[512], what[160];
        snprintf(load, sizeof load, "%s%s%s", req, p->name, z ? ",zdp" : "");
        snprintf(what, sizeof what, "%s on %s = 2%s", model_names[m], dims[0],
                 z ? " beside zdp = 2" : "");
        l3_files ref, got;
        l3_files_in_tmp(&ref, "ref");
        l3_files_in_tmp(&got, "got");
        static char text[8192];
        bool rejected;
        cf_job_text(text, sizeof text, 0, NULL, NULL, "", models[m], "train", "");
        tsr_status st = l3_run(text, &ref, &rejected, NULL);
        if (st != TSR_OK)
          return cf_say(msg, len, CF_FAIL, "suite error: the 1-rank run of %s failed: %s",
                        model_names[m], tsr_last_error());
        cf_job_text(text, sizeof text, z ? 2 : 1, dims, shape, load, models[m], "train", "");
        cf_rank_leftover = 0;
        st = l3_run(text, &got, &rejected, p);
        snprintf(tried + strlen(tried), sizeof tried - strlen(tried), "%s%s", tried[0] ? "; " : "",
                 what);
        if (st != TSR_OK && (rejected || st == TSR_ENOTSUP)) {
          l3_files_remove(&ref);
          l3_files_remove(&got);
          continue; /* a job the plugins refuse is not claimed */
        }
        char why[CF_MSG];
        cf_result r = st != TSR_OK
                          ? cf_say(why, sizeof why, CF_FAIL, "run failed: %s", tsr_last_error())
                          : l3_compare(&got, &ref, dims[0], z ? 4 : 2, why, sizeof why);
        l3_files_remove(&ref);
        l3_files_remove(&got);
        if (r == CF_FAIL)
          return cf_say(msg, len, CF_FAIL, "%s, run to reach what L3 had not: %s", what, why);
        bool now[CF_MAX_ITEMS];
        read_reach(p, now);
        int more = 0;
        for (int k = 0; k < p->nitems; k++) more += now[k] && !reached[k];
        memcpy(reached, now, sizeof now);
        if (more)
          snprintf(extra_runs + strlen(extra_runs), sizeof extra_runs - strlen(extra_runs),
                   "%s%d with %s", extra_runs[0] ? ", " : "", more, what);
        got_now += more;
      }
  if (before + got_now < wanted) {
    char names[512] = "";
    for (int k = 0; k < p->nitems; k++)
      if ((p->items[k].kind == CF_ITEM_OP || p->items[k].kind == CF_ITEM_REDIST) && !reached[k])
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", names[0] ? ", " : "",
                 p->items[k].name);
    return cf_say(msg, len, CF_NOTSUP,
                  "%d of %d op rules and transitions never ran in an L3 run (tried: %s), so no "
                  "comparison with the 1-rank run covered their groups: %s",
                  wanted - before - got_now, wanted, tried[0] ? tried : "no dim", names);
  }
  return cf_say(msg, len, CF_PASS,
                "all %d op rules and transitions ran in L3 runs: %d in the tests "
                "above%s%s",
                wanted, before, got_now ? ", " : "", extra_runs);
}

/* True for a plugin that registers a rule for a mixture-of-experts op or the experts style: its
 * L3 runs include the model with MoE layers. */
static bool registers_moe(const cf_plugin *p) {
  for (int k = 0; k < p->nitems; k++) {
    const cf_item *it = &p->items[k];
    if ((it->kind == CF_ITEM_OP && cf_moe_op(it->op)) ||
        (it->kind == CF_ITEM_STYLE && !strcmp(it->name, TSR_STYLE_EXPERTS)))
      return true;
  }
  return false;
}

static bool listed(const char *list, const char *name) {
  char buf[TSR_MAX_VALUE];
  snprintf(buf, sizeof buf, "%s", list);
  for (char *s = NULL, *tok = strtok_r(buf, ", ", &s); tok; tok = strtok_r(NULL, ", ", &s))
    if (!strcmp(tok, name)) return true;
  return false;
}

void cf_add_model_tests(const cf_plugin *p) {
  if (!p->name[0] || !p->loaded) return; /* L1 and L2.discovery say why it does not load */
  char req[256] = "";
  for (int i = 0; i < p->nrequired; i++)
    snprintf(req + strlen(req), sizeof req - strlen(req), "%s;", p->required[i]);
  char arg[128], name[160];
  /* alone: each dim at 2 and 4 ranks */
  for (int i = 0; i < p->ntest_dims; i++)
    for (int n = 2; n <= 4; n += 2) {
      snprintf(arg, sizeof arg, "%s|%d|%s%s|alone", p->test_dims[i], n, req, p->name);
      snprintf(name, sizeof name, "L3.model.%s=%d", p->test_dims[i], n);
      cf_add_test(name, 3, l3_model, 0, n, arg);
    }
  /* the model with MoE layers, for a plugin that registers something for them: each dim at 2
   * and 4 ranks (4 experts); the combinations below run it too */
  for (int i = 0; registers_moe(p) && i < p->ntest_dims; i++) {
    for (int n = 2; n <= 4; n += 2) {
      snprintf(arg, sizeof arg, "%s|%d|%s%s|alone|%d", p->test_dims[i], n, req, p->name,
               CF_MODEL_MOE);
      snprintf(name, sizeof name, "L3.model.%s=%d.moe", p->test_dims[i], n);
      cf_add_test(name, 3, l3_model, 0, n, arg);
    }
  }
  /* alone with each key variant (an alternative schedule, layout, ...), first dim at 2 */
  char extra[512];
  int model;
  for (int kv = 1; p->ntest_dims && cf_variant(p, 2 * kv, &model, extra, sizeof extra); kv++) {
    char tag[128] = "";
    size_t o = 0;
    for (char *s = NULL, *line = strtok_r(extra, "\n", &s); line; line = strtok_r(NULL, "\n", &s)) {
      if (line[0] == '[') continue;
      for (char *c = line; *c; c++)
        if (*c != ' ' && o + 1 < sizeof tag) tag[o++] = *c;
      if (o + 1 < sizeof tag) tag[o++] = ',';
    }
    if (o) tag[o - 1] = '\0';
    snprintf(arg, sizeof arg, "%s|2|%s%s|alone", p->test_dims[0], req, p->name);
    snprintf(name, sizeof name, "L3.model.%s=2.%s", p->test_dims[0], tag);
    cf_add_test(name, 3, l3_model, kv, 2, arg);
  }
  /* beside each other in-tree plugin: this plugin's first dim and the other's at 2 */
  const char *mine = p->ntest_dims ? p->test_dims[0] : NULL;
  for (int k = 0; mine && k < p->nothers; k++) {
    const char *q = p->others[k].name, *qdim = p->others[k].dim, *qreq = p->others[k].required;
    bool skip = false;
    for (int r = 0; r < p->nrequired; r++) skip |= !strcmp(p->required[r], q);
    for (int d = 0; d < p->ndims; d++) skip |= listed(p->others[k].dims, p->dims[d]);
    if (skip) continue;
    char load[128];
    snprintf(load, sizeof load, "%s%s", req, p->name);
    if (qreq[0] && !listed(qreq, p->name)) {
      /* the other one's requirements (sp needs tp) go in too, unless this is one of them */
      char tmp[TSR_MAX_VALUE];
      snprintf(tmp, sizeof tmp, "%s", qreq);
      for (char *s = NULL, *tok = strtok_r(tmp, ", ", &s); tok; tok = strtok_r(NULL, ", ", &s))
        if (strcmp(tok, p->name) && !strstr(req, tok))
          snprintf(load + strlen(load), sizeof load - strlen(load), ";%s", tok);
    }
    snprintf(load + strlen(load), sizeof load - strlen(load), ";%s", q);
    /* a plugin without dims works on the dim of what it requires */
    const char *qd = qdim[0] ? qdim : NULL;
    if (!qd && qreq[0]) {
      static char first[TSR_MAX_DIM_NAME];
      snprintf(first, sizeof first, "%.*s", (int)strcspn(qreq, ", "), qreq);
      qd = !strcmp(first, "tp") ? "tp" : NULL; /* sp refines tp */
    }
    if (qd && !strcmp(qd, mine))
      snprintf(arg, sizeof arg, "%s|2|%s|combo", mine, load);
    else if (qd)
      snprintf(arg, sizeof arg, "%s;%s|2;2|%s|combo", mine, qd, load);
    else
      continue;
    snprintf(name, sizeof name, "L3.model.%s=2+%s", mine, q);
    cf_add_test(name, 3, l3_model, 0, 2, arg);
    if (!registers_moe(p)) continue;
    snprintf(arg + strlen(arg), sizeof arg - strlen(arg), "|%d", CF_MODEL_MOE);
    snprintf(name, sizeof name, "L3.model.%s=2+%s.moe", mine, q);
    cf_add_test(name, 3, l3_model, 0, 2, arg);
  }
  cf_add_test("L3.reach", 3, l3_reach, -1, 0, NULL);
}
