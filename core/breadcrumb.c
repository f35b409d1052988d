/* The per-thread breadcrumb (tessera/breadcrumb.h). */
#include "tessera/breadcrumb.h"

/* initial-exec: the address is one thread-pointer offset, with no call into the dynamic linker,
 * so a signal handler may take it. */
static _Thread_local tsr_breadcrumb crumb
    __attribute__((tls_model("initial-exec"))) = {.rank = -1, .microbatch = -1};

tsr_breadcrumb *tsr_breadcrumb_here(void) {
  return &crumb;
}
