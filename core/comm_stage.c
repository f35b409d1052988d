/* Host staging of device buffers for backends that move host memory only (comm_impl.h).
 *
 * This is what lets ranks on devices talk through `mpi`: a call on device buffers is copied to
 * host buffers, run by the backend as a host call, and the result copied back. Correct on any
 * backend, and costly: two transfers per call on top of the collective. A backend that moves
 * device memory itself sets device_memory and is never staged: `nccl`, and `local`, whose virtual
 * ranks on one device copy and sum each other's device buffers (comm_local_coll.c). */
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"
#include "kernel_table.h"

tsr_status tsr_stage_begin(const tsr_group_t *g, const void **send, size_t send_bytes, void **recv,
                           size_t recv_bytes, tsr_stage *s) {
  memset(s, 0, sizeof *s);
  const void *sd = send ? *send : NULL;
  void *rd = recv ? *recv : NULL;
  bool dev_send = send_bytes && tsr_on_device(sd), dev_recv = recv_bytes && tsr_on_device(rd);
  if (g->comm->iface->device_memory || (!dev_send && !dev_recv)) return TSR_OK;
  bool in_place = sd && sd == rd;
  size_t bytes = in_place ? (send_bytes > recv_bytes ? send_bytes : recv_bytes) : 0;
  if (dev_send) {
    s->send_host = malloc(in_place ? bytes : send_bytes);
    if (!s->send_host) goto oom;
    tsr_memcpy_any(s->send_host, sd, send_bytes);
    *send = s->send_host;
  }
  if (dev_recv) {
    s->recv_host = in_place ? s->send_host : malloc(recv_bytes);
    if (!s->recv_host) goto oom;
    s->recv_device = rd;
    s->recv_bytes = recv_bytes;
    *recv = s->recv_host;
  }
  return TSR_OK;
oom:
  tsr_stage_end(s, TSR_ENOMEM);
  return TSR_ERROR(TSR_ENOMEM, "group '%s': out of host memory staging %zu + %zu device bytes",
                   g->label, send_bytes, recv_bytes);
}

tsr_status tsr_stage_end(tsr_stage *s, tsr_status st) {
  if (st == TSR_OK && s->recv_device) tsr_memcpy_any(s->recv_device, s->recv_host, s->recv_bytes);
  if (s->recv_host != s->send_host) free(s->recv_host);
  free(s->send_host);
  memset(s, 0, sizeof *s);
  return st;
}
