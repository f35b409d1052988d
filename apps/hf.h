/* Hugging Face model folders (docs/hf.md): a folder's config.json read into the job's [model]
 * keys and written from them, its weights read from model.safetensors or from the shards that
 * model.safetensors.index.json names, and folders written by `tessera export`. */
#ifndef TESSERA_APP_HF_H
#define TESSERA_APP_HF_H

#include <stdbool.h>
#include <stdint.h>

#include "llama.h"
#include "tessera/config.h"
#include "tessera/io.h"

/* The [model] keys a config.json maps to, in this order (docs/hf.md has the table). */
enum {
  TSR_HF_VOCAB,
  TSR_HF_HIDDEN,
  TSR_HF_INTERMEDIATE,
  TSR_HF_LAYERS,
  TSR_HF_HEADS,
  TSR_HF_KV_HEADS,
  TSR_HF_EPS,
  TSR_HF_THETA,
  TSR_HF_TIE,
  TSR_HF_EXPERTS,
  TSR_HF_TOP_K,
  TSR_HF_SPARSE_STEP,
  TSR_HF_AUX_COEF,
  TSR_HF_NKEYS
};

/* The [model] key name of index k (TSR_HF_*). */
const char *tsr_hf_key_name(int k);

/* What a config.json says: the model's keys, with the value transformers takes for a key the
 * file leaves out (`given` says which the file wrote), and what generation needs. */
typedef struct tsr_hf_config {
  char path[TSR_MAX_PATH + 16]; /* DIR/config.json */
  char model_type[32];          /* llama, mistral or mixtral */
  double value[TSR_HF_NKEYS];   /* by TSR_HF_*; booleans as 0 / 1 */
  bool given[TSR_HF_NKEYS];     /* written in the file (or implied by model_type) */
  bool known[TSR_HF_NKEYS];     /* value holds something: given, or transformers' default */
  int64_t sliding_window;       /* 0: none */
  int64_t max_position_embeddings;
  int32_t bos_token_id; /* -1 when absent */
  int32_t eos_token_id[8];
  int neos;
} tsr_hf_config;

/* True when `path` is a directory (a folder to load, not a checkpoint file). */
bool tsr_hf_is_folder(const char *path);

/* Reads and checks DIR/config.json: valid JSON, a supported model_type (llama, mistral,
 * mixtral), numbers where numbers belong, and nothing the model cannot compute (rope_scaling,
 * a head_dim other than hidden_size / num_attention_heads, biases, an activation other than
 * silu). TSR_EIO when it cannot be read, TSR_EINVAL naming the file and the key otherwise. */
tsr_status tsr_hf_config_read(const char *dir, tsr_hf_config *out);

/* When [checkpoint] load names a folder: reads its config.json and sets the job's [model] keys
 * from it. A key set both in the job and in config.json must agree (TSR_EINVAL naming both
 * values and both files); a key only config.json gives (or implies) takes its value; a key only
 * the job sets keeps the job's value. No-op when load is empty or a file. */
tsr_status tsr_hf_job_apply(tsr_config *cfg);

/* The job's value of [model] key k (TSR_HF_*; num_key_value_heads = 0 read as the heads). */
double tsr_hf_job_value(const tsr_config *cfg, int k);

/* The weights a command reads for the job `cfg` (export, generate): `override` when given, else
 * [checkpoint] save when that file exists, else [checkpoint] load (a file or a folder), resolved
 * as the job resolves paths, into buf. TSR_EINVAL when there is none. */
tsr_status tsr_hf_job_weights(const tsr_config *cfg, const char *override, char *buf, size_t len);

/* The [model] keys of `cfg` as a model config (as tsr_train_model_config, here for the commands
 * that build no ranks). */
tsr_llama_config tsr_hf_model_config(const tsr_config *cfg);

/* Loads the folder `dir` into the training job's parameters (and the tied embedding's replica),
 * all or nothing: every rank reads the files and keeps its shards. Weights only: the optimizer
 * starts afresh. Errors are prefixed with where [checkpoint] load is set. */
struct tsr_train_rank;
tsr_status tsr_hf_train_load(struct tsr_train_rank *t, const char *dir);

/* ---- the tensors of a model ---- */

/* One tensor of the model as Hugging Face files hold it. */
typedef struct tsr_hf_tensor {
  char name[160];
  int ndim;
  int64_t shape[2];
} tsr_hf_tensor;

/* Fills the `n` full f32 tensors `ts` named as Hugging Face names them (tsr_hf_tensors) from
 * the sharded checkpoint folder `folder` ([checkpoint] dir; apps/export_sharded.c), each from
 * the slices that hold it, an MoE expert's from its box of the stacked experts. TSR_EINVAL
 * naming the folder and the tensor when one is missing or of another shape. */
tsr_status tsr_hf_sharded_load(const char *folder, int n, const char *const *names,
                               tsr_tensor *const *ts);

/* The tensors of a model of config `m` in the model's parameter order, the stacked experts as
 * Mixtral's per-expert tensors (as tsr_llama_hf_tensor names them). *out is malloc'd. */
tsr_status tsr_hf_tensors(const tsr_llama_config *m, tsr_hf_tensor **out, int *n);

/* ---- weights: a safetensors file, or a folder of one file or of shards ---- */

typedef struct tsr_hf_weights tsr_hf_weights;

/* Opens the weights at `path`: a safetensors file, or a folder holding model.safetensors (taken
 * first, as transformers does) or model.safetensors.index.json and every shard its weight_map
 * names. Every shard is opened and validated, and the index is checked against the shards (each
 * name in the shard the index gives, each shard's tensor in the index): TSR_EINVAL naming the
 * file and the tensor or shard otherwise. */
tsr_status tsr_hf_weights_open(const char *path, tsr_hf_weights **out);
void tsr_hf_weights_close(tsr_hf_weights *w);
/* The file that holds tensor `name`, NULL when none does. */
const tsr_safetensors_t *tsr_hf_weights_find(const tsr_hf_weights *w, const char *name);

/* Reads `n` tensors by name into `dst` (f32, contiguous CPU tensors of the expected shapes),
 * converting from F32, BF16 or F16. Every tensor must be present with that shape, a float
 * dtype and finite values; a tensor of the files that is not asked for is an error unless it
 * matches one of the `nignore` fnmatch patterns. Errors name the file and the tensor; on error
 * `dst` may be partly written (callers load into scratch tensors). */
tsr_status tsr_hf_weights_load(const tsr_hf_weights *w, int n, const char *const *names,
                               tsr_tensor *const *dst, int nignore, const char *const *ignore);

/* ---- writing a folder ---- */

typedef struct tsr_hf_write_opts {
  tsr_dtype dtype;       /* TSR_F32 or TSR_BF16 */
  int64_t shard_bytes;   /* most tensor bytes per shard file (a larger tensor gets its own) */
  int64_t max_positions; /* max_position_embeddings written to config.json */
  int32_t bos_token_id;  /* -1: not written */
  int32_t eos_token_id;  /* -1: not written */
  int ntokenizer;        /* tokenizer files to copy into the folder */
  const char *const *tokenizer;
} tsr_hf_write_opts;

/* Writes an HF folder at `dir` (created with its parents when absent; files of the same names in it
 * are replaced, others left alone): config.json from the job's [model] keys (LlamaForCausalLM, or
 * MixtralForCausalLM with experts), model.safetensors when one shard holds everything or
 * model-0000N-of-0000M.safetensors and model.safetensors.index.json, generation_config.json
 * when a token id is known, and copies of the tokenizer files; weight files of an earlier export
 * that this one does not write are removed. `tensors` are the model's full tensors named by
 * tsr_hf_tensors. Every file goes through a temporary beside it. */
tsr_status tsr_hf_folder_write(const char *dir, const tsr_config *cfg, int n,
                               const char *const *names, const tsr_tensor *const *tensors,
                               const tsr_hf_write_opts *opts);

/* ---- the commands ---- */

/* `tessera export` (export_cmd.c) and `tessera generate` (generate_cmd.c): argv[0] is the
 * command's name; the exit code is returned. */
int tsr_cmd_export(int argc, char **argv);
int tsr_cmd_generate(int argc, char **argv);

#endif
