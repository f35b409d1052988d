/* `tessera conform`: L2. */
#include "conform.h"

void cf_add_l2(const cf_plugin *p) {
  (void)p;
}
