/* `tessera conform`: the jobs the tests write, their variants, and finding a registration again
 * in the job variants that make it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "conform.h"

/* The other plugins of the tree, for the combinations of L1 and L3, and zdp, the suite's own data
 * split on a dim of its own name (plugins/conform). */
const char *const cf_known_plugins[CF_NKNOWN] = {
    "dp", "tp", "sp", "pp", "cp_ring", "cp_ulysses", "zdp",
};

/* ---- Jobs ---- */

typedef struct cf_model {
  int vocab, hidden, inter, layers, heads, kv, batch, seq;
  bool tied;
  int experts, top_k; /* sparse MoE layers: experts per layer and per token; 0: dense */
  double aux;         /* their router_aux_loss_coef */
  bool docs;          /* [data] mask = document on the suite's packed documents (cf_docs_source) */
} cf_model;

/* 0, 1: the L2 registration jobs (12 heads split over 1-4 ranks; kv heads split, or a single kv
 * head replicated); 2: the L3 model, small enough to run a step in milliseconds; 3, 4: the L3
 * model with tied embeddings, and with a single kv head (L3.reach); 5: the L3 model with sparse
 * MoE layers, 4 experts of which each token uses 2 (split by 1, 2 or 4 ranks), with the
 * load-balancing loss; 6: without it (the model refuses that loss over pipeline stages); 7: the
 * L3 model with a single kv head on packed documents, [data] mask = document (L3.reach). */
static const cf_model models[] = {
    {48, 48, 64, 4, 12, 12, 4, 24, false, 0, 0, 0, false},
    {48, 48, 64, 4, 12, 1, 4, 24, false, 0, 0, 0, false},
    {32, 32, 40, 4, 4, 2, 6, 16, false, 0, 0, 0, false},
    {32, 32, 40, 4, 4, 2, 6, 16, true, 0, 0, 0, false},
    {32, 32, 40, 4, 4, 1, 6, 16, false, 0, 0, 0, false},
    {32, 32, 40, 4, 4, 2, 6, 16, false, 4, 2, 0.02, false},
    {32, 32, 40, 4, 4, 2, 6, 16, false, 4, 2, 0, false},
    {32, 32, 40, 4, 4, 1, 6, 16, false, 0, 0, 0, true},
};

/* Packed documents for the document-masked model, written once into the suite's directory: 640
 * ids below 32 in documents of 1 to 12 tokens, and their index (tessera/doc_index.h). The source
 * value (tokens:PATH) goes into buf; "" when the files cannot be written. */
static void cf_docs_source(char *buf, size_t len) {
  char path[TSR_MAX_PATH + 16], idx[TSR_MAX_PATH + 32];
  snprintf(path, sizeof path, "%s/docs.bin", cf_suite_dir);
  snprintf(idx, sizeof idx, "%s.idx", path);
  snprintf(buf, len, "tokens:%s", path);
  struct stat sb;
  if (stat(idx, &sb) == 0) return;
  enum { N = 640 };
  unsigned char tok[2 * N], head[64] = {0};
  uint64_t off[N + 1], nd = 0, x = 12345;
  off[0] = 0;
  for (uint64_t at = 0; at < N; nd++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t n = 1 + (x >> 33) % 12;
    at = at + n < N ? at + n : N;
    off[nd + 1] = at;
  }
  for (int i = 0; i < N; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    tok[2 * i] = (unsigned char)((x >> 33) % 32), tok[2 * i + 1] = 0;
  }
  /* little-endian fields: magic, version 1, 2-byte tokens, ndocs, ntokens, head 0, tail 0, eos -1
   */
  memcpy(head, "TSRDOCS1", 8);
  head[8] = 1, head[12] = 2;
  for (int b = 0; b < 8; b++) head[16 + b] = (unsigned char)(nd >> (8 * b));
  for (int b = 0; b < 8; b++) head[24 + b] = (unsigned char)((uint64_t)N >> (8 * b));
  memset(head + 40, 0xff, 4);
  FILE *t = fopen(path, "wb"), *f = fopen(idx, "wb");
  bool ok = t && f && fwrite(tok, 1, sizeof tok, t) == sizeof tok &&
            fwrite(head, 1, sizeof head, f) == sizeof head;
  for (uint64_t i = 0; ok && i <= nd; i++) {
    unsigned char o[8];
    for (int b = 0; b < 8; b++) o[b] = (unsigned char)(off[i] >> (8 * b));
    ok = fwrite(o, 1, 8, f) == 8;
  }
  if (t && fclose(t) != 0) ok = false;
  if (f && fclose(f) != 0) ok = false;
  if (!ok) buf[0] = '\0';
}

void cf_job_text(char *buf, size_t len, int ndim, const char *const *dims, const int *shape,
                 const char *load, int model, const char *mode, const char *extra) {
  const cf_model *m = &models[model];
  char d[512] = "dp", s[128] = "1";
  size_t od = 0, os = 0;
  for (int i = 0; i < ndim; i++) {
    od += (size_t)snprintf(d + od, sizeof d - od, "%s%s", i ? ", " : "", dims[i]);
    os += (size_t)snprintf(s + os, sizeof s - os, "%s%d", i ? ", " : "", shape[i]);
  }
  char moe[160] = "", source[TSR_MAX_PATH + 32] = "synthetic", mask[32] = "";
  if (m->docs) {
    cf_docs_source(source, sizeof source);
    snprintf(mask, sizeof mask, "mask = document\n");
  }
  if (m->experts)
    snprintf(moe, sizeof moe,
             "num_local_experts = %d\nnum_experts_per_tok = %d\nrouter_aux_loss_coef = %g\n",
             m->experts, m->top_k, m->aux);
  snprintf(buf, len,
           "[job]\nmode = %s\nsteps = 1\nseed = 7\nbackend = local\ndevice = cpu\ntimeout_s = 20\n"
           "[mesh]\ndims = %s\nshape = %s\n"
           "[plugins]\nload = %s\n"
           "[model]\nvocab_size = %d\nhidden_size = %d\nintermediate_size = %d\n"
           "num_hidden_layers = %d\nnum_attention_heads = %d\nnum_key_value_heads = %d\n"
           "rms_norm_eps = 1e-5\nrope_theta = 10000\ntie_word_embeddings = %s\n%s"
           "[data]\nsource = %s\nbatch_size = %d\nseq_len = %d\n%s"
           "[optimizer]\nlr = 1e-2\nweight_decay = 0.1\nmax_norm = 1.0\n%s",
           mode, d, s, load, m->vocab, m->hidden, m->inter, m->layers, m->heads, m->kv,
           m->tied ? "true" : "false", moe, source, m->batch, m->seq, mask, extra ? extra : "");
}

void cf_load_list(const cf_plugin *p, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; i < p->nrequired; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s, ", p->required[i]);
  snprintf(buf + o, len - o, "%s", p->name);
}

/* ---- The rank allocators, watched ---- */

_Atomic int64_t cf_rank_leftover;

static tsr_status watch_setup(tsr_rank_t *r, void *ctx, void **state) {
  (void)r, (void)ctx;
  static int made; /* any non-NULL state */
  *state = &made;
  return TSR_OK;
}

/* Registered before any plugin, so it runs last in tsr_rank_free: after the model, the optimizer
 * and every plugin's rank state are gone, just before the allocator is released. */
static void watch_teardown(tsr_rank_t *r, void *state, void *ctx) {
  (void)state, (void)ctx;
  cf_rank_leftover += (int64_t)tsr_rank_allocator(r)->bytes_in_use;
}

static tsr_status watch_hook(tsr_rank_t *r, tsr_hook_when when, const tsr_optim_step *step,
                             void *ctx) {
  (void)when, (void)step, (void)ctx;
  cf_rank_watch(r);
  return TSR_OK;
}

void cf_rank_watch(tsr_rank_t *r) {
  void *s;
  if (tsr_rank_registry(r)) tsr_rank_state(r, CF_WATCH_STATE, &s);
}

tsr_status cf_watched_registry_new(tsr_registry_t **reg) {
  TSR_CHECK(tsr_registry_new(reg));
  tsr_rank_state_spec spec = {CF_WATCH_STATE, watch_setup, watch_teardown, NULL};
  tsr_optim_hook hook = {CF_WATCH_STATE, TSR_HOOK_BEFORE_STEP, watch_hook, NULL};
  tsr_status st = tsr_registry_add_rank_state(*reg, &spec);
  if (st == TSR_OK) st = tsr_registry_add_optim_hook(*reg, &hook);
  if (st != TSR_OK) {
    tsr_registry_free(*reg);
    *reg = NULL;
  }
  return st;
}

tsr_status cf_job_load_watched(const char *text, tsr_config **cfg, tsr_registry_t **reg,
                               tsr_plugin_set_t **set) {
  return cf_job_load_into(text, true, cfg, reg, set);
}

tsr_status cf_job_load(const char *text, tsr_config **cfg, tsr_registry_t **reg,
                       tsr_plugin_set_t **set) {
  return cf_job_load_into(text, false, cfg, reg, set);
}

tsr_status cf_job_load_into(const char *text, bool watched, tsr_config **cfg, tsr_registry_t **reg,
                            tsr_plugin_set_t **set) {
  *cfg = NULL, *reg = NULL, *set = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_config_parse_string(text, "conform.ini", cfg), st);
  TSR_CHECK_GOTO(watched ? cf_watched_registry_new(reg) : tsr_registry_new(reg), st);
  TSR_CHECK_GOTO(tsr_plugin_set_load(*cfg, *reg, set), st);
  return TSR_OK;
cleanup : {
  char keep[4096];
  snprintf(keep, sizeof keep, "%s", tsr_last_error());
  cf_job_free(*cfg, *reg, *set);
  *cfg = NULL, *reg = NULL, *set = NULL;
  tsr_error(st, "%s", keep);
}
  return st;
}

void cf_job_free(tsr_config *cfg, tsr_registry_t *reg, tsr_plugin_set_t *set) {
  tsr_registry_free(reg); /* before the plugins: it points into them */
  tsr_plugin_set_free(set);
  tsr_config_free(cfg);
}

/* The alternatives of one ENUM or BOOL key other than its default. */
static int key_alternatives(const cf_key *key, char alts[][TSR_MAX_VALUE], int cap) {
  int nalt = 0;
  if (key->type == TSR_KEY_BOOL) {
    snprintf(alts[nalt++], TSR_MAX_VALUE, "%s", strcmp(key->def, "true") ? "true" : "false");
  } else if (key->type == TSR_KEY_ENUM) {
    const char *c = key->choices;
    while (*c && nalt < cap) {
      size_t l = strcspn(c, "|");
      if (!key->has_default || strlen(key->def) != l || strncmp(c, key->def, l))
        snprintf(alts[nalt++], TSR_MAX_VALUE, "%.*s", (int)l, c);
      c += l + (c[l] == '|');
    }
  }
  return nalt;
}

/* Variant v: model v % 2; key variant v / 2: 0 = defaults, then each ENUM/BOOL alternative
 * alone, then each again with every INT key one above its default (an alternative such as an
 * interleaved schedule may need a second key to change with it). */
bool cf_variant(const cf_plugin *p, int v, int *model, char *extra, size_t len) {
  *model = v % 2;
  int want = v / 2, k = 0;
  extra[0] = '\0';
  if (want == 0) return true;
  bool ints = false;
  for (int j = 0; j < p->nkeys; j++)
    ints |= p->keys[j].type == TSR_KEY_INT && p->keys[j].has_default;
  for (int pass = 0; pass < (ints ? 2 : 1); pass++)
    for (int i = 0; i < p->nkeys; i++) {
      char alts[8][TSR_MAX_VALUE];
      int nalt = key_alternatives(&p->keys[i], alts, 8);
      for (int a = 0; a < nalt; a++) {
        if (++k != want) continue;
        size_t o = (size_t)snprintf(extra, len, "[strategy.%s]\n%s = %s\n", p->name,
                                    p->keys[i].name, alts[a]);
        for (int j = 0; pass == 1 && j < p->nkeys && o < len; j++) {
          const cf_key *n = &p->keys[j];
          if (n->type != TSR_KEY_INT || !n->has_default) continue;
          double up = atof(n->def) + 1;
          if (up <= n->max) o += (size_t)snprintf(extra + o, len - o, "%s = %.0f\n", n->name, up);
        }
        return true;
      }
    }
  return false;
}

const char *cf_variant_str(const cf_plugin *p, int v, char *buf, size_t len) {
  char extra[512], keys[512] = "";
  int model;
  cf_variant(p, v, &model, extra, sizeof extra);
  size_t o = 0;
  for (char *sv = NULL, *line = strtok_r(extra, "\n", &sv); line && o < sizeof keys;
       line = strtok_r(NULL, "\n", &sv))
    if (line[0] != '[')
      o += (size_t)snprintf(keys + o, sizeof keys - o, "%s%s", o ? ", " : "", line);
  snprintf(buf, len, "%s%s%s", model ? "1 kv head" : "kv heads split", keys[0] ? ", " : "", keys);
  return buf;
}

bool cf_find_plugin(const char *name, char *out, size_t len) {
  static char dirs[32][TSR_MAX_PATH];
  int n = tsr_plugin_search_dirs(NULL, NULL, dirs, 32);
  /* the search path, then the suite's own plugins in its folders' conform/ */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < n; i++) {
      char c[TSR_MAX_PATH + TSR_MAX_NAME + 40];
      struct stat st;
      int l = snprintf(c, sizeof c, "%s%s/" TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX, dirs[i],
                       pass ? "/" CF_HELPER_DIR : "", name);
      if (l < 0 || (size_t)l >= sizeof c || (size_t)l >= len) continue;
      if (stat(c, &st) == 0 && S_ISREG(st.st_mode)) {
        memcpy(out, c, (size_t)l + 1);
        return true;
      }
    }
  return false;
}

void cf_helpers_on_path(void) {
  static char dirs[32][TSR_MAX_PATH];
  int n = tsr_plugin_search_dirs(NULL, NULL, dirs, 32);
  const char *old = getenv("TESSERA_PLUGIN_PATH");
  size_t len = (old ? strlen(old) : 0) + 1, o = 0;
  for (int i = 0; i < n; i++) len += strlen(dirs[i]) + sizeof CF_HELPER_DIR + 2;
  char *v = malloc(len);
  if (!v) return;
  o = (size_t)snprintf(v, len, "%s", old ? old : "");
  for (int i = 0; i < n && o < len; i++) {
    char d[TSR_MAX_PATH + 16];
    struct stat st;
    snprintf(d, sizeof d, "%s/%s", dirs[i], CF_HELPER_DIR);
    if (stat(d, &st) == 0 && S_ISDIR(st.st_mode)) {
      size_t l = strlen(d);
      if (o + l + 2 > len) break;
      if (o) v[o++] = ':';
      memcpy(v + o, d, l + 1);
      o += l;
    }
  }
  setenv("TESSERA_PLUGIN_PATH", v, 1);
  free(v);
}

/* ---- Finding the registration again ---- */

typedef struct variant_job {
  tsr_config *cfg;
  tsr_registry_t *reg;
  tsr_plugin_set_t *set;
} variant_job;

/* Loads the first job variant, with the item's dim of size n, whose registry has the item. */
static const void *find_item(const cf_plugin *p, const cf_item *it, int n, int *variant,
                             variant_job *job) {
  char load[512], extra[512], text[8192];
  cf_load_list(p, load, sizeof load);
  int model;
  for (int v = *variant; cf_variant(p, v, &model, extra, sizeof extra); v++) {
    *variant = v + 1;
    const char *dims[1] = {it->dim};
    int shape[1] = {n};
    cf_job_text(text, sizeof text, it->kind == CF_ITEM_SCHED ? 0 : 1, dims, shape, load, model,
                "train", extra);
    if (cf_job_load_watched(text, &job->cfg, &job->reg, &job->set) != TSR_OK) continue;
    const tsr_registry_t *reg = job->reg;
    for (int i = 0; it->kind == CF_ITEM_OP && i < tsr_registry_op_rule_count(reg); i++) {
      const tsr_op_rule *r = tsr_registry_op_rule_at(reg, i);
      if (!strcmp(r->name, it->name) && !strcmp(r->op, it->op)) return r;
    }
    for (int i = 0; it->kind == CF_ITEM_REDIST && i < tsr_registry_redistribute_count(reg); i++)
      if (!strcmp(tsr_registry_redistribute_at(reg, i)->name, it->name))
        return tsr_registry_redistribute_at(reg, i);
    if (it->kind == CF_ITEM_STYLE) {
      const tsr_module_style *s = tsr_registry_find_module_style(reg, it->name, it->dim);
      if (s && s->owner && !strcmp(s->owner, p->name)) return s;
    }
    if (it->kind == CF_ITEM_SCHED) {
      const tsr_schedule *s = tsr_registry_find_schedule(reg, it->name);
      if (s) return s;
    }
    cf_job_free(job->cfg, job->reg, job->set);
  }
  memset(job, 0, sizeof *job);
  return NULL;
}

cf_result cf_over_variants(const cf_plugin *p, const cf_test *t, int n, cf_variant_body body,
                           char *msg, size_t len) {
  const cf_item *it = &p->items[t->item];
  int v = 0, jobs = 0;
  cf_result best = CF_NOTSUP;
  char keep[CF_MSG] = "";
  variant_job job;
  const void *found;
  while ((found = find_item(p, it, n, &v, &job))) {
    char m[CF_MSG] = "";
    cf_result r = body(p, t, found, job.reg, m, sizeof m);
    cf_job_free(job.cfg, job.reg, job.set);
    jobs++;
    if (r == CF_FAIL) {
      char what[512];
      return cf_say(msg, len, CF_FAIL, "%s (job variant: %s)", m,
                    cf_variant_str(p, v - 1, what, sizeof what));
    }
    /* a PASS outranks a NOTSUP; the first message of the best verdict is kept */
    if (r == CF_PASS && best == CF_NOTSUP) keep[0] = '\0';
    if (r == CF_PASS) best = r;
    if (!keep[0] && r == best) snprintf(keep, sizeof keep, "%s", m);
  }
  if (!jobs)
    return cf_say(msg, len, CF_NOTSUP, "not registered on a job with %s = %d",
                  it->kind == CF_ITEM_SCHED ? "pp" : it->dim, n);
  char tail[64] = "";
  if (jobs > 1) snprintf(tail, sizeof tail, " (each of %d job variants)", jobs);
  return cf_say(msg, len, best, "%s%s", keep, tail);
}
