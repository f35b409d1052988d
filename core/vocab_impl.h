/* What the registry knows of each op in the vocabulary (vocab.c). */
#ifndef TESSERA_VOCAB_IMPL_H
#define TESSERA_VOCAB_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/registry.h"

typedef struct tsr_vocab_op {
  const char *name;
  int ninputs;
  uint32_t params;    /* bit i set: input i is a parameter */
  const char *inputs; /* the inputs' names, for messages */
} tsr_vocab_op;

/* The op called `name`, or NULL when the model has none. */
const tsr_vocab_op *tsr_vocab_find_op(const char *name);
bool tsr_vocab_has_style(const char *name);
/* names joined by ", " into buf, for messages. */
const char *tsr_vocab_join(const char *const *names, char *buf, size_t len);

#endif
