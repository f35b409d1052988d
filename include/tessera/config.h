/* The job file: an INI file (docs/design.md §6) parsed into a plain struct.
 *
 * One table (tsr_config_schema_at) lists every key of every core section with its type, range,
 * default and description. The parser, the defaults, the error messages and docs/ini-reference.md
 * all come from that table, so they cannot disagree. [strategy.NAME] sections are not in the
 * table: their keys belong to the plugin NAME, which declares them with the same tsr_key_spec,
 * and they are checked when that plugin loads.
 *
 * Every error names the file, the line, the section and key, and the fix:
 *   job.ini:7: [mesh] shape: 3 entries but 'dims' (line 6) has 2; give one size per dim
 * A file with several mistakes reports all of them, one per line, in file order.
 */
#ifndef TESSERA_CONFIG_H
#define TESSERA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "tessera/export.h"
#include "tessera/mesh.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_MAX_PLUGINS 16
#define TSR_MAX_NAME    64 /* plugin and section names, including the terminator */
#define TSR_MAX_VALUE                                                                              \
  256 /* one INI value, including the terminator (inih reads 200-byte lines)                       \
       */
#define TSR_MAX_PATH    1024 /* composed paths (directory + file), including the terminator */
#define TSR_MAX_ENTRIES 32   /* keys per [strategy.NAME] section */

/* ---- Key specifications (shared by the core table and by plugins) ---- */

typedef enum tsr_key_type {
  TSR_KEY_INT = 0,    /* decimal integer within [min, max] */
  TSR_KEY_FLOAT = 1,  /* finite number within [min, max] */
  TSR_KEY_BOOL = 2,   /* true | false */
  TSR_KEY_STRING = 3, /* any text up to TSR_MAX_VALUE - 1 characters, may be empty */
  TSR_KEY_ENUM = 4,   /* one of `choices` */
  TSR_KEY_NAMES = 5,  /* comma-separated identifiers ([A-Za-z_][A-Za-z0-9_]*) */
  TSR_KEY_INTS = 6,   /* comma-separated integers, each within [min, max] */
} tsr_key_type;

/* One accepted key. Plugins give an array of these terminated by an entry whose name is NULL. */
typedef struct tsr_key_spec {
  const char *name; /* key as written in the INI file */
  tsr_key_type type;
  const char *default_value; /* INI text used when the key is absent; NULL: the key is required */
  double min, max;           /* INT, FLOAT, INTS: inclusive range */
  const char *choices;       /* ENUM: alternatives separated by '|', e.g. "gpipe|1f1b" */
  const char *doc;           /* one line for docs and did-you-mean messages */
} tsr_key_spec;

/* Checks `value` against `spec`. On failure returns TSR_EINVAL with a message that says what was
 * expected (type, range, choices) without any location; callers prefix the location. */
TSR_API tsr_status tsr_key_check(const tsr_key_spec *spec, const char *value);
/* "integer in [1, 1000000]", "one of gpipe | 1f1b", ... into buf. Returns buf. */
TSR_API const char *tsr_key_describe(const tsr_key_spec *spec, char *buf, size_t len);

/* ---- The parsed job ---- */

typedef enum tsr_job_mode { TSR_MODE_TRAIN = 0, TSR_MODE_FORWARD = 1 } tsr_job_mode;
typedef enum tsr_lr_schedule { TSR_LR_CONSTANT = 0, TSR_LR_COSINE = 1 } tsr_lr_schedule;

/* One key = value line as written, kept for locations and for plugin sections. */
typedef struct tsr_config_entry {
  char key[TSR_MAX_NAME];
  char value[TSR_MAX_VALUE];
  int line;
} tsr_config_entry;

/* A [strategy.NAME] section: raw entries, checked against the plugin's keys when it loads. */
typedef struct tsr_config_section {
  char name[TSR_MAX_NAME]; /* NAME, without "strategy." */
  int line;                /* line of the [strategy.NAME] header */
  int n;
  tsr_config_entry entries[TSR_MAX_ENTRIES];
} tsr_config_section;

/* The parsed job. Plugins read it through the accessors below (tsr_config_mesh_size,
 * tsr_config_key_int, ...), not through its fields: the layout is frozen for plugin ABI 1 only so
 * that plugins built against 1.0 keep working, and a later ABI major may change it. */
typedef struct tsr_config {
  char path[TSR_MAX_PATH]; /* the file as given; "<string>" for tsr_config_parse_string */
  char dir[TSR_MAX_PATH];  /* its directory, for relative [plugins] path entries */

  struct {
    tsr_job_mode mode;
    int64_t steps;
    int64_t seed;
    char backend[TSR_MAX_NAME]; /* "local", "mpi", "nccl" */
    tsr_device_kind device;
    /* precision of matrix products: TSR_F32, or TSR_BF16 (bf16 operands, f32 accumulation; all
     * state stays f32). Parsed from "f32|bf16", whose indices are these enum values. */
    tsr_dtype dtype;
    double timeout_s;
    int64_t world_size; /* 0: the product of [mesh] shape */
  } job;

  struct {
    int ndim;   /* entries of dims */
    int nshape; /* entries of shape; the parser rejects a file where it differs from ndim */
    char names[TSR_MAX_MESH_DIMS][TSR_MAX_DIM_NAME]; /* as written; owners' aliases renamed */
    int shape[TSR_MAX_MESH_DIMS];
    int64_t world; /* product of shape */
  } mesh;

  struct {
    int nload;
    char load[TSR_MAX_PLUGINS][TSR_MAX_NAME];
    char path[TSR_MAX_VALUE]; /* extra search directories, ':' or ',' separated */
  } plugins;

  struct {
    int64_t vocab_size, hidden_size, intermediate_size, num_hidden_layers;
    int64_t num_attention_heads, num_key_value_heads;
    double rms_norm_eps, rope_theta;
    bool tie_word_embeddings;
  } model;

  struct {
    char source[TSR_MAX_VALUE];
    int64_t batch_size, seq_len;
  } data;

  struct {
    double lr;
    tsr_lr_schedule lr_schedule;
    int64_t warmup_steps;
    double beta1, beta2, eps, weight_decay, max_norm;
    double min_lr;            /* where the cosine ends */
    int64_t grad_accum_steps; /* microbatches per optimizer step */
  } optimizer;

  struct {
    char load[TSR_MAX_VALUE], save[TSR_MAX_VALUE];
  } checkpoint;

  struct {
    char dump[TSR_MAX_VALUE], trace[TSR_MAX_VALUE];
  } output;

  int nstrategy;
  tsr_config_section strategy[TSR_MAX_PLUGINS];

  /* Every core key = value line read, for tsr_config_line. */
  int nentries;
  struct {
    char section[TSR_MAX_NAME];
    char key[TSR_MAX_NAME];
    int line;
  } where[128];
} tsr_config;

/* Keys added since ABI 1.0. tsr_config is frozen for plugin ABI 1 (docs/abi.md: its size and
 * every offset), so later keys live here: the core allocates this struct with every config
 * (tsr_config_ext) and it only grows, by appending fields. The keys are also read by name, as
 * any core key, through tsr_config_key_int and the other accessors below. */
typedef enum tsr_on_nonfinite {
  TSR_NONFINITE_STOP = 0, /* stop the run at that step, saving nothing */
  TSR_NONFINITE_SKIP = 1, /* skip that step's update and go on */
} tsr_on_nonfinite;

typedef enum tsr_activation_checkpointing {
  TSR_ACT_CKPT_NONE = 0, /* keep every activation the backward needs */
  TSR_ACT_CKPT_FULL = 1, /* keep a layer's input only and recompute the layer in the backward */
  TSR_ACT_CKPT_SELECTIVE = 2, /* keep GEMM and attention outputs, recompute element-wise ops */
} tsr_activation_checkpointing;

typedef enum tsr_data_mask {
  TSR_MASK_CAUSAL = 0,   /* attention over the whole packed row, positions 0 .. L-1 */
  TSR_MASK_DOCUMENT = 1, /* attention within each document, positions from 0 at each */
} tsr_data_mask;

typedef struct tsr_config_ext {
  struct {
    char source[TSR_MAX_VALUE]; /* held-out data, as [data] source; "" = no evaluation */
    int64_t every;              /* steps between evaluations; 0 = after the last step only */
    int64_t batches;            /* batches per evaluation */
  } eval;
  struct {
    /* a step whose loss or gradient norm is NaN or Inf: "stop|skip_step", whose indices are
     * these values */
    tsr_on_nonfinite on_nonfinite;
  } job;
  struct {
    char metrics[TSR_MAX_VALUE]; /* JSON Lines file of every step and evaluation; "" = none */
  } output;
  struct {
    /* sparse mixture of experts (ABI 1.2), Hugging Face Mixtral's names */
    int64_t num_local_experts;   /* experts per MoE layer; 0 = a dense model */
    int64_t num_experts_per_tok; /* experts each token is routed to (top-k) */
    int64_t decoder_sparse_step; /* layer l is MoE when (l + 1) % step == 0; 1 = every layer */
    double router_aux_loss_coef; /* weight of the load-balancing loss added to the loss */
  } model;
  struct {
    /* periodic sharded checkpoints: DIR/step-NNNNNN/, one file per rank and an index */
    char dir[TSR_MAX_VALUE]; /* "" = none */
    int64_t every;           /* steps between saves; 0 = at the end of the run only */
    int64_t keep_last;       /* newest folders kept; 0 = every one */
  } checkpoint;
  struct {
    /* [model] activation checkpointing: "none|full|selective", whose indices are these values */
    tsr_activation_checkpointing activation_checkpointing;
    int64_t checkpoint_every; /* full or selective applies to layer l when (l + 1) % every == 0 */
  } model_memory;
  struct {
    /* [data] mask: "causal|document", whose indices are these values (docs/data.md) */
    tsr_data_mask mask;
    char index[TSR_MAX_VALUE]; /* document index of a tokens: source; "" = the source + ".idx" */
  } data_docs;
  struct {
    /* [job] stop_grace_s: seconds a run has, after the first SIGINT or SIGTERM, to finish its
     * step and write its checkpoint before it exits at once; 0 = as long as that takes */
    double stop_grace_s;
  } job_stop;
  struct {
    /* [job] memory_limit: bytes a rank may hold at the peak of its step, as written ("512M",
     * "4G", "1.5GiB", "1000000"; K, M, G, T are powers of 1024); "" = no limit. A job whose
     * predicted peak on some rank exceeds it is refused before it runs */
    char memory_limit[TSR_MAX_VALUE];
  } job_memory;
  struct {
    /* [checkpoint] async: a save of dir snapshots the shards to host memory and a background
     * thread writes them while training goes on */
    bool async;
  } checkpoint_async;
  struct {
    /* [output] tensorboard: folder of the run's TensorBoard event file; "" = none */
    char tensorboard[TSR_MAX_VALUE];
  } output_tb;
} tsr_config_ext;

/* The keys added since ABI 1.0 of a config made by tsr_config_load or tsr_config_parse_string. */
TSR_API const tsr_config_ext *tsr_config_ext_of(const tsr_config *cfg);

/* Parses and validates the job file at `path` into a new config. On TSR_EINVAL (bad input) or
 * TSR_EIO (unreadable file) the last error holds every problem found, one per line. */
TSR_API tsr_status tsr_config_load(const char *path, tsr_config **out);
/* As tsr_config_load, from text in memory; `name` stands in for the file name in messages. */
TSR_API tsr_status tsr_config_parse_string(const char *text, const char *name, tsr_config **out);
TSR_API void tsr_config_free(tsr_config *cfg);

/* Sets one core key from "section.key=value" (e.g. "output.dump=/tmp/d.safetensors"), checked
 * as the parser checks it: unknown keys get a did-you-mean, bad values say what is expected. For
 * command-line overrides, applied after tsr_config_load; the job file's cross-checks are not run
 * again, so it is meant for keys that stand on their own (paths, steps, seeds, rates; [mesh]
 * dims and shape keep the world size in step, 0 while their counts differ).
 * "strategy.NAME.key=value" adds or replaces a key of [strategy.NAME] (made if absent); the
 * plugin checks it when it loads, as it checks the file's keys. */
TSR_API tsr_status tsr_config_set(tsr_config *cfg, const char *assignment);
/* After the last tsr_config_set: the cross-checks that overrides can break ([mesh] dims and
 * shape of one length, every [strategy.NAME] with its plugin in [plugins] load), TSR_EINVAL with
 * the fix otherwise. */
TSR_API tsr_status tsr_config_check_sets(const tsr_config *cfg);

/* TSR_EINVAL when the mesh product differs from the world size a backend provides. */
TSR_API tsr_status tsr_config_check_world(const tsr_config *cfg, int world);

/* Line where `key` of `section` was set (section "strategy.tp" for plugin sections, key NULL for
 * the section header), or 0 when the file did not set it or a --set replaced it. */
TSR_API int tsr_config_line(const tsr_config *cfg, const char *section, const char *key);

/* Where the value of `key` of `section` comes from, for messages, into buf (returned):
 * "job.ini:12: [section] key" when the file set it, "--set section.key" when a command-line
 * override did (tsr_config_set), "job.ini: [section] key" for a default. */
TSR_API const char *tsr_config_where(const tsr_config *cfg, const char *section, const char *key,
                                     char *buf, size_t len);

/* Records "file:line: [section] key: <message>" (or "--set section.key: <message>" for a key a
 * command-line override set) as the last error and returns `s`. Plugins use
 * it for their own cross-checks (heads % tp, ...) so that they read like the core's. */
TSR_API tsr_status tsr_config_error(const tsr_config *cfg, tsr_status s, const char *section,
                                    const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* The [strategy.NAME] section of plugin `name`, or NULL when the file has none. */
TSR_API const tsr_config_section *tsr_config_strategy(const tsr_config *cfg, const char *name);

/* Checks a plugin section against the plugin's keys (terminated by name == NULL): unknown keys
 * (with a did-you-mean), bad values and missing required keys. `plugin_path` goes into the
 * message so the user knows which build declared the keys. */
TSR_API tsr_status tsr_config_check_section(const tsr_config *cfg, const char *plugin,
                                            const tsr_key_spec *keys, const char *plugin_path);

/* Value of `key` for plugin `plugin`: the INI text, else the key's default from `keys`, else
 * NULL. The section must have passed tsr_config_check_section. */
TSR_API const char *tsr_config_get(const tsr_config *cfg, const char *plugin,
                                   const tsr_key_spec *keys, const char *key);
/* Typed forms of tsr_config_get. They return TSR_EINVAL for a key that is neither set nor
 * defaulted or a value that does not parse. */
TSR_API tsr_status tsr_config_get_int(const tsr_config *cfg, const char *plugin,
                                      const tsr_key_spec *keys, const char *key, int64_t *out);
TSR_API tsr_status tsr_config_get_float(const tsr_config *cfg, const char *plugin,
                                        const tsr_key_spec *keys, const char *key, double *out);
TSR_API tsr_status tsr_config_get_bool(const tsr_config *cfg, const char *plugin,
                                       const tsr_key_spec *keys, const char *key, bool *out);

/* ---- Reading the job by name (what plugins use instead of the struct's fields) ---- */

/* The mesh: its number of dims, and the name of dim i (outermost first; NULL when i is out of
 * range). */
TSR_API int tsr_config_mesh_ndim(const tsr_config *cfg);
TSR_API const char *tsr_config_mesh_dim(const tsr_config *cfg, int i);
/* The position of mesh dim `dim`, or -1 when the mesh has no such dim. */
TSR_API int tsr_config_mesh_index(const tsr_config *cfg, const char *dim);
/* The size of mesh dim `dim`, or 1 when the mesh has no such dim: a dim the job leaves out is a
 * dim of size 1, so plugins need not tell the two apart. */
TSR_API int tsr_config_mesh_size(const tsr_config *cfg, const char *dim);
/* The number of ranks: the product of [mesh] shape. */
TSR_API int64_t tsr_config_mesh_world(const tsr_config *cfg);
/* True when [plugins] load names `plugin`. */
TSR_API bool tsr_config_loads_plugin(const tsr_config *cfg, const char *plugin);

/* A key of a core section ("job", "mesh", "model", "data", "optimizer", ...; not
 * [strategy.NAME], see tsr_config_get_int), as the job file or its default sets it, by the names
 * the file uses: tsr_config_key_int(cfg, "model", "num_attention_heads", &heads). Each returns
 * TSR_EINVAL, with a did-you-mean, for a key the schema lacks, and for a key of another type.
 *   _int     integer keys; an enum key gives the index of its value among its choices, which
 *            for [job] mode, device, dtype and [optimizer] lr_schedule is the tsr_job_mode,
 *            tsr_device_kind, tsr_dtype or tsr_lr_schedule value
 *   _float   number keys, and integer keys converted
 *   _bool    true | false keys
 *   _string  any key, written into buf as INI text (lists ", "-joined, an enum as its choice);
 *            TSR_EINVAL when it does not fit in len bytes */
TSR_API tsr_status tsr_config_key_int(const tsr_config *cfg, const char *section, const char *key,
                                      int64_t *out);
TSR_API tsr_status tsr_config_key_float(const tsr_config *cfg, const char *section, const char *key,
                                        double *out);
TSR_API tsr_status tsr_config_key_bool(const tsr_config *cfg, const char *section, const char *key,
                                       bool *out);
TSR_API tsr_status tsr_config_key_string(const tsr_config *cfg, const char *section,
                                         const char *key, char *buf, size_t len);

/* ---- The core schema ---- */

typedef struct tsr_config_key {
  const char *section; /* "job", "mesh", ... */
  tsr_key_spec spec;
} tsr_config_key;

TSR_API int tsr_config_schema_count(void);
TSR_API const tsr_config_key *tsr_config_schema_at(int i);
/* Writes the INI reference (docs/ini-reference.md) generated from the schema to `f`. */
TSR_API tsr_status tsr_config_write_reference(FILE *f);

/* Smallest edit distance candidate among `n` names for did-you-mean hints, or NULL when none is
 * close enough to be a plausible typo. */
TSR_API const char *tsr_closest_name(const char *word, const char *const *names, int n);

#ifdef __cplusplus
}
#endif
#endif
