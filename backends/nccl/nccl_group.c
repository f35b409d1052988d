/* The `nccl` backend: groups and their NCCL communicators, the arrival that also agrees on host
 * or device memory, and the wait that bounds every device call by the communicator's timeout.
 *
 * Every NCCL communicator is nonblocking (config.blocking = 0): NCCL then never waits inside a
 * call for a peer, and this file polls ncclCommGetAsyncError and cudaStreamQuery against a
 * deadline instead, so that a peer that died or hung is a TSR_ETIMEDOUT naming the call, after
 * which the communicator is aborted, never a process stuck in NCCL. */
#include <dlfcn.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nccl_backend.h"

/* ---- Types ---- */

ncclDataType_t tsr_nccl_dtype(tsr_dtype dt) {
  switch (dt) {
    case TSR_BF16:
      return ncclBfloat16;
    case TSR_F16:
      return ncclFloat16;
    case TSR_I32:
      return ncclInt32;
    case TSR_I64:
      return ncclInt64;
    default:
      return ncclFloat32;
  }
}

/* avg is NCCL's own: for floats each input is multiplied by 1/n before the sum, for integers the
 * sum is divided by n, truncating toward zero as the host path does. */
ncclRedOp_t tsr_nccl_op(tsr_reduce_op op) {
  switch (op) {
    case TSR_REDUCE_AVG:
      return ncclAvg;
    case TSR_REDUCE_MAX:
      return ncclMax;
    default:
      return ncclSum;
  }
}

/* ---- Memory kinds ---- */

const char *tsr_nccl_mem_name(nccl_mem m) {
  switch (m) {
    case NCCL_MEM_HOST:
      return "host memory";
    case NCCL_MEM_DEVICE:
      return "device memory";
    case NCCL_MEM_BAD:
      return "host and device buffers mixed, or another GPU's memory";
    default:
      return "no buffer";
  }
}

nccl_mem tsr_nccl_mem_of(const nccl_proc *p, const void *ptr, size_t bytes, char *what,
                         size_t len) {
  if (!ptr || !bytes) {
    snprintf(what, len, "empty");
    return NCCL_MEM_NONE;
  }
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
    /* Runtimes before CUDA 11 call plain host memory an invalid value; that error is not
     * sticky, and must not be seen by the next CUDA call. */
    (void)cudaGetLastError();
    snprintf(what, len, "host memory");
    return NCCL_MEM_HOST;
  }
  if (a.type == cudaMemoryTypeManaged) {
    snprintf(what, len, "managed memory");
    return NCCL_MEM_DEVICE;
  }
  if (a.type != cudaMemoryTypeDevice) {
    /* Pinned host memory included: the host path reads it like any host buffer. */
    snprintf(what, len, "host memory");
    return NCCL_MEM_HOST;
  }
  if (a.device != p->device) {
    snprintf(what, len, "memory of GPU %d, not this rank's GPU %d", a.device, p->device);
    return NCCL_MEM_BAD;
  }
  snprintf(what, len, "device memory of GPU %d", a.device);
  return NCCL_MEM_DEVICE;
}

nccl_mem tsr_nccl_buffers_mem(const nccl_proc *p, const void *send, size_t send_bytes,
                              const void *recv, size_t recv_bytes, char *detail, size_t len) {
  char ws[128], wr[128];
  nccl_mem ms = tsr_nccl_mem_of(p, send, send_bytes, ws, sizeof ws);
  nccl_mem mr = tsr_nccl_mem_of(p, recv, recv_bytes, wr, sizeof wr);
  if (len) detail[0] = '\0';
  if (ms == NCCL_MEM_BAD || mr == NCCL_MEM_BAD) {
    snprintf(detail, len, "%s is %s", ms == NCCL_MEM_BAD ? "send" : "recv",
             ms == NCCL_MEM_BAD ? ws : wr);
    return NCCL_MEM_BAD;
  }
  if (ms != NCCL_MEM_NONE && mr != NCCL_MEM_NONE && ms != mr) {
    snprintf(detail, len, "send is %s, recv is %s", ws, wr);
    return NCCL_MEM_BAD;
  }
  return ms != NCCL_MEM_NONE ? ms : mr;
}

/* ---- Waiting on MPI and NCCL ---- */

/* Polls x until it is empty, `deadline` passes (*timed_out) or MPI fails (its code). */
static int xfer_drain(mpi_xfer *x, double deadline, bool *timed_out) {
  int spins = 0;
  *timed_out = false;
  while (x->active > 0) {
    bool progress;
    int rc = tsr_mpi_xfer_test(x, &progress);
    if (rc != MPI_SUCCESS) return rc;
    if (progress) {
      spins = 0;
      continue;
    }
    if (x->active > 0 && MPI_Wtime() > deadline) {
      *timed_out = true;
      return MPI_SUCCESS;
    }
    tsr_nccl_backoff(&spins);
  }
  x->n = 0;
  return MPI_SUCCESS;
}

/* Polls the communicator until its pending operation (init, finalize, a queued call) is no
 * longer ncclInProgress: returns its result, or ncclInProgress when `deadline` passed first. */
static ncclResult_t comm_settle(ncclComm_t comm, double deadline) {
  int spins = 0;
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (MPI_Wtime() > deadline) return ncclInProgress;
    tsr_nccl_backoff(&spins);
  }
}

/* ---- NCCL communicators ---- */

/* What member 0 sends every other member: the unique id, or why it has none, so that a failure
 * on member 0 is an error on every member instead of a timeout. */
typedef struct id_msg {
  int32_t ok;
  char why[256];
  ncclUniqueId id;
} id_msg;

static tsr_status exchange_id(tsr_group_t *inner, id_msg *msg) {
  char rs[128], who[256], es[MPI_MAX_ERROR_STRING];
  double timeout = inner->comm->timeout_s;
  mpi_xfer x = {0};
  tsr_status st = TSR_OK;
  tsr_ranks_format(inner->n, inner->ranks, rs, sizeof rs);
  if (inner->index == 0) {
    ncclResult_t r = ncclGetUniqueId(&msg->id);
    msg->ok = r == ncclSuccess;
    if (!msg->ok) snprintf(msg->why, sizeof msg->why, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    for (int j = 1; j < inner->n; j++)
      TSR_CHECK_GOTO(tsr_mpi_post(inner, &x, true, j, msg, sizeof *msg, TSR_NCCL_TAG_ID), st);
  } else {
    TSR_CHECK_GOTO(tsr_mpi_post(inner, &x, false, 0, msg, sizeof *msg, TSR_NCCL_TAG_ID), st);
  }
  bool timed_out;
  int rc = xfer_drain(&x, MPI_Wtime() + timeout, &timed_out);
  if (rc != MPI_SUCCESS || timed_out) {
    tsr_mpi_xfer_pending(&x, inner->n, inner->ranks, who, sizeof who);
    tsr_mpi_xfer_abandon(&x);
    if (timed_out)
      st = TSR_ERROR(TSR_ETIMEDOUT,
                     "group '%s' %s: exchanging the NCCL unique id timed out after %g s: %s never "
                     "came",
                     inner->label, rs, timeout, who);
    else {
      tsr_mpi_error_string(rc, es, sizeof es);
      st = TSR_ERROR(TSR_ECOMM, "group '%s' %s: exchanging the NCCL unique id failed in MPI: %s",
                     inner->label, rs, es);
    }
    goto cleanup;
  }
  if (!msg->ok)
    st = TSR_ERROR(TSR_ECOMM, "group '%s' %s: rank %d (member 0) has no NCCL unique id: %s",
                   inner->label, rs, inner->ranks[0], msg->why);
cleanup:
  tsr_mpi_xfer_free(&x);
  return st;
}

/* The NCCL communicator of the group's rank list, collective over its members: member 0 makes
 * the unique id, every member joins with ncclCommInitRankConfig. group_init calls it right after
 * the mpi backend created the group, which is collective over the same members, so they are all
 * here; the same holds for no later moment (a point-to-point call involves two members only). */
static tsr_status shared_create(tsr_group_t *inner, int device, nccl_shared **out) {
  mpi_group *mg = tsr_mpi_group(inner);
  char rs[128], msg[TSR_NCCL_MSG_LEN];
  if (mg->broken) return tsr_mpi_broken_error(inner, "creating the NCCL communicator");
  tsr_ranks_format(inner->n, inner->ranks, rs, sizeof rs);
  nccl_shared *sh = calloc(1, sizeof *sh);
  id_msg *id = calloc(1, sizeof *id);
  if (!sh || !id) {
    free(sh);
    free(id);
    return TSR_ERROR(TSR_ENOMEM, "group '%s' %s: out of memory", inner->label, rs);
  }
  sh->mg = mg;
  sh->n = inner->n;
  sh->me = inner->index;
  tsr_status st = exchange_id(inner, id);
  if (st != TSR_OK) {
    /* A late message may still land in id (its requests were abandoned): it is left to the
     * process, which is expected to end. */
    free(sh);
    /* The mpi group exists on every member but can never move device data: later calls on it,
     * host ones included, fail at once with this reason. */
    snprintf(msg, sizeof msg, "%s", tsr_last_error());
    tsr_mpi_break(mg, st, msg);
    return tsr_error(st, "%s", msg);
  }
  /* NCCL binds the communicator to the current device: the rank's, whatever thread this is. */
  (void)cudaSetDevice(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  double deadline = MPI_Wtime() + inner->comm->timeout_s;
  ncclResult_t r = ncclCommInitRankConfig(&sh->comm, inner->n, id->id, inner->index, &config);
  free(id);
  if (r == ncclInProgress || (r == ncclSuccess && sh->comm)) r = comm_settle(sh->comm, deadline);
  if (r == ncclSuccess) {
    *out = sh;
    return TSR_OK;
  }
  if (r == ncclInProgress) {
    st = TSR_ETIMEDOUT;
    snprintf(msg, sizeof msg,
             "group '%s' %s: creating its NCCL communicator timed out after %g s (a member never "
             "joined, or the members cannot reach each other: check NCCL_SOCKET_IFNAME and the "
             "firewall; NCCL_DEBUG=INFO says more)",
             inner->label, rs, inner->comm->timeout_s);
  } else {
    st = TSR_ECOMM;
    snprintf(msg, sizeof msg, "group '%s' %s: ncclCommInitRankConfig failed: %s (%s)%s",
             inner->label, rs, ncclGetErrorString(r), sh->comm ? ncclGetLastError(sh->comm) : "",
             r == ncclInvalidUsage ? "; NCCL refuses two ranks of one communicator on one GPU: "
                                     "run one process per GPU"
                                   : "");
  }
  if (sh->comm) ncclCommAbort(sh->comm);
  free(sh);
  tsr_mpi_break(mg, st, msg);
  return TSR_ERROR(st, "%s", msg);
}

void tsr_nccl_shared_destroy(nccl_shared *sh, double timeout_s) {
  if (!sh) return;
  bool broken = sh->mg->broken;
  if (sh->comm) {
    if (broken) {
      ncclCommAbort(sh->comm);
    } else {
      /* Finalize flushes what NCCL still holds; bounded like everything else, then abort. */
      ncclResult_t r = ncclCommFinalize(sh->comm);
      if (r == ncclSuccess || r == ncclInProgress)
        r = comm_settle(sh->comm, MPI_Wtime() + timeout_s);
      if (r == ncclSuccess)
        ncclCommDestroy(sh->comm);
      else
        ncclCommAbort(sh->comm);
    }
    sh->comm = NULL;
  }
  /* A broken group may still have handshake requests on these buffers: left to the process. */
  if (broken) return;
  tsr_mpi_xfer_free(&sh->px[0]);
  tsr_mpi_xfer_free(&sh->px[1]);
  free(sh);
}

/* ---- Groups ---- */

tsr_status tsr_nccl_group_init(tsr_comm_t *c, tsr_group_t *g) {
  nccl_proc *p = c->context;
  tsr_group_t *inner = NULL;
  TSR_CHECK(tsr_comm_group(p->mpi, g->n, g->ranks, g->label, &inner));
  /* The front never hands a group of one to a backend, so the inner front made no mpi group for
   * it; tests that drive this iface directly on one member (one GPU) still get a real one. */
  if (!inner->context) TSR_CHECK(tsr_mpi_group_init(p->mpi, inner));
  mpi_group *mg = tsr_mpi_group(inner);
  nccl_shared *sh = NULL;
  for (int i = 0; i < p->n_shared && !sh; i++)
    if (p->shared[i]->mg == mg) sh = p->shared[i];
  nccl_handle *h = malloc(sizeof *h);
  if (!h) return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory", g->label);
  if (!sh && p->n_shared == p->cap_shared) {
    int cap = p->cap_shared ? 2 * p->cap_shared : 16;
    nccl_shared **q = realloc(p->shared, (size_t)cap * sizeof *q);
    if (!q) {
      free(h);
      return TSR_ERROR(TSR_ENOMEM, "group '%s': out of memory for the group table", g->label);
    }
    p->shared = q;
    p->cap_shared = cap;
  }
  if (!sh) {
    tsr_status st = shared_create(inner, p->device, &sh);
    if (st != TSR_OK) {
      free(h);
      return st;
    }
    p->shared[p->n_shared++] = sh;
  }
  h->inner = inner;
  h->sh = sh;
  g->context = h;
  return TSR_OK;
}

void tsr_nccl_group_free(tsr_group_t *g) {
  free(g->context);
  g->context = NULL;
}

/* ---- Arrival ---- */

/* A member's memory kind rides in a descriptor field that tsr_call_check ignores for that kind
 * of call and tsr_call_format never prints: root, except for broadcast, where root is compared
 * and op is not. */
static void tag_set(tsr_call *call, nccl_mem m) {
  if (call->kind == TSR_COLL_BROADCAST)
    call->op = (tsr_reduce_op)m;
  else
    call->root = (int)m;
}

static nccl_mem tag_get(const tsr_call *call) {
  int v = call->kind == TSR_COLL_BROADCAST ? (int)call->op : call->root;
  return v >= NCCL_MEM_NONE && v <= NCCL_MEM_BAD ? (nccl_mem)v : NCCL_MEM_BAD;
}

static size_t sum_counts(int n, const size_t *v) {
  size_t s = 0;
  for (int i = 0; v && i < n; i++) s += v[i];
  return s;
}

/* Bytes of the call's send and recv buffers on this member. */
static void call_bytes(const tsr_group_t *g, const tsr_call *call, size_t *sb, size_t *rb) {
  size_t es = tsr_dtype_size(call->dt);
  *sb = *rb = 0;
  switch (call->kind) {
    case TSR_COLL_ALL_REDUCE:
    case TSR_COLL_BROADCAST:
      *sb = *rb = call->count * es;
      break;
    case TSR_COLL_ALL_GATHER:
      *sb = call->counts[g->index] * es;
      *rb = sum_counts(g->n, call->counts) * es;
      break;
    case TSR_COLL_REDUCE_SCATTER:
      *sb = sum_counts(g->n, call->counts) * es;
      *rb = call->counts[g->index] * es;
      break;
    case TSR_COLL_ALL_TO_ALL:
      *sb = sum_counts(g->n, call->counts) * es;
      *rb = sum_counts(g->n, call->recv_counts) * es;
      break;
    default:
      break;
  }
}

tsr_status tsr_nccl_arrive(tsr_group_t *g, const tsr_call *call, bool *device) {
  nccl_handle *h = tsr_nccl_handle(g);
  size_t sb, rb;
  char detail[300];
  *device = false;
  call_bytes(g, call, &sb, &rb);
  nccl_mem mine =
      tsr_nccl_buffers_mem(tsr_nccl_proc(g), call->send, sb, call->recv, rb, detail, sizeof detail);
  tsr_call tagged = *call;
  tag_set(&tagged, mine);
  /* Everything tsr_call_check compares is the front's call; a mismatch is reported here exactly
   * as under backend = mpi, on every member, before any data moves. */
  TSR_CHECK(tsr_mpi_arrive(h->inner, &tagged));
  mpi_group *mg = h->sh->mg;
  int host = -1, dev = -1, bad = -1;
  for (int j = 0; j < g->n; j++) {
    nccl_mem m = tag_get(&mg->calls[j]);
    if (m == NCCL_MEM_HOST && host < 0) host = j;
    if (m == NCCL_MEM_DEVICE && dev < 0) dev = j;
    if (m == NCCL_MEM_BAD && bad < 0) bad = j;
  }
  if (bad < 0 && (host < 0 || dev < 0)) {
    *device = dev >= 0;
    return TSR_OK;
  }
  /* Every member saw the same descriptors, so every member reports the same message (the member
   * at fault adds what it alone knows). The group stays usable: no data moved. */
  char what[256], rs[128];
  tsr_call_format(call, g->n, what, sizeof what);
  tsr_ranks_format(g->n, g->ranks, rs, sizeof rs);
  if (bad >= 0)
    return tsr_error(TSR_ECOMM,
                     "%s on group '%s' %s (seq %" PRIu64
                     "): rank %d passes host and device buffers in one call, or another GPU's "
                     "memory%s%s%s; every buffer of a call must be host memory, or device memory "
                     "of the rank's own GPU",
                     what, g->label, rs, mg->cur_seq, g->ranks[bad], bad == g->index ? " (" : "",
                     bad == g->index ? detail : "", bad == g->index ? ")" : "");
  return tsr_error(TSR_ECOMM,
                   "%s on group '%s' %s (seq %" PRIu64
                   "): rank %d passes host memory and rank %d device memory; every member of a "
                   "call must pass the same kind (device memory for tensors, host memory for "
                   "host scalars)",
                   what, g->label, rs, mg->cur_seq, g->ranks[host], g->ranks[dev]);
}

/* ---- Device calls ---- */

tsr_status tsr_nccl_fail_at(tsr_group_t *g, tsr_status st, const char *msg, const char *file,
                            int line) {
  nccl_shared *sh = tsr_nccl_handle(g)->sh;
  if (sh->comm) {
    /* Makes NCCL's kernels and proxy threads give up: peers that are still waiting in this
     * call time out on their side and abort theirs. */
    ncclCommAbort(sh->comm);
    sh->comm = NULL;
  }
  tsr_mpi_break(sh->mg, st, msg);
  return tsr_error_at(st, file, line, "%s", msg);
}

/* The functions of the libtessera-cuda the core loaded, if it has. Looked up by soname without
 * loading (RTLD_NOLOAD) rather than linked: the context this thread made current lives in that
 * copy, which need not be the one a link would pick (build tree and install side by side). */
static bool cuda_fns(nccl_proc *p) {
  if (p->cuda_lib) return true;
  void *lib = dlopen("libtessera-cuda.so", RTLD_LAZY | RTLD_NOLOAD);
  if (!lib) {
    (void)dlerror();
    return false;
  }
  nccl_cuda_fns f = {
      .current = (tsr_cuda_ctx * (*)(void))(uintptr_t)dlsym(lib, "tsr_cuda_ctx_current"),
      .device = (int (*)(const tsr_cuda_ctx *))(uintptr_t)dlsym(lib, "tsr_cuda_ctx_device"),
      .comm_stream = (void *(*)(tsr_cuda_ctx *))(uintptr_t)dlsym(lib, "tsr_cuda_ctx_comm_stream"),
      .comm_waits_compute =
          (tsr_status(*)(tsr_cuda_ctx *))(uintptr_t)dlsym(lib, "tsr_cuda_ctx_comm_waits_compute"),
  };
  if (!f.current || !f.device || !f.comm_stream || !f.comm_waits_compute) {
    dlclose(lib);
    return false;
  }
  p->cuda_lib = lib;
  p->cuda = f;
  return true;
}

#ifdef TSR_NCCL_FAULTS
/* Test builds: this rank arrived but never queues its part, as a process stuck between the two
 * would; its peers time out inside NCCL. It gives up once they have. */
static tsr_status stall(tsr_group_t *g, const nccl_run *run) {
  char msg[TSR_NCCL_MSG_LEN];
  double until = MPI_Wtime() + 1.5 * g->comm->timeout_s;
  while (MPI_Wtime() < until) {
    struct timespec t = {0, 10000000};
    nanosleep(&t, NULL);
  }
  snprintf(msg, sizeof msg,
           "%s: fault injected by TESSERA_NCCL_TEST_FAULT: this rank never "
           "queued its part",
           run->what);
  return TSR_NCCL_FAIL(g, TSR_ECOMM, msg);
}
#endif

tsr_status tsr_nccl_begin(tsr_group_t *g, nccl_run *run) {
  nccl_proc *p = tsr_nccl_proc(g);
  char msg[TSR_NCCL_MSG_LEN];
#ifdef TSR_NCCL_FAULTS
  if (p->fault_at >= 0 && (int64_t)p->device_calls == p->fault_at) {
    p->device_calls++;
    return stall(g, run);
  }
#endif
  p->device_calls++;
  if (!tsr_nccl_handle(g)->sh->comm) {
    snprintf(msg, sizeof msg, "%s: the group's NCCL communicator was aborted", run->what);
    return TSR_NCCL_FAIL(g, TSR_ECOMM, msg);
  }
  tsr_cuda_ctx *ctx = cuda_fns(p) ? p->cuda.current() : NULL;
  if (ctx) {
    int d = p->cuda.device(ctx);
    if (d != p->device) {
      snprintf(msg, sizeof msg,
               "%s: this thread's CUDA context is on GPU %d, but this rank's GPU is %d (create the "
               "context on tsr_nccl_comm_device)",
               run->what, d, p->device);
      return TSR_NCCL_FAIL(g, TSR_EINVAL, msg);
    }
    run->stream = (cudaStream_t)p->cuda.comm_stream(ctx);
    /* The collective reads what the rank's kernels wrote: its stream waits for them on the
     * device, without a host wait. */
    tsr_status st = p->cuda.comm_waits_compute(ctx);
    if (st != TSR_OK) {
      snprintf(msg, sizeof msg, "%s: ordering the comm stream after the compute stream: %s",
               run->what, tsr_last_error());
      return TSR_NCCL_FAIL(g, st, msg);
    }
    return TSR_OK;
  }
  /* No tessera context (a test or tool with its own buffers): the backend's stream waits for the
   * legacy default stream, and so for cudaMemcpy, cudaMemset, kernels launched without a stream
   * and (by the legacy stream's own rule) work queued before on blocking streams. Work on
   * non-blocking streams is the caller's to finish. No host wait, and nothing waits for the
   * streams of other communicators, which after a timeout may hold an aborted transfer. */
  cudaError_t e = cudaSetDevice(p->device);
  if (e == cudaSuccess) e = cudaEventRecord(p->order, cudaStreamLegacy);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(p->stream, p->order, 0);
  if (e != cudaSuccess) {
    snprintf(msg, sizeof msg, "%s: ordering the transfer after the default stream: %s (%s)",
             run->what, cudaGetErrorString(e), cudaGetErrorName(e));
    return TSR_NCCL_FAIL(g, TSR_ECOMM, msg);
  }
  run->stream = p->stream;
  return TSR_OK;
}

ncclResult_t tsr_nccl_group_end(ncclResult_t first) {
  ncclResult_t r = ncclGroupEnd();
  return first != ncclSuccess ? first : r;
}

static tsr_status nccl_failed(tsr_group_t *g, const nccl_run *run, const char *fn, ncclResult_t r) {
  char msg[TSR_NCCL_MSG_LEN];
  nccl_shared *sh = tsr_nccl_handle(g)->sh;
  if (r == ncclInProgress)
    snprintf(msg, sizeof msg,
             "%s timed out after %g s in NCCL (%s): every member arrived, but the transfer did not "
             "complete (a member died or hung, or its GPU is stuck); the NCCL communicator was "
             "aborted and the group is unusable from now on",
             run->what, g->comm->timeout_s, fn);
  else
    snprintf(msg, sizeof msg,
             "%s failed in NCCL (%s): %s (%s); the NCCL communicator was aborted and the group is "
             "unusable from now on",
             run->what, fn, ncclGetErrorString(r), sh->comm ? ncclGetLastError(sh->comm) : "");
  return TSR_NCCL_FAIL(g, r == ncclInProgress ? TSR_ETIMEDOUT : TSR_ECOMM, msg);
}

tsr_status tsr_nccl_finish(tsr_group_t *g, const nccl_run *run, const char *fn, ncclResult_t r) {
  nccl_shared *sh = tsr_nccl_handle(g)->sh;
  double deadline = MPI_Wtime() + g->comm->timeout_s;
  /* Nonblocking communicators may still be queueing (connections of a first transfer). */
  if (r == ncclInProgress) r = comm_settle(sh->comm, deadline);
  if (r != ncclSuccess) return nccl_failed(g, run, fn, r);
  int spins = 0;
  for (;;) {
    cudaError_t e = cudaStreamQuery(run->stream);
    if (e == cudaSuccess) return TSR_OK;
    if (e != cudaErrorNotReady) {
      char msg[TSR_NCCL_MSG_LEN];
      snprintf(msg, sizeof msg,
               "%s failed on the device (%s): %s (%s); the NCCL communicator was aborted and the "
               "group is unusable from now on",
               run->what, fn, cudaGetErrorString(e), cudaGetErrorName(e));
      return TSR_NCCL_FAIL(g, TSR_ECOMM, msg);
    }
    /* A peer's failure (network, its own abort) shows here, not in the stream. */
    ncclResult_t state = ncclSuccess;
    ncclResult_t q = ncclCommGetAsyncError(sh->comm, &state);
    if (q != ncclSuccess) return nccl_failed(g, run, fn, q);
    if (state != ncclSuccess && state != ncclInProgress) return nccl_failed(g, run, fn, state);
    if (MPI_Wtime() > deadline) return nccl_failed(g, run, fn, ncclInProgress);
    tsr_nccl_backoff(&spins);
  }
}
