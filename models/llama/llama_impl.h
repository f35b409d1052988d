/* The Llama model's structs, shared by its files (llama.c, llama_ckpt.c); not part of any API. */
#ifndef TESSERA_LLAMA_IMPL_H
#define TESSERA_LLAMA_IMPL_H

#include "llama.h"

#define NAME_LEN 96

/* One decoder layer's parameters (vars owned by the model). */
typedef struct llama_layer {
  tsr_var *input_layernorm;          /* (C) */
  tsr_var *q_proj;                   /* (H*D, C) */
  tsr_var *k_proj;                   /* (Hkv*D, C) */
  tsr_var *v_proj;                   /* (Hkv*D, C) */
  tsr_var *o_proj;                   /* (C, H*D) */
  tsr_var *post_attention_layernorm; /* (C) */
  tsr_var *gate_proj;                /* (I, C) */
  tsr_var *up_proj;                  /* (I, C) */
  tsr_var *down_proj;                /* (C, I) */
  /* an MoE layer has these instead of gate_proj, up_proj and down_proj */
  tsr_var *router; /* (E, C) block_sparse_moe.gate */
  tsr_var *w13;    /* (E, 2I, C) each expert's w1 over its w3 */
  tsr_var *w2;     /* (E, C, I) */
} llama_layer;

struct tsr_llama_t {
  tsr_rank_t *r;
  const tsr_mesh_t *mesh; /* the job's mesh */
  tsr_mesh_t **stages;    /* (npp) unbind(mesh, stage dim): one mesh per stage coordinate */
  int npp;
  int chunks;       /* stages per pp coordinate (virtual stages); stage s is on stages[s % npp] */
  int nstages;      /* npp * chunks */
  int *layer_stage; /* (num_hidden_layers) */
  tsr_llama_config cfg;
  int head_dim;
  tsr_var *embed_tokens; /* (V, C) */
  llama_layer *layers;   /* (num_hidden_layers) */
  tsr_var *norm;         /* (C) */
  tsr_var *lm_head;      /* (V, C); NULL when tied to embed_tokens */
  /* (V, C) tied over several stages: the last stage's replica of embed_tokens that its lm_head
   * uses, so that no weight crosses stages per microbatch; not among params (one name) */
  tsr_var *tied_head;
  int nparams;
  tsr_var **params;        /* (nparams) in HF order, pointing at the fields above */
  char (*names)[NAME_LEN]; /* (nparams) */
  tsr_tensor *storage;     /* every parameter's local tensor is a view into this */
  /* document masking: the (B, L) i32 segment ids and positions of the forward running now, on
   * its stage's mesh (tsr_llama_set_documents), and the host ones of a pipeline step
   * (tsr_llama_pipe_documents); NULL: causal */
  tsr_var *doc_seg, *doc_pos;
  const int32_t *doc_host_seg, *doc_host_pos; /* (rows, seq) aligned with the step's ids */
};

/* The decoder layer's ops on `h`, adding an MoE layer's router stats to *stats (llama.c). */
tsr_status llama_layer_ops(tsr_llama_t *m, tsr_tape_t *t, const llama_layer *y, tsr_var *h,
                           tsr_var **stats, tsr_var **out);
/* Layer l, checkpointed when the config says so (llama_ckpt.c). */
tsr_status llama_decoder_layer(tsr_llama_t *m, tsr_tape_t *t, int l, tsr_var *h, tsr_var **stats,
                               tsr_var **out);

#endif
