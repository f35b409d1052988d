/* The pipeline components of a tokenizer.json: normalizer, pre_tokenizer, post_processor and
 * decoder. Sequences are flattened into one list per kind (a sequence of sequences applies the
 * same steps in the same order). Types the Llama, Mistral and GPT-2 files use are implemented;
 * any other is refused naming its key, with the list of those that load. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tok_load.h"

/* The regex ByteLevel splits with when use_regex is true (GPT-2's), in Oniguruma syntax. */
const char tok_gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* `{"String": s}` or `{"Regex": r}`. A String is kept as text in *lit when lit is not NULL (a
 * plain search is faster), else compiled as a literal. */
static tsr_status load_pattern(tok_ld *ld, const cJSON *obj, const char *key, pcre2_code **re,
                               char **lit, size_t *nlit) {
  char k[256];
  snprintf(k, sizeof k, "%s.pattern", key);
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
  const cJSON *str = cJSON_GetObjectItemCaseSensitive(p, "String");
  const cJSON *rx = cJSON_GetObjectItemCaseSensitive(p, "Regex");
  if (!cJSON_IsObject(p) || (!cJSON_IsString(str) && !cJSON_IsString(rx)))
    return tok_bad(ld, k, "is %s; expected {\"String\": ...} or {\"Regex\": ...}",
                   tok_json_kind(p));
  if (cJSON_IsString(str)) {
    size_t n = strlen(str->valuestring);
    if (!n) return tok_bad(ld, k, "the String pattern is empty");
    if (lit) {
      if (!(*lit = tok_strndup(str->valuestring, n))) return tok_oom(ld);
      *nlit = n;
      return TSR_OK;
    }
    snprintf(k, sizeof k, "%s.pattern.String", key);
    return tok_regex_compile(str->valuestring, n, true, ld->file, k, re);
  }
  snprintf(k, sizeof k, "%s.pattern.Regex", key);
  return tok_regex_compile(rx->valuestring, strlen(rx->valuestring), false, ld->file, k, re);
}

static tsr_status type_of(tok_ld *ld, const cJSON *obj, const char *key, const char **type) {
  if (!cJSON_IsObject(obj))
    return tok_bad(ld, key, "is %s; expected an object with a \"type\"", tok_json_kind(obj));
  return tok_get_str(ld, obj, "type", key, true, type);
}

static tsr_status unsupported(tok_ld *ld, const char *key, const char *type, const char *known) {
  return tok_bad(ld, key,
                 "type '%s' is not supported; this build implements %s (docs/tokenize.md "
                 "lists what each does)",
                 type, known);
}

/* Calls `one` on every element of array `name` of obj, with its key. */
typedef tsr_status (*load_fn)(tok_ld *ld, const cJSON *item, const char *key);
static tsr_status each(tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                       load_fn one) {
  char k[256];
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, name);
  snprintf(k, sizeof k, "%s.%s", key, name);
  if (!cJSON_IsArray(arr)) return tok_bad(ld, k, "is %s; expected an array", tok_json_kind(arr));
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    snprintf(k, sizeof k, "%s.%s[%d]", key, name, i++);
    TSR_CHECK(one(ld, e, k));
  }
  return TSR_OK;
}

static tsr_status too_many(tok_ld *ld, const char *key) {
  return tok_bad(ld, key, "more than %d steps of one kind", TOK_MAX_STAGES);
}

/* ---- normalizers ---- */

static tsr_status load_norm(tok_ld *ld, const cJSON *n, const char *key) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!n || cJSON_IsNull(n)) return TSR_OK;
  const char *type;
  TSR_CHECK(type_of(ld, n, key, &type));
  if (!strcmp(type, "Sequence")) return each(ld, n, "normalizers", key, load_norm);
  if (tok->nnorm == TOK_MAX_STAGES) return too_many(ld, key);
  tok_normalizer *d = &tok->norm[tok->nnorm];
  memset(d, 0, sizeof *d);
  if (!strcmp(type, "Prepend") || !strcmp(type, "Replace")) {
    bool prepend = !strcmp(type, "Prepend");
    const char *text;
    TSR_CHECK(tok_get_str(ld, n, prepend ? "prepend" : "content", key, true, &text));
    d->kind = prepend ? NORM_PREPEND : NORM_REPLACE;
    d->text_len = strlen(text);
    if (!(d->text = tok_strndup(text, d->text_len))) return tok_oom(ld);
    tok->nnorm++; /* counted now, so that free() releases what the pattern adds */
    if (!prepend) TSR_CHECK(load_pattern(ld, n, key, &d->re, &d->pat, &d->pat_len));
    return TSR_OK;
  }
  if (!strcmp(type, "Strip")) {
    d->kind = NORM_STRIP;
    TSR_CHECK(tok_get_bool(ld, n, "strip_left", key, true, &d->left));
    TSR_CHECK(tok_get_bool(ld, n, "strip_right", key, true, &d->right));
    tok->nnorm++;
    return TSR_OK;
  }
  return unsupported(ld, key, type, "the normalizers Sequence, Prepend, Replace and Strip");
}

/* ---- pre-tokenizers ---- */

static tsr_status prepend_scheme(tok_ld *ld, const cJSON *o, const char *key, tok_prepend *out) {
  const char *scheme;
  bool add;
  TSR_CHECK(tok_get_str(ld, o, "prepend_scheme", key, false, &scheme));
  TSR_CHECK(tok_get_bool(ld, o, "add_prefix_space", key, true, &add));
  *out = PREPEND_ALWAYS;
  if (!scheme) {
    /* files before prepend_scheme existed: add_prefix_space alone */
    if (!add) *out = PREPEND_NEVER;
    return TSR_OK;
  }
  if (!strcmp(scheme, "first"))
    *out = PREPEND_FIRST;
  else if (!strcmp(scheme, "never"))
    *out = PREPEND_NEVER;
  else if (strcmp(scheme, "always"))
    return tok_bad(ld, key, "'prepend_scheme' is \"%s\"; expected always, first or never", scheme);
  return TSR_OK;
}

static tsr_status replacement_char(tok_ld *ld, const cJSON *o, const char *key, char *out,
                                   size_t *len) {
  const char *r;
  TSR_CHECK(tok_get_str(ld, o, "replacement", key, true, &r));
  size_t n = strlen(r);
  if (!n || n > 4 || tsr_utf8_valid_prefix(r, n) != n || tok_utf8_len((unsigned char)r[0]) != n)
    return tok_bad(ld, key, "'replacement' \"%s\" is not one character", r);
  memcpy(out, r, n);
  out[n] = '\0';
  *len = n;
  return TSR_OK;
}

/* JIT-compiled code is matched through pcre2_jit_match, which skips pcre2_match's checks. */
static tsr_status finish_regex(tok_pretok *d) {
  size_t jit = 0;
  d->jit = pcre2_pattern_info(d->re, PCRE2_INFO_JITSIZE, &jit) == 0 && jit > 0;
  return TSR_OK;
}

static tsr_status load_pre(tok_ld *ld, const cJSON *p, const char *key) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!p || cJSON_IsNull(p)) return TSR_OK;
  const char *type;
  TSR_CHECK(type_of(ld, p, key, &type));
  if (!strcmp(type, "Sequence")) return each(ld, p, "pretokenizers", key, load_pre);
  if (tok->npre == TOK_MAX_STAGES) return too_many(ld, key);
  /* The model reads bytes straight from the text after ByteLevel, so nothing may follow it. */
  if (tok->byte_level)
    return tok_bad(ld, key,
                   "comes after the ByteLevel pre-tokenizer; only a ByteLevel last in the "
                   "sequence is supported");
  tok_pretok *d = &tok->pre[tok->npre];
  memset(d, 0, sizeof *d);
  if (!strcmp(type, "Split")) {
    const char *behavior;
    TSR_CHECK(tok_get_str(ld, p, "behavior", key, true, &behavior));
    static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    int b = -1;
    for (int i = 0; i < 5; i++)
      if (!strcmp(behavior, names[i])) b = i;
    if (b < 0)
      return tok_bad(ld, key,
                     "'behavior' \"%s\" is not one of Isolated, Removed, MergedWithPrevious, "
                     "MergedWithNext, Contiguous",
                     behavior);
    d->kind = PRE_SPLIT;
    d->behavior = (tok_split_behavior)b;
    TSR_CHECK(tok_get_bool(ld, p, "invert", key, false, &d->invert));
    tok->npre++;
    TSR_CHECK(load_pattern(ld, p, key, &d->re, NULL, NULL));
    const cJSON *rx =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(p, "pattern"), "Regex");
    if (cJSON_IsString(rx))
      d->fast = tok_fast_kind(rx->valuestring, strlen(rx->valuestring), false);
    return finish_regex(d);
  }
  if (!strcmp(type, "ByteLevel")) {
    bool regex;
    d->kind = PRE_BYTELEVEL;
    TSR_CHECK(tok_get_bool(ld, p, "add_prefix_space", key, true, &d->add_prefix_space));
    TSR_CHECK(tok_get_bool(ld, p, "use_regex", key, true, &regex));
    tok->npre++;
    tok->byte_level = true;
    if (!regex) return TSR_OK;
    char k[256];
    snprintf(k, sizeof k, "%s (GPT-2's regex)", key);
    TSR_CHECK(
        tok_regex_compile(tok_gpt2_pattern, strlen(tok_gpt2_pattern), false, ld->file, k, &d->re));
    d->fast = tok_fast_kind(tok_gpt2_pattern, strlen(tok_gpt2_pattern), true);
    return finish_regex(d);
  }
  if (!strcmp(type, "Metaspace")) {
    d->kind = PRE_METASPACE;
    TSR_CHECK(replacement_char(ld, p, key, d->repl, &d->repl_len));
    TSR_CHECK(prepend_scheme(ld, p, key, &d->prepend));
    TSR_CHECK(tok_get_bool(ld, p, "split", key, true, &d->split));
    tok->npre++;
    return TSR_OK;
  }
  return unsupported(ld, key, type, "the pre-tokenizers Sequence, Split, ByteLevel and Metaspace");
}

/* ---- decoders ---- */

static tsr_status load_dec(tok_ld *ld, const cJSON *p, const char *key) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!p || cJSON_IsNull(p)) return TSR_OK;
  const char *type;
  TSR_CHECK(type_of(ld, p, key, &type));
  if (!strcmp(type, "Sequence")) return each(ld, p, "decoders", key, load_dec);
  if (tok->ndec == TOK_MAX_STAGES) return too_many(ld, key);
  tok_decoder *d = &tok->dec[tok->ndec];
  memset(d, 0, sizeof *d);
  if (!strcmp(type, "ByteLevel") || !strcmp(type, "ByteFallback") || !strcmp(type, "Fuse")) {
    d->kind = !strcmp(type, "ByteLevel")      ? DEC_BYTELEVEL
              : !strcmp(type, "ByteFallback") ? DEC_BYTEFALLBACK
                                              : DEC_FUSE;
    tok->ndec++;
    return TSR_OK;
  }
  if (!strcmp(type, "Metaspace")) {
    char r[5];
    d->kind = DEC_METASPACE;
    TSR_CHECK(replacement_char(ld, p, key, r, &d->text_len));
    TSR_CHECK(prepend_scheme(ld, p, key, &d->prepend));
    if (!(d->text = tok_strndup(r, d->text_len))) return tok_oom(ld);
    tok->ndec++;
    return TSR_OK;
  }
  if (!strcmp(type, "Replace")) {
    const char *text;
    d->kind = DEC_REPLACE;
    TSR_CHECK(tok_get_str(ld, p, "content", key, true, &text));
    d->text_len = strlen(text);
    if (!(d->text = tok_strndup(text, d->text_len))) return tok_oom(ld);
    tok->ndec++;
    return load_pattern(ld, p, key, &d->re, &d->pat, &d->pat_len);
  }
  if (!strcmp(type, "Strip")) {
    const char *c;
    int64_t start, stop;
    d->kind = DEC_STRIP;
    TSR_CHECK(tok_get_str(ld, p, "content", key, true, &c));
    size_t n = strlen(c);
    if (!n || tsr_utf8_valid_prefix(c, n) != n || tok_utf8_len((unsigned char)c[0]) != n)
      return tok_bad(ld, key, "'content' \"%s\" is not one character", c);
    d->strip_cp = tok_utf8_decode(c);
    TSR_CHECK(tok_get_int(ld, p, "start", key, 0, 1 << 20, 0, &start));
    TSR_CHECK(tok_get_int(ld, p, "stop", key, 0, 1 << 20, 0, &stop));
    d->strip_start = (int)start, d->strip_stop = (int)stop;
    tok->ndec++;
    return TSR_OK;
  }
  return unsupported(ld, key, type,
                     "the decoders Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse "
                     "and Strip");
}

/* ---- post-processors ---- */

static tsr_status set_template(tok_ld *ld, const char *key, const int32_t *head, int nhead,
                               const int32_t *tail, int ntail) {
  tsr_tokenizer_t *tok = ld->tok;
  if (tok->head || tok->tail)
    return tok_bad(ld, key, "a second post-processor that adds tokens; only one is supported");
  tok->head = malloc(((size_t)nhead + 1) * sizeof *tok->head);
  tok->tail = malloc(((size_t)ntail + 1) * sizeof *tok->tail);
  if (!tok->head || !tok->tail) return tok_oom(ld);
  memcpy(tok->head, head, (size_t)nhead * sizeof *head);
  memcpy(tok->tail, tail, (size_t)ntail * sizeof *tail);
  tok->nhead = nhead, tok->ntail = ntail;
  return TSR_OK;
}

static tsr_status template_single(tok_ld *ld, const cJSON *p, const char *key) {
  char k[256];
  int32_t ids[2][64];
  int n[2] = {0, 0}, part = 0;
  const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
  const cJSON *specials = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
  snprintf(k, sizeof k, "%s.single", key);
  if (!cJSON_IsArray(single))
    return tok_bad(ld, k, "is %s; expected an array", tok_json_kind(single));
  int i = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, single) {
    snprintf(k, sizeof k, "%s.single[%d]", key, i++);
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(e, "SpecialToken");
    const cJSON *seq = cJSON_GetObjectItemCaseSensitive(e, "Sequence");
    if (cJSON_IsObject(seq)) {
      const cJSON *id = cJSON_GetObjectItemCaseSensitive(seq, "id");
      if (!cJSON_IsString(id) || strcmp(id->valuestring, "A") || part == 1)
        return tok_bad(ld, k, "a single sequence's template holds Sequence A once");
      part = 1;
      continue;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp, "id");
    if (!cJSON_IsObject(sp) || !cJSON_IsString(name))
      return tok_bad(ld, k, "expected {\"SpecialToken\": {\"id\": ...}} or {\"Sequence\": ...}");
    const cJSON *def = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(def, "ids");
    if (!cJSON_IsArray(list))
      return tok_bad(ld, k, "\"%s\" has no ids in %s.special_tokens", name->valuestring, key);
    const cJSON *v;
    cJSON_ArrayForEach(v, list) {
      int32_t id = cJSON_IsNumber(v) ? (int32_t)v->valuedouble : -1;
      if (!tsr_tokenizer_id_to_token(ld->tok, id))
        return tok_bad(ld, k, "\"%s\" has id %s, which no token has", name->valuestring,
                       cJSON_IsNumber(v) ? "out of the vocabulary" : tok_json_kind(v));
      if (n[part] == 64) return tok_bad(ld, k, "more than 64 special tokens on one side");
      ids[part][n[part]++] = id;
    }
  }
  if (!part) return tok_bad(ld, k, "the single template has no Sequence A");
  return set_template(ld, key, ids[0], n[0], ids[1], n[1]);
}

/* BertProcessing / RobertaProcessing: [cls] A [sep], each given as ["token", id]. */
static tsr_status cls_sep(tok_ld *ld, const cJSON *p, const char *key) {
  int32_t ids[2];
  static const char *const names[] = {"cls", "sep"};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(p, names[i]);
    const cJSON *id = cJSON_GetArrayItem(v, 1);
    ids[i] = cJSON_IsNumber(id) ? (int32_t)id->valuedouble : -1;
    if (!cJSON_IsArray(v) || !tsr_tokenizer_id_to_token(ld->tok, ids[i])) {
      char k[256];
      snprintf(k, sizeof k, "%s.%s", key, names[i]);
      return tok_bad(ld, k, "expected [\"token\", id] with an id of the vocabulary");
    }
  }
  return set_template(ld, key, &ids[0], 1, &ids[1], 1);
}

static tsr_status load_post_one(tok_ld *ld, const cJSON *p, const char *key) {
  if (!p || cJSON_IsNull(p)) return TSR_OK;
  const char *type;
  TSR_CHECK(type_of(ld, p, key, &type));
  if (!strcmp(type, "Sequence")) return each(ld, p, "processors", key, load_post_one);
  if (!strcmp(type, "ByteLevel")) return TSR_OK; /* it only adjusts offsets */
  if (!strcmp(type, "TemplateProcessing")) return template_single(ld, p, key);
  if (!strcmp(type, "BertProcessing") || !strcmp(type, "RobertaProcessing"))
    return cls_sep(ld, p, key);
  return unsupported(ld, key, type,
                     "the post-processors Sequence, TemplateProcessing, ByteLevel, "
                     "BertProcessing and RobertaProcessing");
}

tsr_status tok_load_post(tok_ld *ld, const cJSON *post) {
  return load_post_one(ld, post, "post_processor");
}

tsr_status tok_load_components(tok_ld *ld, const cJSON *root) {
  tsr_tokenizer_t *tok = ld->tok;
  TSR_CHECK(load_norm(ld, cJSON_GetObjectItemCaseSensitive(root, "normalizer"), "normalizer"));
  TSR_CHECK(load_pre(ld, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"), "pre_tokenizer"));
  const cJSON *dec = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  tok->has_decoder = dec && !cJSON_IsNull(dec);
  TSR_CHECK(load_dec(ld, dec, "decoder"));
  for (int i = 0; i < tok->nadded; i++)
    if (tok->added[i].single_word) {
      /* the regex crate's \w, which the Rust library tests the neighbours with */
      static const char word[] = "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]";
      return tok_regex_compile(word, strlen(word), false, ld->file, "added_tokens (single_word)",
                               &tok->word_re);
    }
  return TSR_OK;
}

void tok_free_components(tsr_tokenizer_t *tok) {
  for (int i = 0; i < tok->nnorm; i++) {
    free(tok->norm[i].text);
    free(tok->norm[i].pat);
    pcre2_code_free(tok->norm[i].re);
  }
  for (int i = 0; i < tok->npre; i++) pcre2_code_free(tok->pre[i].re);
  for (int i = 0; i < tok->ndec; i++) {
    free(tok->dec[i].text);
    free(tok->dec[i].pat);
    pcre2_code_free(tok->dec[i].re);
  }
  free(tok->head);
  free(tok->tail);
}
