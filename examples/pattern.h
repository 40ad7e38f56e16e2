/* A deterministic data pattern, written and checked on the host or on the
 * device (a PTX kernel JIT-compiled by the driver: no nvcc needed). Used by
 * the example programs, the tests and the benchmarks. */
#ifndef GPUBUF_PATTERN_H
#define GPUBUF_PATTERN_H

#include <stdint.h>

/* Word i (4 bytes, little-endian) of the pattern with this seed. */
static inline uint32_t gpubuf_pattern_word(uint64_t i, uint32_t seed) {
    return ((uint32_t)i * 0x9E3779B1u) ^ seed;
}

/* Host side. len is rounded down to whole words. */
void gpubuf_pattern_fill(void *p, uint64_t len, uint32_t seed);
uint64_t gpubuf_pattern_mismatches(const void *p, uint64_t len, uint32_t seed);

/* Device side: run on device ordinal `device` (primary context), on memory
 * at device address dptr. Return 0 or a negative gpubuf error (message on
 * stderr). Unavailable (GPUBUF_ENODRIVER) without CUDA support. */
int gpubuf_pattern_fill_device(int device, uint64_t dptr, uint64_t len, uint32_t seed);
int gpubuf_pattern_verify_device(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                 uint64_t *ret_mismatches);

/* Stream-ordered variants (stream: a CUstream of that device's primary
 * context, NULL for the legacy default stream). fill_device_async enqueues a
 * kernel that first spins for spin_us microseconds (0: none), then fills, and
 * returns without waiting. verify_device_stream enqueues the check on stream
 * and waits for that stream only. The kernels' module stays loaded for the
 * life of the process. */
int gpubuf_pattern_fill_device_async(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                     void *stream, uint32_t spin_us);
int gpubuf_pattern_verify_device_stream(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                        void *stream, uint64_t *ret_mismatches);

#endif
