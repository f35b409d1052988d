/* Private layout of the job registry, shared by the core files that fill and read it. */
#ifndef TESSERA_REGISTRY_IMPL_H
#define TESSERA_REGISTRY_IMPL_H

#include <stdint.h>

#include "tessera/registry.h"

/* A growable array of fixed-size records, each with the plugin that added it. */
typedef struct tsr_vec {
  void *items;
  int count;
  int cap;
  const char **owners; /* (cap) the breadcrumb's plugin when each item was pushed, or NULL */
  /* (cap) how many times the core used each item (tsr_vec_note), summed over every rank: ranks
   * are threads that share the registry, so the counts are atomic */
  _Atomic int64_t *uses;
} tsr_vec;

/* Appends a copy of `item` (item_size bytes), owned by the plugin whose callback is running (the
 * loader marks register_rules in the breadcrumb). */
tsr_status tsr_vec_push(tsr_vec *v, const void *item, size_t item_size);
void tsr_vec_free(tsr_vec *v);
/* The owner of item i, or of the item at `item` (NULL when it is not one of v's). */
const char *tsr_vec_owner(const tsr_vec *v, int i);
const char *tsr_vec_owner_of(const tsr_vec *v, const void *item, size_t item_size);
/* Counts one use of item i, or of the item at `item`; anything else is ignored. */
void tsr_vec_note(const tsr_vec *v, int i);
void tsr_vec_note_item(const tsr_vec *v, const void *item, size_t item_size);
int64_t tsr_vec_uses(const tsr_vec *v, int i);

struct tsr_registry_t {
  tsr_vec redistribute; /* tsr_redistribute_rule, in registration order */
  void *rules;          /* other registries, owned by registry_rules.c; NULL until used */
};

/* Frees what registry_rules.c keeps in reg->rules. Defined there. */
void tsr_registry_rules_free(tsr_registry_t *reg);

/* The plugin that registered an entry, for the breadcrumb while its callbacks run; NULL when it
 * was registered outside a plugin's register_rules (tests, programs) or is not the registry's. */
const char *tsr_registry_redistribute_owner(const tsr_registry_t *reg, int i);
const char *tsr_registry_op_rule_owner(const tsr_registry_t *reg, const tsr_op_rule *rule);
const char *tsr_registry_grad_hook_owner(const tsr_registry_t *reg, int i);
const char *tsr_registry_rank_state_owner(const tsr_registry_t *reg, int i);

/* One use of a registration: the planner chose op rule `rule` for an op (ops_plan.c), a
 * transition was applied (redistribute.c). Read by tsr_registry_*_uses. */
void tsr_registry_note_op_rule(const tsr_registry_t *reg, const tsr_op_rule *rule);
void tsr_registry_note_redistribute(const tsr_registry_t *reg, int i);

#endif
