/* The `mpi` backend's process-level entry points: MPI start-up, the communicator, the launch.
 *
 * A process is one rank, so the little state here that is process-wide (whether this library
 * initialised MPI) is a static on purpose: it describes the process, not a rank. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_backend.h"

#define TSR_MPI_EXPORT __attribute__((visibility("default")))

static const tsr_comm_iface mpi_iface = {
    .name = "mpi",
    .group_init = tsr_mpi_group_init,
    /* Group state is shared by the handles over one rank list and freed with the process's
     * communicator, as in the local backend. */
    .group_free = NULL,
    .all_reduce = tsr_mpi_all_reduce,
    .all_gather = tsr_mpi_all_gather,
    .reduce_scatter = tsr_mpi_reduce_scatter,
    .all_to_all = tsr_mpi_all_to_all,
    .broadcast = tsr_mpi_broadcast,
    .barrier = tsr_mpi_barrier,
    .send = tsr_mpi_send,
    .recv = tsr_mpi_recv,
    .sendrecv = tsr_mpi_sendrecv,
};

TSR_MPI_EXPORT tsr_status tsr_mpi_init(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized)
    return TSR_ERROR(TSR_ENOTSUP,
                     "mpi backend: MPI was already finalised in this process and cannot start "
                     "again; run one job per process");
  if (!inited) {
    int provided = MPI_THREAD_SINGLE;
    /* Only the thread that starts MPI calls it; kernel threads never do. */
    int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    if (rc != MPI_SUCCESS)
      return TSR_ERROR(TSR_ECOMM,
                       "mpi backend: MPI_Init_thread failed (code %d); is this "
                       "process started by mpirun or srun?",
                       rc);
  }
  /* Failures come back as codes the backend turns into messages, instead of MPI aborting. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return TSR_OK;
}

/* TESSERA_MPI_TEST_FAULT=kill:R:K makes rank R die (SIGKILL) at its K-th collective, and
 * stall:R:K makes it stop there forever, a hung process; test builds only (docs/mpi.md). */
static void fault_from_env(mpi_proc *p) {
  p->fault_at = -1;
#ifdef TSR_MPI_FAULTS
  const char *s = getenv("TESSERA_MPI_TEST_FAULT");
  char kind[16] = "";
  int r = -1;
  long long k = -1;
  if (!s || sscanf(s, "%15[a-z]:%d:%lld", kind, &r, &k) != 3 || r != p->rank || k < 0) return;
  if (strcmp(kind, "kill") && strcmp(kind, "stall")) return;
  p->fault_at = k;
  p->fault_kill = !strcmp(kind, "kill");
#endif
}

TSR_MPI_EXPORT tsr_status tsr_mpi_comm_new(double timeout_s, tsr_comm_t **out) {
  *out = NULL;
  if (!(timeout_s > 0) || timeout_s > 1e6)
    return TSR_ERROR(TSR_EINVAL, "mpi backend: timeout %g s must be in (0, 1e6]", timeout_s);
  TSR_CHECK(tsr_mpi_init());
  mpi_proc *p = calloc(1, sizeof *p);
  if (!p) return TSR_ERROR(TSR_ENOMEM, "mpi backend: out of memory");
  p->ctl = MPI_COMM_NULL;
  p->timeout_s = timeout_s;
  MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p->world);
  fault_from_env(p);
  tsr_status st = TSR_OK;
  /* Collective over the world, once at start-up, when every process is starting anyway. */
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &p->ctl);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(p->ctl, MPI_ERRORS_RETURN);
  if (rc != MPI_SUCCESS) {
    char es[MPI_MAX_ERROR_STRING];
    tsr_mpi_error_string(rc, es, sizeof es);
    st = TSR_ERROR(TSR_ECOMM, "rank %d: MPI_Comm_dup of the world failed: %s", p->rank, es);
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_comm_create(&mpi_iface, p, p->rank, p->world, timeout_s, out), st);
  return TSR_OK;
cleanup:
  if (p->ctl != MPI_COMM_NULL) MPI_Comm_free(&p->ctl);
  free(p);
  return st;
}

TSR_MPI_EXPORT void tsr_mpi_comm_free(tsr_comm_t *c) {
  if (!c) return;
  mpi_proc *p = c->context;
  tsr_comm_destroy(c);
  bool broken = false;
  for (int i = 0; i < p->n_groups; i++) {
    broken = broken || p->groups[i]->broken;
    tsr_mpi_group_destroy(p->groups[i]);
  }
  /* After a failure the control communicator may have pending handshakes too. */
  if (!broken && p->ctl != MPI_COMM_NULL) MPI_Comm_free(&p->ctl);
  free(p->groups);
  free(p);
}

TSR_MPI_EXPORT void tsr_mpi_finalize(void) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Finalize();
}

TSR_MPI_EXPORT void tsr_mpi_abort(int code) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

TSR_MPI_EXPORT tsr_status tsr_mpi_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg) {
  if (!fn) return TSR_ERROR(TSR_EINVAL, "tsr_mpi_launch: rank function is NULL");
  TSR_CHECK(tsr_mpi_init());
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != world)
    return TSR_ERROR(TSR_EINVAL,
                     "rank %d: the mesh has %d ranks but the job has %d MPI processes; start it "
                     "as `mpirun -np %d tessera run JOB.ini` (or srun -n %d), or change [mesh] "
                     "shape",
                     rank, world, size, world, world);
  tsr_comm_t *c = NULL;
  TSR_CHECK(tsr_mpi_comm_new(timeout_s, &c));
  tsr_clear_error();
  tsr_status st = fn(c, arg);
  if (st != TSR_OK) {
    /* Peers may be inside a collective with this rank: leave MPI as it is for the caller's
     * abort, and the communicator with it. */
    return tsr_error_prefix(st, "rank %d", rank);
  }
  tsr_mpi_comm_free(c);
  tsr_mpi_finalize();
  return TSR_OK;
}
