/* Steps of the forked children of the GPU suites (test_gpu, test_gpu_vmm):
 * each makes its CUDA calls in the child that runs it and reports a step
 * number, never asserting. */
#ifndef GPUBUF_TEST_GPU_HELPERS_H
#define GPUBUF_TEST_GPU_HELPERS_H

#include <stdint.h>

#include "gpubuf/gpubuf.h"
#include "harness.h"
#include "pattern.h"

/* Connect to d, allocate size bytes named name in pool, fill them with the
 * pattern of seed on GPU fill_device (-1: the buffer's own device) and
 * seal. 0; 1: the connect or alloc failed; 2: the fill failed, or
 * want_device >= 0 and the buffer is not on it; 3: the seal failed. */
static inline int gpu_produce_sealed(const test_daemon *d, const char *pool, uint64_t size,
                                     const char *name, int fill_device, int want_device,
                                     uint32_t seed) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_alloc(c, pool, size, name, &b) < 0)
        return 1;
    int dev = fill_device < 0 ? gpubuf_buffer_device(b) : fill_device;
    if ((want_device >= 0 && gpubuf_buffer_device(b) != want_device) ||
        gpubuf_pattern_fill_device(dev, gpubuf_buffer_device_ptr(b), size, seed) < 0)
        return 2;
    return gpubuf_seal_sync(b) < 0 ? 3 : 0;
}

/* Fill the first size bytes of b with the pattern of seed on b's device and
 * check every word there: 0, or -1 when a step failed or a word is wrong. */
static inline int gpu_fill_verify(gpubuf_buffer *b, uint64_t size, uint32_t seed) {
    uint64_t bad = 1;
    if (gpubuf_pattern_fill_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b), size,
                                   seed) < 0 ||
        gpubuf_pattern_verify_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b), size,
                                     seed, &bad) < 0 ||
        bad)
        return -1;
    return 0;
}

#endif
