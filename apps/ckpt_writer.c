/* The background writer of [checkpoint] async: a snapshot in host buffers and a thread. */
#define _GNU_SOURCE /* syscall(SYS_gettid) */
#include "ckpt_writer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "tessera/io.h"

#define META_MAX 8

struct tsr_ckpt_writer {
  int n, cap;           /* tensors in the snapshot, and room for names and buffers */
  char **names;         /* (cap) owned copies: the caller's may go before the thread ends */
  tsr_tensor **bufs;    /* (cap) host copies, kept for the next start when shapes agree */
  int nmeta;            /* metadata pairs, at most META_MAX */
  char *keys[META_MAX]; /* owned copies */
  char *vals[META_MAX]; /* owned copies */
  char *path;           /* the file the thread writes */
  void (*after)(void);  /* called by the thread once the file is in place; may be NULL */
  pthread_t thread;     /* valid while `running` */
  bool running;         /* a thread was started and not joined yet */
  atomic_bool finished; /* set by the thread as its last act: wait will not block */
  tsr_status status;    /* the thread's result, read after the join */
  char error[2048];     /* its message (the last error is per thread) */
};

tsr_status tsr_ckpt_writer_new(tsr_ckpt_writer **out) {
  tsr_ckpt_writer *w = calloc(1, sizeof *w);
  if (!w) return TSR_ERROR(TSR_ENOMEM, "checkpoint writer: out of memory");
  atomic_init(&w->finished, true);
  *out = w;
  return TSR_OK;
}

/* The strings of the previous start; the buffers stay. */
static void drop_strings(tsr_ckpt_writer *w) {
  for (int i = 0; i < w->cap; i++) {
    free(w->names[i]);
    w->names[i] = NULL;
  }
  for (int k = 0; k < w->nmeta; k++) {
    free(w->keys[k]);
    free(w->vals[k]);
    w->keys[k] = w->vals[k] = NULL;
  }
  w->nmeta = 0;
  free(w->path);
  w->path = NULL;
}

void tsr_ckpt_writer_free(tsr_ckpt_writer *w) {
  if (!w) return;
  /* joined without reporting: this thread's last error may be the run's, kept for its message */
  if (w->running) pthread_join(w->thread, NULL);
  w->running = false;
  drop_strings(w);
  for (int i = 0; i < w->cap; i++) tsr_tensor_free(w->bufs[i]);
  free(w->names);
  free(w->bufs);
  free(w);
}

static void *write_thread(void *arg) {
  tsr_ckpt_writer *w = arg;
  /* The run's kernel threads fill the cores; a writer competing with them at equal weight stalls
   * a whole GEMM whenever it holds a core one of them waits for. At nice 19 it takes what they
   * leave (its work is mostly copying into the page cache and waiting for the disk). On Linux
   * the nice value of a thread id is the thread's own; failing leaves it at the default. */
  (void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 19);
  w->status = tsr_safetensors_save(w->path, w->n, (const char *const *)w->names,
                                   (const tsr_tensor *const *)w->bufs, w->nmeta,
                                   (const char *const *)w->keys, (const char *const *)w->vals);
  if (w->status != TSR_OK) snprintf(w->error, sizeof w->error, "%s", tsr_last_error());
  if (w->status == TSR_OK && w->after) w->after();
  atomic_store(&w->finished, true);
  return NULL;
}

static bool same_shape(const tsr_tensor *a, const tsr_tensor *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

/* Room for n names and buffers; buffers beyond n are kept for a later, larger start. */
static tsr_status reserve(tsr_ckpt_writer *w, int n) {
  if (n <= w->cap) return TSR_OK;
  char **names = realloc(w->names, (size_t)n * sizeof *names);
  if (!names) return TSR_ERROR(TSR_ENOMEM, "checkpoint writer: out of memory");
  w->names = names;
  tsr_tensor **bufs = realloc(w->bufs, (size_t)n * sizeof *bufs);
  if (!bufs) return TSR_ERROR(TSR_ENOMEM, "checkpoint writer: out of memory");
  w->bufs = bufs;
  for (int i = w->cap; i < n; i++) w->names[i] = NULL, w->bufs[i] = NULL;
  w->cap = n;
  return TSR_OK;
}

tsr_status tsr_ckpt_writer_reserve(tsr_ckpt_writer *w, int n, const tsr_tensor *const *tensors) {
  if (w->running)
    return TSR_ERROR(TSR_EINVAL, "checkpoint writer: %s is still being written; wait for it",
                     w->path);
  TSR_CHECK(reserve(w, n));
  for (int i = 0; i < n; i++) {
    const tsr_tensor *src = tensors[i];
    if (w->bufs[i] && same_shape(w->bufs[i], src)) continue;
    tsr_tensor_free(w->bufs[i]);
    w->bufs[i] = NULL;
    TSR_CHECK(tsr_tensor_new(NULL, src->dtype, src->ndim, src->shape, &w->bufs[i]));
  }
  return TSR_OK;
}

tsr_status tsr_ckpt_writer_start(tsr_ckpt_writer *w, const char *path, int n,
                                 const char *const *names, const tsr_tensor *const *tensors,
                                 int nmeta, const char *const *keys, const char *const *values,
                                 void (*after)(void), int64_t *bytes) {
  *bytes = 0;
  if (w->running)
    return TSR_ERROR(TSR_EINVAL, "checkpoint writer: %s is still being written; wait for it",
                     w->path);
  if (nmeta > META_MAX)
    return TSR_ERROR(TSR_EINVAL, "checkpoint writer: %d metadata pairs, at most %d", nmeta,
                     META_MAX);
  drop_strings(w);
  w->n = 0;
  TSR_CHECK(reserve(w, n));
  if (!(w->path = strdup(path))) return TSR_ERROR(TSR_ENOMEM, "checkpoint writer: out of memory");
  for (int k = 0; k < nmeta; k++) {
    w->keys[k] = strdup(keys[k]);
    w->vals[k] = strdup(values[k]);
    w->nmeta = k + 1;
    if (!w->keys[k] || !w->vals[k])
      return TSR_ERROR(TSR_ENOMEM, "checkpoint writer: out of memory");
  }
  /* the snapshot: after this the caller's tensors may change */
  for (int i = 0; i < n; i++) {
    const tsr_tensor *src = tensors[i];
    if (w->bufs[i] && !same_shape(w->bufs[i], src)) {
      tsr_tensor_free(w->bufs[i]);
      w->bufs[i] = NULL;
    }
    if (!w->bufs[i])
      TSR_CHECK(tsr_tensor_new(NULL, src->dtype, src->ndim, src->shape, &w->bufs[i]));
    TSR_CHECK(tsr_tensor_copy(w->bufs[i], src));
    if (!(w->names[i] = strdup(names[i])))
      return TSR_ERROR(TSR_ENOMEM, "checkpoint writer: out of memory");
    w->n = i + 1;
    *bytes += (int64_t)tsr_tensor_nbytes(w->bufs[i]);
  }
  w->after = after;
  w->status = TSR_OK;
  w->error[0] = '\0';
  if (n == 0) return TSR_OK; /* nothing of this rank's goes to the checkpoint */
  atomic_store(&w->finished, false);
  int rc = pthread_create(&w->thread, NULL, write_thread, w);
  if (rc != 0) {
    atomic_store(&w->finished, true);
    return TSR_ERROR(TSR_EINTERNAL, "checkpoint writer: cannot start a thread: %s", strerror(rc));
  }
  w->running = true;
  return TSR_OK;
}

bool tsr_ckpt_writer_done(tsr_ckpt_writer *w) {
  return !w->running || atomic_load(&w->finished);
}

tsr_status tsr_ckpt_writer_wait(tsr_ckpt_writer *w) {
  if (!w->running) return TSR_OK;
  pthread_join(w->thread, NULL);
  w->running = false;
  if (w->status != TSR_OK) return tsr_error(w->status, "%s", w->error);
  return TSR_OK;
}
