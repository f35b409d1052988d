/* Shared by the tests that run the Llama model on a mesh and compare it with the 1-rank run:
 * batches, gathering results past the rank that made them, element-wise comparison, and one
 * training step. Test code only: failures go through cmocka. (Plugins load from a job text with
 * tsr_plugin_job_load_string, as `tessera run` loads them.) */
#ifndef TESSERA_TEST_HARNESS_H
#define TESSERA_TEST_HARNESS_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/autograd.h"
#include "tessera/config.h"
#include "tessera/dtensor.h"
#include "tessera/plugin.h"
#include "tessera/registry.h"

#include "llama.h"

/* The small Llama the model-on-a-mesh tests run unless they need another: vocabulary 19 and
 * intermediate 20 split unevenly over 2, 3 and 4 ranks; 4 heads over 2 kv heads; 2 layers. */
extern const tsr_llama_config tsr_test_llama;

/* A mesh of one rank with one dim, "dp" (NULL when out of memory); free with tsr_mesh_free. */
tsr_mesh_t *tsr_test_one_rank_mesh(void);

/* A registry with the data layout and pipeline stages the in-tree plugins declare (batch split
 * over dp, dp_shard and dp_replicate, sequence split over ring_cp and ulysses_cp, stages over
 * pp) and no rule: for tests that run the model on those dims through the core's generic rules
 * alone. Made once, shared by every rank; never freed. */
const tsr_registry_t *tsr_test_layout(void);

/* Gathers x to a full tensor (collective over x's mesh, or over `job_mesh` when x lives on one
 * pipeline stage of it: the move to the whole mesh broadcasts along pp). When `keep`, *out is a
 * copy that does not come from the rank's allocator, so it outlives the rank; otherwise *out is
 * untouched. */
tsr_status tsr_test_keep_full(tsr_rank_t *r, const tsr_mesh_t *job_mesh, const tsr_dtensor *x,
                              bool keep, tsr_tensor **out);

/* Fails the test at the first element with |a - b| > atol + rtol |b|, naming `what`, `index`
 * and the element; `a` is the mesh run's, `b` the reference's. */
void tsr_test_expect_close(const tsr_tensor *a, const tsr_tensor *b, float rtol, float atol,
                           const char *what, int index);

/* What one training step produced, as full tensors rank 0 keeps (NULL on the other ranks). */
#define TSR_TEST_MAX_PARAMS 64
typedef struct tsr_test_step_result {
  tsr_tensor *logits; /* (B, L, V) */
  tsr_tensor *loss;   /* () */
  int nparams;
  tsr_tensor *grads[TSR_TEST_MAX_PARAMS]; /* each parameter's gradient, before any clipping */
  tsr_tensor *after[TSR_TEST_MAX_PARAMS]; /* each parameter after one AdamW step */
} tsr_test_step_result;

/* Called on every rank once the gradients are resolved, before the gathers that keep them move
 * bytes of their own: where a test reads its byte counters. */
typedef void (*tsr_test_step_hook)(tsr_rank_t *r, void *arg);

/* One training step of `model` on (ids, labels), collective over the model's mesh `m`: forward,
 * backward, every gradient resolved to its parameter's placements, `hook` (may be NULL), then
 * one AdamW step at `lr` (betas 0.9 / 0.95, eps 1e-8, weight decay 0.1). Rank 0 keeps the
 * results in *res. A failure inside forward or backward is returned with *in_model = true (the
 * tests that expect one inspect it); any other failure with *in_model = false. */
tsr_status tsr_test_step(tsr_rank_t *r, const tsr_mesh_t *m, tsr_llama_t *model, tsr_var *ids,
                         tsr_var *labels, double lr, tsr_test_step_hook hook, void *hook_arg,
                         tsr_test_step_result *res, bool *in_model);
void tsr_test_step_result_free(tsr_test_step_result *res);

/* Every tensor of `mesh` against `one` with tsr_test_expect_close. */
void tsr_test_step_expect_close(const tsr_test_step_result *mesh, const tsr_test_step_result *one,
                                float rtol, float atol);

#endif
