/* The tape's private layout, shared by autograd.c and tape_recompute.c. */
#ifndef TSR_TAPE_IMPL_H
#define TSR_TAPE_IMPL_H

#include "ops_impl.h"
#include "tessera/autograd.h"

#define TAPE_MAX_IO 16 /* inputs or outputs of one node (a recomputed layer and its weights) */

typedef struct tape_node {
  const char *op;
  tsr_var *inputs[TAPE_MAX_IO]; /* (ninputs) borrowed */
  int ninputs;
  tsr_var *outputs[TAPE_MAX_IO]; /* (noutputs) borrowed; owned by the tape's var list */
  int noutputs;
  tsr_backward_fn backward;
  void *saved;
  void (*free_saved)(void *);
  tsr_var *remat[TAPE_MAX_IO]; /* input j transient: the var its value is rebuilt from */
  /* selective activation checkpointing (tape_recompute.c) */
  tsr_recompute_fn recompute; /* optional: makes output 0's local again from the inputs */
  bool dropped;               /* output 0's local is released until something reads it */
  bool differentiated;        /* its backward has run: nothing reads output 0 again */
} tape_node;

/* A transient var not yet read by a recorded node (tsr_tape_set_transient). */
typedef struct transient {
  tsr_var *v, *src;
} transient;

/* A backward split by tsr_tape_backward_input, waiting for tsr_tape_backward_weight. */
typedef enum split_kind {
  SPLIT_NONE = 0,
  SPLIT_WEIGHT_LATER = 1,
  SPLIT_WHOLE_LATER = 2
} split_kind;

typedef struct split_state {
  int nnodes;          /* the tape's node count when it was split */
  unsigned char *act;  /* (nnodes) the node's outputs lead to one of the inputs */
  unsigned char *kind; /* (nnodes) split_kind */
  tsr_dtensor **grads; /* (nnodes * TAPE_MAX_IO) kept output gradients of WEIGHT_LATER */
  tsr_var **inputs;    /* (ninputs) borrowed */
  int ninputs, ndeferred;
} split_state;

struct tsr_tape_t {
  tsr_rank_t *r;
  split_state *split; /* NULL unless a split backward is pending */
  bool recording;
  bool no_hooks;    /* tsr_tape_set_hooks(t, false): a tape nested in another's backward */
  tape_node *nodes; /* (nnodes) in execution order */
  int nnodes, node_cap;
  tsr_var **vars; /* (nvars) every var the tape made */
  int nvars, var_cap;
  transient *pending; /* (npending) */
  int npending, pending_cap;
  int selective_from; /* >= 0: tsr_tape_set_selective is on since this node; -1: off */
};

/* Redistributes src's value to v's placements into v's released local tensor (a transient). */
tsr_status tsr_tape_rebuild_local(tsr_tape_t *t, tsr_var *v, const tsr_var *src);
/* Releases v's local tensor (the DTensor's metadata stays). */
void tsr_tape_drop_local(tsr_var *v);
/* Gathers the node's released transient inputs again (tsr_tape_set_transient), for a read. */
tsr_status tsr_tape_rebuild_transients(tsr_tape_t *t, const tape_node *node);
/* Releases the node's transient inputs again. */
void tsr_tape_drop_transients(const tape_node *node);

/* Makes the local tensors of the node's inputs that selective checkpointing released again. */
tsr_status tsr_tape_recompute_inputs(tsr_tape_t *t, const tape_node *node);
/* After node's backward: releases what it recomputed and nothing reads any more. */
void tsr_tape_recompute_release(tsr_tape_t *t, tape_node *node);

#endif
