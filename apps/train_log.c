/* The training log of rank 0. */
#include <math.h>
#include <string.h>
#include <time.h>

#include "tessera/comm.h"
#include "train.h"
#include "train_log.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *bytes_str(double b, char *buf, size_t len) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024.0 && u < 4) b /= 1024.0, u++;
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
  return buf;
}

/* FLOP/s with a prefix that keeps three significant digits readable on a laptop and a GPU. */
static const char *flops_str(double f, char *buf, size_t len) {
  if (f >= 1e12)
    snprintf(buf, len, "%.2f TFLOP/s", f / 1e12);
  else
    snprintf(buf, len, "%.1f GFLOP/s", f / 1e9);
  return buf;
}

/* A number for JSON, which has no NaN or Inf: null for those. */
static const char *json_num(double v, const char *fmt, char *buf, size_t len) {
  if (!isfinite(v)) return "null";
  snprintf(buf, len, fmt, v);
  return buf;
}

double tsr_train_flops_per_token(const tsr_llama_config *m, int64_t seq_len) {
  double n = (double)tsr_llama_num_params(m);
  if (!m->tie_word_embeddings) n -= (double)m->vocab_size * m->hidden_size;
  /* an MoE layer computes with its router and the top-k experts of each token, not all */
  for (int l = 0; l < m->num_hidden_layers; l++)
    if (tsr_llama_layer_is_moe(m, l))
      n -= 3.0 * (m->num_local_experts - m->num_experts_per_tok) * m->intermediate_size *
           m->hidden_size;
  return 6.0 * n + 6.0 * m->num_hidden_layers * m->hidden_size * (double)seq_len;
}

void tsr_train_log_header(tsr_train_log *l, const tsr_app_job *job, int threads) {
  const tsr_config *c = job->cfg;
  char buf[256];
  if (l->json) return;
  fprintf(l->out, "job %s: %s, %lld steps, %lld ranks (%s), %d kernel threads per rank\n", c->path,
          c->job.mode == TSR_MODE_TRAIN ? "train" : "forward", (long long)c->job.steps,
          (long long)c->mesh.world, tsr_mesh_str(job->mesh, buf, sizeof buf), threads);
  fprintf(l->out,
          "model: vocab %lld, hidden %lld, intermediate %lld, %lld layers, %lld heads / %lld kv, "
          "%s; batch %lld x %lld tokens",
          (long long)c->model.vocab_size, (long long)c->model.hidden_size,
          (long long)c->model.intermediate_size, (long long)c->model.num_hidden_layers,
          (long long)c->model.num_attention_heads,
          (long long)(c->model.num_key_value_heads ? c->model.num_key_value_heads
                                                   : c->model.num_attention_heads),
          c->model.tie_word_embeddings ? "tied embeddings" : "untied",
          (long long)c->data.batch_size, (long long)c->data.seq_len);
  const tsr_config_ext *x = tsr_config_ext_of(c);
  if (x->model.num_local_experts > 0) {
    fprintf(l->out, "; MoE %lld experts, top-%lld, ", (long long)x->model.num_local_experts,
            (long long)x->model.num_experts_per_tok);
    if (x->model.decoder_sparse_step > 1)
      fprintf(l->out, "every layer l with (l + 1) %% %lld == 0",
              (long long)x->model.decoder_sparse_step);
    else
      fprintf(l->out, "every layer");
  }
  if (c->optimizer.grad_accum_steps > 1)
    fprintf(l->out, " in %lld microbatches", (long long)c->optimizer.grad_accum_steps);
  fprintf(l->out, "; data %s\n", c->data.source);
  if (l->peak_gflops > 0)
    fprintf(l->out, "sgemm peak: %.1f GFLOP/s on %d threads (measured now; MFU is against it)\n",
            l->peak_gflops, l->peak_threads);
  fflush(l->out);
}

void tsr_train_log_resume(tsr_train_log *l, const tsr_config *c, int64_t resumed_at) {
  if (l->json || !c->checkpoint.load[0]) return;
  /* load = latest with no checkpoint yet: the load said so, the run starts afresh */
  if (resumed_at < 0 && !strcmp(c->checkpoint.load, "latest")) return;
  if (resumed_at >= 0)
    fprintf(l->out, "resumed from %s at step %lld (model and optimizer state)\n",
            c->checkpoint.load, (long long)resumed_at);
  else
    fprintf(l->out, "loaded weights from %s (no optimizer state beside it: fresh optimizer)\n",
            c->checkpoint.load);
  fflush(l->out);
}

void tsr_train_log_begin(tsr_train_log *l, int64_t start_step, int64_t end_step) {
  l->first_step = start_step;
  l->end_step = end_step;
  l->t_begin = now_s();
  l->steps_done = 0;
  l->secs_total = 0;
}

typedef struct comm_fmt {
  char *buf;
  size_t len, used;
} comm_fmt;

static void add_label(const char *label, uint64_t bytes, void *arg) {
  comm_fmt *f = arg;
  if (!strcmp(label, "log") || !bytes || f->used >= f->len) return;
  char b[32];
  int n = snprintf(f->buf + f->used, f->len - f->used, "%s%s %s", f->used ? ", " : "", label,
                   bytes_str((double)bytes, b, sizeof b));
  if (n > 0) f->used += (size_t)n;
}

void tsr_train_log_comm(tsr_train_log *l, const tsr_comm_t *comm) {
  comm_fmt f = {l->comm, sizeof l->comm, 0};
  l->comm[0] = '\0';
  tsr_comm_bytes_foreach(comm, add_label, &f);
}

/* Seconds since the epoch, for the metrics' "time". */
static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* `s` with '"' and '\\' escaped and control characters left out, into buf. */
static const char *json_str(const char *s, char *buf, size_t len) {
  size_t o = 0;
  for (; *s && o + 3 < len; s++) {
    if (*s == '"' || *s == '\\') buf[o++] = '\\';
    if ((unsigned char)*s >= 0x20) buf[o++] = *s;
  }
  buf[o] = '\0';
  return buf;
}

/* One line of [output] metrics, written whole and flushed. */
static void metrics_line(tsr_train_log *l, const char *line) {
  if (!l->metrics) return;
  if (fputs(line, l->metrics) < 0 || fflush(l->metrics) != 0) l->metrics_failed = true;
}

static void metrics_step(tsr_train_log *l, const tsr_train_step_stats *s, double wall, double tps,
                         double flops, double mfu) {
  if (!l->metrics) return;
  char line[2560], a[64], b[64], c[64], skip[1536];
  int n = snprintf(line, sizeof line,
                   "{\"step\": %lld, \"kind\": \"%s\", \"time\": %.3f, \"loss\": %s, \"lr\": %.6g, "
                   "\"grad_norm\": %s, \"tokens_per_s\": %.1f, \"flops_per_s\": %.6g, \"mfu\": %s, "
                   "\"peak_bytes\": %lld, \"peak_bytes_min\": %lld, \"secs\": %.6f",
                   (long long)s->step, s->train ? "train" : "forward", wall,
                   json_num(s->loss, "%.6f", a, sizeof a), s->lr,
                   json_num(s->train ? s->grad_norm : NAN, "%.6g", b, sizeof b), tps, flops,
                   json_num(mfu >= 0 ? mfu : NAN, "%.4f", c, sizeof c), (long long)s->peak_bytes,
                   (long long)s->peak_bytes_min, s->secs);
  if (s->skipped)
    n += snprintf(line + n, sizeof line - (size_t)n, ", \"skipped\": \"%s\"",
                  json_str(s->skipped, skip, sizeof skip));
  snprintf(line + n, sizeof line - (size_t)n, "}\n");
  metrics_line(l, line);
}

void tsr_train_log_step(tsr_train_log *l, const tsr_train_step_stats *s) {
  if (l->steps_done == 0) l->loss_first = s->loss;
  l->loss_last = s->loss;
  l->steps_done++;
  l->secs_total += s->secs;
  double tps = (double)l->tokens_per_step / s->secs;
  double flops = tps * l->flops_per_token / (s->train ? 1.0 : 3.0);
  double mfu = l->peak_gflops > 0 ? flops / (l->peak_gflops * 1e9) : -1;
  double wall = wall_s();
  metrics_step(l, s, wall, tps, flops, mfu);
  /* the same figures as the metrics' line, under "<kind>/<key>" */
  static const char *const train_tags[] = {
      "train/loss",        "train/lr",  "train/grad_norm",  "train/tokens_per_s",
      "train/flops_per_s", "train/mfu", "train/peak_bytes", "train/peak_bytes_min",
      "train/secs"};
  static const char *const fwd_tags[] = {
      "forward/loss",        "forward/lr",  "forward/grad_norm",  "forward/tokens_per_s",
      "forward/flops_per_s", "forward/mfu", "forward/peak_bytes", "forward/peak_bytes_min",
      "forward/secs"};
  double vals[9] = {s->loss,
                    s->lr,
                    s->train ? s->grad_norm : NAN,
                    tps,
                    flops,
                    mfu >= 0 ? mfu : NAN,
                    (double)s->peak_bytes,
                    (double)s->peak_bytes_min,
                    s->secs};
  tsr_train_tboard_scalars(l, s->step, wall, 9, s->train ? train_tags : fwd_tags, vals);
  if (l->json) {
    char lb[64], gb[64];
    fprintf(l->out,
            "{\"step\": %lld, \"loss\": %s, \"lr\": %.6g, \"grad_norm\": %s, \"secs\": %.6f, "
            "\"tokens_per_s\": %.1f, \"flops_per_s\": %.6g, \"mfu\": %.4f, \"peak_bytes\": %lld, "
            "\"peak_bytes_min\": %lld, "
            "\"comm\": \"%s\"",
            (long long)s->step, json_num(s->loss, "%.6f", lb, sizeof lb), s->lr,
            json_num(s->grad_norm, "%.6g", gb, sizeof gb), s->secs, tps, flops, mfu,
            (long long)s->peak_bytes, (long long)s->peak_bytes_min, l->comm);
    if (s->skipped) {
      fputs(", \"skipped\": \"", l->out);
      for (const char *p = s->skipped; *p; p++)
        if (*p == '"' || *p == '\\')
          fprintf(l->out, "\\%c", *p);
        else if ((unsigned char)*p >= 0x20)
          fputc(*p, l->out);
      fputc('"', l->out);
    }
    fputs("}\n", l->out);
    fflush(l->out);
    return;
  }
  char line[1024], fb[32], mb[32];
  int n = snprintf(line, sizeof line, "step %*lld/%lld  loss %.4f", s->step >= 1000 ? 5 : 3,
                   (long long)s->step, (long long)l->end_step, s->loss);
  if (s->train)
    n += snprintf(line + n, sizeof line - (size_t)n, "  lr %.3e  gnorm %.3f", s->lr, s->grad_norm);
  n += snprintf(line + n, sizeof line - (size_t)n, "  %.0f tok/s  %s", tps,
                flops_str(flops, fb, sizeof fb));
  if (mfu >= 0) n += snprintf(line + n, sizeof line - (size_t)n, "  MFU %.1f%%", 100 * mfu);
  if (s->peak_bytes_min != s->peak_bytes) {
    char lo[32];
    n += snprintf(line + n, sizeof line - (size_t)n, "  peak/rank %s..%s",
                  bytes_str((double)s->peak_bytes_min, lo, sizeof lo),
                  bytes_str((double)s->peak_bytes, mb, sizeof mb));
  } else {
    n += snprintf(line + n, sizeof line - (size_t)n, "  peak/rank %s",
                  bytes_str((double)s->peak_bytes, mb, sizeof mb));
  }
  n += snprintf(line + n, sizeof line - (size_t)n, "  comm %s", l->comm[0] ? l->comm : "-");
  if (!l->progress) {
    fprintf(l->out, "%s\n", line);
  } else {
    /* A terminal keeps about ten lines of a long run and rewrites the current one in place. */
    int64_t total = l->end_step - l->first_step, done = s->step - l->first_step;
    int64_t every = total / 10 > 0 ? total / 10 : 1;
    double eta = l->secs_total / (double)done * (double)(total - done);
    bool keep = done == 1 || done % every == 0 || done == total || s->skipped;
    fprintf(l->out, "\r\033[K%s  ETA %d:%02d%s", line, (int)(eta / 60), (int)eta % 60,
            keep ? "\n" : "");
  }
  if (s->skipped) fprintf(l->out, "%s\n", s->skipped);
  fflush(l->out);
}

void tsr_train_log_end(tsr_train_log *l) {
  if (l->json || !l->steps_done) return;
  double wall = now_s() - l->t_begin;
  fprintf(l->out, "done: %lld steps in %.1f s (%.0f tok/s); loss %.4f -> %.4f\n",
          (long long)l->steps_done, wall,
          (double)l->tokens_per_step * (double)l->steps_done / l->secs_total, l->loss_first,
          l->loss_last);
  fflush(l->out);
}

void tsr_train_log_eval(tsr_train_log *l, const tsr_train_eval_result *e) {
  double wall = wall_s();
  static const char *const tags[] = {"eval/loss", "eval/ppl", "eval/batches", "eval/tokens",
                                     "eval/secs"};
  double vals[5] = {e->loss, e->ppl, (double)e->batches, (double)e->tokens, e->secs};
  tsr_train_tboard_scalars(l, e->step, wall, 5, tags, vals);
  if (l->metrics) {
    char line[512], a[64], b[64];
    snprintf(line, sizeof line,
             "{\"step\": %lld, \"kind\": \"eval\", \"time\": %.3f, \"eval_loss\": %s, "
             "\"eval_ppl\": %s, \"eval_batches\": %lld, \"eval_tokens\": %lld, \"eval_secs\": "
             "%.6f}\n",
             (long long)e->step, wall, json_num(e->loss, "%.6f", a, sizeof a),
             json_num(e->ppl, "%.6g", b, sizeof b), (long long)e->batches, (long long)e->tokens,
             e->secs);
    metrics_line(l, line);
  }
  if (l->json) {
    char a[64], b[64];
    fprintf(l->out,
            "{\"step\": %lld, \"eval_loss\": %s, \"eval_ppl\": %s, \"eval_batches\": %lld, "
            "\"eval_tokens\": %lld, \"eval_secs\": %.6f}\n",
            (long long)e->step, json_num(e->loss, "%.6f", a, sizeof a),
            json_num(e->ppl, "%.6g", b, sizeof b), (long long)e->batches, (long long)e->tokens,
            e->secs);
    fflush(l->out);
    return;
  }
  /* on a terminal the step line may be waiting to be rewritten: this one starts afresh */
  fprintf(l->out, "%seval %*lld/%lld  loss %.4f  ppl %.3f  (%lld batches, %lld tokens, %.1f s)\n",
          l->progress ? "\r\033[K" : "", e->step >= 1000 ? 5 : 3, (long long)e->step,
          (long long)l->end_step, e->loss, e->ppl, (long long)e->batches, (long long)e->tokens,
          e->secs);
  fflush(l->out);
}
