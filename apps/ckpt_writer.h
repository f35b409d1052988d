/* A background writer of one safetensors file ([checkpoint] async): the tensors are copied into
 * host buffers the writer keeps (its snapshot), and a thread writes them as tsr_safetensors_save
 * writes any file (a temporary synced and renamed over the path), while the caller's tensors
 * change. It knows nothing of training or of the other ranks. */
#ifndef TESSERA_APP_CKPT_WRITER_H
#define TESSERA_APP_CKPT_WRITER_H

#include <stdbool.h>
#include <stdint.h>

#include "tessera/status.h"
#include "tessera/tensor.h"

typedef struct tsr_ckpt_writer tsr_ckpt_writer;

/* A writer with no file under way; its buffers are made by the first start. */
tsr_status tsr_ckpt_writer_new(tsr_ckpt_writer **out);
/* Waits for the write under way, then frees the buffers. NULL is a no-op. */
void tsr_ckpt_writer_free(tsr_ckpt_writer *w);

/* Copies the `n` tensors (any device and strides) into the writer's host buffers, reusing those
 * of the previous start where the shapes agree, and starts a thread that writes them to `path`
 * under `names` with the metadata, at the lowest priority (nice 19). `after`, when not NULL, is
 * called by that thread once the file is in place (a test hook). TSR_EINVAL when a write is still
 * under way (wait for it first). The snapshot's bytes go to *bytes. With n == 0 nothing is written
 * and the writer is done at once. */
tsr_status tsr_ckpt_writer_start(tsr_ckpt_writer *w, const char *path, int n,
                                 const char *const *names, const tsr_tensor *const *tensors,
                                 int nmeta, const char *const *keys, const char *const *values,
                                 void (*after)(void), int64_t *bytes);
/* Makes the host buffers a start with these `n` tensors' shapes will copy into, ahead of it (zero
 * filled, so their pages are in place): the first save then costs a copy, as every later one. */
tsr_status tsr_ckpt_writer_reserve(tsr_ckpt_writer *w, int n, const tsr_tensor *const *tensors);
/* True when no write is under way or the one under way has ended (it does not block). */
bool tsr_ckpt_writer_done(tsr_ckpt_writer *w);
/* Waits for the write under way and returns its status, its message as this thread's last
 * error; TSR_OK when there was none. */
tsr_status tsr_ckpt_writer_wait(tsr_ckpt_writer *w);

#endif
