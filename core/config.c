/* Job-file parser: inih does the INI syntax; this file adds line numbers, duplicate and unknown
 * detection, typed values from the schema table and the cross-key checks. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ini.h>

#include "config_internal.h"

#define MAX_ERRORS   20
#define LONG_LINES   64   /* lines longer than inih's buffer, per job file */
#define LINE_MAX_LEN 4096 /* the longest line read at all (a value holds at most TSR_MAX_VALUE) */
#define ERRBUF       8192

/* Parser state, handed to inih as both the reader's stream and the handler's user pointer. */
typedef struct parse_state {
  tsr_config *cfg;
  /* Input: a FILE or a string cursor. */
  FILE *file;
  const char *text;
  int line;           /* number of the line inih is processing */
  int continued_line; /* line that starts with blanks and holds a value: a continuation */
  bool stop;          /* a line was too long: stop, because inih would split it */
  bool section_ok;    /* the current section is known; keys of an unknown one are not reported */
  /* Values of lines too long for inih's line buffer (200 bytes in the system library): the
   * reader hands inih "key = \x01N" and on_value reads value N from here. */
  char *long_values[LONG_LINES];
  int nlong;
  int nerrors;
  char errors[ERRBUF];
  size_t errlen;
} parse_state;

static void add_error(parse_state *ps, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void add_error(parse_state *ps, int line, const char *fmt, ...) {
  ps->nerrors++;
  if (ps->nerrors > MAX_ERRORS || ps->errlen + 2 >= ERRBUF) return;
  char *p = ps->errors + ps->errlen;
  size_t room = ERRBUF - ps->errlen;
  int n = ps->errlen ? snprintf(p, room, "\n") : 0;
  n += line > 0 ? snprintf(p + n, room - (size_t)n, "%s:%d: ", ps->cfg->path, line)
                : snprintf(p + n, room - (size_t)n, "%s: ", ps->cfg->path);
  if ((size_t)n < room) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p + n, room - (size_t)n, fmt, ap);
    va_end(ap);
  }
  ps->errlen += strlen(p);
}

static bool is_core_section(const char *name) {
  for (int i = 0; tsr_schema_sections[i]; i++)
    if (!strcmp(tsr_schema_sections[i], name)) return true;
  return false;
}

static int where_line(const tsr_config *cfg, const char *section, const char *key) {
  for (int i = 0; i < cfg->nentries; i++)
    if (!strcmp(cfg->where[i].section, section) &&
        ((key == NULL && cfg->where[i].key[0] == '\0') ||
         (key != NULL && !strcmp(cfg->where[i].key, key))))
      return cfg->where[i].line;
  return 0;
}

static void add_where(tsr_config *cfg, const char *section, const char *key, int line) {
  if (cfg->nentries >= (int)(sizeof cfg->where / sizeof cfg->where[0])) return;
  snprintf(cfg->where[cfg->nentries].section, TSR_MAX_NAME, "%s", section);
  snprintf(cfg->where[cfg->nentries].key, TSR_MAX_NAME, "%s", key ? key : "");
  cfg->where[cfg->nentries].line = line;
  cfg->nentries++;
}

static int raw_line(const tsr_config *cfg, const char *section, const char *key);

/* Most ranks a job may have: [mesh] shape's product and [job] world_size alike. */
#define MAX_WORLD 1048576

/* The product of [mesh] shape, or -1 above MAX_WORLD: sizes go up to 1024 over up to
 * TSR_MAX_MESH_DIMS dims, whose product would overflow int64 if taken whole. */
static int64_t mesh_product(const tsr_config *cfg) {
  int64_t world = 1;
  for (int i = 0; i < cfg->mesh.nshape; i++) {
    if (cfg->mesh.shape[i] > 0 && world > MAX_WORLD / cfg->mesh.shape[i]) return -1;
    world *= cfg->mesh.shape[i];
  }
  return world;
}

/* The line of a key a --set gave: messages say "--set section.key" instead of a file line. */
#define SET_LINE (-1)

static void mark_set(tsr_config *cfg, const char *section, const char *key) {
  for (int i = 0; i < cfg->nentries; i++)
    if (!strcmp(cfg->where[i].section, section) && !strcmp(cfg->where[i].key, key)) {
      cfg->where[i].line = SET_LINE;
      return;
    }
  add_where(cfg, section, key, SET_LINE);
}

static tsr_config_section *find_strategy(tsr_config *cfg, const char *name) {
  for (int i = 0; i < cfg->nstrategy; i++)
    if (!strcmp(cfg->strategy[i].name, name)) return &cfg->strategy[i];
  return NULL;
}

/* A [header] line: checked here rather than in the handler because inih reports sections only
 * through their keys, and an empty misspelled section must still be an error. */
static void on_section(parse_state *ps, const char *name) {
  tsr_config *cfg = ps->cfg;
  ps->section_ok = false;
  int first = where_line(cfg, name, NULL);
  if (first) {
    add_error(ps, ps->line, "[%s]: section appears twice (first at line %d); merge them", name,
              first);
    return;
  }
  add_where(cfg, name, NULL, ps->line);
  if (is_core_section(name)) {
    ps->section_ok = true;
    return;
  }
  if (!strncmp(name, "strategy.", 9) && name[9] != '\0') {
    if (cfg->nstrategy >= TSR_MAX_PLUGINS) {
      add_error(ps, ps->line, "[%s]: more than %d [strategy.*] sections", name, TSR_MAX_PLUGINS);
      return;
    }
    tsr_config_section *s = &cfg->strategy[cfg->nstrategy++];
    snprintf(s->name, sizeof s->name, "%s", name + 9);
    s->line = ps->line;
    ps->section_ok = true;
    return;
  }
  int nsections = 0;
  while (tsr_schema_sections[nsections]) nsections++;
  const char *hint = tsr_closest_name(name, tsr_schema_sections, nsections);
  if (hint)
    add_error(ps, ps->line, "[%s]: unknown section; did you mean [%s]?", name, hint);
  else
    add_error(ps, ps->line,
              "[%s]: unknown section; sections are [job] [mesh] [plugins] [model] [data] "
              "[optimizer] [checkpoint] [output] and [strategy.NAME]",
              name);
}

/* Looks at a raw line before inih does, for what inih does not report. */
static void inspect_line(parse_state *ps, const char *s) {
  const char *p = s;
  while (*p == ' ' || *p == '\t') p++;
  if (*p == '\0' || *p == '\n' || *p == '\r' || *p == ';' || *p == '#') return;
  if (*p == '[') {
    const char *end = strchr(p, ']');
    if (!end) return; /* inih reports the syntax error */
    /* inih ignores whatever follows the ']'; only blanks and a comment may */
    const char *rest = end + 1;
    while (*rest == ' ' || *rest == '\t') rest++;
    if (*rest && *rest != '\n' && *rest != '\r' && *rest != ';' && *rest != '#') {
      size_t n = strcspn(rest, "\r\n");
      add_error(ps, ps->line,
                "text after ']' in a section header: '%.*s'; put a key on its own line, or "
                "start a comment with ';' or '#'",
                (int)(n > 40 ? 40 : n), rest);
      return;
    }
    char name[TSR_MAX_NAME];
    const char *b = p + 1, *e = end;
    while (b < e && isspace((unsigned char)*b)) b++;
    while (e > b && isspace((unsigned char)e[-1])) e--;
    snprintf(name, sizeof name, "%.*s", (int)(e - b), b);
    on_section(ps, name);
    return;
  }
  if (p != s) ps->continued_line = ps->line;
}

/* fgets-like reader that counts lines, so that every message has one. */
/* A line longer than inih's buffer, in `line` (n bytes): when it is "key = value" (or ':'), the
 * value is kept in ps and inih gets "key = \x01N" in str instead; anything else is refused. */
static char *shorten_line(parse_state *ps, char *str, int num, const char *line, int n) {
  const char *p = line, *end = line + n;
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  const char *sep = p;
  while (sep < end && *sep != '=' && *sep != ':' && *sep != '\n') sep++;
  int keylen = (int)(sep - line);
  if (p == end || *p == ';' || *p == '#' || *p == '\n' || *p == '\r') { /* a comment or blanks */
    snprintf(str, (size_t)num, "\n");
    return str;
  }
  if (sep == end || *sep == '\n' || *p == '[' || *p == ';' || *p == '#' || keylen + 16 >= num ||
      ps->nlong >= LONG_LINES) {
    add_error(ps, ps->line,
              "line is longer than %d characters and is not a 'key = value' line; "
              "shorten it",
              num - 3);
    ps->stop = true;
    return NULL;
  }
  const char *v = sep + 1;
  size_t vlen = (size_t)(end - v);
  char *copy = malloc(vlen + 1);
  if (!copy) {
    add_error(ps, ps->line, "out of memory reading a long line");
    ps->stop = true;
    return NULL;
  }
  memcpy(copy, v, vlen);
  copy[vlen] = '\0';
  /* as inih reads a value: up to an inline comment (';' after a blank), without outer blanks */
  for (char *c = copy; *c; c++)
    if (*c == ';' && c > copy && isspace((unsigned char)c[-1])) {
      *c = '\0';
      break;
    }
  size_t a = strspn(copy, " \t"), b = strlen(copy);
  while (b > a && isspace((unsigned char)copy[b - 1])) b--;
  memmove(copy, copy + a, b - a);
  copy[b - a] = '\0';
  ps->long_values[ps->nlong] = copy;
  snprintf(str, (size_t)num, "%.*s= \x01%d\n", keylen, line, ps->nlong++);
  return str;
}

static char *read_line(char *str, int num, void *stream) {
  parse_state *ps = stream;
  if (ps->stop) return NULL;
  static _Thread_local char line[LINE_MAX_LEN];
  int n = 0;
  bool eof = true;
  for (;;) {
    int c;
    if (ps->file) {
      c = fgetc(ps->file);
    } else {
      c = *ps->text ? (unsigned char)*ps->text++ : EOF;
    }
    if (c == EOF) break;
    eof = false;
    if (c == '\0') {
      /* inih reads lines as C strings: the rest of the line would vanish unseen */
      ps->line++;
      add_error(ps, ps->line, "a NUL byte at column %d; a job file is text: remove it", n + 1);
      ps->stop = true;
      return NULL;
    }
    if (n >= LINE_MAX_LEN - 1) {
      ps->line++;
      add_error(ps, ps->line, "line is longer than %d characters; shorten it", LINE_MAX_LEN - 2);
      ps->stop = true;
      return NULL;
    }
    line[n++] = (char)c;
    if (c == '\n') break;
  }
  if (eof) return NULL;
  line[n] = '\0';
  ps->line++;
  if (n >= num - 3) {
    if (!shorten_line(ps, str, num, line, n)) return NULL;
    n = (int)strlen(str);
  } else {
    memcpy(str, line, (size_t)n + 1);
  }
  /* A UTF-8 byte order mark (editors on Windows write one) is accepted and dropped here, before
   * both this file's look at the line and inih's, so the first section is read like any other. */
  if (ps->line == 1 && (unsigned char)str[0] == 0xef && (unsigned char)str[1] == 0xbb &&
      (unsigned char)str[2] == 0xbf)
    memmove(str, str + 3, (size_t)n - 2);
  inspect_line(ps, str);
  return str;
}

static void unknown_key(parse_state *ps, const char *section, const char *key) {
  const char *names[64] = {NULL};
  int n = 0;
  for (int i = 0; i < tsr_schema_len && n < 64; i++)
    if (!strcmp(tsr_schema[i].key.section, section)) names[n++] = tsr_schema[i].key.spec.name;
  const char *hint = tsr_closest_name(key, names, n);
  char list[512];
  size_t o = 0;
  list[0] = '\0';
  for (int i = 0; i < n && o < sizeof list; i++)
    o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", names[i]);
  if (hint)
    add_error(ps, ps->line, "[%s] %s: unknown key; did you mean '%s'?", section, key, hint);
  else
    add_error(ps, ps->line, "[%s] %s: unknown key; [%s] accepts %s", section, key, section, list);
}

static int on_value(void *user, const char *section, const char *name, const char *value) {
  parse_state *ps = user;
  tsr_config *cfg = ps->cfg;
  if (value[0] == '\x01') { /* a long line's value (shorten_line) */
    int k = atoi(value + 1);
    if (k >= 0 && k < ps->nlong) value = ps->long_values[k];
  }
  if (ps->continued_line == ps->line) {
    add_error(ps, ps->line,
              "[%s] %s: indented line is read as a continuation of '%s'; multi-line values are "
              "not supported: remove the indentation",
              section, name, name);
    return 1;
  }
  if (section[0] == '\0') {
    add_error(ps, ps->line, "%s: key before any [section]; put it under the section it belongs to",
              name);
    return 1;
  }
  if (!ps->section_ok) return 1; /* the header's error already covers its keys */

  if (!strncmp(section, "strategy.", 9)) {
    tsr_config_section *s = find_strategy(cfg, section + 9);
    if (!s) return 1;
    for (int i = 0; i < s->n; i++)
      if (!strcmp(s->entries[i].key, name)) {
        add_error(ps, ps->line, "[%s] %s: duplicate key (first set at line %d); keep one", section,
                  name, s->entries[i].line);
        return 1;
      }
    if (s->n >= TSR_MAX_ENTRIES) {
      add_error(ps, ps->line, "[%s] %s: more than %d keys in one section", section, name,
                TSR_MAX_ENTRIES);
      return 1;
    }
    if (strlen(name) >= TSR_MAX_NAME || strlen(value) >= TSR_MAX_VALUE) {
      add_error(ps, ps->line, "[%s] %s: key or value too long", section, name);
      return 1;
    }
    tsr_config_entry *e = &s->entries[s->n++];
    snprintf(e->key, sizeof e->key, "%s", name);
    snprintf(e->value, sizeof e->value, "%s", value);
    e->line = ps->line;
    return 1;
  }

  const tsr_schema_entry *e = tsr_schema_find(section, name);
  if (!e) {
    unknown_key(ps, section, name);
    return 1;
  }
  int first = where_line(cfg, section, name);
  if (first) {
    add_error(ps, ps->line, "[%s] %s: duplicate key (first set at line %d); keep one", section,
              name, first);
    return 1;
  }
  add_where(cfg, section, name, ps->line);
  if (tsr_key_check(&e->key.spec, value) != TSR_OK || tsr_schema_store(e, value, cfg) != TSR_OK) {
    add_error(ps, ps->line, "[%s] %s: %s", section, name, tsr_last_error());
    tsr_clear_error();
    return 1;
  }
  return 1;
}

static tsr_status apply_defaults(tsr_config *cfg) {
  for (int i = 0; i < tsr_schema_len; i++) {
    const tsr_schema_entry *e = &tsr_schema[i];
    if (!e->key.spec.default_value) continue;
    TSR_CHECK(tsr_key_check(&e->key.spec, e->key.spec.default_value));
    TSR_CHECK(tsr_schema_store(e, e->key.spec.default_value, cfg));
  }
  return TSR_OK;
}

static int line_or_header(const tsr_config *cfg, const char *section, const char *key) {
  int line = where_line(cfg, section, key);
  return line ? line : where_line(cfg, section, NULL);
}

/* Whether [plugins] load names `plugin`. */
static bool plugin_listed(const tsr_config *cfg, const char *plugin) {
  for (int j = 0; j < cfg->plugins.nload; j++)
    if (!strcmp(cfg->plugins.load[j], plugin)) return true;
  return false;
}

/* Checks that span keys: run once the whole file is read. */
static void cross_check(parse_state *ps) {
  tsr_config *cfg = ps->cfg;
  int dl = line_or_header(cfg, "mesh", "dims"), sl = line_or_header(cfg, "mesh", "shape");

  if (cfg->mesh.ndim == 0)
    add_error(ps, dl, "[mesh] dims: empty; name at least one dim, e.g. dims = dp");
  if (cfg->mesh.ndim != cfg->mesh.nshape) {
    add_error(ps, sl, "[mesh] shape: %d entr%s but dims (line %d) has %d; give one size per dim",
              cfg->mesh.nshape, cfg->mesh.nshape == 1 ? "y" : "ies", dl, cfg->mesh.ndim);
  } else {
    int64_t world = mesh_product(cfg);
    cfg->mesh.world = world < 0 ? 0 : world;
    if (world < 0)
      add_error(ps, sl, "[mesh] shape: the product exceeds %d ranks; use fewer or smaller dims",
                MAX_WORLD);
    else if (cfg->job.world_size != 0 && cfg->job.world_size != world)
      add_error(ps, sl,
                "[mesh] shape: product %lld differs from [job] world_size = %lld (line %d); "
                "make them agree or set world_size = 0",
                (long long)world, (long long)cfg->job.world_size,
                where_line(cfg, "job", "world_size"));
  }
  for (int i = 0; i < cfg->mesh.ndim; i++)
    for (int j = 0; j < i; j++)
      if (!strcmp(cfg->mesh.names[i], cfg->mesh.names[j]))
        add_error(ps, dl, "[mesh] dims: '%s' appears twice; each dim name once",
                  cfg->mesh.names[i]);

  int pl = line_or_header(cfg, "plugins", "load");
  for (int i = 0; i < cfg->plugins.nload; i++)
    for (int j = 0; j < i; j++)
      if (!strcmp(cfg->plugins.load[i], cfg->plugins.load[j]))
        add_error(ps, pl, "[plugins] load: '%s' is listed twice; list each plugin once",
                  cfg->plugins.load[i]);

  for (int i = 0; i < cfg->nstrategy; i++) {
    if (!plugin_listed(cfg, cfg->strategy[i].name))
      add_error(ps, cfg->strategy[i].line,
                "[strategy.%s]: plugin '%s' is not in [plugins] load (line %d); add it there or "
                "remove the section",
                cfg->strategy[i].name, cfg->strategy[i].name, pl);
  }

  const char *src = cfg->data.source;
  if (strcmp(src, "synthetic")) {
    static const char *const kinds[] = {"text:", "tokens:", "safetensors:"};
    bool ok = false;
    for (int i = 0; i < 3; i++)
      ok |= !strncmp(src, kinds[i], strlen(kinds[i])) && src[strlen(kinds[i])] != '\0';
    if (!ok)
      add_error(ps, line_or_header(cfg, "data", "source"),
                "[data] source: '%s' is not synthetic, text:PATH, tokens:PATH or "
                "safetensors:PATH",
                src);
  }

  int64_t heads = cfg->model.num_attention_heads;
  if (cfg->model.num_key_value_heads == 0) cfg->model.num_key_value_heads = heads;
  if (cfg->model.hidden_size % heads)
    add_error(ps, line_or_header(cfg, "model", "num_attention_heads"),
              "[model] num_attention_heads: %lld does not divide hidden_size %lld; pick a divisor",
              (long long)heads, (long long)cfg->model.hidden_size);
  if (heads % cfg->model.num_key_value_heads)
    add_error(ps, line_or_header(cfg, "model", "num_key_value_heads"),
              "[model] num_key_value_heads: %lld does not divide num_attention_heads %lld",
              (long long)cfg->model.num_key_value_heads, (long long)heads);
  if (cfg->job.device == TSR_DEVICE_CUDA && !strcmp(cfg->job.backend, "mpi"))
    add_error(ps, line_or_header(cfg, "job", "backend"),
              "[job] backend: mpi moves host memory; use backend = nccl with device = cuda");
}

static tsr_status parse(parse_state *ps, const char *name) {
  /* the job's directory resolves every relative path of it: cut, it would move them */
  if (strlen(name) >= TSR_MAX_PATH)
    return tsr_error(TSR_EINVAL,
                     "%.60s...: the job file's path has %zu characters, more than the %d a job "
                     "path may have; move the job file to a shorter path or run it from its "
                     "directory",
                     name, strlen(name), TSR_MAX_PATH - 1);
  /* the keys added since ABI 1.0 follow the frozen struct in the same allocation */
  tsr_config_full *full = calloc(1, sizeof *full);
  if (!full) return TSR_ERROR(TSR_ENOMEM, "out of memory reading %s", name);
  tsr_config *cfg = &full->cfg;
  ps->cfg = cfg;
  snprintf(cfg->path, sizeof cfg->path, "%s", name);
  const char *slash = strrchr(name, '/');
  if (slash)
    snprintf(cfg->dir, sizeof cfg->dir, "%.*s", (int)(slash - name), name);
  else
    snprintf(cfg->dir, sizeof cfg->dir, ".");
  if (slash == name) snprintf(cfg->dir, sizeof cfg->dir, "/");

  tsr_status st = apply_defaults(cfg);
  if (st != TSR_OK) {
    free(cfg);
    return tsr_error_prefix(st, "schema default");
  }
  int rc = ini_parse_stream(read_line, ps, on_value, ps);
  if (rc > 0 && !ps->stop)
    add_error(ps, rc,
              "syntax error: expected '[section]', 'key = value' or a comment (';' or '#')");
  else if (rc < 0)
    add_error(ps, 0, "out of memory while parsing");
  if (!ps->stop) cross_check(ps);
  if (ps->nerrors) {
    if (ps->nerrors > MAX_ERRORS)
      add_error(ps, 0, "... and %d more errors", ps->nerrors - MAX_ERRORS);
    free(cfg);
    return tsr_error(TSR_EINVAL, "%s", ps->errors);
  }
  return TSR_OK;
}

static void state_free(parse_state *ps) {
  for (int i = 0; i < ps->nlong; i++) free(ps->long_values[i]);
  free(ps);
}

tsr_status tsr_config_load(const char *path, tsr_config **out) {
  *out = NULL;
  /* O_NONBLOCK: a FIFO opens at once and is refused by its type instead of waiting for a
   * writer; a directory opens too, and reads as an empty (all-default) job unless refused */
  int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return tsr_error(TSR_EIO, "%s: cannot open job file: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    bool dir = fstat(fd, &sb) == 0 && S_ISDIR(sb.st_mode);
    close(fd);
    return tsr_error(TSR_EIO, "%s: the job file is %s; give a job file (JOB.ini)", path,
                     dir ? "a directory" : "not a regular file (a FIFO, socket or device)");
  }
  FILE *f = fdopen(fd, "r");
  if (!f) {
    close(fd);
    return tsr_error(TSR_EIO, "%s: cannot open job file: %s", path, strerror(errno));
  }
  parse_state *ps = calloc(1, sizeof *ps);
  if (!ps) {
    fclose(f);
    return TSR_ERROR(TSR_ENOMEM, "out of memory reading %s", path);
  }
  ps->file = f;
  tsr_status st = parse(ps, path);
  if (st == TSR_OK && ferror(f)) {
    free(ps->cfg);
    st = tsr_error(TSR_EIO, "%s: reading the job file failed: %s", path, strerror(errno));
  }
  if (st == TSR_OK) *out = ps->cfg;
  fclose(f);
  state_free(ps);
  return st;
}

tsr_status tsr_config_parse_string(const char *text, const char *name, tsr_config **out) {
  *out = NULL;
  parse_state *ps = calloc(1, sizeof *ps);
  if (!ps) return TSR_ERROR(TSR_ENOMEM, "out of memory reading %s", name);
  ps->text = text;
  tsr_status st = parse(ps, name ? name : "<string>");
  if (st == TSR_OK) *out = ps->cfg;
  state_free(ps);
  return st;
}

void tsr_config_free(tsr_config *cfg) {
  free(cfg);
}

const tsr_config_ext *tsr_config_ext_of(const tsr_config *cfg) {
  return &((const tsr_config_full *)cfg)->ext;
}

tsr_status tsr_config_check_world(const tsr_config *cfg, int world) {
  if (cfg->mesh.world == world) return TSR_OK;
  return tsr_config_error(cfg, TSR_EINVAL, "mesh", "shape",
                          "product %lld differs from the world size %d the backend started; "
                          "change shape or start %lld ranks",
                          (long long)cfg->mesh.world, world, (long long)cfg->mesh.world);
}

/* --set strategy.NAME.key=value: the entry is added to (or replaces one in) [strategy.NAME],
 * made if the file has none; the plugin checks its keys when it loads, as for the file's. */
static tsr_status set_strategy_key(tsr_config *cfg, const char *assignment) {
  const char *name = assignment + 9, *dot = strchr(name, '.'), *eq = strchr(assignment, '=');
  if (!dot || !eq || dot > eq || dot == name || eq == dot + 1)
    return tsr_error(
        TSR_EINVAL, "--set '%s': expected strategy.NAME.key=value, e.g. strategy.pp.schedule=gpipe",
        assignment);
  if (dot - name >= TSR_MAX_NAME || eq - dot - 1 >= TSR_MAX_NAME || strlen(eq + 1) >= TSR_MAX_VALUE)
    return tsr_error(TSR_EINVAL, "--set '%s': plugin name, key or value too long", assignment);
  char plugin[TSR_MAX_NAME], key[TSR_MAX_NAME];
  snprintf(plugin, sizeof plugin, "%.*s", (int)(dot - name), name);
  snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
  tsr_config_section *sec = find_strategy(cfg, plugin);
  if (!sec) {
    if (cfg->nstrategy >= TSR_MAX_PLUGINS)
      return tsr_error(TSR_EINVAL, "--set '%s': more than %d [strategy.*] sections", assignment,
                       TSR_MAX_PLUGINS);
    sec = &cfg->strategy[cfg->nstrategy++];
    memset(sec, 0, sizeof *sec);
    snprintf(sec->name, sizeof sec->name, "%s", plugin);
  }
  tsr_config_entry *e = NULL;
  for (int i = 0; i < sec->n && !e; i++)
    if (!strcmp(sec->entries[i].key, key)) e = &sec->entries[i];
  if (!e) {
    if (sec->n >= TSR_MAX_ENTRIES)
      return tsr_error(TSR_EINVAL, "--set '%s': more than %d keys in [strategy.%s]", assignment,
                       TSR_MAX_ENTRIES, plugin);
    e = &sec->entries[sec->n++];
    snprintf(e->key, sizeof e->key, "%s", key);
  }
  e->line = SET_LINE; /* from the command line: a message must not point at the file's old line */
  snprintf(e->value, sizeof e->value, "%s", eq + 1);
  return TSR_OK;
}

tsr_status tsr_config_set(tsr_config *cfg, const char *assignment) {
  if (!strncmp(assignment, "strategy.", 9)) return set_strategy_key(cfg, assignment);
  const char *dot = strchr(assignment, '.');
  const char *eq = strchr(assignment, '=');
  if (!dot || !eq || dot > eq)
    return tsr_error(TSR_EINVAL, "--set '%s': expected section.key=value, e.g. output.dump=d.st",
                     assignment);
  char section[TSR_MAX_NAME], key[TSR_MAX_NAME];
  if (dot - assignment >= TSR_MAX_NAME || eq - dot - 1 >= TSR_MAX_NAME)
    return tsr_error(TSR_EINVAL, "--set '%s': section or key too long", assignment);
  snprintf(section, sizeof section, "%.*s", (int)(dot - assignment), assignment);
  snprintf(key, sizeof key, "%.*s", (int)(eq - dot - 1), dot + 1);
  const char *value = eq + 1;
  const tsr_schema_entry *e = tsr_schema_find(section, key);
  if (!e) {
    const char *names[128];
    int n = 0;
    for (int i = 0; i < tsr_schema_len && n < 128; i++)
      if (!strcmp(tsr_schema[i].key.section, section)) names[n++] = tsr_schema[i].key.spec.name;
    if (!n)
      return tsr_error(TSR_EINVAL, "--set '%s': no section [%s] in the job-file schema", assignment,
                       section);
    const char *hint = tsr_closest_name(key, names, n);
    return tsr_error(TSR_EINVAL, "--set '%s': [%s] has no key '%s'%s%s%s", assignment, section, key,
                     hint ? "; did you mean '" : "", hint ? hint : "", hint ? "'?" : "");
  }
  if (strlen(value) >= TSR_MAX_VALUE)
    return tsr_error(TSR_EINVAL, "--set '%s': value longer than %d characters", assignment,
                     TSR_MAX_VALUE - 1);
  tsr_status st = tsr_key_check(&e->key.spec, value);
  if (st == TSR_OK) st = tsr_schema_store(e, value, cfg);
  if (st != TSR_OK) return tsr_error_prefix(st, "--set %s.%s", section, key);
  mark_set(cfg, section, key);
  if (!strcmp(section, "mesh")) {
    /* dims and shape may be set one after the other: a count mismatch between them is only an
     * error if it remains when every --set is applied (world = 0 until then); the checks that
     * need both are in tsr_config_check_sets */
    int64_t world = cfg->mesh.ndim == cfg->mesh.nshape ? mesh_product(cfg) : 0;
    if (world < 0)
      return tsr_error(TSR_EINVAL,
                       "--set mesh.%s: the shape's product exceeds %d ranks; use fewer or "
                       "smaller dims",
                       key, MAX_WORLD);
    cfg->mesh.world = world;
  }
  return TSR_OK;
}

tsr_status tsr_config_check_sets(const tsr_config *cfg) {
  if (cfg->mesh.ndim != cfg->mesh.nshape)
    return tsr_error(TSR_EINVAL,
                     "--set: [mesh] dims names %d dims but shape gives %d sizes; set both, e.g. "
                     "--set mesh.dims=dp,tp --set mesh.shape=2,2",
                     cfg->mesh.ndim, cfg->mesh.nshape);
  /* what the file's cross-checks say of the world, again after the overrides: whichever of
   * shape and world_size a --set changed is the key named */
  int64_t world = mesh_product(cfg);
  if (world < 0)
    return tsr_config_error(cfg, TSR_EINVAL, "mesh", "shape",
                            "the product exceeds %d ranks; use fewer or smaller dims", MAX_WORLD);
  if (cfg->job.world_size != 0 && cfg->job.world_size != world) {
    bool by_set = raw_line(cfg, "job", "world_size") == SET_LINE ||
                  raw_line(cfg, "mesh", "shape") != SET_LINE;
    return tsr_config_error(cfg, TSR_EINVAL, by_set ? "job" : "mesh",
                            by_set ? "world_size" : "shape",
                            "[job] world_size = %lld but [mesh] shape's product is %lld; make "
                            "them agree, or set world_size = 0",
                            (long long)cfg->job.world_size, (long long)world);
  }
  for (int i = 0; i < cfg->nstrategy; i++)
    if (!plugin_listed(cfg, cfg->strategy[i].name))
      return tsr_error(TSR_EINVAL,
                       "[strategy.%s] is set but plugin '%s' is not in [plugins] load; add it "
                       "(e.g. --set plugins.load=...,%s) or drop the section",
                       cfg->strategy[i].name, cfg->strategy[i].name, cfg->strategy[i].name);
  return TSR_OK;
}

/* The raw line of a key: > 0 in the file, SET_LINE when a --set gave it, 0 when neither did. */
static int raw_line(const tsr_config *cfg, const char *section, const char *key) {
  if (!strncmp(section, "strategy.", 9) && key) {
    const tsr_config_section *s = tsr_config_strategy(cfg, section + 9);
    for (int i = 0; s && i < s->n; i++)
      if (!strcmp(s->entries[i].key, key)) return s->entries[i].line;
    return 0;
  }
  return where_line(cfg, section, key);
}

int tsr_config_line(const tsr_config *cfg, const char *section, const char *key) {
  int line = raw_line(cfg, section, key);
  return line > 0 ? line : 0;
}

const char *tsr_config_where(const tsr_config *cfg, const char *section, const char *key, char *buf,
                             size_t len) {
  int line = key ? raw_line(cfg, section, key) : 0;
  if (line == SET_LINE)
    snprintf(buf, len, "--set %s.%s", section, key);
  else if (line > 0)
    snprintf(buf, len, "%s:%d: [%s] %s", cfg->path, line, section, key);
  else if (key)
    snprintf(buf, len, "%s: [%s] %s", cfg->path, section, key);
  else
    snprintf(buf, len, "%s: [%s]", cfg->path, section);
  return buf;
}

tsr_status tsr_config_error(const tsr_config *cfg, tsr_status s, const char *section,
                            const char *key, const char *fmt, ...) {
  char msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  int line = key ? raw_line(cfg, section, key) : 0;
  /* an override is reported as what was typed, not at the line it replaced */
  if (line == SET_LINE) return tsr_error(s, "--set %s.%s: %s", section, key, msg);
  if (!line) line = tsr_config_line(cfg, section, NULL);
  char loc[TSR_MAX_PATH + 16];
  if (line)
    snprintf(loc, sizeof loc, "%s:%d", cfg->path, line);
  else
    snprintf(loc, sizeof loc, "%s", cfg->path);
  if (key) return tsr_error(s, "%s: [%s] %s: %s", loc, section, key, msg);
  return tsr_error(s, "%s: [%s]: %s", loc, section, msg);
}

const tsr_config_section *tsr_config_strategy(const tsr_config *cfg, const char *name) {
  return find_strategy((tsr_config *)cfg, name);
}

static const tsr_key_spec *find_spec(const tsr_key_spec *keys, const char *key) {
  for (int i = 0; keys && keys[i].name; i++)
    if (!strcmp(keys[i].name, key)) return &keys[i];
  return NULL;
}

tsr_status tsr_config_check_section(const tsr_config *cfg, const char *plugin,
                                    const tsr_key_spec *keys, const char *plugin_path) {
  char section[TSR_MAX_NAME + 16];
  snprintf(section, sizeof section, "strategy.%s", plugin);
  const tsr_config_section *s = tsr_config_strategy(cfg, plugin);
  for (int i = 0; s && i < s->n; i++) {
    const tsr_config_entry *e = &s->entries[i];
    const tsr_key_spec *spec = find_spec(keys, e->key);
    if (!spec) {
      const char *names[TSR_MAX_ENTRIES];
      int n = 0;
      for (int k = 0; keys && keys[k].name && n < TSR_MAX_ENTRIES; k++) names[n++] = keys[k].name;
      const char *hint = tsr_closest_name(e->key, names, n);
      char list[512] = "";
      size_t o = 0;
      for (int k = 0; k < n && o < sizeof list; k++)
        o += (size_t)snprintf(list + o, sizeof list - o, "%s%s", k ? ", " : "", names[k]);
      if (hint)
        return tsr_config_error(cfg, TSR_EINVAL, section, e->key,
                                "unknown key for plugin %s (%s); did you mean '%s'?", plugin,
                                plugin_path, hint);
      return tsr_config_error(cfg, TSR_EINVAL, section, e->key,
                              "unknown key for plugin %s (%s); it accepts: %s", plugin, plugin_path,
                              n ? list : "no keys");
    }
    if (tsr_key_check(spec, e->value) != TSR_OK) {
      char why[1024];
      snprintf(why, sizeof why, "%s", tsr_last_error());
      return tsr_config_error(cfg, TSR_EINVAL, section, e->key, "%s", why);
    }
  }
  for (int k = 0; keys && keys[k].name; k++) {
    bool set = false;
    for (int i = 0; s && i < s->n; i++) set |= !strcmp(s->entries[i].key, keys[k].name);
    if (!set && !keys[k].default_value) {
      char want[256];
      tsr_key_describe(&keys[k], want, sizeof want);
      if (!s)
        return tsr_config_error(cfg, TSR_EINVAL, "plugins", "load",
                                "plugin %s (%s) requires key '%s' (%s); add a [%s] section "
                                "with '%s = ...'",
                                plugin, plugin_path, keys[k].name, want, section, keys[k].name);
      return tsr_config_error(cfg, TSR_EINVAL, section, NULL,
                              "plugin %s (%s) requires key '%s' (%s); add '%s = ...'", plugin,
                              plugin_path, keys[k].name, want, keys[k].name);
    }
  }
  return TSR_OK;
}

const char *tsr_config_get(const tsr_config *cfg, const char *plugin, const tsr_key_spec *keys,
                           const char *key) {
  const tsr_config_section *s = tsr_config_strategy(cfg, plugin);
  for (int i = 0; s && i < s->n; i++)
    if (!strcmp(s->entries[i].key, key)) return s->entries[i].value;
  const tsr_key_spec *spec = find_spec(keys, key);
  return spec ? spec->default_value : NULL;
}

static tsr_status get_checked(const tsr_config *cfg, const char *plugin, const tsr_key_spec *keys,
                              const char *key, const char **value) {
  *value = tsr_config_get(cfg, plugin, keys, key);
  if (!*value)
    return TSR_ERROR(TSR_EINVAL, "plugin %s asked for key '%s', which it does not declare", plugin,
                     key);
  return TSR_OK;
}

tsr_status tsr_config_get_int(const tsr_config *cfg, const char *plugin, const tsr_key_spec *keys,
                              const char *key, int64_t *out) {
  const char *v;
  TSR_CHECK(get_checked(cfg, plugin, keys, key, &v));
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end || errno)
    return TSR_ERROR(TSR_EINVAL, "[strategy.%s] %s: '%s' is not an integer", plugin, key, v);
  *out = x;
  return TSR_OK;
}

tsr_status tsr_config_get_float(const tsr_config *cfg, const char *plugin, const tsr_key_spec *keys,
                                const char *key, double *out) {
  const char *v;
  TSR_CHECK(get_checked(cfg, plugin, keys, key, &v));
  char *end;
  double x = strtod(v, &end);
  if (end == v || *end)
    return TSR_ERROR(TSR_EINVAL, "[strategy.%s] %s: '%s' is not a number", plugin, key, v);
  *out = x;
  return TSR_OK;
}

tsr_status tsr_config_get_bool(const tsr_config *cfg, const char *plugin, const tsr_key_spec *keys,
                               const char *key, bool *out) {
  const char *v;
  TSR_CHECK(get_checked(cfg, plugin, keys, key, &v));
  if (strcmp(v, "true") && strcmp(v, "false"))
    return TSR_ERROR(TSR_EINVAL, "[strategy.%s] %s: '%s' is not true or false", plugin, key, v);
  *out = !strcmp(v, "true");
  return TSR_OK;
}
