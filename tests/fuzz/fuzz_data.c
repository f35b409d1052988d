/* libFuzzer target: the training-data readers. Input: 4 bytes of parameters, then the data
 * file's bytes. Byte 0 picks the kind (text:, tokens:, tokens32:, safetensors:), byte 1 the
 * vocabulary size, bytes 2 and 3 the batch (1..4) and the sequence length (1..32); the reader
 * opens the file (validating every id against the vocabulary) and serves three batches, the
 * last after a jump to a far step. Refusals are fine; memory errors, undefined behaviour, leaks
 * and hangs are not. */
#include <stdint.h>
#include <stdio.h>

#include "fuzz_util.h"
#include "tessera/io.h"
#include "tessera/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  static const char *const kinds[] = {"text", "tokens", "tokens32", "safetensors"};
  static const int vocabs[] = {1, 2, 255, 256, 257, 1000, 32000, 65536};
  const char *kind = kinds[data[0] % 4];
  int vocab = vocabs[data[1] % 8];
  int batch = 1 + data[2] % 4, seq = 1 + data[3] % 32;
  const char *path = fuzz_file(data + 4, size - 4, ".data");
  if (!path) return 0;
  char source[600];
  snprintf(source, sizeof source, "%s:%s", kind, path);
  tsr_data_t *d = NULL;
  if (tsr_data_open(source, vocab, batch, seq, data[1], &d) != TSR_OK) return 0;
  int32_t ids[4 * 32], labels[4 * 32];
  for (int k = 0; k < 3; k++) {
    if (k == 2) tsr_data_set_step(d, (int64_t)1 << 40);
    if (tsr_data_next(d, ids, labels) != TSR_OK) break;
  }
  tsr_data_close(d);
  tsr_clear_error();
  return 0;
}
