/* Training data sources. A batch is a pure function of (seed, step), so every rank computes the
 * same global batch without communication and a resumed run sees the batches it would have. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_internal.h"
#include "tessera/doc_index.h"

/* The ignore index of torch.nn.functional.cross_entropy. */
#define IGNORE_INDEX (-100)

typedef enum data_kind {
  DATA_SYNTHETIC,
  DATA_TEXT,     /* one byte per token */
  DATA_TOKENS16, /* little-endian uint16 */
  DATA_TOKENS32, /* little-endian uint32 */
  DATA_ROWS,     /* input_ids / labels rows from safetensors */
} data_kind;

struct tsr_data_t {
  data_kind kind;
  char *path;
  int vocab, batch, seq_len;
  uint64_t seed;
  int64_t step;
  /* text and tokens: the mapped file */
  void *map;
  size_t map_len;
  int64_t ntokens;
  /* safetensors: every row, already validated */
  int32_t *ids, *labels;
  int64_t nrows;
  /* synthetic: next = (mul * token + add) mod vocab */
  uint64_t mul, add;
  /* document masking: the index, and where each row of the last batch starts in the file */
  bool docs;
  tsr_doc_index index;
  int64_t *starts; /* (batch) */
  bool have_batch;
};

/* splitmix64's finaliser: a bijective mix with good avalanche. */
static uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Counter-based: the value at (seed, stream, counter) needs no state and no earlier draws. */
static uint64_t rng_at(uint64_t seed, uint64_t stream, uint64_t counter) {
  return mix64(mix64(seed ^ mix64(stream)) + counter);
}

/* Uniform in [0, n); the modulo bias is below n / 2^64. */
static uint64_t below(uint64_t x, uint64_t n) {
  return x % n;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

void tsr_data_close(tsr_data_t *d) {
  if (!d) return;
  if (d->map) munmap(d->map, d->map_len);
  tsr_doc_index_close(&d->index);
  free(d->starts);
  free(d->ids);
  free(d->labels);
  free(d->path);
  free(d);
}

static tsr_status map_file(tsr_data_t *d, size_t esize) {
  /* O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer */
  int fd = open(d->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return TSR_ERROR(TSR_EIO, "data file %s: cannot open: %s", d->path, strerror(errno));
  tsr_status s = TSR_OK;
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    s = TSR_ERROR(TSR_EIO,
                  "data file %s: not a regular file (a directory, FIFO or device); give "
                  "a file of tokens",
                  d->path);
    goto cleanup;
  }
  size_t size = (size_t)sb.st_size;
  if (size % esize) {
    s = TSR_ERROR(TSR_EINVAL, "data file %s: %zu bytes is not a whole number of %zu-byte tokens",
                  d->path, size, esize);
    goto cleanup;
  }
  d->ntokens = (int64_t)(size / esize);
  if (d->ntokens < (int64_t)d->seq_len + 1) {
    s = TSR_ERROR(TSR_EINVAL,
                  "data file %s: %lld tokens, but a row needs seq_len + 1 = %d; use a "
                  "longer file or a shorter [data] seq_len",
                  d->path, (long long)d->ntokens, d->seq_len + 1);
    goto cleanup;
  }
  d->map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
  if (d->map == MAP_FAILED) {
    d->map = NULL;
    s = TSR_ERROR(TSR_EIO, "data file %s: cannot map %zu bytes: %s", d->path, size,
                  strerror(errno));
    goto cleanup;
  }
  d->map_len = size;
cleanup:
  close(fd);
  return s;
}

static int64_t token_at(const tsr_data_t *d, int64_t i) {
  const unsigned char *p = d->map;
  switch (d->kind) {
    case DATA_TEXT:
      return p[i];
    case DATA_TOKENS16:
      return (int64_t)p[2 * i] | (int64_t)p[2 * i + 1] << 8;
    default:
      return (int64_t)((uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
                       (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24);
  }
}

/* The whole file is checked once here, so that a bad id fails at start-up and not at step
 * 40 000; one pass over a token file costs less than reading it. */
static tsr_status open_tokens(tsr_data_t *d) {
  size_t esize = d->kind == DATA_TEXT ? 1 : d->kind == DATA_TOKENS16 ? 2 : 4;
  if (d->kind == DATA_TEXT && d->vocab < 256)
    return TSR_ERROR(TSR_EINVAL,
                     "data source text:%s uses bytes as tokens and needs vocab_size >= "
                     "256, got %d; raise [model] vocab_size",
                     d->path, d->vocab);
  TSR_CHECK(map_file(d, esize));
  if (d->kind == DATA_TEXT) return TSR_OK;
  for (int64_t i = 0; i < d->ntokens; i++) {
    int64_t id = token_at(d, i);
    if (id >= d->vocab)
      return TSR_ERROR(TSR_EINVAL,
                       "data file %s: token %lld (byte offset %lld) is %lld, not below "
                       "vocab_size %d",
                       d->path, (long long)i, (long long)i * (long long)esize, (long long)id,
                       d->vocab);
  }
  return TSR_OK;
}

static tsr_status rows_tensor(tsr_data_t *d, const tsr_safetensors_t *st, const char *name,
                              int64_t *shape) {
  const char *dts = tsr_safetensors_dtype_str(st, name);
  if (!dts)
    return TSR_ERROR(TSR_EINVAL,
                     "data file %s: no tensor '%s'; a safetensors data file holds "
                     "input_ids and labels, [N, seq_len] int32",
                     d->path, name);
  if (strcmp(dts, "I32") != 0 && strcmp(dts, "I64") != 0)
    return TSR_ERROR(TSR_EINVAL, "data file %s: tensor '%s' is %s; expected I32 (or I64)", d->path,
                     name, dts);
  int ndim;
  TSR_CHECK(tsr_safetensors_info(st, name, NULL, &ndim, shape));
  if (ndim != 2 || shape[0] < 1)
    return TSR_ERROR(TSR_EINVAL, "data file %s: tensor '%s' must be [N, seq_len] with N >= 1",
                     d->path, name);
  if (shape[1] != d->seq_len)
    return TSR_ERROR(TSR_EINVAL,
                     "data file %s: tensor '%s' has rows of %lld tokens but [data] "
                     "seq_len is %d",
                     d->path, name, (long long)shape[1], d->seq_len);
  return TSR_OK;
}

/* Moves tensor `name` into a malloc'd i32 array and checks every value. */
static tsr_status rows_load(tsr_data_t *d, const tsr_safetensors_t *st, const char *name,
                            bool is_labels, int32_t **out) {
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_safetensors_read_as(st, name, TSR_I32, &t));
  tsr_status s = TSR_OK;
  size_t bytes = tsr_tensor_nbytes(t);
  const int32_t *p = tsr_tensor_data(t);
  for (int64_t i = 0; i < tsr_tensor_numel(t); i++) {
    bool ok = (p[i] >= 0 && p[i] < d->vocab) || (is_labels && p[i] == IGNORE_INDEX);
    if (!ok) {
      s = TSR_ERROR(TSR_EINVAL, "data file %s: %s[%lld, %lld] is %d; expected 0 .. %d%s", d->path,
                    name, (long long)(i / d->seq_len), (long long)(i % d->seq_len), (int)p[i],
                    d->vocab - 1, is_labels ? " or -100 (ignored)" : "");
      goto cleanup;
    }
  }
  if (!(*out = malloc(bytes ? bytes : 1))) {
    s = TSR_ERROR(TSR_ENOMEM, "data file %s: out of memory for %s", d->path, name);
    goto cleanup;
  }
  memcpy(*out, p, bytes);
cleanup:
  tsr_tensor_free(t);
  return s;
}

static tsr_status open_rows(tsr_data_t *d) {
  tsr_safetensors_t *st = NULL;
  tsr_status s = tsr_safetensors_open(d->path, &st);
  if (s != TSR_OK) return tsr_error_prefix(s, "data source safetensors:%s", d->path);
  int64_t si[TSR_MAX_DIMS], sl[TSR_MAX_DIMS];
  TSR_CHECK_GOTO(rows_tensor(d, st, "input_ids", si), s);
  TSR_CHECK_GOTO(rows_tensor(d, st, "labels", sl), s);
  if (si[0] != sl[0]) {
    s = TSR_ERROR(TSR_EINVAL, "data file %s: input_ids has %lld rows and labels %lld", d->path,
                  (long long)si[0], (long long)sl[0]);
    goto cleanup;
  }
  d->nrows = si[0];
  TSR_CHECK_GOTO(rows_load(d, st, "input_ids", false, &d->ids), s);
  TSR_CHECK_GOTO(rows_load(d, st, "labels", true, &d->labels), s);
cleanup:
  tsr_safetensors_close(st);
  return s;
}

/* A multiplier coprime with the vocabulary makes the rule a permutation: every token has one
 * successor and one predecessor, so no token is a dead end. */
static void synthetic_rule(tsr_data_t *d) {
  uint64_t v = (uint64_t)d->vocab;
  d->mul = 1;
  d->add = below(rng_at(d->seed, UINT64_MAX, 1), v);
  if (v < 3) return;
  uint64_t m = 2 + below(rng_at(d->seed, UINT64_MAX, 0), v - 2);
  while (gcd(m, v) != 1) m = m + 1 < v ? m + 1 : 2;
  d->mul = m;
}

static bool has_prefix(const char *s, const char *prefix, const char **rest) {
  size_t n = strlen(prefix);
  if (strncmp(s, prefix, n) != 0) return false;
  *rest = s + n;
  return true;
}

tsr_status tsr_data_open(const char *source, int vocab_size, int batch, int seq_len, uint64_t seed,
                         tsr_data_t **out) {
  *out = NULL;
  if (!source) return TSR_ERROR(TSR_EINVAL, "data source: NULL");
  if (vocab_size < 1 || batch < 1 || seq_len < 1)
    return TSR_ERROR(TSR_EINVAL,
                     "data source %s: vocab_size (%d), batch_size (%d) and seq_len "
                     "(%d) must be at least 1",
                     source, vocab_size, batch, seq_len);
  const char *path = NULL;
  data_kind kind;
  if (strcmp(source, "synthetic") == 0)
    kind = DATA_SYNTHETIC;
  else if (has_prefix(source, "text:", &path))
    kind = DATA_TEXT;
  else if (has_prefix(source, "tokens:", &path))
    kind = DATA_TOKENS16;
  else if (has_prefix(source, "tokens32:", &path))
    kind = DATA_TOKENS32;
  else if (has_prefix(source, "safetensors:", &path))
    kind = DATA_ROWS;
  else
    return TSR_ERROR(TSR_EINVAL,
                     "unknown data source '%s'; expected synthetic, text:PATH, "
                     "tokens:PATH (uint16), tokens32:PATH or safetensors:PATH",
                     source);
  if (path && !*path)
    return TSR_ERROR(TSR_EINVAL, "data source '%s' has no path after the ':'", source);
  tsr_data_t *d = calloc(1, sizeof *d);
  if (!d) return TSR_ERROR(TSR_ENOMEM, "data source %s: out of memory", source);
  d->kind = kind;
  d->vocab = vocab_size;
  d->batch = batch;
  d->seq_len = seq_len;
  d->seed = seed;
  tsr_status s = TSR_OK;
  if (path) {
    size_t n = strlen(path) + 1;
    if (!(d->path = malloc(n))) {
      s = TSR_ERROR(TSR_ENOMEM, "data source %s: out of memory", source);
      goto cleanup;
    }
    memcpy(d->path, path, n);
  }
  if (kind == DATA_SYNTHETIC)
    synthetic_rule(d);
  else if (kind == DATA_ROWS)
    TSR_CHECK_GOTO(open_rows(d), s);
  else
    TSR_CHECK_GOTO(open_tokens(d), s);
  *out = d;
  d = NULL;
cleanup:
  tsr_data_close(d);
  return s;
}

static void next_synthetic(const tsr_data_t *d, int32_t *ids, int32_t *labels) {
  uint64_t v = (uint64_t)d->vocab;
  for (int b = 0; b < d->batch; b++) {
    uint64_t stream = (uint64_t)d->step * (uint64_t)d->batch + (uint64_t)b;
    uint64_t tok = below(rng_at(d->seed, stream, 0), v);
    for (int i = 0; i < d->seq_len; i++) {
      uint64_t r = rng_at(d->seed, stream, (uint64_t)i + 1);
      /* Low 3 bits pick the 1-in-8 noise; the rest of the word picks the noise token. */
      uint64_t next = (r & 7) == 0 ? below(r >> 3, v) : (d->mul * tok + d->add) % v;
      ids[(size_t)b * d->seq_len + i] = (int32_t)tok;
      labels[(size_t)b * d->seq_len + i] = (int32_t)next;
      tok = next;
    }
  }
}

static void next_window(const tsr_data_t *d, int32_t *ids, int32_t *labels) {
  uint64_t starts = (uint64_t)(d->ntokens - d->seq_len); /* windows of seq_len + 1 */
  for (int b = 0; b < d->batch; b++) {
    uint64_t stream = (uint64_t)d->step * (uint64_t)d->batch + (uint64_t)b;
    int64_t pos = (int64_t)below(rng_at(d->seed, stream, 0), starts);
    if (d->starts) d->starts[b] = pos;
    for (int i = 0; i < d->seq_len; i++) {
      ids[(size_t)b * d->seq_len + i] = (int32_t)token_at(d, pos + i);
      labels[(size_t)b * d->seq_len + i] = (int32_t)token_at(d, pos + i + 1);
    }
  }
}

static void next_rows(const tsr_data_t *d, int32_t *ids, int32_t *labels) {
  size_t l = (size_t)d->seq_len;
  for (int b = 0; b < d->batch; b++) {
    int64_t row =
        (int64_t)(((uint64_t)d->step * (uint64_t)d->batch + (uint64_t)b) % (uint64_t)d->nrows);
    memcpy(ids + (size_t)b * l, d->ids + (size_t)row * l, l * sizeof *ids);
    memcpy(labels + (size_t)b * l, d->labels + (size_t)row * l, l * sizeof *labels);
  }
}

/* ---- documents ---- */

/* The document holding token `at` of the file: the last i with offsets[i] <= at. */
static int64_t doc_of(const tsr_doc_index *ix, int64_t at) {
  uint64_t lo = 0, hi = ix->ndocs; /* offsets[lo] <= at < offsets[hi] */
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (ix->offsets[mid] <= (uint64_t)at)
      lo = mid;
    else
      hi = mid;
  }
  return (int64_t)lo;
}

/* A label that is the first token of the next document is not this document's to predict. */
static void ignore_document_ends(const tsr_data_t *d, int32_t *labels) {
  for (int b = 0; b < d->batch; b++) {
    int64_t p0 = d->starts[b];
    for (int64_t k = doc_of(&d->index, p0) + 1;
         k < (int64_t)d->index.ndocs && (int64_t)d->index.offsets[k] <= p0 + d->seq_len; k++) {
      int64_t i = (int64_t)d->index.offsets[k] - 1 - p0; /* the input token that ends doc k - 1 */
      if (i >= 0) labels[(size_t)b * d->seq_len + i] = IGNORE_INDEX;
    }
  }
}

tsr_status tsr_data_use_documents(tsr_data_t *d, const char *index_path) {
  if (d->kind != DATA_TOKENS16 && d->kind != DATA_TOKENS32)
    return TSR_ERROR(TSR_EINVAL,
                     "[data] mask = document needs a tokens: or tokens32: source with the "
                     "document index tessera tokenize writes; %s%s has no documents",
                     d->kind == DATA_SYNTHETIC ? "synthetic"
                     : d->kind == DATA_TEXT    ? "text:"
                                               : "safetensors:",
                     d->path ? d->path : "");
  if (!index_path || !*index_path)
    return TSR_ERROR(TSR_EINVAL, "data file %s: no document index path", d->path);
  tsr_doc_index_close(&d->index);
  d->docs = false;
  tsr_status s = tsr_doc_index_open(index_path, d->path, &d->index);
  if (s != TSR_OK) return tsr_error_prefix(s, "the document index of %s", d->path);
  size_t esize = d->kind == DATA_TOKENS16 ? 2 : 4;
  if (d->index.token_bytes != esize) {
    s = TSR_ERROR(TSR_EINVAL,
                  "document index %s is of %u-byte tokens but the source %s reads %zu-byte ones; "
                  "use %s:%s",
                  index_path, d->index.token_bytes, d->path, esize,
                  d->index.token_bytes == 2 ? "tokens" : "tokens32", d->path);
    tsr_doc_index_close(&d->index);
    return s;
  }
  free(d->starts);
  if (!(d->starts = calloc((size_t)d->batch, sizeof *d->starts))) {
    tsr_doc_index_close(&d->index);
    return TSR_ERROR(TSR_ENOMEM, "data file %s: out of memory", d->path);
  }
  d->docs = true;
  return TSR_OK;
}

tsr_status tsr_data_documents(const tsr_data_t *d, int32_t *seg, int32_t *pos) {
  if (!d->docs)
    return TSR_ERROR(TSR_EINVAL, "data source %s: no document index was read",
                     d->path ? d->path : "synthetic");
  if (!d->have_batch) return TSR_ERROR(TSR_EINVAL, "data source %s: no batch yet", d->path);
  for (int b = 0; b < d->batch; b++) {
    int64_t p0 = d->starts[b], k0 = doc_of(&d->index, p0), k = k0;
    int64_t first = p0; /* the row's first token of document k */
    for (int i = 0; i < d->seq_len; i++) {
      while (k + 1 < (int64_t)d->index.ndocs && (int64_t)d->index.offsets[k + 1] <= p0 + i) {
        k++;
        first = (int64_t)d->index.offsets[k];
      }
      seg[(size_t)b * d->seq_len + i] = (int32_t)(k - k0);
      pos[(size_t)b * d->seq_len + i] = (int32_t)(p0 + i - first);
    }
  }
  return TSR_OK;
}

tsr_status tsr_data_next(tsr_data_t *d, int32_t *input_ids, int32_t *labels) {
  if (!input_ids || !labels) return TSR_ERROR(TSR_EINVAL, "data next: NULL output buffer");
  switch (d->kind) {
    case DATA_SYNTHETIC:
      next_synthetic(d, input_ids, labels);
      break;
    case DATA_ROWS:
      next_rows(d, input_ids, labels);
      break;
    default:
      next_window(d, input_ids, labels);
      if (d->docs) ignore_document_ends(d, labels);
      break;
  }
  d->step++;
  d->have_batch = true;
  return TSR_OK;
}

int64_t tsr_data_step(const tsr_data_t *d) {
  return d->step;
}

void tsr_data_set_step(tsr_data_t *d, int64_t step) {
  d->step = step;
}
