/* The job registry: what loaded plugins added to the core. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "registry_impl.h"
#include "tessera/breadcrumb.h"

tsr_status tsr_vec_push(tsr_vec *v, const void *item, size_t item_size) {
  if (v->count == v->cap) {
    int cap = v->cap ? 2 * v->cap : 8;
    void *p = realloc(v->items, (size_t)cap * item_size);
    if (!p) return TSR_ERROR(TSR_ENOMEM, "out of memory growing a registry");
    v->items = p;
    const char **o = realloc(v->owners, (size_t)cap * sizeof *o);
    if (!o) return TSR_ERROR(TSR_ENOMEM, "out of memory growing a registry");
    v->owners = o;
    v->cap = cap;
  }
  memcpy((char *)v->items + (size_t)v->count * item_size, item, item_size);
  v->owners[v->count] = tsr_breadcrumb_here()->plugin;
  v->count++;
  return TSR_OK;
}

void tsr_vec_free(tsr_vec *v) {
  free(v->items);
  free(v->owners);
  memset(v, 0, sizeof *v);
}

const char *tsr_vec_owner(const tsr_vec *v, int i) {
  return v && i >= 0 && i < v->count ? v->owners[i] : NULL;
}

const char *tsr_vec_owner_of(const tsr_vec *v, const void *item, size_t item_size) {
  if (!v || !v->count) return NULL;
  uintptr_t at = (uintptr_t)item, base = (uintptr_t)v->items;
  if (at < base || (at - base) % item_size) return NULL;
  uintptr_t k = (at - base) / item_size;
  return k < (uintptr_t)v->count ? v->owners[k] : NULL;
}

tsr_status tsr_registry_new(tsr_registry_t **out) {
  *out = calloc(1, sizeof **out);
  return *out ? TSR_OK : TSR_ERROR(TSR_ENOMEM, "out of memory allocating a registry");
}

void tsr_registry_free(tsr_registry_t *reg) {
  if (!reg) return;
  tsr_registry_rules_free(reg);
  tsr_vec_free(&reg->redistribute);
  free(reg);
}

tsr_status tsr_registry_add_redistribute(tsr_registry_t *reg, const tsr_redistribute_rule *rule) {
  if (!rule || !rule->name || !rule->match || !rule->apply)
    return TSR_ERROR(TSR_EINVAL, "redistribute rule '%s' needs a name, match and apply",
                     rule && rule->name ? rule->name : "(unnamed)");
  return tsr_vec_push(&reg->redistribute, rule, sizeof *rule);
}

int tsr_registry_redistribute_count(const tsr_registry_t *reg) {
  return reg ? reg->redistribute.count : 0;
}

const char *tsr_registry_redistribute_owner(const tsr_registry_t *reg, int i) {
  return reg ? tsr_vec_owner(&reg->redistribute, i) : NULL;
}

const tsr_redistribute_rule *tsr_registry_redistribute_at(const tsr_registry_t *reg, int i) {
  return &((const tsr_redistribute_rule *)reg->redistribute.items)[i];
}
