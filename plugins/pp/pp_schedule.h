/* The pp plugin's schedule builders (tsr_schedule_fn), shared by the plugin and its tests. */
#ifndef TESSERA_PP_SCHEDULE_H
#define TESSERA_PP_SCHEDULE_H

#include <stdint.h>

#include "tessera/registry.h"

/* All forwards, then all backwards in reverse microbatch order. */
tsr_status tsr_pp_gpipe(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                        int *n, void *ctx);
/* One forward, one backward: stages - stage - 1 warm-up forwards, then alternating, then the
 * remaining backwards. */
tsr_status tsr_pp_1f1b(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                       int *n, void *ctx);
/* Interleaved 1F1B over `chunks` model chunks per rank, ctx = (void *)(intptr_t)chunks (>= 2):
 * rank r holds stages r, r + stages, ...; forwards go through the chunks in groups of `stages`
 * microbatches, (stages - r - 1) * 2 + (chunks - 1) * stages warm-up forwards, then one forward
 * one backward. Needs microbatches % stages == 0. */
tsr_status tsr_pp_interleaved(int stages, int microbatches, int stage, tsr_pipe_action *actions,
                              int cap, int *n, void *ctx);
/* Zero bubble, ZB-H1 style: 1F1B's order with each backward split into its input part (B),
 * which the previous stage waits for, and its weight part (W), which nothing waits for. Stage s
 * runs W of microbatch j - s right after B of j (the rest at the end): the later stages, which
 * would idle in 1F1B's cool-down, fill it with held-back W's, and no stage holds more than pp
 * microbatches between F and W (1F1B's peak). With F = B = W the bubble falls from 1F1B's
 * (pp - 1) / (m + pp - 1) to (pp - 1) / (3 m + pp - 1) once m >= pp. */
tsr_status tsr_pp_zero_bubble(int stages, int microbatches, int stage, tsr_pipe_action *actions,
                              int cap, int *n, void *ctx);

#endif
