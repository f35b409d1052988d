/* The job registry: what loaded plugins added to the core. */
#include <stdatomic.h>
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
    _Atomic int64_t *u = realloc(v->uses, (size_t)cap * sizeof *u);
    if (!u) return TSR_ERROR(TSR_ENOMEM, "out of memory growing a registry");
    v->uses = u;
    v->cap = cap;
  }
  memcpy((char *)v->items + (size_t)v->count * item_size, item, item_size);
  v->owners[v->count] = tsr_breadcrumb_here()->plugin;
  atomic_init(&v->uses[v->count], 0);
  v->count++;
  return TSR_OK;
}

void tsr_vec_free(tsr_vec *v) {
  free(v->items);
  free(v->owners);
  free(v->uses);
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

void tsr_vec_note(const tsr_vec *v, int i) {
  if (v && i >= 0 && i < v->count) atomic_fetch_add_explicit(&v->uses[i], 1, memory_order_relaxed);
}

void tsr_vec_note_item(const tsr_vec *v, const void *item, size_t item_size) {
  if (!v || !v->count) return;
  uintptr_t at = (uintptr_t)item, base = (uintptr_t)v->items;
  if (at < base || (at - base) % item_size) return;
  tsr_vec_note(v, (int)((at - base) / item_size));
}

int64_t tsr_vec_uses(const tsr_vec *v, int i) {
  return v && i >= 0 && i < v->count ? atomic_load(&v->uses[i]) : 0;
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

void tsr_registry_note_redistribute(const tsr_registry_t *reg, int i) {
  if (reg) tsr_vec_note(&reg->redistribute, i);
}

int64_t tsr_registry_redistribute_uses(const tsr_registry_t *reg, int i) {
  return reg ? tsr_vec_uses(&reg->redistribute, i) : 0;
}

const tsr_redistribute_rule *tsr_registry_redistribute_at(const tsr_registry_t *reg, int i) {
  return &((const tsr_redistribute_rule *)reg->redistribute.items)[i];
}
