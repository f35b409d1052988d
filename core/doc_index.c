/* The document index of a token file (tessera/doc_index.h): mapped, and checked whole when
 * opened, so that a reader can trust every offset afterwards. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tessera/doc_index.h"

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const unsigned char *p) {
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static tsr_status check(const char *path, const char *tokens_path, tsr_doc_index *ix) {
  const unsigned char *p = ix->map;
  size_t size = ix->map_len;
  if (size < TSR_DOC_INDEX_HEADER || memcmp(p, TSR_DOC_INDEX_MAGIC, 8))
    return TSR_ERROR(TSR_EINVAL,
                     "document index %s: not an index (no %s header); write one with "
                     "tessera tokenize",
                     path, TSR_DOC_INDEX_MAGIC);
  if (le32(p + 8) != TSR_DOC_INDEX_VERSION)
    return TSR_ERROR(TSR_EINVAL, "document index %s: version %u; this build reads version %d", path,
                     le32(p + 8), TSR_DOC_INDEX_VERSION);
  ix->token_bytes = le32(p + 12);
  ix->ndocs = le64(p + 16);
  ix->ntokens = le64(p + 24);
  ix->head = le32(p + 32);
  ix->tail = le32(p + 36);
  ix->eos = (int32_t)le32(p + 40);
  if (ix->token_bytes != 2 && ix->token_bytes != 4)
    return TSR_ERROR(TSR_EINVAL, "document index %s: token_bytes is %u; expected 2 or 4", path,
                     ix->token_bytes);
  if (ix->ndocs > (size - TSR_DOC_INDEX_HEADER) / 8 ||
      size != TSR_DOC_INDEX_HEADER + 8 * (ix->ndocs + 1))
    return TSR_ERROR(TSR_EINVAL,
                     "document index %s: %zu bytes, but %llu documents need %llu; the file is "
                     "cut short or not an index",
                     path, size, (unsigned long long)ix->ndocs,
                     (unsigned long long)(TSR_DOC_INDEX_HEADER + 8 * (ix->ndocs + 1)));
  /* The format is little-endian and the offsets are read in place. */
  const uint16_t one = 1;
  if (*(const unsigned char *)&one != 1)
    return TSR_ERROR(TSR_ENOTSUP, "document index %s: this host is big-endian", path);
  ix->offsets = (const uint64_t *)(p + TSR_DOC_INDEX_HEADER);
  uint64_t min = (uint64_t)ix->head + ix->tail;
  if (ix->offsets[0] != 0 || ix->offsets[ix->ndocs] != ix->ntokens)
    return TSR_ERROR(TSR_EINVAL,
                     "document index %s: offsets run from %llu to %llu; expected 0 to ntokens "
                     "%llu",
                     path, (unsigned long long)ix->offsets[0],
                     (unsigned long long)ix->offsets[ix->ndocs], (unsigned long long)ix->ntokens);
  for (uint64_t i = 0; i < ix->ndocs; i++)
    if (ix->offsets[i + 1] < ix->offsets[i] + min)
      return TSR_ERROR(TSR_EINVAL,
                       "document index %s: document %llu has %lld tokens, fewer than head + tail "
                       "= %llu",
                       path, (unsigned long long)i,
                       (long long)(ix->offsets[i + 1] - ix->offsets[i]), (unsigned long long)min);
  if (tokens_path) {
    struct stat sb;
    if (stat(tokens_path, &sb) != 0)
      return TSR_ERROR(TSR_EIO, "token file %s: %s", tokens_path, strerror(errno));
    if ((uint64_t)sb.st_size != ix->ntokens * ix->token_bytes)
      return TSR_ERROR(TSR_EINVAL,
                       "token file %s: %lld bytes, but its index %s says %llu tokens of %u "
                       "bytes; the two files are not a pair",
                       tokens_path, (long long)sb.st_size, path, (unsigned long long)ix->ntokens,
                       ix->token_bytes);
  }
  return TSR_OK;
}

tsr_status tsr_doc_index_open(const char *path, const char *tokens_path, tsr_doc_index *out) {
  memset(out, 0, sizeof *out);
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0)
    return TSR_ERROR(TSR_EIO, "document index %s: cannot open: %s", path, strerror(errno));
  struct stat sb;
  tsr_status s = TSR_OK;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    s = TSR_ERROR(TSR_EIO, "document index %s: not a regular file", path);
  } else if (sb.st_size < TSR_DOC_INDEX_HEADER) {
    s = TSR_ERROR(TSR_EINVAL,
                  "document index %s: not an index (%lld bytes, shorter than the %d-byte "
                  "header); write one with tessera tokenize",
                  path, (long long)sb.st_size, TSR_DOC_INDEX_HEADER);
  } else {
    out->map_len = (size_t)sb.st_size;
    out->map = mmap(NULL, out->map_len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (out->map == MAP_FAILED) {
      out->map = NULL;
      s = TSR_ERROR(TSR_EIO, "document index %s: cannot map: %s", path, strerror(errno));
    } else {
      s = check(path, tokens_path, out);
    }
  }
  close(fd);
  if (s != TSR_OK) tsr_doc_index_close(out);
  return s;
}

void tsr_doc_index_close(tsr_doc_index *ix) {
  if (ix->map) munmap(ix->map, ix->map_len);
  memset(ix, 0, sizeof *ix);
}
