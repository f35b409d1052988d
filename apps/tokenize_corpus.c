/* The corpus pipeline of `tessera tokenize`. The inputs are cut into chunks of about 1 MB at
 * line ends; a batch of chunks is encoded by one thread per core, each chunk into its own
 * buffers, and the main thread then writes the batch's chunks in input order, so the output is
 * the same whatever the thread count. Both outputs go to temporaries that are renamed into
 * place after the last batch: a failure anywhere leaves nothing behind. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "tessera/doc_index.h"
#include "tokenize.h"

#define CHUNK_BYTES (1u << 20)
/* chunks per thread in a batch: enough that unequal chunks even out */
#define CHUNKS_PER_THREAD 4

typedef struct corpus_file {
  const char *path;
  const char *data; /* the mapping; NULL for an empty file */
  size_t size;
  bool jsonl;
  size_t next;        /* where the next chunk starts */
  uint64_t line_base; /* lines of this file in chunks already written */
} corpus_file;

typedef struct chunk {
  int file;
  size_t begin, end;
  /* results */
  int32_t *ids;
  size_t nids, cap_ids;
  uint64_t *lens; /* tokens of each document */
  size_t ndocs, cap_lens;
  uint64_t lines, empty;
  tsr_status status;
  uint64_t err_line; /* 1-based within the chunk */
  char err[1024];
} chunk;

typedef struct worker {
  struct corpus *c;
  tsr_tok_encoder_t *enc;
  char *buf; /* a JSONL document's text, or a document with invalid UTF-8 replaced */
  size_t cap;
  pthread_t thread;
} worker;

typedef struct corpus {
  const tsr_tokenizer_t *tok;
  const tsr_corpus_opts *o;
  corpus_file *files;
  int file; /* the first file with input left */
  chunk *chunks;
  int nchunks, cap_chunks;
  worker *workers;
  unsigned flags;
  bool append_eos;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int next, done; /* chunks of the batch handed out, finished */
  uint64_t bytes_done, tokens_done, total_bytes;
  int files_done;
  struct timespec start;
} corpus;

/* cJSON records its last parse error in a process-wide variable: one parse at a time. */
static pthread_mutex_t json_lock = PTHREAD_MUTEX_INITIALIZER;

static double since(const struct timespec *t0) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

/* CPU seconds of every thread of the process so far. */
static double cpu_time(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

static bool grow(void **p, size_t *cap, size_t need, size_t size) {
  if (need <= *cap) return true;
  size_t c = *cap ? *cap : 1024;
  while (c < need) c *= 2;
  void *q = realloc(*p, c * size);
  if (!q) return false;
  *p = q;
  *cap = c;
  return true;
}

static bool fail(chunk *ch, uint64_t line, tsr_status s, const char *fmt, const char *detail) {
  ch->status = s;
  ch->err_line = line;
  snprintf(ch->err, sizeof ch->err, fmt, detail);
  return false;
}

/* A JSONL line -> its text in w->buf. */
static bool json_text(worker *w, chunk *ch, const char *p, size_t n, const char **text,
                      size_t *len) {
  const char *field = w->c->o->field;
  pthread_mutex_lock(&json_lock);
  cJSON *o = cJSON_ParseWithLength(p, n);
  const char *at = o ? NULL : cJSON_GetErrorPtr();
  pthread_mutex_unlock(&json_lock);
  char msg[512];
  bool ok = false;
  if (!o) {
    snprintf(msg, sizeof msg, "not valid JSON (column %zu); a JSONL file holds one object per line",
             at && at >= p && at <= p + n ? (size_t)(at - p) + 1 : (size_t)1);
  } else if (!cJSON_IsObject(o)) {
    snprintf(msg, sizeof msg, "not a JSON object; a JSONL file holds one object per line");
  } else {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (!v) {
      int k = snprintf(msg, sizeof msg,
                       "no \"%s\" member; name the text's member with --field "
                       "(this object has:",
                       field);
      const cJSON *e;
      cJSON_ArrayForEach(e, o) if (k < (int)sizeof msg - 64) k +=
          snprintf(msg + k, sizeof msg - (size_t)k, " %s", e->string);
      snprintf(msg + k, sizeof msg - (size_t)k, ")");
    } else if (!cJSON_IsString(v)) {
      snprintf(msg, sizeof msg, "\"%s\" is not a string", field);
    } else {
      size_t l = strlen(v->valuestring);
      if (!grow((void **)&w->buf, &w->cap, l + 1, 1)) {
        snprintf(msg, sizeof msg, "out of memory");
      } else {
        memcpy(w->buf, v->valuestring, l);
        *text = w->buf, *len = l;
        ok = true;
      }
    }
  }
  cJSON_Delete(o);
  if (!ok) fail(ch, ch->lines, TSR_EINVAL, "%s", msg);
  return ok;
}

/* \u0000 in a JSON string: cJSON's strings end at a NUL, so the text would be cut silently. */
static bool has_nul_escape(const char *p, size_t n) {
  for (size_t i = 0; i + 6 <= n; i++) {
    if (p[i] != '\\' || memcmp(p + i + 1, "u0000", 5)) continue;
    size_t k = 0;
    while (k < i && p[i - 1 - k] == '\\') k++;
    if (k % 2 == 0) return true;
  }
  return false;
}

/* The text with each invalid UTF-8 sequence replaced by U+FFFD, in w->buf. */
static bool replace_invalid(worker *w, const char *s, size_t n, const char **out, size_t *len) {
  if (!grow((void **)&w->buf, &w->cap, 3 * n + 1, 1)) return false;
  char *o = w->buf;
  while (n) {
    size_t ok = tsr_utf8_valid_prefix(s, n);
    memmove(o, s, ok);
    o += ok, s += ok, n -= ok;
    if (!n) break;
    memcpy(o, "\xEF\xBF\xBD", 3);
    o += 3;
    /* the bad byte, and the continuation bytes that belonged to it */
    do s++, n--;
    while (n && ((unsigned char)*s & 0xC0) == 0x80);
  }
  *out = w->buf, *len = (size_t)(o - w->buf);
  return true;
}

static bool one_doc(worker *w, chunk *ch, const char *s, size_t n) {
  corpus *c = w->c;
  if (!n && !c->o->keep_empty) {
    ch->empty++;
    return true;
  }
  size_t valid = tsr_utf8_valid_prefix(s, n);
  if (valid != n) {
    if (!c->o->utf8_replace) {
      char d[96];
      snprintf(d, sizeof d, "%zu (0x%02X)", valid + 1, (unsigned char)s[valid]);
      return fail(ch, ch->lines, TSR_EINVAL,
                  "not valid UTF-8 at byte %s of the document; fix the file, or give --utf8 "
                  "replace to take each bad sequence as U+FFFD",
                  d);
    }
    if (!replace_invalid(w, s, n, &s, &n))
      return fail(ch, ch->lines, TSR_ENOMEM, "%s", "out of memory");
  }
  const int32_t *ids;
  size_t k;
  tsr_status st = tsr_tok_encode(w->enc, s, n, c->flags, &ids, &k);
  if (st != TSR_OK) return fail(ch, ch->lines, st, "%s", tsr_last_error());
  size_t total = k + (c->append_eos ? 1 : 0);
  if (!grow((void **)&ch->ids, &ch->cap_ids, ch->nids + total, sizeof *ch->ids) ||
      !grow((void **)&ch->lens, &ch->cap_lens, ch->ndocs + 1, sizeof *ch->lens))
    return fail(ch, ch->lines, TSR_ENOMEM, "%s", "out of memory");
  memcpy(ch->ids + ch->nids, ids, k * sizeof *ids);
  if (c->append_eos) ch->ids[ch->nids + k] = c->o->eos;
  ch->nids += total;
  ch->lens[ch->ndocs++] = total;
  return true;
}

static void run_chunk(worker *w, chunk *ch) {
  const corpus *c = w->c;
  const corpus_file *f = &c->files[ch->file];
  const char *p = f->data + ch->begin, *end = f->data + ch->end;
  ch->nids = ch->ndocs = 0;
  ch->lines = ch->empty = 0;
  ch->status = TSR_OK;
  if (c->o->doc_per_file && !f->jsonl) {
    ch->lines = 1; /* errors name the document by its file alone */
    one_doc(w, ch, p, (size_t)(end - p));
    return;
  }
  /* a byte-order mark at the start of a JSONL file is not JSON; JSON readers skip it */
  if (f->jsonl && ch->begin == 0 && end - p >= 3 && !memcmp(p, "\xEF\xBB\xBF", 3)) p += 3;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    const char *stop = nl ? nl : end;
    ch->lines++;
    const char *s = p;
    size_t n = (size_t)(stop - p);
    p = nl ? nl + 1 : end;
    if (n && s[n - 1] == '\r') n--; /* CRLF files */
    if (f->jsonl) {
      size_t blank = 0;
      while (blank < n && (s[blank] == ' ' || s[blank] == '\t')) blank++;
      if (blank == n) continue; /* blank lines between objects */
      if (has_nul_escape(s, n))
        return (void)fail(ch, ch->lines, TSR_EINVAL, "%s",
                          "the object holds \\u0000 (NUL), which this reader cannot carry; "
                          "remove it from the text");
      if (!json_text(w, ch, s, n, &s, &n)) return;
    }
    if (!one_doc(w, ch, s, n)) return;
  }
}

static void *work(void *arg) {
  worker *w = arg;
  corpus *c = w->c;
  for (;;) {
    pthread_mutex_lock(&c->lock);
    int i = c->next < c->nchunks ? c->next++ : -1;
    pthread_mutex_unlock(&c->lock);
    if (i < 0) return NULL;
    chunk *ch = &c->chunks[i];
    run_chunk(w, ch);
    pthread_mutex_lock(&c->lock);
    c->done++;
    c->bytes_done += ch->end - ch->begin;
    c->tokens_done += ch->nids;
    pthread_cond_signal(&c->cond);
    pthread_mutex_unlock(&c->lock);
  }
}

/* The next batch of chunks; false when the input is all used. */
static bool next_batch(corpus *c) {
  const tsr_corpus_opts *o = c->o;
  c->nchunks = 0;
  int max = o->threads * CHUNKS_PER_THREAD;
  while (c->nchunks < max && c->file < o->ninputs) {
    corpus_file *f = &c->files[c->file];
    if (f->next >= f->size) {
      c->file++;
      continue;
    }
    size_t begin = f->next, end = f->size;
    if (!(o->doc_per_file && !f->jsonl) && f->size - begin > CHUNK_BYTES) {
      const char *nl = memchr(f->data + begin + CHUNK_BYTES, '\n', f->size - begin - CHUNK_BYTES);
      end = nl ? (size_t)(nl - f->data) + 1 : f->size;
    }
    f->next = end;
    chunk *ch = &c->chunks[c->nchunks++];
    ch->file = c->file;
    ch->begin = begin, ch->end = end;
  }
  return c->nchunks > 0;
}

static void draw(corpus *c, bool last) {
  double t = since(&c->start);
  double mb = (double)c->bytes_done / 1e6, all = (double)c->total_bytes / 1e6;
  fprintf(stderr, "\r\033[K%d/%d files  %.1f/%.1f MB  %.1f MB/s  %.2f M tokens/s", c->files_done,
          c->o->ninputs, mb, all, t > 0 ? mb / t : 0.0,
          t > 0 ? (double)c->tokens_done / t / 1e6 : 0.0);
  if (last) fputc('\n', stderr);
  fflush(stderr);
}

/* Encodes the batch on every thread; the main thread redraws the progress line meanwhile. */
static tsr_status run_batch(corpus *c) {
  c->next = c->done = 0;
  int started = 0;
  for (; started < c->o->threads; started++)
    if (pthread_create(&c->workers[started].thread, NULL, work, &c->workers[started]) != 0) break;
  if (!started) return TSR_ERROR(TSR_ENOMEM, "tokenize: cannot start a thread");
  pthread_mutex_lock(&c->lock);
  while (c->done < c->nchunks) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_nsec += 250 * 1000 * 1000;
    if (dl.tv_nsec >= 1000000000) dl.tv_sec++, dl.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&c->cond, &c->lock, &dl);
    if (c->o->progress) draw(c, false);
  }
  pthread_mutex_unlock(&c->lock);
  for (int i = 0; i < started; i++) pthread_join(c->workers[i].thread, NULL);
  return TSR_OK;
}

static bool put_le(FILE *f, uint64_t v, int bytes) {
  unsigned char b[8];
  for (int i = 0; i < bytes; i++) b[i] = (unsigned char)(v >> (8 * i));
  return fwrite(b, 1, (size_t)bytes, f) == (size_t)bytes;
}

typedef struct out_file {
  const char *path;
  char tmp[4200];
  FILE *f;
} out_file;

/* The batch's chunks, in input order, appended to the outputs. */
static tsr_status write_batch(corpus *c, out_file *tokens, out_file *index, uint64_t *ntok,
                              tsr_corpus_stats *st, unsigned char **wbuf, size_t *wcap) {
  int tb = c->o->token_bytes;
  for (int i = 0; i < c->nchunks; i++) {
    chunk *ch = &c->chunks[i];
    corpus_file *f = &c->files[ch->file];
    if (ch->status != TSR_OK) {
      if (c->o->doc_per_file && !f->jsonl) return tsr_error(ch->status, "%s: %s", f->path, ch->err);
      return tsr_error(ch->status, "%s:%llu: %s", f->path,
                       (unsigned long long)(f->line_base + ch->err_line), ch->err);
    }
    if (!grow((void **)wbuf, wcap, ch->nids * (size_t)tb + 1, 1))
      return TSR_ERROR(TSR_ENOMEM, "tokenize: out of memory");
    unsigned char *b = *wbuf;
    const int32_t *ids = ch->ids;
    if (tb == 2)
      for (size_t k = 0; k < ch->nids; k++, b += 2)
        b[0] = (unsigned char)ids[k], b[1] = (unsigned char)(ids[k] >> 8);
    else
      for (size_t k = 0; k < ch->nids; k++, b += 4)
        b[0] = (unsigned char)ids[k], b[1] = (unsigned char)(ids[k] >> 8),
        b[2] = (unsigned char)(ids[k] >> 16), b[3] = (unsigned char)(ids[k] >> 24);
    if (fwrite(*wbuf, 1, ch->nids * (size_t)tb, tokens->f) != ch->nids * (size_t)tb)
      return TSR_ERROR(TSR_EIO, "%s: write error: %s", tokens->tmp, strerror(errno));
    for (size_t d = 0; d < ch->ndocs; d++) {
      *ntok += ch->lens[d];
      if (!put_le(index->f, *ntok, 8))
        return TSR_ERROR(TSR_EIO, "%s: write error: %s", index->tmp, strerror(errno));
    }
    f->line_base += ch->lines;
    st->docs += ch->ndocs;
    st->empty += ch->empty;
    st->tokens += ch->nids;
    if (ch->end == f->size) c->files_done++;
  }
  return TSR_OK;
}

static tsr_status open_out(out_file *o) {
  if (snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld.XXXXXX", o->path, (long)getpid()) >=
      (int)sizeof o->tmp)
    return TSR_ERROR(TSR_EINVAL, "%s: path too long", o->path);
  int fd = mkstemp(o->tmp);
  if (fd < 0) {
    o->tmp[0] = '\0';
    return TSR_ERROR(TSR_EIO,
                     "%s: cannot create a file beside it: %s; the directory must exist "
                     "and be writable",
                     o->path, strerror(errno));
  }
  fchmod(fd, 0644);
  if (!(o->f = fdopen(fd, "wb"))) {
    close(fd);
    return TSR_ERROR(TSR_EIO, "%s: %s", o->tmp, strerror(errno));
  }
  setvbuf(o->f, NULL, _IOFBF, 1 << 20);
  return TSR_OK;
}

static tsr_status close_out(out_file *o, bool keep) {
  tsr_status s = TSR_OK;
  if (o->f) {
    if (keep && (fflush(o->f) != 0 || fsync(fileno(o->f)) != 0))
      s = TSR_ERROR(TSR_EIO, "%s: write error: %s", o->tmp, strerror(errno));
    if (fclose(o->f) != 0 && s == TSR_OK && keep)
      s = TSR_ERROR(TSR_EIO, "%s: write error: %s", o->tmp, strerror(errno));
    o->f = NULL;
  }
  if (o->tmp[0] && (!keep || s != TSR_OK)) unlink(o->tmp);
  return s;
}

static tsr_status write_header(corpus *c, out_file *index, uint64_t ndocs, uint64_t ntok,
                               tsr_corpus_stats *st) {
  unsigned char h[TSR_DOC_INDEX_HEADER] = {0};
  memcpy(h, TSR_DOC_INDEX_MAGIC, 8);
  uint64_t fields[] = {TSR_DOC_INDEX_VERSION,
                       (uint64_t)c->o->token_bytes,
                       ndocs,
                       ntok,
                       st->head,
                       st->tail,
                       (uint32_t)(c->append_eos ? c->o->eos : -1)};
  int at[] = {8, 12, 16, 24, 32, 36, 40}, size[] = {4, 4, 8, 8, 4, 4, 4};
  for (int i = 0; i < 7; i++)
    for (int j = 0; j < size[i]; j++) h[at[i] + j] = (unsigned char)(fields[i] >> (8 * j));
  if (fseek(index->f, 0, SEEK_SET) != 0 || fwrite(h, 1, sizeof h, index->f) != sizeof h)
    return TSR_ERROR(TSR_EIO, "%s: write error: %s", index->tmp, strerror(errno));
  return TSR_OK;
}

/* Maps every input before anything is written, and refuses an output that is an input. */
static tsr_status open_inputs(corpus *c, const char *tokenizer_path) {
  const tsr_corpus_opts *o = c->o;
  struct stat outs[2];
  bool out_exists[2] = {stat(o->out, &outs[0]) == 0, stat(o->index, &outs[1]) == 0};
  for (int i = 0; i <= o->ninputs; i++) {
    const char *path = i < o->ninputs ? o->inputs[i] : tokenizer_path;
    struct stat sb;
    if (stat(path, &sb) != 0)
      return TSR_ERROR(TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    for (int k = 0; k < 2; k++)
      if (out_exists[k] && outs[k].st_dev == sb.st_dev && outs[k].st_ino == sb.st_ino)
        return TSR_ERROR(TSR_EINVAL, "output %s is the input %s; write elsewhere",
                         k ? o->index : o->out, path);
    if (i == o->ninputs) break;
    corpus_file *f = &c->files[i];
    f->path = path;
    const char *dot = strrchr(path, '.');
    f->jsonl = o->format == TSR_CORPUS_JSONL ||
               (o->format == TSR_CORPUS_AUTO && dot &&
                (!strcmp(dot, ".jsonl") || !strcmp(dot, ".ndjson") || !strcmp(dot, ".json")));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return TSR_ERROR(TSR_EIO, "%s: cannot open: %s", path, strerror(errno));
    tsr_status s = TSR_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
      s = TSR_ERROR(TSR_EIO, "%s: not a regular file; give text or JSONL files", path);
    } else if (sb.st_size > 0) {
      void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
      if (m == MAP_FAILED)
        s = TSR_ERROR(TSR_EIO, "%s: cannot map: %s", path, strerror(errno));
      else
        f->data = m, f->size = (size_t)sb.st_size;
    }
    close(fd);
    if (s != TSR_OK) return s;
    c->total_bytes += f->size;
  }
  return TSR_OK;
}

static tsr_status publish(out_file *o) {
  if (rename(o->tmp, o->path) != 0)
    return TSR_ERROR(TSR_EIO, "%s: cannot rename %s over it: %s", o->path, o->tmp, strerror(errno));
  o->tmp[0] = '\0';
  return TSR_OK;
}

tsr_status tsr_corpus_tokenize(const tsr_tokenizer_t *tok, const tsr_corpus_opts *o,
                               tsr_corpus_stats *st) {
  memset(st, 0, sizeof *st);
  corpus c = {.tok = tok, .o = o};
  out_file tokens = {.path = o->out}, index = {.path = o->index};
  unsigned char *wbuf = NULL;
  size_t wcap = 0;
  uint64_t ntok = 0;
  tsr_status s = TSR_OK;
  pthread_mutex_init(&c.lock, NULL);
  pthread_cond_init(&c.cond, NULL);
  clock_gettime(CLOCK_MONOTONIC, &c.start);
  double cpu0 = cpu_time();
  const int32_t *head, *tail;
  int nhead, ntail;
  tsr_tokenizer_template(tok, &head, &nhead, &tail, &ntail);
  c.flags =
      (o->add_special ? TSR_TOK_ADD_SPECIAL : 0u) | (o->split_special ? TSR_TOK_SPLIT_SPECIAL : 0u);
  /* a template that already ends documents with the EOS gets no second one */
  c.append_eos = o->eos >= 0 && !(o->add_special && ntail && tail[ntail - 1] == o->eos);
  st->head = o->add_special ? (uint32_t)nhead : 0;
  st->tail = (o->add_special ? (uint32_t)ntail : 0) + (c.append_eos ? 1 : 0);
  c.files = calloc((size_t)o->ninputs + 1, sizeof *c.files);
  c.chunks = calloc((size_t)o->threads * CHUNKS_PER_THREAD, sizeof *c.chunks);
  c.workers = calloc((size_t)o->threads, sizeof *c.workers);
  if (!c.files || !c.chunks || !c.workers) {
    s = TSR_ERROR(TSR_ENOMEM, "tokenize: out of memory");
    goto cleanup;
  }
  TSR_CHECK_GOTO(open_inputs(&c, tsr_tokenizer_path(tok)), s);
  for (int i = 0; i < o->threads; i++) {
    c.workers[i].c = &c;
    TSR_CHECK_GOTO(tsr_tok_encoder_new(tok, &c.workers[i].enc), s);
  }
  TSR_CHECK_GOTO(open_out(&tokens), s);
  TSR_CHECK_GOTO(open_out(&index), s);
  unsigned char zero[TSR_DOC_INDEX_HEADER + 8] = {0}; /* the header comes last; offsets[0] = 0 */
  if (fwrite(zero, 1, sizeof zero, index.f) != sizeof zero) {
    s = TSR_ERROR(TSR_EIO, "%s: write error: %s", index.tmp, strerror(errno));
    goto cleanup;
  }
  while (next_batch(&c)) {
    TSR_CHECK_GOTO(run_batch(&c), s);
    TSR_CHECK_GOTO(write_batch(&c, &tokens, &index, &ntok, st, &wbuf, &wcap), s);
  }
  for (int i = 0; i < o->ninputs; i++) c.files_done += c.files[i].size == 0;
  if (o->progress) draw(&c, true);
  st->bytes = c.total_bytes;
  TSR_CHECK_GOTO(write_header(&c, &index, st->docs, ntok, st), s);
  TSR_CHECK_GOTO(close_out(&tokens, true), s);
  TSR_CHECK_GOTO(close_out(&index, true), s);
  /* the index first: a token file in place always has its index beside it */
  TSR_CHECK_GOTO(publish(&index), s);
  TSR_CHECK_GOTO(publish(&tokens), s);
  st->seconds = since(&c.start);
  st->cpu_seconds = cpu_time() - cpu0;
cleanup:
  if (s != TSR_OK && o->progress && c.bytes_done) fputc('\n', stderr);
  close_out(&tokens, false);
  close_out(&index, false);
  for (int i = 0; c.files && i < o->ninputs; i++)
    if (c.files[i].data) munmap((void *)c.files[i].data, c.files[i].size);
  for (int i = 0; c.chunks && i < o->threads * CHUNKS_PER_THREAD; i++) {
    free(c.chunks[i].ids);
    free(c.chunks[i].lens);
  }
  for (int i = 0; c.workers && i < o->threads; i++) {
    tsr_tok_encoder_free(c.workers[i].enc);
    free(c.workers[i].buf);
  }
  free(c.files);
  free(c.chunks);
  free(c.workers);
  free(wbuf);
  pthread_mutex_destroy(&c.lock);
  pthread_cond_destroy(&c.cond);
  return s;
}
