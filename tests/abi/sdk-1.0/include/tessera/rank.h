/* The per-rank context: everything one SPMD rank needs, so that nothing per rank lives in a
 * global. Two ranks may be two threads of one process, each with its own tsr_rank_t.
 */
#ifndef TESSERA_RANK_H
#define TESSERA_RANK_H

#include "tessera/comm.h"
#include "tessera/status.h"
#include "tessera/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_rank_t tsr_rank_t;
typedef struct tsr_registry_t tsr_registry_t; /* see tessera/registry.h */

/* A rank context over `comm` (borrowed). `registry` (borrowed, may be NULL) supplies the rules
 * that loaded plugins registered; it is read-only while ranks run. The context owns a CPU
 * allocator whose counters measure this rank's memory: every tensor made from it (the locals of
 * the DTensors the core makes, and tsr_dtensor_full_tensor's results) must be freed before
 * tsr_rank_free; copy one with tsr_tensor_cast to keep it longer. */
tsr_status tsr_rank_new(tsr_comm_t *comm, const tsr_registry_t *registry, tsr_rank_t **out);
/* Moves the rank to device `dev` (cpu, cuda with its ordinal, or emu): its allocator becomes that
 * device's, so every tensor the core makes for this rank lives there. Call it on the rank's own
 * thread, before any tensor is made from the rank's allocator (else TSR_EINVAL). TSR_ENOTSUP when
 * this build or machine has no such device, with the reason. */
tsr_status tsr_rank_set_device(tsr_rank_t *r, tsr_device dev);
tsr_device tsr_rank_device(const tsr_rank_t *r);
/* The precision of the rank's matrix products (linear layers, [job] dtype): TSR_F32 (the
 * default), or TSR_BF16 for mixed precision, where every GEMM operand is rounded to bf16 and
 * accumulated in f32 (tsr_kernel_matmul_forward_bf16); parameters, gradients, optimizer state,
 * activations and every other op stay f32. TSR_EINVAL for any other dtype. Ops and plugin rules
 * that multiply matrices follow it through tsr_linear_forward / _backward (tessera/device.h). */
tsr_status tsr_rank_set_matmul_dtype(tsr_rank_t *r, tsr_dtype dt);
tsr_dtype tsr_rank_matmul_dtype(const tsr_rank_t *r);
/* Frees the context (and releases its device, on the thread that set it). NULL is a no-op. */
void tsr_rank_free(tsr_rank_t *r);

int tsr_rank_id(const tsr_rank_t *r);
int tsr_rank_world(const tsr_rank_t *r);
tsr_comm_t *tsr_rank_comm(tsr_rank_t *r);
const tsr_registry_t *tsr_rank_registry(const tsr_rank_t *r);
tsr_allocator *tsr_rank_allocator(tsr_rank_t *r);

#ifdef __cplusplus
}
#endif
#endif
