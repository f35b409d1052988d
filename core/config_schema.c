/* The job-file schema: the one table that the parser, the defaults, the messages and
 * docs/ini-reference.md are all derived from, and the typed value checks shared with plugins. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

#define OFF(field) offsetof(tsr_config, field)
#define SZ(field)  sizeof(((tsr_config *)0)->field)

#define KEY_INT(sec, k, field, def, lo, hi, text)                                                  \
  { {sec, {k, TSR_KEY_INT, def, lo, hi, NULL, text}}, TSR_STORE_I64, OFF(field), 0, 0, 0 }
#define KEY_FLOAT(sec, k, field, def, lo, hi, text)                                                \
  { {sec, {k, TSR_KEY_FLOAT, def, lo, hi, NULL, text}}, TSR_STORE_F64, OFF(field), 0, 0, 0 }
#define KEY_BOOL(sec, k, field, def, text)                                                         \
  { {sec, {k, TSR_KEY_BOOL, def, 0, 0, NULL, text}}, TSR_STORE_BOOL, OFF(field), 0, 0, 0 }
#define KEY_STRING(sec, k, field, def, text)                                                       \
  {                                                                                                \
    {sec, {k, TSR_KEY_STRING, def, 0, 0, NULL, text}}, TSR_STORE_CHARS, OFF(field), SZ(field), 0,  \
        0                                                                                          \
  }
#define KEY_ENUM(sec, k, field, def, choices, text)                                                \
  { {sec, {k, TSR_KEY_ENUM, def, 0, 0, choices, text}}, TSR_STORE_ENUM, OFF(field), 0, 0, 0 }

/* Keys added since ABI 1.0 live in tsr_config_ext, after the frozen struct (config_internal.h). */
#define XOFF(field) offsetof(tsr_config_full, ext.field)
#define XSZ(field)  sizeof(((tsr_config_full *)0)->ext.field)
#define XKEY_INT(sec, k, field, def, lo, hi, text)                                                 \
  { {sec, {k, TSR_KEY_INT, def, lo, hi, NULL, text}}, TSR_STORE_I64, XOFF(field), 0, 0, 0 }
#define XKEY_STRING(sec, k, field, def, text)                                                      \
  {                                                                                                \
    {sec, {k, TSR_KEY_STRING, def, 0, 0, NULL, text}}, TSR_STORE_CHARS, XOFF(field), XSZ(field),   \
        0, 0                                                                                       \
  }
#define XKEY_FLOAT(sec, k, field, def, lo, hi, text)                                               \
  { {sec, {k, TSR_KEY_FLOAT, def, lo, hi, NULL, text}}, TSR_STORE_F64, XOFF(field), 0, 0, 0 }
#define XKEY_BOOL(sec, k, field, def, text)                                                        \
  { {sec, {k, TSR_KEY_BOOL, def, 0, 0, NULL, text}}, TSR_STORE_BOOL, XOFF(field), 0, 0, 0 }
#define XKEY_ENUM(sec, k, field, def, choices, text)                                               \
  { {sec, {k, TSR_KEY_ENUM, def, 0, 0, choices, text}}, TSR_STORE_ENUM, XOFF(field), 0, 0, 0 }

_Static_assert(TSR_NONFINITE_STOP == 0 && TSR_NONFINITE_SKIP == 1,
               "[job] on_nonfinite's choices must be tsr_on_nonfinite values");
_Static_assert(sizeof(tsr_on_nonfinite) == sizeof(int), "an enum key is stored as an int");
_Static_assert(TSR_MASK_CAUSAL == 0 && TSR_MASK_DOCUMENT == 1 &&
                   sizeof(tsr_data_mask) == sizeof(int),
               "[data] mask's choices must be tsr_data_mask values");
_Static_assert(TSR_ACT_CKPT_NONE == 0 && TSR_ACT_CKPT_FULL == 1 &&
                   sizeof(tsr_activation_checkpointing) == sizeof(int),
               "[model] activation_checkpointing's choices must be its enum's values");

/* [job] dtype stores the index of its choice "f32|bf16" as the tsr_dtype. */
_Static_assert(TSR_F32 == 0 && TSR_BF16 == 1, "[job] dtype's choices must be tsr_dtype values");

/* Ranges are generous: they catch typos and nonsense (a negative step count, a world of a
 * billion ranks), not configurations that are merely unusual. */
const tsr_schema_entry tsr_schema[] = {
    KEY_ENUM("job", "mode", job.mode, "train", "train|forward",
             "train: forward, backward and optimizer steps; forward: forward passes only"),
    KEY_INT("job", "steps", job.steps, "1", 1, 1e9, "number of steps (batches) to run"),
    KEY_INT("job", "seed", job.seed, "1234", 0, 9007199254740991.0,
            "seed of parameter init and synthetic data; every rank derives its streams from it"),
    {{"job",
      {"backend", TSR_KEY_ENUM, "local", 0, 0, "local|mpi|nccl",
       "communicator: local = ranks are threads of one process; mpi, nccl = processes"}},
     TSR_STORE_CHARS,
     OFF(job.backend),
     SZ(job.backend),
     0,
     0},
    KEY_ENUM("job", "device", job.device, "cpu", "cpu|cuda|emu",
             "where tensors live and kernels run; emu: CPU memory the host may not touch, "
             "for checking the device path without a GPU"),
    KEY_ENUM("job", "dtype", job.dtype, "f32", "f32|bf16",
             "precision of matrix products: bf16 = mixed precision (bf16 GEMM operands, f32 "
             "accumulation); parameters, gradients, optimizer state and other ops stay f32"),
    KEY_FLOAT("job", "timeout_s", job.timeout_s, "60", 0.001, 86400,
              "a collective that waits longer than this fails, listing the missing ranks"),
    KEY_INT("job", "world_size", job.world_size, "0", 0, 1048576,
            "expected number of ranks; 0 = the product of [mesh] shape"),
    XKEY_ENUM("job", "on_nonfinite", job.on_nonfinite, "stop", "stop|skip_step",
              "a step whose loss or gradient norm is NaN or Inf: stop = the run stops there with "
              "exit 1, saving nothing; skip_step = that step's update is skipped and the run goes "
              "on"),
    XKEY_FLOAT("job", "stop_grace_s", job_stop.stop_grace_s, "120", 0, 604800,
               "after the first SIGINT or SIGTERM, seconds the run has to finish its step and "
               "write its checkpoint; past them it exits at once, saying so (a wedged step "
               "cannot hold off a stop); 0 = no limit"),
    XKEY_STRING("job", "memory_limit", job_memory.memory_limit, "",
                "bytes a rank may hold at the peak of its step, e.g. 512M, 4G, 1.5GiB (K, M, G, "
                "T: powers of 1024); a job whose predicted peak (tessera plan: parameters, "
                "gradients, AdamW moments, activations) exceeds it on some rank is refused before "
                "it runs; empty = no limit"),

    {{"mesh",
      {"dims", TSR_KEY_NAMES, "dp", 0, 0, NULL,
       "mesh dim names, outermost first, e.g. dp, tp, pp, ulysses_cp, ring_cp"}},
     TSR_STORE_NAMES,
     OFF(mesh.names),
     TSR_MAX_MESH_DIMS,
     TSR_MAX_DIM_NAME,
     OFF(mesh.ndim)},
    {{"mesh",
      {"shape", TSR_KEY_INTS, "1", 1, 1024, NULL,
       "size of each dim of `dims`, same count; the product is the world size"}},
     TSR_STORE_INTS,
     OFF(mesh.shape),
     TSR_MAX_MESH_DIMS,
     0,
     OFF(mesh.nshape)},

    {{"plugins",
      {"load", TSR_KEY_NAMES, "", 0, 0, NULL,
       "strategy plugins to load, in order; each is libtessera-<name>.so on the search path"}},
     TSR_STORE_NAMES,
     OFF(plugins.load),
     TSR_MAX_PLUGINS,
     TSR_MAX_NAME,
     OFF(plugins.nload)},
    KEY_STRING("plugins", "path", plugins.path, "",
               "extra plugin directories, ':' or ',' separated; relative to the job file"),

    KEY_INT("model", "vocab_size", model.vocab_size, "256", 1, 1e7, "vocabulary size"),
    KEY_INT("model", "hidden_size", model.hidden_size, "64", 1, 1e6, "model width"),
    KEY_INT("model", "intermediate_size", model.intermediate_size, "176", 1, 1e7,
            "MLP inner width (SwiGLU)"),
    KEY_INT("model", "num_hidden_layers", model.num_hidden_layers, "4", 1, 1000,
            "transformer blocks"),
    KEY_INT("model", "num_attention_heads", model.num_attention_heads, "8", 1, 1024,
            "query heads; must divide hidden_size"),
    KEY_INT("model", "num_key_value_heads", model.num_key_value_heads, "0", 0, 1024,
            "key/value heads (GQA); 0 = num_attention_heads; must divide num_attention_heads"),
    KEY_FLOAT("model", "rms_norm_eps", model.rms_norm_eps, "1e-5", 1e-12, 1, "RMSNorm epsilon"),
    KEY_FLOAT("model", "rope_theta", model.rope_theta, "10000", 1, 1e9, "RoPE base"),
    KEY_BOOL("model", "tie_word_embeddings", model.tie_word_embeddings, "false",
             "share the embedding matrix with the output projection"),
    XKEY_INT("model", "num_local_experts", model.num_local_experts, "0", 0, 4096,
             "experts per mixture-of-experts layer (Mixtral); 0 = dense MLPs"),
    XKEY_INT("model", "num_experts_per_tok", model.num_experts_per_tok, "2", 1, 4096,
             "experts each token is routed to (top-k), at most num_local_experts"),
    XKEY_INT("model", "decoder_sparse_step", model.decoder_sparse_step, "1", 1, 1000,
             "layer l (from 0) is a mixture-of-experts layer when (l + 1) % step == 0"),
    XKEY_FLOAT("model", "router_aux_loss_coef", model.router_aux_loss_coef, "0.001", 0, 1e3,
               "weight of the load-balancing loss added to the training loss"),
    XKEY_ENUM("model", "activation_checkpointing", model_memory.activation_checkpointing, "none",
              "none|full|selective",
              "full: a layer keeps only its input and is recomputed in the backward (one more "
              "forward); selective: a layer keeps its GEMM and attention outputs and recomputes "
              "its norms, RoPE and SwiGLU in the backward. Both give the same results as none"),
    XKEY_INT("model", "checkpoint_every", model_memory.checkpoint_every, "1", 1, 1000,
             "with activation_checkpointing = full or selective, layer l (from 0) is "
             "checkpointed when (l + 1) % checkpoint_every == 0"),

    KEY_STRING("data", "source", data.source, "synthetic",
               "synthetic | text:PATH | tokens:PATH | safetensors:PATH (input_ids, labels)"),
    KEY_INT("data", "batch_size", data.batch_size, "4", 1, 1e6, "global batch size (sequences)"),
    KEY_INT("data", "seq_len", data.seq_len, "32", 1, 1e7, "tokens per sequence"),
    XKEY_ENUM("data", "mask", data_docs.mask, "causal", "causal|document",
              "causal: attention over the whole row; document: a token attends only to earlier "
              "tokens of its own document and positions (RoPE) restart at 0 at each document, "
              "from the source's document index (tokens: and tokens32: sources only)"),
    XKEY_STRING("data", "index", data_docs.index, "",
                "document index of the source, as tessera tokenize writes it; empty = the token "
                "file's path + .idx; read with mask = document"),

    KEY_FLOAT("optimizer", "lr", optimizer.lr, "1e-3", 0, 10, "AdamW learning rate (peak)"),
    KEY_ENUM("optimizer", "lr_schedule", optimizer.lr_schedule, "constant", "constant|cosine",
             "learning-rate schedule after warmup"),
    KEY_INT("optimizer", "warmup_steps", optimizer.warmup_steps, "0", 0, 1e9,
            "linear warmup steps from 0 to lr"),
    KEY_FLOAT("optimizer", "beta1", optimizer.beta1, "0.9", 0, 0.999999, "AdamW beta1"),
    KEY_FLOAT("optimizer", "beta2", optimizer.beta2, "0.999", 0, 0.999999, "AdamW beta2"),
    KEY_FLOAT("optimizer", "eps", optimizer.eps, "1e-8", 1e-30, 1,
              "AdamW epsilon; must be > 0 (0 divides 0 by 0 on the first step)"),
    KEY_FLOAT("optimizer", "weight_decay", optimizer.weight_decay, "0.01", 0, 10,
              "decoupled weight decay, applied to every parameter"),
    KEY_FLOAT("optimizer", "max_norm", optimizer.max_norm, "1.0", 0, 1e6,
              "global gradient-norm clip as clip_grad_norm_; 0 = no clipping"),
    KEY_FLOAT("optimizer", "min_lr", optimizer.min_lr, "0", 0, 10,
              "learning rate the cosine schedule decays to at the last step"),
    KEY_INT("optimizer", "grad_accum_steps", optimizer.grad_accum_steps, "1", 1, 1e6,
            "microbatches per optimizer step; must divide [data] batch_size"),

    KEY_STRING(
        "checkpoint", "load", checkpoint.load, "",
        "safetensors file of full tensors (HF names), a sharded checkpoint folder, or latest "
        "(the newest complete one in dir) to start from; empty = fresh init"),
    KEY_STRING("checkpoint", "save", checkpoint.save, "",
               "safetensors file written at the end; empty = none"),
    XKEY_STRING("checkpoint", "dir", checkpoint.dir, "",
                "folder of sharded checkpoints, one step-NNNNNN/ per save, each rank writing "
                "its own shards; empty = none"),
    XKEY_INT("checkpoint", "every", checkpoint.every, "0", 0, 1e9,
             "save to dir after every this many steps and after the last; 0 = after the last "
             "only"),
    XKEY_INT("checkpoint", "keep_last", checkpoint.keep_last, "0", 0, 1e6,
             "newest checkpoints kept in dir, older ones removed after a save; 0 = keep all"),
    XKEY_BOOL("checkpoint", "async", checkpoint_async.async, "false",
              "true: a save to dir copies each rank's shards to host memory and writes them in a "
              "background thread while training goes on; the next save and the end of the run "
              "wait for it"),

    KEY_STRING("output", "dump", output.dump, "",
               "safetensors file of logits, loss, grads and updated params of step 1"),
    KEY_STRING("output", "trace", output.trace, "",
               "Chrome trace / Perfetto JSON, a track per rank, any mesh: steps and their "
               "phases, ops, communication per mesh dim, pipeline actions"),
    XKEY_STRING("output", "metrics", output.metrics, "",
                "JSON Lines file, one object per step (loss, lr, grad norm, tokens/s, MFU, peak "
                "memory) and per evaluation (eval loss), written as the run goes; empty = none"),
    XKEY_STRING("output", "tensorboard", output_tb.tensorboard, "",
                "folder of a TensorBoard event file (events.out.tfevents.TIME.HOST) with the "
                "metrics' scalars, written by rank 0 as the run goes; made when absent; empty = "
                "none"),

    XKEY_STRING("eval", "source", eval.source, "",
                "held-out data, as [data] source (batch_size and seq_len from [data]); empty = "
                "no evaluation"),
    XKEY_INT("eval", "every", eval.every, "0", 0, 1e9,
             "evaluate after every this many steps and after the last; 0 = after the last only"),
    XKEY_INT("eval", "batches", eval.batches, "1", 1, 1e6,
             "batches per evaluation, the same ones each time; the loss is their mean"),
};
const int tsr_schema_len = (int)(sizeof tsr_schema / sizeof tsr_schema[0]);

const char *const tsr_schema_sections[] = {
    "job", "mesh", "plugins", "model", "data", "optimizer", "checkpoint", "output", "eval", NULL,
};

int tsr_config_schema_count(void) {
  return tsr_schema_len;
}

const tsr_config_key *tsr_config_schema_at(int i) {
  return i >= 0 && i < tsr_schema_len ? &tsr_schema[i].key : NULL;
}

const tsr_schema_entry *tsr_schema_find(const char *section, const char *key) {
  for (int i = 0; i < tsr_schema_len; i++)
    if (!strcmp(tsr_schema[i].key.section, section) && !strcmp(tsr_schema[i].key.spec.name, key))
      return &tsr_schema[i];
  return NULL;
}

/* ---- Value parsing ---- */

static bool parse_i64(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end != '\0' || errno == ERANGE) return false;
  *out = v;
  return true;
}

static bool parse_f64(const char *s, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE || !isfinite(v)) return false;
  *out = v;
  return true;
}

static bool parse_bool(const char *s, bool *out) {
  if (!strcmp(s, "true"))
    *out = true;
  else if (!strcmp(s, "false"))
    *out = false;
  else
    return false;
  return true;
}

/* Index of `s` among the '|'-separated `choices`, or -1. */
static int choice_index(const char *choices, const char *s) {
  size_t len = strlen(s);
  int i = 0;
  for (const char *p = choices; *p; i++) {
    const char *bar = strchr(p, '|');
    size_t n = bar ? (size_t)(bar - p) : strlen(p);
    if (n == len && !strncmp(p, s, n)) return i;
    if (!bar) break;
    p = bar + 1;
  }
  return -1;
}

static bool is_identifier(const char *s, size_t n) {
  if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  for (size_t i = 1; i < n; i++)
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) return false;
  return true;
}

/* Calls fn on each trimmed comma-separated item of `value`; stops at the first false. An empty
 * value has no items. */
static bool foreach_item(const char *value, bool (*fn)(const char *item, size_t n, void *arg),
                         void *arg) {
  const char *p = value;
  while (isspace((unsigned char)*p)) p++;
  if (*p == '\0') return true;
  for (;;) {
    const char *comma = strchr(p, ',');
    const char *end = comma ? comma : p + strlen(p);
    const char *b = p, *e = end;
    while (b < e && isspace((unsigned char)*b)) b++;
    while (e > b && isspace((unsigned char)e[-1])) e--;
    if (!fn(b, (size_t)(e - b), arg)) return false;
    if (!comma) return true;
    p = comma + 1;
  }
}

typedef struct item_check {
  const tsr_key_spec *spec;
  int count;
  char bad[TSR_MAX_VALUE];
} item_check;

static bool check_name_item(const char *item, size_t n, void *arg) {
  item_check *c = arg;
  c->count++;
  if (is_identifier(item, n)) return true;
  snprintf(c->bad, sizeof c->bad, "%.*s", (int)n, item);
  return false;
}

static bool check_int_item(const char *item, size_t n, void *arg) {
  item_check *c = arg;
  c->count++;
  char buf[64];
  snprintf(c->bad, sizeof c->bad, "%.*s", (int)n, item);
  if (n == 0 || n >= sizeof buf) return false;
  memcpy(buf, item, n);
  buf[n] = '\0';
  int64_t v;
  return parse_i64(buf, &v) && v >= c->spec->min && v <= c->spec->max;
}

const char *tsr_key_describe(const tsr_key_spec *spec, char *buf, size_t len) {
  switch (spec->type) {
    case TSR_KEY_INT:
      snprintf(buf, len, "an integer in [%.17g, %.17g]", spec->min, spec->max);
      break;
    case TSR_KEY_FLOAT:
      snprintf(buf, len, "a number in [%g, %g]", spec->min, spec->max);
      break;
    case TSR_KEY_BOOL:
      snprintf(buf, len, "true or false");
      break;
    case TSR_KEY_STRING:
      snprintf(buf, len, "text (up to %d characters)", TSR_MAX_VALUE - 1);
      break;
    case TSR_KEY_ENUM: {
      size_t o = (size_t)snprintf(buf, len, "one of ");
      for (const char *p = spec->choices; *p && o < len; p++)
        o += (size_t)snprintf(buf + o, len - o, *p == '|' ? " | " : "%c", *p);
      break;
    }
    case TSR_KEY_NAMES:
      snprintf(buf, len, "a comma-separated list of names ([A-Za-z_][A-Za-z0-9_]*)");
      break;
    case TSR_KEY_INTS:
      snprintf(buf, len, "a comma-separated list of integers in [%.17g, %.17g]", spec->min,
               spec->max);
      break;
  }
  return buf;
}

tsr_status tsr_key_check(const tsr_key_spec *spec, const char *value) {
  char want[256];
  tsr_key_describe(spec, want, sizeof want);
  if (strlen(value) >= TSR_MAX_VALUE)
    return tsr_error(TSR_EINVAL, "value is longer than %d characters", TSR_MAX_VALUE - 1);
  switch (spec->type) {
    case TSR_KEY_INT: {
      int64_t v;
      if (!parse_i64(value, &v)) return tsr_error(TSR_EINVAL, "'%s' is not %s", value, want);
      if (v < spec->min || v > spec->max)
        return tsr_error(TSR_EINVAL, "%s is out of range: use %s", value, want);
      return TSR_OK;
    }
    case TSR_KEY_FLOAT: {
      double v;
      if (!parse_f64(value, &v)) return tsr_error(TSR_EINVAL, "'%s' is not %s", value, want);
      if (v < spec->min || v > spec->max)
        return tsr_error(TSR_EINVAL, "%s is out of range: use %s", value, want);
      return TSR_OK;
    }
    case TSR_KEY_BOOL: {
      bool b;
      if (!parse_bool(value, &b)) return tsr_error(TSR_EINVAL, "'%s' is not %s", value, want);
      return TSR_OK;
    }
    case TSR_KEY_STRING:
      return TSR_OK;
    case TSR_KEY_ENUM:
      if (choice_index(spec->choices, value) < 0)
        return tsr_error(TSR_EINVAL, "'%s' is not %s", value, want);
      return TSR_OK;
    case TSR_KEY_NAMES:
    case TSR_KEY_INTS: {
      item_check c = {spec, 0, ""};
      bool ok =
          foreach_item(value, spec->type == TSR_KEY_NAMES ? check_name_item : check_int_item, &c);
      if (!ok) return tsr_error(TSR_EINVAL, "item %d '%s' is bad: use %s", c.count, c.bad, want);
      return TSR_OK;
    }
  }
  return tsr_error(TSR_EINVAL, "unknown key type %d", (int)spec->type);
}

/* ---- Storing ---- */

typedef struct item_store {
  const tsr_schema_entry *e;
  char *base;
  int count;
} item_store;

static bool store_item(const char *item, size_t n, void *arg) {
  item_store *s = arg;
  if ((size_t)s->count >= s->e->cap) return false;
  if (s->e->store == TSR_STORE_NAMES) {
    char *dst = s->base + s->e->offset + (size_t)s->count * s->e->name_len;
    if (n >= s->e->name_len) return false;
    memcpy(dst, item, n);
    dst[n] = '\0';
  } else {
    char buf[64];
    snprintf(buf, sizeof buf, "%.*s", (int)n, item);
    int64_t v = 0;
    parse_i64(buf, &v);
    ((int *)(s->base + s->e->offset))[s->count] = (int)v;
  }
  s->count++;
  return true;
}

tsr_status tsr_schema_store(const tsr_schema_entry *e, const char *value, tsr_config *cfg) {
  char *base = (char *)cfg;
  switch (e->store) {
    case TSR_STORE_I64:
      parse_i64(value, (int64_t *)(base + e->offset));
      return TSR_OK;
    case TSR_STORE_F64:
      parse_f64(value, (double *)(base + e->offset));
      return TSR_OK;
    case TSR_STORE_BOOL:
      parse_bool(value, (bool *)(base + e->offset));
      return TSR_OK;
    case TSR_STORE_CHARS:
      if (strlen(value) >= e->cap)
        return tsr_error(TSR_EINVAL, "value is longer than %zu characters", e->cap - 1);
      memcpy(base + e->offset, value, strlen(value) + 1);
      return TSR_OK;
    case TSR_STORE_ENUM:
      *(int *)(base + e->offset) = choice_index(e->key.spec.choices, value);
      return TSR_OK;
    case TSR_STORE_NAMES:
    case TSR_STORE_INTS: {
      item_store s = {e, base, 0};
      if (!foreach_item(value, store_item, &s)) {
        if ((size_t)s.count >= e->cap)
          return tsr_error(TSR_EINVAL, "more than %zu entries", e->cap);
        return tsr_error(TSR_EINVAL, "entry %d is longer than %zu characters", s.count + 1,
                         e->name_len - 1);
      }
      *(int *)(base + e->count_offset) = s.count;
      return TSR_OK;
    }
  }
  return tsr_error(TSR_EINTERNAL, "unknown store kind %d", (int)e->store);
}

/* ---- Did-you-mean ---- */

/* Edit distance where swapping two neighbours counts as one edit ("stpes" is one from "steps"),
 * case-insensitive. */
static int edit_distance(const char *a, const char *b) {
  enum { N = 64 };
  size_t la = strlen(a), lb = strlen(b);
  if (la >= N || lb >= N) return 99;
  int d[N][N];
  for (size_t i = 0; i <= la; i++) d[i][0] = (int)i;
  for (size_t j = 0; j <= lb; j++) d[0][j] = (int)j;
  for (size_t i = 1; i <= la; i++)
    for (size_t j = 1; j <= lb; j++) {
      int ca = tolower((unsigned char)a[i - 1]), cb = tolower((unsigned char)b[j - 1]);
      int best = d[i - 1][j - 1] + (ca != cb);
      if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
      if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
      if (i > 1 && j > 1 && ca == tolower((unsigned char)b[j - 2]) &&
          tolower((unsigned char)a[i - 2]) == cb && d[i - 2][j - 2] + 1 < best)
        best = d[i - 2][j - 2] + 1;
      d[i][j] = best;
    }
  return d[la][lb];
}

const char *tsr_closest_name(const char *word, const char *const *names, int n) {
  const char *best = NULL;
  int best_d = 99;
  for (int i = 0; i < n; i++) {
    int d = edit_distance(word, names[i]);
    if (d < best_d) best_d = d, best = names[i];
  }
  /* A third of the word, at least 1 and at most 3 edits: "stpes" finds "steps", "x" finds
   * nothing. */
  int limit = (int)strlen(word) / 3;
  if (limit < 1) limit = 1;
  if (limit > 3) limit = 3;
  return best_d <= limit ? best : NULL;
}

/* ---- docs/ini-reference.md ---- */

tsr_status tsr_config_write_reference(FILE *f) {
  fprintf(f,
          "# Job file reference\n\n"
          "<!-- Generated by `tessera ini-reference` from the schema table in "
          "core/config_schema.c;\n     a test fails when this file and the table differ. -->\n\n"
          "A job file is an INI file. Comments start with `;` or `#` at the start of a line, or\n"
          "` ;` after a value. Every key is optional unless marked required; an absent key takes\n"
          "its default. Unknown sections and keys, duplicate keys, indented continuation lines\n"
          "and out-of-range values are errors that name the file, the line and the key. A\n"
          "UTF-8 byte order mark at the start is accepted; a NUL byte, text after the `]` of\n"
          "a section header (other than a comment) and a job file that is not a regular file\n"
          "(a directory, a FIFO) are errors.\n\n"
          "`[strategy.NAME]` sections hold the keys of plugin NAME, which must be listed in\n"
          "`[plugins] load`; `tessera plugins` lists each plugin's keys, and\n"
          "`docs/plugin-guide.md` explains how a plugin declares them.\n");
  const char *section = "";
  for (int i = 0; i < tsr_schema_len; i++) {
    const tsr_config_key *k = &tsr_schema[i].key;
    if (strcmp(k->section, section)) {
      section = k->section;
      fprintf(f, "\n## [%s]\n\n| key | type | default | description |\n|---|---|---|---|\n",
              section);
    }
    char want[256];
    tsr_key_describe(&k->spec, want, sizeof want);
    const char *def = k->spec.default_value;
    fprintf(f, "| `%s` | %s | %s%s%s | %s |\n", k->spec.name, want, def ? "`" : "",
            def ? (*def ? def : " ") : "required", def ? "`" : "", k->spec.doc);
  }
  if (ferror(f)) return tsr_error(TSR_EIO, "writing the INI reference failed");
  return TSR_OK;
}
