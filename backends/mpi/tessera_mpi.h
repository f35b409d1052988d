/* The `mpi` backend's entry points: ranks are processes started by mpirun or srun.
 *
 * libtessera-mpi.so exports the tsr_mpi_* functions below. The core never links MPI: the
 * `tessera` command reaches the backend through the loader (tsr_mpi_loader_*, a static library
 * without MPI that dlopens the backend), and tests and benchmarks that need a real MPI
 * communicator link the backend directly. See docs/mpi.md.
 *
 * One process is one rank. MPI is initialised once per process (MPI_THREAD_FUNNELED: only the
 * thread that initialised it makes MPI calls) with MPI_ERRORS_RETURN, so that a failure comes
 * back as a tsr_status instead of killing the job from inside MPI.
 */
#ifndef TESSERA_MPI_H
#define TESSERA_MPI_H

#include <stdbool.h>

#include "tessera/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- libtessera-mpi.so ---- */

/* Initialises MPI if nobody has yet. Idempotent. */
tsr_status tsr_mpi_init(void);
/* This process's communicator over MPI_COMM_WORLD; collectives wait at most timeout_s. */
tsr_status tsr_mpi_comm_new(double timeout_s, tsr_comm_t **out);
/* Frees the communicator and the MPI communicators of its groups (not those of broken groups,
 * whose requests may still be pending; the process is expected to end). */
void tsr_mpi_comm_free(tsr_comm_t *c);
/* MPI_Finalize, when MPI is initialised and not yet finalised. */
void tsr_mpi_finalize(void);
/* Prints nothing; ends every process of the job with `code` (MPI_Abort). */
void tsr_mpi_abort(int code);

/* Runs fn on this process's rank, as tsr_local_launch runs it on every thread: checks that the
 * job has `world` processes, builds the communicator, calls fn. On success frees everything and
 * finalises MPI. On failure returns fn's status with "rank R: " before its message and leaves MPI
 * initialised: peers may still be waiting in a collective, so the caller prints the message and
 * ends the job with tsr_mpi_abort. */
tsr_status tsr_mpi_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg);

/* ---- The loader (libtessera_mpi_loader.a, no MPI) ---- */

/* This process's rank as mpirun, srun or another PMI launcher set it in the environment, or -1
 * when the process was not started by one. Needs no MPI. */
int tsr_mpi_env_rank(void);
/* The number of processes an MPI launcher started (mpirun, mpiexec: OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE, MV2_COMM_WORLD_SIZE), or -1 when none says. *var, when not NULL, receives the name of
 * the variable read. Needs no MPI. */
int tsr_mpi_env_size(const char **var);
/* Whether this build has the backend (Open MPI was found at configure time). */
bool tsr_mpi_loader_built(void);
/* dlopens libtessera-mpi.so and calls its tsr_mpi_launch. */
tsr_status tsr_mpi_loader_launch(int world, double timeout_s, tsr_rank_fn fn, void *arg);
/* Whether tsr_mpi_loader_launch initialised MPI in this process (the job is running). */
bool tsr_mpi_loader_started(void);
/* tsr_mpi_abort through the loaded backend; returns when the backend was never started. */
void tsr_mpi_loader_abort(int code);

#ifdef __cplusplus
}
#endif
#endif
