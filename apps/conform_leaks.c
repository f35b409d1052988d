/* `tessera conform`: leaks. L1.leaks repeats the plugin's callbacks and whole jobs and measures
 * the heap in use (mallinfo2, every arena) and what the rank allocators still hold after each
 * job, naming the callback whose repetition grows it; the L2 tests use cf_measure to repeat one
 * registration's forward and backward the same way (cf_no_leak).
 *
 * Each measure runs its work twice first (caches, arenas and lazily made state settle), then
 * CF_LEAK_WINDOWS times CF_LEAK_REPS times, and fails when the heap grew by CF_LEAK_BYTES_PER_REP
 * or more per repetition in every window. The in-tree plugins' repetitions grow it by nothing
 * over most windows; under load a window can see a few hundred bytes of the allocator settling
 * (an arena made for a contended thread), never all three.
 */
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conform.h"

#define CF_LEAK_WARM 2
#define CF_LEAK_REPS 6

int64_t cf_heap_in_use(void) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = mallinfo2();
  return (int64_t)mi.uordblks + (int64_t)mi.hblkhd;
#else
  return -1;
#endif
}

tsr_status cf_measure(cf_rep_fn fn, void *arg, int warm, int reps, int64_t *heap_growth,
                      int64_t *rank_leftover) {
  *heap_growth = *rank_leftover = 0;
  for (int i = 0; i < warm; i++) TSR_CHECK(fn(arg));
  cf_rank_leftover = 0;
  /* three windows of reps: a leak grows the heap in each, the allocator settling (a thread's
   * cache, an arena's first use under contention) in some only */
  int64_t h[CF_LEAK_WINDOWS + 1], least = INT64_MAX;
  for (int w = 0; w <= CF_LEAK_WINDOWS; w++) {
    h[w] = cf_heap_in_use();
    for (int i = 0; w < CF_LEAK_WINDOWS && i < reps; i++) TSR_CHECK(fn(arg));
    if (w && h[w] - h[w - 1] < least) least = h[w] - h[w - 1];
  }
  *heap_growth = h[0] < 0 ? 0 : least;
  *rank_leftover = cf_rank_leftover;
  return TSR_OK;
}

/* ---- The callbacks, called directly ---- */

typedef enum leak_phase { LEAK_VALIDATE = 0, LEAK_INIT_FINI, LEAK_REGISTER } leak_phase;

typedef struct leak_direct {
  const tsr_strategy *d;
  tsr_plugin_args args;
  leak_phase phase;
} leak_direct;

static tsr_status direct_once(void *arg) {
  leak_direct *x = arg;
  const tsr_strategy *d = x->d;
  if (x->phase == LEAK_VALIDATE) return d->validate(&x->args);
  void *state = NULL;
  TSR_CHECK(d->init(&x->args, &state));
  tsr_status st = TSR_OK;
  if (x->phase == LEAK_REGISTER) {
    tsr_registry_t *reg = NULL;
    st = tsr_registry_new(&reg);
    if (st == TSR_OK) st = d->register_rules(reg, &x->args, state);
    if (st == TSR_OK && TSR_STRATEGY_HAS(d, check_registry) && d->check_registry)
      st = d->check_registry(reg, &x->args, state);
    tsr_registry_free(reg);
  }
  d->fini(state);
  return st;
}

/* ---- Whole jobs ---- */

typedef struct leak_job {
  const char *text;
} leak_job;

static tsr_status load_once(void *arg) {
  const leak_job *x = arg;
  tsr_config *cfg;
  tsr_registry_t *reg;
  tsr_plugin_set_t *set;
  TSR_CHECK(cf_job_load(x->text, &cfg, &reg, &set));
  cf_job_free(cfg, reg, set);
  return TSR_OK;
}

static tsr_status train_once(void *arg) {
  const leak_job *x = arg;
  return cf_train_text(x->text, 2);
}

/* One measure and its verdict: `what` is the callback or job repeated. */
static cf_result judge(tsr_status st, const char *what, int64_t heap, int64_t ranks, char *msg,
                       size_t len) {
  if (st != TSR_OK) return cf_say(msg, len, CF_FAIL, "%s, repeated: %s", what, tsr_last_error());
  if (heap >= (int64_t)CF_LEAK_BYTES_PER_REP * CF_LEAK_REPS)
    return cf_say(msg, len, CF_FAIL,
                  "%s leaks: the heap in use grew by %lld bytes per repetition, in each of %d "
                  "windows of %d (after %d to settle)",
                  what, (long long)(heap / CF_LEAK_REPS), CF_LEAK_WINDOWS, CF_LEAK_REPS,
                  CF_LEAK_WARM);
  if (ranks > 0)
    return cf_say(msg, len, CF_FAIL,
                  "%s leaks rank memory: the rank allocators still held %lld bytes when the ranks "
                  "were freed, over %d repetitions (tensors a rule, transition, hook or rank state "
                  "made and never freed)",
                  what, (long long)ranks, CF_LEAK_WINDOWS * CF_LEAK_REPS);
  return CF_PASS;
}

cf_result cf_leaks_test(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  if (!p->loaded) return cf_say(msg, len, CF_FAIL, "does not load: %s", p->load_msg);
  if (cf_heap_in_use() < 0)
    return cf_say(msg, len, CF_NOTSUP, "the C library has no mallinfo2 to measure the heap with");
  char load[512], text[8192];
  cf_load_list(p, load, sizeof load);
  const char *dims[1] = {p->ntest_dims ? p->test_dims[0] : "dp"};
  int shape[1] = {p->ntest_dims ? 2 : 1};
  cf_job_text(text, sizeof text, 1, dims, shape, load, 2, "train", "");
  int64_t heap = 0, ranks = 0;
  tsr_status st;
  cf_result r;
  char done[256] = "";
  /* the callbacks directly, on a job with the plugin's dim at 2 (as the loader calls them) */
  void *h;
  const tsr_strategy *d = cf_open_desc(p, &h, msg, len);
  if (!d) return CF_FAIL;
  tsr_config *cfg;
  if (tsr_config_parse_string(text, "conform-leaks.ini", &cfg) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "suite error: %s", tsr_last_error());
  leak_direct x = {d, {cfg, p->name, p->path, TSR_ABI_MAJOR, TSR_ABI_MINOR}, LEAK_VALIDATE};
  static const char *const phase_names[] = {
      "validate",
      "init then fini",
      "init, register_rules (into a registry then freed), check_registry, fini",
  };
  for (int ph = d->validate ? LEAK_VALIDATE : LEAK_INIT_FINI; ph <= LEAK_REGISTER; ph++) {
    /* register_rules alone needs the plugins it requires registered first: the loader's job
     * below covers it then */
    if (ph == LEAK_REGISTER && p->nrequired) break;
    x.phase = (leak_phase)ph;
    tsr_clear_error();
    st = cf_measure(direct_once, &x, CF_LEAK_WARM, CF_LEAK_REPS, &heap, &ranks);
    if (st != TSR_OK && ph != LEAK_VALIDATE) {
      /* a job the plugin refuses directly (it needs another's registrations) is the loader's */
      break;
    }
    r = judge(TSR_OK, phase_names[ph], heap, 0, msg, len);
    if (r != CF_PASS) {
      tsr_config_free(cfg);
      return r;
    }
    snprintf(done + strlen(done), sizeof done - strlen(done), "%s%s", done[0] ? "; " : "",
             ph == LEAK_VALIDATE    ? "validate"
             : ph == LEAK_INIT_FINI ? "init/fini"
                                    : "register");
  }
  tsr_config_free(cfg);
  /* whole jobs through the loader, then trained as L3 trains them (2 steps each) */
  leak_job j = {text};

  st = cf_measure(load_once, &j, CF_LEAK_WARM, CF_LEAK_REPS, &heap, &ranks);
  r = judge(st,
            "loading and freeing a job (validate, init, register_rules, check_registry, fini "
            "through the loader)",
            heap, 0, msg, len);
  if (r != CF_PASS) return r;
  st = cf_measure(train_once, &j, CF_LEAK_WARM, CF_LEAK_REPS, &heap, &ranks);
  char what[128];
  snprintf(what, sizeof what,
           "a training job on %s = %d (the rules, transitions, hooks and rank "
           "states the model runs)",
           dims[0], shape[0]);
  r = judge(st, what, heap, ranks, msg, len);
  if (r != CF_PASS) return r;
  return cf_say(msg, len, CF_PASS,
                "%d windows of %d repetitions each, after %d to settle: %s; job load; training job "
                "on %s = %d (heap and rank allocators)",
                CF_LEAK_WINDOWS, CF_LEAK_REPS, CF_LEAK_WARM, done, dims[0], shape[0]);
}

/* ---- The leak checks of L2 ----
 * On a mesh of 2, once per test (each test is its own process), the first case that computes is
 * repeated (cf_measure): the heap must not grow and the rank allocators must be empty when the
 * ranks are freed. */

static bool leak_checked;

typedef struct leak_case {
  tsr_rank_fn fn;
  void *arg;
  int n;
  double timeout_s;
} leak_case;

static tsr_status leak_once(void *arg) {
  const leak_case *l = arg;
  return tsr_local_launch(l->n, l->timeout_s, l->fn, l->arg);
}

bool cf_no_leak(tsr_rank_fn fn, void *arg, int n, double timeout_s, const char *what, char *msg,
                size_t len) {
  if (n != 2 || leak_checked || cf_heap_in_use() < 0) return true;
  leak_checked = true;
  leak_case l = {fn, arg, n, timeout_s};
  int64_t heap, ranks;
  const int reps = 6;
  if (cf_measure(leak_once, &l, 2, reps, &heap, &ranks) != TSR_OK) {
    snprintf(msg, len, "%s, repeated to look for leaks: %s", what, tsr_last_error());
    return false;
  }
  if (heap >= (int64_t)CF_LEAK_BYTES_PER_REP * reps) {
    snprintf(msg, len,
             "%s leaks: the heap in use grew by %lld bytes per run, in each of %d windows of "
             "%d runs (after 2 to settle)",
             what, (long long)(heap / reps), CF_LEAK_WINDOWS, reps);
    return false;
  }
  if (ranks > 0) {
    snprintf(msg, len,
             "%s leaks rank memory: the rank allocators still held %lld bytes when the ranks "
             "were freed, over %d runs (tensors made and never freed)",
             what, (long long)ranks, CF_LEAK_WINDOWS * reps);
    return false;
  }
  return true;
}
