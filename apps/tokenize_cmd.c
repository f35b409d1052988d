/* `tessera tokenize`: options, then the corpus pipeline (tokenize_corpus.c), or one string's ids
 * with --text. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>

#include "app.h"
#include "tessera/kernels.h"
#include "tokenize.h"

static const char tokenize_usage[] =
    "usage: tessera tokenize TOKENIZER.json -o OUT [options] FILE...\n"
    "       tessera tokenize TOKENIZER.json --text STRING [--pieces] [--no-special]\n"
    "\n"
    "Encodes text files and JSONL files with a Hugging Face tokenizer.json (byte-level BPE as\n"
    "GPT-2 and Llama 3, or SentencePiece-style BPE as Llama 2 and Mistral) into OUT, a token\n"
    "file of the `tokens:` (uint16) or `tokens32:` (uint32) data source, and OUT.idx, the index\n"
    "of document boundaries (docs/tokenize.md). Each document gets the tokenizer's special\n"
    "tokens (BOS) and the EOS token after it. A text file holds one document per line, a JSONL\n"
    "file one per JSON object. Work is spread over every core; a progress line (files, MB,\n"
    "tokens/s) is drawn on a terminal. On any error nothing is written.\n"
    "\n"
    "options:\n"
    "  -o, --output OUT       the token file (required)\n"
    "  --index PATH           the document index (default OUT.idx)\n"
    "  --format auto|text|jsonl  how to read the inputs (auto: .jsonl, .ndjson and .json files\n"
    "                         are JSONL, others text)\n"
    "  --field NAME           the JSON member holding the text (default text)\n"
    "  --doc line|file        a text file holds one document per line (default) or is one\n"
    "  --eos TOKEN|none       the token after each document (default: eos_token of a\n"
    "                         tokenizer_config.json beside the tokenizer, else </s>,\n"
    "                         <|end_of_text|>, <|endoftext|> or <eos>)\n"
    "  --no-special           leave out the post-processor's tokens (BOS)\n"
    "  --split-special        special tokens written in the text are encoded as text\n"
    "  --keep-empty           keep documents without text (empty lines are skipped by default)\n"
    "  --utf8 error|replace   invalid UTF-8 stops with an error (default) or becomes U+FFFD\n"
    "  --dtype auto|u16|u32   token width (auto: u16 when the vocabulary fits)\n"
    "  --threads N            encoding threads (default: the cores this process may use)\n"
    "  --no-progress          no progress line even on a terminal\n"
    "  --text STRING          print the ids of STRING and exit\n"
    "  --pieces               with --text: print the pieces the normalizers and pre-tokenizers\n"
    "                         cut STRING into (a JSON array) instead of its ids\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure (out of memory), 2 bad input (an unsupported\n"
    "            tokenizer component, an unreadable or malformed input, file:line named)\n";

static int bad_arg(const char *fmt, const char *arg) {
  fprintf(stderr, "tessera tokenize: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "; see tessera tokenize --help\n");
  return TSR_EXIT_BAD_INPUT;
}

static int fail(tsr_status s) {
  fprintf(stderr, "tessera tokenize: %s\n", tsr_last_error());
  return tsr_app_exit_code(s);
}

/* --text: the ids of one string, or with --pieces what the model is given (a JSON array, so
 * that white space shows). */
static int print_ids(const tsr_tokenizer_t *tok, const char *text, unsigned flags, bool pieces) {
  tsr_tok_encoder_t *enc;
  tsr_status s = tsr_tok_encoder_new(tok, &enc);
  if (s != TSR_OK) return fail(s);
  const int32_t *ids;
  const char *buf;
  const size_t *ends;
  size_t n;
  if (pieces && (s = tsr_tok_pieces(enc, text, strlen(text), flags, &buf, &ends, &n)) == TSR_OK) {
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; arr && i < n; i++) {
      size_t a = i ? ends[i - 1] : 0;
      char *piece = strndup(buf + a, ends[i] - a);
      cJSON_AddItemToArray(arr, cJSON_CreateString(piece ? piece : ""));
      free(piece);
    }
    char *line = arr ? cJSON_PrintUnformatted(arr) : NULL;
    printf("%s\n", line ? line : "[]");
    cJSON_free(line);
    cJSON_Delete(arr);
  } else if (!pieces && (s = tsr_tok_encode(enc, text, strlen(text), flags, &ids, &n)) == TSR_OK) {
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? " " : "", (int)ids[i]);
    printf("\n");
  }
  tsr_tok_encoder_free(enc);
  return s == TSR_OK ? TSR_EXIT_OK : fail(s);
}

static bool pick(const char *v, const char *const *names, int n, int *out) {
  for (int i = 0; i < n; i++)
    if (!strcmp(v, names[i])) return *out = i, true;
  return false;
}

int tsr_cmd_tokenize(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(tokenize_usage, stdout);
    return TSR_EXIT_OK;
  }
  tsr_corpus_opts o = {.field = "text", .add_special = true, .progress = isatty(STDERR_FILENO)};
  const char *tokenizer = NULL, *text = NULL, *eos = NULL;
  bool pieces = false;
  int dtype = 0, utf8 = 0, doc = 0, format = 0;
  const char **inputs = calloc((size_t)argc, sizeof *inputs);
  if (!inputs) return TSR_EXIT_RUNTIME;
  int rc = TSR_EXIT_BAD_INPUT;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    bool has = i + 1 < argc;
    static const char *const formats[] = {"auto", "text", "jsonl"};
    static const char *const dtypes[] = {"auto", "u16", "u32"};
    static const char *const utf8s[] = {"error", "replace"};
    static const char *const docs[] = {"line", "file"};
    if ((!strcmp(a, "-o") || !strcmp(a, "--output")) && has)
      o.out = argv[++i];
    else if (!strcmp(a, "--index") && has)
      o.index = argv[++i];
    else if (!strcmp(a, "--format") && has) {
      if (!pick(argv[++i], formats, 3, &format)) {
        rc = bad_arg("--format '%s': expected auto, text or jsonl", argv[i]);
        goto cleanup;
      }
    } else if (!strcmp(a, "--field") && has)
      o.field = argv[++i];
    else if (!strcmp(a, "--doc") && has) {
      if (!pick(argv[++i], docs, 2, &doc)) {
        rc = bad_arg("--doc '%s': expected line or file", argv[i]);
        goto cleanup;
      }
    } else if (!strcmp(a, "--eos") && has)
      eos = argv[++i];
    else if (!strcmp(a, "--no-special"))
      o.add_special = false;
    else if (!strcmp(a, "--split-special"))
      o.split_special = true;
    else if (!strcmp(a, "--keep-empty"))
      o.keep_empty = true;
    else if (!strcmp(a, "--utf8") && has) {
      if (!pick(argv[++i], utf8s, 2, &utf8)) {
        rc = bad_arg("--utf8 '%s': expected error or replace", argv[i]);
        goto cleanup;
      }
    } else if (!strcmp(a, "--dtype") && has) {
      if (!pick(argv[++i], dtypes, 3, &dtype)) {
        rc = bad_arg("--dtype '%s': expected auto, u16 or u32", argv[i]);
        goto cleanup;
      }
    } else if (!strcmp(a, "--threads") && has) {
      char *end;
      long t = strtol(argv[++i], &end, 10);
      if (*end || t < 1 || t > 1024) {
        rc = bad_arg("--threads '%s': expected an integer in [1, 1024]", argv[i]);
        goto cleanup;
      }
      o.threads = (int)t;
    } else if (!strcmp(a, "--no-progress"))
      o.progress = false;
    else if (!strcmp(a, "--text") && has)
      text = argv[++i];
    else if (!strcmp(a, "--pieces"))
      pieces = true;
    else if (a[0] == '-' && a[1]) {
      static const char *const valued[] = {"-o",      "--output",  "--index", "--format",
                                           "--field", "--doc",     "--eos",   "--utf8",
                                           "--dtype", "--threads", "--text"};
      int k;
      rc = bad_arg(pick(a, valued, 11, &k) ? "'%s' needs a value" : "unknown option '%s'", a);
      goto cleanup;
    } else if (!tokenizer)
      tokenizer = a;
    else
      inputs[o.ninputs++] = a;
  }
  if (!tokenizer) {
    rc = bad_arg("%s", "no TOKENIZER.json given");
    goto cleanup;
  }
  tsr_tokenizer_t *tok = NULL;
  tsr_status s = tsr_tokenizer_load(tokenizer, &tok);
  if (s != TSR_OK) {
    rc = fail(s);
    goto cleanup;
  }
  unsigned flags =
      (o.add_special ? TSR_TOK_ADD_SPECIAL : 0u) | (o.split_special ? TSR_TOK_SPLIT_SPECIAL : 0u);
  if (text) {
    rc = o.ninputs || o.out ? bad_arg("%s", "--text takes no input files and no -o")
                            : print_ids(tok, text, flags, pieces);
    goto done;
  }
  if (!o.out || !o.ninputs) {
    rc = bad_arg("%s", !o.out ? "no -o OUT given" : "no input FILE given");
    goto done;
  }
  char index[4200];
  if (!o.index) {
    if (snprintf(index, sizeof index, "%s.idx", o.out) >= (int)sizeof index) {
      rc = bad_arg("-o '%s': path too long", o.out);
      goto done;
    }
    o.index = index;
  }
  if (!strcmp(o.index, o.out)) {
    rc = bad_arg("--index '%s' is the token file", o.index);
    goto done;
  }
  int32_t vocab = tsr_tokenizer_vocab_size(tok);
  o.token_bytes = dtype == 2 || (dtype == 0 && vocab > 65536) ? 4 : 2;
  if (o.token_bytes == 2 && vocab > 65536) {
    fprintf(stderr, "tessera tokenize: --dtype u16: %s has ids up to %d, above 65535; use u32\n",
            tokenizer, (int)vocab - 1);
    goto done;
  }
  const char *eos_from = "--eos";
  if (eos && !strcmp(eos, "none"))
    o.eos = -1;
  else if (eos && (o.eos = tsr_tokenizer_token_to_id(tok, eos)) < 0) {
    fprintf(stderr, "tessera tokenize: --eos '%s' is not a token of %s\n", eos, tokenizer);
    goto done;
  } else if (!eos && (o.eos = tsr_tokenizer_eos(tok, &eos_from)) < 0) {
    fprintf(stderr,
            "tessera tokenize: %s names no EOS token (no tokenizer_config.json eos_token, no "
            "special </s>, <|end_of_text|>, <|endoftext|> or <eos>); give --eos TOKEN, or "
            "--eos none\n",
            tokenizer);
    goto done;
  }
  o.inputs = inputs;
  o.format = (tsr_corpus_format)format;
  o.doc_per_file = doc == 1;
  o.utf8_replace = utf8 == 1;
  if (!o.threads) o.threads = tsr_kernel_num_cores();
  tsr_corpus_stats st;
  s = tsr_corpus_tokenize(tok, &o, &st);
  if (s != TSR_OK) {
    rc = fail(s);
    goto done;
  }
  double mb = (double)st.bytes / 1e6;
  printf("tokenized %d file%s, %.2f MB, %llu documents", o.ninputs, o.ninputs == 1 ? "" : "s", mb,
         (unsigned long long)st.docs);
  if (st.empty) printf(" (%llu empty skipped)", (unsigned long long)st.empty);
  printf(", into %llu tokens in %.2f s: %.2f MB/s, %.2f M tokens/s on %d thread%s (%.2f CPU s, "
         "%.2f MB/s per core)\n",
         (unsigned long long)st.tokens, st.seconds, st.seconds > 0 ? mb / st.seconds : 0.0,
         st.seconds > 0 ? (double)st.tokens / st.seconds / 1e6 : 0.0, o.threads,
         o.threads == 1 ? "" : "s", st.cpu_seconds, st.cpu_seconds > 0 ? mb / st.cpu_seconds : 0.0);
  printf("per document: %u token%s before the text, %u after (EOS %s from %s)\n", st.head,
         st.head == 1 ? "" : "s", st.tail,
         o.eos >= 0 ? tsr_tokenizer_id_to_token(tok, o.eos) : "none",
         o.eos >= 0 ? eos_from : "--eos none");
  printf("wrote %s ([data] source = %s:%s, vocab_size >= %d) and its index %s\n", o.out,
         o.token_bytes == 2 ? "tokens" : "tokens32", o.out, (int)vocab, o.index);
  rc = TSR_EXIT_OK;
done:
  tsr_tokenizer_free(tok);
cleanup:
  free(inputs);
  return rc;
}
