/* The document index `tessera tokenize` writes beside a token file (docs/tokenize.md): where
 * each document of the token stream starts, so that a reader can find document boundaries and
 * the tokens the tokenizer added around each document's text.
 *
 * The file is little-endian:
 *
 *   offset  size  field
 *        0     8  magic "TSRDOCS1"
 *        8     4  u32 version, 1
 *       12     4  u32 token_bytes: 2 (the `tokens:` format) or 4 (`tokens32:`)
 *       16     8  u64 ndocs
 *       24     8  u64 ntokens: the token file holds ntokens * token_bytes bytes
 *       32     4  u32 head: tokens before each document's text (the post-processor's, as BOS)
 *       36     4  u32 tail: tokens after it (the post-processor's, then the EOS when appended)
 *       40     4  i32 eos: the id appended after each document, or -1
 *       44    20  reserved, zero
 *       64     8  u64 offsets[ndocs + 1]: offsets[i] is the first token of document i (its
 *                 head), offsets[ndocs] = ntokens; document i is [offsets[i], offsets[i + 1])
 *
 * Every document holds at least head + tail tokens.
 */
#ifndef TESSERA_DOC_INDEX_H
#define TESSERA_DOC_INDEX_H

#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TSR_DOC_INDEX_MAGIC   "TSRDOCS1"
#define TSR_DOC_INDEX_VERSION 1
#define TSR_DOC_INDEX_HEADER  64

typedef struct tsr_doc_index {
  uint32_t token_bytes, head, tail;
  int32_t eos;
  uint64_t ndocs, ntokens;
  const uint64_t *offsets; /* ndocs + 1 entries, in the mapping (little-endian hosts) */
  void *map;
  size_t map_len;
} tsr_doc_index;

/* Maps and checks `path`: magic, version, size, offsets increasing from 0 to ntokens, every
 * document at least head + tail long; with `tokens_path` (may be NULL) also that the token file
 * holds ntokens tokens. TSR_EIO when unreadable, TSR_EINVAL naming the file and what is wrong. */
TSR_API tsr_status tsr_doc_index_open(const char *path, const char *tokens_path,
                                      tsr_doc_index *out);
/* Unmaps; a zeroed index is a no-op. */
TSR_API void tsr_doc_index_close(tsr_doc_index *ix);

#ifdef __cplusplus
}
#endif
#endif
