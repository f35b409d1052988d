/* The layout numbers of layout_fields.h under the 1.0 SDK: this file is compiled with
 * sdk-1.0/include as its only tessera include path. */
#include <stddef.h>

#include "tessera/config.h"
#include "tessera/dtensor.h"
#include "tessera/plugin.h"
#include "tessera/registry.h"

#include "layout.h"

#define ABI_MEMBER_SIZE(type, field) sizeof(((type *)0)->field)
#define ABI_SIZE(type)               {#type " size", sizeof(type)},
#define ABI_END(type, field)                                                                       \
  {#type " end of " #field, offsetof(type, field) + ABI_MEMBER_SIZE(type, field)},
#define ABI_FIELD(type, field)                                                                     \
  {#type "." #field " offset", offsetof(type, field)},                                             \
      {#type "." #field " size", ABI_MEMBER_SIZE(type, field)},

const abi_layout_entry abi_layout_1_0[] = {
#include "layout_fields.h"
};
const size_t abi_layout_1_0_count = sizeof abi_layout_1_0 / sizeof abi_layout_1_0[0];
const unsigned abi_layout_1_0_abi[2] = {TSR_ABI_MAJOR, TSR_ABI_MINOR};
