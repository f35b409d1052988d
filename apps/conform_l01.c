/* `tessera conform`: L0 (load and ABI) and L1 (the callbacks' contract).
 *
 * L0 reads the descriptor itself, field by field, so that each defect is its own failed test
 * with the field named; the loader's own verdict (tsr_plugin_probe) is one more test. L1 drives
 * the callbacks through the loader and directly, as two jobs in one process would.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"

/* ---- L0: load and ABI ---- */

#define DESC_OR_FAIL(d)                                                                            \
  void *handle_;                                                                                   \
  const tsr_strategy *d = cf_open_desc(p, &handle_, msg, len);                                     \
  if (!d) return CF_FAIL

static cf_result l0_open(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  void *h = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    return cf_say(msg, len, CF_FAIL, "dlopen(RTLD_NOW) failed: %s", e ? e : "unknown error");
  }
  return CF_PASS;
}

static cf_result l0_entry(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  void *sym = dlsym(handle_, TSR_PLUGIN_SYMBOL);
  tsr_plugin_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  if (entry(TSR_ABI_MAJOR, TSR_ABI_MINOR) != d)
    return cf_say(msg, len, CF_FAIL,
                  "%s returned another descriptor on the second call; return a pointer to one "
                  "static descriptor",
                  TSR_PLUGIN_SYMBOL);
  return CF_PASS;
}

static cf_result l0_abi(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (d->abi_major != TSR_ABI_MAJOR)
    return cf_say(msg, len, CF_FAIL,
                  "abi_major is %u, the core's is %d (plugin ABI %u.%u, core ABI %d.%d); rebuild "
                  "against this tessera's include/tessera",
                  d->abi_major, TSR_ABI_MAJOR, d->abi_major, d->abi_minor, TSR_ABI_MAJOR,
                  TSR_ABI_MINOR);
  if (d->abi_minor > TSR_ABI_MINOR)
    return cf_say(msg, len, CF_PASS, "built for ABI %u.%u, newer than the core's %d.%d",
                  d->abi_major, d->abi_minor, TSR_ABI_MAJOR, TSR_ABI_MINOR);
  return CF_PASS;
}

static cf_result l0_struct_size(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (d->struct_size < TSR_STRATEGY_SIZE_1_0)
    return cf_say(msg, len, CF_FAIL,
                  "struct_size is %u, less than the %zu bytes of an ABI %d.0 descriptor; set "
                  "struct_size = sizeof(tsr_strategy)",
                  d->struct_size, (size_t)TSR_STRATEGY_SIZE_1_0, TSR_ABI_MAJOR);
  return CF_PASS;
}

static cf_result l0_reserved(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (d->abi_major != TSR_ABI_MAJOR || d->struct_size < TSR_STRATEGY_SIZE_1_0)
    return cf_say(msg, len, CF_FAIL, "not read: the ABI or struct_size check fails first");
  if (d->flags) return cf_say(msg, len, CF_FAIL, "flags = 0x%x; ABI 1.0 defines none", d->flags);
  for (int i = 0; i < TSR_STRATEGY_RESERVED; i++)
    if (d->reserved[i])
      return cf_say(msg, len, CF_FAIL, "reserved[%d] is set; every reserved slot must be zero", i);
  return CF_PASS;
}

static cf_result l0_name(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (!d->name) return cf_say(msg, len, CF_FAIL, "name is NULL");
  if (!cf_ident(d->name, TSR_MAX_NAME))
    return cf_say(msg, len, CF_FAIL, "name '%s' is not an identifier of at most %d characters",
                  d->name, TSR_MAX_NAME - 1);
  if (!p->name[0])
    return cf_say(msg, len, CF_FAIL,
                  "the file %s is not named " TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX
                  ", so no job can load it",
                  p->path, d->name);
  if (strcmp(d->name, p->name))
    return cf_say(msg, len, CF_FAIL, "descriptor name '%s' differs from the file's name '%s'",
                  d->name, p->name);
  return CF_PASS;
}

static cf_result l0_version(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (!d->version || !d->version[0])
    return cf_say(msg, len, CF_FAIL, "version is %s; set it, e.g. \"0.1.0\"",
                  d->version ? "empty" : "NULL");
  const char *s = d->version;
  int parts = 0;
  while (isdigit((unsigned char)*s)) {
    while (isdigit((unsigned char)*s)) s++;
    parts++;
    if (*s != '.') break;
    s++;
  }
  if (parts < 2)
    return cf_say(msg, len, CF_FAIL, "version '%s' does not start with MAJOR.MINOR[.PATCH]",
                  d->version);
  return CF_PASS;
}

static cf_result l0_callbacks(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  const char *missing = !d->init             ? "init"
                        : !d->fini           ? "fini"
                        : !d->register_rules ? "register_rules"
                                             : NULL;
  if (missing) return cf_say(msg, len, CF_FAIL, "mandatory callback '%s' is NULL", missing);
  return CF_PASS;
}

static cf_result l0_dims(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  int n = 0;
  for (int i = 0; d->dims && d->dims[i]; i++, n++) {
    if (!cf_ident(d->dims[i], TSR_MAX_DIM_NAME))
      return cf_say(msg, len, CF_FAIL,
                    "dims[%d] '%s' is not an identifier of at most %d "
                    "characters",
                    i, d->dims[i], TSR_MAX_DIM_NAME - 1);
    for (int k = 0; k < i; k++)
      if (!strcmp(tsr_mesh_canonical_name(d->dims[k]), tsr_mesh_canonical_name(d->dims[i])))
        return cf_say(msg, len, CF_FAIL, "dims lists '%s' twice", d->dims[i]);
    if (i >= TSR_MAX_MESH_DIMS)
      return cf_say(msg, len, CF_FAIL, "more than %d dims", TSR_MAX_MESH_DIMS);
  }
  for (int i = 0; d->required && d->required[i]; i++) {
    if (!cf_ident(d->required[i], TSR_MAX_NAME))
      return cf_say(msg, len, CF_FAIL, "required[%d] '%s' is not a plugin name", i, d->required[i]);
    if (d->name && !strcmp(d->required[i], d->name))
      return cf_say(msg, len, CF_FAIL, "requires itself");
  }
  if (!n && !(d->required && d->required[0]))
    return cf_say(msg, len, CF_PASS,
                  "owns no dim and requires no plugin: it can only add to "
                  "dims of size 1");
  return CF_PASS;
}

static cf_result l0_keys(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  int n = 0;
  for (int i = 0; d->keys && d->keys[i].name; i++, n++) {
    const tsr_key_spec *k = &d->keys[i];
    if (i >= TSR_MAX_ENTRIES)
      return cf_say(msg, len, CF_FAIL, "more than %d keys", TSR_MAX_ENTRIES);
    if (!cf_ident(k->name, TSR_MAX_NAME))
      return cf_say(msg, len, CF_FAIL, "keys[%d] '%s' is not an identifier", i, k->name);
    for (int j = 0; j < i; j++)
      if (!strcmp(d->keys[j].name, k->name))
        return cf_say(msg, len, CF_FAIL, "key '%s' is declared twice", k->name);
    if ((unsigned)k->type > TSR_KEY_INTS)
      return cf_say(msg, len, CF_FAIL, "key '%s' has unknown type %d", k->name, (int)k->type);
    if (k->type == TSR_KEY_ENUM && (!k->choices || !k->choices[0]))
      return cf_say(msg, len, CF_FAIL, "enum key '%s' has no choices", k->name);
    if ((k->type == TSR_KEY_INT || k->type == TSR_KEY_FLOAT || k->type == TSR_KEY_INTS) &&
        !(k->min <= k->max))
      return cf_say(msg, len, CF_FAIL, "key '%s' has min %g > max %g", k->name, k->min, k->max);
    if (!k->doc || !k->doc[0])
      return cf_say(msg, len, CF_FAIL, "key '%s' has no doc line (shown by tessera plugins)",
                    k->name);
    if (k->default_value && tsr_key_check(k, k->default_value) != TSR_OK)
      return cf_say(msg, len, CF_FAIL, "key '%s': its default '%s' fails its own check: %s",
                    k->name, k->default_value, tsr_last_error());
  }
  if (!n) return cf_say(msg, len, CF_NOTSUP, "declares no [strategy.%s] keys", p->name);
  return CF_PASS;
}

static cf_result l0_loader(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  tsr_plugin_report rep;
  if (tsr_plugin_probe(p->path, NULL, &rep) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "the loader's %s check: %s", tsr_plugin_check_name(rep.failed),
                  rep.message);
  return CF_PASS;
}

/* ---- L1: the contract ---- */

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

static bool known(const char *s, const char *const *list, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s, list[i])) return true;
  return false;
}

static cf_result l1_register_scope(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (need_loaded(p, msg, len) != CF_PASS) return CF_FAIL;
  static const char *const ops[] = {"embedding", "rmsnorm", "linear", "view",         "rope",
                                    "sdpa",      "add",     "swiglu", "cross_entropy"};
  static const char *const styles[] = {"column_linear", "row_linear", "kv_linear", "embedding",
                                       "rmsnorm",       "attention",  "mlp"};
  for (int i = 0; i < p->nitems; i++) {
    const cf_item *it = &p->items[i];
    if (it->kind == CF_ITEM_OP && !known(it->op, ops, sizeof ops / sizeof ops[0]))
      return cf_say(msg, len, CF_FAIL, "rule '%s' is for op '%s', which no model op calls",
                    it->name, it->op);
    if (it->kind == CF_ITEM_STYLE && !known(it->name, styles, sizeof styles / sizeof styles[0]))
      return cf_say(msg, len, CF_FAIL, "module style '%s' is not one the model uses", it->name);
  }
  return cf_say(msg, len, CF_PASS, "%d registrations, %d optimizer hooks, %d gradient hooks",
                p->nitems, p->n_optim_hooks, p->n_grad_hooks);
}

void cf_add_l01(const cf_plugin *p) {
  (void)p;
  cf_add_test("L0.open", 0, l0_open, -1, 0, NULL);
  cf_add_test("L0.entry", 0, l0_entry, -1, 0, NULL);
  cf_add_test("L0.abi_version", 0, l0_abi, -1, 0, NULL);
  cf_add_test("L0.struct_size", 0, l0_struct_size, -1, 0, NULL);
  cf_add_test("L0.reserved", 0, l0_reserved, -1, 0, NULL);
  cf_add_test("L0.name", 0, l0_name, -1, 0, NULL);
  cf_add_test("L0.version", 0, l0_version, -1, 0, NULL);
  cf_add_test("L0.callbacks", 0, l0_callbacks, -1, 0, NULL);
  cf_add_test("L0.dims", 0, l0_dims, -1, 0, NULL);
  cf_add_test("L0.keys", 0, l0_keys, -1, 0, NULL);
  cf_add_test("L0.loader", 0, l0_loader, -1, 0, NULL);
  cf_add_test("L1.lifecycle", 1, l1_lifecycle, -1, 0, NULL);
  cf_add_test("L1.two_jobs", 1, l1_two_jobs, -1, 0, NULL);
  cf_add_test("L1.unknown_key", 1, l1_unknown_key, -1, 0, NULL);
  cf_add_test("L1.bad_values", 1, l1_bad_values, -1, 0, NULL);
  cf_add_test("L1.rejections", 1, l1_rejections, -1, 0, NULL);
  cf_add_test("L1.fini_after_failed_job", 1, l1_failed_job, -1, 0, NULL);
  cf_add_test("L1.register_scope", 1, l1_register_scope, -1, 0, NULL);
}
