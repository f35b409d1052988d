/* `tessera tokenize` and `tessera decode` (docs/tokenize.md): the commands (tokenize_cmd.c,
 * decode_cmd.c) and the corpus pipeline behind tokenize (tokenize_corpus.c). */
#ifndef TESSERA_APP_TOKENIZE_H
#define TESSERA_APP_TOKENIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/tokenizer.h"

typedef enum tsr_corpus_format {
  TSR_CORPUS_AUTO,  /* by file name: .jsonl, .ndjson and .json are JSONL, the rest text */
  TSR_CORPUS_TEXT,  /* one document per line (or per file) */
  TSR_CORPUS_JSONL, /* one document per JSON object, one object per line */
} tsr_corpus_format;

typedef struct tsr_corpus_opts {
  const char *const *inputs;
  int ninputs;
  const char *out;   /* the token file */
  const char *index; /* its document index */
  tsr_corpus_format format;
  const char *field;  /* JSONL: the member holding the text */
  bool doc_per_file;  /* text: the whole file is one document */
  int32_t eos;        /* appended after each document; -1: none */
  bool add_special;   /* the post-processor's tokens (BOS) */
  bool split_special; /* special tokens written in the text are text */
  bool keep_empty;    /* documents without text still get their head and tail tokens */
  bool utf8_replace;  /* invalid UTF-8 becomes U+FFFD instead of an error */
  int token_bytes;    /* 2 or 4 */
  int threads;
  bool progress; /* a progress line on stderr (a terminal) */
} tsr_corpus_opts;

typedef struct tsr_corpus_stats {
  uint64_t bytes, docs, empty, tokens;
  uint32_t head, tail;
  double seconds, cpu_seconds; /* wall time and CPU time (all threads) of the pipeline */
} tsr_corpus_stats;

/* Tokenizes the inputs into the token file and its index, each written to a temporary beside it
 * and renamed into place only when everything succeeded: on failure nothing is written. Errors
 * name the input file and line. */
tsr_status tsr_corpus_tokenize(const tsr_tokenizer_t *tok, const tsr_corpus_opts *o,
                               tsr_corpus_stats *st);

int tsr_cmd_tokenize(int argc, char **argv);
int tsr_cmd_decode(int argc, char **argv);

#endif
