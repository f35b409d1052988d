/* `tessera conform`, level L3: the Llama model end to end.
 *
 * Each test runs the tiny model of cf_job_text's model 2 for one training step (forward, backward,
 * AdamW) twice through the training loop of `tessera run`: on one rank without plugins, and on a
 * mesh that puts the plugin to work, alone (each of its dims at 2 and 4 ranks) or beside one other
 * in-tree plugin (both dims at 2). The two dumps (logits, loss, every gradient and every parameter
 * after the step) must agree to rtol 1e-4, atol 1e-4, and bytes must have crossed the plugin's
 * dim in the step (the comm counters of the training log): a dim over which nothing moves ran the
 * model replicated, which matches the 1-rank run without splitting anything (a data layout the
 * model never applied). A combination that the plugins' validate refuses, or that finds no
 * sharding rule, is NOTSUP; on its own dims the plugin must run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conform.h"
#include "tessera/io.h"
#include "train.h"

/* One job from text, run with its dump written to `dump` and, when `log` is set, its training log
 * (one JSON object per step) to that file. */
static tsr_status run_job(const char *text, const char *dump, const char *log, bool *rejected) {
  tsr_app_job job;
  memset(&job, 0, sizeof job);
  tsr_status st = TSR_OK;
  char set[TSR_MAX_PATH + 32];
  *rejected = false;
  snprintf(set, sizeof set, "output.dump=%s", dump);
  TSR_CHECK_GOTO(tsr_config_parse_string(text, "conform-l3.ini", &job.cfg), st);
  TSR_CHECK_GOTO(tsr_config_set(job.cfg, set), st);
  TSR_CHECK_GOTO(tsr_registry_new(&job.reg), st);
  st = tsr_plugin_set_load(job.cfg, job.reg, &job.plugins);
  if (st != TSR_OK) {
    *rejected = true;
    goto cleanup;
  }
  const char *names[TSR_MAX_MESH_DIMS];
  for (int i = 0; i < job.cfg->mesh.ndim; i++) names[i] = job.cfg->mesh.names[i];
  TSR_CHECK_GOTO(tsr_mesh_init((int)job.cfg->mesh.world, job.cfg->mesh.ndim, job.cfg->mesh.shape,
                               names, &job.mesh),
                 st);
  FILE *out = fopen(log ? log : "/dev/null", "w");
  tsr_train_opts opts = {0, false, log != NULL, 0, out ? out : stdout};
  st = tsr_train_run(&job, &opts);
  if (out) fclose(out);
cleanup : {
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  tsr_mesh_free(job.mesh);
  tsr_registry_free(job.reg);
  tsr_plugin_set_free(job.plugins);
  tsr_config_free(job.cfg);
  if (st != TSR_OK) tsr_error(st, "%s", keep);
}
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

/* The communication of the last step in a JSON training log: its "comm" value, "label size
 * unit, ..." with one label per group (a mesh dim, or dims joined by '+'). "" when none. */
static void last_comm(const char *log, char *out, size_t len) {
  out[0] = '\0';
  FILE *f = fopen(log, "r");
  if (!f) return;
  char line[4096];
  while (fgets(line, sizeof line, f)) {
    const char *c = strstr(line, "\"comm\": \"");
    if (!c) continue;
    c += strlen("\"comm\": \"");
    snprintf(out, len, "%.*s", (int)strcspn(c, "\""), c);
  }
  fclose(f);
}

/* Bytes that crossed mesh dim `dim` by `comm` (last_comm): its own group's and those of groups
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

/* t->arg: "dims|shape|load|combo" with ';' between list entries; the first dim is the plugin's. */
static cf_result l3_model(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  if (!p->loaded) return cf_say(msg, len, CF_FAIL, "does not load: %s", p->load_msg);
  char arg[128], *save = NULL;
  snprintf(arg, sizeof arg, "%s", t->arg);
  char *dl = strtok_r(arg, "|", &save), *sl = strtok_r(NULL, "|", &save);
  char *load = strtok_r(NULL, "|", &save), *combo = strtok_r(NULL, "|", &save);
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
  /* in the test's own directory, which the driver removes even if this child is killed */
  char ref[TSR_MAX_PATH + 16], got[TSR_MAX_PATH + 16], log[TSR_MAX_PATH + 16];
  snprintf(ref, sizeof ref, "%s/ref.safetensors", cf_tmpdir);
  snprintf(got, sizeof got, "%s/got.safetensors", cf_tmpdir);
  snprintf(log, sizeof log, "%s/got.log", cf_tmpdir);
  static char text[8192];
  char extra[512] = "";
  int model;
  if (t->item > 0) cf_variant(p, 2 * t->item, &model, extra, sizeof extra);
  cf_result res = CF_PASS;
  bool rejected;
  cf_job_text(text, sizeof text, 0, NULL, NULL, "", 2, "train", "");
  if (run_job(text, ref, NULL, &rejected) != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL, "suite error: the 1-rank run failed: %s", tsr_last_error());
    goto done;
  }
  cf_job_text(text, sizeof text, nd, dims, shape, load, 2, "train", extra);
  tsr_status st = run_job(text, got, log, &rejected);
  if (st != TSR_OK) {
    /* beside other plugins, or with its keys changed, a refusal is a claim not made */
    bool unclaimed = (rejected || st == TSR_ENOTSUP) && (combination || t->item > 0);
    res = cf_say(msg, len, unclaimed ? CF_NOTSUP : CF_FAIL, "%s on %d ranks: %s",
                 rejected ? "job refused" : "run failed", world, tsr_last_error());
    goto done;
  }
  char report[2048] = "";
  int nbad = 0, nref = 0, ngot = 0;
  if (!dump_complete(ref, &nref) || !dump_complete(got, &ngot)) {
    res = cf_say(msg, len, CF_FAIL,
                 "a dump lacks logits, loss, grad.* or after.* (%d and %d "
                 "tensors)",
                 nref, ngot);
    goto done;
  }
  if (tsr_dump_compare(got, ref, 1e-4, 1e-4, report, sizeof report, &nbad) != TSR_OK) {
    res = cf_say(msg, len, CF_FAIL, "cannot compare the dumps: %s", tsr_last_error());
    goto done;
  }
  report[strcspn(report, "\n")] = '\0';
  char comm[1024];
  last_comm(log, comm, sizeof comm);
  if (nbad)
    res = cf_say(msg, len, CF_FAIL,
                 "%d tensors differ from the 1-rank run (rtol 1e-4, atol "
                 "1e-4); first: %s",
                 nbad, report);
  else if (!(dim_bytes(comm, dims[0]) > 0))
    res = cf_say(msg, len, CF_FAIL,
                 "the step matches the 1-rank run on %d ranks, but no bytes crossed %s (comm: "
                 "%s): the model ran replicated on it, so the plugin split nothing over its dim",
                 world, dims[0], comm[0] ? comm : "none");
  else
    res = cf_say(msg, len, CF_PASS,
                 "%d tensors (logits, loss, gradients, updated parameters) match the 1-rank run "
                 "on %d ranks; comm %s",
                 nref, world, comm);
done:
  unlink(ref);
  unlink(got);
  unlink(log);
  return res;
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
  }
}
