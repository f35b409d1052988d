/* `tessera export`: a job's checkpoint as a Hugging Face model folder (docs/hf.md). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "app.h"
#include "ckpt_shard.h"
#include "hf.h"
#include "tessera/tokenizer.h"
#include "train.h"

static const char export_usage[] =
    "usage: tessera export JOB.ini DIR [options]\n"
    "\n"
    "Writes the job's model as a Hugging Face folder DIR that transformers' from_pretrained\n"
    "loads (docs/hf.md): config.json from the job's [model] keys, the weights in safetensors\n"
    "(one model.safetensors, or shards and model.safetensors.index.json), generation_config.json\n"
    "when the token ids are known, and the tokenizer files given. The weights are those of\n"
    "[checkpoint] save when that file exists, else of [checkpoint] load (a checkpoint file, a\n"
    "sharded checkpoint folder, latest: the newest in [checkpoint] dir, or a Hugging Face\n"
    "folder).\n"
    "\n"
    "options:\n"
    "  --checkpoint PATH    export these weights instead (a checkpoint file, a sharded\n"
    "                       checkpoint folder step-NNNNNN or a Hugging Face folder)\n"
    "  --dtype f32|bf16     the weights' dtype in the folder (default f32)\n"
    "  --shard-size SIZE    most bytes of tensors per file, e.g. 5GB (default), 500MB, 2MiB\n"
    "  --tokenizer FILE     copy FILE (tokenizer.json, tokenizer_config.json, ...) into DIR;\n"
    "                       repeatable; the first that loads as a tokenizer gives BOS, EOS\n"
    "  --max-positions N    max_position_embeddings in config.json (default: the loaded\n"
    "                       folder's, else the larger of [data] seq_len and 2048)\n"
    "  --bos ID, --eos ID   token ids for config.json and generation_config.json\n"
    "  --set S.K=V          override a key of the job file, as `tessera run --set`\n"
    "\n"
    "exit codes: 0 success, 1 runtime failure, 2 bad input (a checkpoint that does not match\n"
    "            the job, an MoE layout Hugging Face has no class for, a bad option); nothing is\n"
    "            written on bad input\n";

static int bad_arg(const char *what, const char *arg) {
  fprintf(stderr, "tessera export: %s '%s'; see tessera export --help\n", what, arg);
  return TSR_EXIT_BAD_INPUT;
}

static int fail(tsr_status s) {
  fprintf(stderr, "tessera export: %s\n", tsr_last_error());
  return tsr_app_exit_code(s);
}

/* "5GB", "500MB", "2MiB", "1024": bytes. */
static bool parse_size(const char *s, int64_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !(v > 0)) return false;
  static const struct {
    const char *unit;
    double mul;
  } units[] = {{"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
               {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
    if (!strcasecmp(end, units[i].unit)) {
      double b = v * units[i].mul;
      if (b < 1 || b > 9e18) return false;
      *out = (int64_t)b;
      return true;
    }
  return false;
}

static bool parse_id(const char *s, int32_t *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 0 || v > 2000000000L) return false;
  *out = (int32_t)v;
  return true;
}

int tsr_cmd_export(int argc, char **argv) {
  if (tsr_app_wants_help(argc, argv)) {
    fputs(export_usage, stdout);
    return TSR_EXIT_OK;
  }
  const char *job = NULL, *dir = NULL, *checkpoint = NULL, *tokenizer[16], *sets[32];
  int ntok = 0, nset = 0;
  tsr_hf_write_opts opts = {
      .dtype = TSR_F32, .shard_bytes = 5000000000LL, .bos_token_id = -1, .eos_token_id = -1};
  bool bos_given = false, eos_given = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (a[0] != '-') {
      if (!job)
        job = a;
      else if (!dir)
        dir = a;
      else
        return bad_arg("a third argument", a);
      continue;
    }
    if (!v) return bad_arg("a value is missing after", a);
    i++;
    if (!strcmp(a, "--checkpoint")) {
      checkpoint = v;
    } else if (!strcmp(a, "--dtype")) {
      if (strcmp(v, "f32") && strcmp(v, "bf16")) return bad_arg("--dtype: not f32 or bf16:", v);
      opts.dtype = strcmp(v, "f32") ? TSR_BF16 : TSR_F32;
    } else if (!strcmp(a, "--shard-size")) {
      if (!parse_size(v, &opts.shard_bytes)) return bad_arg("--shard-size: not a size:", v);
    } else if (!strcmp(a, "--tokenizer")) {
      if (ntok == 16) return bad_arg("more than 16 --tokenizer files:", v);
      tokenizer[ntok++] = v;
    } else if (!strcmp(a, "--max-positions")) {
      int32_t x;
      if (!parse_id(v, &x) || x < 1) return bad_arg("--max-positions: not a positive integer:", v);
      opts.max_positions = x;
    } else if (!strcmp(a, "--bos")) {
      if (!parse_id(v, &opts.bos_token_id)) return bad_arg("--bos: not a token id:", v);
      bos_given = true;
    } else if (!strcmp(a, "--eos")) {
      if (!parse_id(v, &opts.eos_token_id)) return bad_arg("--eos: not a token id:", v);
      eos_given = true;
    } else if (!strcmp(a, "--set")) {
      if (nset == 32) return bad_arg("more than 32 --set:", v);
      sets[nset++] = v;
    } else {
      return bad_arg("unknown option", a);
    }
  }
  if (!job || !dir) return bad_arg("give JOB.ini and DIR; got", job ? job : "nothing");
  opts.tokenizer = tokenizer;
  opts.ntokenizer = ntok;

  tsr_config *cfg = NULL;
  tsr_status s = tsr_config_load(job, &cfg);
  for (int i = 0; s == TSR_OK && i < nset; i++) s = tsr_config_set(cfg, sets[i]);
  if (s == TSR_OK) s = tsr_config_check_sets(cfg);
  if (s == TSR_OK) s = tsr_hf_job_apply(cfg);
  tsr_llama_config mc = {0};
  if (s == TSR_OK) {
    mc = tsr_hf_model_config(cfg);
    s = tsr_llama_config_check(&mc);
    if (s != TSR_OK) s = tsr_error_prefix(s, "%s: [model]", cfg->path);
  }
  if (s == TSR_OK && mc.num_local_experts > 0 && mc.decoder_sparse_step != 1)
    s = tsr_config_error(cfg, TSR_EINVAL, "model", "decoder_sparse_step",
                         "%d: Hugging Face's Mixtral has a sparse MoE block in every layer, and "
                         "no transformers class loads Llama layers with MoE layers between them; "
                         "export needs decoder_sparse_step = 1 (or num_local_experts = 0)",
                         mc.decoder_sparse_step);
  char weights[TSR_TRAIN_PATH_LEN];
  if (s == TSR_OK) s = tsr_hf_job_weights(cfg, checkpoint, weights, sizeof weights);
  /* load = latest: the newest complete folder of [checkpoint] dir */
  struct stat sb;
  if (s == TSR_OK && !checkpoint && !strcmp(cfg->checkpoint.load, "latest") &&
      stat(weights, &sb) != 0 && tsr_config_ext_of(cfg)->checkpoint.dir[0]) {
    char ckdir[TSR_TRAIN_PATH_LEN];
    int64_t step;
    tsr_ckpt_latest(
        tsr_train_path(cfg, tsr_config_ext_of(cfg)->checkpoint.dir, ckdir, sizeof ckdir), weights,
        sizeof weights, &step);
    if (!weights[0])
      s = tsr_config_error(cfg, TSR_EINVAL, "checkpoint", "load",
                           "latest: no complete checkpoint in %s to export; give --checkpoint PATH",
                           ckdir);
  }
  /* what the loaded folder says, and the tokenizer's ids, unless given */
  tsr_hf_config hc;
  bool have_hc =
      s == TSR_OK && tsr_hf_is_folder(weights) && tsr_hf_config_read(weights, &hc) == TSR_OK;
  if (!opts.max_positions)
    opts.max_positions = have_hc && hc.max_position_embeddings > 0
                             ? hc.max_position_embeddings
                             : (cfg && cfg->data.seq_len > 2048 ? cfg->data.seq_len : 2048);
  if (have_hc && !bos_given) opts.bos_token_id = hc.bos_token_id;
  if (have_hc && !eos_given && hc.neos > 0) opts.eos_token_id = hc.eos_token_id[0];
  for (int i = 0; s == TSR_OK && i < ntok; i++) {
    /* the first file that loads as a tokenizer (a tokenizer.json must) */
    const char *base = strrchr(tokenizer[i], '/');
    bool must = !strcmp(base ? base + 1 : tokenizer[i], "tokenizer.json");
    tsr_tokenizer_t *tok = NULL;
    s = tsr_tokenizer_load(tokenizer[i], &tok);
    if (s != TSR_OK && !must) {
      s = TSR_OK;
      tsr_clear_error();
      continue;
    }
    if (s != TSR_OK) break;
    const int32_t *head, *tail;
    int nhead, ntail;
    tsr_tokenizer_template(tok, &head, &nhead, &tail, &ntail);
    if (!bos_given && nhead == 1) opts.bos_token_id = head[0];
    int32_t eos = tsr_tokenizer_eos(tok, NULL);
    if (!eos_given && eos >= 0) opts.eos_token_id = eos;
    if (tsr_tokenizer_vocab_size(tok) > mc.vocab_size)
      s = tsr_error(TSR_EINVAL, "%s: the tokenizer has %d ids but [model] vocab_size is %d",
                    tokenizer[i], (int)tsr_tokenizer_vocab_size(tok), mc.vocab_size);
    tsr_tokenizer_free(tok);
    break;
  }
  /* read and check every tensor before anything is written */
  tsr_hf_tensor *specs = NULL;
  tsr_tensor **ts = NULL;
  const char **names = NULL;
  tsr_hf_weights *w = NULL;
  int n = 0;
  if (s == TSR_OK) s = tsr_hf_tensors(&mc, &specs, &n);
  if (s == TSR_OK) {
    ts = calloc((size_t)n + 1, sizeof *ts);
    names = calloc((size_t)n + 1, sizeof *names);
    if (!ts || !names) s = TSR_ERROR(TSR_ENOMEM, "export: out of memory");
  }
  for (int i = 0; s == TSR_OK && i < n; i++) {
    names[i] = specs[i].name;
    s = tsr_tensor_new(NULL, TSR_F32, specs[i].ndim, specs[i].shape, &ts[i]);
  }
  /* a sharded checkpoint folder: each tensor from the slices that hold it */
  bool sharded = s == TSR_OK && tsr_ckpt_is_folder(weights);
  if (sharded) s = tsr_hf_sharded_load(weights, n, names, ts);
  if (s == TSR_OK && !sharded) s = tsr_hf_weights_open(weights, &w);
  if (s == TSR_OK && !sharded) {
    const char *ignore[4];
    int nignore = 0;
    for (int i = 0; i < tsr_checkpoint_hf_buffers_count && nignore < 3; i++)
      ignore[nignore++] = tsr_checkpoint_hf_buffers[i];
    if (mc.tie_word_embeddings) ignore[nignore++] = "lm_head.weight";
    s = tsr_hf_weights_load(w, n, names, ts, nignore, ignore);
  }
  tsr_hf_weights_close(w);
  for (int i = 0; s == TSR_OK && i < ntok; i++) {
    FILE *f = fopen(tokenizer[i], "rb");
    if (!f)
      s = tsr_error(TSR_EIO, "--tokenizer %s: cannot read: %s", tokenizer[i], strerror(errno));
    if (f) fclose(f);
  }
  if (s == TSR_OK)
    s = tsr_hf_folder_write(dir, cfg, n, names, (const tsr_tensor *const *)ts, &opts);
  if (s == TSR_OK)
    printf("exported %s (%d tensors, %s) to %s\n", weights, n,
           opts.dtype == TSR_BF16 ? "bf16" : "f32", dir);
  for (int i = 0; ts && i < n; i++) tsr_tensor_free(ts[i]);
  free(ts);
  free(names);
  free(specs);
  tsr_config_free(cfg);
  return s == TSR_OK ? TSR_EXIT_OK : fail(s);
}
