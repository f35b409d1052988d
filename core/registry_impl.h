/* Private layout of the job registry, shared by the core files that fill and read it. */
#ifndef TESSERA_REGISTRY_IMPL_H
#define TESSERA_REGISTRY_IMPL_H

#include "tessera/registry.h"

/* A growable array of fixed-size records. */
typedef struct tsr_vec {
  void *items;
  int count;
  int cap;
} tsr_vec;

/* Appends a copy of `item` (item_size bytes). */
tsr_status tsr_vec_push(tsr_vec *v, const void *item, size_t item_size);
void tsr_vec_free(tsr_vec *v);

struct tsr_registry_t {
  tsr_vec redistribute; /* tsr_redistribute_rule, in registration order */
  void *rules;          /* other registries, owned by registry_rules.c; NULL until used */
};

/* Frees what registry_rules.c keeps in reg->rules. Defined there. */
void tsr_registry_rules_free(tsr_registry_t *reg);

#endif
