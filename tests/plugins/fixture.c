/* One plugin source, built many times with a different defect each (see CMakeLists.txt), so that
 * every loader check has a plugin that fails it and the messages can be tested. Without defects
 * it is a well-formed plugin that owns FIX_DIM and logs its lifecycle to $TESSERA_TEST_LOG. */
#include <stdio.h>
#include <stdlib.h>

#include "tessera/plugin.h"

#ifndef FIX_NAME
#error "FIX_NAME must name the plugin"
#endif
#ifndef FIX_DESC_NAME
#define FIX_DESC_NAME FIX_NAME
#endif
#ifndef FIX_MAJOR
#define FIX_MAJOR TSR_ABI_MAJOR
#endif
#ifndef FIX_SIZE
#define FIX_SIZE sizeof(tsr_strategy)
#endif

/* Appends one lifecycle event, so tests can check that init and fini pair up in order. */
static void log_event(const char *what) {
  const char *path = getenv("TESSERA_TEST_LOG");
  if (!path || !*path) return;
  FILE *f = fopen(path, "a");
  if (!f) return;
  fprintf(f, "%s %s\n", what, FIX_NAME);
  fclose(f);
}

#ifdef FIX_UNRESOLVED
/* Defined nowhere: dlopen with RTLD_NOW must refuse this library. */
extern int tsr_fixture_symbol_nobody_defines(void);
#endif

/* Unused in the FIX_NO_INIT build, which leaves .init unset. */
__attribute__((unused)) static tsr_status fix_init(const tsr_plugin_args *args, void **state) {
  (void)args;
#ifdef FIX_UNRESOLVED
  if (tsr_fixture_symbol_nobody_defines()) return TSR_OK;
#endif
  log_event("init");
#ifdef FIX_INIT_FAILS
  *state = NULL;
  /* a "; " inside parentheses, as plugins' messages have: not where the fix starts */
  return tsr_error(TSR_EPLUGIN,
                   "fixture %s refuses to start (no device of kind 'imaginary'; none is built); "
                   "use another device",
                   FIX_NAME);
#else
  static int token;
  *state = &token;
  return TSR_OK;
#endif
}

static void fix_fini(void *state) {
  (void)state;
  log_event("fini");
}

#ifdef FIX_SCHEDULE
/* A third party's pipeline schedule: every forward, then every backward in reverse. */
static tsr_status fix_schedule(int stages, int microbatches, int stage, tsr_pipe_action *actions,
                               int cap, int *n, void *ctx) {
  (void)stages, (void)stage, (void)ctx;
  *n = 0;
  for (int m = 0; m < microbatches; m++) {
    if (*n + 3 > cap) return tsr_error(TSR_EINVAL, "fixture schedule: capacity %d too small", cap);
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_RECV_ACT, m, 0};
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_FORWARD, m, 0};
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_SEND_ACT, m, 0};
  }
  for (int m = microbatches - 1; m >= 0; m--) {
    if (*n + 3 > cap) return tsr_error(TSR_EINVAL, "fixture schedule: capacity %d too small", cap);
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_RECV_GRAD, m, 0};
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_BACKWARD, m, 0};
    actions[(*n)++] = (tsr_pipe_action){TSR_PIPE_SEND_GRAD, m, 0};
  }
  return TSR_OK;
}
#endif

static tsr_status fix_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)reg, (void)args, (void)state;
  log_event("register");
#ifdef FIX_SCHEDULE
  tsr_schedule sched = {FIX_SCHEDULE, args->name, fix_schedule, NULL};
  return tsr_registry_add_schedule(reg, &sched);
#else
  return TSR_OK;
#endif
}

#ifdef FIX_HOST_ONLY
/* A plugin that keeps to host memory: refuses a job on any other device. */
static tsr_status fix_validate(const tsr_plugin_args *args) {
  return tsr_plugin_require_host(args, "reads its tensors from the host");
}
#endif

#ifdef FIX_DIM
static const char *const fix_dims[] = {FIX_DIM, NULL};
#endif
#ifdef FIX_REQUIRES
static const char *const fix_required[] = {FIX_REQUIRES, NULL};
#endif
#ifdef FIX_ALIAS
static const char *const fix_aliases[] = {FIX_ALIAS, FIX_DIM, NULL};
#endif
#ifdef FIX_KEYS
static const tsr_key_spec fix_keys[] = {
    {"level", TSR_KEY_INT, NULL, 1, 3, NULL, "required test key"},
    {"style", TSR_KEY_ENUM, "plain", 0, 0, "plain|fancy", "optional test key"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};
#endif

static const tsr_strategy fix_desc = {
    .abi_major = FIX_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
    .struct_size = FIX_SIZE,
    .name = FIX_DESC_NAME,
    .version = "0.0.1",
    .description = "loader test fixture",
#ifdef FIX_DIM
    .dims = fix_dims,
#endif
#ifdef FIX_REQUIRES
    .required = fix_required,
#endif
#ifdef FIX_KEYS
    .keys = fix_keys,
#endif
#ifdef FIX_HOST_ONLY
    .validate = fix_validate,
#endif
#ifndef FIX_NO_INIT
    .init = fix_init,
#endif
    .fini = fix_fini,
    .register_rules = fix_register,
#ifdef FIX_RESERVED
    .reserved = {0, 0, 0, (void *)1},
#endif
#ifdef FIX_ALIAS
    .dim_aliases = fix_aliases,
#endif
};

#ifndef FIX_NO_SYMBOL
TSR_PLUGIN_EXPORT const tsr_strategy *tsr_plugin_v1(uint32_t core_abi_major,
                                                    uint32_t core_abi_minor) {
  (void)core_abi_major, (void)core_abi_minor;
  return &fix_desc;
}
#else
/* Exported under the wrong name: the loader must not find it. */
TSR_PLUGIN_EXPORT const tsr_strategy *tsr_plugin_v0(uint32_t a, uint32_t b) {
  (void)a, (void)b;
  return &fix_desc;
}
#endif
