/* The nccl loader as the `tessera` command uses it: this program links no MPI, CUDA or NCCL.
 *
 * It opens libtessera-nccl.so through tsr_nccl_loader_launch and runs one rank: the rank function
 * sees an "nccl" communicator and the GPU it was given. On a host without a GPU the launch must
 * fail with the backend's reason (which proves the library was found, opened and started MPI);
 * the test then reports Skipped (77). */
#include <stdio.h>
#include <string.h>

#include "tessera_nccl.h"

#define SKIP_CODE 77

static tsr_status rank_fn(tsr_comm_t *c, void *arg) {
  int *device = arg;
  if (strcmp(tsr_comm_backend(c), "nccl") != 0)
    return tsr_error(TSR_EINTERNAL, "the rank's backend is '%s'", tsr_comm_backend(c));
  *device = tsr_nccl_loader_device(c);
  if (*device < 0) return tsr_error(TSR_EINTERNAL, "tsr_nccl_loader_device gave %d", *device);
  return TSR_OK;
}

int main(void) {
  if (!tsr_nccl_loader_built()) {
    fprintf(stderr, "FAIL: the loader says the backend is not built, but this test exists only "
                    "when it is\n");
    return 1;
  }
  if (tsr_nccl_loader_started() || tsr_nccl_loader_device(NULL) != -1) {
    fprintf(stderr, "FAIL: the loader claims a started backend before any launch\n");
    return 1;
  }
  int device = -1;
  tsr_status st = tsr_nccl_loader_launch(1, 60.0, rank_fn, &device);
  if (st == TSR_OK) {
    printf("OK: one rank ran on backend nccl, GPU %d\n", device);
    return 0;
  }
  if (!tsr_nccl_loader_started()) {
    fprintf(stderr, "FAIL: the backend did not start: %s\n", tsr_last_error());
    return 1;
  }
  if (st == TSR_ENOTSUP && strstr(tsr_last_error(), "no CUDA device")) {
    /* MPI is running and every rank of the job failed the same way: ending it through the
     * backend is what the `tessera` command does too. */
    printf("SKIP test_nccl_loader: the backend was found, opened and started, and refused to run "
           "without a GPU: %s\n",
           tsr_last_error());
    fflush(stdout);
    tsr_nccl_loader_abort(SKIP_CODE);
    return SKIP_CODE;
  }
  fprintf(stderr, "FAIL: %s: %s\n", tsr_status_name(st), tsr_last_error());
  tsr_nccl_loader_abort(1);
  return 1;
}
