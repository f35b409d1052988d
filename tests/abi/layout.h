/* One number of a struct layout: "tsr_op_rule.inputs offset" and its value. Shared by the two
 * tables of the layout test; includes no tessera header, so each table's translation unit sees
 * only its own set. */
#ifndef TESSERA_TEST_ABI_LAYOUT_H
#define TESSERA_TEST_ABI_LAYOUT_H

#include <stddef.h>

typedef struct abi_layout_entry {
  const char *what;
  size_t value;
} abi_layout_entry;

/* The numbers of layout_fields.h under the 1.0 headers (layout_1_0.c) and under the tree's
 * (layout_now.c), entry for entry, and each set's plugin ABI version. */
extern const abi_layout_entry abi_layout_1_0[], abi_layout_now[];
extern const size_t abi_layout_1_0_count, abi_layout_now_count;
extern const unsigned abi_layout_1_0_abi[2], abi_layout_now_abi[2];

#endif
