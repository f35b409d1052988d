/* Deliberately broken strategy plugins for the conformance suite's own tests: one source, built
 * once per defect (tests/conformance/CMakeLists.txt), each of which `tessera conform` must fail
 * for the right reason.
 *   BROKEN_RULE      a linear rule on dim `br` that claims Replicate output for input-split
 *                    matmuls, whose shards are really partial sums (the value is wrong);
 *   BROKEN_INIT      init dereferences a null pointer (the suite must survive the crash);
 *   BROKEN_DESC      struct_size smaller than an ABI 1.0 descriptor;
 *   BROKEN_BACKWARD  an add rule on dim `bb` whose forward is right and whose backward doubles
 *                    the gradient;
 *   BROKEN_HANG      an rmsnorm rule on dim `bh` whose compute never returns (the suite must
 *                    kill it at the timeout);
 *   BROKEN_OP        a rule for "conv2d", an op the model never calls: the registry refuses it,
 *                    so the plugin fails at load and the suite must say so with the registry's
 *                    message;
 *   BROKEN_MASK      a cross_entropy rule with use_mask on the logits, which are not a
 *                    parameter: refused by the registry likewise.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tessera/plugin.h"

#ifndef BROKEN_NAME
#error "BROKEN_NAME must name the plugin"
#endif
#ifndef BROKEN_DIM
#define BROKEN_DIM "bx"
#endif

static const char *const broken_dims[] = {BROKEN_DIM, NULL};

static tsr_status broken_init(const tsr_plugin_args *args, void **state) {
  (void)args;
#ifdef BROKEN_INIT
  /* volatile: the store must happen, as a real bug's would */
  volatile int *nowhere = NULL;
  *nowhere = 1;
#endif
  *state = NULL;
  return TSR_OK;
}

static void broken_fini(void *state) {
  (void)state;
}

#ifdef BROKEN_BACKWARD
/* out = a + b on the local shards: right. */
static tsr_status add_forward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                              const void *attrs, int noutputs, tsr_dtensor **out, void **saved,
                              void *ctx) {
  (void)dim, (void)ninputs, (void)attrs, (void)noutputs, (void)ctx;
  *saved = NULL;
  tsr_tensor *sum = NULL, *b = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_tensor_clone(in[0]->local, &sum), st);
  TSR_CHECK_GOTO(tsr_tensor_clone(in[1]->local, &b), st);
  float *s = tsr_tensor_data(sum);
  const float *pb = tsr_tensor_data(b);
  for (int64_t i = 0; i < tsr_tensor_numel(sum); i++) s[i] += pb[i];
  st = tsr_dtensor_from_local(r, in[0]->mesh, sum, in[0]->shape, in[0]->placements, &out[0]);
  sum = NULL;
cleanup:
  tsr_tensor_free(sum);
  tsr_tensor_free(b);
  return st;
}

/* d(a + b)/da = 1, but this hands back twice the output's gradient to both inputs. */
static tsr_status add_backward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                               const void *attrs, int noutputs, const tsr_dtensor *const *outs,
                               const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                               void *ctx) {
  (void)dim, (void)attrs, (void)noutputs, (void)outs, (void)saved, (void)ctx;
  for (int i = 0; i < ninputs; i++) {
    tsr_tensor *g = NULL;
    TSR_CHECK(tsr_tensor_clone(gout[0]->local, &g));
    float *p = tsr_tensor_data(g);
    for (int64_t k = 0; k < tsr_tensor_numel(g); k++) p[k] *= 2.0f;
    TSR_CHECK(
        tsr_dtensor_from_local(r, in[i]->mesh, g, in[i]->shape, gout[0]->placements, &gin[i]));
  }
  return TSR_OK;
}
#endif

#ifdef BROKEN_HANG
static tsr_status hang_forward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                               const void *attrs, int noutputs, tsr_dtensor **out, void **saved,
                               void *ctx) {
  (void)r, (void)dim, (void)ninputs, (void)in, (void)attrs, (void)noutputs, (void)out, (void)ctx;
  *saved = NULL;
  for (;;) sleep(1);
  return TSR_OK; /* not reached */
}

static tsr_status hang_backward(tsr_rank_t *r, int dim, int ninputs, const tsr_dtensor *const *in,
                                const void *attrs, int noutputs, const tsr_dtensor *const *outs,
                                const tsr_dtensor *const *gout, tsr_dtensor **gin, void *saved,
                                void *ctx) {
  (void)r, (void)dim, (void)ninputs, (void)in, (void)attrs, (void)noutputs, (void)outs;
  (void)gout, (void)gin, (void)saved, (void)ctx;
  return TSR_ENOTSUP;
}
#endif

static tsr_status broken_register(tsr_registry_t *reg, const tsr_plugin_args *args, void *state) {
  (void)args, (void)state;
#ifdef BROKEN_RULE
  tsr_op_rule rule = {.name = "broken_rule.linear.row",
                      .op = "linear",
                      .mesh_dim = BROKEN_DIM,
                      .ninputs = 2,
                      .inputs = {tsr_shard(2), tsr_shard(1)},
                      .noutputs = 1,
                      .outputs = {tsr_replicate()}, /* wrong: each shard is a partial sum */
                      .grads = {tsr_shard(2), tsr_shard(1)}};
  return tsr_registry_add_op_rule(reg, &rule);
#elif defined(BROKEN_BACKWARD)
  tsr_op_rule rule = {.name = "broken_backward.add",
                      .op = "add",
                      .mesh_dim = BROKEN_DIM,
                      .ninputs = 2,
                      .inputs = {tsr_shard(0), tsr_shard(0)},
                      .noutputs = 1,
                      .outputs = {tsr_shard(0)},
                      .grads = {tsr_shard(0), tsr_shard(0)},
                      .compute = add_forward,
                      .backward = add_backward};
  return tsr_registry_add_op_rule(reg, &rule);
#elif defined(BROKEN_HANG)
  tsr_op_rule rule = {.name = "broken_hang.rmsnorm",
                      .op = "rmsnorm",
                      .mesh_dim = BROKEN_DIM,
                      .ninputs = 2,
                      .inputs = {tsr_shard(0), tsr_replicate()},
                      .noutputs = 1,
                      .outputs = {tsr_shard(0)},
                      .grads = {tsr_shard(0), tsr_partial(TSR_REDUCE_SUM)},
                      .compute = hang_forward,
                      .backward = hang_backward};
  return tsr_registry_add_op_rule(reg, &rule);
#elif defined(BROKEN_OP)
  tsr_op_rule rule = {.name = "broken_op.conv2d",
                      .op = "conv2d", /* not in tsr_op_names() */
                      .mesh_dim = BROKEN_DIM,
                      .ninputs = 2,
                      .inputs = {tsr_shard(0), tsr_replicate()},
                      .noutputs = 1,
                      .outputs = {tsr_shard(0)},
                      .grads = {tsr_shard(0), tsr_partial(TSR_REDUCE_SUM)}};
  return tsr_registry_add_op_rule(reg, &rule);
#elif defined(BROKEN_MASK)
  /* gathers the logits before the loss: only a parameter (a weight) may be gathered by use_mask */
  tsr_op_rule rule = {.name = "broken_mask.cross_entropy",
                      .op = TSR_OP_CROSS_ENTROPY,
                      .mesh_dim = BROKEN_DIM,
                      .ninputs = 2,
                      .inputs = {tsr_shard(2), tsr_replicate()},
                      .noutputs = 1,
                      .outputs = {tsr_replicate()},
                      .grads = {tsr_shard(2), tsr_replicate()},
                      .use_mask = 1u << 0,
                      .use = {tsr_replicate()}};
  return tsr_registry_add_op_rule(reg, &rule);
#else
  (void)reg;
  return TSR_OK;
#endif
}

static const tsr_strategy broken_desc = {
    .abi_major = TSR_ABI_MAJOR,
    .abi_minor = TSR_ABI_MINOR,
#ifdef BROKEN_DESC
    .struct_size = 8,
#else
    .struct_size = sizeof(tsr_strategy),
#endif
    .name = BROKEN_NAME,
    .version = "0.0.1",
    .description = "deliberately broken plugin for the conformance suite's tests",
    .dims = broken_dims,
    .init = broken_init,
    .fini = broken_fini,
    .register_rules = broken_register,
};

TSR_PLUGIN_EXPORT const tsr_strategy *tsr_plugin_v1(uint32_t core_abi_major,
                                                    uint32_t core_abi_minor) {
  (void)core_abi_major, (void)core_abi_minor;
  return &broken_desc;
}
