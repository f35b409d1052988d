/* `tessera conform PLUGIN`: options, the test list, isolation and reporting.
 *
 * Every test runs in its own forked child, so a plugin that crashes, aborts or hangs fails that
 * test (naming the signal or the timeout) and the suite goes on. The child sends its verdict and
 * message through a pipe; its stdout and stderr go to a file whose last line is quoted when the
 * child dies without a verdict. The parent never calls into the plugin.
 */
#define _GNU_SOURCE /* strsignal, realpath, usleep */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conform.h"
#include "tessera/tessera.h"

static const char conform_usage[] =
    "usage: tessera conform PLUGIN [options]\n"
    "\n"
    "Runs the conformance suite against one strategy plugin: PLUGIN is a name on the plugin\n"
    "search path (tp) or a path to a libtessera-<name>.so. Levels (docs/conformance.md):\n"
    "  L0  load and ABI: the descriptor's fields, ABI version, struct_size, name, dims, keys\n"
    "  L1  contract: bad keys rejected with a message, init/fini pairing, fini after a failed "
    "job,\n"
    "      rejections carry a message, register_rules accepted by the registry\n"
    "  L2  each op rule, redistribute transition, module style and schedule it registers, against\n"
    "      float64 references within what f32 rounding explains (relative L2 2e-6), on meshes of\n"
    "      1-4 ranks along its dims, uneven sizes, forward and backward\n"
    "  L3  the Llama model (and its MoE variant, for a plugin with rules for the MoE ops or\n"
    "      the experts style), five training steps, with the plugin alone and beside the other\n"
    "      plugins found and zdp (a data split on a dim of a fresh name), against the 1-rank run:\n"
    "      step 1's tensors, every loss, the parameters and AdamW moments after the last step;\n"
    "      bytes must cross the plugin's dim\n"
    "Each test runs in a child process; a crash or a hang fails that test only. What the plugin\n"
    "does not register or the model cannot split is NOTSUP, not a failure.\n"
    "\n"
    "options:\n"
    "  --filter GLOB    run only the tests whose name matches (repeatable: any of them)\n"
    "  --list           print the test names and exit\n"
    "  --format FORMAT  human (default), tap (TAP 13) or junit (JUnit XML); --output is the\n"
    "                   same option, and takes xml for junit\n"
    "  --xfail FILE     expected failures: one 'GLOB reason' per line ('#' comments); a matching\n"
    "                   failure is XFAIL, a matching pass is XPASS (which fails the run)\n"
    "  --strict         NOTSUP fails the run\n"
    "  --timeout S      seconds per test before it is killed (default 60)\n"
    "  --verbose        print each child's output\n"
    "\n"
    "exit codes: 0 every test passed (or XFAIL, or NOTSUP without --strict), 1 a test failed or\n"
    "            passed unexpectedly (XPASS), 2 bad arguments (a --filter that matches no test\n"
    "            too), unreadable --xfail file, or no such plugin file\n";

typedef enum cf_format { CF_HUMAN = 0, CF_TAP, CF_XML } cf_format;

typedef struct cf_xfail {
  char glob[160];
  char reason[256];
} cf_xfail;

typedef struct cf_outcome {
  cf_result result;
  double secs;
  char msg[CF_MSG];
  char xreason[256];
} cf_outcome;

static cf_test g_tests[CF_MAX_TESTS];
char cf_tmpdir[TSR_MAX_PATH];
char cf_suite_dir[TSR_MAX_PATH];
static int g_ntests;

static int g_dropped; /* tests beyond CF_MAX_TESTS, reported in the header */

bool cf_add_test(const char *name, int level, cf_test_fn fn, int item, int n, const char *arg) {
  if (g_ntests >= CF_MAX_TESTS) {
    g_dropped++;
    return false;
  }
  cf_test *t = &g_tests[g_ntests++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", name);
  t->level = level;
  t->fn = fn;
  t->item = item;
  t->n = n;
  snprintf(t->arg, sizeof t->arg, "%s", arg ? arg : "");
  return true;
}

cf_result cf_say(char *msg, size_t len, cf_result r, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, len, fmt, ap);
  va_end(ap);
  return r;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *result_name(cf_result r) {
  static const char *const names[] = {"PASS", "FAILED", "NOTSUP", "XFAIL", "XPASS"};
  return names[r];
}

/* The last non-empty line of a file, and the one before it, for a child that died without a
 * verdict. */
static void last_lines(const char *path, char *out, char *before, size_t len) {
  out[0] = before[0] = '\0';
  FILE *f = fopen(path, "r");
  if (!f) return;
  char line[CF_MSG];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = '\0';
    if (!line[0]) continue;
    snprintf(before, len, "%s", out);
    snprintf(out, len, "%s", line);
  }
  fclose(f);
}

/* Removes a test's directory and the plain files in it. */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  while ((e = readdir(d))) {
    char f[TSR_MAX_PATH];
    if (e->d_name[0] == '.') continue;
    if (snprintf(f, sizeof f, "%s/%s", dir, e->d_name) < (int)sizeof f) unlink(f);
  }
  closedir(d);
  rmdir(dir);
}

static void copy_file(const char *path, FILE *to) {
  FILE *f = fopen(path, "r");
  if (!f) return;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, to);
  fclose(f);
}

#define CF_CRASH_PROG "tessera conform"

/* The crash handler's line (apps/crash.c), "tessera conform: rank 1 crashed (SIGSEGV) in plugin
 * P, op rule R (forward), step 2" or "tessera conform: crashed (SIGSEGV) outside the ranks, in
 * plugin P, init", as "crashed: signal 11 (Segmentation fault) on rank 1 in plugin P, ...".
 * False when `line` is not one. */
static bool crash_report(const char *line, char *msg, size_t len) {
  static const struct {
    const char *name;
    int sig;
  } sigs[] = {{"SIGSEGV", SIGSEGV},
              {"SIGBUS", SIGBUS},
              {"SIGFPE", SIGFPE},
              {"SIGABRT", SIGABRT},
              {"SIGILL", SIGILL}};
  size_t pl = strlen(CF_CRASH_PROG ": ");
  const char *c = strstr(line, "crashed (");
  if (strncmp(line, CF_CRASH_PROG ": ", pl) || !c) return false;
  const char *name = c + strlen("crashed ("), *close = strchr(name, ')');
  int sig = 0;
  for (size_t i = 0; close && i < sizeof sigs / sizeof sigs[0]; i++)
    if (strlen(sigs[i].name) == (size_t)(close - name) &&
        !strncmp(name, sigs[i].name, (size_t)(close - name)))
      sig = sigs[i].sig;
  if (!sig) return false;
  const char *who = line + pl, *where = close + 1;
  if (!strncmp(where, " outside the ranks", 18)) where += 18;
  while (*where == ',' || *where == ' ') where++;
  int wl = c > who ? (int)(c - who - 1) : 0;
  snprintf(msg, len, "crashed: signal %d (%s)%s%.*s%s%s", sig, strsignal(sig), wl > 0 ? " on " : "",
           wl > 0 ? wl : 0, who, *where ? " in " : "", where);
  /* "in in plugin" when the handler already wrote "in" */
  char *dup = strstr(msg, " in in ");
  if (dup) memmove(dup, dup + 3, strlen(dup + 3) + 1);
  return true;
}

/* Runs fn in a child with a timeout. The verdict travels as one byte then the message. */
static void run_isolated(const cf_plugin *p, const cf_test *t, double timeout_s, bool verbose,
                         cf_outcome *o) {
  memset(o, 0, sizeof *o);
  double t0 = now_s();
  /* one directory per test for its output and files, removed whatever the child did */
  const char *tmp = getenv("TMPDIR");
  char dir[TSR_MAX_PATH], logpath[TSR_MAX_PATH + 16];
  snprintf(dir, sizeof dir, "%s/tessera-conform-XXXXXX", tmp && tmp[0] == '/' ? tmp : "/tmp");
  int logfd = -1, fds[2] = {-1, -1};
  if (mkdtemp(dir)) {
    snprintf(logpath, sizeof logpath, "%s/output", dir);
    logfd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  }
  if (logfd < 0 || pipe(fds) != 0) {
    o->result = CF_FAIL;
    snprintf(o->msg, sizeof o->msg, "cannot start the test: %s", strerror(errno));
    if (logfd >= 0) close(logfd);
    remove_dir(dir);
    return;
  }
  snprintf(cf_tmpdir, sizeof cf_tmpdir, "%s", dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    dup2(logfd, STDOUT_FILENO);
    dup2(logfd, STDERR_FILENO);
    /* a fatal signal prints the crashing thread's breadcrumb (the plugin callback it ran) to the
     * log and exits 1; crash_report turns that into the test's message */
    tsr_app_crash_install(CF_CRASH_PROG);
    char msg[CF_MSG] = "";
    cf_result r = t->fn(p, t, msg, sizeof msg);
    char rb = (char)r;
    if (write(fds[1], &rb, 1) != 1 || write(fds[1], msg, strlen(msg)) < 0) _exit(3);
    fflush(NULL);
    _exit(0);
  }
  close(fds[1]);
  if (pid < 0) {
    o->result = CF_FAIL;
    snprintf(o->msg, sizeof o->msg, "cannot fork: %s", strerror(errno));
    close(fds[0]), close(logfd);
    remove_dir(dir);
    return;
  }
  char buf[CF_MSG + 1];
  size_t got = 0;
  bool timed_out = false;
  for (;;) {
    double left = timeout_s - (now_s() - t0);
    if (left <= 0) {
      timed_out = true;
      break;
    }
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int pr = poll(&pfd, 1, (int)(left * 1000) + 1);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    ssize_t n = read(fds[0], buf + got, sizeof buf - 1 - got);
    if (n <= 0) break; /* the child closed the pipe: it exited or died */
    got += (size_t)n;
    if (got >= sizeof buf - 1) break;
  }
  int status = 0;
  if (timed_out) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else {
    /* The verdict is in; a child stuck in exit (a plugin destructor) still counts as hung. */
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (now_s() - t0 > timeout_s) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        timed_out = true;
        break;
      }
      usleep(2000);
    }
  }
  close(fds[0]);
  close(logfd);
  o->secs = now_s() - t0;
  char tail[CF_MSG], before[CF_MSG];
  last_lines(logpath, tail, before, sizeof tail);
  if (verbose) {
    fprintf(stderr, "---- output of %s ----\n", t->name);
    copy_file(logpath, stderr);
  }
  remove_dir(dir);
  buf[got] = '\0';
  if (timed_out) {
    o->result = CF_FAIL;
    snprintf(o->msg, sizeof o->msg, "timed out after %g s (hung)%s%s", timeout_s,
             tail[0] ? "; last output: " : "", tail);
  } else if (WIFSIGNALED(status) && got == 0) {
    int sig = WTERMSIG(status);
    o->result = CF_FAIL;
    snprintf(o->msg, sizeof o->msg, "crashed: signal %d (%s)%s%s", sig, strsignal(sig),
             tail[0] ? "; last output: " : "", tail);
  } else if (got == 0 && crash_report(tail, o->msg, sizeof o->msg)) {
    o->result = CF_FAIL;
    size_t l = strlen(o->msg);
    if (before[0]) snprintf(o->msg + l, sizeof o->msg - l, "; last output before it: %s", before);
  } else if (got == 0) {
    o->result = CF_FAIL;
    snprintf(o->msg, sizeof o->msg, "exited with status %d without a verdict%s%s",
             WIFEXITED(status) ? WEXITSTATUS(status) : -1, tail[0] ? "; last output: " : "", tail);
  } else {
    o->result = buf[0] >= CF_PASS && buf[0] <= CF_NOTSUP ? (cf_result)buf[0] : CF_FAIL;
    snprintf(o->msg, sizeof o->msg, "%s", buf + 1);
    char crash[CF_MSG];
    if (WIFSIGNALED(status)) {
      /* It answered, then died on the way out (a destructor, a thread of the plugin). */
      size_t l = strlen(o->msg);
      snprintf(o->msg + l, sizeof o->msg - l, "%scrashed after the test: signal %d (%s)",
               l ? "; " : "", WTERMSIG(status), strsignal(WTERMSIG(status)));
      o->result = CF_FAIL;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) &&
               crash_report(tail, crash, sizeof crash)) {
      size_t l = strlen(o->msg);
      snprintf(o->msg + l, sizeof o->msg - l, "%s%s after the test", l ? "; " : "", crash);
      o->result = CF_FAIL;
    }
  }
}

static int read_xfail(const char *path, cf_xfail **out, int *n) {
  FILE *f = fopen(path, "r");
  *out = NULL;
  *n = 0;
  if (!f) {
    fprintf(stderr, "tessera conform: --xfail %s: %s\n", path, strerror(errno));
    return TSR_EXIT_BAD_INPUT;
  }
  char line[512];
  int cap = 0, lineno = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    char *s = line;
    while (*s == ' ' || *s == '\t') s++;
    s[strcspn(s, "\r\n")] = '\0';
    if (!*s || *s == '#') continue;
    size_t g = strcspn(s, " \t");
    const char *reason = s + g;
    while (*reason == ' ' || *reason == '\t') reason++;
    if (!*reason) {
      fprintf(stderr,
              "%s:%d: expected 'GLOB reason', got only '%s'; say why it is expected to fail\n",
              path, lineno, s);
      fclose(f);
      free(*out);
      *out = NULL;
      return TSR_EXIT_BAD_INPUT;
    }
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      cf_xfail *grown = realloc(*out, (size_t)cap * sizeof **out);
      if (!grown) {
        fclose(f);
        free(*out);
        *out = NULL;
        return TSR_EXIT_RUNTIME;
      }
      *out = grown;
    }
    snprintf((*out)[*n].glob, sizeof(*out)[*n].glob, "%.*s", (int)g, s);
    snprintf((*out)[*n].reason, sizeof(*out)[*n].reason, "%s", reason);
    (*n)++;
  }
  fclose(f);
  return TSR_EXIT_OK;
}

/* Resolves PLUGIN: a path (it has a '/' or ends in .so) or a name on the search path. */
static bool resolve_plugin(const char *arg, cf_plugin *p) {
  char path[TSR_MAX_PATH];
  size_t l = strlen(arg);
  if (strchr(arg, '/') || (l > 3 && !strcmp(arg + l - 3, ".so"))) {
    snprintf(path, sizeof path, "%s", arg);
  } else {
    if (!cf_find_plugin(arg, path, sizeof path)) {
      fprintf(stderr,
              "tessera conform: no " TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX " on the plugin "
              "search path; give a path to the .so or add its directory to TESSERA_PLUGIN_PATH\n",
              arg);
      return false;
    }
  }
  char abs[PATH_MAX];
  if (!realpath(path, abs)) {
    fprintf(stderr, "tessera conform: %s: %s\n", path, strerror(errno));
    return false;
  }
  if (snprintf(p->path, sizeof p->path, "%s", abs) >= (int)sizeof p->path) {
    fprintf(stderr, "tessera conform: path too long: %s\n", abs);
    return false;
  }
  memcpy(p->dir, p->path, sizeof p->dir);
  char *slash = strrchr(p->dir, '/');
  if (slash) *slash = '\0';
  const char *base = strrchr(abs, '/') ? strrchr(abs, '/') + 1 : abs;
  size_t pre = strlen(TSR_PLUGIN_PREFIX), suf = strlen(TSR_PLUGIN_SUFFIX), bl = strlen(base);
  p->name[0] = '\0';
  if (bl > pre + suf && !strncmp(base, TSR_PLUGIN_PREFIX, pre) &&
      !strcmp(base + bl - suf, TSR_PLUGIN_SUFFIX))
    snprintf(p->name, sizeof p->name, "%.*s", (int)(bl - pre - suf), base + pre);
  return true;
}

/* The plugin's directory goes first on TESSERA_PLUGIN_PATH, so that the jobs the tests write load
 * this file and not another one of the same name; the other plugins come from the usual path. */
static void put_first_on_path(const cf_plugin *p) {
  const char *old = getenv("TESSERA_PLUGIN_PATH");
  size_t len = strlen(p->dir) + (old ? strlen(old) : 0) + 2;
  char *v = malloc(len);
  if (!v) return;
  snprintf(v, len, "%s%s%s", p->dir, old && *old ? ":" : "", old ? old : "");
  setenv("TESSERA_PLUGIN_PATH", v, 1);
  free(v);
}

static void xml_escape(FILE *f, const char *s) {
  for (; *s; s++) {
    switch (*s) {
      case '<':
        fputs("&lt;", f);
        break;
      case '>':
        fputs("&gt;", f);
        break;
      case '&':
        fputs("&amp;", f);
        break;
      case '"':
        fputs("&quot;", f);
        break;
      default:
        if ((unsigned char)*s < 0x20 && *s != '\t')
          fputc(' ', f);
        else
          fputc(*s, f);
    }
  }
}

/* L2: what discovery found, then one test per registration and mesh size, in the order
 * discovery found them. */
static void add_registration_tests(const cf_plugin *p) {
  static const char *const kinds[] = {"op", "redistribute", "style", "schedule"};
  static const cf_test_fn fns[] = {cf_op_rule_test, cf_redistribute_test, cf_style_test,
                                   cf_schedule_test};
  cf_add_test("L2.discovery", 2, cf_discovery_test, -1, 0, NULL);
  for (int i = 0; i < p->nitems; i++) {
    const cf_item *it = &p->items[i];
    for (int n = 1; n <= 4; n++) {
      char name[160];
      if (it->kind == CF_ITEM_SCHED)
        snprintf(name, sizeof name, "L2.schedule.%s.stages=%d", it->name, n);
      else if (it->kind == CF_ITEM_OP)
        snprintf(name, sizeof name, "L2.op.%s.%s=%d", it->name, it->dim, n);
      else
        snprintf(name, sizeof name, "L2.%s.%s.%s=%d", kinds[it->kind], it->name, it->dim, n);
      cf_add_test(name, 2, fns[it->kind], i, n, NULL);
    }
  }
}

static bool selected(const cf_test *t, char **filters, int nfilters) {
  if (!nfilters) return true;
  for (int i = 0; i < nfilters; i++)
    if (!fnmatch(filters[i], t->name, 0)) return true;
  return false;
}

static bool failing(cf_result r, bool strict) {
  return r == CF_FAIL || r == CF_XPASS || (strict && r == CF_NOTSUP);
}

int tsr_cmd_conform(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(conform_usage, stdout);
    return TSR_EXIT_OK;
  }
  const char *plugin_arg = NULL, *xfail_path = NULL;
  char *filters[64];
  int nfilters = 0;
  bool list = false, strict = false, verbose = false;
  double timeout_s = 60;
  cf_format fmt = CF_HUMAN;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool takes = !strcmp(a, "--filter") || !strcmp(a, "--output") || !strcmp(a, "--format") ||
                 !strcmp(a, "--xfail") || !strcmp(a, "--timeout");
    if (takes && i + 1 >= argc) {
      fprintf(stderr, "tessera conform: %s needs a value\n%s", a, conform_usage);
      return TSR_EXIT_BAD_INPUT;
    }
    if (!strcmp(a, "--filter")) {
      if (nfilters == 64) {
        fprintf(stderr, "tessera conform: more than 64 --filter options\n");
        return TSR_EXIT_BAD_INPUT;
      }
      filters[nfilters++] = argv[++i];
    } else if (!strcmp(a, "--format") || !strcmp(a, "--output")) {
      const char *v = argv[++i];
      if (!strcmp(v, "human"))
        fmt = CF_HUMAN;
      else if (!strcmp(v, "tap"))
        fmt = CF_TAP;
      else if (!strcmp(v, "junit") || !strcmp(v, "xml"))
        fmt = CF_XML;
      else {
        fprintf(stderr, "tessera conform: %s '%s': expected human, tap or junit\n", a, v);
        return TSR_EXIT_BAD_INPUT;
      }
    } else if (!strcmp(a, "--xfail")) {
      xfail_path = argv[++i];
    } else if (!strcmp(a, "--timeout")) {
      char *end;
      timeout_s = strtod(argv[++i], &end);
      if (*end || !(timeout_s > 0) || timeout_s > 86400) {
        fprintf(stderr, "tessera conform: --timeout '%s': expected seconds in (0, 86400]\n",
                argv[i]);
        return TSR_EXIT_BAD_INPUT;
      }
    } else if (!strcmp(a, "--list")) {
      list = true;
    } else if (!strcmp(a, "--strict")) {
      strict = true;
    } else if (!strcmp(a, "--verbose")) {
      verbose = true;
    } else if (a[0] == '-') {
      fprintf(stderr, "tessera conform: unknown option '%s'\n%s", a, conform_usage);
      return TSR_EXIT_BAD_INPUT;
    } else if (plugin_arg) {
      fprintf(stderr, "tessera conform: one plugin at a time ('%s' and '%s')\n", plugin_arg, a);
      return TSR_EXIT_BAD_INPUT;
    } else {
      plugin_arg = a;
    }
  }
  if (!plugin_arg) {
    fprintf(stderr, "tessera conform: missing PLUGIN\n%s", conform_usage);
    return TSR_EXIT_BAD_INPUT;
  }
  cf_xfail *xf = NULL;
  int nxf = 0;
  if (xfail_path) {
    int rc = read_xfail(xfail_path, &xf, &nxf);
    if (rc != TSR_EXIT_OK) return rc;
  }
  static cf_plugin p;
  memset(&p, 0, sizeof p);
  if (!resolve_plugin(plugin_arg, &p)) {
    free(xf);
    return TSR_EXIT_BAD_INPUT;
  }
  put_first_on_path(&p);
  cf_helpers_on_path();
  double t_start = now_s();
  cf_discover(&p, timeout_s);
  g_ntests = 0;
  cf_add_load_tests(&p);
  cf_add_contract_tests(&p);
  add_registration_tests(&p);
  cf_add_model_tests(&p);

  if (list) {
    for (int i = 0; i < g_ntests; i++)
      if (selected(&g_tests[i], filters, nfilters)) printf("%s\n", g_tests[i].name);
    free(xf);
    return TSR_EXIT_OK;
  }

  int nsel = 0;
  for (int i = 0; i < g_ntests; i++) nsel += selected(&g_tests[i], filters, nfilters);
  if (nfilters && !nsel) {
    /* a filter that matches nothing would otherwise pass a CI job that tested nothing */
    fprintf(stderr, "tessera conform: no test matches --filter %s%s; see --list\n", filters[0],
            nfilters > 1 ? " ..." : "");
    free(xf);
    return TSR_EXIT_BAD_INPUT;
  }
  FILE *out = stdout;
  char abi[32];
  snprintf(abi, sizeof abi, p.described ? "%u.%u" : "unknown", p.abi_major, p.abi_minor);
  const char *shown = p.name[0] ? p.name : "(no libtessera-<name>.so file name)";
  if (fmt == CF_HUMAN) {
    fprintf(out, "tessera conform %s (tessera %d.%d.%d, core ABI %d.%d)\n", CF_SUITE_VERSION,
            TSR_VERSION_MAJOR, TSR_VERSION_MINOR, TSR_VERSION_PATCH, TSR_ABI_MAJOR, TSR_ABI_MINOR);
    fprintf(out, "plugin: %s %s, ABI %s, path %s\n", shown, p.version[0] ? p.version : "-", abi,
            p.path);
    fprintf(out, "tests: %d of %d selected, timeout %g s each%s\n", nsel, g_ntests, timeout_s,
            strict ? ", strict" : "");
    if (g_dropped)
      fprintf(out, "warning: %d more tests not run: the suite holds at most %d\n", g_dropped,
              CF_MAX_TESTS);
    fputc('\n', out);
  } else if (fmt == CF_TAP) {
    fprintf(out, "TAP version 13\n");
    fprintf(out, "# tessera conform %s (tessera %d.%d.%d, core ABI %d.%d)\n", CF_SUITE_VERSION,
            TSR_VERSION_MAJOR, TSR_VERSION_MINOR, TSR_VERSION_PATCH, TSR_ABI_MAJOR, TSR_ABI_MINOR);
    fprintf(out, "# plugin: %s %s, ABI %s, path %s\n", shown, p.version[0] ? p.version : "-", abi,
            p.path);
    fprintf(out, "1..%d\n", nsel);
  }
  fflush(out);

  cf_outcome *res = calloc((size_t)(g_ntests ? g_ntests : 1), sizeof *res);
  if (!res) {
    free(xf);
    fprintf(stderr, "tessera conform: out of memory\n");
    return TSR_EXIT_RUNTIME;
  }
  /* the directory the tests of this run share (L3's record of what it reached), removed at the
   * end */
  const char *tmpenv = getenv("TMPDIR");
  snprintf(cf_suite_dir, sizeof cf_suite_dir, "%s/tessera-conform-run-XXXXXX",
           tmpenv && tmpenv[0] == '/' ? tmpenv : "/tmp");
  if (!mkdtemp(cf_suite_dir)) cf_suite_dir[0] = '\0';
  int counts[5] = {0}, k = 0;
  for (int i = 0; i < g_ntests; i++) {
    const cf_test *t = &g_tests[i];
    if (!selected(t, filters, nfilters)) continue;
    cf_outcome *o = &res[i];
    run_isolated(&p, t, timeout_s, verbose, o);
    for (int x = 0; x < nxf; x++) {
      if (fnmatch(xf[x].glob, t->name, 0)) continue;
      snprintf(o->xreason, sizeof o->xreason, "%s", xf[x].reason);
      if (o->result == CF_FAIL)
        o->result = CF_XFAIL;
      else if (o->result == CF_PASS)
        o->result = CF_XPASS;
      break;
    }
    counts[o->result]++;
    k++;
    if (fmt == CF_HUMAN) {
      bool bad = failing(o->result, strict);
      fprintf(out, "  %-7s %-56s %6.2fs", result_name(o->result), t->name, o->secs);
      if (o->result == CF_XFAIL || o->result == CF_XPASS)
        fprintf(out, "  [expected to fail: %s]", o->xreason);
      if (o->msg[0] && (bad || o->result != CF_PASS || verbose))
        fprintf(out, "\n          %s", o->msg);
      fputc('\n', out);
    } else if (fmt == CF_TAP) {
      bool ok = !failing(o->result, strict) && o->result != CF_XFAIL;
      fprintf(out, "%s %d - %s", ok ? "ok" : "not ok", k, t->name);
      if (o->result == CF_NOTSUP && !strict)
        fprintf(out, " # SKIP NOTSUP: %s", o->msg);
      else if (o->result == CF_XFAIL)
        fprintf(out, " # TODO XFAIL: %s", o->xreason);
      else if (o->result == CF_XPASS)
        fprintf(out, " # XPASS: %s", o->xreason);
      fputc('\n', out);
      if (o->msg[0] && o->result != CF_PASS) {
        /* a YAML block as TAP 13 has it; the message's quotes become apostrophes */
        fprintf(out, "  ---\n  message: \"");
        for (const char *c = o->msg; *c; c++) fputc(*c == '"' || *c == '\\' ? '\'' : *c, out);
        fprintf(out, "\"\n  ...\n");
      }
    }
    fflush(out);
  }
  double total = now_s() - t_start;
  int nfail = counts[CF_FAIL] + counts[CF_XPASS] + (strict ? counts[CF_NOTSUP] : 0);
  if (fmt == CF_XML) {
    fprintf(out, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    fprintf(out,
            "<testsuites name=\"tessera conform\" tests=\"%d\" failures=\"%d\" time=\"%.3f\">\n", k,
            nfail, total);
    fprintf(out, "  <testsuite name=\"conform.");
    xml_escape(out, shown);
    fprintf(out, "\" tests=\"%d\" failures=\"%d\" errors=\"0\" skipped=\"%d\" time=\"%.3f\">\n", k,
            nfail, counts[CF_NOTSUP] * !strict + counts[CF_XFAIL], total);
    fprintf(out, "    <properties>\n");
    const char *props[][2] = {{"plugin.name", shown},
                              {"plugin.version", p.version},
                              {"plugin.abi", abi},
                              {"plugin.path", p.path},
                              {"suite.version", CF_SUITE_VERSION}};
    for (size_t i = 0; i < sizeof props / sizeof props[0]; i++) {
      fprintf(out, "      <property name=\"%s\" value=\"", props[i][0]);
      xml_escape(out, props[i][1]);
      fprintf(out, "\"/>\n");
    }
    fprintf(out, "    </properties>\n");
    for (int i = 0; i < g_ntests; i++) {
      const cf_test *t = &g_tests[i];
      if (!selected(t, filters, nfilters)) continue;
      const cf_outcome *o = &res[i];
      fprintf(out, "    <testcase classname=\"conform.");
      xml_escape(out, shown);
      fprintf(out, ".L%d\" name=\"", t->level);
      xml_escape(out, t->name);
      fprintf(out, "\" time=\"%.3f\"", o->secs);
      if (o->result == CF_PASS) {
        fprintf(out, "/>\n");
        continue;
      }
      fprintf(out, ">\n      ");
      if (failing(o->result, strict)) {
        fprintf(out, "<failure message=\"%s: ", result_name(o->result));
        xml_escape(out, o->result == CF_XPASS ? o->xreason : o->msg);
        fprintf(out, "\"/>\n");
      } else {
        fprintf(out, "<skipped message=\"%s: ", result_name(o->result));
        xml_escape(out, o->result == CF_XFAIL ? o->xreason : o->msg);
        fprintf(out, "\"/>\n");
      }
      if (o->msg[0]) {
        fprintf(out, "      <system-out>");
        xml_escape(out, o->msg);
        fprintf(out, "</system-out>\n");
      }
      fprintf(out, "    </testcase>\n");
    }
    fprintf(out, "  </testsuite>\n</testsuites>\n");
  } else {
    fprintf(out,
            "%stotals: %d tests, %d passed, %d failed, %d notsup, %d xfail, %d xpass (%.1f s)\n",
            fmt == CF_TAP ? "# " : "\n", k, counts[CF_PASS], counts[CF_FAIL], counts[CF_NOTSUP],
            counts[CF_XFAIL], counts[CF_XPASS], total);
    if (fmt == CF_HUMAN) fprintf(out, "result: %s\n", nfail ? "FAILED" : "PASSED");
  }
  fflush(out);
  if (cf_suite_dir[0]) remove_dir(cf_suite_dir);
  free(res);
  free(xf);
  return nfail ? TSR_EXIT_RUNTIME : TSR_EXIT_OK;
}
