/* `tessera conform`: the plugin conformance suite (docs/conformance.md).
 *
 * The files follow what the tests check; the levels L0-L3 the command line and the docs name
 * map onto them:
 *   conform.c            the driver: options, the test list, each test in a forked child with a
 *                        timeout, expected failures and the three output formats
 *   conform_job.c        the jobs the tests write, their variants, finding a registration again
 *   conform_discover.c   discovery of the descriptor and registrations (and L2.discovery)
 *   conform_load.c       L0: loading and the ABI, the descriptor field by field
 *   conform_contract.c   L1: the callbacks' contract (keys, lifecycle, refusals, scope)
 *   conform_rules.c      L2: op rules, module styles and redistribute transitions against dense
 *                        references
 *   conform_ref64.c      the float64 references of the ops that L2 holds f32 results against
 *   conform_moe.c        the mixture-of-experts ops' inputs and float64 references for L2
 *   conform_leaks.c      heap and rank-allocator growth: L1.leaks, and the leak checks of L2
 *   conform_schedules.c  L2: pipeline schedules, simulated stage against stage
 *   conform_model.c      L3: the Llama model against the 1-rank run
 */
#ifndef TESSERA_APP_CONFORM_H
#define TESSERA_APP_CONFORM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "app.h"
#include "tessera/plugin.h"

#define CF_SUITE_VERSION "1.2.0"
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
  bool stage_dim; /* it declared one of its dims the stage dim */
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
/* The directory every test of one run shares ("" when it could not be made): L3 records there
 * which of the plugin's registrations its runs reached, for L3.reach. */
extern char cf_suite_dir[TSR_MAX_PATH];

/* Adds a test; false when the list is full. */
bool cf_add_test(const char *name, int level, cf_test_fn fn, int item, int n, const char *arg);

/* Formats like snprintf into msg and returns r, for one-line test bodies. */
cf_result cf_say(char *msg, size_t len, cf_result r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* ---- Jobs (conform_job.c) ---- */

/* The text of a job file: mesh `dims` x `shape` (ndim entries; 0 gives a 1-rank "dp" mesh), the
 * plugins in `load` (comma-separated, may be ""), the model and data of `model` (0: the L2
 * registration model, 1: its grouped-query variant, 2: the L3 model, 3: it with tied embeddings,
 * 4: it with a single kv head, 5: it with sparse MoE layers of 4 experts, top 2, CF_MODEL_MOE;
 * 6: those without the load-balancing loss, CF_MODEL_MOE_NOAUX; 7: CF_MODEL_DOCS) and `extra`
 * lines appended
 * verbatim (strategy sections). mode is "train" or "forward". */
#define CF_MODEL_MOE       5
#define CF_MODEL_MOE_NOAUX 6
#define CF_MODEL_DOCS      7 /* the L3 model, one kv head, on packed documents (mask = document) */
void cf_job_text(char *buf, size_t len, int ndim, const char *const *dims, const int *shape,
                 const char *load, int model, const char *mode, const char *extra);
/* The plugin, preceded by the plugins it requires, as a [plugins] load value. */
void cf_load_list(const cf_plugin *p, char *buf, size_t len);
/* Parses `text` and loads its plugins into a new registry. On failure *cfg etc. are freed and
 * NULL, the status and the last error are the loader's. */
tsr_status cf_job_load(const char *text, tsr_config **cfg, tsr_registry_t **reg,
                       tsr_plugin_set_t **set);
void cf_job_free(tsr_config *cfg, tsr_registry_t *reg, tsr_plugin_set_t *set);
/* As cf_job_load, into a registry of cf_watched_registry_new (`watched`), or a plain one. */
tsr_status cf_job_load_into(const char *text, bool watched, tsr_config **cfg, tsr_registry_t **reg,
                            tsr_plugin_set_t **set);
tsr_status cf_job_load_watched(const char *text, tsr_config **cfg, tsr_registry_t **reg,
                               tsr_plugin_set_t **set);

/* ---- Rank allocators, watched (conform_job.c) ----
 * A registry from cf_watched_registry_new holds, before any plugin's registrations, the suite's
 * rank state CF_WATCH_STATE and a before-step optimizer hook that makes it. Made on a rank (by
 * the hook, or by cf_rank_watch), its teardown runs last in tsr_rank_free, when the model, the
 * optimizer and every plugin's rank state are gone, and adds the bytes the rank's allocator still
 * holds to cf_rank_leftover: tensors a rule, transition, hook or rank state never freed. */
#define CF_WATCH_STATE "conform.watch"
extern _Atomic int64_t cf_rank_leftover;
tsr_status cf_watched_registry_new(tsr_registry_t **reg);
void cf_rank_watch(tsr_rank_t *r);

/* ---- Heap growth (conform_leaks.c) ---- */

/* Bytes of the heap in use (mallinfo2, every arena); -1 where it cannot be told. */
int64_t cf_heap_in_use(void);
/* Runs fn(arg) `warm` times, then CF_LEAK_WINDOWS times `reps` times, measuring the heap's
 * growth over each window of reps (the least of them) and what the watched rank allocators held
 * after all of them. Stops at fn's first failure. */
#define CF_LEAK_WINDOWS 3
typedef tsr_status (*cf_rep_fn)(void *arg);
tsr_status cf_measure(cf_rep_fn fn, void *arg, int warm, int reps, int64_t *heap_growth,
                      int64_t *rank_leftover);
/* Below this many heap bytes per repetition growth is noise (docs/conformance.md). */
#define CF_LEAK_BYTES_PER_REP 1024
/* The leak check of an L2 test: on a mesh of n = 2, the first time in the test's process, runs
 * fn(arg) on n local ranks (cf_measure) and returns false, with the reason in msg, when the heap
 * grows or the ranks' allocators keep bytes. `what` names the registration. True otherwise. */
bool cf_no_leak(tsr_rank_fn fn, void *arg, int n, double timeout_s, const char *what, char *msg,
                size_t len);
/* L1.leaks (conform_leaks.c). */
cf_result cf_leaks_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);

/* The in-tree plugins, which L1 and L3 combine with the one under test when they are found, and
 * zdp, the suite's own data split on a fresh dim (plugins/conform). */
#define CF_NKNOWN 7
extern const char *const cf_known_plugins[CF_NKNOWN];
/* The folder, under a plugin folder, of the plugins the suite brings (zdp). */
#define CF_HELPER_DIR "conform"
/* The path of libtessera-<name>.so on the search path, or else in the CF_HELPER_DIR of a folder
 * of it; false when there is none. */
bool cf_find_plugin(const char *name, char *out, size_t len);
/* Appends every CF_HELPER_DIR of the search path to TESSERA_PLUGIN_PATH, so that jobs find the
 * suite's plugins after every other. */
void cf_helpers_on_path(void);

/* The n-th (0-based) job variant the L2 tests try for a registration: model 0 or 1, and the
 * plugin's keys at their defaults or one ENUM/BOOL key at another value. Returns false past the
 * last. Writes the [strategy.NAME] lines into extra. */
bool cf_variant(const cf_plugin *p, int v, int *model, char *extra, size_t len);
/* Variant v in words, for messages: "kv heads split" or "1 kv head", then its key lines. */
const char *cf_variant_str(const cf_plugin *p, int v, char *buf, size_t len);

/* An L2 test body for one job variant: `found` is the registration (tsr_op_rule,
 * tsr_redistribute_rule, tsr_module_style or tsr_schedule) in that job's registry `reg`. */
typedef cf_result (*cf_variant_body)(const cf_plugin *p, const cf_test *t, const void *found,
                                     const tsr_registry_t *reg, char *msg, size_t len);
/* Runs body on every job variant that registers test t's item with its dim of size n; the worst
 * verdict wins (FAILED over PASS over NOTSUP), and a failure names its variant. */
cf_result cf_over_variants(const cf_plugin *p, const cf_test *t, int n, cf_variant_body body,
                           char *msg, size_t len);

/* ---- Float64 references (conform_ref64.c) ---- */

/* What an op takes beyond its inputs, as the L2 tests run it. */
typedef struct cf_op_attrs {
  bool causal;     /* sdpa's mask */
  int top_k;       /* moe_router: experts per token */
  float aux_scale; /* moe_aux_loss: out = aux_scale * sum_e stats[0, e] * stats[1, e] */
} cf_op_attrs;

/* An op's output and the gradients of its inputs, in double, for one output gradient (and one
 * for the second output of an op that has two: moe_router's stats). */
typedef struct cf_ref64 {
  double *out;
  int64_t nout;
  double *out2; /* the second output, NULL for an op with one */
  int64_t nout2;
  double *grads[TSR_MAX_OP_INPUTS]; /* NULL for an input without gradient (ids, labels) */
  int64_t ngrad[TSR_MAX_OP_INPUTS];
  bool has_grad[TSR_MAX_OP_INPUTS];
  /* NULL where the whole gradient is defined; else 0 at the elements the op leaves undefined,
   * which are not compared (moe_experts' combine gradient where the combine weight is 0) */
  unsigned char *defined[TSR_MAX_OP_INPUTS];
} cf_ref64;

/* Runs op (a name of the vocabulary) forward on the full inputs `in` and backward for the output
 * gradient `gout` (and `gout2` for a second output; NULL: none reaches it), in double. */
tsr_status cf_ref64_run(const char *op, tsr_tensor *const *in, int nin, const cf_op_attrs *attrs,
                        const tsr_tensor *gout, const tsr_tensor *gout2, cf_ref64 *r);
void cf_ref64_free(cf_ref64 *r);

/* How far an f32 tensor is from its float64 reference. */
typedef struct cf_error {
  double rel_l2;  /* ||got - ref|| / ||ref|| */
  double rel_max; /* max |got - ref| / max |ref| */
  int64_t worst;  /* the element of the largest |got - ref| */
  double got, want;
  int64_t skipped; /* elements not compared: undefined in the reference */
} cf_error;
/* Over the elements where `defined` (NULL: all) is nonzero. */
void cf_ref64_error(const tsr_tensor *got, const double *ref, const unsigned char *defined,
                    int64_t n, cf_error *e);

/* Deterministic values in [-1, 1) from `seed`, the same on every rank (conform_rules.c). */
tsr_status cf_rand_tensor(int ndim, const int64_t *shape, uint32_t seed, tsr_tensor **out);

/* ---- Mixture of experts (conform_moe.c) ---- */

/* The sizes of an L2 case of a moe op: tokens (B, L), hidden C, experts E, intermediate I,
 * experts per token, and how many of the last experts no token selects. */
typedef struct cf_moe_shape {
  int64_t B, L, C, E, I;
  int top_k;
  int64_t starved;
} cf_moe_shape;
/* True for moe_router, moe_experts and moe_aux_loss. */
bool cf_moe_op(const char *op);
/* The aux loss's scale for E experts. */
float cf_moe_aux_scale(int64_t E);
/* The op's inputs as full f32 tensors (*nin set): the router's logits; the experts' x, combine
 * (routed on the host from such logits), w13 and w2; the aux loss's stats of such a routing. */
tsr_status cf_moe_inputs(const char *op, const cf_moe_shape *s, tsr_tensor **in, int *nin);
/* The float64 reference of a moe op, into r (whose out and grads cf_ref64_run made, zeroed): x
 * the inputs as doubles, g and g2 the output gradients (g2 may be NULL). */
tsr_status cf_moe_ref64(const char *op, tsr_tensor *const *in, const double *const *x,
                        const cf_op_attrs *attrs, const double *g, const double *g2, cf_ref64 *r);

/* ---- Discovery (conform_discover.c) ---- */

/* True for a C identifier shorter than max characters. */
bool cf_ident(const char *s, size_t max);
/* dlopen + entry point of the plugin's file; NULL with the reason in msg. *handle stays open. */
const tsr_strategy *cf_open_desc(const cf_plugin *p, void **handle, char *msg, size_t len);
/* Runs discovery in a forked child and fills p (name, descriptor, registrations). */
void cf_discover(cf_plugin *p, double timeout_s);
/* L2.discovery: the plugin loads and registers something on its dims. */
cf_result cf_discovery_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);

/* ---- The tests, by what they check ---- */

/* Adds the L0 tests: loading and the ABI (conform_load.c). */
void cf_add_load_tests(const cf_plugin *p);
/* Adds the L1 tests: the callbacks' contract (conform_contract.c). */
void cf_add_contract_tests(const cf_plugin *p);
/* The L2 test of one op rule, redistribute transition or module style (t->item) on a mesh of
 * t->n ranks, against dense references (conform_rules.c). */
cf_result cf_op_rule_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);
cf_result cf_redistribute_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);
cf_result cf_style_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);
/* The L2 test of one schedule (t->item) on t->n stages over 1-6 microbatches
 * (conform_schedules.c). */
cf_result cf_schedule_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);
/* Adds the L3 tests: the model alone and with the other in-tree plugins (conform_model.c). */
void cf_add_model_tests(const cf_plugin *p);
/* Trains the job of `text` for `steps` steps as L3 does, in a watched registry, writing no files
 * (conform_model.c). */
tsr_status cf_train_text(const char *text, int steps);
/* L1.jobs_isolated (conform_model.c): job 1 made, job 2 made and freed, then job 1 trained as L3
 * trains the model, against the 1-rank run. */
cf_result cf_jobs_isolated_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len);

int tsr_cmd_conform(int argc, char **argv);

#endif
