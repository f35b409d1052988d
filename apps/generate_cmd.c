/* `tessera generate`: continue a prompt with a trained model (docs/generate.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "app.h"
#include "hf.h"
#include "llama_generate.h"
#include "tessera/comm.h"
#include "tessera/kernels.h"
#include "tessera/tokenizer.h"
#include "train.h"

static const char generate_usage[] =
    "usage: tessera generate MODEL (--prompt TEXT | --prompt-ids IDS) [options]\n"
    "\n"
    "Continues a prompt, with a KV cache, on one rank or under --tp (docs/generate.md).\n"
    "MODEL is a Hugging Face folder (config.json and safetensors weights), or a job file:\n"
    "its [model] keys (and a folder's config.json when [checkpoint] load names one) and the\n"
    "weights of [checkpoint] save when that file exists, else of [checkpoint] load.\n"
    "\n"
    "options:\n"
    "  --checkpoint PATH    the weights: a Tessera checkpoint file or a Hugging Face folder\n"
    "  --tokenizer FILE     tokenizer.json (default: MODEL/tokenizer.json for a folder)\n"
    "  --prompt TEXT        the text to continue (encoded with the tokenizer's BOS)\n"
    "  --prompt-ids IDS     token ids instead, comma- or space-separated (no tokenizer needed)\n"
    "  --no-bos             encode the prompt without the tokenizer's BOS\n"
    "  --max-tokens N       new tokens at most (default 64)\n"
    "  --temperature T      0 (default) is greedy; above 0 samples from softmax(logits / T)\n"
    "  --top-k K            sample among the K most likely tokens only (default 0: all)\n"
    "  --top-p P            sample among the most likely tokens whose probabilities reach P\n"
    "                       (default 1: all)\n"
    "  --seed S             the sampler's seed (default 0); a seed gives one continuation\n"
    "  --eos ID             stop after this token (repeatable); default: the tokenizer's EOS,\n"
    "                       else config.json's eos_token_id\n"
    "  --ignore-eos         never stop before --max-tokens\n"
    "  --no-cache           recompute the whole sequence for every token (for measurement)\n"
    "  --tp N               tensor parallelism over N ranks (threads of this process): each\n"
    "                       holds its heads and its slice of the MLP (N divides the head counts)\n"
    "  --print-ids          print the new tokens' ids instead of their text\n"
    "  --stats              print the prompt's and the new tokens' tokens/s on stderr\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure, 2 bad input (a malformed config.json or\n"
    "            weights, a prompt id outside the vocabulary, a bad option)\n";

typedef struct gen_opts {
  const char *model, *checkpoint, *tokenizer, *prompt, *prompt_ids;
  bool no_bos, ignore_eos, no_cache, print_ids, stats;
  long max_tokens;
  double temperature, top_p;
  long top_k, tp;
  unsigned long long seed;
  int32_t eos[16];
  int neos;
} gen_opts;

static int fail(tsr_status s) {
  fprintf(stderr, "tessera generate: %s\n", tsr_last_error());
  return tsr_app_exit_code(s);
}

static int bad_arg(const char *what, const char *arg) {
  fprintf(stderr, "tessera generate: %s '%s'; see tessera generate --help\n", what, arg);
  return TSR_EXIT_BAD_INPUT;
}

static bool parse_num(const char *s, double lo, double hi, double *v) {
  char *end;
  errno = 0;
  double x = strtod(s, &end);
  if (errno || end == s || *end || !(x >= lo && x <= hi)) return false;
  *v = x;
  return true;
}

static int parse_args(int argc, char **argv, gen_opts *o) {
  memset(o, 0, sizeof *o);
  o->max_tokens = 64;
  o->top_p = 1;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    double x;
    bool takes = true;
    if (!strcmp(a, "--no-bos"))
      o->no_bos = true, takes = false;
    else if (!strcmp(a, "--ignore-eos"))
      o->ignore_eos = true, takes = false;
    else if (!strcmp(a, "--no-cache"))
      o->no_cache = true, takes = false;
    else if (!strcmp(a, "--print-ids"))
      o->print_ids = true, takes = false;
    else if (!strcmp(a, "--stats"))
      o->stats = true, takes = false;
    else if (a[0] != '-') {
      if (o->model) return bad_arg("a second MODEL", a);
      o->model = a;
      takes = false;
    }
    if (!takes) continue;
    if (!v) return bad_arg("a value is missing after", a);
    i++;
    if (!strcmp(a, "--checkpoint"))
      o->checkpoint = v;
    else if (!strcmp(a, "--tokenizer"))
      o->tokenizer = v;
    else if (!strcmp(a, "--prompt"))
      o->prompt = v;
    else if (!strcmp(a, "--prompt-ids"))
      o->prompt_ids = v;
    else if (!strcmp(a, "--max-tokens")) {
      if (!parse_num(v, 1, 1 << 20, &x) || x != floor(x))
        return bad_arg("--max-tokens: not 1 .. 1048576:", v);
      o->max_tokens = (long)x;
    } else if (!strcmp(a, "--temperature")) {
      if (!parse_num(v, 0, 1e6, &x)) return bad_arg("--temperature: not a number >= 0:", v);
      o->temperature = x;
    } else if (!strcmp(a, "--top-k")) {
      if (!parse_num(v, 0, 1e9, &x) || x != floor(x))
        return bad_arg("--top-k: not an integer >= 0:", v);
      o->top_k = (long)x;
    } else if (!strcmp(a, "--tp")) {
      if (!parse_num(v, 1, 64, &x) || x != floor(x))
        return bad_arg("--tp: not an integer in 1 .. 64:", v);
      o->tp = (long)x;
    } else if (!strcmp(a, "--top-p")) {
      if (!parse_num(v, 0, 1, &x) || x == 0) return bad_arg("--top-p: not in (0, 1]:", v);
      o->top_p = x;
    } else if (!strcmp(a, "--seed")) {
      if (!parse_num(v, 0, 1.8e19, &x) || x != floor(x))
        return bad_arg("--seed: not an integer >= 0:", v);
      o->seed = (unsigned long long)x;
    } else if (!strcmp(a, "--eos")) {
      if (!parse_num(v, 0, 2e9, &x) || x != floor(x) || o->neos == 16)
        return bad_arg("--eos: not a token id:", v);
      o->eos[o->neos++] = (int32_t)x;
    } else {
      return bad_arg("unknown option", a);
    }
  }
  if (!o->model) return bad_arg("no MODEL (a job file or a Hugging Face folder):", "");
  if (!o->prompt == !o->prompt_ids)
    return bad_arg("give one of --prompt and --prompt-ids, not", o->prompt ? "both" : "neither");
  return -1;
}

/* The model's config and the path of its weights. */
static tsr_status resolve_model(const gen_opts *o, tsr_llama_config *mc, char *weights, size_t wlen,
                                tsr_hf_config *hc, bool *have_hc) {
  *have_hc = false;
  if (tsr_hf_is_folder(o->model)) {
    TSR_CHECK(tsr_hf_config_read(o->model, hc));
    *have_hc = true;
    for (int k = 0; k < TSR_HF_NKEYS; k++)
      if (!hc->known[k])
        return tsr_error(TSR_EINVAL, "%s: no \"%s\"", hc->path, tsr_hf_key_name(k));
    const double *v = hc->value;
    *mc = (tsr_llama_config){
        .vocab_size = (int)v[TSR_HF_VOCAB],
        .hidden_size = (int)v[TSR_HF_HIDDEN],
        .intermediate_size = (int)v[TSR_HF_INTERMEDIATE],
        .num_hidden_layers = (int)v[TSR_HF_LAYERS],
        .num_attention_heads = (int)v[TSR_HF_HEADS],
        .num_key_value_heads = (int)v[TSR_HF_KV_HEADS],
        .rms_norm_eps = (float)v[TSR_HF_EPS],
        .rope_theta = (float)v[TSR_HF_THETA],
        .tie_word_embeddings = v[TSR_HF_TIE] != 0,
        .num_local_experts = (int)v[TSR_HF_EXPERTS],
        .num_experts_per_tok = (int)v[TSR_HF_TOP_K],
        .decoder_sparse_step = 1,
        .router_aux_loss_coef = (float)v[TSR_HF_AUX_COEF],
    };
    tsr_status s = tsr_llama_config_check(mc);
    if (s != TSR_OK) return tsr_error_prefix(s, "%s", hc->path);
    snprintf(weights, wlen, "%s", o->checkpoint ? o->checkpoint : o->model);
    return TSR_OK;
  }
  tsr_config *cfg = NULL;
  TSR_CHECK(tsr_config_load(o->model, &cfg));
  tsr_status s = tsr_hf_job_apply(cfg);
  if (s == TSR_OK) {
    *mc = tsr_hf_model_config(cfg);
    s = tsr_llama_config_check(mc);
    if (s != TSR_OK) s = tsr_error_prefix(s, "%s: [model]", cfg->path);
  }
  if (s == TSR_OK) s = tsr_hf_job_weights(cfg, o->checkpoint, weights, wlen);
  if (s == TSR_OK && tsr_hf_is_folder(weights))
    *have_hc = tsr_hf_config_read(weights, hc) == TSR_OK;
  tsr_config_free(cfg);
  return s;
}

/* The model's tensors, read from `path` into full f32 tensors. */
static tsr_status load_weights(const char *path, const tsr_llama_config *mc, tsr_hf_tensor **specs,
                               int *n, tsr_tensor ***out) {
  TSR_CHECK(tsr_hf_tensors(mc, specs, n));
  tsr_tensor **ts = calloc((size_t)*n + 1, sizeof *ts);
  const char **names = calloc((size_t)*n + 1, sizeof *names);
  tsr_hf_weights *w = NULL;
  tsr_status s = ts && names ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  for (int i = 0; i < *n && s == TSR_OK; i++) {
    names[i] = (*specs)[i].name;
    s = tsr_tensor_new(NULL, TSR_F32, (*specs)[i].ndim, (*specs)[i].shape, &ts[i]);
  }
  if (s == TSR_OK) s = tsr_hf_weights_open(path, &w);
  if (s == TSR_OK) {
    const char *ignore[4];
    int nignore = 0;
    for (int i = 0; i < tsr_checkpoint_hf_buffers_count && nignore < 3; i++)
      ignore[nignore++] = tsr_checkpoint_hf_buffers[i];
    if (mc->tie_word_embeddings) ignore[nignore++] = "lm_head.weight";
    s = tsr_hf_weights_load(w, *n, names, ts, nignore, ignore);
  }
  tsr_hf_weights_close(w);
  free(names);
  if (s != TSR_OK) {
    for (int i = 0; ts && i < *n; i++) tsr_tensor_free(ts[i]);
    free(ts);
    return s;
  }
  *out = ts;
  return TSR_OK;
}

/* ---- sampling ---- */

static uint64_t next_u64(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

typedef struct cand {
  float logit;
  int32_t id;
} cand;

/* Descending logit, ties to the lower id. */
static int cmp_cand(const void *a, const void *b) {
  const cand *x = a, *y = b;
  if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
  return x->id < y->id ? -1 : x->id > y->id;
}

/* The next token: argmax (the lowest id among equal maxima) when temperature is 0, else a draw
 * from softmax(logits / T) over the top-k tokens, cut to the smallest prefix whose probability
 * reaches top_p. */
static int32_t sample(const gen_opts *o, const float *logits, int V, cand *c, double *p,
                      uint64_t *rng) {
  if (o->temperature <= 0) {
    int32_t best = 0;
    for (int i = 1; i < V; i++)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  for (int i = 0; i < V; i++) c[i] = (cand){logits[i], i};
  qsort(c, (size_t)V, sizeof *c, cmp_cand);
  int k = o->top_k > 0 && o->top_k < V ? (int)o->top_k : V;
  double sum = 0;
  for (int i = 0; i < k; i++) sum += p[i] = exp(((double)c[i].logit - c[0].logit) / o->temperature);
  double cum = 0;
  int keep = k;
  for (int i = 0; i < k; i++) {
    cum += p[i] / sum;
    if (cum >= o->top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0;
  for (int i = 0; i < keep; i++) total += p[i];
  double u = (double)(next_u64(rng) >> 11) * 0x1.0p-53 * total;
  for (int i = 0; i < keep; i++) {
    if (u < p[i]) return c[i].id;
    u -= p[i];
  }
  return c[keep - 1].id;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static tsr_status parse_ids(const char *s, int32_t **ids, int *n, int V) {
  *n = 0;
  *ids = malloc((strlen(s) / 2 + 2) * sizeof **ids);
  if (!*ids) return TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  const char *p = s;
  while (*p) {
    while (*p == ' ' || *p == ',') p++;
    if (!*p) break;
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || v < 0 || v >= V)
      return tsr_error(TSR_EINVAL, "--prompt-ids: '%.*s' is not a token id below vocab_size %d",
                       (int)strcspn(p, " ,"), p, V);
    (*ids)[(*n)++] = (int32_t)v;
    p = end;
  }
  if (!*n) return tsr_error(TSR_EINVAL, "--prompt-ids: no ids");
  return TSR_OK;
}

/* One generation, shared by the ranks of a --tp run; rank 0 (or the one rank) fills the
 * results. */
typedef struct gen_run {
  const gen_opts *o;
  const tsr_llama_config *mc;
  int nt;
  const char *const *names;
  const tsr_tensor *const *ts;
  const int32_t *prompt;
  int np, total;
  int32_t *seq; /* (total): the prompt and the new tokens */
  int ngen;
  double t_prompt, t_all;
} gen_run;

/* The prompt, then a token at a time until max_tokens or an end token. Under tp every rank runs
 * the same steps; rank 0 samples and broadcasts each token. */
static tsr_status run_gen(gen_run *c, tsr_group_t *grp) {
  const gen_opts *o = c->o;
  int V = c->mc->vocab_size;
  bool lead = !grp || tsr_group_index(grp) == 0;
  tsr_llama_gen *g = NULL;
  int32_t *seq = malloc((size_t)c->total * sizeof *seq);
  float *logits = malloc((size_t)V * sizeof *logits);
  cand *cands = malloc((size_t)V * sizeof *cands);
  double *probs = malloc((size_t)V * sizeof *probs);
  tsr_status s =
      seq && logits && cands && probs ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  if (s == TSR_OK) s = tsr_llama_gen_new_tp(c->mc, c->nt, c->names, c->ts, c->total, grp, &g);
  int ngen = 0;
  double t0 = now_s(), t_prompt = 0;
  if (s == TSR_OK) {
    memcpy(seq, c->prompt, (size_t)c->np * sizeof *seq);
    uint64_t rng = o->seed;
    s = tsr_llama_gen_step(g, seq, c->np, logits);
    t_prompt = now_s() - t0;
    for (int len = c->np; s == TSR_OK && ngen < o->max_tokens; len++) {
      int32_t next = lead ? sample(o, logits, V, cands, probs, &rng) : 0;
      if (grp) s = tsr_comm_broadcast(grp, &next, 1, TSR_I32, 0);
      if (s != TSR_OK) break;
      seq[len] = next;
      ngen++;
      bool stop = false;
      for (int e = 0; e < o->neos; e++) stop |= next == o->eos[e];
      if (stop || ngen == o->max_tokens) break;
      if (o->no_cache) {
        tsr_llama_gen_reset(g);
        s = tsr_llama_gen_step(g, seq, len + 1, logits);
      } else {
        s = tsr_llama_gen_step(g, &seq[len], 1, logits);
      }
    }
  }
  if (s == TSR_OK && lead) {
    memcpy(c->seq, seq, (size_t)(c->np + ngen) * sizeof *seq);
    c->ngen = ngen;
    c->t_prompt = t_prompt;
    c->t_all = now_s() - t0;
  }
  tsr_llama_gen_free(g);
  free(seq);
  free(logits);
  free(cands);
  free(probs);
  return s;
}

static tsr_status run_rank(tsr_comm_t *comm, void *arg) {
  int n = tsr_comm_world(comm), ranks[TSR_LOCAL_MAX_RANKS];
  for (int i = 0; i < n; i++) ranks[i] = i;
  tsr_group_t *grp = NULL;
  TSR_CHECK(tsr_comm_group(comm, n, ranks, "tp", &grp));
  return run_gen(arg, grp);
}

int tsr_cmd_generate(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(generate_usage, stdout);
    return TSR_EXIT_OK;
  }
  gen_opts o;
  int rc = parse_args(argc, argv, &o);
  if (rc >= 0) return rc;
  tsr_llama_config mc;
  tsr_hf_config hc;
  bool have_hc = false;
  char weights[TSR_TRAIN_PATH_LEN];
  tsr_status s = resolve_model(&o, &mc, weights, sizeof weights, &hc, &have_hc);
  if (s != TSR_OK) return fail(s);
  tsr_tokenizer_t *tok = NULL;
  char tok_path[TSR_TRAIN_PATH_LEN + 32];
  if (o.tokenizer) {
    snprintf(tok_path, sizeof tok_path, "%s", o.tokenizer);
  } else {
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json",
             tsr_hf_is_folder(o.model) ? o.model : weights);
    struct stat sb;
    if (stat(tok_path, &sb) != 0) tok_path[0] = '\0';
  }
  if (tok_path[0] && (s = tsr_tokenizer_load(tok_path, &tok)) != TSR_OK) return fail(s);
  if (!tok && (o.prompt || !o.print_ids)) {
    tsr_error(TSR_EINVAL, "no tokenizer: give --tokenizer FILE (tokenizer.json), or --prompt-ids "
                          "with --print-ids");
    return fail(TSR_EINVAL);
  }
  if (tok && tsr_tokenizer_vocab_size(tok) > mc.vocab_size) {
    tsr_error(TSR_EINVAL, "%s: the tokenizer has %d ids but the model's vocab_size is %d", tok_path,
              (int)tsr_tokenizer_vocab_size(tok), mc.vocab_size);
    tsr_tokenizer_free(tok);
    return fail(TSR_EINVAL);
  }
  /* the prompt */
  int32_t *prompt = NULL;
  int np = 0;
  if (o.prompt_ids) {
    s = parse_ids(o.prompt_ids, &prompt, &np, mc.vocab_size);
  } else {
    tsr_tok_encoder_t *enc = NULL;
    const int32_t *ids;
    size_t n = 0;
    s = tsr_tok_encoder_new(tok, &enc);
    if (s == TSR_OK)
      s = tsr_tok_encode(enc, o.prompt, strlen(o.prompt), o.no_bos ? 0 : TSR_TOK_ADD_SPECIAL, &ids,
                         &n);
    if (s == TSR_OK && n == 0) s = tsr_error(TSR_EINVAL, "--prompt: the text encodes to no tokens");
    if (s == TSR_OK && (prompt = malloc(n * sizeof *prompt))) {
      memcpy(prompt, ids, n * sizeof *prompt);
      np = (int)n;
    }
    tsr_tok_encoder_free(enc);
  }
  if (s != TSR_OK) {
    free(prompt);
    tsr_tokenizer_free(tok);
    return fail(s);
  }
  if (!o.neos && !o.ignore_eos) {
    int32_t e = tok ? tsr_tokenizer_eos(tok, NULL) : -1;
    if (e >= 0) o.eos[o.neos++] = e;
    for (int i = 0; e < 0 && have_hc && i < hc.neos; i++) o.eos[o.neos++] = hc.eos_token_id[i];
  }
  int kvh = mc.num_key_value_heads ? mc.num_key_value_heads : mc.num_attention_heads;
  if (o.tp > 1 && (mc.num_attention_heads % o.tp || kvh % o.tp)) {
    free(prompt);
    tsr_tokenizer_free(tok);
    tsr_error(TSR_EINVAL,
              "--tp %ld must divide num_attention_heads %d and num_key_value_heads %d (each rank "
              "runs whole heads)",
              o.tp, mc.num_attention_heads, kvh);
    return fail(TSR_EINVAL);
  }
  int total = np + (int)o.max_tokens;
  if (have_hc && hc.sliding_window > 0 && total > hc.sliding_window) {
    free(prompt);
    tsr_tokenizer_free(tok);
    tsr_error(TSR_EINVAL,
              "%s: \"sliding_window\" is %lld and prompt + --max-tokens is %d: the model's "
              "attention is full causal, equal to the window only up to its length",
              hc.path, (long long)hc.sliding_window, total);
    return fail(TSR_EINVAL);
  }
  /* the weights, then the generator on one rank or on --tp ranks (threads of this process) */
  tsr_hf_tensor *specs = NULL;
  tsr_tensor **ts = NULL;
  int nt = 0;
  const char **names = NULL;
  int32_t *seq = malloc((size_t)total * sizeof *seq);
  int threads = tsr_kernel_num_cores();
  if (o.tp > 1) threads = tsr_kernel_thread_budget(threads, (int)o.tp);
  tsr_kernel_set_threads(threads);
  s = seq ? load_weights(weights, &mc, &specs, &nt, &ts)
          : TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  if (s == TSR_OK && !(names = calloc((size_t)nt + 1, sizeof *names)))
    s = TSR_ERROR(TSR_ENOMEM, "generate: out of memory");
  for (int i = 0; s == TSR_OK && i < nt; i++) names[i] = specs[i].name;
  gen_run run = {.o = &o,
                 .mc = &mc,
                 .nt = nt,
                 .names = names,
                 .ts = (const tsr_tensor *const *)ts,
                 .prompt = prompt,
                 .np = np,
                 .total = total,
                 .seq = seq};
  if (s == TSR_OK && o.tp > 1)
    s = tsr_local_launch((int)o.tp, 600, run_rank, &run);
  else if (s == TSR_OK)
    s = run_gen(&run, NULL);
  int ngen = run.ngen;
  double t_prompt = run.t_prompt;
  double t_all = run.t_all;
  if (s == TSR_OK) {
    if (o.print_ids) {
      for (int i = 0; i < ngen; i++) printf("%s%d", i ? " " : "", (int)seq[np + i]);
      printf("\n");
    } else {
      char *text = NULL;
      s = tsr_tokenizer_decode(tok, seq + np, (size_t)ngen, TSR_TOK_SKIP_SPECIAL, &text, NULL);
      if (s == TSR_OK) printf("%s\n", text);
      free(text);
    }
    if (o.stats && ngen > 0) {
      double t_gen = t_all - t_prompt;
      fprintf(stderr,
              "generate: prompt %d tokens in %.3f s (%.1f tokens/s); %d new tokens in %.3f s "
              "(%.1f tokens/s, KV cache %s, tp %d)\n",
              np, t_prompt, np / (t_prompt > 0 ? t_prompt : 1e-9), ngen, t_gen,
              ngen > 1 ? (ngen - 1) / (t_gen > 0 ? t_gen : 1e-9) : 0.0, o.no_cache ? "off" : "on",
              (int)(o.tp > 1 ? o.tp : 1));
    }
  }
  for (int i = 0; ts && i < nt; i++) tsr_tensor_free(ts[i]);
  free(ts);
  free(specs);
  free(names);
  free(seq);
  free(prompt);
  tsr_tokenizer_free(tok);
  return s == TSR_OK ? TSR_EXIT_OK : fail(s);
}
