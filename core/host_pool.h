/* The host buffer pool behind the CPU allocators (host_pool.c). */
#ifndef TSR_HOST_POOL_H
#define TSR_HOST_POOL_H

#include <stddef.h>

/* A 64-byte aligned buffer of `bytes` (at least one pointer's worth), from the pool's kept
 * buffers of that size or the system; NULL when the system has no memory. */
void *tsr_host_pool_alloc(size_t bytes);
/* Gives back a buffer of tsr_host_pool_alloc made with the same `bytes`; kept for reuse within
 * the pool's bound, freed otherwise. */
void tsr_host_pool_free(void *ptr, size_t bytes);

#endif
