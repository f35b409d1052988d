/* Shared between safetensors.c, checkpoint.c, data.c and dump.c; not part of the public API. */
#ifndef TESSERA_IO_INTERNAL_H
#define TESSERA_IO_INTERNAL_H

#include <stdbool.h>

#include "tessera/io.h"

/* Checks that tensor `name` can be copied into `dst`: same shape, and the same dtype, or with
 * `convert` one tsr_safetensors_read_as converts. Writes nothing, so that loaders can check every
 * tensor before they touch any. */
tsr_status tsr_safetensors_check_into(const tsr_safetensors_t *st, const char *name,
                                      const tsr_tensor *dst, bool convert);

/* Copies tensor `name` into `dst` after tsr_safetensors_check_into. Allocates nothing when `dst`
 * is contiguous, so that once checked it cannot fail halfway through a load. */
tsr_status tsr_safetensors_copy_into(const tsr_safetensors_t *st, const char *name, tsr_tensor *dst,
                                     bool convert);

/* The dtypes of the safetensors format: name, element size, and the tsr_dtype or -1. */
typedef struct tsr_st_dtype_info {
  const char *name;
  size_t size;
  int tsr;
} tsr_st_dtype_info;
extern const tsr_st_dtype_info tsr_st_dtypes[];
extern const int tsr_st_dtype_count;
/* Index into tsr_st_dtypes of a tsr_dtype. */
int tsr_st_dtype_from_tsr(tsr_dtype dt);
/* The format is little-endian and the reader and writer copy raw bytes. */
bool tsr_st_host_is_little_endian(void);

/* ---- writing in two steps (safetensors_write.c) ---- */

/* Fault injection for the tests (docs/testing.md): the points a checkpoint save passes, in
 * order. With TESSERA_TEST_SAVE_KILL set to a point's name in the environment, the save kills its
 * own process with SIGKILL on reaching it, as a power cut or the OOM killer would; a test then
 * checks what a later run makes of the files left behind. Unset (always, outside the tests),
 * tsr_save_point_reached does nothing. */
typedef enum tsr_save_point {
  TSR_SAVE_NONE = 0,
  TSR_SAVE_OPTIM_HALF,      /* "optim-half": the optimizer temporary half written (flushed) */
  TSR_SAVE_OPTIM_TEMP,      /* "optim-temp": it complete and synced */
  TSR_SAVE_MODEL_HALF,      /* "model-half": the model temporary half written */
  TSR_SAVE_MODEL_TEMP,      /* "model-temp": both temporaries complete, nothing published */
  TSR_SAVE_OPTIM_PUBLISHED, /* "optim-published": the commit point passed, the model not yet */
  TSR_SAVE_PUBLISHED,       /* "published": both renamed, stale temporaries not yet removed */
} tsr_save_point;
void tsr_save_point_reached(tsr_save_point p);

/* Writes the file tsr_safetensors_save would write to a new temporary `path.tmp.<pid>.<random>`
 * beside `path`, synced, and gives its name (malloc'd) in *tmp; nothing is published. On failure
 * the temporary is removed. `half` (TSR_SAVE_NONE for none) is reached with the header and half
 * the tensors written and flushed. */
tsr_status tsr_st_write_temp(const char *path, int n, const char *const *names,
                             const tsr_tensor *const *tensors, int nmeta,
                             const char *const *meta_keys, const char *const *meta_values,
                             tsr_save_point half, char **tmp);
/* Renames `tmp` over `path` and syncs the directory; on failure removes `tmp`. */
tsr_status tsr_st_publish(const char *tmp, const char *path);
/* True when the directory entry `name` is a temporary of `path` (`BASE.tmp.<pid>.<8 hex>`, BASE
 * the last component of `path`); `*pid` (may be NULL) gets the writer's pid. */
bool tsr_st_temp_of(const char *path, const char *name, long *pid);
/* Removes the temporaries of `path` left by writers that are no longer running (killed in the
 * middle of a save). Those of live processes are kept. */
void tsr_st_remove_stale(const char *path);

/* Fails naming the tensor and the element when a float tensor `name` holds NaN or Inf. */
tsr_status tsr_safetensors_check_finite(const tsr_safetensors_t *st, const char *name);

#endif
