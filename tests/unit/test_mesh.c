/* Meshes: coordinates, groups, unbind, name checks, names as given, bad shapes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/mesh.h"

static const char *const five[] = {"dp", "tp", "pp", "ulysses_cp", "ring_cp"};

static void test_coords_round_trip(void **state) {
  int shape[3] = {2, 3, 4};
  const char *names[3] = {"dp", "tp", "pp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(24, 3, shape, names, &m), TSR_OK);
  int c[3];
  assert_true(tsr_mesh_coords(m, 17, c)); /* 17 = 1*12 + 1*4 + 1 */
  assert_int_equal(c[0], 1);
  assert_int_equal(c[1], 1);
  assert_int_equal(c[2], 1);
  for (int r = 0; r < 24; r++) {
    assert_true(tsr_mesh_coords(m, r, c));
    assert_int_equal(tsr_mesh_rank_at(m, c), r);
  }
  assert_false(tsr_mesh_coords(m, 24, c));
  assert_int_equal(tsr_mesh_size_of(m, "tp"), 3);
  assert_int_equal(tsr_mesh_size_of(m, "ring_cp"), 1); /* absent behaves as size 1 */
  tsr_mesh_free(m);
}

static void test_product_mismatch_prints_both(void **state) {
  int shape[2] = {2, 3};
  const char *names[2] = {"dp", "tp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(8, 2, shape, names, &m), TSR_EINVAL);
  const char *e = tsr_last_error();
  assert_non_null(strstr(e, "dp=2 x tp=3"));
  assert_non_null(strstr(e, "6 ranks"));
  assert_non_null(strstr(e, "world has 8"));
}

static void test_bad_names_and_sizes(void **state) {
  int shape[2] = {2, 2}, zero[2] = {2, 0};
  const char *dup[2] = {"tp", "tp"};
  const char *empty[2] = {"dp", ""}, *ok[2] = {"dp", "tp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(4, 2, shape, dup, &m), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "appears twice"));
  assert_int_equal(tsr_mesh_init(4, 2, shape, empty, &m), TSR_EINVAL);
  assert_non_null(strstr(tsr_last_error(), "empty name"));
  assert_int_equal(tsr_mesh_init(0, 2, zero, ok, &m), TSR_EINVAL);
}

/* The mesh knows no aliases: a dim's other spellings are its owning plugin's to declare and
 * the loader's to rename (test_plugin_loader), so a mesh holds names as given. */
static void test_names_as_given(void **state) {
  int shape[2] = {2, 2};
  const char *names[2] = {"dp", "ulysess_cp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(4, 2, shape, names, &m), TSR_OK);
  assert_string_equal(tsr_mesh_dim_name(m, 1), "ulysess_cp");
  assert_int_equal(tsr_mesh_find_dim(m, "ulysses_cp"), -1);
  assert_int_equal(tsr_mesh_find_dim(m, "ulysess_cp"), 1);
  tsr_mesh_free(m);
}

static void test_check_dim_names(void **state) {
  int shape[3] = {2, 1, 2};
  const char *names[3] = {"dp", "foo", "bar"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(4, 3, shape, names, &m), TSR_OK);
  const char *allowed[] = {"dp", "tp", "pp", "ulysses_cp", "ring_cp", NULL};
  /* "foo" has size 1 and is ignored; "bar" is reported with the allowed list. */
  assert_int_equal(tsr_mesh_check_dim_names(m, allowed), TSR_EINVAL);
  const char *e = tsr_last_error();
  assert_non_null(strstr(e, "'bar'"));
  assert_null(strstr(e, "'foo'"));
  assert_non_null(strstr(e, "dp, tp, pp, ulysses_cp, ring_cp"));
  tsr_mesh_free(m);
}

static void test_groups_single_and_flattened(void **state) {
  int shape[3] = {2, 3, 2};
  const char *names[3] = {"dp", "tp", "pp"};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(12, 3, shape, names, &m), TSR_OK);
  int ranks[12], n, self;
  /* rank 7 = (1, 0, 1): along tp -> (1, *, 1) = 7, 9, 11 */
  assert_int_equal(tsr_mesh_group_ranks(m, 7, 1u << 1, ranks, &n, &self), TSR_OK);
  assert_int_equal(n, 3);
  assert_int_equal(ranks[0], 7);
  assert_int_equal(ranks[1], 9);
  assert_int_equal(ranks[2], 11);
  assert_int_equal(self, 0);
  /* dp + pp flattened, row-major over (dp, pp) with tp fixed at 0: 0, 1, 6, 7 */
  assert_int_equal(tsr_mesh_group_ranks(m, 7, (1u << 0) | (1u << 2), ranks, &n, &self), TSR_OK);
  assert_int_equal(n, 4);
  int want[4] = {0, 1, 6, 7};
  for (int i = 0; i < 4; i++) assert_int_equal(ranks[i], want[i]);
  assert_int_equal(self, 3);
  /* Empty mask: just this rank. */
  assert_int_equal(tsr_mesh_group_ranks(m, 7, 0, ranks, &n, &self), TSR_OK);
  assert_int_equal(n, 1);
  assert_int_equal(ranks[0], 7);
  assert_int_equal(tsr_mesh_group_ranks(m, 7, 1u << 5, ranks, &n, &self), TSR_EINVAL);
  tsr_mesh_free(m);
}

static void test_unbind(void **state) {
  int shape[3] = {2, 2, 2};
  const char *names[3] = {"dp", "pp", "tp"};
  tsr_mesh_t *m, **stages;
  int n;
  assert_int_equal(tsr_mesh_init(8, 3, shape, names, &m), TSR_OK);
  assert_int_equal(tsr_mesh_unbind(m, "pp", &stages, &n), TSR_OK);
  assert_int_equal(n, 2);
  for (int s = 0; s < 2; s++) {
    assert_int_equal(tsr_mesh_ndim(stages[s]), 2);
    assert_string_equal(tsr_mesh_dim_name(stages[s], 0), "dp");
    assert_string_equal(tsr_mesh_dim_name(stages[s], 1), "tp");
    assert_string_equal(tsr_mesh_unbound_dim(stages[s]), "pp");
    /* stage s holds the ranks whose pp coordinate is s, in row-major order */
    int want0[4] = {0, 1, 4, 5}, want1[4] = {2, 3, 6, 7};
    const int *w = s ? want1 : want0;
    for (int i = 0; i < 4; i++) assert_int_equal(tsr_mesh_ranks(stages[s])[i], w[i]);
    int c[2];
    assert_true(tsr_mesh_coords(stages[s], w[3], c));
    assert_int_equal(c[0], 1);
    assert_int_equal(c[1], 1);
  }
  assert_true(tsr_mesh_same_shape(stages[0], stages[1]));
  assert_false(tsr_mesh_equal(stages[0], stages[1]));
  for (int s = 0; s < n; s++) tsr_mesh_free(stages[s]);
  free(stages);
  /* A mesh without the dim returns one copy of itself. */
  assert_int_equal(tsr_mesh_unbind(m, "ring_cp", &stages, &n), TSR_OK);
  assert_int_equal(n, 1);
  assert_true(tsr_mesh_equal(stages[0], m));
  tsr_mesh_free(stages[0]);
  free(stages);
  tsr_mesh_free(m);
}

static void test_five_dim_mesh_of_the_seed(void **state) {
  int shape[5] = {2, 2, 2, 2, 1};
  tsr_mesh_t *m;
  assert_int_equal(tsr_mesh_init(16, 5, shape, five, &m), TSR_OK);
  char buf[256];
  tsr_mesh_str(m, buf, sizeof buf);
  assert_string_equal(buf, "dp=2 x tp=2 x pp=2 x ulysses_cp=2 x ring_cp=1 over ranks [0..15]");
  tsr_mesh_free(m);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_coords_round_trip),
      cmocka_unit_test(test_product_mismatch_prints_both),
      cmocka_unit_test(test_bad_names_and_sizes),
      cmocka_unit_test(test_names_as_given),
      cmocka_unit_test(test_check_dim_names),
      cmocka_unit_test(test_groups_single_and_flattened),
      cmocka_unit_test(test_unbind),
      cmocka_unit_test(test_five_dim_mesh_of_the_seed),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
