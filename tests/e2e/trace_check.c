/* trace_check TRACE.json WORLD DIMS PIPELINE STEPS MODE: checks an [output] trace (trace.sh).
 * The file parses as JSON (cJSON); it has a track (thread_name) per rank 0..WORLD-1; on every
 * track: a "step" slice per step 1..STEPS, "phase" and "op" slices (MODE train: ops in both
 * passes), "comm" slices with a group and bytes >= 0 over each mesh dim of DIMS (comma
 * separated, "-" for none) when WORLD > 1, "pipeline" slices exactly when PIPELINE is 1; slices
 * on a track nest (1 us of slack). Prints "ok N events" or what is wrong; exit 0 when ok. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

typedef struct slice {
  double ts, end;
  const char *name;
} slice;

static int bad;

static void fail(const char *fmt, const char *a, int r) {
  printf(fmt, a, r);
  putchar('\n');
  bad++;
}

static const char *str(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : "";
}

static double num(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

static int by_start(const void *a, const void *b) {
  const slice *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  return x->end > y->end ? -1 : x->end < y->end; /* the longer first: it holds the other */
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: trace_check TRACE WORLD DIMS PIPELINE STEPS MODE\n");
    return 2;
  }
  int world = atoi(argv[2]), steps = atoi(argv[5]);
  bool pipe = !strcmp(argv[4], "1"), train = !strcmp(argv[6], "train");
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    printf("cannot open %s\n", argv[1]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc((size_t)len + 1);
  if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) return 1;
  text[len] = '\0';
  fclose(f);
  cJSON *doc = cJSON_Parse(text);
  const cJSON *events = cJSON_GetObjectItemCaseSensitive(doc, "traceEvents");
  if (!doc || !cJSON_IsArray(events)) {
    printf("not a trace: %s\n", doc ? "no traceEvents array" : "not JSON");
    return 1;
  }
  int nev = cJSON_GetArraySize(events), total = 0;
  for (int r = 0; r < world; r++) {
    bool named = false, cat_step = false, cat_phase = false, cat_op = false, cat_comm = false,
         cat_pipe = false, fwd = false, bwd = false, linear = false;
    int nsteps = 0, n = 0;
    slice *sl = calloc((size_t)nev + 1, sizeof *sl);
    char groups[1024] = ",";
    for (const cJSON *e = events->child; e; e = e->next) {
      if ((int)num(e, "tid") != r) continue;
      if (!strcmp(str(e, "name"), "thread_name")) named = true;
      if (strcmp(str(e, "ph"), "X")) continue;
      const char *cat = str(e, "cat"), *name = str(e, "name");
      const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
      sl[n++] = (slice){num(e, "ts"), num(e, "ts") + num(e, "dur"), name};
      if (!strcmp(cat, "step")) {
        cat_step = true;
        if ((int)num(args, "step") == nsteps + 1) nsteps++;
      } else if (!strcmp(cat, "phase")) {
        cat_phase = true;
      } else if (!strcmp(cat, "op")) {
        cat_op = true;
        fwd |= !strcmp(str(args, "pass"), "forward");
        bwd |= !strcmp(str(args, "pass"), "backward");
        linear |= !strcmp(name, "linear");
      } else if (!strcmp(cat, "comm")) {
        cat_comm = true;
        const char *g = str(args, "group");
        if (!*g || num(args, "bytes") < 0)
          fail("%s: rank %d has a comm slice without a group or bytes", name, r);
        char item[128];
        for (const char *p = g; *p;) {
          size_t k = strcspn(p, "+");
          snprintf(item, sizeof item, ",%.*s,", (int)k, p);
          if (!strstr(groups, item) && strlen(groups) + k + 2 < sizeof groups)
            strncat(groups, item + 1, k + 1);
          p += k + (p[k] == '+');
        }
      } else if (!strcmp(cat, "pipeline")) {
        cat_pipe = true;
      }
    }
    total += n;
    if (!named) fail("%s rank %d has no track", "", r);
    if (!cat_step || nsteps != steps) fail("%s rank %d lacks a step slice per step", "", r);
    if (!cat_phase) fail("%s rank %d has no phase slices", "", r);
    if (!cat_op || !linear || !fwd || (train && !bwd))
      fail("%s rank %d lacks op slices (linear, forward and, training, backward)", "", r);
    if (world > 1 && !cat_comm) fail("%s rank %d has no comm slices", "", r);
    if (cat_pipe != pipe)
      fail("%s rank %d: pipeline slices where there is no pp, or none with it", "", r);
    char dims[256];
    snprintf(dims, sizeof dims, "%s", strcmp(argv[3], "-") ? argv[3] : "");
    for (char *d = strtok(dims, ","); d; d = strtok(NULL, ",")) {
      char item[128];
      snprintf(item, sizeof item, ",%s,", d);
      if (!strstr(groups, item)) fail("no communication over %s on rank %d", d, r);
    }
    /* nesting: a slice that starts inside another ends inside it */
    qsort(sl, (size_t)n, sizeof *sl, by_start);
    slice *stack[4096];
    int depth = 0;
    for (int i = 0; i < n; i++) {
      while (depth && sl[i].ts >= stack[depth - 1]->end - 1e-3) depth--;
      if (depth && sl[i].end > stack[depth - 1]->end + 1.0) {
        printf("rank %d: %s at %.3f overlaps %s\n", r, sl[i].name, sl[i].ts,
               stack[depth - 1]->name);
        bad++;
        break;
      }
      if (depth < 4096) stack[depth++] = &sl[i];
    }
    free(sl);
  }
  for (const cJSON *e = events->child; e; e = e->next)
    if (!strcmp(str(e, "name"), "thread_name") && (int)num(e, "tid") >= world)
      fail("%s a track for rank %d, beyond the world", "", (int)num(e, "tid"));
  if (!bad) printf("ok %d events\n", total);
  cJSON_Delete(doc);
  free(text);
  return bad ? 1 : 0;
}
