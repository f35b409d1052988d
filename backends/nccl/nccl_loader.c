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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* libtessera-nccl.so in the folder of the libtessera this process loaded, when it is there: the
 * install puts both in <prefix>/lib, so an install made with --prefix (or moved) finds its own. */
static bool beside_core(char *out, size_t len) {
  char lib[4096];
  if (!tsr_core_library_dir(lib, sizeof lib)) return false;
  int w = snprintf(out, len, "%s/libtessera-nccl.so", lib);
  return w > 0 && (size_t)w < len && access(out, F_OK) == 0;
}

static tsr_status open_backend(void) {
  if (backend) return TSR_OK;
  if (!TSR_NCCL_BUILT)
    return TSR_ERROR(TSR_ENOTSUP,
                     "backend 'nccl' is not built in this tessera (at configure time: %s). It "
                     "needs the CUDA Toolkit, Open MPI and NCCL 2.14+: install what is missing, "
                     "reconfigure and rebuild, or use backend = mpi or local",
                     TSR_NCCL_MISSING);
  const char *env = getenv("TESSERA_NCCL_BACKEND");
  char beside[4096];
  const char *paths[] = {env && env[0] == '/' ? env : NULL,
                         beside_core(beside, sizeof beside) ? beside : NULL, TSR_NCCL_INSTALL_LIB,
                         TSR_NCCL_BUILD_LIB};
  char tried[2048] = "";
  size_t pos = 0;
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    if (!paths[i]) continue;
    /* RTLD_GLOBAL: Open MPI opens its own components with dlopen, and they resolve MPI's
     * symbols through the global scope. */
    backend = dlopen(paths[i], RTLD_NOW | RTLD_GLOBAL);
    if (backend) return TSR_OK;
    const char *why = dlerror();
    int w = snprintf(tried + pos, sizeof tried - pos, "\n  %s: %s", paths[i], why ? why : "?");
    if (w > 0) pos = pos + (size_t)w < sizeof tried ? pos + (size_t)w : sizeof tried - 1;
  }
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
