/* The core schema table with where each key lands in tsr_config. Private to core/config*.c. */
#ifndef TESSERA_CONFIG_INTERNAL_H
#define TESSERA_CONFIG_INTERNAL_H

#include <stddef.h>

#include "tessera/config.h"

/* How a key's value is stored; the key's tsr_key_type says how it is checked. */
typedef enum tsr_store_kind {
  TSR_STORE_I64 = 0,   /* int64_t */
  TSR_STORE_F64 = 1,   /* double */
  TSR_STORE_BOOL = 2,  /* bool */
  TSR_STORE_CHARS = 3, /* char[cap] */
  TSR_STORE_ENUM = 4,  /* an int-sized enum: the index of the value in `choices` */
  TSR_STORE_NAMES = 5, /* char[cap][name_len] with an int count at count_offset */
  TSR_STORE_INTS = 6,  /* int[cap] with an int count at count_offset */
} tsr_store_kind;

typedef struct tsr_schema_entry {
  tsr_config_key key;
  tsr_store_kind store;
  size_t offset;       /* of the value in tsr_config */
  size_t cap;          /* CHARS: bytes; NAMES, INTS: entries */
  size_t name_len;     /* NAMES: bytes per entry */
  size_t count_offset; /* NAMES, INTS: of the int count in tsr_config */
} tsr_schema_entry;

/* What the core allocates for every config: the frozen public struct, then the keys added since
 * ABI 1.0 (tsr_config_ext_of). The schema's offsets are from the start of this struct. */
typedef struct tsr_config_full {
  tsr_config cfg;
  tsr_config_ext ext;
} tsr_config_full;

extern const tsr_schema_entry tsr_schema[];
extern const int tsr_schema_len;

/* Sections of the core schema, in file order, NULL-terminated. */
extern const char *const tsr_schema_sections[];

/* The entry for section.key, or NULL. */
const tsr_schema_entry *tsr_schema_find(const char *section, const char *key);

/* Stores `value` (already checked with tsr_key_check) into cfg as `e` says. */
tsr_status tsr_schema_store(const tsr_schema_entry *e, const char *value, tsr_config *cfg);

#endif
