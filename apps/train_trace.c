/* [output] trace: every rank's timeline in the Chrome trace / Perfetto JSON format, for any mesh.
 * Each rank records its ops and communication (the core's events, tessera/trace.h), the phases
 * of each step and, with a pipeline, the schedule's actions; after the run rank 0 gathers the
 * ranks' events and writes one file with a track per rank. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "tessera/io.h"
#include "train.h"

tsr_status tsr_train_trace_begin(tsr_train_rank *t) {
  if (!t->job->cfg->output.trace[0]) return TSR_OK;
  TSR_CHECK(tsr_trace_new(TSR_TRAIN_TRACE_EVENTS, &t->trace));
  tsr_trace_attach(t->trace);
  return TSR_OK;
}

void tsr_train_trace_end(tsr_train_rank *t) {
  if (!t->trace) return;
  tsr_trace_attach(NULL);
  tsr_trace_free(t->trace);
  t->trace = NULL;
}

/* A name for the trace: letters, digits and a few marks; anything else becomes '?' (the names
 * are the core's and the plugins' op names and group labels, never user text). */
static void put_name(FILE *f, const char *s) {
  for (; s && *s; s++) {
    unsigned char c = (unsigned char)*s;
    fputc(c >= 0x20 && c < 0x7f && c != '"' && c != '\\' ? c : '?', f);
  }
}

/* This rank's events as JSON lines, each ending in ",\n", with times from `base` (ns). */
static void format_events(tsr_train_rank *t, int rank, int stage, int64_t base, FILE *f) {
  if (stage >= 0)
    fprintf(f,
            "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
            "{\"name\": \"rank %d (stage %d)\"}},\n",
            rank, rank, stage);
  else
    fprintf(f,
            "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
            "{\"name\": \"rank %d\"}},\n",
            rank, rank);
  fprintf(f,
          "{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": 0, \"tid\": %d, \"args\": "
          "{\"sort_index\": %d}},\n",
          rank, rank);
  int64_t n = tsr_trace_count(t->trace);
  for (int64_t i = 0; i < n; i++) {
    const tsr_trace_event *e = tsr_trace_event_at(t->trace, i);
    fputs("{\"name\": \"", f);
    put_name(f, e->name);
    if (!strcmp(e->cat, "comm")) {
      fputc(' ', f);
      put_name(f, e->group);
    } else if (!strcmp(e->cat, "pipeline") || !strcmp(e->cat, "step")) {
      fprintf(f, " %lld", (long long)e->a);
    }
    fputs("\", \"cat\": \"", f);
    put_name(f, e->cat);
    fprintf(f,
            "\", \"ph\": \"X\", \"pid\": 0, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, \"args\": {",
            rank, (double)(e->t0_ns - base) * 1e-3, (double)(e->t1_ns - e->t0_ns) * 1e-3);
    if (!strcmp(e->cat, "op")) {
      fputs("\"pass\": \"", f);
      put_name(f, e->pass);
      fputc('"', f);
    } else if (!strcmp(e->cat, "comm")) {
      fputs("\"group\": \"", f);
      put_name(f, e->group);
      fprintf(f, "\", \"bytes\": %lld", (long long)e->bytes);
    } else if (!strcmp(e->cat, "pipeline")) {
      fprintf(f, "\"microbatch\": %lld, \"stage\": %lld", (long long)e->a, (long long)e->b);
    } else if (e->a >= 0) {
      fprintf(f, "\"step\": %lld", (long long)e->a);
      if (e->b >= 0) fprintf(f, ", \"microbatch\": %lld", (long long)e->b);
    }
    fputs("}},\n", f);
  }
}

/* The rank's pipeline stage (its first), or -1 without a pipeline. */
static int rank_stage(tsr_train_rank *t) {
  if (!t->pipe) return -1;
  int P = tsr_llama_stage_count(t->model) / tsr_llama_stages_per_rank(t->model);
  for (int s = 0; s < P; s++)
    if (tsr_mesh_contains(tsr_llama_stage_mesh(t->model, s), tsr_rank_id(t->r))) return s;
  return -1;
}

tsr_status tsr_train_trace_write(tsr_train_rank *t, tsr_group_t *all, FILE *out) {
  const tsr_config *c = t->job->cfg;
  if (!t->trace) return TSR_OK;
  tsr_trace *trace = t->trace;
  tsr_trace_attach(NULL); /* the gathering below is not part of the run */
  int world = tsr_group_size(all), me = tsr_group_index(all);
  char *text = NULL, *every = NULL;
  size_t len = 0;
  int64_t *lens = calloc((size_t)world, sizeof *lens);
  size_t *counts = calloc((size_t)world, sizeof *counts);
  tsr_status st = TSR_OK;
  if (!lens || !counts) {
    st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
    goto cleanup;
  }
  /* one time origin for every rank: the earliest event of any */
  int64_t first = INT64_MAX, n = tsr_trace_count(trace);
  for (int64_t i = 0; i < n; i++)
    if (tsr_trace_event_at(trace, i)->t0_ns < first) first = tsr_trace_event_at(trace, i)->t0_ns;
  int64_t neg = -first, worst = 0, drops[2] = {tsr_trace_dropped(trace), 0};
  TSR_CHECK_GOTO(tsr_comm_all_reduce(all, &neg, &worst, 1, TSR_I64, TSR_REDUCE_MAX), st);
  TSR_CHECK_GOTO(tsr_comm_all_reduce(all, drops, drops + 1, 1, TSR_I64, TSR_REDUCE_SUM), st);
  int64_t base = worst == -INT64_MAX ? 0 : -worst;
  FILE *f = open_memstream(&text, &len);
  if (!f) {
    st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
    goto cleanup;
  }
  format_events(t, me, rank_stage(t), base, f);
  if (fclose(f) != 0) {
    st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
    goto cleanup;
  }
  /* the texts travel as 4-byte words, the last one padded */
  int64_t mine = (int64_t)len;
  TSR_CHECK_GOTO(tsr_comm_all_gather(all, &mine, 1, lens, NULL, TSR_I64), st);
  size_t words = 0;
  for (int r = 0; r < world; r++) words += (counts[r] = ((size_t)lens[r] + 3) / 4);
  every = malloc(words * 4 + 4);
  char *padded = realloc(text, counts[me] * 4 + 4);
  if (!every || !padded) {
    st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory for %zu bytes", words * 4);
    goto cleanup;
  }
  text = padded;
  memset(text + len, ' ', counts[me] * 4 + 4 - len);
  TSR_CHECK_GOTO(tsr_comm_all_gather(all, text, counts[me], every, counts, TSR_I32), st);
  if (me == 0) {
    char path[TSR_TRAIN_PATH_LEN], where[TSR_MAX_PATH + 160], *doc = NULL;
    size_t dlen = 0;
    FILE *d = open_memstream(&doc, &dlen);
    if (!d) {
      st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
      goto cleanup;
    }
    fprintf(d,
            "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"dropped_events\": %lld, "
            "\"events_per_rank\": %d}, \"traceEvents\": [\n",
            (long long)drops[1], TSR_TRAIN_TRACE_EVENTS);
    fprintf(d, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 0, \"args\": {\"name\": "
               "\"tessera run\"}},\n");
    size_t at = 0;
    for (int r = 0; r < world; r++) {
      fwrite(every + at * 4, 1, (size_t)lens[r], d);
      at += counts[r];
    }
    fprintf(d, "{\"name\": \"end\", \"ph\": \"i\", \"pid\": 0, \"tid\": 0, \"ts\": 0, \"s\": "
               "\"g\"}\n]}\n");
    if (fclose(d) != 0) {
      free(doc);
      st = TSR_ERROR(TSR_ENOMEM, "trace: out of memory");
      goto cleanup;
    }
    tsr_train_path(c, c->output.trace, path, sizeof path);
    /* as every output: a temporary beside the path, renamed over it */
    st = tsr_file_write_atomic(path, doc, dlen);
    free(doc);
    if (st != TSR_OK)
      st = tsr_error_prefix(st, "%s", tsr_config_where(c, "output", "trace", where, sizeof where));
    else if (drops[1] && out)
      fprintf(out,
              "trace: %lld events past the first %d of a rank were not kept; trace fewer steps "
              "(--stop-at) for the whole timeline\n",
              (long long)drops[1], TSR_TRAIN_TRACE_EVENTS);
  }
cleanup:
  free(text);
  free(every);
  free(lens);
  free(counts);
  return st;
}
