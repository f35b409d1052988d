/* The vocabulary plugins register against: the ops the model runs through sharding rules and
 * the module styles it applies. Registrations are checked against it (registry_rules.c), so a
 * rule for an op nothing calls, or a style for a module the model does not have, is refused when
 * it is registered instead of never firing. Adding an op or a style to the model means adding
 * it here, in the one list the registry, the model and the conformance suite share. */
#include <stdio.h>
#include <string.h>

#include "vocab_impl.h"

/* Inputs in the order the op takes them; `params` marks the inputs that are parameters, the
 * only ones a rule may gather for the op (use_mask): the rest are activations the op computes
 * with as they are placed. */
static const tsr_vocab_op ops[] = {
    {TSR_OP_EMBEDDING, 2, 1u << 1, "ids, weight"},
    {TSR_OP_RMSNORM, 2, 1u << 1, "x, weight"},
    {TSR_OP_LINEAR, 2, 1u << 1, "x, weight"},
    {TSR_OP_ROPE, 1, 0, "x"},
    {TSR_OP_SDPA, 3, 0, "q, k, v"},
    {TSR_OP_ADD, 2, 0, "a, b"},
    {TSR_OP_SWIGLU, 2, 0, "gate, up"},
    {TSR_OP_CROSS_ENTROPY, 2, 0, "logits, labels"},
    {TSR_OP_MOE_ROUTER, 1, 0, "logits"},
    {TSR_OP_MOE_EXPERTS, 4, 1u << 2 | 1u << 3, "x, combine, w13, w2"},
    {TSR_OP_MOE_AUX_LOSS, 1, 0, "stats"},
    {TSR_OP_ROPE_DOC, 2, 0, "x, pos"},
    {TSR_OP_SDPA_DOC, 4, 0, "q, k, v, seg"},
};

static const char *const op_names[] = {
    TSR_OP_EMBEDDING,    TSR_OP_RMSNORM,
    TSR_OP_LINEAR,       TSR_OP_ROPE,
    TSR_OP_SDPA,         TSR_OP_ADD,
    TSR_OP_SWIGLU,       TSR_OP_CROSS_ENTROPY,
    TSR_OP_MOE_ROUTER,   TSR_OP_MOE_EXPERTS,
    TSR_OP_MOE_AUX_LOSS, TSR_OP_ROPE_DOC,
    TSR_OP_SDPA_DOC,     NULL,
};

static const char *const style_names[] = {
    TSR_STYLE_EMBEDDING,  TSR_STYLE_COLUMN_LINEAR, TSR_STYLE_KV_LINEAR,
    TSR_STYLE_ROW_LINEAR, TSR_STYLE_RMSNORM,       TSR_STYLE_ATTENTION,
    TSR_STYLE_MLP,        TSR_STYLE_EXPERTS,       NULL,
};

const char *const *tsr_op_names(void) {
  return op_names;
}

const char *const *tsr_module_style_names(void) {
  return style_names;
}

const tsr_vocab_op *tsr_vocab_find_op(const char *name) {
  for (size_t i = 0; name && i < sizeof ops / sizeof ops[0]; i++)
    if (!strcmp(ops[i].name, name)) return &ops[i];
  return NULL;
}

bool tsr_vocab_has_style(const char *name) {
  for (int i = 0; name && style_names[i]; i++)
    if (!strcmp(style_names[i], name)) return true;
  return false;
}

const char *tsr_vocab_join(const char *const *names, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int i = 0; names[i] && o < len; i++)
    o += (size_t)snprintf(buf + o, len - o, "%s%s", i ? ", " : "", names[i]);
  return buf;
}
