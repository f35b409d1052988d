/* libFuzzer target: the safetensors reader (header JSON, offsets, dtypes, shapes, metadata) and
 * the conversions a checkpoint load makes. Input: the file's bytes. Every tensor a file that
 * opens lists is read in its own dtype and converted as a checkpoint would be; the metadata is
 * read back. Refusals are fine; memory errors, undefined behaviour, leaks and hangs are not. */
#include <stdint.h>

#include "fuzz_util.h"
#include "tessera/io.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *path = fuzz_file(data, size, ".safetensors");
  if (!path) return 0;
  tsr_safetensors_t *st = NULL;
  if (tsr_safetensors_open(path, &st) != TSR_OK) return 0;
  for (int i = 0; i < tsr_safetensors_meta_count(st); i++)
    (void)tsr_safetensors_meta(st, tsr_safetensors_meta_key(st, i));
  for (int i = 0; i < tsr_safetensors_count(st); i++) {
    const char *name = tsr_safetensors_name(st, i);
    (void)tsr_safetensors_has(st, name);
    (void)tsr_safetensors_dtype_str(st, name);
    tsr_dtype dt;
    int ndim = 0;
    int64_t shape[TSR_MAX_DIMS];
    if (tsr_safetensors_info(st, name, &dt, &ndim, shape) != TSR_OK) continue;
    tsr_tensor *t = NULL;
    if (tsr_safetensors_read(st, name, &t) == TSR_OK) tsr_tensor_free(t);
    /* a checkpoint converts floats to f32 and ids to i64 */
    bool is_float = dt == TSR_F32 || dt == TSR_BF16 || dt == TSR_F16;
    t = NULL;
    if (tsr_safetensors_read_as(st, name, is_float ? TSR_F32 : TSR_I64, &t) == TSR_OK)
      tsr_tensor_free(t);
  }
  tsr_safetensors_close(st);
  tsr_clear_error();
  return 0;
}
