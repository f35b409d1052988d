/* `tessera decode`: a token file (with its document index) or a list of ids back to text. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cJSON.h>

#include "app.h"
#include "tessera/doc_index.h"
#include "tokenize.h"

static const char decode_usage[] =
    "usage: tessera decode TOKENIZER.json TOKENS [options]\n"
    "       tessera decode TOKENIZER.json --ids \"ID ID ...\" [--skip-special]\n"
    "\n"
    "Turns a token file written by `tessera tokenize` back into text, one document per line,\n"
    "without the tokens tokenize added around each document (BOS, EOS), so that decoding gives\n"
    "back the input (docs/tokenize.md). TOKENS is a path, or a data source tokens:PATH or\n"
    "tokens32:PATH. Without its index (TOKENS.idx) the whole file is decoded as one text.\n"
    "\n"
    "options:\n"
    "  --index PATH           the document index (default TOKENS.idx when it exists)\n"
    "  --no-index             ignore the index: decode every token as one text\n"
    "  --dtype u16|u32        token width without an index (default: tokens32: is u32, and\n"
    "                         otherwise u16 when the tokenizer's ids fit)\n"
    "  --format text|jsonl    one document per line (default), or one JSON object per line\n"
    "  --field NAME           the JSON member that gets the text (default text)\n"
    "  --print-ids            print each document's ids, all of them, instead of its text\n"
    "  --skip-special         leave out every special token, also those written in the text\n"
    "  -o, --output PATH      write to PATH (replaced whole at the end) instead of stdout\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure, 2 bad input (an id no token has, a malformed\n"
    "            index or a token file that does not match it)\n";

typedef struct dec {
  const tsr_tokenizer_t *tok;
  FILE *out;
  bool jsonl, print_ids;
  const char *field;
  unsigned flags;
  int32_t *ids;
  size_t cap;
} dec;

static int fail(tsr_status s) {
  fprintf(stderr, "tessera decode: %s\n", tsr_last_error());
  return tsr_app_exit_code(s);
}

static int bad_arg(const char *fmt, const char *arg) {
  fprintf(stderr, "tessera decode: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "; see tessera decode --help\n");
  return TSR_EXIT_BAD_INPUT;
}

/* One document (or the whole stream) of ids, as a line. */
static tsr_status emit(dec *d, const int32_t *ids, size_t n) {
  if (d->print_ids) {
    for (size_t i = 0; i < n; i++) fprintf(d->out, "%s%d", i ? " " : "", (int)ids[i]);
    fputc('\n', d->out);
    return TSR_OK;
  }
  char *text;
  size_t len;
  TSR_CHECK(tsr_tokenizer_decode(d->tok, ids, n, d->flags, &text, &len));
  if (d->jsonl) {
    cJSON *o = cJSON_CreateObject();
    char *line = o && cJSON_AddStringToObject(o, d->field, text) ? cJSON_PrintUnformatted(o) : NULL;
    if (line) fprintf(d->out, "%s\n", line);
    cJSON_free(line);
    cJSON_Delete(o);
    free(text);
    return line ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "decode: out of memory");
  }
  fwrite(text, 1, len, d->out);
  fputc('\n', d->out);
  free(text);
  return TSR_OK;
}

/* ids [first, first + n) of the little-endian token file. */
static tsr_status load_ids(dec *d, const unsigned char *p, int tb, uint64_t first, size_t n) {
  if (n > d->cap) {
    int32_t *q = realloc(d->ids, n * sizeof *q);
    if (!q) return TSR_ERROR(TSR_ENOMEM, "decode: out of memory for %zu ids", n);
    d->ids = q;
    d->cap = n;
  }
  p += first * (uint64_t)tb;
  for (size_t i = 0; i < n; i++, p += tb)
    d->ids[i] = tb == 2 ? (int32_t)(p[0] | p[1] << 8)
                        : (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                                    (uint32_t)p[3] << 24);
  return TSR_OK;
}

static tsr_status decode_file(dec *d, const char *path, const char *index_path, int tb) {
  tsr_doc_index ix = {0};
  if (index_path) {
    TSR_CHECK(tsr_doc_index_open(index_path, path, &ix));
    tb = (int)ix.token_bytes;
  }
  tsr_status s = TSR_OK;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  void *map = NULL;
  if (fd < 0 || fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    s = TSR_ERROR(TSR_EIO, "%s: cannot open as a token file: %s", path,
                  fd < 0 ? strerror(errno) : "not a regular file");
    goto cleanup;
  }
  if (sb.st_size % tb) {
    s = TSR_ERROR(TSR_EINVAL, "%s: %lld bytes is not a whole number of %d-byte tokens", path,
                  (long long)sb.st_size, tb);
    goto cleanup;
  }
  if (sb.st_size &&
      (map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED) {
    map = NULL;
    s = TSR_ERROR(TSR_EIO, "%s: cannot map: %s", path, strerror(errno));
    goto cleanup;
  }
  uint64_t ntok = (uint64_t)sb.st_size / (uint64_t)tb;
  if (!index_path) {
    TSR_CHECK_GOTO(load_ids(d, map, tb, 0, (size_t)ntok), s);
    s = emit(d, d->ids, (size_t)ntok);
    goto cleanup;
  }
  for (uint64_t i = 0; i < ix.ndocs; i++) {
    /* the tokens tokenize added around the text are left out, unless ids are asked for */
    uint64_t a = ix.offsets[i] + (d->print_ids ? 0 : ix.head);
    uint64_t b = ix.offsets[i + 1] - (d->print_ids ? 0 : ix.tail);
    TSR_CHECK_GOTO(load_ids(d, map, tb, a, (size_t)(b - a)), s);
    s = emit(d, d->ids, (size_t)(b - a));
    if (s != TSR_OK) {
      tsr_error_prefix(s, "%s: document %llu (tokens %llu..%llu)", path, (unsigned long long)i,
                       (unsigned long long)a, (unsigned long long)b);
      goto cleanup;
    }
  }
cleanup:
  if (map) munmap(map, (size_t)sb.st_size);
  if (fd >= 0) close(fd);
  tsr_doc_index_close(&ix);
  return s;
}

static tsr_status parse_ids(dec *d, const char *list, size_t *n) {
  *n = 0;
  for (const char *p = list; *p;) {
    if (*p == ' ' || *p == ',' || *p == '\t' || *p == '\n') {
      p++;
      continue;
    }
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 0 || v > INT32_MAX)
      return TSR_ERROR(TSR_EINVAL, "--ids: '%.20s' is not a token id", p);
    if (*n == d->cap) {
      size_t cap = d->cap ? 2 * d->cap : 64;
      int32_t *q = realloc(d->ids, cap * sizeof *q);
      if (!q) return TSR_ERROR(TSR_ENOMEM, "decode: out of memory");
      d->ids = q, d->cap = cap;
    }
    d->ids[(*n)++] = (int32_t)v;
    p = end;
  }
  return TSR_OK;
}

int tsr_cmd_decode(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(decode_usage, stdout);
    return TSR_EXIT_OK;
  }
  dec d = {.out = stdout, .field = "text"};
  const char *tokenizer = NULL, *tokens = NULL, *index = NULL, *ids = NULL, *out = NULL;
  bool no_index = false;
  int tb = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has = i + 1 < argc;
    if (!strcmp(a, "--index") && has)
      index = argv[++i];
    else if (!strcmp(a, "--no-index"))
      no_index = true;
    else if (!strcmp(a, "--dtype") && has) {
      const char *v = argv[++i];
      if (strcmp(v, "u16") && strcmp(v, "u32"))
        return bad_arg("--dtype '%s': expected u16 or u32", v);
      tb = v[1] == '1' ? 2 : 4;
    } else if (!strcmp(a, "--format") && has) {
      const char *v = argv[++i];
      if (strcmp(v, "text") && strcmp(v, "jsonl"))
        return bad_arg("--format '%s': expected text or jsonl", v);
      d.jsonl = v[0] == 'j';
    } else if (!strcmp(a, "--field") && has)
      d.field = argv[++i];
    else if (!strcmp(a, "--print-ids"))
      d.print_ids = true;
    else if (!strcmp(a, "--skip-special"))
      d.flags |= TSR_TOK_SKIP_SPECIAL;
    else if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has)
      out = argv[++i];
    else if (!strcmp(a, "--ids") && has)
      ids = argv[++i];
    else if (a[0] == '-' && a[1])
      return bad_arg("unknown option (or one without its value) '%s'", a);
    else if (!tokenizer)
      tokenizer = a;
    else if (!tokens)
      tokens = a;
    else
      return bad_arg("one token file at a time; '%s' is one too many", a);
  }
  if (!tokenizer) return bad_arg("%s", "no TOKENIZER.json given");
  if (!tokens == !ids) return bad_arg("%s", "give a token file or --ids, one of the two");
  if (tokens && !strncmp(tokens, "tokens32:", 9))
    tokens += 9, tb = tb ? tb : 4;
  else if (tokens && !strncmp(tokens, "tokens:", 7))
    tokens += 7, tb = tb ? tb : 2;
  tsr_tokenizer_t *tok;
  tsr_status s = tsr_tokenizer_load(tokenizer, &tok);
  if (s != TSR_OK) return fail(s);
  d.tok = tok;
  char tmp[4200] = "", auto_index[4200];
  if (tokens && !index && !no_index &&
      snprintf(auto_index, sizeof auto_index, "%s.idx", tokens) < (int)sizeof auto_index &&
      access(auto_index, F_OK) == 0)
    index = auto_index;
  if (no_index) index = NULL;
  if (!tb) tb = tsr_tokenizer_vocab_size(tok) > 65536 ? 4 : 2;
  if (out) {
    int fd = -1;
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld.XXXXXX", out, (long)getpid()) >= (int)sizeof tmp ||
        (fd = mkstemp(tmp)) < 0 || !(d.out = fdopen(fd, "w"))) {
      s = TSR_ERROR(TSR_EIO, "-o %s: cannot create a file beside it: %s", out, strerror(errno));
      if (fd >= 0) close(fd), unlink(tmp);
      tmp[0] = '\0';
      d.out = stdout;
      goto done;
    }
    fchmod(fd, 0644);
  }
  if (ids) {
    size_t n;
    s = parse_ids(&d, ids, &n);
    if (s == TSR_OK) s = emit(&d, d.ids, n);
  } else {
    s = decode_file(&d, tokens, index, tb);
  }
  if (d.out != stdout) {
    bool ok = fflush(d.out) == 0 && fsync(fileno(d.out)) == 0;
    ok = fclose(d.out) == 0 && ok;
    if (s == TSR_OK && !ok) s = TSR_ERROR(TSR_EIO, "-o %s: write error: %s", out, strerror(errno));
    if (s == TSR_OK && rename(tmp, out) != 0)
      s = TSR_ERROR(TSR_EIO, "-o %s: cannot rename %s over it: %s", out, tmp, strerror(errno));
    if (s != TSR_OK) unlink(tmp);
  } else if (fflush(stdout) != 0 && s == TSR_OK) {
    s = TSR_ERROR(TSR_EIO, "stdout: write error: %s", strerror(errno));
  }
done:
  free(d.ids);
  tsr_tokenizer_free(tok);
  return s == TSR_OK ? TSR_EXIT_OK : fail(s);
}
