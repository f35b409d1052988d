/* Shared by the two halves of the tokenizer.json reader: tok_load.c (model, added tokens) and
 * tok_components.c (normalizers, pre-tokenizers, post-processor, decoders). */
#ifndef TESSERA_TOK_LOAD_H
#define TESSERA_TOK_LOAD_H

#include <cJSON.h>

#include "tok_impl.h"

/* What a loader function works on: the file, for messages, and the tokenizer being filled. */
typedef struct tok_ld {
  const char *file;
  tsr_tokenizer_t *tok;
} tok_ld;

/* TSR_EINVAL "tokenizer FILE: KEY: message". */
tsr_status tok_bad(const tok_ld *ld, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
tsr_status tok_oom(const tok_ld *ld);
/* "a string", "an array", ... or "missing", for messages. */
const char *tok_json_kind(const cJSON *v);

/* Members of `obj` (at `key`, for messages); absent or null gives the default. */
tsr_status tok_get_bool(const tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                        bool dflt, bool *out);
tsr_status tok_get_int(const tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                       int64_t lo, int64_t hi, int64_t dflt, int64_t *out);
tsr_status tok_get_str(const tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                       bool required, const char **out);

char *tok_strndup(const char *s, size_t n);
/* The whole file, NUL-terminated (malloc'd). */
tsr_status tok_read_file(const char *path, char **text, size_t *len);

/* normalizer, pre_tokenizer and decoder of `root`; the single_word regex when needed */
tsr_status tok_load_components(tok_ld *ld, const cJSON *root);
/* post_processor (after the added tokens are indexed: templates name them) */
tsr_status tok_load_post(tok_ld *ld, const cJSON *post);
void tok_free_components(tsr_tokenizer_t *tok);

#endif
