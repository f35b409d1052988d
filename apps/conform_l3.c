/* `tessera conform`: L3. */
#include "conform.h"

void cf_add_l3(const cf_plugin *p) {
  (void)p;
}
