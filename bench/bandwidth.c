/* bandwidth and peer: device-to-device copies out of a gpubuf view against
 * copies out of a local allocation, on the buffer's GPU and on GPU 1. Built
 * only with CUDA. */
#include <stdlib.h>

#include "bench.h"
#include "pattern.h"

/* Median rate of 10 timed 1-copy runs (after 2 warm-ups) of n bytes from src
 * to dst in the current context, in GB/s of n * factor bytes. */
static double copy_gbps(const gpubuf_cuda *cu, CUdeviceptr dst, CUdeviceptr src, uint64_t n,
                        double factor) {
    CUevent e0, e1;
    double bw[10];
    if (cu->EventCreate(&e0, 0) || cu->EventCreate(&e1, 0))
        _exit(3);
    for (int rep = 0; rep < 12; rep++) {
        float ms;
        cu->EventRecord(e0, NULL);
        cu->MemcpyDtoDAsync(dst, src, n, NULL);
        cu->EventRecord(e1, NULL);
        if (cu->EventSynchronize(e1) != CUDA_SUCCESS)
            _exit(4);
        cu->EventElapsedTime(&ms, e0, e1);
        if (rep >= 2)
            bw[rep - 2] = factor * (double)n / (ms / 1e3) / 1e9;
    }
    cu->EventDestroy(e0);
    cu->EventDestroy(e1);
    qsort(bw, 10, sizeof(double), cmpd);
    return bw[5];
}

static CUcontext use_device(const gpubuf_cuda *cu, int ordinal) {
    CUdevice dev;
    CUcontext ctx;
    if (cu->DeviceGet(&dev, ordinal) || cu->DevicePrimaryCtxRetain(&ctx, dev) ||
        cu->CtxSetCurrent(ctx))
        _exit(3);
    return ctx;
}

/* On `device`: copy b's n bytes into a local buffer, then a local source of
 * the same size, and print both median rates (n * factor bytes per second)
 * as view_key and local_key. */
static void view_vs_local(const gpubuf_buffer *b, int device, uint64_t n, double factor,
                          const char *view_key, const char *local_key) {
    const gpubuf_cuda *cu;
    CUdeviceptr dst, src_local;
    CHECK(gpubuf_cuda_load(&cu));
    use_device(cu, device);
    if (cu->MemAlloc(&dst, n) || cu->MemAlloc(&src_local, n))
        _exit(3);
    cu->MemsetD32(src_local, 7, n / 4);
    printf("%s %.1f\n", view_key,
           copy_gbps(cu, dst, (CUdeviceptr)gpubuf_buffer_device_ptr(b), n, factor));
    printf("%s %.1f\n", local_key, copy_gbps(cu, dst, src_local, n, factor));
    cu->MemFree(dst);
    cu->MemFree(src_local);
}

/* A buffer of size bytes in --pool named name, filled with the pattern of
 * seed on its GPU; exits on failure. */
static gpubuf_buffer *alloc_filled(gpubuf_client *c, const char *name, uint64_t size,
                                   uint32_t seed) {
    gpubuf_buffer *b;
    CHECK(gpubuf_alloc(c, g_pool, size, name, &b));
    CHECK(gpubuf_pattern_fill_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b), size,
                                     seed));
    return b;
}

/* Device-to-device copy bandwidth: source a gpubuf view vs a local cuMemAlloc
 * (bytes read + written per second, like the anchor). */
static void bandwidth(void) {
    const uint64_t big = 1ull << 30;
    gpubuf_client *c = conn();
    gpubuf_buffer *b = alloc_filled(c, "bench/bw", big, 1);
    view_vs_local(b, gpubuf_buffer_device(b), big, 2.0, "dtod_GBps_gpubuf_view_median",
                  "dtod_GBps_local_median");
    gpubuf_release(b);
    gpubuf_delete(c, "bench/bw");
    gpubuf_disconnect(c);
}

/* Peer access: a 1 GiB buffer written on GPU 0 (in a process of its own),
 * read by GPU 1 through a view mapped there with gpubuf_set_device(1), next
 * to a copy local to GPU 1. Rates are bytes copied per second. */
static void peer_setup(void) {
    const uint64_t big = 1ull << 30;
    gpubuf_client *c = conn();
    gpubuf_buffer *b = alloc_filled(c, "bench/peer", big, 3);
    CHECK(gpubuf_seal_sync(b));
    printf("peer_buffer_device %d\n", gpubuf_buffer_device(b));
    gpubuf_disconnect(c);
}

static void peer_copy(void) {
    const uint64_t big = 1ull << 30;
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    uint64_t bad = 1;
    CHECK(gpubuf_set_device(c, 1));
    double t0 = now_us();
    CHECK(gpubuf_open(c, "bench/peer", 0, &b));
    printf("peer_open_first_us %.1f\n", now_us() - t0);
    printf("peer_view_device %d\npeer_view_memory_device %d\n", gpubuf_buffer_device(b),
           gpubuf_buffer_memory_device(b));
    CHECK(gpubuf_pattern_verify_device(1, gpubuf_buffer_device_ptr(b), big, 3, &bad));
    printf("peer_verify_mismatches %llu\n", (unsigned long long)bad);
    view_vs_local(b, 1, big, 1.0, "peer_copy_GBps_gpu1_reads_gpubuf_view_on_gpu0_median",
                  "peer_copy_GBps_gpu1_local_median");
    gpubuf_release(b);
    CHECK(gpubuf_delete(c, "bench/peer"));
    gpubuf_disconnect(c);
}

int bandwidth_phase(void) {
    return run_child(bandwidth);
}

int peer_phase(void) {
    return run_child(peer_setup) || run_child(peer_copy);
}
