/* Job-file parser: values, defaults, every error path and the generated reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/config.h"

#ifndef TSR_TEST_SOURCE_DIR
#error "TSR_TEST_SOURCE_DIR must point at the source tree (tests/plugins/CMakeLists.txt sets it)"
#endif

/* Parses `text` expecting failure; checks that the message contains every given fragment. */
static void expect_error(const char *text, ...) {
  tsr_config *cfg = NULL;
  tsr_status st = tsr_config_parse_string(text, "job.ini", &cfg);
  assert_int_equal(st, TSR_EINVAL);
  assert_null(cfg);
  const char *msg = tsr_last_error();
  va_list ap;
  va_start(ap, text);
  for (const char *want; (want = va_arg(ap, const char *));) {
    if (!strstr(msg, want)) fail_msg("message\n  %s\nlacks\n  %s", msg, want);
  }
  va_end(ap);
}

static tsr_config *parse_ok(const char *text) {
  tsr_config *cfg = NULL;
  tsr_status st = tsr_config_parse_string(text, "job.ini", &cfg);
  if (st != TSR_OK) fail_msg("unexpected error: %s", tsr_last_error());
  assert_non_null(cfg);
  return cfg;
}

static void test_defaults(void **state) {
  (void)state;
  tsr_config *cfg = parse_ok("");
  assert_int_equal(cfg->job.mode, TSR_MODE_TRAIN);
  assert_int_equal(cfg->job.steps, 1);
  assert_string_equal(cfg->job.backend, "local");
  assert_int_equal(cfg->job.device, TSR_DEVICE_CPU);
  assert_int_equal(cfg->mesh.ndim, 1);
  assert_string_equal(cfg->mesh.names[0], "dp");
  assert_int_equal(cfg->mesh.world, 1);
  assert_int_equal(cfg->plugins.nload, 0);
  /* 0 means "as many as attention heads", resolved at parse time. */
  assert_int_equal(cfg->model.num_key_value_heads, cfg->model.num_attention_heads);
  assert_string_equal(cfg->data.source, "synthetic");
  assert_true(cfg->optimizer.beta2 > 0.99);
  tsr_config_free(cfg);
}

static void test_values_and_lines(void **state) {
  (void)state;
  tsr_config *cfg = parse_ok("[job]\n"
                             "mode = forward   ; inline comment\n"
                             "steps = 7\n"
                             "timeout_s = 2.5\n"
                             "# a comment line\n"
                             "[mesh]\n"
                             "dims = dp, ulysess_cp, tp\n"
                             "shape = 2,3 , 1\n"
                             "[plugins]\n"
                             "load = a, b\n"
                             "[strategy.a]\n"
                             "x = 1\n"
                             "[model]\n"
                             "tie_word_embeddings = true\n"
                             "num_key_value_heads = 2\n");
  assert_int_equal(cfg->job.mode, TSR_MODE_FORWARD);
  assert_int_equal(cfg->job.steps, 7);
  assert_true(cfg->job.timeout_s == 2.5);
  assert_int_equal(cfg->mesh.ndim, 3);
  /* as written: an alias is its owning plugin's to rename, when the job loads */
  assert_string_equal(cfg->mesh.names[1], "ulysess_cp");
  assert_int_equal(cfg->mesh.shape[0], 2);
  assert_int_equal(cfg->mesh.shape[1], 3);
  assert_int_equal(cfg->mesh.world, 6);
  assert_int_equal(cfg->plugins.nload, 2);
  assert_string_equal(cfg->plugins.load[1], "b");
  assert_true(cfg->model.tie_word_embeddings);
  assert_int_equal(cfg->model.num_key_value_heads, 2);
  assert_int_equal(tsr_config_line(cfg, "job", "steps"), 3);
  assert_int_equal(tsr_config_line(cfg, "mesh", NULL), 6);
  assert_int_equal(tsr_config_line(cfg, "strategy.a", "x"), 12);
  assert_int_equal(tsr_config_line(cfg, "strategy.a", NULL), 11);
  assert_int_equal(tsr_config_line(cfg, "job", "seed"), 0);
  const tsr_config_section *s = tsr_config_strategy(cfg, "a");
  assert_non_null(s);
  assert_int_equal(s->n, 1);
  assert_string_equal(s->entries[0].value, "1");
  assert_null(tsr_config_strategy(cfg, "b"));
  assert_int_equal(tsr_config_check_world(cfg, 6), TSR_OK);
  assert_int_equal(tsr_config_check_world(cfg, 4), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "job.ini:8: [mesh] shape: product 6 differs"));
  tsr_config_free(cfg);
}

static void test_unknown_section_and_key(void **state) {
  (void)state;
  expect_error("[mesg]\n", "job.ini:1: [mesg]: unknown section; did you mean [mesh]?", NULL);
  expect_error("[job]\n[zzzzzz]\nfoo = 1\n", "job.ini:2: [zzzzzz]: unknown section",
               "[strategy.NAME]", NULL);
  expect_error("[job]\nstpes = 3\n", "job.ini:2: [job] stpes: unknown key; did you mean 'steps'?",
               NULL);
  expect_error("[data]\nqqq = 3\n", "job.ini:2: [data] qqq: unknown key; [data] accepts source",
               NULL);
  expect_error("steps = 3\n", "job.ini:1: steps: key before any [section]", NULL);
}

static void test_duplicates(void **state) {
  (void)state;
  expect_error("[job]\nsteps = 3\nseed = 1\nsteps = 4\n",
               "job.ini:4: [job] steps: duplicate key (first set at line 2); keep one", NULL);
  expect_error("[job]\nsteps = 3\n[mesh]\n[job]\n",
               "job.ini:4: [job]: section appears twice (first at line 1)", NULL);
  expect_error("[plugins]\nload = a\n[strategy.a]\nk = 1\nk = 2\n",
               "job.ini:5: [strategy.a] k: duplicate key (first set at line 4)", NULL);
}

static void test_bad_values(void **state) {
  (void)state;
  expect_error("[job]\nsteps = abc\n", "job.ini:2: [job] steps: 'abc' is not an integer", NULL);
  expect_error("[job]\nsteps = 0\n", "job.ini:2: [job] steps: 0 is out of range", NULL);
  expect_error("[job]\nsteps = 3x\n", "[job] steps: '3x' is not an integer", NULL);
  expect_error("[job]\nbackend = gloo\n",
               "job.ini:2: [job] backend: 'gloo' is not one of local | mpi | nccl", NULL);
  expect_error("[job]\ntimeout_s = -1\n", "[job] timeout_s: -1 is out of range", NULL);
  expect_error("[job]\ntimeout_s = nan\n", "[job] timeout_s: 'nan' is not a number", NULL);
  expect_error("[model]\ntie_word_embeddings = yes\n", "'yes' is not true or false", NULL);
  expect_error("[mesh]\ndims = dp, 2x\nshape = 1, 1\n", "[mesh] dims: item 2 '2x' is bad", NULL);
  expect_error("[mesh]\ndims = dp\nshape = 0\n", "[mesh] shape: item 1 '0' is bad", NULL);
  expect_error("[data]\nsource = hdfs:x\n", "[data] source: 'hdfs:x' is not synthetic", NULL);
  expect_error("[data]\nsource = text:\n", "[data] source: 'text:' is not synthetic", NULL);
}

static void test_mesh_checks(void **state) {
  (void)state;
  expect_error("[mesh]\ndims = dp, tp\nshape = 2, 2, 2\n",
               "job.ini:3: [mesh] shape: 3 entries but dims (line 2) has 2; give one size per dim",
               NULL);
  expect_error("[job]\nworld_size = 8\n[mesh]\ndims = dp, tp\nshape = 2, 2\n",
               "job.ini:5: [mesh] shape: product 4 differs from [job] world_size = 8 (line 2)",
               NULL);
  expect_error("[mesh]\ndims = tp, tp\nshape = 1, 1\n", "[mesh] dims: 'tp' appears twice", NULL);
  expect_error("[mesh]\ndims =\nshape =\n", "[mesh] dims: empty", NULL);
  expect_error("[mesh]\ndims = a,b,c,d,e,f,g,h,i\nshape = 1,1,1,1,1,1,1,1,1\n",
               "[mesh] dims: more than 8 entries", NULL);
}

static void test_plugin_lists(void **state) {
  (void)state;
  expect_error("[plugins]\nload = tp, dp, tp\n",
               "job.ini:2: [plugins] load: 'tp' is listed twice; list each plugin once", NULL);
  expect_error("[plugins]\nload = tp\n[strategy.pp]\nschedule = 1f1b\n",
               "job.ini:3: [strategy.pp]: plugin 'pp' is not in [plugins] load (line 2)", NULL);
}

static void test_model_checks(void **state) {
  (void)state;
  expect_error("[model]\nhidden_size = 60\nnum_attention_heads = 8\n",
               "job.ini:3: [model] num_attention_heads: 8 does not divide hidden_size 60", NULL);
  expect_error("[model]\nnum_attention_heads = 8\nnum_key_value_heads = 3\n",
               "job.ini:3: [model] num_key_value_heads: 3 does not divide", NULL);
}

static void test_syntax(void **state) {
  (void)state;
  expect_error("[job]\nsteps = 3\n  seed = 4\n",
               "job.ini:3: [job] steps: indented line is read as a continuation of 'steps'", NULL);
  expect_error("[job]\nthis line has no equals sign\n", "job.ini:2: syntax error", NULL);
  char longline[400];
  memset(longline, 'x', sizeof longline);
  memcpy(longline, "[job]\nsteps = ", 14);
  longline[sizeof longline - 2] = '\n';
  longline[sizeof longline - 1] = '\0';
  /* longer than the system inih's 200-byte line buffer: read whole, and the value checked */
  expect_error(longline, "job.ini:2: [job] steps: value is longer than 255 characters", NULL);
  static char huge[5000];
  memset(huge, 'x', sizeof huge);
  memcpy(huge, "[job]\nsteps = ", 14);
  huge[sizeof huge - 2] = '\n';
  huge[sizeof huge - 1] = '\0';
  expect_error(huge, "job.ini:2: line is longer than 4094 characters", NULL);
}

/* A value of up to 255 characters is accepted however long its line, inline comment and blanks
 * dropped as on a short line; so is a long comment. */
static void test_long_lines(void **state) {
  (void)state;
  char text[1024], value[256];
  memset(value, 'm', 250);
  memcpy(value, "/tmp/", 5);
  value[250] = '\0';
  char comment[400];
  memset(comment, 'c', sizeof comment - 1);
  comment[sizeof comment - 1] = '\0';
  snprintf(text, sizeof text, "[job]\n; %s\nsteps = 3\n[output]\nmetrics =   %s   ; why\n", comment,
           value);
  tsr_config *cfg = NULL;
  if (tsr_config_parse_string(text, "job.ini", &cfg) != TSR_OK) fail_msg("%s", tsr_last_error());
  assert_int_equal(cfg->job.steps, 3);
  assert_string_equal(tsr_config_ext_of(cfg)->output.metrics, value);
  tsr_config_free(cfg);
}

static void test_many_errors_each_reported(void **state) {
  (void)state;
  expect_error("[job]\nsteps = 0\nmode = learn\n[mesh]\ndims = dp\nshape = 1, 2\n",
               "job.ini:2: [job] steps", "\njob.ini:3: [job] mode: 'learn' is not one of",
               "\njob.ini:6: [mesh] shape: 2 entries", NULL);
}

static void test_load_file(void **state) {
  (void)state;
  tsr_config *cfg = NULL;
  assert_int_equal(tsr_config_load("/nonexistent/dir/job.ini", &cfg), TSR_EIO);
  assert_non_null(strstr(tsr_last_error(), "/nonexistent/dir/job.ini: cannot open job file"));

  char path[] = "/tmp/tsr_test_config_XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  fputs("[job]\n\n\nsteps = 5\nbogus = 1\n", f);
  fclose(f);
  assert_int_equal(tsr_config_load(path, &cfg), TSR_EINVAL);
  char want[128];
  snprintf(want, sizeof want, "%s:5: [job] bogus: unknown key", path);
  assert_non_null(strstr(tsr_last_error(), want));
  remove(path);
}

static const tsr_key_spec plugin_keys[] = {
    {"schedule", TSR_KEY_ENUM, "1f1b", 0, 0, "gpipe|1f1b", "pipeline schedule"},
    {"microbatches", TSR_KEY_INT, NULL, 1, 64, NULL, "microbatches per step"},
    {"overlap", TSR_KEY_BOOL, "false", 0, 0, NULL, "overlap"},
    {NULL, 0, NULL, 0, 0, NULL, NULL},
};

static void test_plugin_section(void **state) {
  (void)state;
  tsr_config *cfg = parse_ok("[plugins]\nload = pp\n[strategy.pp]\nmicrobatches = 4\n");
  assert_int_equal(tsr_config_check_section(cfg, "pp", plugin_keys, "/x/libtessera-pp.so"), TSR_OK);
  int64_t mb = 0;
  assert_int_equal(tsr_config_get_int(cfg, "pp", plugin_keys, "microbatches", &mb), TSR_OK);
  assert_int_equal(mb, 4);
  assert_string_equal(tsr_config_get(cfg, "pp", plugin_keys, "schedule"), "1f1b");
  bool overlap = true;
  assert_int_equal(tsr_config_get_bool(cfg, "pp", plugin_keys, "overlap", &overlap), TSR_OK);
  assert_false(overlap);
  assert_int_equal(tsr_config_get_int(cfg, "pp", plugin_keys, "undeclared", &mb), TSR_EINVAL);
  tsr_config_free(cfg);

  cfg = parse_ok("[plugins]\nload = pp\n[strategy.pp]\nmicrobatches = 4\nschedul = gpipe\n");
  assert_int_equal(tsr_config_check_section(cfg, "pp", plugin_keys, "/x/libtessera-pp.so"),
                   TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "job.ini:5: [strategy.pp] schedul: unknown key for "
                                           "plugin pp (/x/libtessera-pp.so); did you mean "
                                           "'schedule'?"));
  tsr_config_free(cfg);

  cfg = parse_ok("[plugins]\nload = pp\n[strategy.pp]\nmicrobatches = 99\n");
  assert_int_equal(tsr_config_check_section(cfg, "pp", plugin_keys, "p.so"), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "job.ini:4: [strategy.pp] microbatches: 99 is out of "
                                           "range"));
  tsr_config_free(cfg);

  cfg = parse_ok("[plugins]\nload = pp\n");
  assert_int_equal(tsr_config_check_section(cfg, "pp", plugin_keys, "p.so"), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "job.ini:2: [plugins] load: plugin pp (p.so) requires "
                                           "key 'microbatches'"));
  tsr_config_free(cfg);

  cfg = parse_ok("[plugins]\nload = pp\n[strategy.pp]\nmicrobatches = 2\n");
  assert_int_equal(tsr_config_error(cfg, TSR_EINVAL, "strategy.pp", "microbatches", "needs %d", 4),
                   TSR_EINVAL);
  assert_string_equal(tsr_last_error(), "job.ini:4: [strategy.pp] microbatches: needs 4");
  tsr_config_free(cfg);
}

static void test_schema_defaults_are_valid(void **state) {
  (void)state;
  int n = tsr_config_schema_count();
  assert_true(n > 30);
  for (int i = 0; i < n; i++) {
    const tsr_config_key *k = tsr_config_schema_at(i);
    assert_non_null(k->spec.doc);
    if (k->spec.default_value && tsr_key_check(&k->spec, k->spec.default_value) != TSR_OK)
      fail_msg("[%s] %s: default '%s' fails its own check: %s", k->section, k->spec.name,
               k->spec.default_value, tsr_last_error());
  }
  assert_null(tsr_config_schema_at(n));
}

/* docs/ini-reference.md must be exactly what the table generates. */
static void test_reference_doc_matches_schema(void **state) {
  (void)state;
  char *gen = NULL;
  size_t gen_len = 0;
  FILE *mem = open_memstream(&gen, &gen_len);
  assert_non_null(mem);
  assert_int_equal(tsr_config_write_reference(mem), TSR_OK);
  fclose(mem);

  FILE *f = fopen(TSR_TEST_SOURCE_DIR "/docs/ini-reference.md", "r");
  if (!f) fail_msg("cannot open docs/ini-reference.md; regenerate it with `tessera ini-reference`");
  char *doc = calloc(1, gen_len + 2);
  size_t doc_len = fread(doc, 1, gen_len + 1, f);
  fclose(f);
  if (doc_len != gen_len || memcmp(doc, gen, gen_len))
    fail_msg("docs/ini-reference.md differs from the schema table; regenerate it with "
             "`tessera ini-reference > docs/ini-reference.md`");
  for (int i = 0; i < tsr_config_schema_count(); i++) {
    char row[128];
    snprintf(row, sizeof row, "| `%s` |", tsr_config_schema_at(i)->spec.name);
    assert_non_null(strstr(doc, row));
  }
  free(doc);
  free(gen);
}

static void test_closest_name(void **state) {
  (void)state;
  static const char *const names[] = {"steps", "seed", "mode"};
  assert_string_equal(tsr_closest_name("stpes", names, 3), "steps");
  assert_string_equal(tsr_closest_name("SEED", names, 3), "seed");
  assert_null(tsr_closest_name("x", names, 3));
  assert_null(tsr_closest_name("completely_else", names, 3));
}

/* What plugins read instead of the struct's fields. */
static void test_mesh_accessors(void **state) {
  (void)state;
  tsr_config *cfg = parse_ok("[mesh]\ndims = dp, ulysses_cp, tp\nshape = 2, 3, 1\n"
                             "[plugins]\nload = dp, tp\n[model]\nnum_attention_heads = 6\n"
                             "hidden_size = 48\n");
  assert_int_equal(tsr_config_mesh_ndim(cfg), 3);
  assert_string_equal(tsr_config_mesh_dim(cfg, 0), "dp");
  assert_string_equal(tsr_config_mesh_dim(cfg, 1), "ulysses_cp");
  assert_null(tsr_config_mesh_dim(cfg, 3));
  assert_null(tsr_config_mesh_dim(cfg, -1));
  assert_int_equal(tsr_config_mesh_size(cfg, "dp"), 2);
  assert_int_equal(tsr_config_mesh_size(cfg, "ulysses_cp"), 3);
  assert_int_equal(tsr_config_mesh_index(cfg, "ulysses_cp"), 1);
  assert_int_equal(tsr_config_mesh_size(cfg, "tp"), 1);
  /* a dim the job leaves out is a dim of size 1 */
  assert_int_equal(tsr_config_mesh_size(cfg, "pp"), 1);
  assert_int_equal(tsr_config_mesh_index(cfg, "pp"), -1);
  assert_int_equal(tsr_config_mesh_world(cfg), 6);
  assert_true(tsr_config_loads_plugin(cfg, "tp"));
  assert_false(tsr_config_loads_plugin(cfg, "pp"));
  /* between an override and tsr_config_check_sets dims and shape may differ in length: the dim
   * without a size reads as absent, not as whatever follows the sizes */
  assert_int_equal(tsr_config_set(cfg, "mesh.dims=dp, tp, pp, ring_cp"), TSR_OK);
  assert_int_equal(tsr_config_mesh_ndim(cfg), 4);
  assert_int_equal(tsr_config_mesh_size(cfg, "ring_cp"), 1);
  assert_int_equal(tsr_config_mesh_index(cfg, "ring_cp"), 3);
  tsr_config_free(cfg);
}

static void test_key_accessors(void **state) {
  (void)state;
  tsr_config *cfg = parse_ok("[job]\ndevice = emu\nbackend = mpi\n[model]\n"
                             "num_attention_heads = 6\nhidden_size = 48\n"
                             "tie_word_embeddings = true\n[data]\nseq_len = 40\n"
                             "[optimizer]\nlr = 0.25\ngrad_accum_steps = 2\n"
                             "[mesh]\ndims = dp, tp\nshape = 2, 4\n");
  int64_t v = 0;
  assert_int_equal(tsr_config_key_int(cfg, "model", "num_attention_heads", &v), TSR_OK);
  assert_int_equal(v, 6);
  /* the default, and the kv heads resolved to the heads at parse time */
  assert_int_equal(tsr_config_key_int(cfg, "model", "num_key_value_heads", &v), TSR_OK);
  assert_int_equal(v, 6);
  assert_int_equal(tsr_config_key_int(cfg, "model", "num_hidden_layers", &v), TSR_OK);
  assert_int_equal(v, 4);
  assert_int_equal(tsr_config_key_int(cfg, "data", "seq_len", &v), TSR_OK);
  assert_int_equal(v, 40);
  assert_int_equal(tsr_config_key_int(cfg, "optimizer", "grad_accum_steps", &v), TSR_OK);
  assert_int_equal(v, 2);
  /* an enum reads as its value */
  assert_int_equal(tsr_config_key_int(cfg, "job", "device", &v), TSR_OK);
  assert_int_equal(v, TSR_DEVICE_EMU);
  double d = 0;
  assert_int_equal(tsr_config_key_float(cfg, "optimizer", "lr", &d), TSR_OK);
  assert_true(d == 0.25);
  assert_int_equal(tsr_config_key_float(cfg, "data", "seq_len", &d), TSR_OK);
  assert_true(d == 40.0);
  bool b = false;
  assert_int_equal(tsr_config_key_bool(cfg, "model", "tie_word_embeddings", &b), TSR_OK);
  assert_true(b);

  char buf[64];
  assert_int_equal(tsr_config_key_string(cfg, "job", "device", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "emu");
  assert_int_equal(tsr_config_key_string(cfg, "job", "backend", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "mpi");
  assert_int_equal(tsr_config_key_string(cfg, "mesh", "dims", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "dp, tp");
  assert_int_equal(tsr_config_key_string(cfg, "mesh", "shape", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "2, 4");
  assert_int_equal(tsr_config_key_string(cfg, "model", "hidden_size", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "48");
  assert_int_equal(tsr_config_key_string(cfg, "optimizer", "lr", buf, sizeof buf), TSR_OK);
  assert_true(strtod(buf, NULL) == 0.25);
  assert_int_equal(tsr_config_key_string(cfg, "model", "tie_word_embeddings", buf, sizeof buf),
                   TSR_OK);
  assert_string_equal(buf, "true");
  assert_int_equal(tsr_config_key_string(cfg, "checkpoint", "load", buf, sizeof buf), TSR_OK);
  assert_string_equal(buf, "");
  assert_int_equal(tsr_config_key_string(cfg, "mesh", "dims", buf, 6), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "does not fit in 6 bytes"));

  /* wrong names and wrong types say what to do instead */
  assert_int_equal(tsr_config_key_int(cfg, "model", "num_heads", &v), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "[model] has no key 'num_heads'"));
  assert_int_equal(tsr_config_key_int(cfg, "model", "num_hiden_layers", &v), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "did you mean 'num_hidden_layers'?"));
  assert_int_equal(tsr_config_key_int(cfg, "modle", "hidden_size", &v), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "[modle] is not a core section"));
  assert_int_equal(tsr_config_key_int(cfg, "strategy.tp", "x", &v), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "tsr_config_get_int"));
  assert_int_equal(tsr_config_key_int(cfg, "optimizer", "lr", &v), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "use tsr_config_key_float"));
  assert_int_equal(tsr_config_key_bool(cfg, "data", "seq_len", &b), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "use tsr_config_key_int"));
  assert_int_equal(tsr_config_key_float(cfg, "job", "backend", &d), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "use tsr_config_key_string"));
  tsr_config_free(cfg);
}

/* Keys added since ABI 1.0 live after the frozen struct (tsr_config_ext_of); they parse, take
 * their defaults, take --set and read by name like any core key. */
static void test_ext_keys(void **state) {
  (void)state;
  tsr_config *cfg = parse_ok("[job]\nsteps = 3\n");
  const tsr_config_ext *x = tsr_config_ext_of(cfg);
  assert_string_equal(x->eval.source, "");
  assert_int_equal(x->eval.every, 0);
  assert_int_equal(x->eval.batches, 1);
  tsr_config_free(cfg);
  cfg = parse_ok("[job]\nsteps = 3\n[eval]\nsource = text:held.txt\nevery = 50\nbatches = 4\n");
  x = tsr_config_ext_of(cfg);
  assert_string_equal(x->eval.source, "text:held.txt");
  assert_int_equal(x->eval.every, 50);
  assert_int_equal(x->eval.batches, 4);
  assert_int_equal(tsr_config_line(cfg, "eval", "every"), 5);
  int64_t v = 0;
  assert_int_equal(tsr_config_key_int(cfg, "eval", "batches", &v), TSR_OK);
  assert_int_equal(v, 4);
  assert_int_equal(tsr_config_set(cfg, "eval.batches=7"), TSR_OK);
  assert_int_equal(x->eval.batches, 7);
  /* the frozen part is untouched */
  assert_int_equal(cfg->job.steps, 3);
  tsr_config_free(cfg);
  expect_error("[eval]\nevery = -1\n", "[eval] every", "out of range", NULL);
  expect_error("[eval]\nbatches = 0\n", "[eval] batches", "out of range", NULL);
  expect_error("[eval]\nsorce = synthetic\n", "did you mean 'source'", NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_defaults),
      cmocka_unit_test(test_values_and_lines),
      cmocka_unit_test(test_unknown_section_and_key),
      cmocka_unit_test(test_duplicates),
      cmocka_unit_test(test_bad_values),
      cmocka_unit_test(test_mesh_checks),
      cmocka_unit_test(test_plugin_lists),
      cmocka_unit_test(test_model_checks),
      cmocka_unit_test(test_syntax),
      cmocka_unit_test(test_long_lines),
      cmocka_unit_test(test_many_errors_each_reported),
      cmocka_unit_test(test_load_file),
      cmocka_unit_test(test_plugin_section),
      cmocka_unit_test(test_schema_defaults_are_valid),
      cmocka_unit_test(test_reference_doc_matches_schema),
      cmocka_unit_test(test_closest_name),
      cmocka_unit_test(test_mesh_accessors),
      cmocka_unit_test(test_key_accessors),
      cmocka_unit_test(test_ext_keys),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
