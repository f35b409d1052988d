/* The kernel table as plugins see it (tessera/device.h), on every table this build serves: the
 * CPU's, the emulated device's and, on a machine with a GPU, CUDA's. Only public headers are
 * used, as in a plugin.
 *
 * The layout is the ABI: plugins built against an older SDK read the members at fixed offsets,
 * so the list that generates the struct must keep its order, and every backend must fill every
 * member, since a plugin calls whatever it finds there. */
#include <stddef.h>
#include <string.h>

#include "test_kernels_util.h"
#include "tessera/comm.h"
#include "tessera/device.h"
#include "tessera/rank.h"

/* ---- the tables, each read off a tensor as a rule reads it ---- */

typedef struct table_req {
  tsr_device_kind kind;
  const tsr_kernel_table *table;
} table_req;

static tsr_status table_body(tsr_comm_t *comm, void *arg) {
  table_req *q = arg;
  tsr_rank_t *r = NULL;
  tsr_tensor *t = NULL;
  TSR_CHECK(tsr_rank_new(comm, NULL, &r));
  tsr_status st = tsr_rank_set_device(r, (tsr_device){q->kind, 0});
  int64_t one = 1;
  if (st == TSR_OK) st = tsr_tensor_new(tsr_rank_allocator(r), TSR_F32, 1, &one, &t);
  if (st == TSR_OK) q->table = tsr_kernel_table_of(t);
  tsr_tensor_free(t);
  tsr_rank_free(r);
  return st;
}

/* The table of device `kind`; NULL for CUDA when this build or machine has none. */
static const tsr_kernel_table *table_of(tsr_device_kind kind) {
  table_req q = {kind, NULL};
  tsr_status st = tsr_local_launch(1, 60.0, table_body, &q);
  if (kind == TSR_DEVICE_CUDA && st == TSR_ENOTSUP) {
    printf("no CUDA table here: %s\n", tsr_last_error());
    return NULL;
  }
  if (st != TSR_OK) fail_msg("table of device %d: %s", (int)kind, tsr_last_error());
  assert_non_null(q.table);
  return q.table;
}

/* ---- layout ---- */

#define COUNT_ENTRY(entry, kind, ret, params, args)  +1
#define NAME_ENTRY(entry, kind, ret, params, args)   #entry,
#define OFFSET_ENTRY(entry, kind, ret, params, args) offsetof(tsr_kernel_table, entry),

enum { N_ENTRIES = 0 TSR_KERNEL_LIST(COUNT_ENTRY) };

/* ABI 3's members in the order plugins built against it read them, written out independently of
 * the list so that reordering or dropping an entry there fails here. Appending one means raising
 * TSR_KERNEL_TABLE_ABI and adding it at the end. */
static const char *const abi3_members[] = {
    "gemm",
    "matmul_forward",
    "matmul_backward",
    "rmsnorm_forward",
    "rmsnorm_backward",
    "rope_tables",
    "rope_forward",
    "rope_backward",
    "blhd_to_bhld",
    "bhld_to_blhd",
    "swiglu_forward",
    "swiglu_backward",
    "embedding_forward",
    "embedding_backward",
    "cross_entropy",
    "logits_row_max",
    "logits_row_sumexp",
    "logits_target",
    "cross_entropy_shard_backward",
    "attention_forward",
    "attention_backward",
    "attention_forward_blhd",
    "attention_backward_blhd",
    "attention_merge",
    "adamw",
    "sum_squares",
    "global_norm",
    "clip_coef",
    "scale",
    "owns",
    "allocator_init",
    "allocator_release",
    "copy_h2d",
    "copy_d2h",
    "copy_d2d",
    "zero",
    "copy_strided",
    "add",
    "sync",
    "matmul_forward_bf16",
    "matmul_backward_bf16",
};

static void test_layout_is_abi3(void **state) {
  (void)state;
  assert_int_equal(TSR_KERNEL_TABLE_ABI, 3);
  assert_int_equal(N_ENTRIES, 41);
  assert_int_equal(sizeof abi3_members / sizeof abi3_members[0], N_ENTRIES);

  static const char *const listed[] = {TSR_KERNEL_LIST(NAME_ENTRY)};
  static const size_t offsets[] = {TSR_KERNEL_LIST(OFFSET_ENTRY)};
  /* The four header fields, then one function pointer per entry with nothing between. */
  const size_t first = offsetof(tsr_kernel_table, gemm);
  for (int i = 0; i < N_ENTRIES; i++) {
    if (strcmp(listed[i], abi3_members[i]) != 0)
      fail_msg("member %d is %s, ABI 3 has %s there", i, listed[i], abi3_members[i]);
    assert_int_equal(offsets[i], first + (size_t)i * sizeof(tsr_kernel_fn));
  }
  assert_int_equal(sizeof(tsr_kernel_table), first + N_ENTRIES * sizeof(tsr_kernel_fn));
  assert_int_equal(offsetof(tsr_kernel_table, abi), 0);
  assert_int_equal(offsetof(tsr_kernel_table, struct_size), 4);
  if (sizeof(void *) == 8) {
    /* The LP64 numbers of the 1.0 SDK. */
    assert_int_equal(offsetof(tsr_kernel_table, name), 8);
    assert_int_equal(offsetof(tsr_kernel_table, device), 16);
    assert_int_equal(first, 24);
    assert_int_equal(sizeof(tsr_kernel_table), 352);
  }
}

/* ---- every table complete ---- */

static void check_complete(const tsr_kernel_table *t, tsr_device_kind kind) {
  assert_int_equal(t->abi, TSR_KERNEL_TABLE_ABI);
  assert_int_equal(t->struct_size, sizeof(tsr_kernel_table));
  assert_int_equal(t->device, kind);
  assert_non_null(t->name);
#define CHECK_MEMBER(entry, kind_, ret, params, args)                                              \
  if (!t->entry) fail_msg("table %s: member %s is NULL", t->name, #entry);
  TSR_KERNEL_LIST(CHECK_MEMBER)
#undef CHECK_MEMBER
#define CHECK_NAMED(entry, kind_, ret, params, args)                                               \
  if (!tsr_kernel_lookup(t, #entry)) fail_msg("table %s does not serve %s", t->name, #entry);
  TSR_KERNEL_LOOKUP_LIST(CHECK_NAMED)
#undef CHECK_NAMED
}

static void test_every_table_complete(void **state) {
  (void)state;
  const tsr_kernel_table *cpu = table_of(TSR_DEVICE_CPU), *emu = table_of(TSR_DEVICE_EMU);
  assert_string_equal(cpu->name, "cpu");
  assert_string_equal(emu->name, "emu");
  check_complete(cpu, TSR_DEVICE_CPU);
  check_complete(emu, TSR_DEVICE_EMU);
  const tsr_kernel_table *cuda = table_of(TSR_DEVICE_CUDA);
  if (cuda) {
    assert_string_equal(cuda->name, "cuda");
    check_complete(cuda, TSR_DEVICE_CUDA);
  }
}

/* ---- lookup by name ---- */

static void check_lookup_finds_members(const tsr_kernel_table *t) {
#define CHECK_LOOKUP(entry, kind, ret, params, args)                                               \
  if (tsr_kernel_lookup(t, #entry) != (tsr_kernel_fn)t->entry)                                     \
    fail_msg("table %s: lookup of %s is not the member", t->name, #entry);
  TSR_KERNEL_LIST(CHECK_LOOKUP)
#undef CHECK_LOOKUP
}

static void test_lookup(void **state) {
  (void)state;
  const tsr_kernel_table *cpu = table_of(TSR_DEVICE_CPU), *emu = table_of(TSR_DEVICE_EMU);
  check_lookup_finds_members(cpu);
  check_lookup_finds_members(emu);
  const tsr_kernel_table *cuda = table_of(TSR_DEVICE_CUDA);
  if (cuda) check_lookup_finds_members(cuda);

  /* What the lookup returns is the kernel itself, called through its own type. */
  typedef void (*scale_fn)(float *x, int64_t n, float s);
  scale_fn scale = (scale_fn)tsr_kernel_lookup(cpu, "scale");
  assert_non_null(scale);
  float x[3] = {1.0f, -2.0f, 0.5f};
  scale(x, 3, 4.0f);
  assert_true(x[0] == 4.0f && x[1] == -8.0f && x[2] == 2.0f);

  /* Names are exact; anything else is NULL, never a near match. */
  assert_null(tsr_kernel_lookup(cpu, "no_such_kernel"));
  assert_null(tsr_kernel_lookup(cpu, ""));
  assert_null(tsr_kernel_lookup(cpu, "GEMM"));
  assert_null(tsr_kernel_lookup(cpu, "gemm "));
  assert_null(tsr_kernel_lookup(cpu, "tsr_kernel_gemm"));
  assert_null(tsr_kernel_lookup(cpu, "name")); /* a header field, not an entry */
  assert_null(tsr_kernel_lookup(cpu, NULL));
  assert_null(tsr_kernel_lookup(NULL, "gemm"));
  assert_true(tsr_kernel_lookup(cpu, "attention_forward") !=
              tsr_kernel_lookup(cpu, "attention_forward_blhd"));

  /* A table filled by an ABI 2 library ends before the bf16 matmuls: lookup answers NULL for them
   * instead of reading past its end, and still finds what it has. */
  tsr_kernel_table abi2 = *cpu;
  abi2.abi = 2;
  abi2.struct_size = (uint32_t)offsetof(tsr_kernel_table, matmul_forward_bf16);
  assert_null(tsr_kernel_lookup(&abi2, "matmul_forward_bf16"));
  assert_null(tsr_kernel_lookup(&abi2, "matmul_backward_bf16"));
  assert_true(tsr_kernel_lookup(&abi2, "sync") == (tsr_kernel_fn)cpu->sync);
  assert_true(tsr_kernel_lookup(&abi2, "gemm") == (tsr_kernel_fn)cpu->gemm);
  /* and one whose struct_size ends before any entry has none */
  abi2.struct_size = (uint32_t)offsetof(tsr_kernel_table, gemm);
  assert_null(tsr_kernel_lookup(&abi2, "gemm"));
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_layout_is_abi3),
      cmocka_unit_test(test_every_table_complete),
      cmocka_unit_test(test_lookup),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
