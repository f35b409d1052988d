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

#endif
