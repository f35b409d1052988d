/* `tessera conform`: discovery, L0 (load and ABI) and L1 (the callbacks' contract).
 *
 * L0 reads the descriptor itself, field by field, so that each defect is its own failed test
 * with the field named; the loader's own verdict (tsr_plugin_probe) is one more test. L1 drives
 * the callbacks through the loader and directly, as two jobs in one process would.
 */
#define _GNU_SOURCE /* strsignal */
#include <ctype.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "conform.h"

/* The other plugins of the tree, for the combinations of L1 and L3. */
static const char *const known_plugins[] = {"dp", "tp", "sp", "pp", "cp_ring", "cp_ulysses"};

/* ---- Jobs ---- */

typedef struct cf_model {
  int vocab, hidden, inter, layers, heads, kv, batch, seq;
} cf_model;

/* 0, 1: the L2 registration jobs (12 heads split over 1-4 ranks; kv heads split, or a single kv
 * head replicated); 2: the L3 model, small enough to run a step in milliseconds. */
static const cf_model models[] = {
    {48, 48, 64, 4, 12, 12, 4, 24},
    {48, 48, 64, 4, 12, 1, 4, 24},
    {32, 32, 40, 4, 4, 2, 6, 16},
};

void cf_job_text(char *buf, size_t len, int ndim, const char *const *dims, const int *shape,
                 const char *load, int model, const char *mode, const char *extra) {
  const cf_model *m = &models[model];
  char d[512] = "dp", s[128] = "1";
  size_t od = 0, os = 0;
  for (int i = 0; i < ndim; i++) {
    od += (size_t)snprintf(d + od, sizeof d - od, "%s%s", i ? ", " : "", dims[i]);
    os += (size_t)snprintf(s + os, sizeof s - os, "%s%d", i ? ", " : "", shape[i]);
  }
  snprintf(buf, len,
           "[job]\nmode = %s\nsteps = 1\nseed = 7\nbackend = local\ndevice = cpu\ntimeout_s = 20\n"
           "[mesh]\ndims = %s\nshape = %s\n"
           "[plugins]\nload = %s\n"
           "[model]\nvocab_size = %d\nhidden_size = %d\nintermediate_size = %d\n"
           "num_hidden_layers = %d\nnum_attention_heads = %d\nnum_key_value_heads = %d\n"
           "rms_norm_eps = 1e-5\nrope_theta = 10000\ntie_word_embeddings = false\n"
           "[data]\nsource = synthetic\nbatch_size = %d\nseq_len = %d\n"
           "[optimizer]\nlr = 1e-2\nweight_decay = 0.1\nmax_norm = 1.0\n%s",
           mode, d, s, load, m->vocab, m->hidden, m->inter, m->layers, m->heads, m->kv, m->batch,
           m->seq, extra ? extra : "");
}

void cf_load_list(const cf_plugin *p, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < p->nrequired; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s, ", p->required[i]);
  snprintf(buf + o, len - o, "%s", p->name);
}

tsr_status cf_job_load(const char *text, tsr_config **cfg, tsr_registry_t **reg,
                       tsr_plugin_set_t **set) {
  *cfg = NULL, *reg = NULL, *set = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_config_parse_string(text, "conform.ini", cfg), st);
  TSR_CHECK_GOTO(tsr_registry_new(reg), st);
  TSR_CHECK_GOTO(tsr_plugin_set_load(*cfg, *reg, set), st);
  return TSR_OK;
cleanup : {
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  cf_job_free(*cfg, *reg, *set);
  *cfg = NULL, *reg = NULL, *set = NULL;
  tsr_error(st, "%s", keep);
}
  return st;
}

void cf_job_free(tsr_config *cfg, tsr_registry_t *reg, tsr_plugin_set_t *set) {
  tsr_registry_free(reg); /* before the plugins: it points into them */
  tsr_plugin_set_free(set);
  tsr_config_free(cfg);
}

/* The alternatives of one ENUM or BOOL key other than its default. */
static int key_alternatives(const cf_key *key, char alts[][TSR_MAX_VALUE], int cap) {
  int nalt = 0;
  if (key->type == TSR_KEY_BOOL) {
    snprintf(alts[nalt++], TSR_MAX_VALUE, "%s", strcmp(key->def, "true") ? "true" : "false");
  } else if (key->type == TSR_KEY_ENUM) {
    const char *c = key->choices;
    while (*c && nalt < cap) {
      size_t l = strcspn(c, "|");
      if (!key->has_default || strlen(key->def) != l || strncmp(c, key->def, l))
        snprintf(alts[nalt++], TSR_MAX_VALUE, "%.*s", (int)l, c);
      c += l + (c[l] == '|');
    }
  }
  return nalt;
}

/* Variant v: model v % 2; key variant v / 2: 0 = defaults, then each ENUM/BOOL alternative
 * alone, then each again with every INT key one above its default (an alternative such as an
 * interleaved schedule may need a second key to change with it). */
bool cf_variant(const cf_plugin *p, int v, int *model, char *extra, size_t len) {
  *model = v % 2;
  int want = v / 2, k = 0;
  extra[0] = '\0';
  if (want == 0) return true;
  bool ints = false;
  for (int j = 0; j < p->nkeys; j++)
    ints |= p->keys[j].type == TSR_KEY_INT && p->keys[j].has_default;
  for (int pass = 0; pass < (ints ? 2 : 1); pass++)
    for (int i = 0; i < p->nkeys; i++) {
      char alts[8][TSR_MAX_VALUE];
      int nalt = key_alternatives(&p->keys[i], alts, 8);
      for (int a = 0; a < nalt; a++) {
        if (++k != want) continue;
        size_t o = (size_t)snprintf(extra, len, "[strategy.%s]\n%s = %s\n", p->name,
                                    p->keys[i].name, alts[a]);
        for (int j = 0; pass == 1 && j < p->nkeys && o < len; j++) {
          const cf_key *n = &p->keys[j];
          if (n->type != TSR_KEY_INT || !n->has_default) continue;
          double up = atof(n->def) + 1;
          if (up <= n->max) o += (size_t)snprintf(extra + o, len - o, "%s = %.0f\n", n->name, up);
        }
        return true;
      }
    }
  return false;
}

bool cf_find_plugin(const char *name, char *out, size_t len) {
  static char dirs[32][TSR_MAX_PATH];
  int n = tsr_plugin_search_dirs(NULL, NULL, dirs, 32);
  for (int i = 0; i < n; i++) {
    char c[TSR_MAX_PATH + TSR_MAX_NAME + 32];
    struct stat st;
    int l = snprintf(c, sizeof c, "%s/" TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX, dirs[i], name);
    if (l < 0 || (size_t)l >= sizeof c || (size_t)l >= len) continue;
    if (stat(c, &st) == 0 && S_ISREG(st.st_mode)) {
      memcpy(out, c, (size_t)l + 1);
      return true;
    }
  }
  return false;
}

/* ---- Discovery ---- */

static bool ident(const char *s, size_t max) {
  if (!s || !*s || strlen(s) >= max || !(isalpha((unsigned char)*s) || *s == '_')) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return false;
  return true;
}

/* dlopen + entry point, for the tests that read the descriptor themselves. */
static const tsr_strategy *open_desc(const cf_plugin *p, void **handle, char *msg, size_t len) {
  *handle = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
  if (!*handle) {
    const char *e = dlerror();
    snprintf(msg, len, "dlopen(%s) failed: %s", p->path, e ? e : "unknown error");
    return NULL;
  }
  void *sym = dlsym(*handle, TSR_PLUGIN_SYMBOL);
  if (!sym) {
    snprintf(msg, len, "no exported symbol %s in %s", TSR_PLUGIN_SYMBOL, p->path);
    return NULL;
  }
  tsr_plugin_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  const tsr_strategy *d = entry(TSR_ABI_MAJOR, TSR_ABI_MINOR);
  if (!d)
    snprintf(msg, len, "%s(%d, %d) returned NULL", TSR_PLUGIN_SYMBOL, TSR_ABI_MAJOR, TSR_ABI_MINOR);
  return d;
}

/* Copies what the driver needs out of the descriptor; reads only what L0 may then check. */
static void read_desc(cf_plugin *p) {
  void *h;
  char msg[CF_MSG];
  const tsr_strategy *d = open_desc(p, &h, msg, sizeof msg);
  if (!d || d->abi_major != TSR_ABI_MAJOR || d->struct_size < TSR_STRATEGY_SIZE_1_0) return;
  p->abi_major = d->abi_major;
  p->abi_minor = d->abi_minor;
  if (d->version) snprintf(p->version, sizeof p->version, "%s", d->version);
  for (int i = 0; d->dims && d->dims[i] && p->ndims < CF_MAX_LIST; i++)
    snprintf(p->dims[p->ndims++], TSR_MAX_DIM_NAME, "%s", d->dims[i]);
  for (int i = 0; d->required && d->required[i] && p->nrequired < CF_MAX_LIST; i++)
    snprintf(p->required[p->nrequired++], TSR_MAX_NAME, "%s", d->required[i]);
  for (int i = 0; d->keys && d->keys[i].name && p->nkeys < CF_MAX_KEYS; i++) {
    cf_key *k = &p->keys[p->nkeys++];
    snprintf(k->name, sizeof k->name, "%s", d->keys[i].name);
    k->type = (int)d->keys[i].type;
    k->has_default = d->keys[i].default_value != NULL;
    snprintf(k->def, sizeof k->def, "%s", k->has_default ? d->keys[i].default_value : "");
    k->min = d->keys[i].min, k->max = d->keys[i].max;
    snprintf(k->choices, sizeof k->choices, "%s", d->keys[i].choices ? d->keys[i].choices : "");
  }
  p->described = true;
}

static void add_item(cf_plugin *p, cf_item_kind kind, const char *name, const char *op,
                     const char *dim, int n) {
  for (int i = 0; i < p->nitems; i++) {
    cf_item *it = &p->items[i];
    if (it->kind == kind && !strcmp(it->name, name) && !strcmp(it->op, op) &&
        !strcmp(it->dim, dim)) {
      it->sizes |= 1 << n;
      return;
    }
  }
  if (p->nitems == CF_MAX_ITEMS) {
    p->items_dropped++;
    return;
  }
  cf_item *it = &p->items[p->nitems++];
  it->kind = kind;
  snprintf(it->name, sizeof it->name, "%s", name ? name : "(unnamed)");
  snprintf(it->op, sizeof it->op, "%s", op ? op : "");
  snprintf(it->dim, sizeof it->dim, "%s", dim);
  it->sizes = 1 << n;
}

static bool in_registry(const tsr_registry_t *base, cf_item_kind kind, const char *name,
                        const char *op) {
  if (!base) return false;
  if (kind == CF_ITEM_OP)
    for (int i = 0; i < tsr_registry_op_rule_count(base); i++) {
      const tsr_op_rule *r = tsr_registry_op_rule_at(base, i);
      if (!strcmp(r->name, name) && !strcmp(r->op, op)) return true;
    }
  if (kind == CF_ITEM_REDIST)
    for (int i = 0; i < tsr_registry_redistribute_count(base); i++)
      if (!strcmp(tsr_registry_redistribute_at(base, i)->name, name)) return true;
  return false;
}

/* Records what `reg` holds that `base` (the required plugins alone) does not. */
static void collect(cf_plugin *p, const tsr_registry_t *reg, const tsr_registry_t *base,
                    const char *dim, int n) {
  for (int i = 0; i < tsr_registry_op_rule_count(reg); i++) {
    const tsr_op_rule *r = tsr_registry_op_rule_at(reg, i);
    if (!in_registry(base, CF_ITEM_OP, r->name, r->op))
      add_item(p, CF_ITEM_OP, r->name, r->op, r->mesh_dim ? r->mesh_dim : dim, n);
  }
  for (int i = 0; i < tsr_registry_redistribute_count(reg); i++) {
    const tsr_redistribute_rule *r = tsr_registry_redistribute_at(reg, i);
    if (!in_registry(base, CF_ITEM_REDIST, r->name, ""))
      add_item(p, CF_ITEM_REDIST, r->name, "", r->mesh_dim ? r->mesh_dim : dim, n);
  }
  for (int i = 0; i < tsr_registry_module_style_count(reg); i++) {
    const tsr_module_style *s = tsr_registry_module_style_at(reg, i);
    if (s->owner && !strcmp(s->owner, p->name))
      add_item(p, CF_ITEM_STYLE, s->style, "", s->mesh_dim, n);
  }
  for (int i = 0; i < tsr_registry_schedule_count(reg); i++) {
    const tsr_schedule *s = tsr_registry_schedule_at(reg, i);
    if (s->owner && !strcmp(s->owner, p->name)) add_item(p, CF_ITEM_SCHED, s->name, "", "", n);
  }
  int bo = base ? tsr_registry_optim_hook_count(base) : 0;
  int bg = base ? tsr_registry_grad_hook_count(base) : 0;
  if (tsr_registry_optim_hook_count(reg) - bo > p->n_optim_hooks)
    p->n_optim_hooks = tsr_registry_optim_hook_count(reg) - bo;
  if (tsr_registry_grad_hook_count(reg) - bg > p->n_grad_hooks)
    p->n_grad_hooks = tsr_registry_grad_hook_count(reg) - bg;
}

static void discover_rules(cf_plugin *p) {
  char load[512], req[512] = "", text[8192], extra[512];
  cf_load_list(p, load, sizeof load);
  for (int i = 0; i < p->nrequired; i++)
    snprintf(req + strlen(req), sizeof req - strlen(req), "%s%s", i ? ", " : "", p->required[i]);
  tsr_config *cfg;
  tsr_registry_t *reg;
  tsr_plugin_set_t *set;
  cf_job_text(text, sizeof text, 0, NULL, NULL, load, 0, "train", "");
  if (cf_job_load(text, &cfg, &reg, &set) != TSR_OK) {
    snprintf(p->load_msg, sizeof p->load_msg, "%s", tsr_last_error());
    return;
  }
  p->loaded = true;
  /* the dims of the required plugins, for a plugin that owns none */
  char dims[CF_MAX_LIST][TSR_MAX_DIM_NAME];
  int ndims = 0;
  for (int i = 0; i < p->ndims; i++) snprintf(dims[ndims++], TSR_MAX_DIM_NAME, "%s", p->dims[i]);
  for (int i = 0; !ndims && i < tsr_plugin_set_count(set); i++) {
    const tsr_strategy *d = tsr_plugin_set_strategy(set, i);
    for (int k = 0; d && d->dims && d->dims[k] && ndims < CF_MAX_LIST; k++)
      snprintf(dims[ndims++], TSR_MAX_DIM_NAME, "%s", d->dims[k]);
  }
  cf_job_free(cfg, reg, set);
  for (int i = 0; i < ndims; i++) memcpy(p->test_dims[i], dims[i], TSR_MAX_DIM_NAME);
  p->ntest_dims = ndims;
  for (size_t i = 0; i < sizeof known_plugins / sizeof known_plugins[0] && p->nothers < 8; i++) {
    char path[TSR_MAX_PATH];
    if (!strcmp(known_plugins[i], p->name) || !cf_find_plugin(known_plugins[i], path, sizeof path))
      continue;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *sym = h ? dlsym(h, TSR_PLUGIN_SYMBOL) : NULL;
    if (!sym) continue;
    tsr_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    const tsr_strategy *d = entry(TSR_ABI_MAJOR, TSR_ABI_MINOR);
    if (!d || d->abi_major != TSR_ABI_MAJOR) continue;
    int k = p->nothers++;
    snprintf(p->others[k].name, TSR_MAX_NAME, "%s", known_plugins[i]);
    snprintf(p->others[k].dim, TSR_MAX_DIM_NAME, "%s", d->dims && d->dims[0] ? d->dims[0] : "");
    size_t o = 0;
    for (int j = 0; d->dims && d->dims[j]; j++)
      o += (size_t)snprintf(p->others[k].dims + o, TSR_MAX_VALUE - o, "%s%s", j ? ", " : "",
                            d->dims[j]);
    o = 0;
    for (int j = 0; d->required && d->required[j]; j++)
      o += (size_t)snprintf(p->others[k].required + o, TSR_MAX_VALUE - o, "%s%s", j ? ", " : "",
                            d->required[j]);
  }
  for (int di = 0; di < ndims; di++)
    for (int n = 1; n <= 4; n++) {
      int model;
      for (int v = 0; cf_variant(p, v, &model, extra, sizeof extra); v++) {
        const char *dn[1] = {dims[di]};
        int shape[1] = {n};
        tsr_config *bc = NULL;
        tsr_registry_t *breg = NULL;
        tsr_plugin_set_t *bset = NULL;
        if (p->nrequired) {
          cf_job_text(text, sizeof text, 1, dn, shape, req, model, "train", "");
          if (cf_job_load(text, &bc, &breg, &bset) != TSR_OK) continue;
        }
        cf_job_text(text, sizeof text, 1, dn, shape, load, model, "train", extra);
        if (cf_job_load(text, &cfg, &reg, &set) == TSR_OK) {
          collect(p, reg, breg, dims[di], n);
          cf_job_free(cfg, reg, set);
        }
        cf_job_free(bc, breg, bset);
      }
    }
  tsr_clear_error();
}

/* Runs one discovery step in a child; the child sends the whole struct back. */
static void discover_step(cf_plugin *p, void (*step)(cf_plugin *), double timeout_s,
                          const char *what) {
  int fds[2];
  if (pipe(fds) != 0) return;
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, STDOUT_FILENO), dup2(null, STDERR_FILENO);
    step(p);
    const char *b = (const char *)p;
    size_t off = 0;
    while (off < sizeof *p) {
      ssize_t w = write(fds[1], b + off, sizeof *p - off);
      if (w <= 0) _exit(3);
      off += (size_t)w;
    }
    _exit(0);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return;
  }
  static cf_plugin got;
  size_t off = 0;
  struct pollfd pfd = {fds[0], POLLIN, 0};
  bool hung = true;
  while (off < sizeof got && poll(&pfd, 1, (int)(timeout_s * 1000)) > 0) {
    ssize_t r = read(fds[0], (char *)&got + off, sizeof got - off);
    if (r <= 0) {
      hung = false; /* the child closed the pipe: it exited or died */
      break;
    }
    off += (size_t)r;
  }
  close(fds[0]);
  int status = 0;
  if (off == sizeof got || hung) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  if (off == sizeof got) {
    *p = got;
  } else if (!p->load_msg[0]) {
    if (hung)
      snprintf(p->load_msg, sizeof p->load_msg, "discovery (%s) hung for %g s", what, timeout_s);
    else if (WIFSIGNALED(status))
      snprintf(p->load_msg, sizeof p->load_msg, "discovery (%s) crashed: signal %d (%s)", what,
               WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
      snprintf(p->load_msg, sizeof p->load_msg, "discovery (%s) exited with status %d", what,
               WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
}

void cf_discover(cf_plugin *p, double timeout_s) {
  discover_step(p, read_desc, timeout_s, "reading the descriptor");
  if (p->described && p->name[0]) discover_step(p, discover_rules, timeout_s, "loading it");
}

/* ---- L0: load and ABI ---- */

#define DESC_OR_FAIL(d)                                                                            \
  void *handle_;                                                                                   \
  const tsr_strategy *d = open_desc(p, &handle_, msg, len);                                        \
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
  if (!ident(d->name, TSR_MAX_NAME))
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
    if (!ident(d->dims[i], TSR_MAX_DIM_NAME))
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
    if (!ident(d->required[i], TSR_MAX_NAME))
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
    if (!ident(k->name, TSR_MAX_NAME))
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
  const tsr_strategy *d = open_desc(p, &h, msg, len);
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
  /* a plugin after this one whose section is wrong: the loader stops after this one's init and
   * must run its fini; the next job must still load */
  const char *other = NULL;
  for (size_t i = 0; i < sizeof known_plugins / sizeof known_plugins[0] && !other; i++) {
    bool skip = !strcmp(known_plugins[i], p->name) || !strcmp(known_plugins[i], "sp");
    for (int r = 0; r < p->nrequired; r++) skip |= !strcmp(known_plugins[i], p->required[r]);
    char f[TSR_MAX_PATH];
    if (!skip && cf_find_plugin(known_plugins[i], f, sizeof f)) other = known_plugins[i];
  }
  if (!other)
    return cf_say(msg, len, CF_NOTSUP, "no other plugin on the search path to fail after it");
  char text[8192], extra[256];
  snprintf(extra, sizeof extra, "[strategy.%s]\nconform_no_such_key = 1\n", other);
  base_job(p, text, sizeof text, other, extra);
  if (expect_rejected(text, "a job whose later plugin fails", other, "conform_no_such_key", msg,
                      len) != CF_PASS)
    return CF_FAIL;
  base_job(p, text, sizeof text, NULL, "");
  tsr_config *cfg;
  tsr_registry_t *reg;
  tsr_plugin_set_t *set;
  if (cf_job_load(text, &cfg, &reg, &set) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "after the failed job the plugin no longer loads: %s",
                  tsr_last_error());
  cf_job_free(cfg, reg, set);
  return cf_say(msg, len, CF_PASS, "fini ran after %s failed; the next job loads", other);
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
