/* The loader of the `mpi` backend: what the `tessera` command links instead of MPI.
 *
 * libtessera-mpi.so is opened on first use, so that the core and the command never depend on
 * MPI and a build without Open MPI still runs every other backend. The backend is looked up in
 * TESSERA_MPI_BACKEND (an absolute path to the .so), then beside the libtessera this process
 * loaded (an install under any prefix), then the configured install's lib directory, then this
 * build tree; never the current directory.
 *
 * The handle is process-wide state on purpose: one process is one rank under this backend. */

#include <dlfcn.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "tessera/plugin.h"
#include "tessera_mpi.h"

typedef tsr_status (*launch_fn)(int world, double timeout_s, tsr_rank_fn fn, void *arg);
typedef void (*abort_fn)(int code);

static void *backend;
static bool started;

int tsr_mpi_env_rank(void) {
  /* Open MPI, PMIx launchers, MPICH/Hydra and Slurm, in that order. */
  static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
                                     "SLURM_PROCID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *s = getenv(vars[i]);
    char *end = NULL;
    long r = s && *s ? strtol(s, &end, 10) : -1;
    if (s && *s && end && *end == '\0' && r >= 0) return (int)r;
  }
  return -1;
}

int tsr_mpi_env_size(const char **var) {
  /* Open MPI, MPICH/Hydra and Intel MPI, MVAPICH */
  static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *s = getenv(vars[i]);
    char *end = NULL;
    long n = s && *s ? strtol(s, &end, 10) : -1;
    if (s && *s && end && *end == '\0' && n >= 1 && n <= INT_MAX) {
      if (var) *var = vars[i];
      return (int)n;
    }
  }
  return -1;
}

bool tsr_mpi_loader_built(void) {
  return TSR_MPI_BUILT;
}

bool tsr_mpi_loader_started(void) {
  return started;
}

static tsr_status open_backend(void) {
  if (backend) return TSR_OK;
  if (!TSR_MPI_BUILT)
    return TSR_ERROR(TSR_ENOTSUP,
                     "backend 'mpi' is not built in this tessera: Open MPI was not found when it "
                     "was configured. Install libopenmpi-dev and openmpi-bin, reconfigure with "
                     "-DTESSERA_MPI=ON and rebuild, or use backend = local");
  char tried[2048] = "";
  /* RTLD_GLOBAL: Open MPI opens its own components with dlopen, and they resolve MPI's symbols
   * through the global scope. */
  backend = tsr_core_dlopen("libtessera-mpi.so", "TESSERA_MPI_BACKEND", TSR_MPI_INSTALL_LIB,
                            TSR_MPI_BUILD_LIB, RTLD_NOW | RTLD_GLOBAL, tried, sizeof tried);
  if (backend) return TSR_OK;
  return TSR_ERROR(TSR_ENOTSUP,
                   "backend 'mpi': cannot open libtessera-mpi.so; set TESSERA_MPI_BACKEND to its "
                   "absolute path. Tried:%s",
                   tried);
}

tsr_status tsr_mpi_loader_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg) {
  TSR_CHECK(open_backend());
  launch_fn launch = (launch_fn)(uintptr_t)dlsym(backend, "tsr_mpi_launch");
  if (!launch)
    return TSR_ERROR(TSR_ENOTSUP, "backend 'mpi': libtessera-mpi.so lacks tsr_mpi_launch; it is "
                                  "from another build of tessera");
  started = true;
  return launch(world, timeout_s, fn, arg);
}

void tsr_mpi_loader_abort(int code) {
  if (!backend || !started) return;
  abort_fn end = (abort_fn)(uintptr_t)dlsym(backend, "tsr_mpi_abort");
  if (end) end(code);
}
