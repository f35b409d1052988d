/* The core's own trace events (tessera/trace.h): ops and communication. Private to core/. */
#ifndef TESSERA_TRACE_IMPL_H
#define TESSERA_TRACE_IMPL_H

#include <stdint.h>

#include "tessera/trace.h"

/* An op's forward or a tape node's backward, from t0_ns (tsr_trace_clock) to now. */
void tsr_trace_op(const char *op, const char *pass, int64_t t0_ns);
/* A communication call on the group labelled `group`, from t0_ns to now, `bytes` sent. */
void tsr_trace_comm(const char *call, const char *group, int64_t t0_ns, uint64_t bytes);

#endif
