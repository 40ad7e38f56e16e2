#include "pattern.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "cuda_driver.h"
#include "gpubuf/gpubuf.h"

void gpubuf_pattern_fill(void *p, uint64_t len, uint32_t seed) {
    uint32_t *w = p;
    for (uint64_t i = 0; i < len / 4; i++)
        w[i] = gpubuf_pattern_word(i, seed);
}

uint64_t gpubuf_pattern_mismatches(const void *p, uint64_t len, uint32_t seed) {
    const uint32_t *w = p;
    uint64_t bad = 0;
    for (uint64_t i = 0; i < len / 4; i++)
        bad += w[i] != gpubuf_pattern_word(i, seed);
    return bad;
}

#ifdef GPUBUF_HAVE_CUDA
/* What both loops below share: the start of a grid-stride loop (the word
 * index in %rd4, the stride in %rd5), and word %rd4 of the pattern of seed
 * %r1 into %r6 (gpubuf_pattern_word). */
#define PTX_GRID_STRIDE_START                                                                      \
    "  mov.u32 %r2, %ctaid.x;\n"                                                                   \
    "  mov.u32 %r3, %ntid.x;\n"                                                                    \
    "  mov.u32 %r4, %tid.x;\n"                                                                     \
    "  mov.u32 %r5, %nctaid.x;\n"                                                                  \
    "  cvt.u64.u32 %rd3, %r4;\n"                                                                   \
    "  mad.wide.u32 %rd4, %r2, %r3, %rd3;\n"                                                       \
    "  mul.wide.u32 %rd5, %r5, %r3;\n"

#define PTX_PATTERN_WORD                                                                           \
    "  cvt.u32.u64 %r6, %rd4;\n"                                                                   \
    "  mul.lo.u32 %r6, %r6, 0x9E3779B1;\n"                                                         \
    "  xor.b32 %r6, %r6, %r1;\n"

/* Grid-stride loops over 32-bit words. */
static const char ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry gpubuf_fill(.param .u64 p_data, .param .u64 p_n, .param .u32 p_seed)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<8>;\n"
    "  .reg .b64 %rd<10>;\n"
    "  ld.param.u64 %rd1, [p_data];\n"
    "  ld.param.u64 %rd2, [p_n];\n"
    "  ld.param.u32 %r1, [p_seed];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    PTX_GRID_STRIDE_START
    "FILL_LOOP:\n"
    "  setp.ge.u64 %p, %rd4, %rd2;\n"
    "  @%p bra FILL_DONE;\n"
    PTX_PATTERN_WORD
    "  shl.b64 %rd6, %rd4, 2;\n"
    "  add.u64 %rd7, %rd1, %rd6;\n"
    "  st.global.u32 [%rd7], %r6;\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  bra FILL_LOOP;\n"
    "FILL_DONE:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry gpubuf_verify(.param .u64 p_data, .param .u64 p_n, .param .u32 p_seed,\n"
    "                              .param .u64 p_bad)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b32 %r<10>;\n"
    "  .reg .b64 %rd<12>;\n"
    "  ld.param.u64 %rd1, [p_data];\n"
    "  ld.param.u64 %rd2, [p_n];\n"
    "  ld.param.u32 %r1, [p_seed];\n"
    "  ld.param.u64 %rd8, [p_bad];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  cvta.to.global.u64 %rd8, %rd8;\n"
    PTX_GRID_STRIDE_START
    "VERIFY_LOOP:\n"
    "  setp.ge.u64 %p, %rd4, %rd2;\n"
    "  @%p bra VERIFY_DONE;\n"
    "  shl.b64 %rd6, %rd4, 2;\n"
    "  add.u64 %rd7, %rd1, %rd6;\n"
    "  ld.global.u32 %r7, [%rd7];\n"
    PTX_PATTERN_WORD
    "  setp.eq.u32 %p, %r6, %r7;\n"
    "  @%p bra VERIFY_NEXT;\n"
    "  atom.global.add.u32 %r8, [%rd8], 1;\n"
    "VERIFY_NEXT:\n"
    "  add.u64 %rd4, %rd4, %rd5;\n"
    "  bra VERIFY_LOOP;\n"
    "VERIFY_DONE:\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry gpubuf_spin(.param .u64 p_ns)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b64 %rd<6>;\n"
    "  ld.param.u64 %rd1, [p_ns];\n"
    "  mov.u64 %rd2, %globaltimer;\n"
    "SPIN_LOOP:\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "  sub.u64 %rd4, %rd3, %rd2;\n"
    "  setp.lt.u64 %p, %rd4, %rd1;\n"
    "  @%p bra SPIN_LOOP;\n"
    "  ret;\n"
    "}\n";

typedef struct kernels {
    const gpubuf_cuda *cu;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fill, verify;
} kernels;

static int kernels_load(int device, kernels *k) {
    CUdevice dev;
    CUresult r;
    char why[256];
    int rc = gpubuf_cuda_load(&k->cu);
    if (rc < 0) {
        fprintf(stderr, "pattern: %s\n", gpubuf_cuda_load_error());
        return rc;
    }
    if ((r = k->cu->DeviceGet(&dev, device)) != CUDA_SUCCESS ||
        (r = k->cu->DevicePrimaryCtxRetain(&k->ctx, dev)) != CUDA_SUCCESS ||
        (r = k->cu->CtxPushCurrent(k->ctx)) != CUDA_SUCCESS) {
        fprintf(stderr, "pattern: %s\n", gpubuf_cuda_describe(r, "context", why, sizeof(why)));
        return GPUBUF_ECUDA;
    }
    if ((r = k->cu->ModuleLoadData(&k->mod, ptx)) != CUDA_SUCCESS ||
        (r = k->cu->ModuleGetFunction(&k->fill, k->mod, "gpubuf_fill")) != CUDA_SUCCESS ||
        (r = k->cu->ModuleGetFunction(&k->verify, k->mod, "gpubuf_verify")) != CUDA_SUCCESS) {
        fprintf(stderr, "pattern: %s\n", gpubuf_cuda_describe(r, "PTX module", why, sizeof(why)));
        CUcontext ignored;
        k->cu->CtxPopCurrent(&ignored);
        return GPUBUF_ECUDA;
    }
    return 0;
}

static void kernels_unload(int device, kernels *k) {
    CUcontext ignored;
    CUdevice dev;
    k->cu->ModuleUnload(k->mod);
    k->cu->CtxPopCurrent(&ignored);
    if (k->cu->DeviceGet(&dev, device) == CUDA_SUCCESS)
        k->cu->DevicePrimaryCtxRelease(dev);
}

static int launch(kernels *k, CUfunction f, void **args) {
    char why[256];
    CUresult r = k->cu->LaunchKernel(f, 1024, 1, 1, 256, 1, 1, 0, NULL, args, NULL);
    if (r == CUDA_SUCCESS)
        r = k->cu->CtxSynchronize();
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "pattern: %s\n", gpubuf_cuda_describe(r, "kernel", why, sizeof(why)));
        return GPUBUF_ECUDA;
    }
    return 0;
}

int gpubuf_pattern_fill_device(int device, uint64_t dptr, uint64_t len, uint32_t seed) {
    kernels k;
    int r = kernels_load(device, &k);
    if (r < 0)
        return r;
    CUdeviceptr p = (CUdeviceptr)dptr;
    uint64_t n = len / 4;
    void *args[] = {&p, &n, &seed};
    r = launch(&k, k.fill, args);
    kernels_unload(device, &k);
    return r;
}

int gpubuf_pattern_verify_device(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                 uint64_t *ret_mismatches) {
    kernels k;
    CUdeviceptr bad = 0;
    uint32_t host_bad = 0;
    int r = kernels_load(device, &k);
    if (r < 0)
        return r;
    if (k.cu->MemAlloc(&bad, 4) != CUDA_SUCCESS || k.cu->MemsetD32(bad, 0, 1) != CUDA_SUCCESS) {
        r = GPUBUF_ECUDA;
        goto out;
    }
    CUdeviceptr p = (CUdeviceptr)dptr;
    uint64_t n = len / 4;
    void *args[] = {&p, &n, &seed, &bad};
    r = launch(&k, k.verify, args);
    if (r == 0 && k.cu->MemcpyDtoH(&host_bad, bad, 4) != CUDA_SUCCESS)
        r = GPUBUF_ECUDA;
    if (r == 0)
        *ret_mismatches = host_bad;
out:
    if (bad)
        k.cu->MemFree(bad);
    kernels_unload(device, &k);
    return r;
}
/* One module per device, loaded on first use and kept: kernels enqueued on a
 * stream may still run when the call returns. */
static struct {
    pthread_mutex_t lock;
    CUmodule mod[64];
    CUfunction fill[64], verify[64], spin[64];
} g_async = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int async_kernels(int device, const gpubuf_cuda **ret_cu, CUcontext *ret_ctx) {
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUresult r = CUDA_SUCCESS;
    char why[256];
    int rc = gpubuf_cuda_load(&cu);
    if (rc < 0 || device < 0 || device >= 64)
        return rc < 0 ? rc : GPUBUF_ENODEVICE;
    if ((r = cu->DeviceGet(&dev, device)) != CUDA_SUCCESS ||
        (r = cu->DevicePrimaryCtxRetain(ret_ctx, dev)) != CUDA_SUCCESS)
        goto fail;
    pthread_mutex_lock(&g_async.lock);
    cu->CtxPushCurrent(*ret_ctx);
    if (!g_async.mod[device] &&
        ((r = cu->ModuleLoadData(&g_async.mod[device], ptx)) != CUDA_SUCCESS ||
         (r = cu->ModuleGetFunction(&g_async.fill[device], g_async.mod[device],
                                    "gpubuf_fill")) != CUDA_SUCCESS ||
         (r = cu->ModuleGetFunction(&g_async.verify[device], g_async.mod[device],
                                    "gpubuf_verify")) != CUDA_SUCCESS ||
         (r = cu->ModuleGetFunction(&g_async.spin[device], g_async.mod[device],
                                    "gpubuf_spin")) != CUDA_SUCCESS))
        g_async.mod[device] = NULL;
    pthread_mutex_unlock(&g_async.lock);
    if (r != CUDA_SUCCESS) {
        CUcontext ignored;
        cu->CtxPopCurrent(&ignored);
        cu->DevicePrimaryCtxRelease(dev);
        goto fail;
    }
    *ret_cu = cu;
    return 0;
fail:
    fprintf(stderr, "pattern: %s\n", gpubuf_cuda_describe(r, "PTX module", why, sizeof(why)));
    return GPUBUF_ECUDA;
}

static void async_done(const gpubuf_cuda *cu, int device) {
    CUcontext ignored;
    CUdevice dev;
    cu->CtxPopCurrent(&ignored);
    if (cu->DeviceGet(&dev, device) == CUDA_SUCCESS)
        cu->DevicePrimaryCtxRelease(dev);
}

int gpubuf_pattern_fill_device_async(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                     void *stream, uint32_t spin_us) {
    const gpubuf_cuda *cu;
    CUcontext ctx;
    CUresult r = CUDA_SUCCESS;
    char why[256];
    int rc = async_kernels(device, &cu, &ctx);
    if (rc < 0)
        return rc;
    CUdeviceptr p = (CUdeviceptr)dptr;
    uint64_t n = len / 4, ns = (uint64_t)spin_us * 1000;
    void *spin_args[] = {&ns};
    void *fill_args[] = {&p, &n, &seed};
    if (spin_us)
        r = cu->LaunchKernel(g_async.spin[device], 1, 1, 1, 1, 1, 1, 0, (CUstream)stream,
                             spin_args, NULL);
    if (r == CUDA_SUCCESS)
        r = cu->LaunchKernel(g_async.fill[device], 1024, 1, 1, 256, 1, 1, 0, (CUstream)stream,
                             fill_args, NULL);
    async_done(cu, device);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "pattern: %s\n", gpubuf_cuda_describe(r, "fill kernel", why, sizeof(why)));
        return GPUBUF_ECUDA;
    }
    return 0;
}

int gpubuf_pattern_verify_device_stream(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                        void *stream, uint64_t *ret_mismatches) {
    const gpubuf_cuda *cu;
    CUcontext ctx;
    CUdeviceptr bad = 0;
    uint32_t host_bad = 0;
    CUresult r;
    char why[256];
    int rc = async_kernels(device, &cu, &ctx);
    if (rc < 0)
        return rc;
    CUdeviceptr p = (CUdeviceptr)dptr;
    uint64_t n = len / 4;
    void *args[] = {&p, &n, &seed, &bad};
    if ((r = cu->MemAlloc(&bad, 4)) == CUDA_SUCCESS &&
        (r = cu->MemsetD32(bad, 0, 1)) == CUDA_SUCCESS &&
        (r = cu->LaunchKernel(g_async.verify[device], 1024, 1, 1, 256, 1, 1, 0, (CUstream)stream,
                              args, NULL)) == CUDA_SUCCESS &&
        (r = cu->StreamSynchronize((CUstream)stream)) == CUDA_SUCCESS)
        r = cu->MemcpyDtoH(&host_bad, bad, 4);
    if (bad)
        cu->MemFree(bad);
    async_done(cu, device);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "pattern: %s\n", gpubuf_cuda_describe(r, "verify kernel", why, sizeof(why)));
        return GPUBUF_ECUDA;
    }
    *ret_mismatches = host_bad;
    return 0;
}
#else
int gpubuf_pattern_fill_device_async(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                     void *stream, uint32_t spin_us) {
    (void)device, (void)dptr, (void)len, (void)seed, (void)stream, (void)spin_us;
    return GPUBUF_ENODRIVER;
}

int gpubuf_pattern_verify_device_stream(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                        void *stream, uint64_t *ret_mismatches) {
    (void)device, (void)dptr, (void)len, (void)seed, (void)stream, (void)ret_mismatches;
    return GPUBUF_ENODRIVER;
}

int gpubuf_pattern_fill_device(int device, uint64_t dptr, uint64_t len, uint32_t seed) {
    (void)device, (void)dptr, (void)len, (void)seed;
    return GPUBUF_ENODRIVER;
}

int gpubuf_pattern_verify_device(int device, uint64_t dptr, uint64_t len, uint32_t seed,
                                 uint64_t *ret_mismatches) {
    (void)device, (void)dptr, (void)len, (void)seed, (void)ret_mismatches;
    return GPUBUF_ENODRIVER;
}
#endif
