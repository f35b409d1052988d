/* `tessera conform`: the plugin conformance suite (docs/conformance.md).
 *
 * conform.c is the driver: options, the test list, running each test in a forked child with a
 * timeout, expected failures and the three output formats. conform_job.c writes the tests' jobs
 * and runs discovery. The levels: conform_l01.c (L0 load/ABI, L1 contract), conform_l2.c (rules,
 * styles and transitions against dense references), conform_l2_sched.c (pipeline schedules),
 * conform_l3.c (the Llama model against the 1-rank run).
 */
#ifndef TESSERA_APP_CONFORM_H
#define TESSERA_APP_CONFORM_H

#include <stdbool.h>
#include <stddef.h>

#include "app.h"
#include "tessera/plugin.h"

#define CF_SUITE_VERSION "1.0.0"
#define CF_MAX_TESTS     1024
#define CF_MAX_LIST      16  /* dims, required plugins */
#define CF_MAX_KEYS      32  /* declared [strategy.NAME] keys */
#define CF_MAX_ITEMS     128 /* rules, styles, schedules found by discovery */
#define CF_MSG           1024

/* What a test concluded, as the child reports it (PASS, FAIL, NOTSUP) and as the driver grades it
 * against the expected-failure list (XFAIL, XPASS). */
typedef enum cf_result { CF_PASS = 0, CF_FAIL, CF_NOTSUP, CF_XFAIL, CF_XPASS } cf_result;

/* One declared key of the plugin, copied out of its descriptor. */
typedef struct cf_key {
  char name[TSR_MAX_NAME];
  int type; /* tsr_key_type */
  bool has_default;
  char def[TSR_MAX_VALUE];
  double min, max;
  char choices[TSR_MAX_VALUE];
} cf_key;

/* What one registration of the plugin is, as discovery found it. */
typedef enum cf_item_kind {
  CF_ITEM_OP = 0,
  CF_ITEM_REDIST,
  CF_ITEM_STYLE,
  CF_ITEM_SCHED
} cf_item_kind;

typedef struct cf_item {
  cf_item_kind kind;
  char name[TSR_MAX_NAME];    /* rule name, style name or schedule name */
  char op[TSR_MAX_NAME];      /* CF_ITEM_OP: the op */
  char dim[TSR_MAX_DIM_NAME]; /* mesh dim ("" for a rule on any dim, and for schedules) */
  int sizes;                  /* bit n set: registered on a job with that dim of size n (1..4) */
} cf_item;

/* The plugin under test, as the driver and every test see it. Filled before any test runs, by a
 * discovery child (so a plugin that crashes while loading cannot take the suite with it). */
typedef struct cf_plugin {
  char path[TSR_MAX_PATH]; /* absolute */
  char dir[TSR_MAX_PATH];
  char name[TSR_MAX_NAME]; /* from the file name libtessera-<name>.so; "" if it has no such name */
  bool described;          /* discovery read the descriptor */
  char version[TSR_MAX_NAME];
  unsigned abi_major, abi_minor;
  int ndims, nrequired, nkeys;
  char dims[CF_MAX_LIST][TSR_MAX_DIM_NAME];
  char required[CF_MAX_LIST][TSR_MAX_NAME];
  cf_key keys[CF_MAX_KEYS];
  bool loaded;               /* discovery loaded it into a job (init and register ran) */
  char load_msg[CF_MSG];     /* why not, when it did not */
  int nitems, items_dropped; /* registrations beyond CF_MAX_ITEMS are counted, not tested */
  cf_item items[CF_MAX_ITEMS];
  int n_optim_hooks, n_grad_hooks;
  /* The dims the L2 and L3 tests put it on: its own, or, for a plugin that owns none (sp), the
   * dims of the plugins it requires. */
  int ntest_dims;
  char test_dims[CF_MAX_LIST][TSR_MAX_DIM_NAME];
  /* The other in-tree plugins found on the search path, for the L3 combinations. */
  int nothers;
  struct {
    char name[TSR_MAX_NAME];
    char dim[TSR_MAX_DIM_NAME];   /* its first dim, "" for none */
    char dims[TSR_MAX_VALUE];     /* all its dims, ", "-joined */
    char required[TSR_MAX_VALUE]; /* ", "-joined */
  } others[8];
} cf_plugin;

typedef struct cf_test cf_test;
/* A test body; runs in the child. Writes a one-line reason into msg for FAIL and NOTSUP (and
 * may for PASS). */
typedef cf_result (*cf_test_fn)(const cf_plugin *p, const cf_test *t, char *msg, size_t len);

struct cf_test {
  char name[160];
  int level;
  cf_test_fn fn;
  int item; /* index into cf_plugin.items, or -1 */
  int n;    /* mesh size or other parameter */
  char arg[128];
};

/* The running test's own directory (set in the child): files a test writes go there, and the
 * driver removes it when the test ends, however it ended. */
extern char cf_tmpdir[TSR_MAX_PATH];

/* Adds a test; false when the list is full. */
bool cf_add_test(const char *name, int level, cf_test_fn fn, int item, int n, const char *arg);

/* ---- Jobs and discovery (conform_job.c) ---- */

/* The text of a job file: mesh `dims` x `shape` (ndim entries; 0 gives a 1-rank "dp" mesh), the
 * plugins in `load` (comma-separated, may be ""), the model and data of `model` (0: the L2
 * registration model, 1: its grouped-query variant, 2: the L3 model) and `extra` lines appended
 * verbatim (strategy sections). mode is "train" or "forward". */
void cf_job_text(char *buf, size_t len, int ndim, const char *const *dims, const int *shape,
                 const char *load, int model, const char *mode, const char *extra);
/* The plugin, preceded by the plugins it requires, as a [plugins] load value. */
void cf_load_list(const cf_plugin *p, char *buf, size_t len);
/* Parses `text` and loads its plugins into a new registry. On failure *cfg etc. are freed and
 * NULL, the status and the last error are the loader's. */
tsr_status cf_job_load(const char *text, tsr_config **cfg, tsr_registry_t **reg,
                       tsr_plugin_set_t **set);
void cf_job_free(tsr_config *cfg, tsr_registry_t *reg, tsr_plugin_set_t *set);

/* The in-tree plugins, which L1 and L3 combine with the one under test when they are found. */
#define CF_NKNOWN 6
extern const char *const cf_known_plugins[CF_NKNOWN];
/* True for a C identifier shorter than max characters. */
bool cf_ident(const char *s, size_t max);
/* dlopen + entry point of the plugin's file; NULL with the reason in msg. *handle stays open. */
const tsr_strategy *cf_open_desc(const cf_plugin *p, void **handle, char *msg, size_t len);
/* The path of libtessera-<name>.so on the search path; false when there is none. */
bool cf_find_plugin(const char *name, char *out, size_t len);
/* Runs discovery in a forked child and fills p (name, descriptor, registrations). */
void cf_discover(cf_plugin *p, double timeout_s);
/* Adds the L0 and L1 tests. */
void cf_add_l01(const cf_plugin *p);
/* Adds the L2 tests (one per registration and mesh size). */
void cf_add_l2(const cf_plugin *p);
/* Adds the L3 tests (the model alone and with the other in-tree plugins). */
void cf_add_l3(const cf_plugin *p);

/* The n-th (0-based) job variant the L2 tests try for a registration: model 0 or 1, and the
 * plugin's keys at their defaults or one ENUM/BOOL key at another value. Returns false past the
 * last. Writes the [strategy.NAME] lines into extra. */
bool cf_variant(const cf_plugin *p, int v, int *model, char *extra, size_t len);

/* Formats like snprintf into msg and returns r, for one-line test bodies. */
cf_result cf_say(char *msg, size_t len, cf_result r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The L2 check of one schedule on `stages` stages over 1-6 microbatches (conform_l2_sched.c). */
cf_result cf_schedule_check(const tsr_schedule *sched, int stages, char *msg, size_t len);

int tsr_cmd_conform(int argc, char **argv);

#endif
