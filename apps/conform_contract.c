/* `tessera conform`, level L1: the contract of the plugin's callbacks.
 *
 * The tests drive validate, init, register_rules and fini through the loader and directly, as two
 * jobs in one process would, and check that refusals come with a status and a message and that
 * what the plugin registers stays within what the model calls.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"

static cf_result need_loaded(const cf_plugin *p, char *msg, size_t len) {
  if (!p->described) return cf_say(msg, len, CF_FAIL, "the descriptor could not be read (see L0)");
  if (!p->name[0]) return cf_say(msg, len, CF_FAIL, "no plugin name (see L0.name)");
  if (!p->loaded) return cf_say(msg, len, CF_FAIL, "does not load: %s", p->load_msg);
  return CF_PASS;
}

/* A job that loads the plugin, its dims at size 1 (it registers but stays inactive). */
static void base_job(const cf_plugin *p, char *text, size_t len, const char *extra_load,
                     const char *extra) {
  char load[512];
  cf_load_list(p, load, sizeof load);
  if (extra_load) snprintf(load + strlen(load), sizeof load - strlen(load), ", %s", extra_load);
  const char *dims[CF_MAX_LIST];
  int shape[CF_MAX_LIST];
  for (int i = 0; i < p->ndims; i++) dims[i] = p->dims[i], shape[i] = 1;
  cf_job_text(text, len, p->ndims, dims, shape, load, 0, "train", extra);
}

static cf_result l1_lifecycle(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (!p->described || !p->name[0])
    return cf_say(msg, len, CF_FAIL, "the descriptor could not be read (see L0)");
  char text[8192];
  base_job(p, text, sizeof text, NULL, "");
  for (int round = 0; round < 3; round++) {
    tsr_config *cfg;
    tsr_registry_t *reg;
    tsr_plugin_set_t *set;
    if (cf_job_load(text, &cfg, &reg, &set) != TSR_OK)
      return cf_say(msg, len, CF_FAIL, "load %d of 3 (validate, init, register_rules): %s",
                    round + 1, tsr_last_error());
    cf_job_free(cfg, reg, set); /* fini */
  }
  return cf_say(msg, len, CF_PASS, "validate, init, register_rules and fini three times over");
}

/* Names of what a registry holds, to see that one job's fini leaves another's alone. */
static void registry_names(const tsr_registry_t *reg, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < tsr_registry_op_rule_count(reg) && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s/%s;", tsr_registry_op_rule_at(reg, i)->name,
                          tsr_registry_op_rule_at(reg, i)->op);
  for (int i = 0; i < tsr_registry_redistribute_count(reg) && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s;", tsr_registry_redistribute_at(reg, i)->name);
  for (int i = 0; i < tsr_registry_module_style_count(reg) && o < len; i++) {
    const tsr_module_style *s = tsr_registry_module_style_at(reg, i);
    o += (size_t)snprintf(buf + o, len - o, "%s@%s;", s->style, s->mesh_dim);
  }
  for (int i = 0; i < tsr_registry_schedule_count(reg) && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s;", tsr_registry_schedule_at(reg, i)->name);
}

static cf_result l1_two_jobs(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (need_loaded(p, msg, len) != CF_PASS) return CF_FAIL;
  char text[8192];
  base_job(p, text, sizeof text, NULL, "");
  tsr_config *c1, *c2;
  tsr_registry_t *r1, *r2;
  tsr_plugin_set_t *s1, *s2;
  if (cf_job_load(text, &c1, &r1, &s1) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "first job: %s", tsr_last_error());
  if (cf_job_load(text, &c2, &r2, &s2) != TSR_OK) {
    cf_job_free(c1, r1, s1);
    return cf_say(msg, len, CF_FAIL, "second job beside the first: %s", tsr_last_error());
  }
  static char a[16384], b[16384], after[16384];
  registry_names(r1, a, sizeof a);
  registry_names(r2, b, sizeof b);
  cf_job_free(c2, r2, s2);
  registry_names(r1, after, sizeof after);
  cf_result res = CF_PASS;
  if (strcmp(a, b))
    res = cf_say(msg, len, CF_FAIL,
                 "two identical jobs registered different things: [%.200s] "
                 "and [%.200s]",
                 a, b);
  else if (strcmp(a, after))
    res = cf_say(msg, len, CF_FAIL,
                 "the second job's fini changed the first job's "
                 "registrations (per-job state kept in a static?)");
  cf_job_free(c1, r1, s1);
  return res;
}

static cf_result expect_rejected(const char *text, const char *what, const char *must1,
                                 const char *must2, char *msg, size_t len) {
  tsr_config *cfg;
  tsr_registry_t *reg;
  tsr_plugin_set_t *set;
  tsr_status st = cf_job_load(text, &cfg, &reg, &set);
  if (st == TSR_OK) {
    cf_job_free(cfg, reg, set);
    return cf_say(msg, len, CF_FAIL, "%s was accepted", what);
  }
  const char *e = tsr_last_error();
  if (st != TSR_EINVAL)
    return cf_say(msg, len, CF_FAIL, "%s: status %s, expected EINVAL (bad input): %s", what,
                  tsr_status_name(st), e);
  if ((must1 && !strstr(e, must1)) || (must2 && !strstr(e, must2)))
    return cf_say(msg, len, CF_FAIL, "%s: the message does not name '%s': %s", what,
                  must1 && !strstr(e, must1) ? must1 : must2, e);
  return CF_PASS;
}

static cf_result l1_unknown_key(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (need_loaded(p, msg, len) != CF_PASS) return CF_FAIL;
  char text[8192], extra[256];
  snprintf(extra, sizeof extra, "[strategy.%s]\nconform_no_such_key = 1\n", p->name);
  base_job(p, text, sizeof text, NULL, extra);
  return expect_rejected(text, "an unknown key in [strategy.NAME]", "conform_no_such_key", NULL,
                         msg, len);
}

static cf_result l1_bad_values(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (need_loaded(p, msg, len) != CF_PASS) return CF_FAIL;
  if (!p->nkeys) return cf_say(msg, len, CF_NOTSUP, "declares no keys");
  for (int i = 0; i < p->nkeys; i++) {
    const cf_key *k = &p->keys[i];
    /* a value no key of the type accepts */
    char bad[64];
    switch (k->type) {
      case TSR_KEY_INT:
      case TSR_KEY_INTS:
        snprintf(bad, sizeof bad, "%.0f", k->max + 1 > 9e15 ? -1 : k->max + 1);
        if (k->max >= 9e15 && k->min <= -1) snprintf(bad, sizeof bad, "x7");
        break;
      case TSR_KEY_FLOAT:
        snprintf(bad, sizeof bad, "not_a_number");
        break;
      case TSR_KEY_BOOL:
        snprintf(bad, sizeof bad, "maybe");
        break;
      case TSR_KEY_ENUM:
        snprintf(bad, sizeof bad, "conform_no_such_choice");
        break;
      case TSR_KEY_NAMES:
        snprintf(bad, sizeof bad, "1not-a-name");
        break;
      default:
        continue; /* any string is a string */
    }
    char text[8192], extra[256], what[256];
    snprintf(extra, sizeof extra, "[strategy.%s]\n%s = %s\n", p->name, k->name, bad);
    snprintf(what, sizeof what, "%s = %s", k->name, bad);
    base_job(p, text, sizeof text, NULL, extra);
    if (expect_rejected(text, what, k->name, NULL, msg, len) != CF_PASS) return CF_FAIL;
  }
  return cf_say(msg, len, CF_PASS, "%d keys", p->nkeys);
}

/* Jobs that plugins commonly cannot split (a dim of 3-5 ranks over 4 heads, 5 tokens, 2 layers),
 * through the callbacks directly: whatever validate, init or register_rules refuses must come
 * with a status and a message; what init accepts, fini releases. */
static cf_result l1_rejections(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (need_loaded(p, msg, len) != CF_PASS) return CF_FAIL;
  void *h;
  const tsr_strategy *d = cf_open_desc(p, &h, msg, len);
  if (!d) return CF_FAIL;
  int rejected = 0, jobs = 0;
  for (int n = 3; n <= 5; n++)
    for (int i = 0; i < (p->ntest_dims ? p->ntest_dims : 1); i++) {
      const char *dims[1] = {p->ntest_dims ? p->test_dims[i] : "tp"};
      int shape[1] = {n};
      char text[8192];
      cf_job_text(text, sizeof text, 1, dims, shape, "", 2, "train", "");
      tsr_config *cfg;
      if (tsr_config_parse_string(text, "hostile.ini", &cfg) != TSR_OK)
        return cf_say(msg, len, CF_FAIL, "suite error: %s", tsr_last_error());
      cfg->data.seq_len = 5;
      cfg->model.num_hidden_layers = 2;
      tsr_plugin_args args = {cfg, p->name, p->path, TSR_ABI_MAJOR, TSR_ABI_MINOR};
      const char *stage = "validate";
      tsr_clear_error();
      tsr_status st = d->validate ? d->validate(&args) : TSR_OK;
      void *state = NULL;
      if (st == TSR_OK) {
        stage = "init";
        st = d->init(&args, &state);
        if (st == TSR_OK) {
          tsr_registry_t *reg = NULL;
          stage = "register_rules";
          st = tsr_registry_new(&reg);
          if (st == TSR_OK) st = d->register_rules(reg, &args, state);
          tsr_registry_free(reg);
          d->fini(state);
        }
      }
      char e[CF_MSG];
      snprintf(e, sizeof e, "%s", tsr_last_error());
      tsr_config_free(cfg);
      jobs++;
      if (st == TSR_OK) continue;
      rejected++;
      if (!e[0])
        return cf_say(msg, len, CF_FAIL, "%s returned %s for %s = %d without a message", stage,
                      tsr_status_name(st), dims[0], n);
    }
  if (!rejected)
    return cf_say(msg, len, CF_NOTSUP,
                  "accepted all %d jobs tried (dims of 3-5 over 4 heads, 5 tokens, 2 layers); "
                  "init, register_rules and fini ran on each",
                  jobs);
  return cf_say(msg, len, CF_PASS, "%d of %d jobs refused, each with a message", rejected, jobs);
}

static cf_result l1_failed_job(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (need_loaded(p, msg, len) != CF_PASS) return CF_FAIL;
  /* directly: init, then fini without register_rules, as the loader does when register_rules
   * fails; fini must not depend on what register_rules made */
  char text[8192];
  base_job(p, text, sizeof text, NULL, "");
  void *h;
  const tsr_strategy *d = cf_open_desc(p, &h, msg, len);
  if (!d) return CF_FAIL;
  tsr_config *cfg;
  if (tsr_config_parse_string(text, "conform.ini", &cfg) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "suite error: %s", tsr_last_error());
  tsr_plugin_args args = {cfg, p->name, p->path, TSR_ABI_MAJOR, TSR_ABI_MINOR};
  void *state = NULL;
  tsr_status st = d->validate ? d->validate(&args) : TSR_OK;
  if (st == TSR_OK) st = d->init(&args, &state);
  if (st != TSR_OK) {
    tsr_config_free(cfg);
    return cf_say(msg, len, CF_FAIL, "init on a job that loads refused: %s", tsr_last_error());
  }
  d->fini(state);
  tsr_config_free(cfg);
  /* through the loader: a plugin after this one whose section is wrong stops the job after this
   * one's init, the loader runs this one's fini, and the next job must still load */
  const char *other = NULL;
  for (size_t i = 0; i < CF_NKNOWN && !other; i++) {
    bool skip = !strcmp(cf_known_plugins[i], p->name) || !strcmp(cf_known_plugins[i], "sp");
    for (int r = 0; r < p->nrequired; r++) skip |= !strcmp(cf_known_plugins[i], p->required[r]);
    char f[TSR_MAX_PATH];
    if (!skip && cf_find_plugin(cf_known_plugins[i], f, sizeof f)) other = cf_known_plugins[i];
  }
  if (!other)
    return cf_say(msg, len, CF_PASS,
                  "init then fini without register_rules; no other plugin on "
                  "the search path to fail after it");
  char extra[256];
  snprintf(extra, sizeof extra, "[strategy.%s]\nconform_no_such_key = 1\n", other);
  base_job(p, text, sizeof text, other, extra);
  if (expect_rejected(text, "a job whose later plugin fails", other, "conform_no_such_key", msg,
                      len) != CF_PASS)
    return CF_FAIL;
  base_job(p, text, sizeof text, NULL, "");
  tsr_registry_t *reg;
  tsr_plugin_set_t *set;
  if (cf_job_load(text, &cfg, &reg, &set) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "after the failed job the plugin no longer loads: %s",
                  tsr_last_error());
  cf_job_free(cfg, reg, set);
  return cf_say(msg, len, CF_PASS,
                "init then fini without register_rules; fini ran after %s "
                "failed and the next job loads",
                other);
}

static bool in_list(const char *s, const char *const *list) {
  for (; s && *list; list++)
    if (!strcmp(s, *list)) return true;
  return false;
}

/* What register_rules added to `reg` beyond its first `nops` op rules and `nstyles` styles, held
 * against the vocabulary (tsr_op_names, tsr_module_style_names). The registry refuses anything
 * else when it is registered; this says so should a registration ever get past it. */
static bool within_vocabulary(const tsr_registry_t *reg, int nops, int nstyles, char *msg,
                              size_t len) {
  for (int i = nops; i < tsr_registry_op_rule_count(reg); i++) {
    const tsr_op_rule *r = tsr_registry_op_rule_at(reg, i);
    if (!in_list(r->op, tsr_op_names())) {
      cf_say(msg, len, CF_FAIL, "rule '%s' is for op '%s', which is not in tsr_op_names()", r->name,
             r->op);
      return false;
    }
  }
  for (int i = nstyles; i < tsr_registry_module_style_count(reg); i++) {
    const tsr_module_style *st = tsr_registry_module_style_at(reg, i);
    if (!in_list(st->style, tsr_module_style_names())) {
      cf_say(msg, len, CF_FAIL, "module style '%s' on %s is not in tsr_module_style_names()",
             st->style, st->mesh_dim);
      return false;
    }
  }
  return true;
}

/* The descriptor of a plugin the one under test requires, from the search path (its file in
 * path); NULL if none. */
static const tsr_strategy *required_desc(const char *name, char *path, size_t len) {
  if (!cf_find_plugin(name, path, len)) return NULL;
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  void *sym = h ? dlsym(h, TSR_PLUGIN_SYMBOL) : NULL;
  if (!sym) return NULL;
  tsr_plugin_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  const tsr_strategy *d = entry(TSR_ABI_MAJOR, TSR_ABI_MINOR);
  return d && d->abi_major == TSR_ABI_MAJOR ? d : NULL;
}

/* One job as the loader runs it, with the callbacks called directly: the required plugins, then
 * the plugin (descs[n - 1]), each validate, init and register_rules in turn into one registry,
 * on the whole job's config (a required plugin may leave styles to the plugin when the job loads
 * it). Returns false when the job did not get to the plugin's register_rules (a validate or init
 * refused it); otherwise sets *st to register_rules' status, `why` to its message, and checks
 * what it added against the vocabulary (*outside set, msg written, on a name outside it). */
static bool register_directly(const tsr_strategy *const *descs, const char *const *names,
                              const char (*paths)[TSR_MAX_PATH], int n, tsr_config *cfg,
                              tsr_status *st, char *why, size_t wlen, bool *outside, char *msg,
                              size_t len) {
  tsr_registry_t *reg = NULL;
  void *state[CF_MAX_LIST + 1] = {0};
  int inited = 0;
  bool ran = false;
  *outside = false;
  if (tsr_registry_new(&reg) != TSR_OK) return false;
  for (int i = 0; i < n; i++) {
    tsr_plugin_args args = {cfg, names[i], paths[i], TSR_ABI_MAJOR, TSR_ABI_MINOR};
    tsr_clear_error();
    if (descs[i]->validate && descs[i]->validate(&args) != TSR_OK) break;
    if (descs[i]->init(&args, &state[i]) != TSR_OK) break;
    inited++;
    int nops = tsr_registry_op_rule_count(reg), nstyles = tsr_registry_module_style_count(reg);
    tsr_clear_error();
    tsr_status rs = descs[i]->register_rules(reg, &args, state[i]);
    if (i < n - 1) {
      if (rs != TSR_OK) break; /* a required plugin's failure: not this plugin's job */
      continue;
    }
    ran = true;
    *st = rs;
    snprintf(why, wlen, "%s", tsr_last_error()[0] ? tsr_last_error() : "no message");
    if (rs == TSR_OK) *outside = !within_vocabulary(reg, nops, nstyles, msg, len);
  }
  while (inited-- > 0) descs[inited]->fini(state[inited]);
  tsr_registry_free(reg);
  return ran;
}

/* Every job discovery tries (each test dim at 1-4 ranks, each variant), run as the loader would
 * (register_directly). The registry refuses a rule for an op outside the vocabulary, the wrong
 * ninputs, use_mask on an input that is not a parameter, a style outside the vocabulary, a
 * parameter other than "weight", or a (style, dim) another plugin holds, and register_rules then
 * fails: the loader fails the plugin on every such job (its register check, so L1.lifecycle and
 * discovery fail too). This test names the plugin, the job and the registry's own message. A job
 * that a validate or init refuses is not the plugin's claim and is skipped. */
static cf_result l1_register_scope(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (!p->described || !p->name[0])
    return cf_say(msg, len, CF_FAIL, "the descriptor could not be read (see L0)");
  void *h;
  const tsr_strategy *descs[CF_MAX_LIST + 1];
  const char *names[CF_MAX_LIST + 1];
  static char paths[CF_MAX_LIST + 1][TSR_MAX_PATH];
  int n = 0;
  for (int i = 0; i < p->nrequired; i++) {
    names[n] = p->required[i];
    if (!(descs[n] = required_desc(p->required[i], paths[n], sizeof paths[n])))
      return cf_say(msg, len, CF_FAIL,
                    "required plugin %s: no usable " TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX
                    " on the plugin search path",
                    p->required[i], p->required[i]);
    n++;
  }
  names[n] = p->name;
  snprintf(paths[n], sizeof paths[n], "%s", p->path);
  if (!(descs[n++] = cf_open_desc(p, &h, msg, len))) return CF_FAIL;
  char load[512], extra[512], text[8192];
  cf_load_list(p, load, sizeof load);
  int jobs = 0, nd = p->ntest_dims ? p->ntest_dims : 1;
  for (int di = 0; di < nd; di++)
    for (int size = 1; size <= (p->ntest_dims ? 4 : 1); size++) {
      int model;
      for (int v = 0; cf_variant(p, v, &model, extra, sizeof extra); v++) {
        const char *dims[1] = {p->ntest_dims ? p->test_dims[di] : "dp"};
        int shape[1] = {size};
        tsr_config *cfg = NULL;
        cf_job_text(text, sizeof text, 1, dims, shape, load, model, "train", extra);
        if (tsr_config_parse_string(text, "conform.ini", &cfg) != TSR_OK)
          return cf_say(msg, len, CF_FAIL, "suite error: %s", tsr_last_error());
        tsr_status st = TSR_OK;
        char why[CF_MSG], what[512];
        bool outside;
        bool ran = register_directly(descs, names, (const char(*)[TSR_MAX_PATH])paths, n, cfg, &st,
                                     why, sizeof why, &outside, msg, len);
        tsr_config_free(cfg);
        if (!ran) continue;
        jobs++;
        if (st != TSR_OK)
          return cf_say(msg, len, CF_FAIL,
                        "plugin %s: register_rules failed (%s) on %s = %d (%s), so the loader "
                        "refuses every such job; the registry says: %s",
                        p->name, tsr_status_name(st), dims[0], size,
                        cf_variant_str(p, v, what, sizeof what), why);
        if (outside) return CF_FAIL;
      }
    }
  if (!jobs)
    return cf_say(msg, len, CF_NOTSUP,
                  "validate or init refused every job tried, so register_rules never ran (see "
                  "L1.lifecycle)");
  return cf_say(msg, len, CF_PASS,
                "register_rules accepted by the registry in %d jobs; registrations %d, optimizer "
                "hooks %d, gradient hooks %d",
                jobs, p->nitems, p->n_optim_hooks, p->n_grad_hooks);
}

void cf_add_contract_tests(const cf_plugin *p) {
  (void)p;
  cf_add_test("L1.lifecycle", 1, l1_lifecycle, -1, 0, NULL);
  cf_add_test("L1.two_jobs", 1, l1_two_jobs, -1, 0, NULL);
  cf_add_test("L1.jobs_isolated", 1, cf_jobs_isolated_test, -1, 0, NULL);
  cf_add_test("L1.leaks", 1, cf_leaks_test, -1, 0, NULL);
  cf_add_test("L1.unknown_key", 1, l1_unknown_key, -1, 0, NULL);
  cf_add_test("L1.bad_values", 1, l1_bad_values, -1, 0, NULL);
  cf_add_test("L1.rejections", 1, l1_rejections, -1, 0, NULL);
  cf_add_test("L1.fini_after_failed_job", 1, l1_failed_job, -1, 0, NULL);
  cf_add_test("L1.register_scope", 1, l1_register_scope, -1, 0, NULL);
}
