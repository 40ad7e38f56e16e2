/* Shared by the GPU suites (test_gpu, test_gpu_vmm): their main(), which
 * runs each case only where enough GPUs are, and steps of their forked
 * children, which make their CUDA calls in the child that runs them and
 * report a step number, never asserting. */
#ifndef GPUBUF_TEST_GPU_HELPERS_H
#define GPUBUF_TEST_GPU_HELPERS_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "gpubuf/gpubuf.h"
#include "harness.h"
#include "check_main.h"
#include "pattern.h"

/* A case of a GPU suite: add_case's arguments (timeout 120 s), the tests
 * (NULL-terminated), and how many GPUs it needs (with a note saying why it
 * does not run where fewer are). */
typedef struct gpu_case {
    const char *name;
    SFun setup, teardown;
    const TTest *const *tests;
    int min_gpus;
    const char *fewer; /* "the multi-gpu cases need two" */
} gpu_case;

/* The main() of a GPU suite prog ("test_gpu"): the GPUs visible here into
 * *ngpus and uuid; exit status 77 (skipped) without any; else the n cases
 * that have enough GPUs run in the suite named suite. */
static inline int gpu_suite_main(const char *prog, const char *suite, int *ngpus,
                                 char uuid[][41], const gpu_case *cases, size_t n) {
    *ngpus = td_probe_gpus(uuid, 8);
    if (*ngpus < 1) {
        printf("%s: no CUDA driver or device: skipped\n", prog);
        return 77;
    }
    Suite *s = suite_create(suite);
    for (size_t i = 0; i < n; i++) {
        if (*ngpus >= cases[i].min_gpus)
            add_tests_(add_case(s, cases[i].name, cases[i].setup, cases[i].teardown, 120),
                       cases[i].tests);
        else
            printf("%s: %d GPU: %s\n", prog, *ngpus, cases[i].fewer);
    }
    return run_suite(s);
}

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

/* Connect to the daemon at socket (*c), open name waiting up to timeout_ms
 * (*b) and check every word of it on the GPU against the pattern of seed:
 * 0; 1: the connect or open failed; 2: the check did. */
static inline int gpu_open_verified(const char *socket, const char *name, int timeout_ms,
                                    uint32_t seed, gpubuf_client **c, gpubuf_buffer **b) {
    uint64_t bad = 1;
    if (gpubuf_connect(socket, c) < 0 || gpubuf_open(*c, name, timeout_ms, b) < 0)
        return 1;
    if (gpubuf_pattern_verify_device(gpubuf_buffer_device(*b), gpubuf_buffer_device_ptr(*b),
                                     gpubuf_buffer_size(*b), seed, &bad) < 0 ||
        bad)
        return 2;
    return 0;
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
