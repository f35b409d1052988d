/* The `nccl` backend's entry points: one process per GPU, started by mpirun or srun.
 *
 * libtessera-nccl.so exports the tsr_nccl_* functions below and nothing else. NCCL moves device
 * memory; MPI is the control plane (call matching, timeouts, the NCCL unique ids) and moves the
 * host buffers of calls made on host memory, through the mpi backend's own code compiled into
 * this library. The core never links MPI, CUDA or NCCL: the `tessera` command reaches the backend
 * through the loader (tsr_nccl_loader_*, a static library that dlopens it), and tests link the
 * backend directly. See docs/nccl.md.
 *
 * One process is one rank and owns one GPU: device (local rank % visible devices), chosen when
 * the communicator is made. NCCL refuses two ranks of one communicator on one GPU, so a job with
 * more processes on a host than that host has GPUs fails at start-up with a message saying so.
 */
#ifndef TESSERA_NCCL_H
#define TESSERA_NCCL_H

#include <stdbool.h>

#include "tessera/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- libtessera-nccl.so ---- */

/* This process's communicator over MPI_COMM_WORLD; collectives wait at most timeout_s. Collective
 * over every process of the job (once, at start-up): initialises MPI if nobody has yet, selects
 * and makes current this rank's GPU (cudaSetDevice), and checks that no two ranks share a GPU. */
tsr_status tsr_nccl_comm_new(double timeout_s, tsr_comm_t **out);
/* Frees the communicator, its NCCL communicators and its MPI communicators (those of broken
 * groups are aborted, not waited for; the process is expected to end). NULL: no-op. */
void tsr_nccl_comm_free(tsr_comm_t *c);
/* The CUDA device ordinal of the communicator's rank, -1 when `c` is not an nccl communicator.
 * The rank's tensors must live on this device (the core passes it to its CUDA allocator). */
int tsr_nccl_comm_device(const tsr_comm_t *c);
/* MPI_Finalize, when MPI is initialised and not yet finalised. */
void tsr_nccl_finalize(void);
/* Prints nothing; ends every process of the job with `code` (MPI_Abort). */
void tsr_nccl_abort(int code);

/* Runs fn on this process's rank, as tsr_mpi_launch does: checks that the job has `world`
 * processes, builds the communicator (which selects the GPU), calls fn on the calling thread with
 * that GPU current. On success frees everything and finalises MPI. On failure returns fn's status
 * with "rank R: " before its message and leaves MPI initialised: peers may still be waiting in a
 * collective, so the caller prints the message and ends the job with tsr_nccl_abort. */
tsr_status tsr_nccl_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg);

/* ---- The loader (libtessera_nccl_loader.a: no MPI, CUDA or NCCL) ---- */

/* Whether this build has the backend (CUDA, MPI and NCCL were found at configure time). */
bool tsr_nccl_loader_built(void);
/* dlopens libtessera-nccl.so (TESSERA_NCCL_BACKEND, then beside the loaded libtessera, then the
 * configured install, then the build tree) and calls its tsr_nccl_launch. TSR_ENOTSUP with the
 * reason when the backend is not built or cannot be opened. */
tsr_status tsr_nccl_loader_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg);
/* Whether tsr_nccl_loader_launch reached the backend's launch in this process (the job is
 * running: MPI may be initialised and peers may be waiting). */
bool tsr_nccl_loader_started(void);
/* tsr_nccl_abort through the loaded backend; returns when the backend was never started. */
void tsr_nccl_loader_abort(int code);
/* tsr_nccl_comm_device through the loaded backend; -1 when it was never opened. Call it from the
 * rank function with the communicator it was given. */
int tsr_nccl_loader_device(const tsr_comm_t *c);

#ifdef __cplusplus
}
#endif
#endif
