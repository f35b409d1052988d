/* Private to the cp_ring plugin: the sequence layout on the ring dim and the ring attention rule.
 */
#ifndef CP_RING_IMPL_H
#define CP_RING_IMPL_H

#include "tessera/device.h"
#include "tessera/ops.h"

#define RING_DIM "ring_cp"

typedef enum ring_balance { RING_BALANCE_NONE = 0, RING_BALANCE_ZIGZAG = 1 } ring_balance;

typedef struct ring_state {
  ring_balance balance;
} ring_state;

/* Global sequence positions (tensor dim 1) of the rows that global rank `rank` holds of a tensor
 * of length L placed `p` on mesh `m`: the sharders of dim 1 split it in mesh order, torch.chunk
 * style, except that under zigzag the ring dim gives coordinate c the chunks c and 2n-1-c of 2n.
 * *pos (malloc'd, *n entries) is the caller's. */
tsr_status ring_positions(const ring_state *s, const tsr_mesh_t *m, const tsr_placement *p,
                          int64_t L, int rank, int32_t **pos, int *n);

/* The zigzag transitions on the ring dim: every change into or out of Shard(1). */
bool ring_zigzag_match(const tsr_dtensor *x, int dim, tsr_placement src, tsr_placement dst,
                       void *ctx);
tsr_status ring_zigzag_apply(tsr_rank_t *r, const tsr_dtensor *x, int dim, tsr_placement dst,
                             tsr_dtensor **out, void *ctx);

/* RoPE on a zigzag sequence shard: the rows rotate by their global positions. */
tsr_status ring_rope_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                             const void *attrs, int nout, tsr_dtensor **out, void **saved,
                             void *ctx);
tsr_status ring_rope_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, const tsr_dtensor *const *outs,
                              const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                              void *ctx);
void ring_rope_saved_free(void *p);

/* Ring attention: q, k, v (B, L, H, D) sequence-sharded on the ring dim. */
tsr_status ring_sdpa_forward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                             const void *attrs, int nout, tsr_dtensor **out, void **saved,
                             void *ctx);
tsr_status ring_sdpa_backward(tsr_rank_t *r, int dim, int nin, const tsr_dtensor *const *in,
                              const void *attrs, int nout, const tsr_dtensor *const *outs,
                              const tsr_dtensor *const *gouts, tsr_dtensor **gins, void *saved,
                              void *ctx);
void ring_sdpa_saved_free(void *p);

#endif
