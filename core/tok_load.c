/* tokenizer.json -> tsr_tokenizer_t: the model (BPE vocabulary and merges) and the added tokens.
 * The pipeline's components (normalizers, pre-tokenizers, post-processor, decoder) are read by
 * tok_components.c. Every refusal names the file and the JSON key and says what would load. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tok_load.h"

/* cJSON records its last parse error in a process-wide variable: serialise parses. */
static pthread_mutex_t json_lock = PTHREAD_MUTEX_INITIALIZER;

char *tok_strndup(const char *s, size_t n) {
  char *d = malloc(n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

tsr_status tok_bad(const tok_ld *ld, const char *key, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return tsr_error(TSR_EINVAL, "tokenizer %s: %s: %s", ld->file, key, msg);
}

tsr_status tok_oom(const tok_ld *ld) {
  return tsr_error(TSR_ENOMEM, "tokenizer %s: out of memory", ld->file);
}

const char *tok_json_kind(const cJSON *v) {
  if (!v) return "missing";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  return "an object";
}

tsr_status tok_get_bool(const tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                        bool dflt, bool *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  *out = dflt;
  if (!v || cJSON_IsNull(v)) return TSR_OK;
  if (!cJSON_IsBool(v))
    return tok_bad(ld, key, "'%s' is %s; expected true or false", name, tok_json_kind(v));
  *out = cJSON_IsTrue(v);
  return TSR_OK;
}

tsr_status tok_get_int(const tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                       int64_t lo, int64_t hi, int64_t dflt, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  *out = dflt;
  if (!v || cJSON_IsNull(v)) return TSR_OK;
  double d = cJSON_IsNumber(v) ? v->valuedouble : -1e300;
  if (!cJSON_IsNumber(v) || d != (double)(int64_t)d || d < (double)lo || d > (double)hi)
    return tok_bad(ld, key, "'%s' must be an integer in [%lld, %lld]", name, (long long)lo,
                   (long long)hi);
  *out = (int64_t)d;
  return TSR_OK;
}

/* A string member; NULL in *out when absent or null and not required. */
tsr_status tok_get_str(const tok_ld *ld, const cJSON *obj, const char *name, const char *key,
                       bool required, const char **out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
  *out = NULL;
  if (!v || cJSON_IsNull(v)) {
    if (required) return tok_bad(ld, key, "'%s' is missing", name);
    return TSR_OK;
  }
  if (!cJSON_IsString(v))
    return tok_bad(ld, key, "'%s' is %s; expected a string", name, tok_json_kind(v));
  *out = v->valuestring;
  return TSR_OK;
}

/* ---- the model ---- */

static tsr_status load_vocab(tok_ld *ld, const cJSON *vocab) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!cJSON_IsObject(vocab))
    return tok_bad(ld, "model.vocab", "is %s; expected an object of token: id",
                   tok_json_kind(vocab));
  const cJSON *e;
  cJSON_ArrayForEach(e, vocab) {
    double d = cJSON_IsNumber(e) ? e->valuedouble : -1;
    if (!cJSON_IsNumber(e) || d < 0 || d > INT32_MAX - 1 || d != (double)(int32_t)d)
      return tok_bad(ld, "model.vocab", "token \"%s\" has id %s; expected an integer in [0, %d]",
                     e->string, cJSON_IsNumber(e) ? "out of range" : tok_json_kind(e),
                     INT32_MAX - 1);
    int32_t id = (int32_t)d, old;
    if (!e->string[0]) return tok_bad(ld, "model.vocab", "has an empty token (id %d)", id);
    if (!tok_strmap_put(&tok->vocab, e->string, strlen(e->string), id, &old)) return tok_oom(ld);
    if (old >= 0) return tok_bad(ld, "model.vocab", "token \"%s\" appears twice", e->string);
    if (id >= tok->nids) tok->nids = id + 1;
  }
  if (!tok->vocab.n) return tok_bad(ld, "model.vocab", "is empty");
  return TSR_OK;
}

/* Merges are "a b" strings (files of tokenizers < 0.20) or ["a", "b"] pairs (newer). */
static tsr_status merge_parts(tok_ld *ld, const cJSON *m, int i, const char **a, size_t *na,
                              const char **b, size_t *nb) {
  char key[64];
  snprintf(key, sizeof key, "model.merges[%d]", i);
  if (cJSON_IsString(m)) {
    const char *s = m->valuestring, *sp = strchr(s, ' ');
    if (!sp || sp == s || !sp[1] || strchr(sp + 1, ' '))
      return tok_bad(ld, key, "\"%s\" is not two tokens separated by one space", s);
    *a = s, *na = (size_t)(sp - s), *b = sp + 1, *nb = strlen(sp + 1);
    return TSR_OK;
  }
  if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
      cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
    *a = cJSON_GetArrayItem(m, 0)->valuestring, *na = strlen(*a);
    *b = cJSON_GetArrayItem(m, 1)->valuestring, *nb = strlen(*b);
    return TSR_OK;
  }
  return tok_bad(ld, key, "is %s; expected \"a b\" or [\"a\", \"b\"]", tok_json_kind(m));
}

static tsr_status load_merges(tok_ld *ld, const cJSON *merges) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!cJSON_IsArray(merges))
    return tok_bad(ld, "model.merges", "is %s; expected an array", tok_json_kind(merges));
  tok_buf joined = {0};
  tsr_status s = TSR_OK;
  int i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, merges) {
    const char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    TSR_CHECK_GOTO(merge_parts(ld, m, i, &a, &na, &b, &nb), s);
    int32_t ia = tok_strmap_get(&tok->vocab, a, na), ib = tok_strmap_get(&tok->vocab, b, nb);
    joined.n = 0;
    if (!tok_buf_put(&joined, a, na) || !tok_buf_put(&joined, b, nb)) {
      s = tok_oom(ld);
      goto cleanup;
    }
    int32_t ij = tok_strmap_get(&tok->vocab, joined.p, joined.n);
    if (ia < 0 || ib < 0 || ij < 0) {
      char key[64];
      snprintf(key, sizeof key, "model.merges[%d]", i);
      s = tok_bad(ld, key, "\"%.*s\" + \"%.*s\": \"%.*s\" is not in model.vocab", (int)na, a,
                  (int)nb, b,
                  ia < 0   ? (int)na
                  : ib < 0 ? (int)nb
                           : (int)joined.n,
                  ia < 0   ? a
                  : ib < 0 ? b
                           : joined.p);
      goto cleanup;
    }
    if (!tok_merge_put(&tok->merges, ia, ib, i, ij)) {
      s = tok_oom(ld);
      goto cleanup;
    }
    i++;
  }
cleanup:
  tok_buf_free(&joined);
  return s;
}

static tsr_status load_model(tok_ld *ld, const cJSON *model) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!cJSON_IsObject(model))
    return tok_bad(ld, "model", "is %s; expected an object", tok_json_kind(model));
  const char *type;
  TSR_CHECK(tok_get_str(ld, model, "type", "model", false, &type));
  /* files of old versions leave out the type; vocab + merges is a BPE */
  if (!type && cJSON_GetObjectItemCaseSensitive(model, "merges")) type = "BPE";
  if (!type || strcmp(type, "BPE"))
    return tok_bad(ld, "model.type",
                   "'%s' is not supported; this build implements BPE (the model of Llama, "
                   "Mistral and GPT-2 tokenizers)",
                   type ? type : "(none)");
  const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
  if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0))
    return tok_bad(ld, "model.dropout",
                   "BPE dropout makes tokenization random; set it to null to tokenize a corpus");
  const char *prefix, *suffix, *unk;
  TSR_CHECK(tok_get_str(ld, model, "continuing_subword_prefix", "model", false, &prefix));
  TSR_CHECK(tok_get_str(ld, model, "end_of_word_suffix", "model", false, &suffix));
  if ((prefix && *prefix) || (suffix && *suffix))
    return tok_bad(
        ld, prefix && *prefix ? "model.continuing_subword_prefix" : "model.end_of_word_suffix",
        "\"%s\" is not supported (Llama and GPT-2 files have null or \"\")",
        prefix && *prefix ? prefix : suffix);
  TSR_CHECK(tok_get_bool(ld, model, "fuse_unk", "model", false, &tok->fuse_unk));
  TSR_CHECK(tok_get_bool(ld, model, "byte_fallback", "model", false, &tok->byte_fallback));
  TSR_CHECK(tok_get_bool(ld, model, "ignore_merges", "model", false, &tok->ignore_merges));
  TSR_CHECK(load_vocab(ld, cJSON_GetObjectItemCaseSensitive(model, "vocab")));
  TSR_CHECK(load_merges(ld, cJSON_GetObjectItemCaseSensitive(model, "merges")));
  TSR_CHECK(tok_get_str(ld, model, "unk_token", "model", false, &unk));
  tok->unk_id = -1;
  if (unk && (tok->unk_id = tok_strmap_get(&tok->vocab, unk, strlen(unk))) < 0)
    return tok_bad(ld, "model.unk_token", "\"%s\" is not in model.vocab", unk);
  for (int b = 0; b < 256; b++) {
    char name[8], ch[4];
    snprintf(name, sizeof name, "<0x%02X>", b);
    tok->byte_ids[b] = tok_strmap_get(&tok->vocab, name, 6);
    tok->level_char[b] = tok_byte_char((unsigned)b);
    tok->level_ids[b] = tok_strmap_get(&tok->vocab, ch, tok_utf8_encode(tok->level_char[b], ch));
    if (b < 128) {
      ch[0] = (char)b;
      tok->ascii_ids[b] = tok_strmap_get(&tok->vocab, ch, 1);
    }
  }
  return TSR_OK;
}

/* ---- added tokens ---- */

bool tok_trie_add(tok_trie *t, const char *s, size_t n, int32_t token) {
  if (!t->n) {
    if (!(t->nodes = malloc(64 * sizeof *t->nodes))) return false;
    t->cap = 64;
    t->nodes[0] = (tok_trie_node){-1, -1, -1, 0};
    t->n = 1;
  }
  int32_t cur = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    int32_t ch = t->nodes[cur].child;
    while (ch >= 0 && t->nodes[ch].byte != c) ch = t->nodes[ch].sibling;
    if (ch < 0) {
      if (t->n == t->cap) {
        tok_trie_node *p = realloc(t->nodes, 2 * t->cap * sizeof *p);
        if (!p) return false;
        t->nodes = p;
        t->cap *= 2;
      }
      ch = (int32_t)t->n++;
      t->nodes[ch] = (tok_trie_node){-1, t->nodes[cur].child, -1, c};
      t->nodes[cur].child = ch;
    }
    cur = ch;
  }
  /* two added tokens with one content: the first keeps it, as a map insert would */
  if (t->nodes[cur].token < 0) t->nodes[cur].token = token;
  if (!t->first[(unsigned char)s[0]]) t->nfirst++, t->only = (unsigned char)s[0];
  t->first[(unsigned char)s[0]] = true;
  return true;
}

void tok_trie_free(tok_trie *t) {
  free(t->nodes);
  memset(t, 0, sizeof *t);
}

static tsr_status load_added(tok_ld *ld, const cJSON *arr) {
  tsr_tokenizer_t *tok = ld->tok;
  if (!arr || cJSON_IsNull(arr)) return TSR_OK;
  if (!cJSON_IsArray(arr))
    return tok_bad(ld, "added_tokens", "is %s; expected an array", tok_json_kind(arr));
  int n = cJSON_GetArraySize(arr);
  if (!(tok->added = calloc((size_t)n + 1, sizeof *tok->added))) return tok_oom(ld);
  const cJSON *e;
  cJSON_ArrayForEach(e, arr) {
    char key[64];
    snprintf(key, sizeof key, "added_tokens[%d]", tok->nadded);
    if (!cJSON_IsObject(e)) return tok_bad(ld, key, "is %s; expected an object", tok_json_kind(e));
    tok_added *a = &tok->added[tok->nadded];
    const char *content;
    int64_t id;
    TSR_CHECK(tok_get_str(ld, e, "content", key, true, &content));
    TSR_CHECK(tok_get_int(ld, e, "id", key, 0, INT32_MAX - 1, -1, &id));
    if (id < 0) return tok_bad(ld, key, "'id' is missing");
    if (!*content) return tok_bad(ld, key, "'content' is empty");
    a->id = (int32_t)id;
    a->len = strlen(content);
    if (!(a->content = tok_strndup(content, a->len))) return tok_oom(ld);
    TSR_CHECK(tok_get_bool(ld, e, "special", key, false, &a->special));
    /* the Rust library's default: special tokens are matched in the raw text */
    TSR_CHECK(tok_get_bool(ld, e, "normalized", key, !a->special, &a->normalized));
    TSR_CHECK(tok_get_bool(ld, e, "lstrip", key, false, &a->lstrip));
    TSR_CHECK(tok_get_bool(ld, e, "rstrip", key, false, &a->rstrip));
    TSR_CHECK(tok_get_bool(ld, e, "single_word", key, false, &a->single_word));
    if (a->id >= tok->nids) tok->nids = a->id + 1;
    tok->nadded++;
  }
  return TSR_OK;
}

/* Every id's token string and special flag, and the tries of added tokens. Runs after the
 * normalizers are loaded: normalized added tokens are matched by their normalized content. */
static tsr_status index_tokens(tok_ld *ld) {
  tsr_tokenizer_t *tok = ld->tok;
  tok->id_token = calloc((size_t)tok->nids, sizeof *tok->id_token);
  tok->special = calloc((size_t)tok->nids, sizeof *tok->special);
  tok->norm_content = calloc((size_t)tok->nadded + 1, sizeof *tok->norm_content);
  tok->norm_len = calloc((size_t)tok->nadded + 1, sizeof *tok->norm_len);
  if (!tok->id_token || !tok->special || !tok->norm_content || !tok->norm_len) return tok_oom(ld);
  for (size_t i = 0; i < tok->vocab.cap; i++) {
    const tok_strmap_slot *s = &tok->vocab.slots[i];
    if (s->val < 0) continue;
    if (tok->id_token[s->val]) {
      return tok_bad(ld, "model.vocab", "id %d is given to two tokens, \"%s\" and \"%.*s\"", s->val,
                     tok->id_token[s->val], (int)s->len, tok_strmap_key(&tok->vocab, s));
    }
    if (!(tok->id_token[s->val] = tok_strndup(tok_strmap_key(&tok->vocab, s), s->len)))
      return tok_oom(ld);
  }
  tok_buf out = {0}, tmp = {0};
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  tsr_status st = md ? TSR_OK : tok_oom(ld);
  for (int i = 0; st == TSR_OK && i < tok->nadded; i++) {
    tok_added *a = &tok->added[i];
    const char *have = tok->id_token[a->id];
    if (have && strcmp(have, a->content)) {
      char key[64];
      snprintf(key, sizeof key, "added_tokens[%d]", i);
      st = tok_bad(ld, key, "id %d is \"%s\" here but \"%s\" in model.vocab", a->id, a->content,
                   have);
      break;
    }
    if (!have && !(tok->id_token[a->id] = tok_strndup(a->content, a->len))) st = tok_oom(ld);
    tok->special[a->id] = a->special;
    out.n = 0;
    if (st == TSR_OK && a->normalized && !tok_normalize(tok, a->content, a->len, &out, &tmp, md))
      st = tok_oom(ld);
    if (st != TSR_OK) break;
    const char *c = a->normalized ? out.p : a->content;
    size_t n = a->normalized ? out.n : a->len;
    if (!n) continue; /* normalized to nothing: it can never match */
    if (!(tok->norm_content[i] = tok_strndup(c, n))) st = tok_oom(ld);
    tok->norm_len[i] = n;
    if (st == TSR_OK && !tok_trie_add(a->normalized ? &tok->split_norm : &tok->split_raw, c, n, i))
      st = tok_oom(ld);
  }
  pcre2_match_data_free(md);
  tok_buf_free(&out);
  tok_buf_free(&tmp);
  return st;
}

/* tokenizer_config.json beside the file names the EOS token of the model; else the usual
 * names of the two families, among the special tokens. */
static void find_eos(tok_ld *ld) {
  tsr_tokenizer_t *tok = ld->tok;
  tok->eos = -1;
  const char *slash = strrchr(ld->file, '/');
  size_t dir = slash ? (size_t)(slash - ld->file) + 1 : 0;
  char path[4096];
  if (dir + sizeof "tokenizer_config.json" <= sizeof path) {
    memcpy(path, ld->file, dir);
    memcpy(path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    char *text = NULL;
    size_t len = 0;
    if (tok_read_file(path, &text, &len) == TSR_OK) {
      pthread_mutex_lock(&json_lock);
      cJSON *cfg = cJSON_ParseWithLength(text, len);
      pthread_mutex_unlock(&json_lock);
      const cJSON *e = cJSON_GetObjectItemCaseSensitive(cfg, "eos_token");
      if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "content");
      if (cJSON_IsString(e) && (tok->eos = tsr_tokenizer_token_to_id(tok, e->valuestring)) >= 0)
        snprintf(tok->eos_source, sizeof tok->eos_source, "tokenizer_config.json eos_token");
      cJSON_Delete(cfg);
      free(text);
    }
    tsr_clear_error();
  }
  static const char *const names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>", "<eos>"};
  for (size_t i = 0; tok->eos < 0 && i < sizeof names / sizeof names[0]; i++) {
    int32_t id = tsr_tokenizer_token_to_id(tok, names[i]);
    if (id >= 0 && tok->special[id]) {
      tok->eos = id;
      snprintf(tok->eos_source, sizeof tok->eos_source, "the special token %s", names[i]);
    }
  }
}

tsr_status tok_read_file(const char *path, char **text, size_t *len) {
  *text = NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return TSR_ERROR(TSR_EIO, "tokenizer %s: cannot open: %s", path, strerror(errno));
  tsr_status s = TSR_OK;
  struct stat sb;
  if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
    s = TSR_ERROR(TSR_EIO, "tokenizer %s: not a regular file", path);
    goto cleanup;
  }
  *len = (size_t)sb.st_size;
  if (!(*text = malloc(*len + 1))) {
    s = TSR_ERROR(TSR_ENOMEM, "tokenizer %s: out of memory for %zu bytes", path, *len);
    goto cleanup;
  }
  if (fread(*text, 1, *len, f) != *len) {
    s = TSR_ERROR(TSR_EIO, "tokenizer %s: read error", path);
    free(*text);
    *text = NULL;
    goto cleanup;
  }
  (*text)[*len] = '\0';
cleanup:
  fclose(f);
  return s;
}

tsr_status tsr_tokenizer_load(const char *path, tsr_tokenizer_t **out) {
  *out = NULL;
  if (!path) return TSR_ERROR(TSR_EINVAL, "tokenizer: NULL path");
  char *text = NULL;
  size_t len;
  TSR_CHECK(tok_read_file(path, &text, &len));
  pthread_mutex_lock(&json_lock);
  cJSON *root = cJSON_ParseWithLength(text, len);
  size_t err_at = root ? 0 : (size_t)(cJSON_GetErrorPtr() - text);
  pthread_mutex_unlock(&json_lock);
  tsr_status s = TSR_OK;
  tsr_tokenizer_t *tok = calloc(1, sizeof *tok);
  tok_ld ld = {path, tok};
  if (!tok || !(tok->path = tok_strndup(path, strlen(path)))) {
    s = tok_oom(&ld);
    goto cleanup;
  }
  if (!root) {
    size_t line = 1;
    for (size_t i = 0; i < err_at && i < len; i++) line += text[i] == '\n';
    s = TSR_ERROR(TSR_EINVAL, "tokenizer %s: line %zu: not valid JSON (byte %zu)", path, line,
                  err_at);
    goto cleanup;
  }
  if (!cJSON_IsObject(root)) {
    s = TSR_ERROR(TSR_EINVAL, "tokenizer %s: not a JSON object", path);
    goto cleanup;
  }
  TSR_CHECK_GOTO(load_model(&ld, cJSON_GetObjectItemCaseSensitive(root, "model")), s);
  TSR_CHECK_GOTO(load_added(&ld, cJSON_GetObjectItemCaseSensitive(root, "added_tokens")), s);
  TSR_CHECK_GOTO(tok_load_components(&ld, root), s);
  TSR_CHECK_GOTO(index_tokens(&ld), s);
  TSR_CHECK_GOTO(tok_load_post(&ld, cJSON_GetObjectItemCaseSensitive(root, "post_processor")), s);
  find_eos(&ld);
  *out = tok;
  tok = NULL;
cleanup:
  cJSON_Delete(root);
  free(text);
  tsr_tokenizer_free(tok);
  return s;
}

const char *tsr_tokenizer_path(const tsr_tokenizer_t *tok) {
  return tok->path;
}

int32_t tsr_tokenizer_vocab_size(const tsr_tokenizer_t *tok) {
  return tok->nids;
}

int32_t tsr_tokenizer_token_to_id(const tsr_tokenizer_t *tok, const char *token) {
  if (!token) return -1;
  size_t n = strlen(token);
  for (int i = 0; i < tok->nadded; i++)
    if (tok->added[i].len == n && !memcmp(tok->added[i].content, token, n)) return tok->added[i].id;
  return tok_strmap_get(&tok->vocab, token, n);
}

const char *tsr_tokenizer_id_to_token(const tsr_tokenizer_t *tok, int32_t id) {
  return id >= 0 && id < tok->nids ? tok->id_token[id] : NULL;
}

bool tsr_tokenizer_is_special(const tsr_tokenizer_t *tok, int32_t id) {
  return id >= 0 && id < tok->nids && tok->special[id];
}

void tsr_tokenizer_template(const tsr_tokenizer_t *tok, const int32_t **head, int *nhead,
                            const int32_t **tail, int *ntail) {
  *head = tok->head, *nhead = tok->nhead, *tail = tok->tail, *ntail = tok->ntail;
}

int32_t tsr_tokenizer_eos(const tsr_tokenizer_t *tok, const char **source) {
  if (source) *source = tok->eos >= 0 ? tok->eos_source : NULL;
  return tok->eos;
}

void tsr_tokenizer_free(tsr_tokenizer_t *tok) {
  if (!tok) return;
  tok_strmap_free(&tok->vocab);
  tok_mergemap_free(&tok->merges);
  for (int32_t i = 0; tok->id_token && i < tok->nids; i++) free(tok->id_token[i]);
  free(tok->id_token);
  free(tok->special);
  for (int i = 0; i < tok->nadded; i++) {
    free(tok->added[i].content);
    if (tok->norm_content) free(tok->norm_content[i]);
  }
  free(tok->added);
  free(tok->norm_content);
  free(tok->norm_len);
  tok_trie_free(&tok->split_raw);
  tok_trie_free(&tok->split_norm);
  pcre2_code_free(tok->word_re);
  tok_free_components(tok);
  free(tok->path);
  free(tok);
}
