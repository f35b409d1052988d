/* Plugin loader: each check against a fixture that fails it, the lifecycle order, and the mirror
 * plugin end to end. Fixtures are built by tests/plugins/CMakeLists.txt. */
#define _DEFAULT_SOURCE /* mkdtemp, realpath, symlink */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tessera/plugin.h"
#include "tessera/tessera.h"

#ifndef TSR_TEST_FIXTURE_DIR
#error "TSR_TEST_FIXTURE_DIR must point at the fixture plugins (tests/plugins/CMakeLists.txt)"
#endif

static void assert_contains(const char *msg, const char *want) {
  if (!strstr(msg, want)) fail_msg("message\n  %s\nlacks\n  %s", msg, want);
}

static void probe_fails(const char *name, tsr_plugin_check check, const char *want) {
  char path[TSR_MAX_PATH];
  snprintf(path, sizeof path, "%s/libtessera-%s.so", TSR_TEST_FIXTURE_DIR, name);
  tsr_plugin_report rep;
  assert_int_equal(tsr_plugin_probe(path, NULL, &rep), TSR_EPLUGIN);
  if (rep.failed != check)
    fail_msg("%s failed check '%s', expected '%s': %s", name, tsr_plugin_check_name(rep.failed),
             tsr_plugin_check_name(check), rep.message);
  assert_int_equal(rep.status, TSR_EPLUGIN);
  assert_contains(rep.message, want);
  /* Every message names the plugin, the file and the core's ABI. */
  char head[128];
  snprintf(head, sizeof head, "%s: ", name);
  assert_true(strncmp(rep.message, head, strlen(head)) == 0);
  assert_contains(rep.message, path);
  assert_contains(rep.message, "core ABI " TSR_ABI_VERSION_STRING);
  assert_string_equal(tsr_last_error(), rep.message);
}

static void test_probe_checks(void **state) {
  (void)state;
  probe_fails("fix_garbage", TSR_CHECK_OPEN, "dlopen failed");
  probe_fails("fix_unresolved", TSR_CHECK_OPEN, "tsr_fixture_symbol_nobody_defines");
  probe_fails("fix_nosymbol", TSR_CHECK_SYMBOL, "no symbol tsr_plugin_v1");
  char major[96]; /* fix_major is built with abi_major 2 and this tree's minor */
  snprintf(major, sizeof major, "incompatible ABI (plugin ABI 2.%d, core ABI %s)", TSR_ABI_MINOR,
           TSR_ABI_VERSION_STRING);
  probe_fails("fix_major", TSR_CHECK_MAJOR, major);
  probe_fails("fix_size", TSR_CHECK_SIZE, "struct_size 16 is smaller than");
  probe_fails("fix_reserved", TSR_CHECK_RESERVED, "reserved[3] is set");
  probe_fails("fix_name", TSR_CHECK_NAME, "descriptor name 'someone_else' does not match");
  probe_fails("fix_noinit", TSR_CHECK_CALLBACKS, "mandatory field 'init' is NULL");

  tsr_plugin_report rep;
  assert_int_equal(tsr_plugin_probe("/nonexistent/libtessera-x.so", NULL, &rep), TSR_EPLUGIN);
  assert_int_equal(rep.failed, TSR_CHECK_OPEN);
  assert_contains(rep.message, "x: cannot open the file");
  assert_contains(rep.message, "plugin ABI unknown, core ABI " TSR_ABI_VERSION_STRING);

  char path[TSR_MAX_PATH];
  snprintf(path, sizeof path, "%s/libtessera-fix_keys.so", TSR_TEST_FIXTURE_DIR);
  assert_int_equal(tsr_plugin_probe(path, NULL, &rep), TSR_OK);
  assert_int_equal(rep.failed, TSR_CHECK_PASSED);
  assert_string_equal(rep.name, "fix_keys");
  assert_string_equal(rep.version, "0.0.1");
  assert_string_equal(rep.dims, "fk");
  assert_int_equal(rep.abi_major, 1);
  assert_contains(rep.keys, "level (an integer in [1, 3]; required)");
  /* The job may ask for it only by its own name. */
  assert_int_equal(tsr_plugin_probe(path, "other", &rep), TSR_EPLUGIN);
  assert_int_equal(rep.failed, TSR_CHECK_NAME);
}

/* Loads the plugins of a job given as text. Returns the status; *set_out may be NULL. */
static tsr_status load_job(const char *text, tsr_plugin_set_t **set_out, tsr_registry_t **reg_out) {
  tsr_config *cfg = NULL;
  tsr_status st = tsr_config_parse_string(text, "job.ini", &cfg);
  if (st != TSR_OK) fail_msg("job does not parse: %s", tsr_last_error());
  tsr_registry_t *reg = NULL;
  assert_int_equal(tsr_registry_new(&reg), TSR_OK);
  tsr_plugin_set_t *set = NULL;
  st = tsr_plugin_set_load(cfg, reg, &set);
  assert_non_null(set);
  if (set_out)
    *set_out = set;
  else
    tsr_plugin_set_free(set);
  if (reg_out)
    *reg_out = reg;
  else
    tsr_registry_free(reg);
  tsr_config_free(cfg);
  return st;
}

static void load_fails(const char *text, tsr_status status, const char *want) {
  tsr_status st = load_job(text, NULL, NULL);
  if (st != status)
    fail_msg("status %s, expected %s: %s", tsr_status_name(st), tsr_status_name(status),
             tsr_last_error());
  assert_contains(tsr_last_error(), want);
}

static void test_set_checks(void **state) {
  (void)state;
  load_fails("[plugins]\nload = fix_nope\n", TSR_EPLUGIN,
             "job.ini:2: [plugins] load: fix_nope: no libtessera-fix_nope.so in the search path");
  load_fails("[mesh]\ndims = fa\nshape = 2\n[plugins]\nload = fix_ok_a, fix_twin\n", TSR_EPLUGIN,
             "fix_twin: mesh dim 'fa' is already owned by plugin 'fix_ok_a'");
  load_fails("[plugins]\nload = fix_requires\n", TSR_EPLUGIN,
             "fix_requires: requires strategy 'fix_ok_b', which [plugins] load (job.ini:2) does "
             "not list");
  load_fails("[mesh]\ndims = fa, zz\nshape = 1, 2\n[plugins]\nload = fix_ok_a\n", TSR_EINVAL,
             "job.ini:2: [mesh] dims: dim 'zz' has size 2 but no loaded plugin owns it (loaded: "
             "fix_ok_a)");
  load_fails("[mesh]\ndims = dp, tp\nshape = 2, 1\n", TSR_EINVAL,
             "dim 'dp' has size 2 but no loaded plugin owns it (loaded: none)");
  load_fails("[plugins]\nload = fix_keys\n", TSR_EINVAL,
             "job.ini:2: [plugins] load: plugin fix_keys");
  load_fails("[plugins]\nload = fix_keys\n[strategy.fix_keys]\nlevel = 9\n", TSR_EINVAL,
             "job.ini:4: [strategy.fix_keys] level: 9 is out of range");
  load_fails("[plugins]\nload = fix_keys\n[strategy.fix_keys]\nlevle = 2\n", TSR_EINVAL,
             "did you mean 'level'?");
  load_fails("[plugins]\nload = fix_keys\n[strategy.fix_keys]\nlevel = 2\nstyle = odd\n",
             TSR_EINVAL, "job.ini:5: [strategy.fix_keys] style: 'odd' is not one of plain | fancy");
  /* Every broken file is reported, not just the first. */
  tsr_plugin_set_t *set = NULL;
  assert_int_equal(load_job("[plugins]\nload = fix_major, fix_ok_a, fix_size\n", &set, NULL),
                   TSR_EPLUGIN);
  assert_contains(tsr_last_error(), "job.ini:2: [plugins] load: fix_major: incompatible ABI");
  assert_contains(tsr_last_error(), "\njob.ini:2: [plugins] load: fix_size: struct_size");
  assert_int_equal(tsr_plugin_set_count(set), 3);
  assert_int_equal(tsr_plugin_set_report(set, 0)->failed, TSR_CHECK_MAJOR);
  assert_int_equal(tsr_plugin_set_report(set, 1)->status, TSR_OK);
  assert_int_equal(tsr_plugin_set_report(set, 2)->failed, TSR_CHECK_SIZE);
  assert_null(tsr_plugin_set_strategy(set, 1)); /* nothing stays loaded after a failure */
  tsr_plugin_set_free(set);
}

static char log_path[64];

static char *read_log(void) {
  FILE *f = fopen(log_path, "r");
  static char buf[1024];
  buf[0] = '\0';
  if (!f) return buf;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose(f);
  remove(log_path);
  return buf;
}

static void test_lifecycle_order(void **state) {
  (void)state;
  snprintf(log_path, sizeof log_path, "/tmp/tsr_test_loader_%d.log", (int)getpid());
  remove(log_path);
  setenv("TESSERA_TEST_LOG", log_path, 1);

  load_fails("[plugins]\nload = fix_ok_a, fix_ok_b, fix_initfail\n", TSR_EPLUGIN,
             "fix_initfail: init failed: fixture fix_initfail refuses to start (no device of kind "
             "'imaginary'; none is built) (plugin ABI ");
  assert_contains(tsr_last_error(), "libtessera-fix_initfail.so; use another device");
  assert_string_equal(read_log(), "init fix_ok_a\nregister fix_ok_a\ninit fix_ok_b\n"
                                  "register fix_ok_b\ninit fix_initfail\n"
                                  "fini fix_ok_b\nfini fix_ok_a\n");

  tsr_plugin_set_t *set = NULL;
  assert_int_equal(load_job("[mesh]\ndims = fa, fb\nshape = 2, 3\n[plugins]\n"
                            "load = fix_ok_a, fix_ok_b\n",
                            &set, NULL),
                   TSR_OK);
  assert_string_equal(tsr_plugin_set_owner(set, "fa"), "fix_ok_a");
  assert_string_equal(tsr_plugin_set_owner(set, "fb"), "fix_ok_b");
  assert_null(tsr_plugin_set_owner(set, "tp"));
  assert_non_null(tsr_plugin_set_strategy(set, 0));
  assert_string_equal(tsr_plugin_set_report(set, 1)->message, "");
  tsr_plugin_set_free(set);
  assert_string_equal(read_log(), "init fix_ok_a\nregister fix_ok_a\ninit fix_ok_b\n"
                                  "register fix_ok_b\nfini fix_ok_b\nfini fix_ok_a\n");
  unsetenv("TESSERA_TEST_LOG");
}

static void test_search_and_discover(void **state) {
  (void)state;
  char dirs[8][TSR_MAX_PATH];
  int n = tsr_plugin_search_dirs("rel/dir, /abs/dir", "/job/base", dirs, 8);
  assert_true(n >= 3);
  assert_string_equal(dirs[0], TSR_TEST_FIXTURE_DIR); /* TESSERA_PLUGIN_PATH first */
  assert_string_equal(dirs[1], "/job/base/rel/dir");
  assert_string_equal(dirs[2], "/abs/dir");
  assert_string_equal(dirs[n - 1], TSR_TEST_PLUGIN_DIR);      /* the build tree last */
  for (int i = 0; i < n; i++) assert_true(dirs[i][0] == '/'); /* never the current directory */

  tsr_plugin_report *reps = NULL;
  int count = 0;
  assert_int_equal(tsr_plugin_discover(NULL, NULL, &reps, &count), TSR_OK);
  int ok = 0, bad = 0;
  bool mirror = false;
  for (int i = 0; i < count; i++) {
    if (reps[i].status == TSR_OK)
      ok++;
    else
      bad++;
    if (!strcmp(reps[i].name, "mirror")) mirror = reps[i].status == TSR_OK;
    if (!strcmp(reps[i].name, "fix_major")) assert_int_equal(reps[i].failed, TSR_CHECK_MAJOR);
  }
  assert_true(mirror);
  /* garbage, unresolved, nosymbol, major, size, reserved, name, noinit */
  assert_int_equal(bad, 8);
  assert_true(ok >= 7);
  free(reps);
}

typedef struct hook_case {
  const tsr_registry_t *reg;
  const tsr_mesh_t *mesh;
  bool differ; /* rank 1 holds a different value */
} hook_case;

static tsr_status hook_rank(tsr_comm_t *comm, void *arg) {
  const hook_case *hc = arg;
  tsr_rank_t *r = NULL;
  tsr_status st = TSR_OK;
  tsr_tensor *t = NULL;
  TSR_CHECK_GOTO(tsr_rank_new(comm, hc->reg, &r), st);
  int64_t shape[1] = {5};
  TSR_CHECK_GOTO(tsr_tensor_new(NULL, TSR_F32, 1, shape, &t), st);
  tsr_tensor_fill_arange(t, 1.0, hc->differ && tsr_rank_id(r) == 1 ? 0.5 : 0.0);
  tsr_dtensor p = {.mesh = hc->mesh, .ndim = 1, .shape = {5}, .dtype = TSR_F32, .local = t};
  p.placements[0] = tsr_replicate();
  tsr_dtensor *params[1] = {&p};
  const char *names[1] = {"model.norm.weight"};
  tsr_optim_step step = {1, 1e-3, hc->mesh, 1, names, params, params};
  st = tsr_registry_run_optim_hooks(hc->reg, r, TSR_HOOK_AFTER_STEP, &step);
cleanup:
  tsr_tensor_free(t);
  tsr_rank_free(r);
  return st;
}

static void test_mirror_plugin(void **state) {
  (void)state;
  load_fails("[job]\nsteps = 2\n[mesh]\ndims = mirror\nshape = 2\n[plugins]\nload = mirror\n"
             "[strategy.mirror]\ncheck_every = 5\n",
             TSR_EINVAL,
             "job.ini:9: [strategy.mirror] check_every: 5 is more than [job] steps = 2");

  tsr_plugin_set_t *set = NULL;
  tsr_registry_t *reg = NULL;
  assert_int_equal(
      load_job("[mesh]\ndims = mirror\nshape = 2\n[plugins]\nload = mirror\n", &set, &reg), TSR_OK);
  assert_int_equal(tsr_registry_module_style_count(reg), 4);
  assert_int_equal(tsr_registry_optim_hook_count(reg), 1);
  const tsr_module_style *s = tsr_registry_find_module_style(reg, "column_linear", "mirror");
  assert_non_null(s);
  assert_string_equal(s->owner, "mirror");
  assert_int_equal(tsr_module_style_param(s, "weight").kind, TSR_REPLICATE);

  const char *names[1] = {"mirror"};
  int shape[1] = {2};
  tsr_mesh_t *mesh = NULL;
  assert_int_equal(tsr_mesh_init(2, 1, shape, names, &mesh), TSR_OK);
  hook_case hc = {reg, mesh, false};
  assert_int_equal(tsr_local_launch(2, 10.0, hook_rank, &hc), TSR_OK);
  hc.differ = true;
  assert_int_equal(tsr_local_launch(2, 10.0, hook_rank, &hc), TSR_EINTERNAL);
  assert_contains(tsr_last_error(), "optimizer hook mirror.check");
  assert_contains(tsr_last_error(),
                  "parameter model.norm.weight on rank 1 differs from its replica");
  tsr_mesh_free(mesh);
  tsr_registry_free(reg);
  tsr_plugin_set_free(set);
}

/* Copies fixture `name` into `dir` with mode 0755. */
static void copy_fixture(const char *name, const char *dir, char *dst, size_t len) {
  char src[TSR_MAX_PATH + 64];
  snprintf(src, sizeof src, "%s/libtessera-%s.so", TSR_TEST_FIXTURE_DIR, name);
  snprintf(dst, len, "%s/libtessera-%s.so", dir, name);
  FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
  assert_non_null(in);
  assert_non_null(out);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, in)) > 0) assert_int_equal(fwrite(buf, 1, n, out), n);
  fclose(in);
  fclose(out);
  assert_int_equal(chmod(dst, 0755), 0);
}

static void probe_refused(const char *path, const char *want) {
  tsr_plugin_report rep;
  assert_int_equal(tsr_plugin_probe(path, NULL, &rep), TSR_EPLUGIN);
  assert_int_equal(rep.failed, TSR_CHECK_OPEN);
  assert_contains(rep.message, want);
  assert_contains(rep.message, "TESSERA_ALLOW_INSECURE_PLUGINS=1 to load it anyway");
}

/* A plugin file, or its directory, that another user could change is refused unless
 * TESSERA_ALLOW_INSECURE_PLUGINS=1; a sticky directory writable by all is fine. */
static void test_insecure_plugins(void **state) {
  (void)state;
  char tmpl[] = "/tmp/tsr_trust_XXXXXX", so[TSR_MAX_PATH + 64], want[TSR_MAX_PATH + 160];
  assert_non_null(mkdtemp(tmpl));
  char *dir = realpath(tmpl, NULL); /* the loader names the resolved path */
  assert_non_null(dir);
  assert_true(strlen(dir) < 256);
  assert_int_equal(chmod(dir, 0755), 0);
  copy_fixture("fix_ok_a", dir, so, sizeof so);
  tsr_plugin_report rep;
  assert_int_equal(tsr_plugin_probe(so, NULL, &rep), TSR_OK);

  assert_int_equal(chmod(dir, 0757), 0);
  snprintf(want, sizeof want, "its directory %s is writable by every user (mode 0757)", dir);
  probe_refused(so, want);
  assert_contains(tsr_last_error(), "fix_ok_a: refused: ");
  assert_contains(tsr_last_error(), "; chmod o-w ");
  /* a job that names it fails to load, naming the line */
  const char *job = "[mesh]\ndims = fa\nshape = 2\n[plugins]\nload = fix_ok_a\n";
  setenv("TESSERA_PLUGIN_PATH", dir, 1);
  load_fails(job, TSR_EPLUGIN, "job.ini:5: [plugins] load: fix_ok_a: refused: its directory");
  setenv("TESSERA_ALLOW_INSECURE_PLUGINS", "1", 1);
  assert_int_equal(tsr_plugin_probe(so, NULL, &rep), TSR_OK);
  assert_int_equal(load_job(job, NULL, NULL), TSR_OK);
  setenv("TESSERA_ALLOW_INSECURE_PLUGINS", "yes", 1); /* only 1 opts out */
  probe_refused(so, want);
  unsetenv("TESSERA_ALLOW_INSECURE_PLUGINS");
  setenv("TESSERA_PLUGIN_PATH", TSR_TEST_FIXTURE_DIR, 1);

  assert_int_equal(chmod(dir, 01777), 0); /* sticky: only the owner replaces a file */
  assert_int_equal(tsr_plugin_probe(so, NULL, &rep), TSR_OK);
  assert_int_equal(chmod(dir, 0755), 0);
  assert_int_equal(chmod(so, 0757), 0);
  snprintf(want, sizeof want, "the file %s is writable by every user (mode 0757)", so);
  probe_refused(so, want);
  assert_int_equal(chmod(so, 0755), 0);

  /* a symlink is followed: the file it names is what loads */
  char link[TSR_MAX_PATH + 32];
  snprintf(link, sizeof link, "%s/libtessera-fix_link.so", dir);
  assert_int_equal(symlink(so, link), 0);
  assert_int_equal(chmod(so, 0757), 0);
  probe_refused(link, want);
  assert_int_equal(chmod(so, 0755), 0);
  unlink(link);

  if (geteuid() == 0) { /* only root may give a file away */
    assert_int_equal(chown(so, 65534, (gid_t)-1), 0);
    snprintf(want, sizeof want, "the file %s is owned by uid 65534, not by root or", so);
    probe_refused(so, want);
    assert_int_equal(chown(so, 0, (gid_t)-1), 0);
    assert_int_equal(chown(dir, 65534, (gid_t)-1), 0);
    snprintf(want, sizeof want, "its directory %s is owned by uid 65534", dir);
    probe_refused(so, want);
  }
  unlink(so);
  rmdir(dir);
  free(dir);
}

int main(void) {
  /* The fixtures live outside the default search path on purpose. */
  setenv("TESSERA_PLUGIN_PATH", TSR_TEST_FIXTURE_DIR, 1);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_probe_checks),    cmocka_unit_test(test_set_checks),
      cmocka_unit_test(test_lifecycle_order), cmocka_unit_test(test_search_and_discover),
      cmocka_unit_test(test_mirror_plugin),   cmocka_unit_test(test_insecure_plugins),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
