/* Reading the parsed job by name rather than by struct field. Plugins go through these so that
 * a later plugin ABI major can change tsr_config's layout without breaking their source; the
 * core's own code may still read the struct. */
#include <stdio.h>
#include <string.h>

#include "config_internal.h"

int tsr_config_mesh_ndim(const tsr_config *cfg) {
  return cfg->mesh.ndim;
}

const char *tsr_config_mesh_dim(const tsr_config *cfg, int i) {
  return i >= 0 && i < cfg->mesh.ndim ? cfg->mesh.names[i] : NULL;
}

int tsr_config_mesh_index(const tsr_config *cfg, const char *dim) {
  for (int i = 0; i < cfg->mesh.ndim; i++)
    if (!strcmp(cfg->mesh.names[i], dim)) return i;
  return -1;
}

int tsr_config_mesh_size(const tsr_config *cfg, const char *dim) {
  int i = tsr_config_mesh_index(cfg, dim);
  /* Between tsr_config_set and tsr_config_check_sets dims and shape may differ in length; a dim
   * without a size then counts as absent rather than reading past the sizes given. */
  return i >= 0 && i < cfg->mesh.nshape ? cfg->mesh.shape[i] : 1;
}

int64_t tsr_config_mesh_world(const tsr_config *cfg) {
  return cfg->mesh.world;
}

bool tsr_config_loads_plugin(const tsr_config *cfg, const char *plugin) {
  for (int i = 0; i < cfg->plugins.nload; i++)
    if (!strcmp(cfg->plugins.load[i], plugin)) return true;
  return false;
}

/* The getter that reads a key of this storage, for the message that points a caller to it. */
static const char *getter_for(tsr_store_kind store) {
  switch (store) {
    case TSR_STORE_I64:
    case TSR_STORE_ENUM:
      return "tsr_config_key_int";
    case TSR_STORE_F64:
      return "tsr_config_key_float";
    case TSR_STORE_BOOL:
      return "tsr_config_key_bool";
    default:
      return "tsr_config_key_string";
  }
}

static tsr_status find_key(const char *section, const char *key, const tsr_schema_entry **out) {
  *out = section && key ? tsr_schema_find(section, key) : NULL;
  if (*out) return TSR_OK;
  if (!section || !key) return TSR_ERROR(TSR_EINVAL, "a core key needs a section and a name");
  const char *names[64];
  int n = 0;
  for (int i = 0; i < tsr_schema_len && n < 64; i++)
    if (!strcmp(tsr_schema[i].key.section, section)) names[n++] = tsr_schema[i].key.spec.name;
  if (!n) {
    if (!strncmp(section, "strategy.", 9))
      return TSR_ERROR(TSR_EINVAL,
                       "[%s] %s: a plugin's own keys are read with tsr_config_get_int, "
                       "tsr_config_get_float, tsr_config_get_bool or tsr_config_get",
                       section, key);
    return TSR_ERROR(TSR_EINVAL,
                     "[%s] is not a core section; they are job, mesh, plugins, model, data, "
                     "optimizer, checkpoint and output",
                     section);
  }
  const char *hint = tsr_closest_name(key, names, n);
  if (hint)
    return TSR_ERROR(TSR_EINVAL, "[%s] has no key '%s'; did you mean '%s'?", section, key, hint);
  return TSR_ERROR(TSR_EINVAL, "[%s] has no key '%s'; docs/ini-reference.md lists its keys",
                   section, key);
}

static tsr_status wrong_type(const tsr_schema_entry *e, const char *asked) {
  return TSR_ERROR(TSR_EINVAL, "[%s] %s is not read with %s; use %s", e->key.section,
                   e->key.spec.name, asked, getter_for(e->store));
}

tsr_status tsr_config_key_int(const tsr_config *cfg, const char *section, const char *key,
                              int64_t *out) {
  const tsr_schema_entry *e;
  TSR_CHECK(find_key(section, key, &e));
  const char *at = (const char *)cfg + e->offset;
  if (e->store == TSR_STORE_I64) {
    memcpy(out, at, sizeof *out);
  } else if (e->store == TSR_STORE_ENUM) {
    int idx; /* an enum key stores the index of its choice, an int-sized enum value */
    memcpy(&idx, at, sizeof idx);
    *out = idx;
  } else {
    return wrong_type(e, "tsr_config_key_int");
  }
  return TSR_OK;
}

tsr_status tsr_config_key_float(const tsr_config *cfg, const char *section, const char *key,
                                double *out) {
  const tsr_schema_entry *e;
  TSR_CHECK(find_key(section, key, &e));
  const char *at = (const char *)cfg + e->offset;
  if (e->store == TSR_STORE_F64) {
    memcpy(out, at, sizeof *out);
  } else if (e->store == TSR_STORE_I64) {
    int64_t v;
    memcpy(&v, at, sizeof v);
    *out = (double)v;
  } else {
    return wrong_type(e, "tsr_config_key_float");
  }
  return TSR_OK;
}

tsr_status tsr_config_key_bool(const tsr_config *cfg, const char *section, const char *key,
                               bool *out) {
  const tsr_schema_entry *e;
  TSR_CHECK(find_key(section, key, &e));
  if (e->store != TSR_STORE_BOOL) return wrong_type(e, "tsr_config_key_bool");
  memcpy(out, (const char *)cfg + e->offset, sizeof *out);
  return TSR_OK;
}

/* Appends text to buf at *o; false once it no longer fits. */
static bool put_text(char *buf, size_t len, size_t *o, const char *text, size_t n) {
  if (n >= len - *o) return false;
  memcpy(buf + *o, text, n);
  *o += n;
  buf[*o] = '\0';
  return true;
}

static bool put_int(char *buf, size_t len, size_t *o, long long v) {
  char t[32];
  int n = snprintf(t, sizeof t, "%lld", v);
  return put_text(buf, len, o, t, (size_t)n);
}

tsr_status tsr_config_key_string(const tsr_config *cfg, const char *section, const char *key,
                                 char *buf, size_t len) {
  const tsr_schema_entry *e;
  TSR_CHECK(find_key(section, key, &e));
  if (!buf || !len) return TSR_ERROR(TSR_EINVAL, "[%s] %s: no buffer to write to", section, key);
  const char *at = (const char *)cfg + e->offset;
  size_t o = 0;
  bool fits = true;
  buf[0] = '\0';
  switch (e->store) {
    case TSR_STORE_I64: {
      int64_t v;
      memcpy(&v, at, sizeof v);
      fits = put_int(buf, len, &o, (long long)v);
      break;
    }
    case TSR_STORE_F64: {
      double v;
      char t[40];
      memcpy(&v, at, sizeof v);
      /* %.17g gives back the same double when parsed */
      int n = snprintf(t, sizeof t, "%.17g", v);
      fits = put_text(buf, len, &o, t, (size_t)n);
      break;
    }
    case TSR_STORE_BOOL: {
      bool v;
      memcpy(&v, at, sizeof v);
      fits = put_text(buf, len, &o, v ? "true" : "false", v ? 4 : 5);
      break;
    }
    case TSR_STORE_CHARS:
      fits = put_text(buf, len, &o, at, strlen(at));
      break;
    case TSR_STORE_ENUM: {
      /* the stored index back to its choice's text */
      int idx;
      memcpy(&idx, at, sizeof idx);
      const char *c = idx >= 0 ? e->key.spec.choices : NULL;
      for (int i = 0; i < idx && c; i++) c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
      if (!c)
        return TSR_ERROR(TSR_EINTERNAL, "[%s] %s holds choice %d of '%s'", section, key, idx,
                         e->key.spec.choices);
      fits = put_text(buf, len, &o, c, strcspn(c, "|"));
      break;
    }
    case TSR_STORE_NAMES:
    case TSR_STORE_INTS: {
      int n;
      memcpy(&n, (const char *)cfg + e->count_offset, sizeof n);
      for (int i = 0; i < n && fits; i++) {
        if (i) fits = put_text(buf, len, &o, ", ", 2);
        if (!fits) break;
        if (e->store == TSR_STORE_NAMES) {
          const char *name = at + (size_t)i * e->name_len;
          fits = put_text(buf, len, &o, name, strlen(name));
        } else {
          int v;
          memcpy(&v, at + (size_t)i * sizeof v, sizeof v);
          fits = put_int(buf, len, &o, v);
        }
      }
      break;
    }
  }
  if (!fits)
    return TSR_ERROR(TSR_EINVAL, "[%s] %s: the value does not fit in %zu bytes", section, key, len);
  return TSR_OK;
}
