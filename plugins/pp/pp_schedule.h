/* The pp plugin's schedule builders (tsr_schedule_fn), shared by the plugin and its tests. */
#ifndef TESSERA_PP_SCHEDULE_H
#define TESSERA_PP_SCHEDULE_H

#include "tessera/registry.h"

/* All forwards, then all backwards in reverse microbatch order. */
tsr_status tsr_pp_gpipe(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                        int *n, void *ctx);
/* One forward, one backward: stages - stage - 1 warm-up forwards, then alternating, then the
 * remaining backwards. */
tsr_status tsr_pp_1f1b(int stages, int microbatches, int stage, tsr_pipe_action *actions, int cap,
                       int *n, void *ctx);

#endif
