/* Batches on CUDA pools (test_gpu: cuda-ipc, test_gpu_vmm: cuda-vmm): the
 * same story for both kinds, the slabs travelling as IPC handles or as VMM
 * fds. Every CUDA call happens in forked children. */
#ifndef GPUBUF_TEST_GPU_BATCH_H
#define GPUBUF_TEST_GPU_BATCH_H

#include <stdbool.h>

#include "harness.h"

/* A producer allocates 40 buffers of about 4 MiB from pool (several slabs)
 * with gpubuf_alloc_many, fills each with its own pattern on the GPU, seals
 * them with gpubuf_seal_many; a consumer in another process opens them with
 * gpubuf_open_many (one missing name fails alone), checks every buffer on
 * the GPU, opens them again by id and one by a single open (slabs mapped:
 * no handle travels), read-only too when read_only_ok (cuda-vmm; cuda-ipc
 * refuses each item with -EOPNOTSUPP), releases with gpubuf_release_many;
 * then they are deleted with gpubuf_delete_many and the pool is empty. */
void gpu_batch_story(const test_daemon *d, const char *pool, bool read_only_ok);

#endif
