/* Strategy plugins: the ABI a libtessera-<name>.so implements and the loader that checks it.
 *
 * A plugin exports one C function,
 *
 *   const tsr_strategy *tsr_plugin_v1(uint32_t core_abi_major, uint32_t core_abi_minor);
 *
 * which returns a pointer to a descriptor with static storage duration (or NULL to refuse a core
 * it cannot work with). The core never names a plugin: a job's [plugins] load list does.
 *
 * Version policy.
 *   - TSR_ABI_MINOR grows when tsr_strategy gains a field. Fields are only ever appended at the
 *     end (after `reserved`), and a reserved slot may be given a meaning only when zero keeps
 *     the old behaviour. A core reads an appended field only when the plugin's struct_size covers
 *     it, so a plugin built against an older minor keeps working with a newer core; a newer
 *     plugin that sets a reserved slot is refused by an older core, which cannot honour it.
 *   - TSR_ABI_MAJOR grows when anything else changes (a field's type, meaning or position, a
 *     callback's signature). A new major comes with a new entry symbol (tsr_plugin_v2), so a
 *     core can keep loading plugins of the old major next to those of the new.
 *
 * Load checks, in this order, each failure one message naming the plugin, the path and both ABI
 * versions: the file opens (and links: dlopen with RTLD_NOW); the entry symbol exists; abi_major
 * equals the core's; struct_size covers every field the core reads; reserved fields are zero; name
 * matches the name the job asked for; mandatory callbacks are set; required strategies are loaded;
 * no mesh dim has two owners; the [strategy.NAME] keys are valid; validate and init succeed.
 * fini runs for every plugin whose init ran, newest first, whether the job succeeds or not.
 */
#ifndef TESSERA_PLUGIN_H
#define TESSERA_PLUGIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/config.h"
#include "tessera/registry.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_ABI_MAJOR         1
#define TSR_ABI_MINOR         0
#define TSR_PLUGIN_SYMBOL     "tsr_plugin_v1"
#define TSR_PLUGIN_PREFIX     "libtessera-"
#define TSR_PLUGIN_SUFFIX     ".so"
#define TSR_STRATEGY_RESERVED 8

/* What a plugin's callbacks get to see. Valid for the duration of each call. */
typedef struct tsr_plugin_args {
  const tsr_config *config; /* the whole job, already checked by the core */
  const char *name;         /* the plugin's name, the NAME of [strategy.NAME] */
  const char *path;         /* the shared object it was loaded from */
  uint32_t core_abi_major, core_abi_minor;
} tsr_plugin_args;

/* The descriptor. Plugins fill it statically, e.g.
 *   static const char *const dims[] = {"tp", NULL};
 *   static const tsr_strategy desc = {.abi_major = TSR_ABI_MAJOR, .abi_minor = TSR_ABI_MINOR,
 *     .struct_size = sizeof(tsr_strategy), .name = "tp", .version = "0.1.0", .dims = dims, ...};
 */
typedef struct tsr_strategy {
  uint32_t abi_major;   /* TSR_ABI_MAJOR the plugin was built against; must equal the core's */
  uint32_t abi_minor;   /* TSR_ABI_MINOR the plugin was built against; informational */
  uint32_t struct_size; /* sizeof(tsr_strategy) as the plugin was built */
  uint32_t flags;       /* none defined in 1.0: must be zero */

  const char *name;        /* mandatory; equals <name> of libtessera-<name>.so and the INI */
  const char *version;     /* mandatory; the plugin's own version, e.g. "0.1.0" */
  const char *description; /* optional; one line for `tessera plugins` */

  /* Mesh dims this strategy owns, NULL-terminated; NULL or empty when it owns none (a strategy
   * may refine another's dim, as sp refines tp). A mesh dim of size > 1 needs exactly one
   * loaded owner; a plugin whose dims are all absent or of size 1 loads and stays inactive. */
  const char *const *dims;
  /* Strategies that must also be listed in [plugins] load, NULL-terminated, or NULL. */
  const char *const *required;
  /* Keys accepted in [strategy.NAME], terminated by an entry whose name is NULL, or NULL for
   * none. The core checks types, ranges and required keys before validate and init run. */
  const tsr_key_spec *keys;

  /* Optional. Cross-checks against the whole job (heads % tp, layers >= stages, ...). Report
   * failures with tsr_config_error so they name the file, line and key. */
  tsr_status (*validate)(const tsr_plugin_args *args);
  /* Mandatory. Sets up the plugin's state for this job; *state is passed back to the other
   * callbacks. On failure the plugin frees whatever it made: fini is not called for it. */
  tsr_status (*init)(const tsr_plugin_args *args, void **state);
  /* Mandatory. Releases the state made by init. Runs once per successful init. */
  void (*fini)(void *state);
  /* Mandatory. Adds the plugin's redistribute transitions, op sharding rules, module styles,
   * pipeline schedules and optimizer hooks to the job's registry. Runs once, after init. The
   * registry keeps the pointers it is given (names, callbacks, ctx): they must stay valid until
   * fini, so point them at static data or into `state`. */
  tsr_status (*register_rules)(tsr_registry_t *reg, const tsr_plugin_args *args, void *state);

  /* Must be zero in ABI 1.0 (see the version policy above). */
  void *reserved[TSR_STRATEGY_RESERVED];
} tsr_strategy;

/* For a plugin's validate: refuses a job whose [job] device is not the CPU, for a plugin that
 * reads or writes tensor memory from the host (its own loops, or the tsr_kernel_* functions of
 * kernels.h, which are the CPU's). A plugin that moves data only through tensor copies, views,
 * collectives and the kernels of its tensors' device (tessera/device.h) works on every device and
 * needs no such check; `device = emu` is how to find out (tensor.h). `what` says what keeps the
 * plugin on the host. */
static inline tsr_status tsr_plugin_require_host(const tsr_plugin_args *args, const char *what) {
  if (args->config->job.device == TSR_DEVICE_CPU) return TSR_OK;
  return tsr_config_error(args->config, TSR_ENOTSUP, "job", "device",
                          "device %s: plugin %s %s, so it runs with device = cpu only. Use "
                          "device = cpu, or leave %s out of [plugins] load",
                          tsr_device_name(args->config->job.device), args->name, what, args->name);
}

/* The size of the 1.0 descriptor: the least struct_size a core of major 1 accepts. */
#define TSR_STRATEGY_SIZE_1_0                                                                      \
  (offsetof(tsr_strategy, reserved) + sizeof(void *) * TSR_STRATEGY_RESERVED)

/* Marks the entry point as exported when plugins build with hidden visibility (as
 * tessera_add_plugin does):  TSR_PLUGIN_EXPORT const tsr_strategy *tsr_plugin_v1(...) */
#define TSR_PLUGIN_EXPORT __attribute__((visibility("default")))

/* The entry point's type, for the loader and for plugins that want to check their signature. */
typedef const tsr_strategy *(*tsr_plugin_entry_fn)(uint32_t core_abi_major,
                                                   uint32_t core_abi_minor);

/* The entry point of a plugin that serves one descriptor to every core (the loader compares the
 * ABI versions itself and names both on a mismatch):  TSR_PLUGIN_DEFINE(my_desc);
 * Write tsr_plugin_v1 by hand instead to refuse some cores (return NULL). The trailing assertion
 * gives the use's ';' a declaration to end (ISO C has no empty declarations). */
#ifdef __cplusplus
#define TSR_PLUGIN_LINKAGE_       extern "C"
#define TSR_PLUGIN_STATIC_ASSERT_ static_assert
#else
#define TSR_PLUGIN_LINKAGE_
#define TSR_PLUGIN_STATIC_ASSERT_ _Static_assert
#endif
#define TSR_PLUGIN_DEFINE(desc)                                                                    \
  TSR_PLUGIN_LINKAGE_ TSR_PLUGIN_EXPORT const tsr_strategy *tsr_plugin_v1(                         \
      uint32_t core_abi_major, uint32_t core_abi_minor) {                                          \
    (void)core_abi_major, (void)core_abi_minor;                                                    \
    return &(desc);                                                                                \
  }                                                                                                \
  TSR_PLUGIN_STATIC_ASSERT_(sizeof(desc) == sizeof(tsr_strategy),                                  \
                            "TSR_PLUGIN_DEFINE takes a tsr_strategy")

/* ---- Loader ---- */

/* The check a plugin failed (or TSR_CHECK_PASSED), in the order the loader runs them. */
typedef enum tsr_plugin_check {
  TSR_CHECK_PASSED = 0,
  TSR_CHECK_FOUND,     /* a file for the name exists on the search path */
  TSR_CHECK_OPEN,      /* dlopen(RTLD_NOW | RTLD_LOCAL) succeeds: readable, every symbol links */
  TSR_CHECK_SYMBOL,    /* tsr_plugin_v1 exists and returns a descriptor */
  TSR_CHECK_MAJOR,     /* abi_major == TSR_ABI_MAJOR */
  TSR_CHECK_SIZE,      /* struct_size >= TSR_STRATEGY_SIZE_1_0 */
  TSR_CHECK_RESERVED,  /* flags and reserved[] are zero */
  TSR_CHECK_NAME,      /* name equals the name asked for (and the file name) */
  TSR_CHECK_CALLBACKS, /* name, version, init, fini and register_rules are set */
  TSR_CHECK_REQUIRED,  /* every required strategy is loaded too */
  TSR_CHECK_DIMS,      /* no mesh dim owned by two plugins; no mesh dim > 1 without owner */
  TSR_CHECK_KEYS,      /* the [strategy.NAME] section passes the plugin's keys */
  TSR_CHECK_VALIDATE,  /* validate accepts the job */
  TSR_CHECK_INIT,      /* init succeeds */
  TSR_CHECK_REGISTER,  /* register_rules succeeds */
} tsr_plugin_check;

const char *tsr_plugin_check_name(tsr_plugin_check c); /* "open", "symbol", "major", ... */

/* What the loader found out about one plugin: for `tessera plugins` and for error reports. */
typedef struct tsr_plugin_report {
  char name[TSR_MAX_NAME];
  char path[TSR_MAX_PATH]; /* "" when no file was found */
  char version[TSR_MAX_NAME];
  uint32_t abi_major, abi_minor; /* 0.0 when the descriptor could not be read */
  char dims[TSR_MAX_VALUE];      /* owned dims joined by ", " */
  char description[TSR_MAX_VALUE];
  char keys[1024];         /* accepted [strategy.NAME] keys: "name (type; default D); ..." */
  tsr_plugin_check failed; /* TSR_CHECK_PASSED when it loaded */
  tsr_status status;
  char message[2048]; /* the error line; "" when it loaded */
} tsr_plugin_report;

/* The folder of the libtessera this process loaded (resolved, no trailing '/'); false when it
 * cannot be told. Backends and kernel libraries installed beside the core are looked for there
 * first, so an install made with any --prefix (or moved) finds its own. */
bool tsr_core_library_dir(char *out, size_t len);

/* Opens `file` (e.g. "libtessera-mpi.so"), a library of this tessera that the core or a loader
 * dlopens: from the absolute path in the environment variable `env` when it holds one, then
 * beside the loaded libtessera (tsr_core_library_dir), then `install_path` and `build_path`
 * (either may be NULL or ""); never the current directory. `flags` go to dlopen. Returns the
 * handle, or NULL with each path tried and why it failed appended to tried[tried_len]
 * ("\n  PATH: reason" each). */
void *tsr_core_dlopen(const char *file, const char *env, const char *install_path,
                      const char *build_path, int flags, char *tried, size_t tried_len);

/* The directories searched for plugins, in order: TESSERA_PLUGIN_PATH (':'-separated, absolute
 * entries only), then `extra` (the [plugins] path value, ':' or ',' separated, relative entries
 * taken from `base_dir`), then the install's lib/tessera (the folder beside the libtessera that
 * was loaded, so any install prefix works), then the build tree's plugin directory; a core loaded
 * from an install skips the build tree. The current directory is never searched. Writes at most
 * `cap` entries; returns the count. */
int tsr_plugin_search_dirs(const char *extra, const char *base_dir, char (*dirs)[TSR_MAX_PATH],
                           int cap);

/* Opens one plugin file and runs the per-file checks (open .. callbacks) without calling init.
 * `want` is the name the job asks for (NULL: the name in the file name). Fills `rep` either way;
 * the status is TSR_OK or TSR_EPLUGIN. The file is closed again. */
tsr_status tsr_plugin_probe(const char *path, const char *want, tsr_plugin_report *rep);

/* Every libtessera-*.so on the search path, probed, first occurrence of a name first; later
 * files with a name already seen are reported as shadowed. Caller frees *reports. */
tsr_status tsr_plugin_discover(const char *extra, const char *base_dir, tsr_plugin_report **reports,
                               int *n);

typedef struct tsr_plugin_set_t tsr_plugin_set_t; /* the plugins loaded for one job */

/* Loads every plugin of cfg's [plugins] load list in order, runs every check above, and calls
 * register_rules into `reg`. On failure every plugin whose init ran is finalised (newest first)
 * and closed, the last error holds the failing plugin's message, and *out is a set that holds
 * the reports (so callers can list what failed) but no loaded plugin; free it as usual. */
tsr_status tsr_plugin_set_load(const tsr_config *cfg, tsr_registry_t *reg, tsr_plugin_set_t **out);
/* Runs fini for every initialised plugin, newest first, and closes them. NULL is a no-op. */
void tsr_plugin_set_free(tsr_plugin_set_t *set);

int tsr_plugin_set_count(const tsr_plugin_set_t *set);
const tsr_plugin_report *tsr_plugin_set_report(const tsr_plugin_set_t *set, int i);
/* The descriptor of loaded plugin i, or NULL when it did not load. */
const tsr_strategy *tsr_plugin_set_strategy(const tsr_plugin_set_t *set, int i);
/* Name of the loaded plugin that owns mesh dim `dim` (alias-aware), or NULL. */
const char *tsr_plugin_set_owner(const tsr_plugin_set_t *set, const char *dim);

/* A job's configuration with its plugins loaded and their rules registered, as `tessera run`
 * prepares it before starting ranks: what tests, benchmarks and embedding programs start from. */
typedef struct tsr_plugin_job {
  tsr_config *cfg;       /* owned */
  tsr_registry_t *reg;   /* owned: what the plugins registered; ranks read it */
  tsr_plugin_set_t *set; /* owned */
} tsr_plugin_job;

/* Parses `text` (`name` stands in for the file name in messages) and loads its plugins. On
 * failure the last error says why and *out holds nothing to free. */
tsr_status tsr_plugin_job_load_string(const char *text, const char *name, tsr_plugin_job *out);
/* Frees the registry before the plugins it points into, then the config. Idempotent. */
void tsr_plugin_job_free(tsr_plugin_job *job);

#ifdef __cplusplus
}
#endif
#endif
