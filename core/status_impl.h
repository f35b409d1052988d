/* Private to the core: when this thread's last error was written. */
#ifndef TESSERA_STATUS_IMPL_H
#define TESSERA_STATUS_IMPL_H

#include <stdint.h>

#include "tessera/status.h"

/* CLOCK_MONOTONIC nanoseconds (+ 1) at which this thread's last error message was written by
 * tsr_error or tsr_error_at; tsr_error_prefix keeps it (the context is added later, the failure
 * happened then), tsr_clear_error resets it to 0. tsr_local_launch orders failed ranks by it. */
uint64_t tsr_last_error_ns(void);

#endif
