/* copies: host-to-device, device-to-host and device-to-device copies through
 * gpubuf views against the same copies between local allocations. Built
 * only with CUDA. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "pattern.h"

/* An entry point the driver table of common/cuda_driver.h does not have,
 * resolved like the table's (cuGetProcAddress, CUDA 12.0 ABI). */
static void *driver_symbol(const char *sym) {
    typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_proc_fn gp = lib ? (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    void *fn = NULL;
    if (!gp || gp(sym, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS ||
        q != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
        fprintf(stderr, "bench: cannot resolve %s in libcuda.so.1\n", sym);
        _exit(1);
    }
    return fn;
}

/* Copy bandwidth through gpubuf views against the same copy between local
 * cuMemAlloc allocations, on one stream, timed with events: host<->device
 * (pinned host memory from cuMemHostAlloc) and device to device. gpubuf and
 * local copies alternate; 2 warm-ups, then the median of 10 of each.
 * Rates are bytes copied per second. */
enum { COPY_H2D, COPY_D2H, COPY_D2D };

typedef struct copy_case {
    const char *key;
    int kind;
    gpubuf_buffer *dst, *src; /* gpubuf views: dst for H2D and D2D, src for D2H and D2D */
    CUdeviceptr ldst, lsrc;   /* local allocations, the same roles */
    void *host;
    uint64_t n;
} copy_case;

/* The copy of k between local allocations (local_copy, a driver call) or
 * through the gpubuf views (view_copy, a gpubuf call); exits on failure. */
#define LOCAL_OR_VIEW(local_copy, view_copy)                                                       \
    do {                                                                                           \
        if (local)                                                                                 \
            CU(g, local_copy);                                                                     \
        else                                                                                       \
            CHECK(view_copy);                                                                      \
    } while (0)

static void copy_enqueue(const bench_gpu *g, const copy_case *k, int local) {
    gpubuf_stream s = (gpubuf_stream)g->st;
    switch (k->kind) {
    case COPY_H2D:
        LOCAL_OR_VIEW(MemcpyHtoDAsync(k->ldst, k->host, (size_t)k->n, g->st),
                      gpubuf_buffer_copy_from_host_async(k->dst, 0, k->host, k->n, s));
        break;
    case COPY_D2H:
        LOCAL_OR_VIEW(MemcpyDtoHAsync(k->host, k->lsrc, (size_t)k->n, g->st),
                      gpubuf_buffer_copy_to_host_async(k->src, 0, k->host, k->n, s));
        break;
    default:
        LOCAL_OR_VIEW(MemcpyDtoDAsync(k->ldst, k->lsrc, (size_t)k->n, g->st),
                      gpubuf_buffer_copy(k->dst, 0, k->src, 0, k->n, s));
        break;
    }
}

static void copy_compare(const bench_gpu *g, const copy_case *k) {
    enum { REPS = 12, WARM = 2 };
    double bw[2][REPS - WARM];
    CUevent e0, e1;
    CU(g, EventCreate(&e0, CU_EVENT_DEFAULT));
    CU(g, EventCreate(&e1, CU_EVENT_DEFAULT));
    for (int rep = 0; rep < REPS; rep++) {
        for (int j = 0; j < 2; j++) {
            int local = (rep + j) & 1;
            float ms = 0;
            CU(g, EventRecord(e0, g->st));
            copy_enqueue(g, k, local);
            CU(g, EventRecord(e1, g->st));
            CU(g, EventSynchronize(e1));
            CU(g, EventElapsedTime(&ms, e0, e1));
            if (rep >= WARM)
                bw[local][rep - WARM] = (double)k->n / (ms / 1e3) / 1e9;
        }
    }
    CU(g, EventDestroy(e0));
    CU(g, EventDestroy(e1));
    qsort(bw[0], REPS - WARM, sizeof(double), cmpd);
    qsort(bw[1], REPS - WARM, sizeof(double), cmpd);
    printf("copy_%s_gpubuf_GBps %.1f\ncopy_%s_local_GBps %.1f\n", k->key,
           bw[0][(REPS - WARM) / 2], k->key, bw[1][(REPS - WARM) / 2]);
}

static void copies(void) {
    typedef CUresult (*host_alloc_fn)(void **, size_t, unsigned int);
    typedef CUresult (*free_host_fn)(void *);
    const uint64_t big = 1ull << 30, hsize = 256ull << 20;
    const uint32_t seed = 71;
    gpubuf_client *c = conn();
    gpubuf_buffer *va, *vb, *ia;
    CUdeviceptr la, lb;
    void *host = NULL;
    uint64_t bad_vmm = 1, bad_ipc = 1;
    bench_gpu g;
    gpu_open(&g, 0);
    host_alloc_fn host_alloc = (host_alloc_fn)driver_symbol("cuMemHostAlloc");
    free_host_fn free_host = (free_host_fn)driver_symbol("cuMemFreeHost");
    CHECK(gpubuf_alloc(c, g_vmm_pool, big, NULL, &va));
    CHECK(gpubuf_alloc(c, g_vmm_pool, big, NULL, &vb));
    CHECK(gpubuf_alloc(c, g_pool, big, NULL, &ia));
    expect_device0(va);
    expect_device0(vb);
    expect_device0(ia);
    if (gpubuf_buffer_pool_kind(va) != GPUBUF_POOL_CUDA_VMM ||
        gpubuf_buffer_pool_kind(ia) != GPUBUF_POOL_CUDA_IPC) {
        fprintf(stderr, "bench: copies need a cuda-vmm --vmm-pool and a cuda-ipc --pool\n");
        _exit(1);
    }
    CU(&g, MemAlloc(&la, (size_t)big));
    CU(&g, MemAlloc(&lb, (size_t)big));
    CU(&g, MemsetD32(la, 7, (size_t)(big / 4)));
    CU(&g, MemsetD32(lb, 0, (size_t)(big / 4)));
    CUresult hr = host_alloc(&host, (size_t)hsize, CU_MEMHOSTALLOC_PORTABLE);
    if (hr != CUDA_SUCCESS) {
        char why[256];
        fprintf(stderr, "bench: %s\n", gpubuf_cuda_describe(hr, "cuMemHostAlloc", why, sizeof(why)));
        _exit(1);
    }
    memset(host, 3, (size_t)hsize);
    const copy_case cases[] = {
        {.key = "h2d_vmm", .kind = COPY_H2D, .dst = va, .ldst = la, .host = host, .n = hsize},
        {.key = "d2h_vmm", .kind = COPY_D2H, .src = va, .lsrc = la, .host = host, .n = hsize},
        {.key = "h2d_ipc", .kind = COPY_H2D, .dst = ia, .ldst = la, .host = host, .n = hsize},
        {.key = "d2h_ipc", .kind = COPY_D2H, .src = ia, .lsrc = la, .host = host, .n = hsize},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        copy_compare(&g, &cases[i]);
    /* Device to device from a patterned source, checked afterwards. */
    CHECK(gpubuf_pattern_fill_device(0, gpubuf_buffer_device_ptr(va), big, seed));
    const copy_case d2d[] = {
        {.key = "d2d_vmm_to_vmm", .kind = COPY_D2D, .dst = vb, .src = va, .ldst = lb, .lsrc = la,
         .n = big},
        {.key = "d2d_vmm_to_ipc", .kind = COPY_D2D, .dst = ia, .src = va, .ldst = lb, .lsrc = la,
         .n = big},
    };
    for (size_t i = 0; i < sizeof(d2d) / sizeof(d2d[0]); i++)
        copy_compare(&g, &d2d[i]);
    CHECK(gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(vb), big, seed, &bad_vmm));
    CHECK(gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(ia), big, seed, &bad_ipc));
    printf("copy_d2d_verify_mismatches %llu\n", (unsigned long long)(bad_vmm + bad_ipc));
    CU(&g, MemFree(la));
    CU(&g, MemFree(lb));
    hr = free_host(host);
    if (hr != CUDA_SUCCESS)
        _exit(1);
    CHECK(gpubuf_release(va));
    CHECK(gpubuf_release(vb));
    CHECK(gpubuf_release(ia));
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

int copies_phase(void) {
    return run_child(copies);
}
