/* Files: safetensors, checkpoints, training data and dumps.
 *
 * Safetensors is the Hugging Face format: an 8-byte little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...,
 *    "__metadata__": {"key": "value"}}
 * then the data buffer, each tensor contiguous, row-major and little-endian at its offsets
 * (relative to the start of the buffer). Tessera reads every dtype the format defines but loads
 * as tensors only those it has (F32, BF16, F16, I32, I64).
 *
 * A file is validated completely when opened, so that a bad file fails before anything is loaded
 * from it: the header length against the file size, the JSON, every entry's dtype, shape and
 * offsets, byte counts against the shape, no overlapping tensors, no bytes of the buffer that no
 * tensor owns (as the reference implementation requires), no duplicate names. Every message
 * names the file and, where one is involved, the tensor.
 *
 * Everything written goes to a temporary file in the same directory that is synced and then
 * renamed over the destination, so a crash or a failed write never leaves a partial file: the
 * destination holds either the old contents or the new ones.
 *
 * Tensors read and written here live on the CPU.
 */
#ifndef TESSERA_IO_H
#define TESSERA_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- safetensors: reading ---- */

/* A safetensors file opened for reading (memory-mapped; read-only). */
typedef struct tsr_safetensors_t tsr_safetensors_t;

/* Opens and validates `path`. TSR_EIO when it cannot be read, TSR_EINVAL when it is not a valid
 * safetensors file (the message says what is wrong and where). Tensors of rank above
 * TSR_MAX_DIMS are rejected here. */
TSR_API tsr_status tsr_safetensors_open(const char *path, tsr_safetensors_t **out);
/* NULL is a no-op. */
TSR_API void tsr_safetensors_close(tsr_safetensors_t *st);

/* The path given to open. */
TSR_API const char *tsr_safetensors_path(const tsr_safetensors_t *st);
/* Number of tensors, and the name of tensor `i` in the order of the file's header. */
TSR_API int tsr_safetensors_count(const tsr_safetensors_t *st);
TSR_API const char *tsr_safetensors_name(const tsr_safetensors_t *st, int i);
/* True when the file has a tensor called `name`. */
TSR_API bool tsr_safetensors_has(const tsr_safetensors_t *st, const char *name);
/* The dtype string as written in the file ("F32", "U16", ...), or NULL without such a tensor. */
TSR_API const char *tsr_safetensors_dtype_str(const tsr_safetensors_t *st, const char *name);

/* Rank and shape (TSR_MAX_DIMS entries of room) of tensor `name`, and its dtype when `dt` is not
 * NULL. TSR_EINVAL "no tensor 'x' in FILE" without it; TSR_ENOTSUP when `dt` is asked for and the
 * file's dtype is one Tessera has no tensor type for (ndim and shape are filled all the same). */
TSR_API tsr_status tsr_safetensors_info(const tsr_safetensors_t *st, const char *name,
                                        tsr_dtype *dt, int *ndim, int64_t *shape);

/* A new contiguous CPU tensor holding tensor `name` in its own dtype. */
TSR_API tsr_status tsr_safetensors_read(const tsr_safetensors_t *st, const char *name,
                                        tsr_tensor **out);
/* As tsr_safetensors_read, converted to `dt`: between F32, BF16 and F16 (rounding to nearest
 * even), and between I32 and I64 (TSR_EINVAL naming the element when a value does not fit). No
 * conversion between floats and integers. */
TSR_API tsr_status tsr_safetensors_read_as(const tsr_safetensors_t *st, const char *name,
                                           tsr_dtype dt, tsr_tensor **out);
/* Copies tensor `name` into `dst` (any strides). The dtype and the shape must match exactly; the
 * error names the tensor and both. */
TSR_API tsr_status tsr_safetensors_read_into(const tsr_safetensors_t *st, const char *name,
                                             tsr_tensor *dst);

/* The bytes of tensor `name` as stored (row-major, little-endian, the file's dtype) in *data,
 * inside the file's read-only mapping and valid until tsr_safetensors_close, and their count in
 * *nbytes: for reading part of a tensor without copying all of it. */
TSR_API tsr_status tsr_safetensors_bytes(const tsr_safetensors_t *st, const char *name,
                                         const void **data, size_t *nbytes);

/* The value of metadata `key`, or NULL when the file has no such entry. */
TSR_API const char *tsr_safetensors_meta(const tsr_safetensors_t *st, const char *key);
/* Number of metadata entries, and key `i` of them in the file's order. */
TSR_API int tsr_safetensors_meta_count(const tsr_safetensors_t *st);
TSR_API const char *tsr_safetensors_meta_key(const tsr_safetensors_t *st, int i);

/* ---- safetensors: writing ---- */

/* Writes `n` tensors (any strides, CPU) under `names` (unique, not "__metadata__"), in the given
 * order, with `nmeta` metadata strings (may be 0 and NULL), atomically: the data goes to
 * `path.tmp.<pid>.<random>` beside `path`, is synced, and is renamed over `path` (a symlink at
 * `path` is replaced, never followed). On failure the temporary file is removed and an existing
 * `path` is left as it was. A replaced file keeps its mode; a new one gets 0666 less the umask.
 * After the rename, temporaries of `path` left by writers no longer running are removed. The header
 * is padded with spaces to a multiple of 8 bytes so that the data buffer starts aligned. */
TSR_API tsr_status tsr_safetensors_save(const char *path, int n, const char *const *names,
                                        const tsr_tensor *const *tensors, int nmeta,
                                        const char *const *meta_keys,
                                        const char *const *meta_values);

/* Writes `len` bytes to `path` as tsr_safetensors_save writes a file: a temporary beside it,
 * synced and renamed over it (a symlink at `path` is replaced, never followed), keeping the mode
 * of a file it replaces. For the other outputs of a run (traces). */
TSR_API tsr_status tsr_file_write_atomic(const char *path, const void *data, size_t len);

/* ---- checkpoints ---- */

/* A checkpoint is two safetensors files. The model file holds the full (unsharded) parameters
 * under their Hugging Face names, so a Hugging Face Llama checkpoint loads as it is and a Tessera
 * checkpoint loads into transformers. The optimizer file holds `<name>.exp_avg` and
 * `<name>.exp_avg_sq` for every parameter and the metadata `step` (decimal) and
 * `format` = TSR_CHECKPOINT_OPTIM_FORMAT. Both files carry `step` and `checkpoint`, an id of the
 * save that wrote them (a hash of the step and both files' tensors): a model file and an
 * optimizer file are one checkpoint when both agree (tsr_checkpoint_pair). Loading either is all
 * or nothing: the whole file is checked against the expected names, shapes and dtypes, and every
 * float value for NaN and Inf, before any tensor is written. */
#define TSR_CHECKPOINT_OPTIM_FORMAT "tessera-adamw-v1"

typedef struct tsr_checkpoint_opts {
  /* fnmatch(3) patterns of tensor names in the file that loading skips instead of rejecting as
   * unexpected, e.g. "model.layers.*.self_attn.rotary_emb.inv_freq", or "lm_head.weight" for a
   * model with tied embeddings. */
  int n_ignore;
  const char *const *ignore;
} tsr_checkpoint_opts;

/* Patterns for the buffers Hugging Face Llama checkpoints may carry that are not parameters
 * (rotary inverse frequencies). */
TSR_API extern const char *const tsr_checkpoint_hf_buffers[];
TSR_API extern const int tsr_checkpoint_hf_buffers_count;

/* The optimizer file that goes with `model_path`: its ".safetensors" suffix replaced by
 * ".optim.safetensors", or ".optim.safetensors" appended when it has no such suffix. TSR_EINVAL
 * when `buf` is too small. */
TSR_API tsr_status tsr_checkpoint_optim_path(const char *model_path, char *buf, size_t len);

/* Saves parameters to `model_path` and optimizer state to `optim_path` (NULL: derived by
 * tsr_checkpoint_optim_path). Parameters are written in their dtype, optimizer state in its own.
 * Both files are written completely to temporaries beside them and synced before either is
 * published, so that a failed or interrupted write leaves the previous checkpoint as it was;
 * then the optimizer file is renamed into place (the commit point) and the model file after it.
 * A kill between the two renames leaves the new optimizer file beside the old model file and
 * the new model file's temporary: tsr_checkpoint_pair finds it. After a save, temporaries of
 * both names left by writers no longer running are removed. A replaced file keeps its mode.
 * `exp_avg` and `exp_avg_sq` may both be NULL to write the model file only. */
TSR_API tsr_status tsr_checkpoint_save(const char *model_path, const char *optim_path, int n,
                                       const char *const *names, const tsr_tensor *const *params,
                                       const tsr_tensor *const *exp_avg,
                                       const tsr_tensor *const *exp_avg_sq, int64_t step);

/* Checks that the optimizer file `optim_path` and the model file `model_path` are one
 * checkpoint (the same `step` and `checkpoint` id; files without ids, from before the id, pair by
 * step) and gives in *model_out (malloc'd) the model file to load with it: `model_path`, or, when
 * a save was killed between publishing the optimizer file and the model file, the complete
 * temporary `model_path.tmp.*` of that save. A pair from different saves is TSR_EINVAL naming
 * both files, both steps and both ids. Reads only. */
TSR_API tsr_status tsr_checkpoint_pair(const char *model_path, const char *optim_path,
                                       char **model_out);

/* Loads `n` parameters by name into `params` (CPU, any strides). Each must be in the file with
 * exactly the tensor's shape; F32, BF16 and F16 in the file convert to the tensor's float dtype.
 * A tensor of the file that is not asked for is an error (the first few are listed) unless it
 * matches a pattern of `opts` (NULL: none). */
TSR_API tsr_status tsr_checkpoint_load_model(const char *path, int n, const char *const *names,
                                             tsr_tensor *const *params,
                                             const tsr_checkpoint_opts *opts);

/* Loads the optimizer state of `n` parameters and the step it was saved at, with the strictness
 * of tsr_checkpoint_load_model and no ignore patterns. */
TSR_API tsr_status tsr_checkpoint_load_optim(const char *path, int n, const char *const *names,
                                             tsr_tensor *const *exp_avg,
                                             tsr_tensor *const *exp_avg_sq, int64_t *step);

/* ---- training data ---- */

/* A source of token batches (see tsr_data_open). */
typedef struct tsr_data_t tsr_data_t;

/* Opens a data source for global batches of `batch` rows of `seq_len` tokens with ids below
 * `vocab_size`. `source` is one of
 *   synthetic          pseudo-random rows with a learnable rule (below);
 *   text:PATH          the bytes of a file are the tokens (vocab_size must be at least 256);
 *   tokens:PATH        a flat file of little-endian uint16 token ids;
 *   tokens32:PATH      the same with uint32 ids;
 *   safetensors:PATH   tensors `input_ids` and `labels`, I32 or I64, shape [N, seq_len]; other
 *                      tensors in the file are ignored.
 * PATH is used as given. Files are validated here, completely: every id of a token or
 * safetensors file is checked against `vocab_size` (labels may also be -100, the ignore index).
 *
 * Step k's batch depends on (seed, k) only:
 *   synthetic: row b draws its first token uniformly; each next token is, with probability 7/8,
 *     (a * previous + c) mod vocab_size, and otherwise uniform; a (coprime with vocab_size, so the
 *     rule is a permutation of the tokens) and c come from the seed.
 *     The rule is the same for every step, so a model can learn it and its loss falls (the
 *     floor is about the entropy of the 1/8 noise).
 *   text, tokens: row b is seq_len + 1 consecutive tokens at a position drawn uniformly from the
 *     file; inputs are the first seq_len, labels the last seq_len.
 *   safetensors: rows k*batch .. k*batch + batch - 1 of the file, wrapping around; the seed is
 *     not used (the file fixes the order). */
TSR_API tsr_status tsr_data_open(const char *source, int vocab_size, int batch, int seq_len,
                                 uint64_t seed, tsr_data_t **out);
/* Fills the global batch of the current step, each (batch, seq_len) row-major, and moves to the
 * next step. Every rank calls it alike and takes its own shard. */
TSR_API tsr_status tsr_data_next(tsr_data_t *d, int32_t *input_ids, int32_t *labels);
/* The step whose batch the next tsr_data_next returns (0 after open), and a way to set it (>= 0),
 * e.g. when resuming from a checkpoint saved at that step. */
TSR_API int64_t tsr_data_step(const tsr_data_t *d);
TSR_API void tsr_data_set_step(tsr_data_t *d, int64_t step);
/* NULL is a no-op. */
TSR_API void tsr_data_close(tsr_data_t *d);

/* Document masking ([data] mask = document, docs/data.md), since ABI 1.3. Reads the document
 * index at `index_path` (tessera/doc_index.h; checked whole, and against the token file) of a
 * tokens: or tokens32: source; TSR_EINVAL naming the source for any other kind, TSR_EIO or
 * TSR_EINVAL naming the index when it is missing or does not pair with the file. From then on
 * tsr_data_next ignores (-100) the label of every input token that ends a document: the next
 * document is not predicted from this one. */
TSR_API tsr_status tsr_data_use_documents(tsr_data_t *d, const char *index_path);
/* For the batch the last tsr_data_next returned, each (batch, seq_len) row-major: seg[b, i] the
 * document of input token i, numbered from 0 in each row, and pos[b, i] its position in it, from
 * 0 at the document's first token or at the row's start. TSR_EINVAL before tsr_data_next or
 * without tsr_data_use_documents. */
TSR_API tsr_status tsr_data_documents(const tsr_data_t *d, int32_t *seg, int32_t *pos);

/* ---- dumps ---- */

#define TSR_DUMP_FORMAT "tessera-dump-v1"

/* Writes `n` tensors converted to f32 under the given names ("logits", "loss", "grad.<name>",
 * "after.<name>"), with metadata format = TSR_DUMP_FORMAT. */
TSR_API tsr_status tsr_dump_save(const char *path, int n, const char *const *names,
                                 const tsr_tensor *const *tensors);

/* Compares dumps `a` and `b` tensor by tensor. An element agrees when x == y, when both are NaN,
 * or when both are finite and |x - y| <= atol + rtol * |y| (y from `b`): a NaN or an infinity
 * agrees only with the same non-finite value at the same place. A tensor is bad when it is missing
 * from either file, has another shape, or has an element that disagrees. `*nbad` gets the number
 * of bad tensors and `report` (may be NULL) one line per bad tensor with its worst element, cut
 * to fit `report_len`. Returns TSR_OK when the files could be compared, whatever the outcome. */
TSR_API tsr_status tsr_dump_compare(const char *a, const char *b, double rtol, double atol,
                                    char *report, size_t report_len, int *nbad);

#ifdef __cplusplus
}
#endif
#endif
