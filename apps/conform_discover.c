/* `tessera conform`: discovery, and the L2 test of what it found.
 *
 * Discovery runs in forked children (the driver never calls into the plugin): one reads the
 * descriptor, one loads the plugin into jobs on each of its dims at 1-4 ranks and in every job
 * variant, and records what it registers beside what its required plugins register.
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
#include <sys/wait.h>
#include <unistd.h>

#include "conform.h"

bool cf_ident(const char *s, size_t max) {
  if (!s || !*s || strlen(s) >= max || !(isalpha((unsigned char)*s) || *s == '_')) return false;
  for (; *s; s++)
    if (!isalnum((unsigned char)*s) && *s != '_') return false;
  return true;
}

/* dlopen + entry point, for the tests that read the descriptor themselves. */
const tsr_strategy *cf_open_desc(const cf_plugin *p, void **handle, char *msg, size_t len) {
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
  const tsr_strategy *d = cf_open_desc(p, &h, msg, sizeof msg);
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
  const char *stage = tsr_registry_stage_dim(reg);
  for (int i = 0; stage && i < p->ndims; i++) p->stage_dim |= !strcmp(stage, p->dims[i]);
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
  /* the dims to test on: its own, or, for a plugin that owns none, those of the plugins it
   * requires (loaded without it, so that they are known even when it does not load) */
  char dims[CF_MAX_LIST][TSR_MAX_DIM_NAME];
  int ndims = 0;
  for (int i = 0; i < p->ndims; i++) snprintf(dims[ndims++], TSR_MAX_DIM_NAME, "%s", p->dims[i]);
  cf_job_text(text, sizeof text, 0, NULL, NULL, req, 0, "train", "");
  if (!ndims && p->nrequired && cf_job_load(text, &cfg, &reg, &set) == TSR_OK) {
    for (int i = 0; i < tsr_plugin_set_count(set); i++) {
      const tsr_strategy *d = tsr_plugin_set_strategy(set, i);
      for (int k = 0; d && d->dims && d->dims[k] && ndims < CF_MAX_LIST; k++)
        snprintf(dims[ndims++], TSR_MAX_DIM_NAME, "%s", d->dims[k]);
    }
    cf_job_free(cfg, reg, set);
  }
  for (int i = 0; i < ndims; i++) memcpy(p->test_dims[i], dims[i], TSR_MAX_DIM_NAME);
  p->ntest_dims = ndims;
  cf_job_text(text, sizeof text, 0, NULL, NULL, load, 0, "train", "");
  if (cf_job_load(text, &cfg, &reg, &set) != TSR_OK) {
    snprintf(p->load_msg, sizeof p->load_msg, "%s", tsr_last_error());
    return;
  }
  p->loaded = true;
  cf_job_free(cfg, reg, set);
  for (size_t i = 0; i < CF_NKNOWN && p->nothers < 8; i++) {
    char path[TSR_MAX_PATH];
    if (!strcmp(cf_known_plugins[i], p->name) ||
        !cf_find_plugin(cf_known_plugins[i], path, sizeof path))
      continue;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    void *sym = h ? dlsym(h, TSR_PLUGIN_SYMBOL) : NULL;
    if (!sym) continue;
    tsr_plugin_entry_fn entry;
    memcpy(&entry, &sym, sizeof entry);
    const tsr_strategy *d = entry(TSR_ABI_MAJOR, TSR_ABI_MINOR);
    if (!d || d->abi_major != TSR_ABI_MAJOR) continue;
    int k = p->nothers++;
    snprintf(p->others[k].name, TSR_MAX_NAME, "%s", cf_known_plugins[i]);
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

/* What discovery found: a plugin that loads but registers nothing has no L2 to pass. */
cf_result cf_discovery_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (!p->loaded)
    return cf_say(msg, len, CF_FAIL, "discovery could not load it: %s",
                  p->load_msg[0] ? p->load_msg
                  : !p->name[0]  ? "the file is not named libtessera-<name>.so"
                                 : "the descriptor could not be read");
  int count[4] = {0};
  for (int i = 0; i < p->nitems; i++) count[p->items[i].kind]++;
  if (!p->nitems && p->ndims && !p->n_optim_hooks && !p->n_grad_hooks && !p->stage_dim) {
    char dims[256] = "";
    for (int i = 0; i < p->ndims; i++)
      snprintf(dims + strlen(dims), sizeof dims - strlen(dims), "%s%s", i ? ", " : "", p->dims[i]);
    return cf_say(msg, len, CF_FAIL,
                  "owns %s but registers nothing: no data split, op rule, transition, module "
                  "style, schedule, stage dim or hook, so on a mesh where %s > 1 every rank of it "
                  "computes the same thing",
                  dims, p->dims[0]);
  }
  if (!p->nitems)
    return cf_say(msg, len, CF_NOTSUP,
                  "registers no op rule, transition, module style or "
                  "schedule on its dims");
  if (p->items_dropped)
    return cf_say(msg, len, CF_NOTSUP, "%d registrations found; the suite tests the first %d",
                  p->nitems + p->items_dropped, CF_MAX_ITEMS);
  return cf_say(msg, len, CF_PASS, "%d op rules, %d transitions, %d module styles, %d schedules",
                count[CF_ITEM_OP], count[CF_ITEM_REDIST], count[CF_ITEM_STYLE],
                count[CF_ITEM_SCHED]);
}
