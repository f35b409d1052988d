/* The plugin loader: finds libtessera-<name>.so, checks its descriptor in the documented order
 * and drives init / register_rules / fini. Every failure becomes one message that names the
 * plugin, the file and both ABI versions, kept in a report for `tessera plugins`. */
#define _GNU_SOURCE /* dladdr */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tessera/breadcrumb.h"
#include "tessera/plugin.h"

#define MAX_DIRS 32

typedef struct loaded_plugin {
  tsr_plugin_report rep;
  void *handle;
  const tsr_strategy *desc;
  void *state;
  bool inited;
} loaded_plugin;

struct tsr_plugin_set_t {
  int n;
  bool ok; /* every plugin loaded, initialised and registered */
  loaded_plugin p[TSR_MAX_PLUGINS];
};

const char *tsr_plugin_check_name(tsr_plugin_check c) {
  switch (c) {
    case TSR_CHECK_PASSED:
      return "passed";
    case TSR_CHECK_FOUND:
      return "found";
    case TSR_CHECK_OPEN:
      return "open";
    case TSR_CHECK_SYMBOL:
      return "symbol";
    case TSR_CHECK_MAJOR:
      return "major";
    case TSR_CHECK_SIZE:
      return "struct_size";
    case TSR_CHECK_RESERVED:
      return "reserved";
    case TSR_CHECK_NAME:
      return "name";
    case TSR_CHECK_CALLBACKS:
      return "callbacks";
    case TSR_CHECK_REQUIRED:
      return "required";
    case TSR_CHECK_DIMS:
      return "dims";
    case TSR_CHECK_KEYS:
      return "keys";
    case TSR_CHECK_VALIDATE:
      return "validate";
    case TSR_CHECK_INIT:
      return "init";
    case TSR_CHECK_REGISTER:
      return "register";
    case TSR_CHECK_REGISTRY:
      return "registry";
  }
  return "?";
}

/* Records the failure in the report and as the last error: "<name>: <problem> (plugin ABI x.y,
 * core ABI 1.0) in <path>; <fix>", where fmt gives "<problem>; <fix>". */
static tsr_status fail(tsr_plugin_report *rep, tsr_plugin_check check, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static tsr_status fail(tsr_plugin_report *rep, tsr_plugin_check check, const char *fmt, ...) {
  char what[1536], abi[32];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  if (rep->abi_major || rep->abi_minor)
    snprintf(abi, sizeof abi, "%u.%u", rep->abi_major, rep->abi_minor);
  else
    snprintf(abi, sizeof abi, "unknown");
  /* "problem; fix" reads as "name: problem (versions) in path; fix". The fix starts at the
   * first "; " outside parentheses: a plugin's message quoted in the problem may hold its own. */
  char *fix = NULL;
  int depth = 0;
  for (char *p = what; *p && !fix; p++) {
    if (*p == '(') depth++;
    if (*p == ')' && depth > 0) depth--;
    if (depth == 0 && p[0] == ';' && p[1] == ' ') fix = p;
  }
  if (fix) *fix = '\0', fix += 2;
  int len = snprintf(rep->message, sizeof rep->message,
                     "%s: %s (plugin ABI %s, core ABI %d.%d) in %s%s%s", rep->name, what, abi,
                     TSR_ABI_MAJOR, TSR_ABI_MINOR, rep->path[0] ? rep->path : "-", fix ? "; " : "",
                     fix ? fix : "");
  if (len < 0) rep->message[0] = '\0';
  rep->failed = check;
  rep->status = TSR_EPLUGIN;
  return tsr_error(TSR_EPLUGIN, "%s", rep->message);
}

/* Why another user than this process's (or root) could change what `st` describes: a file or a
 * directory writable by every user (a directory with the sticky bit excepted: there only a
 * file's owner may replace it), or one owned by another user who is not root. */
typedef enum { TRUSTED, WORLD_WRITABLE, OTHER_OWNER } trust_problem;

static trust_problem trust_of(const struct stat *st, bool dir) {
  if ((st->st_mode & S_IWOTH) && !(dir && (st->st_mode & S_ISVTX))) return WORLD_WRITABLE;
  if (st->st_uid != 0 && st->st_uid != geteuid()) return OTHER_OWNER;
  return TRUSTED;
}

/* A plugin is code this process runs: refuse a file, or the directory holding it, that another
 * user could replace, unless TESSERA_ALLOW_INSECURE_PLUGINS=1. Checks the file the path
 * resolves to (symlinks followed) and that file's directory. */
static tsr_status check_trust(const char *path, tsr_plugin_report *rep) {
  const char *allow = getenv("TESSERA_ALLOW_INSECURE_PLUGINS");
  if (allow && !strcmp(allow, "1")) return TSR_OK;
  char real[PATH_MAX], dir[PATH_MAX];
  if (!realpath(path, real))
    return fail(rep, TSR_CHECK_OPEN, "cannot resolve the path: %s", strerror(errno));
  snprintf(dir, sizeof dir, "%s", real);
  char *slash = strrchr(dir, '/');
  if (slash) slash[slash == dir ? 1 : 0] = '\0';
  const char *paths[2] = {real, dir};
  for (int i = 0; i < 2; i++) {
    struct stat st;
    if (stat(paths[i], &st) != 0)
      return fail(rep, TSR_CHECK_OPEN, "cannot stat %s: %s", paths[i], strerror(errno));
    const char *what = i ? "its directory" : "the file";
    unsigned mode = (unsigned)(st.st_mode & 07777);
    switch (trust_of(&st, i == 1)) {
      case TRUSTED:
        continue;
      case WORLD_WRITABLE:
        return fail(rep, TSR_CHECK_OPEN,
                    "refused: %s %s is writable by every user (mode %04o), so anyone on this "
                    "machine could change the code this job runs; chmod o-w %s%s, or set "
                    "TESSERA_ALLOW_INSECURE_PLUGINS=1 to load it anyway",
                    what, paths[i], mode, paths[i], i ? " (or chmod +t it)" : "");
      case OTHER_OWNER:
        return fail(rep, TSR_CHECK_OPEN,
                    "refused: %s %s is owned by uid %u, not by root or this process's uid %u, so "
                    "that user could change the code this job runs; chown it to root or uid %u, "
                    "or set TESSERA_ALLOW_INSECURE_PLUGINS=1 to load it anyway",
                    what, paths[i], (unsigned)st.st_uid, (unsigned)geteuid(), (unsigned)geteuid());
    }
  }
  return TSR_OK;
}

static bool is_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Adds each entry of a ':' or ','-separated list. Relative entries are resolved against `base`,
 * or skipped when there is none, because a relative search entry would mean the current
 * directory. */
static int add_dirs(const char *list, const char *base, char (*dirs)[TSR_MAX_PATH], int n,
                    int cap) {
  if (!list) return n;
  const char *p = list;
  while (*p && n < cap) {
    size_t len = strcspn(p, ":,");
    const char *b = p, *e = p + len;
    while (b < e && (*b == ' ' || *b == '\t')) b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t')) e--;
    if (e > b) {
      if (*b == '/')
        snprintf(dirs[n++], TSR_MAX_PATH, "%.*s", (int)(e - b), b);
      else if (base)
        snprintf(dirs[n++], TSR_MAX_PATH, "%s/%.*s", base, (int)(e - b), b);
    }
    p += len;
    if (*p) p++;
  }
  return n;
}

/* The install's lib/tessera: the folder beside the libtessera this process loaded, when there is
 * one, so that an install made with `cmake --install --prefix P` (or moved) finds its own plugins
 * rather than those of the prefix the build was configured with. */
bool tsr_core_library_dir(char *out, size_t len) {
  Dl_info info;
  if (!dladdr((void *)&tsr_plugin_search_dirs, &info) || !info.dli_fname) return false;
  const char *slash = strrchr(info.dli_fname, '/');
  if (!slash) return false;
  char lib[TSR_MAX_PATH], real[PATH_MAX];
  snprintf(lib, sizeof lib, "%.*s", (int)(slash - info.dli_fname), info.dli_fname);
  if (!realpath(lib, real)) return false;
  return (size_t)snprintf(out, len, "%s", real) < len;
}

void *tsr_core_dlopen(const char *file, const char *env, const char *install_path,
                      const char *build_path, int flags, char *tried, size_t tried_len) {
  const char *from_env = env ? getenv(env) : NULL;
  char lib[TSR_MAX_PATH], beside[TSR_MAX_PATH + 64];
  bool have_beside = tsr_core_library_dir(lib, sizeof lib) &&
                     (size_t)snprintf(beside, sizeof beside, "%s/%s", lib, file) < sizeof beside &&
                     access(beside, F_OK) == 0;
  const char *paths[] = {from_env && from_env[0] == '/' ? from_env : NULL,
                         have_beside ? beside : NULL, install_path, build_path};
  size_t pos = tried_len ? strlen(tried) : 0;
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    if (!paths[i] || !paths[i][0]) continue;
    void *h = dlopen(paths[i], flags);
    if (h) return h;
    const char *why = dlerror();
    if (pos + 1 >= tried_len) continue;
    int w = snprintf(tried + pos, tried_len - pos, "\n  %s: %s", paths[i], why ? why : "?");
    if (w > 0) pos = pos + (size_t)w < tried_len ? pos + (size_t)w : tried_len - 1;
  }
  return NULL;
}

static bool installed_plugin_dir(char *out, size_t len) {
  char lib[TSR_MAX_PATH];
  if (!tsr_core_library_dir(lib, sizeof lib)) return false;
  if ((size_t)snprintf(out, len, "%s/tessera", lib) >= len) return false;
  struct stat st;
  return stat(out, &st) == 0 && S_ISDIR(st.st_mode);
}

int tsr_plugin_search_dirs(const char *extra, const char *base_dir, char (*dirs)[TSR_MAX_PATH],
                           int cap) {
  int n = add_dirs(getenv("TESSERA_PLUGIN_PATH"), NULL, dirs, 0, cap);
  n = add_dirs(extra, base_dir ? base_dir : NULL, dirs, n, cap);
  /* An installed core searches its own install only; the build tree is for a core run from it. */
  if (n < cap && installed_plugin_dir(dirs[n], TSR_MAX_PATH)) return n + 1;
#ifdef TESSERA_INSTALL_PLUGIN_DIR
  if (n < cap) snprintf(dirs[n++], TSR_MAX_PATH, "%s", TESSERA_INSTALL_PLUGIN_DIR);
#endif
#ifdef TESSERA_BUILD_PLUGIN_DIR
  if (n < cap) snprintf(dirs[n++], TSR_MAX_PATH, "%s", TESSERA_BUILD_PLUGIN_DIR);
#endif
  return n;
}

/* "libtessera-tp.so" -> "tp"; false when the file name does not have that form. */
static bool name_from_path(const char *path, char *name, size_t len) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t pre = strlen(TSR_PLUGIN_PREFIX), suf = strlen(TSR_PLUGIN_SUFFIX), n = strlen(base);
  if (n <= pre + suf || strncmp(base, TSR_PLUGIN_PREFIX, pre) ||
      strcmp(base + n - suf, TSR_PLUGIN_SUFFIX))
    return false;
  snprintf(name, len, "%.*s", (int)(n - pre - suf), base + pre);
  return true;
}

static void join_names(const char *const *names, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; names && names[i] && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", names[i]);
}

static void describe_keys(const tsr_key_spec *keys, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; keys && keys[i].name && o < len; i++) {
    char want[256];
    tsr_key_describe(&keys[i], want, sizeof want);
    const char *def = keys[i].default_value;
    o += (size_t)snprintf(buf + o, len - o, "%s%s (%s; %s%s)", i ? "; " : "", keys[i].name, want,
                          def ? "default " : "required", def ? (*def ? def : "empty") : "");
  }
}

/* The per-file checks. Leaves the library open in *handle on success. */
static tsr_status probe_open(const char *path, const char *want, tsr_plugin_report *rep,
                             void **handle, const tsr_strategy **out) {
  memset(rep, 0, sizeof *rep);
  *handle = NULL;
  *out = NULL;
  snprintf(rep->path, sizeof rep->path, "%s", path);
  if (want)
    snprintf(rep->name, sizeof rep->name, "%s", want);
  else if (!name_from_path(path, rep->name, sizeof rep->name))
    snprintf(rep->name, sizeof rep->name, "%s", path);

  FILE *f = fopen(path, "rb");
  if (!f) return fail(rep, TSR_CHECK_OPEN, "cannot open the file: %s", strerror(errno));
  fclose(f);
  tsr_status trust = check_trust(path, rep);
  if (trust != TSR_OK) return trust;
  /* RTLD_NOW: an unresolved symbol fails here, with the symbol's name, not mid-job. RTLD_LOCAL:
   * two plugins may use the same internal names. */
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *why = dlerror();
    return fail(rep, TSR_CHECK_OPEN,
                "dlopen failed: %s; rebuild the plugin against this tessera and check that every "
                "library it needs is installed",
                why ? why : "unknown error");
  }
  tsr_plugin_entry_fn entry;
  /* POSIX allows converting dlsym's object pointer to a function pointer through a copy. */
  void *sym = dlsym(h, TSR_PLUGIN_SYMBOL);
  memcpy(&entry, &sym, sizeof entry);
  if (!sym) {
    dlclose(h);
    return fail(rep, TSR_CHECK_SYMBOL,
                "no symbol %s: not a tessera plugin, or built for another ABI major; export "
                "'const tsr_strategy *%s(uint32_t, uint32_t)'",
                TSR_PLUGIN_SYMBOL, TSR_PLUGIN_SYMBOL);
  }
  const tsr_strategy *d = entry(TSR_ABI_MAJOR, TSR_ABI_MINOR);
  if (!d) {
    dlclose(h);
    return fail(rep, TSR_CHECK_SYMBOL, "%s returned NULL: the plugin refuses this core",
                TSR_PLUGIN_SYMBOL);
  }
  rep->abi_major = d->abi_major;
  rep->abi_minor = d->abi_minor;
  tsr_status st = TSR_OK;
  if (d->abi_major != TSR_ABI_MAJOR) {
    st = fail(rep, TSR_CHECK_MAJOR,
              "incompatible ABI; rebuild the plugin against this tessera's include/tessera");
    goto cleanup;
  }
  if (d->struct_size < TSR_STRATEGY_SIZE_1_0) {
    st = fail(rep, TSR_CHECK_SIZE,
              "struct_size %u is smaller than the %zu bytes of an ABI %d.0 descriptor; set "
              "struct_size = sizeof(tsr_strategy) and rebuild",
              d->struct_size, (size_t)TSR_STRATEGY_SIZE_1_0, TSR_ABI_MAJOR);
    goto cleanup;
  }
  bool reserved_zero = d->flags == 0;
  int bad = -1;
  for (int i = 0; i < TSR_STRATEGY_RESERVED; i++)
    if (d->reserved[i] && bad < 0) bad = i;
  reserved_zero = reserved_zero && bad < 0;
  if (!reserved_zero) {
    if (bad >= 0)
      st = fail(rep, TSR_CHECK_RESERVED,
                "reserved[%d] is set; it must be zero (a newer plugin needs a newer core, or the "
                "descriptor is not initialised)",
                bad);
    else
      st = fail(rep, TSR_CHECK_RESERVED, "flags = 0x%x; no flags are defined in ABI %d.%d",
                d->flags, TSR_ABI_MAJOR, TSR_ABI_MINOR);
    goto cleanup;
  }
  if (d->version) snprintf(rep->version, sizeof rep->version, "%s", d->version);
  if (d->description) snprintf(rep->description, sizeof rep->description, "%s", d->description);
  join_names(d->dims, rep->dims, sizeof rep->dims);
  describe_keys(d->keys, rep->keys, sizeof rep->keys);
  char file_name[TSR_MAX_NAME];
  bool named = name_from_path(path, file_name, sizeof file_name);
  if (!d->name || (want && strcmp(d->name, want)) || (named && strcmp(d->name, file_name))) {
    st = fail(rep, TSR_CHECK_NAME,
              "descriptor name '%s' does not match the name '%s' the job and file use; rename "
              "the file or fix .name",
              d->name ? d->name : "(null)", want ? want : file_name);
    goto cleanup;
  }
  const char *missing = !d->version          ? "version"
                        : !d->init           ? "init"
                        : !d->fini           ? "fini"
                        : !d->register_rules ? "register_rules"
                                             : NULL;
  if (missing) {
    st = fail(rep, TSR_CHECK_CALLBACKS, "mandatory field '%s' is NULL; set it in the descriptor",
              missing);
    goto cleanup;
  }
  rep->failed = TSR_CHECK_PASSED;
  rep->status = TSR_OK;
  *handle = h;
  *out = d;
  return TSR_OK;
cleanup:
  dlclose(h);
  return st;
}

tsr_status tsr_plugin_probe(const char *path, const char *want, tsr_plugin_report *rep) {
  void *h;
  const tsr_strategy *d;
  tsr_status st = probe_open(path, want, rep, &h, &d);
  if (h) dlclose(h);
  return st;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

tsr_status tsr_plugin_discover(const char *extra, const char *base_dir, tsr_plugin_report **reports,
                               int *n) {
  char dirs[MAX_DIRS][TSR_MAX_PATH];
  int ndirs = tsr_plugin_search_dirs(extra, base_dir, dirs, MAX_DIRS);
  tsr_plugin_report *out = NULL;
  int count = 0, cap = 0;
  tsr_status st = TSR_OK;
  *reports = NULL;
  *n = 0;
  for (int d = 0; d < ndirs; d++) {
    DIR *dir = opendir(dirs[d]);
    if (!dir) continue;
    char *names[256];
    int nn = 0;
    struct dirent *ent;
    while ((ent = readdir(dir)) && nn < 256) {
      char name[TSR_MAX_NAME];
      if (name_from_path(ent->d_name, name, sizeof name)) names[nn++] = strdup(ent->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)nn, sizeof names[0], cmp_str);
    for (int i = 0; i < nn; i++) {
      char path[TSR_MAX_PATH];
      int len = snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]);
      free(names[i]);
      names[i] = NULL;
      if (len < 0 || (size_t)len >= sizeof path) continue;
      bool seen = false;
      for (int k = 0; k < count; k++) seen |= !strcmp(out[k].path, path);
      if (seen || !is_file(path)) continue;
      if (count == cap) {
        cap = cap ? 2 * cap : 16;
        tsr_plugin_report *grown = realloc(out, (size_t)cap * sizeof *out);
        if (!grown) {
          for (int k = i + 1; k < nn; k++) free(names[k]);
          st = TSR_ERROR(TSR_ENOMEM, "out of memory listing plugins");
          goto cleanup;
        }
        out = grown;
      }
      tsr_plugin_probe(path, NULL, &out[count]);
      for (int k = 0; k < count; k++)
        if (!strcmp(out[k].name, out[count].name) && out[count].status == TSR_OK) {
          snprintf(out[count].message, sizeof out[count].message,
                   "%s: shadowed by %s, which comes first on the search path", out[count].name,
                   out[k].path);
          break;
        }
      count++;
    }
  }
  tsr_clear_error();
  *reports = out;
  *n = count;
  return TSR_OK;
cleanup:
  free(out);
  return st;
}

/* ---- Loading a job's plugins ---- */

static tsr_status find_file(const tsr_config *cfg, const char *name, tsr_plugin_report *rep) {
  char dirs[MAX_DIRS][TSR_MAX_PATH];
  int ndirs = tsr_plugin_search_dirs(cfg->plugins.path, cfg->dir, dirs, MAX_DIRS);
  for (int d = 0; d < ndirs; d++) {
    char path[TSR_MAX_PATH];
    int len =
        snprintf(path, sizeof path, "%s/" TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX, dirs[d], name);
    if (len > 0 && (size_t)len < sizeof path && is_file(path)) {
      snprintf(rep->path, sizeof rep->path, "%s", path);
      return TSR_OK;
    }
  }
  char list[2048];
  size_t o = 0;
  list[0] = '\0';
  for (int d = 0; d < ndirs && o < sizeof list; d++)
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", d ? ", " : "", dirs[d]);
  snprintf(rep->name, sizeof rep->name, "%s", name);
  return fail(rep, TSR_CHECK_FOUND,
              "no " TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX " in the search path [%s]; build it "
              "or add its directory to [plugins] path or TESSERA_PLUGIN_PATH",
              name, ndirs ? list : "empty");
}

static void unload(tsr_plugin_set_t *set) {
  for (int i = set->n - 1; i >= 0; i--) {
    loaded_plugin *p = &set->p[i];
    if (p->inited) {
      tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(p->rep.name, "fini", NULL, NULL);
      p->desc->fini(p->state);
      tsr_breadcrumb_leave(&crumb);
    }
    p->inited = false;
    p->state = NULL;
  }
  for (int i = set->n - 1; i >= 0; i--) {
    if (set->p[i].handle) dlclose(set->p[i].handle);
    set->p[i].handle = NULL;
    set->p[i].desc = NULL;
  }
}

static bool dims_overlap(const tsr_strategy *a, const tsr_strategy *b, const char **dim) {
  for (int i = 0; a->dims && a->dims[i]; i++)
    for (int j = 0; b->dims && b->dims[j]; j++)
      if (!strcmp(tsr_mesh_canonical_name(a->dims[i]), tsr_mesh_canonical_name(b->dims[j]))) {
        *dim = a->dims[i];
        return true;
      }
  return false;
}

/* Renames every mesh dim the job spells by an alias that a loaded plugin declared for a dim it
 * owns. The job's config is the loader's to settle before anyone reads the mesh; it is made by
 * the parser, never static. */
static tsr_status rename_aliases(tsr_config *cfg, tsr_plugin_set_t *set) {
  for (int i = 0; i < set->n; i++) {
    const tsr_strategy *d = set->p[i].desc;
    if (!TSR_STRATEGY_HAS(d, dim_aliases) || !d->dim_aliases) continue;
    for (int a = 0; d->dim_aliases[a]; a += 2) {
      const char *alias = d->dim_aliases[a], *dim = d->dim_aliases[a + 1];
      bool owned = false;
      for (int k = 0; dim && d->dims && d->dims[k]; k++) owned |= !strcmp(d->dims[k], dim);
      if (!owned)
        return fail(&set->p[i].rep, TSR_CHECK_DIMS,
                    "dim_aliases gives alias '%s' for '%s', which is not one of the plugin's "
                    "dims; list {\"alias\", \"owned dim\"} pairs ending in NULL",
                    alias, dim ? dim : "(null)");
      for (int m = 0; m < cfg->mesh.ndim; m++) {
        if (strcmp(cfg->mesh.names[m], alias)) continue;
        for (int o = 0; o < cfg->mesh.ndim; o++)
          if (!strcmp(cfg->mesh.names[o], dim))
            return tsr_config_error(cfg, TSR_EINVAL, "mesh", "dims",
                                    "'%s' and '%s' are one dim ('%s' is plugin %s's other "
                                    "spelling); list it once",
                                    alias, dim, alias, set->p[i].rep.name);
        snprintf(cfg->mesh.names[m], sizeof cfg->mesh.names[m], "%s", dim);
      }
    }
  }
  return TSR_OK;
}

/* Checks across plugins: requirements, dim ownership, and mesh dims without an owner. */
static tsr_status check_set(const tsr_config *cfg, tsr_plugin_set_t *set) {
  for (int i = 0; i < set->n; i++) {
    loaded_plugin *p = &set->p[i];
    for (int r = 0; p->desc->required && p->desc->required[r]; r++) {
      bool listed = false;
      for (int k = 0; k < set->n; k++) listed |= !strcmp(set->p[k].rep.name, p->desc->required[r]);
      if (!listed)
        return fail(&p->rep, TSR_CHECK_REQUIRED,
                    "requires strategy '%s', which [plugins] load (%s:%d) does not list; add it",
                    p->desc->required[r], cfg->path, tsr_config_line(cfg, "plugins", "load"));
    }
  }
  for (int i = 0; i < set->n; i++)
    for (int k = 0; k < i; k++) {
      const char *dim;
      if (dims_overlap(set->p[i].desc, set->p[k].desc, &dim))
        return fail(&set->p[i].rep, TSR_CHECK_DIMS,
                    "mesh dim '%s' is already owned by plugin '%s' (%s); load only one of them",
                    dim, set->p[k].rep.name, set->p[k].rep.path);
    }
  for (int d = 0; d < cfg->mesh.ndim; d++) {
    if (cfg->mesh.shape[d] <= 1) continue;
    if (!tsr_plugin_set_owner(set, cfg->mesh.names[d])) {
      char loaded[512];
      size_t o = 0;
      loaded[0] = '\0';
      for (int i = 0; i < set->n && o < sizeof loaded; i++)
        o += (size_t)snprintf(loaded + o, sizeof loaded - o, "%s%s", i ? ", " : "",
                              set->p[i].rep.name);
      return tsr_config_error(cfg, TSR_EINVAL, "mesh", "dims",
                              "dim '%s' has size %d but no loaded plugin owns it (loaded: %s); "
                              "add the plugin that owns '%s' to [plugins] load, or set its size "
                              "to 1",
                              cfg->mesh.names[d], cfg->mesh.shape[d], o ? loaded : "none",
                              cfg->mesh.names[d]);
    }
  }
  return TSR_OK;
}

tsr_status tsr_plugin_set_load(const tsr_config *cfg, tsr_registry_t *reg, tsr_plugin_set_t **out) {
  char where[TSR_MAX_PATH + 160];
  tsr_status st = TSR_OK;
  tsr_plugin_set_t *set = calloc(1, sizeof *set);
  *out = NULL;
  if (!set) return TSR_ERROR(TSR_ENOMEM, "out of memory loading plugins");
  *out = set;

  /* Every file first, so that a job with several broken plugins reports them all. */
  char all[4096];
  size_t o = 0;
  all[0] = '\0';
  for (int i = 0; i < cfg->plugins.nload; i++) {
    loaded_plugin *p = &set->p[set->n++];
    const char *name = cfg->plugins.load[i];
    tsr_status s = find_file(cfg, name, &p->rep);
    if (s == TSR_OK) {
      char path[TSR_MAX_PATH];
      snprintf(path, sizeof path, "%s", p->rep.path);
      s = probe_open(path, name, &p->rep, &p->handle, &p->desc);
    }
    if (s != TSR_OK) {
      st = s;
      if (o < sizeof all)
        o += (size_t)snprintf(all + o, sizeof all - o, "%s%s: %s", o ? "\n" : "",
                              tsr_config_where(cfg, "plugins", "load", where, sizeof where),
                              p->rep.message);
    }
  }
  if (st != TSR_OK) {
    tsr_error(st, "%s", all);
    goto cleanup;
  }
  TSR_CHECK_GOTO(rename_aliases((tsr_config *)cfg, set), st);
  TSR_CHECK_GOTO(check_set(cfg, set), st);

  for (int i = 0; i < set->n; i++) {
    loaded_plugin *p = &set->p[i];
    tsr_plugin_args args = {cfg, p->rep.name, p->rep.path, TSR_ABI_MAJOR, TSR_ABI_MINOR};
    if (tsr_config_check_section(cfg, p->rep.name, p->desc->keys, p->rep.path) != TSR_OK) {
      /* The config message already names file, line, key and plugin path. */
      snprintf(p->rep.message, sizeof p->rep.message, "%s", tsr_last_error());
      p->rep.failed = TSR_CHECK_KEYS;
      p->rep.status = st = TSR_EINVAL;
      goto cleanup;
    }
    /* each callback runs with the plugin in the breadcrumb: a crash names it, and what
     * register_rules adds is recorded as the plugin's */
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(p->rep.name, "validate", NULL, NULL);
    st = p->desc->validate ? p->desc->validate(&args) : TSR_OK;
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK) {
      char why[1536];
      snprintf(why, sizeof why, "%s", tsr_last_error());
      fail(&p->rep, TSR_CHECK_VALIDATE, "rejects the job: %s", why);
      /* The job is wrong, not the plugin: bad input. */
      p->rep.status = st = TSR_EINVAL;
      goto cleanup;
    }
    tsr_clear_error();
    crumb = tsr_breadcrumb_enter(p->rep.name, "init", NULL, NULL);
    st = p->desc->init(&args, &p->state);
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK) {
      char why[1536];
      snprintf(why, sizeof why, "%s", tsr_last_error()[0] ? tsr_last_error() : "no message");
      st = fail(&p->rep, TSR_CHECK_INIT, "init failed: %s", why);
      goto cleanup;
    }
    p->inited = true;
    crumb = tsr_breadcrumb_enter(p->rep.name, "register_rules", NULL, NULL);
    st = p->desc->register_rules(reg, &args, p->state);
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK) {
      char why[1536];
      snprintf(why, sizeof why, "%s", tsr_last_error()[0] ? tsr_last_error() : "no message");
      st = fail(&p->rep, TSR_CHECK_REGISTER, "register_rules failed: %s", why);
      goto cleanup;
    }
  }
  for (int i = 0; i < set->n; i++) {
    loaded_plugin *p = &set->p[i];
    if (!TSR_STRATEGY_HAS(p->desc, check_registry) || !p->desc->check_registry) continue;
    tsr_plugin_args args = {cfg, p->rep.name, p->rep.path, TSR_ABI_MAJOR, TSR_ABI_MINOR};
    tsr_breadcrumb_saved crumb = tsr_breadcrumb_enter(p->rep.name, "check_registry", NULL, NULL);
    st = p->desc->check_registry(reg, &args, p->state);
    tsr_breadcrumb_leave(&crumb);
    if (st != TSR_OK) {
      char why[1536];
      snprintf(why, sizeof why, "%s", tsr_last_error()[0] ? tsr_last_error() : "no message");
      fail(&p->rep, TSR_CHECK_REGISTRY, "rejects the job: %s", why);
      p->rep.status = st = TSR_EINVAL; /* a name in the job, not the plugin, is wrong */
      goto cleanup;
    }
  }
  set->ok = true;
  return TSR_OK;
cleanup : {
  /* fini may call into the library and overwrite the message the caller needs. */
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  unload(set);
  tsr_error(st, "%s", keep);
}
  return st;
}

void tsr_plugin_set_free(tsr_plugin_set_t *set) {
  if (!set) return;
  unload(set);
  free(set);
}

int tsr_plugin_set_count(const tsr_plugin_set_t *set) {
  return set ? set->n : 0;
}

const tsr_plugin_report *tsr_plugin_set_report(const tsr_plugin_set_t *set, int i) {
  return set && i >= 0 && i < set->n ? &set->p[i].rep : NULL;
}

const tsr_strategy *tsr_plugin_set_strategy(const tsr_plugin_set_t *set, int i) {
  return set && i >= 0 && i < set->n ? set->p[i].desc : NULL;
}

const char *tsr_plugin_set_owner(const tsr_plugin_set_t *set, const char *dim) {
  if (!set || !dim) return NULL;
  const char *want = tsr_mesh_canonical_name(dim);
  for (int i = 0; i < set->n; i++) {
    const tsr_strategy *d = set->p[i].desc;
    for (int k = 0; d && d->dims && d->dims[k]; k++)
      if (!strcmp(tsr_mesh_canonical_name(d->dims[k]), want)) return set->p[i].rep.name;
  }
  return NULL;
}
