/* Shared by the fuzz targets: the input written to a file of this process, since the readers
 * under test take paths (the job file, safetensors, data files) as `tessera run` gives them. */
#ifndef TESSERA_FUZZ_UTIL_H
#define TESSERA_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Writes `size` bytes of `data` to a file named for this process and `suffix` under $TMPDIR (or
 * /tmp) and returns its path (static storage), or NULL when it cannot be written. */
static inline const char *fuzz_file(const uint8_t *data, size_t size, const char *suffix) {
  static char path[512];
  const char *dir = getenv("TMPDIR");
  snprintf(path, sizeof path, "%s/tessera-fuzz-%ld%s", dir && *dir ? dir : "/tmp", (long)getpid(),
           suffix);
  FILE *f = fopen(path, "wb");
  if (!f) return NULL;
  size_t n = size ? fwrite(data, 1, size, f) : 0;
  if (fclose(f) != 0 || n != size) return NULL;
  return path;
}

#endif
