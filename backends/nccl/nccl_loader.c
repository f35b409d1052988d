/* The loader of the `nccl` backend: what the `tessera` command links instead of MPI, CUDA and
 * NCCL.
 *
 * libtessera-nccl.so is opened on first use, so that the core and the command never depend on
 * them and a build without a GPU toolchain still runs every other backend. The backend is looked
 * up in TESSERA_NCCL_BACKEND (an absolute path to the .so), then beside the libtessera this
 * process loaded (an install under any prefix), then the configured install's lib directory, then
 * this build tree; never the current directory.
 *
 * The handle is process-wide state on purpose: one process is one rank under this backend. */
#include <dlfcn.h>
#include <stdint.h>

#include "tessera/plugin.h"
#include "tessera_nccl.h"

typedef tsr_status (*launch_fn)(int world, double timeout_s, tsr_rank_fn fn, void *arg);
typedef void (*abort_fn)(int code);
typedef int (*device_fn)(const tsr_comm_t *c);

static void *backend;
static bool started;

bool tsr_nccl_loader_built(void) {
  return TSR_NCCL_BUILT;
}

bool tsr_nccl_loader_started(void) {
  return started;
}

static tsr_status open_backend(void) {
  if (backend) return TSR_OK;
  if (!TSR_NCCL_BUILT)
    return TSR_ERROR(TSR_ENOTSUP,
                     "backend 'nccl' is not built in this tessera (at configure time: %s). It "
                     "needs the CUDA Toolkit, Open MPI and NCCL 2.14+: install what is missing, "
                     "reconfigure and rebuild, or use backend = mpi or local",
                     TSR_NCCL_MISSING);
  char tried[2048] = "";
  /* RTLD_GLOBAL: Open MPI opens its own components with dlopen, and they resolve MPI's symbols
   * through the global scope. */
  backend = tsr_core_dlopen("libtessera-nccl.so", "TESSERA_NCCL_BACKEND", TSR_NCCL_INSTALL_LIB,
                            TSR_NCCL_BUILD_LIB, RTLD_NOW | RTLD_GLOBAL, tried, sizeof tried);
  if (backend) return TSR_OK;
  return TSR_ERROR(TSR_ENOTSUP,
                   "backend 'nccl': cannot open libtessera-nccl.so; set TESSERA_NCCL_BACKEND to "
                   "its absolute path. Tried:%s",
                   tried);
}

tsr_status tsr_nccl_loader_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg) {
  TSR_CHECK(open_backend());
  launch_fn launch = (launch_fn)(uintptr_t)dlsym(backend, "tsr_nccl_launch");
  if (!launch)
    return TSR_ERROR(TSR_ENOTSUP, "backend 'nccl': libtessera-nccl.so lacks tsr_nccl_launch; it "
                                  "is from another build of tessera");
  started = true;
  return launch(world, timeout_s, fn, arg);
}

void tsr_nccl_loader_abort(int code) {
  if (!backend || !started) return;
  abort_fn end = (abort_fn)(uintptr_t)dlsym(backend, "tsr_nccl_abort");
  if (end) end(code);
}

int tsr_nccl_loader_device(const tsr_comm_t *c) {
  if (!backend) return -1;
  device_fn device = (device_fn)(uintptr_t)dlsym(backend, "tsr_nccl_comm_device");
  return device ? device(c) : -1;
}
