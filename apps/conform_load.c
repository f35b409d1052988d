/* `tessera conform`, level L0: loading the plugin and its ABI.
 *
 * The tests read the descriptor themselves, field by field, so that each defect is its own failed
 * test with the field named; the loader's own verdict (tsr_plugin_probe) is one more test.
 */
#include <ctype.h>
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "conform.h"

#define DESC_OR_FAIL(d)                                                                            \
  void *handle_;                                                                                   \
  const tsr_strategy *d = cf_open_desc(p, &handle_, msg, len);                                     \
  if (!d) return CF_FAIL

static cf_result l0_open(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  void *h = dlopen(p->path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char *e = dlerror();
    return cf_say(msg, len, CF_FAIL, "dlopen(RTLD_NOW) failed: %s", e ? e : "unknown error");
  }
  return CF_PASS;
}

static cf_result l0_entry(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  void *sym = dlsym(handle_, TSR_PLUGIN_SYMBOL);
  tsr_plugin_entry_fn entry;
  memcpy(&entry, &sym, sizeof entry);
  if (entry(TSR_ABI_MAJOR, TSR_ABI_MINOR) != d)
    return cf_say(msg, len, CF_FAIL,
                  "%s returned another descriptor on the second call; return a pointer to one "
                  "static descriptor",
                  TSR_PLUGIN_SYMBOL);
  return CF_PASS;
}

static cf_result l0_abi(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (d->abi_major != TSR_ABI_MAJOR)
    return cf_say(msg, len, CF_FAIL,
                  "abi_major is %u, the core's is %d (plugin ABI %u.%u, core ABI %d.%d); rebuild "
                  "against this tessera's include/tessera",
                  d->abi_major, TSR_ABI_MAJOR, d->abi_major, d->abi_minor, TSR_ABI_MAJOR,
                  TSR_ABI_MINOR);
  if (d->abi_minor > TSR_ABI_MINOR)
    return cf_say(msg, len, CF_PASS, "built for ABI %u.%u, newer than the core's %d.%d",
                  d->abi_major, d->abi_minor, TSR_ABI_MAJOR, TSR_ABI_MINOR);
  return CF_PASS;
}

static cf_result l0_struct_size(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (d->struct_size < TSR_STRATEGY_SIZE_1_0)
    return cf_say(msg, len, CF_FAIL,
                  "struct_size is %u, less than the %zu bytes of an ABI %d.0 descriptor; set "
                  "struct_size = sizeof(tsr_strategy)",
                  d->struct_size, (size_t)TSR_STRATEGY_SIZE_1_0, TSR_ABI_MAJOR);
  return CF_PASS;
}

static cf_result l0_reserved(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (d->abi_major != TSR_ABI_MAJOR || d->struct_size < TSR_STRATEGY_SIZE_1_0)
    return cf_say(msg, len, CF_FAIL, "not read: the ABI or struct_size check fails first");
  if (d->flags) return cf_say(msg, len, CF_FAIL, "flags = 0x%x; ABI 1.0 defines none", d->flags);
  for (int i = 0; i < TSR_STRATEGY_RESERVED; i++)
    if (d->reserved[i])
      return cf_say(msg, len, CF_FAIL, "reserved[%d] is set; every reserved slot must be zero", i);
  return CF_PASS;
}

static cf_result l0_name(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (!d->name) return cf_say(msg, len, CF_FAIL, "name is NULL");
  if (!cf_ident(d->name, TSR_MAX_NAME))
    return cf_say(msg, len, CF_FAIL, "name '%s' is not an identifier of at most %d characters",
                  d->name, TSR_MAX_NAME - 1);
  if (!p->name[0])
    return cf_say(msg, len, CF_FAIL,
                  "the file %s is not named " TSR_PLUGIN_PREFIX "%s" TSR_PLUGIN_SUFFIX
                  ", so no job can load it",
                  p->path, d->name);
  if (strcmp(d->name, p->name))
    return cf_say(msg, len, CF_FAIL, "descriptor name '%s' differs from the file's name '%s'",
                  d->name, p->name);
  return CF_PASS;
}

static cf_result l0_version(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  if (!d->version || !d->version[0])
    return cf_say(msg, len, CF_FAIL, "version is %s; set it, e.g. \"0.1.0\"",
                  d->version ? "empty" : "NULL");
  const char *s = d->version;
  int parts = 0;
  while (isdigit((unsigned char)*s)) {
    while (isdigit((unsigned char)*s)) s++;
    parts++;
    if (*s != '.') break;
    s++;
  }
  if (parts < 2)
    return cf_say(msg, len, CF_FAIL, "version '%s' does not start with MAJOR.MINOR[.PATCH]",
                  d->version);
  return CF_PASS;
}

static cf_result l0_callbacks(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  const char *missing = !d->init             ? "init"
                        : !d->fini           ? "fini"
                        : !d->register_rules ? "register_rules"
                                             : NULL;
  if (missing) return cf_say(msg, len, CF_FAIL, "mandatory callback '%s' is NULL", missing);
  return CF_PASS;
}

static cf_result l0_dims(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  int n = 0;
  for (int i = 0; d->dims && d->dims[i]; i++, n++) {
    if (!cf_ident(d->dims[i], TSR_MAX_DIM_NAME))
      return cf_say(msg, len, CF_FAIL,
                    "dims[%d] '%s' is not an identifier of at most %d "
                    "characters",
                    i, d->dims[i], TSR_MAX_DIM_NAME - 1);
    for (int k = 0; k < i; k++)
      if (!strcmp(tsr_mesh_canonical_name(d->dims[k]), tsr_mesh_canonical_name(d->dims[i])))
        return cf_say(msg, len, CF_FAIL, "dims lists '%s' twice", d->dims[i]);
    if (i >= TSR_MAX_MESH_DIMS)
      return cf_say(msg, len, CF_FAIL, "more than %d dims", TSR_MAX_MESH_DIMS);
  }
  for (int i = 0; d->required && d->required[i]; i++) {
    if (!cf_ident(d->required[i], TSR_MAX_NAME))
      return cf_say(msg, len, CF_FAIL, "required[%d] '%s' is not a plugin name", i, d->required[i]);
    if (d->name && !strcmp(d->required[i], d->name))
      return cf_say(msg, len, CF_FAIL, "requires itself");
  }
  if (!n && !(d->required && d->required[0]))
    return cf_say(msg, len, CF_PASS,
                  "owns no dim and requires no plugin: it can only add to "
                  "dims of size 1");
  return CF_PASS;
}

static cf_result l0_keys(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  DESC_OR_FAIL(d);
  int n = 0;
  for (int i = 0; d->keys && d->keys[i].name; i++, n++) {
    const tsr_key_spec *k = &d->keys[i];
    if (i >= TSR_MAX_ENTRIES)
      return cf_say(msg, len, CF_FAIL, "more than %d keys", TSR_MAX_ENTRIES);
    if (!cf_ident(k->name, TSR_MAX_NAME))
      return cf_say(msg, len, CF_FAIL, "keys[%d] '%s' is not an identifier", i, k->name);
    for (int j = 0; j < i; j++)
      if (!strcmp(d->keys[j].name, k->name))
        return cf_say(msg, len, CF_FAIL, "key '%s' is declared twice", k->name);
    if ((unsigned)k->type > TSR_KEY_INTS)
      return cf_say(msg, len, CF_FAIL, "key '%s' has unknown type %d", k->name, (int)k->type);
    if (k->type == TSR_KEY_ENUM && (!k->choices || !k->choices[0]))
      return cf_say(msg, len, CF_FAIL, "enum key '%s' has no choices", k->name);
    if ((k->type == TSR_KEY_INT || k->type == TSR_KEY_FLOAT || k->type == TSR_KEY_INTS) &&
        !(k->min <= k->max))
      return cf_say(msg, len, CF_FAIL, "key '%s' has min %g > max %g", k->name, k->min, k->max);
    if (!k->doc || !k->doc[0])
      return cf_say(msg, len, CF_FAIL, "key '%s' has no doc line (shown by tessera plugins)",
                    k->name);
    if (k->default_value && tsr_key_check(k, k->default_value) != TSR_OK)
      return cf_say(msg, len, CF_FAIL, "key '%s': its default '%s' fails its own check: %s",
                    k->name, k->default_value, tsr_last_error());
  }
  if (!n) return cf_say(msg, len, CF_NOTSUP, "declares no [strategy.%s] keys", p->name);
  return CF_PASS;
}

static cf_result l0_loader(const cf_plugin *p, const cf_test *t, char *msg, size_t len) {
  (void)t;
  tsr_plugin_report rep;
  if (tsr_plugin_probe(p->path, NULL, &rep) != TSR_OK)
    return cf_say(msg, len, CF_FAIL, "the loader's %s check: %s", tsr_plugin_check_name(rep.failed),
                  rep.message);
  return CF_PASS;
}

void cf_add_load_tests(const cf_plugin *p) {
  (void)p;
  cf_add_test("L0.open", 0, l0_open, -1, 0, NULL);
  cf_add_test("L0.entry", 0, l0_entry, -1, 0, NULL);
  cf_add_test("L0.abi_version", 0, l0_abi, -1, 0, NULL);
  cf_add_test("L0.struct_size", 0, l0_struct_size, -1, 0, NULL);
  cf_add_test("L0.reserved", 0, l0_reserved, -1, 0, NULL);
  cf_add_test("L0.name", 0, l0_name, -1, 0, NULL);
  cf_add_test("L0.version", 0, l0_version, -1, 0, NULL);
  cf_add_test("L0.callbacks", 0, l0_callbacks, -1, 0, NULL);
  cf_add_test("L0.dims", 0, l0_dims, -1, 0, NULL);
  cf_add_test("L0.keys", 0, l0_keys, -1, 0, NULL);
  cf_add_test("L0.loader", 0, l0_loader, -1, 0, NULL);
}
