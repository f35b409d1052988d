/* The layout numbers of layout_fields.h under the tree's public headers (include/, and the
 * build's generated tessera/version.h). */
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

const abi_layout_entry abi_layout_now[] = {
#include "layout_fields.h"
};
const size_t abi_layout_now_count = sizeof abi_layout_now / sizeof abi_layout_now[0];
const unsigned abi_layout_now_abi[2] = {TSR_ABI_MAJOR, TSR_ABI_MINOR};
