/* abi_layout_1_0: every struct frozen for plugin ABI major 1 (layout_fields.h) has, under the
 * tree's headers, the size and field offsets and sizes it has under the 1.0 SDK kept in sdk-1.0/.
 * A plugin built against 1.0 hands the core these structs; a difference would make the core read
 * that plugin's fields in the wrong place. */
#include <stdio.h>
#include <string.h>

#include "layout.h"

int main(void) {
  printf("plugin ABI of the 1.0 SDK: %u.%u, of the tree: %u.%u\n", abi_layout_1_0_abi[0],
         abi_layout_1_0_abi[1], abi_layout_now_abi[0], abi_layout_now_abi[1]);
  if (abi_layout_1_0_abi[0] != 1 || abi_layout_1_0_abi[1] != 0) {
    printf("FAIL: tests/abi/sdk-1.0 is not the 1.0 SDK\n");
    return 1;
  }
  if (abi_layout_now_abi[0] != abi_layout_1_0_abi[0]) {
    printf("FAIL: the tree's ABI major is %u: the 1.0 structs are frozen for major %u only; a new "
           "major needs its own snapshot and its own list\n",
           abi_layout_now_abi[0], abi_layout_1_0_abi[0]);
    return 1;
  }
  if (abi_layout_now_count != abi_layout_1_0_count) {
    printf("FAIL: %zu numbers under the tree's headers, %zu under 1.0\n", abi_layout_now_count,
           abi_layout_1_0_count);
    return 1;
  }
  int bad = 0;
  for (size_t i = 0; i < abi_layout_1_0_count; i++) {
    const abi_layout_entry *old = &abi_layout_1_0[i], *now = &abi_layout_now[i];
    if (strcmp(old->what, now->what) != 0) {
      printf("FAIL: entry %zu is '%s' under 1.0 but '%s' now\n", i, old->what, now->what);
      return 1;
    }
    if (old->value != now->value) {
      printf("CHANGED %s: %zu in 1.0, %zu now\n", old->what, old->value, now->value);
      bad++;
    }
  }
  if (bad) {
    printf("FAIL: %d of %zu layout numbers differ from ABI 1.0. These structs are frozen for ABI "
           "major 1: a new field means a new struct and a new function\n",
           bad, abi_layout_1_0_count);
    return 1;
  }
  printf("ok: %zu layout numbers equal to ABI 1.0\n", abi_layout_1_0_count);
  return 0;
}
