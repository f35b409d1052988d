/* Kernel time accounting for benchmarks: wall time of the outermost kernel call on each thread,
 * summed per kind. Off by default; when off a kernel pays a
 * thread-local increment and one relaxed atomic load. */
#include <stdatomic.h>
#include <time.h>

#include "internal.h"
#include "tessera/kernels.h"

static atomic_bool profile_on;
static _Atomic int64_t profile_ns[TSR_KERNEL_KINDS];
/* Kernels call kernels (linear → GEMM): only the outermost call on a thread is timed, so that
 * nothing counts twice. */
static _Thread_local int profile_depth;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void tsr_kernel_profile_enable(bool on) {
  atomic_store(&profile_on, on);
}

void tsr_kernel_profile_read(double seconds[TSR_KERNEL_KINDS], bool reset) {
  for (int k = 0; k < TSR_KERNEL_KINDS; k++) {
    int64_t ns = reset ? atomic_exchange(&profile_ns[k], 0) : atomic_load(&profile_ns[k]);
    seconds[k] = 1e-9 * (double)ns;
  }
}

int64_t tsr_profile_begin(void) {
  if (profile_depth++ > 0) return -1;
  return atomic_load_explicit(&profile_on, memory_order_relaxed) ? now_ns() : -1;
}

void tsr_profile_end(tsr_kernel_kind kind, int64_t t0) {
  profile_depth--;
  if (t0 >= 0) atomic_fetch_add_explicit(&profile_ns[kind], now_ns() - t0, memory_order_relaxed);
}
