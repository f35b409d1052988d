/* `--set` overrides of `run` and `plan`: a path typed on the command line is relative to the
 * current directory, the job file's own paths to the job file. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "app.h"

/* Keys whose values are paths, with the prefix before the path ("text:" for data sources). */
static bool is_path_key(const char *assignment) {
  static const char *const keys[] = {
      "checkpoint.load=",    "checkpoint.save=", "output.dump=", "output.trace=",
      "output.metrics=",     "data.source=",     "eval.source=", "checkpoint.dir=",
      "output.tensorboard=", "data.index="};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
    if (!strncmp(assignment, keys[i], strlen(keys[i]))) return true;
  return false;
}

/* The current directory, malloc'd, however long; NULL with errno set when it cannot be read. */
static char *current_dir(void) {
  for (size_t len = 256; len <= ((size_t)1 << 20); len *= 2) {
    char *buf = malloc(len);
    if (!buf) return NULL;
    if (getcwd(buf, len)) return buf;
    int err = errno;
    free(buf);
    if (err != ERANGE) {
      errno = err;
      return NULL;
    }
  }
  errno = ENAMETOOLONG;
  return NULL;
}

/* plugins.path=DIR[:DIR...] (':' or ',' between entries): each relative DIR taken from the
 * current directory, as for the other path keys, instead of from the job file's directory. */
static char *absolute_dirs(const char *cmd, const char *assignment) {
  const char *val = assignment + 13;
  char *cwd = current_dir();
  if (!cwd) {
    fprintf(stderr,
            "tessera %s: --set %s: cannot read the current directory to resolve relative "
            "entries: %s; give absolute paths\n",
            cmd, assignment, strerror(errno));
    return NULL;
  }
  size_t entries = 1;
  for (const char *p = val; *p; p++) entries += *p == ':' || *p == ',';
  size_t len = strlen(assignment) + entries * (strlen(cwd) + 1) + 1;
  char *out = malloc(len);
  if (!out) {
    free(cwd);
    fprintf(stderr, "tessera %s: out of memory\n", cmd);
    return NULL;
  }
  size_t o = (size_t)snprintf(out, len, "plugins.path=");
  for (const char *b = val;;) {
    size_t n = strcspn(b, ":,");
    const char *sep = b[n] ? (b[n] == ':' ? ":" : ",") : "";
    if (n == 0 || b[0] == '/')
      o += (size_t)snprintf(out + o, len - o, "%.*s%s", (int)n, b, sep);
    else
      o += (size_t)snprintf(out + o, len - o, "%s/%.*s%s", cwd, (int)n, b, sep);
    if (!b[n]) break;
    b += n + 1;
  }
  free(cwd);
  return out;
}

char *tsr_app_absolute_set(const char *cmd, const char *assignment) {
  if (!strncmp(assignment, "plugins.path=", 13)) return absolute_dirs(cmd, assignment);
  const char *eq = strchr(assignment, '=');
  const char *val = eq ? eq + 1 : assignment;
  /* a data source is KIND:PATH, or a kind alone (synthetic) */
  bool source =
      !strncmp(assignment, "data.source=", 12) || !strncmp(assignment, "eval.source=", 12);
  const char *colon = source ? strchr(val, ':') : NULL;
  const char *path = colon ? colon + 1 : val;
  bool keep = !is_path_key(assignment) || !path[0] || path[0] == '/' || (!colon && source) ||
              !strcmp(assignment, "checkpoint.load=latest"); /* a keyword, not a path */
  char *cwd = keep ? NULL : current_dir();
  if (!keep && !cwd) {
    fprintf(stderr,
            "tessera %s: --set %s: cannot read the current directory to resolve the "
            "relative path: %s; give an absolute path\n",
            cmd, assignment, strerror(errno));
    return NULL;
  }
  size_t len = strlen(assignment) + (cwd ? strlen(cwd) : 0) + 2;
  char *out = malloc(len);
  if (!out) {
    free(cwd);
    fprintf(stderr, "tessera %s: out of memory\n", cmd);
    return NULL;
  }
  if (keep)
    snprintf(out, len, "%s", assignment);
  else
    snprintf(out, len, "%.*s%s/%s", (int)(path - assignment), assignment, cwd, path);
  free(cwd);
  return out;
}
