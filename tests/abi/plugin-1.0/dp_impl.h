/* Private to the dp plugin: its state and the gradient buckets (dp_bucket.c). */
#ifndef TESSERA_DP_IMPL_H
#define TESSERA_DP_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "tessera/plugin.h"

/* The gradients waiting for one collective sequence: an all-reduce over `ar_mask` and/or a
 * reduce-scatter over mesh dim `rs_dim`, on one mesh. One per rank. */
typedef struct dp_bucket {
  const tsr_mesh_t *mesh;
  uint32_t ar_mask;
  int rs_dim; /* -1: none */
  tsr_var **vars;
  int n, cap;
  size_t bytes;
} dp_bucket;

typedef struct dp_state {
  size_t bucket_bytes; /* flush a bucket once it holds this much; 0: every gradient alone */
  bool overlap;        /* sync from the gradient hook, while backward runs */
  int world;
  dp_bucket *buckets; /* (world): rank r uses buckets[r] only, so ranks never share one */
} dp_state;

/* The mesh dims this plugin owns. */
bool dp_owns(const char *dim);

/* Gradient hook: a leaf's gradient is final. Syncs it over the dp dims, in buckets. */
tsr_status dp_grad_ready(tsr_rank_t *r, tsr_var *leaf, void *ctx);
/* Gradient hook: backward has ended; flushes the rank's last bucket. */
tsr_status dp_grad_done(tsr_rank_t *r, void *ctx);
void dp_buckets_free(dp_state *s);

#endif
