/* Values for the tests that hold a hand-written protobuf coder to
 * protobuf-c (test_reply_fast.c, test_reply_pack.c, test_request_fast.c):
 * numbers whose varints take 0 to 10 bytes, from rand(). */
#ifndef GPUBUF_TEST_WIRE_VALUES_H
#define GPUBUF_TEST_WIRE_VALUES_H

#include <stdint.h>
#include <stdlib.h>

static inline uint64_t rnd64(void) {
    return (uint64_t)rand() << 40 ^ (uint64_t)rand() << 20 ^ (uint64_t)rand();
}

/* Zero, small or large, at random. */
static inline uint64_t some(void) {
    switch (rand() % 4) {
    case 0: return 0;
    case 1: return (uint64_t)(rand() % 128);
    case 2: return (uint64_t)(rand() % 100000);
    default: return rnd64();
    }
}

#endif
