/* Activation checkpointing of the Llama model's layers (docs/training.md).
 *
 * Selective checkpointing is the tape's (tsr_tape_set_selective): the layer runs as it is with
 * the tape selective, which releases the element-wise ops' outputs at the layer's end. Full
 * checkpointing is this file's:
 *
 * A checkpointed layer runs its forward on a tape that records nothing, keeps its input and
 * outputs, and stands on the tape as one node whose backward runs the layer again on a tape of
 * its own, recording, and differentiates that. The same ops on the same values give the same
 * bits, and a gathered weight (FSDP) is gathered again by the recomputed op, as its backward
 * would have. The node lists the layer's weights among its inputs, so that the gradient hooks
 * (dp's bucketed sync) hear of them from the outer tape; the inner one fires none. */
#include <stdlib.h>

#include "llama_impl.h"
#include "tessera/ops.h"

typedef struct ckpt_saved {
  tsr_llama_t *m;
  int layer;
} ckpt_saved;

/* The layer's input and weights, as the node's inputs: *n of them. */
static void ckpt_inputs(const llama_layer *y, tsr_var *h, tsr_var **in, int *n) {
  tsr_var *all[] = {h,
                    y->input_layernorm,
                    y->q_proj,
                    y->k_proj,
                    y->v_proj,
                    y->o_proj,
                    y->post_attention_layernorm,
                    y->gate_proj,
                    y->up_proj,
                    y->down_proj,
                    y->router,
                    y->w13,
                    y->w2};
  *n = 0;
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (all[i]) in[(*n)++] = all[i];
}

static tsr_status ckpt_backward(tsr_tape_t *t, tsr_var *const *in, int nin, tsr_var *const *out,
                                int nout, void *saved) {
  ckpt_saved *s = saved;
  tsr_rank_t *r = tsr_tape_rank(t);
  tsr_tape_t *sub = NULL;
  tsr_var *hx = NULL, *o = NULL, *stats = NULL;
  tsr_dtensor *copy = NULL, *g = NULL;
  tsr_status st = TSR_OK;
  TSR_CHECK_GOTO(tsr_tape_new(r, &sub), st);
  tsr_tape_set_hooks(sub, false);
  /* a leaf copy of the layer's input: its gradient is what the node passes back */
  TSR_CHECK_GOTO(tsr_dtensor_clone(r, in[0]->value, &copy), st);
  TSR_CHECK_GOTO(tsr_var_new_leaf(copy, true, NULL, &hx), st);
  copy = NULL;
  TSR_CHECK_GOTO(llama_layer_ops(s->m, sub, &s->m->layers[s->layer], hx, &stats, &o), st);
  /* the router stats' gradient first, then backward from the output with its own */
  if (nout > 1 && out[1]->grad && stats) {
    TSR_CHECK_GOTO(tsr_dtensor_clone(r, out[1]->grad, &g), st);
    st = tsr_var_accumulate_grad(sub, stats, g);
    g = NULL;
    TSR_CHECK_GOTO(st, st);
  }
  tsr_var *from = out[0]->grad ? o : stats;
  const tsr_dtensor *seed = out[0]->grad ? out[0]->grad : NULL;
  if (seed) {
    TSR_CHECK_GOTO(tsr_dtensor_clone(r, seed, &g), st);
    st = tsr_tape_backward_with(sub, from, g);
    g = NULL;
  } else if (from) {
    /* only the stats were reached: their gradient is in place, run backward from them */
    tsr_dtensor *again = from->grad;
    from->grad = NULL;
    st = tsr_tape_backward_with(sub, from, again);
  }
  TSR_CHECK_GOTO(st, st);
  if (hx->grad) {
    st = tsr_var_accumulate_grad(t, in[0], hx->grad);
    hx->grad = NULL;
  }
cleanup:
  tsr_dtensor_free(copy);
  tsr_dtensor_free(g);
  tsr_tape_free(sub);
  tsr_var_free(hx);
  return st;
}

/* Runs layer `l` checkpointed: the layer's activations are freed at once. */
static tsr_status ckpt_layer(tsr_llama_t *m, tsr_tape_t *t, int l, tsr_var *h, tsr_var **stats,
                             tsr_var **out) {
  tsr_rank_t *r = tsr_tape_rank(t);
  const llama_layer *y = &m->layers[l];
  tsr_tape_t *sub = NULL;
  tsr_var *o = NULL, *s = NULL, *outs[2] = {NULL, NULL}, *in[16];
  tsr_dtensor *copy = NULL;
  ckpt_saved *saved = NULL;
  tsr_status st = TSR_OK;
  int nin = 0;
  TSR_CHECK_GOTO(tsr_tape_new(r, &sub), st);
  tsr_tape_set_recording(sub, false);
  TSR_CHECK_GOTO(llama_layer_ops(m, sub, y, h, &s, &o), st);
  for (int k = 0; k < (s ? 2 : 1); k++) {
    TSR_CHECK_GOTO(tsr_dtensor_clone(r, k ? s->value : o->value, &copy), st);
    TSR_CHECK_GOTO(tsr_tape_new_var(t, copy, &outs[k]), st);
    copy = NULL;
  }
  saved = malloc(sizeof *saved);
  if (!saved) {
    st = TSR_ERROR(TSR_ENOMEM, "out of memory checkpointing layer %d", l);
    goto cleanup;
  }
  *saved = (ckpt_saved){m, l};
  ckpt_inputs(y, h, in, &nin);
  st = tsr_tape_record(t, "checkpoint", in, nin, outs, s ? 2 : 1, ckpt_backward, saved, free);
  saved = NULL;
  TSR_CHECK_GOTO(st, st);
  *out = outs[0];
  if (outs[1]) {
    if (*stats)
      TSR_CHECK_GOTO(tsr_op_add(t, *stats, outs[1], stats), st);
    else
      *stats = outs[1];
  }
cleanup:
  free(saved);
  tsr_dtensor_free(copy);
  tsr_tape_free(sub);
  return st;
}

tsr_status llama_decoder_layer(tsr_llama_t *m, tsr_tape_t *t, int l, tsr_var *h, tsr_var **stats,
                               tsr_var **out) {
  int every = m->cfg.checkpoint_every;
  bool chosen = every > 0 && (l + 1) % every == 0 && tsr_tape_recording(t);
  if (chosen && !m->cfg.checkpoint_selective) return ckpt_layer(m, t, l, h, stats, out);
  if (!chosen || tsr_tape_selective(t)) return llama_layer_ops(m, t, &m->layers[l], h, stats, out);
  /* selective: the layer's output is an add's, never released, so the next layer reads it */
  tsr_tape_set_selective(t, true);
  tsr_status st = llama_layer_ops(m, t, &m->layers[l], h, stats, out);
  tsr_tape_set_selective(t, false);
  return st;
}
