/* Traces (tessera/trace.h): a thread records only while attached, keeps at most its capacity and
 * counts the rest, and the core adds a "comm" event for every call that moves data, with the
 * group's label and the bytes sent; a group of one, which moves nothing, adds none. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

#include "tessera/comm.h"
#include "tessera/trace.h"

static void test_capacity(void **state) {
  (void)state;
  tsr_trace *t = NULL;
  assert_int_equal(tsr_trace_new(0, &t), TSR_EINVAL);
  assert_int_equal(tsr_trace_new(3, &t), TSR_OK);
  assert_true(tsr_trace_clock() < 0);
  tsr_trace_add("step", "step", 5, 1, -1); /* not attached: nothing */
  assert_int_equal(tsr_trace_count(t), 0);
  tsr_trace_attach(t);
  for (int i = 0; i < 5; i++) {
    int64_t t0 = tsr_trace_clock();
    assert_true(t0 >= 0);
    tsr_trace_add("phase", "work", t0, i, 7);
  }
  tsr_trace_add("phase", "skipped", -1, 0, 0); /* a clock taken while detached */
  tsr_trace_attach(NULL);
  assert_int_equal(tsr_trace_count(t), 3);
  assert_int_equal(tsr_trace_dropped(t), 2);
  for (int i = 0; i < 3; i++) {
    const tsr_trace_event *e = tsr_trace_event_at(t, i);
    assert_string_equal(e->cat, "phase");
    assert_string_equal(e->name, "work");
    assert_int_equal(e->a, i);
    assert_int_equal(e->b, 7);
    assert_true(e->t1_ns >= e->t0_ns);
  }
  assert_null(tsr_trace_event_at(t, 3));
  tsr_trace_free(t);
}

static tsr_trace *traces[2];

static const tsr_trace_event *find(const tsr_trace *t, const char *name, const char *group) {
  for (int64_t i = 0; i < tsr_trace_count(t); i++) {
    const tsr_trace_event *e = tsr_trace_event_at(t, i);
    if (!strcmp(e->name, name) && !strcmp(e->group, group)) return e;
  }
  return NULL;
}

static tsr_status run_comm(tsr_comm_t *comm, void *arg) {
  (void)arg;
  int me = tsr_comm_rank(comm), both[2] = {0, 1};
  tsr_group_t *g = NULL, *self = NULL;
  TSR_CHECK(tsr_comm_group(comm, 2, both, "dp+tp", &g));
  TSR_CHECK(tsr_comm_group(comm, 1, &me, "alone", &self));
  float x[4] = {1, 2, 3, 4}, y[4];
  tsr_trace_attach(traces[me]);
  TSR_CHECK(tsr_comm_all_reduce(g, x, y, 4, TSR_F32, TSR_REDUCE_SUM));
  TSR_CHECK(tsr_comm_all_reduce(self, x, y, 4, TSR_F32, TSR_REDUCE_SUM));
  if (me == 0) TSR_CHECK(tsr_comm_send(g, 1, x, 3, TSR_F32));
  if (me == 1) TSR_CHECK(tsr_comm_recv(g, 0, y, 3, TSR_F32));
  tsr_trace_attach(NULL);
  TSR_CHECK(tsr_comm_barrier(g)); /* not recorded */
  return TSR_OK;
}

static void test_comm_events(void **state) {
  (void)state;
  for (int r = 0; r < 2; r++) assert_int_equal(tsr_trace_new(100, &traces[r]), TSR_OK);
  if (tsr_local_launch(2, 30.0, run_comm, NULL) != TSR_OK) fail_msg("%s", tsr_last_error());
  for (int r = 0; r < 2; r++) {
    const tsr_trace_event *e = find(traces[r], "all_reduce", "dp+tp");
    assert_non_null(e);
    assert_string_equal(e->cat, "comm");
    assert_int_equal(e->bytes, 16); /* 4 floats: half reduced out, the other half gathered */
    assert_true(e->t1_ns >= e->t0_ns);
    assert_null(find(traces[r], "all_reduce", "alone"));
    assert_null(find(traces[r], "barrier", "dp+tp"));
  }
  assert_int_equal(find(traces[0], "send", "dp+tp")->bytes, 12);
  assert_int_equal(find(traces[1], "recv", "dp+tp")->bytes, 0);
  assert_int_equal(tsr_trace_count(traces[0]), 2);
  assert_int_equal(tsr_trace_count(traces[1]), 2);
  for (int r = 0; r < 2; r++) tsr_trace_free(traces[r]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_capacity),
      cmocka_unit_test(test_comm_events),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
