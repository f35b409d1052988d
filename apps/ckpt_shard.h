/* Sharded checkpoints (docs/training.md, "Sharded checkpoints"): a folder holding one
 * safetensors file per rank that wrote something and index.json, which names every tensor's
 * global shape and dtype and the slices (offsets and shape per dim) each file holds. This part
 * knows nothing of training: the index, the slice reads, the folders of a checkpoint dir. */
#ifndef TESSERA_APP_CKPT_SHARD_H
#define TESSERA_APP_CKPT_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/io.h"
#include "tessera/tensor.h"

#define TSR_CKPT_FORMAT "tessera-sharded-v1"
#define TSR_CKPT_INDEX  "index.json"

/* One box of a tensor that one file holds, contiguous and row-major in that file. */
typedef struct tsr_ckpt_slice {
  int file; /* index into tsr_ckpt_index.files */
  int64_t off[TSR_MAX_DIMS], shape[TSR_MAX_DIMS];
} tsr_ckpt_slice;

typedef struct tsr_ckpt_tensor {
  char *name;
  tsr_dtype dtype;
  int ndim;
  int64_t shape[TSR_MAX_DIMS];
  int nslices, cap;
  tsr_ckpt_slice *slices;
} tsr_ckpt_tensor;

typedef struct tsr_ckpt_index {
  int64_t step, data_step;
  int world;        /* ranks of the job that saved it */
  char mesh[256];   /* "pp=2, dp=2, tp=2", for messages */
  int nfiles, fcap; /* file names, relative to the folder */
  char **files;
  int n, cap;
  tsr_ckpt_tensor *tensors;
} tsr_ckpt_index;

/* Building an index: a tensor (returns its index in *i), a file, a slice of tensor i in file f. */
tsr_status tsr_ckpt_index_add_tensor(tsr_ckpt_index *ix, const char *name, tsr_dtype dt, int ndim,
                                     const int64_t *shape, int *i);
tsr_status tsr_ckpt_index_add_file(tsr_ckpt_index *ix, const char *file, int *f);
tsr_status tsr_ckpt_index_add_slice(tsr_ckpt_index *ix, int i, int f, const int64_t *off,
                                    const int64_t *shape);
/* Writes folder/index.json (a temporary synced and renamed over it). */
tsr_status tsr_ckpt_index_write(const char *folder, const tsr_ckpt_index *ix);
/* Reads and checks folder/index.json: the format, every dtype, shape and slice inside its
 * tensor, file names without '/'. TSR_EINVAL naming the file and what is wrong. */
tsr_status tsr_ckpt_index_read(const char *folder, tsr_ckpt_index *ix);
void tsr_ckpt_index_free(tsr_ckpt_index *ix);
const tsr_ckpt_tensor *tsr_ckpt_index_find(const tsr_ckpt_index *ix, const char *name);

/* Reads boxes of the index's tensors out of the folder's files, opening each file once, when
 * first needed. */
typedef struct tsr_ckpt_reader {
  const char *folder;
  const tsr_ckpt_index *ix;
  tsr_safetensors_t **open; /* (ix->nfiles) NULL until opened */
  int64_t files_opened;
  int64_t bytes_read; /* bytes copied out of the files */
} tsr_ckpt_reader;

tsr_status tsr_ckpt_reader_init(tsr_ckpt_reader *r, const char *folder, const tsr_ckpt_index *ix);
void tsr_ckpt_reader_close(tsr_ckpt_reader *r);
/* Fills `dst` (any device and strides; dtype and rank of the tensor) with the box of tensor
 * `name` that starts at global offsets `start` and has dst's shape, from the slices that
 * intersect it: only those files are opened and only the intersections copied. TSR_EINVAL
 * naming the tensor when the index lacks it, its rank or dtype differ, or the slices leave part
 * of the box uncovered. */
tsr_status tsr_ckpt_read_box(tsr_ckpt_reader *r, const char *name, const int64_t *start,
                             tsr_tensor *dst);

/* The step of a complete checkpoint folder name "step-NNNNNN" (at least 6 digits), or -1. */
int64_t tsr_ckpt_folder_step(const char *name);
/* The newest folder of `dir` that holds a readable index, in `out` (its path), and its step;
 * out[0] == '\0' and *step = -1 when there is none. */
void tsr_ckpt_latest(const char *dir, char *out, size_t len, int64_t *step);
/* True when `path` is a folder with an index.json. */
bool tsr_ckpt_is_folder(const char *path);
/* Removes a folder of plain files and the folder; missing is fine. */
tsr_status tsr_ckpt_remove_folder(const char *path);
/* fsync of a directory, so that a rename inside it is durable (best effort). */
void tsr_ckpt_sync_dir(const char *path);
/* Keeps the newest `keep` step folders of `dir` (0 keeps all) and removes the temporaries
 * (".step-*.tmp") that killed saves left. */
void tsr_ckpt_prune(const char *dir, int64_t keep);

#endif
