/* The `nccl` backend's process-level entry points: the GPU of the rank, the communicator, the
 * launch. The only functions libtessera-nccl.so exports (nccl.map hides the rest, the mpi
 * backend's compiled-in copy included).
 *
 * A process is one rank and owns one GPU, so choosing the device here, once per communicator, is
 * choosing it for the process. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nccl_backend.h"

#define TSR_NCCL_EXPORT __attribute__((visibility("default")))

static const tsr_comm_iface nccl_iface = {
    .name = "nccl",
    .group_init = tsr_nccl_group_init,
    .group_free = tsr_nccl_group_free,
    .all_reduce = tsr_nccl_all_reduce,
    .all_gather = tsr_nccl_all_gather,
    .reduce_scatter = tsr_nccl_reduce_scatter,
    .all_to_all = tsr_nccl_all_to_all,
    .broadcast = tsr_nccl_broadcast,
    .barrier = tsr_nccl_barrier,
    .send = tsr_nccl_send,
    .recv = tsr_nccl_recv,
    .sendrecv = tsr_nccl_sendrecv,
    .device_memory = true,
};

/* ---- The rank's GPU ---- */

/* What every rank tells every other at start-up: its GPU, or why it has none. */
typedef struct gpu_rec {
  int32_t ok;
  int32_t device, count, local;
  char host[64];
  char bus[32];
  char why[400];
} gpu_rec;

static int env_index(const char *name) {
  const char *s = getenv(name);
  char *end = NULL;
  long v = s && *s ? strtol(s, &end, 10) : -1;
  return s && *s && end && *end == '\0' && v >= 0 && v < (1 << 30) ? (int)v : -1;
}

/* The rank's index among the ranks of its host: from the launcher's environment (Open MPI,
 * Slurm), else from MPI's shared-memory split (collective over the world, once at start-up). */
static int local_rank(void) {
  int r = env_index("OMPI_COMM_WORLD_LOCAL_RANK");
  if (r < 0) r = env_index("SLURM_LOCALID");
  if (r >= 0) return r;
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
      MPI_SUCCESS)
    return 0;
  MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  return r;
}

/* Picks and makes current this rank's GPU; failures go to rec->why, not out, because the
 * exchange that follows is collective and every rank must reach it. */
static void select_gpu(int rank, gpu_rec *rec) {
  memset(rec, 0, sizeof *rec);
  if (gethostname(rec->host, sizeof rec->host - 1) != 0) snprintf(rec->host, sizeof rec->host, "?");
  rec->local = local_rank();
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess || version < NCCL_VERSION(2, 14, 0)) {
    snprintf(rec->why, sizeof rec->why,
             "rank %d on %s: libnccl reports version %d, older than the 2.14 this backend needs "
             "(nonblocking communicators)",
             rank, rec->host, version);
    return;
  }
  cudaError_t e = cudaGetDeviceCount(&rec->count);
  if (e != cudaSuccess || rec->count <= 0) {
    snprintf(rec->why, sizeof rec->why,
             "rank %d on %s: no CUDA device (%s); the nccl backend runs one process per GPU "
             "(use backend = mpi or local without GPUs)",
             rank, rec->host,
             e != cudaSuccess ? cudaGetErrorString(e) : "the CUDA runtime reports 0 devices");
    (void)cudaGetLastError();
    return;
  }
  rec->device = rec->local % rec->count;
  e = cudaSetDevice(rec->device);
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(rec->bus, sizeof rec->bus, rec->device);
  if (e != cudaSuccess) {
    snprintf(rec->why, sizeof rec->why, "rank %d on %s: cannot use GPU %d: %s (%s)", rank,
             rec->host, rec->device, cudaGetErrorString(e), cudaGetErrorName(e));
    return;
  }
  rec->ok = 1;
}

/* Every rank learns every rank's GPU, so that a failure anywhere, or two ranks on one GPU (which
 * NCCL refuses), is the same error on every rank at start-up rather than a hang later. */
static tsr_status check_gpus(int rank, int world, const gpu_rec *mine) {
  gpu_rec *all = malloc((size_t)world * sizeof *all);
  if (!all) return TSR_ERROR(TSR_ENOMEM, "rank %d: out of memory for %d GPU records", rank, world);
  tsr_status st = TSR_OK;
  int rc = MPI_Allgather(mine, (int)sizeof *mine, MPI_BYTE, all, (int)sizeof *mine, MPI_BYTE,
                         MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) {
    char es[MPI_MAX_ERROR_STRING];
    tsr_mpi_error_string(rc, es, sizeof es);
    st = TSR_ERROR(TSR_ECOMM, "rank %d: exchanging the GPU of every rank failed in MPI: %s", rank,
                   es);
    goto cleanup;
  }
  for (int i = 0; i < world; i++) {
    if (all[i].ok) continue;
    all[i].why[sizeof all[i].why - 1] = '\0';
    st = TSR_ERROR(TSR_ENOTSUP, "%s", all[i].why);
    goto cleanup;
  }
  for (int i = 0; i < world; i++) {
    for (int j = i + 1; j < world; j++) {
      if (strncmp(all[i].host, all[j].host, sizeof all[i].host) ||
          strncmp(all[i].bus, all[j].bus, sizeof all[i].bus))
        continue;
      all[i].host[sizeof all[i].host - 1] = all[i].bus[sizeof all[i].bus - 1] = '\0';
      st = TSR_ERROR(TSR_EINVAL,
                     "ranks %d and %d both use GPU %d (PCI %s) on host %s, which has %d visible "
                     "GPUs: NCCL refuses two ranks of one communicator on one GPU. Start one "
                     "process per GPU (at most %d on that host), or use backend = local to run "
                     "several ranks on one GPU",
                     i, j, all[i].device, all[i].bus, all[i].host, all[i].count, all[i].count);
      goto cleanup;
    }
  }
cleanup:
  free(all);
  return st;
}

/* ---- Test builds ---- */

/* TESSERA_NCCL_TEST_FAULT=stall:R:K makes rank R stop at its K-th device call after arriving,
 * without queueing its part (its peers time out inside NCCL); TESSERA_NCCL_TEST_GROUPED=1 sends
 * even counts through the per-member path too, so that one GPU exercises it (docs/nccl.md). */
static void test_hooks(nccl_proc *p) {
  p->fault_at = -1;
#ifdef TSR_NCCL_FAULTS
  const char *s = getenv("TESSERA_NCCL_TEST_FAULT");
  int r = -1;
  long long k = -1;
  if (s && sscanf(s, "stall:%d:%lld", &r, &k) == 2 && r == p->rank && k >= 0) p->fault_at = k;
  s = getenv("TESSERA_NCCL_TEST_GROUPED");
  p->force_grouped = s && strcmp(s, "1") == 0;
#endif
}

/* ---- Entry points ---- */

TSR_NCCL_EXPORT tsr_status tsr_nccl_comm_new(double timeout_s, tsr_comm_t **out) {
  *out = NULL;
  if (!(timeout_s > 0) || timeout_s > 1e6)
    return TSR_ERROR(TSR_EINVAL, "nccl backend: timeout %g s must be in (0, 1e6]", timeout_s);
  TSR_CHECK(tsr_mpi_init());
  nccl_proc *p = calloc(1, sizeof *p);
  if (!p) return TSR_ERROR(TSR_ENOMEM, "nccl backend: out of memory");
  tsr_status st = TSR_OK;
  MPI_Comm_rank(MPI_COMM_WORLD, &p->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &p->world);
  gpu_rec rec;
  select_gpu(p->rank, &rec);
  TSR_CHECK_GOTO(check_gpus(p->rank, p->world, &rec), st);
  p->device = rec.device;
  /* Used only when the calling thread has no tessera CUDA context (tsr_nccl_begin). */
  cudaError_t e = cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) p->stream = NULL;
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&p->order, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    p->order = NULL;
    st = TSR_ERROR(TSR_ECOMM, "rank %d: creating a stream and an event on GPU %d failed: %s (%s)",
                   p->rank, p->device, cudaGetErrorString(e), cudaGetErrorName(e));
    goto cleanup;
  }
  TSR_CHECK_GOTO(tsr_mpi_comm_new(timeout_s, &p->mpi), st);
  test_hooks(p);
  TSR_CHECK_GOTO(tsr_comm_create(&nccl_iface, p, p->rank, p->world, timeout_s, out), st);
  return TSR_OK;
cleanup:
  tsr_mpi_comm_free(p->mpi);
  if (p->order) cudaEventDestroy(p->order);
  if (p->stream) cudaStreamDestroy(p->stream);
  free(p);
  return st;
}

TSR_NCCL_EXPORT void tsr_nccl_comm_free(tsr_comm_t *c) {
  if (!c) return;
  nccl_proc *p = c->context;
  double timeout_s = c->timeout_s;
  tsr_comm_destroy(c);
  /* In creation order, the same on every member, in case finalising is collective. */
  for (int i = 0; i < p->n_shared; i++) tsr_nccl_shared_destroy(p->shared[i], timeout_s);
  free(p->shared);
  if (p->order) cudaEventDestroy(p->order);
  if (p->stream) cudaStreamDestroy(p->stream);
  tsr_mpi_comm_free(p->mpi);
  if (p->cuda_lib) dlclose(p->cuda_lib);
  free(p);
}

TSR_NCCL_EXPORT int tsr_nccl_comm_device(const tsr_comm_t *c) {
  if (!c || c->iface != &nccl_iface) return -1;
  return ((const nccl_proc *)c->context)->device;
}

TSR_NCCL_EXPORT void tsr_nccl_finalize(void) {
  tsr_mpi_finalize();
}

TSR_NCCL_EXPORT void tsr_nccl_abort(int code) {
  tsr_mpi_abort(code);
}

TSR_NCCL_EXPORT tsr_status tsr_nccl_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg) {
  if (!fn) return TSR_ERROR(TSR_EINVAL, "tsr_nccl_launch: rank function is NULL");
  TSR_CHECK(tsr_mpi_init());
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (size != world)
    return TSR_ERROR(TSR_EINVAL,
                     "rank %d: the mesh has %d ranks but the job has %d MPI processes; start it "
                     "as `mpirun -np %d tessera run JOB.ini` (one process per GPU), or change "
                     "[mesh] shape",
                     rank, world, size, world);
  tsr_comm_t *c = NULL;
  TSR_CHECK(tsr_nccl_comm_new(timeout_s, &c));
  tsr_clear_error();
  tsr_status st = fn(c, arg);
  if (st != TSR_OK) {
    /* Peers may be inside a collective with this rank: leave MPI and NCCL as they are for the
     * caller's abort. */
    return tsr_error_prefix(st, "rank %d", rank);
  }
  tsr_nccl_comm_free(c);
  tsr_mpi_finalize();
  return TSR_OK;
}
