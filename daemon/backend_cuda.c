/* CUDA backends.
 * cuda-ipc: slabs are cuMemAlloc allocations in the device's primary context;
 * clients map them with the 64-byte cuIpcGetMemHandle blob.
 * cuda-vmm: slabs are cuMemCreate allocations exported once as a POSIX file
 * descriptor (cuMemExportToShareableHandle); the fd travels by SCM_RIGHTS and
 * clients import, reserve, map and set access themselves. The daemon never
 * maps a cuda-vmm slab. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "cuda_driver.h"

#ifdef GPUBUF_HAVE_CUDA
typedef struct cuda_impl {
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUcontext ctx;
} cuda_impl;

typedef struct cuda_slab {
    CUdeviceptr ptr;                /* cuda-ipc */
    CUmemGenericAllocationHandle h; /* cuda-vmm */
} cuda_slab;

/* A failed driver call: the code is chosen by its CUresult, the sentence names
 * the call and the driver's error. */
static int cuda_fail(gd_err *err, CUresult r, const char *what) {
    char why[200];
    gpubuf_cuda_describe(r, what, why, sizeof(why));
    return gd_err_set(err, gpubuf_cuda_code(r), "%s", why);
}

static int cuda_slab_create(gd_backend *be, uint64_t size, void **ret_priv,
                            gd_slab_export *ret_export, gd_err *err) {
    cuda_impl *im = be->impl;
    const gpubuf_cuda *cu = im->cu;
    cuda_slab *s = calloc(1, sizeof(*s));
    CUipcMemHandle h;
    CUresult r;
    if (!s)
        return gd_err_set(err, -ENOMEM, "out of memory");
    cu->CtxSetCurrent(im->ctx);
    r = cu->MemAlloc(&s->ptr, (size_t)size);
    if (r != CUDA_SUCCESS) {
        free(s);
        return cuda_fail(err, r, "cuMemAlloc");
    }
    r = cu->IpcGetMemHandle(&h, s->ptr);
    if (r != CUDA_SUCCESS) {
        cu->MemFree(s->ptr);
        free(s);
        return cuda_fail(err, r, "cuIpcGetMemHandle");
    }
    memset(ret_export, 0, sizeof(*ret_export));
    ret_export->fd = -1;
    ret_export->ro_fd = -1;
    memcpy(ret_export->ipc_handle, h.reserved, GPUBUF_IPC_HANDLE_SIZE);
    ret_export->has_ipc_handle = true;
    *ret_priv = s;
    return 0;
}

static void cuda_slab_destroy(gd_backend *be, void *priv, gd_slab_export *exp) {
    cuda_impl *im = be->impl;
    cuda_slab *s = priv;
    (void)exp;
    im->cu->CtxSetCurrent(im->ctx);
    im->cu->MemFree(s->ptr);
    free(s);
}

static void cuda_destroy(gd_backend *be) {
    cuda_impl *im = be->impl;
    if (im) {
        im->cu->DevicePrimaryCtxRelease(im->dev);
        free(im);
    }
}

static const gd_backend_ops cuda_ops = {
    .slab_create = cuda_slab_create,
    .slab_destroy = cuda_slab_destroy,
    .destroy = cuda_destroy,
};

static CUmemAllocationProp vmm_prop(CUdevice dev) {
    CUmemAllocationProp p;
    memset(&p, 0, sizeof(p));
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = (int)dev;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return p;
}

static int vmm_slab_create(gd_backend *be, uint64_t size, void **ret_priv,
                           gd_slab_export *ret_export, gd_err *err) {
    cuda_impl *im = be->impl;
    const gpubuf_cuda *cu = im->cu;
    CUmemAllocationProp prop = vmm_prop(im->dev);
    cuda_slab *s = calloc(1, sizeof(*s));
    int fd = -1;
    CUresult r;
    if (!s)
        return gd_err_set(err, -ENOMEM, "out of memory");
    cu->CtxSetCurrent(im->ctx);
    r = cu->MemCreate(&s->h, (size_t)size, &prop, 0);
    if (r != CUDA_SUCCESS) {
        free(s);
        return cuda_fail(err, r, "cuMemCreate");
    }
    r = cu->MemExportToShareableHandle(&fd, s->h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    if (r != CUDA_SUCCESS) {
        cu->MemRelease(s->h);
        free(s);
        return cuda_fail(err, r, "cuMemExportToShareableHandle");
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    memset(ret_export, 0, sizeof(*ret_export));
    ret_export->fd = fd;
    ret_export->ro_fd = -1;
    *ret_priv = s;
    return 0;
}

/* The memory itself lives on while an importer holds it. */
static void vmm_slab_destroy(gd_backend *be, void *priv, gd_slab_export *exp) {
    cuda_impl *im = be->impl;
    cuda_slab *s = priv;
    if (exp->fd >= 0)
        close(exp->fd);
    exp->fd = -1;
    im->cu->CtxSetCurrent(im->ctx);
    im->cu->MemRelease(s->h);
    free(s);
}

/* A slab a previous daemon made: import the allocation from the fd it kept
 * (cuMemImportFromShareableHandle), and check by mapping it that it holds
 * size bytes and lives on this pool's device. The fd stays the slab's
 * export: an importer gets the same allocation from it. */
static int vmm_slab_adopt(gd_backend *be, int fd, uint64_t size, void **ret_priv,
                          gd_slab_export *ret_export, gd_err *err) {
    cuda_impl *im = be->impl;
    const gpubuf_cuda *cu = im->cu;
    CUdeviceptr va = 0;
    CUresult r;
    int rc;
    cuda_slab *s = calloc(1, sizeof(*s));
    if (!s)
        return gd_err_set(err, -ENOMEM, "out of memory");
    if (size == 0 || size % be->granularity) {
        free(s);
        return gd_err_set(err, -EINVAL, "size %llu is not a multiple of the granularity",
                          (unsigned long long)size);
    }
    cu->CtxSetCurrent(im->ctx);
    r = cu->MemImportFromShareableHandle(&s->h, (void *)(uintptr_t)fd,
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (r != CUDA_SUCCESS) {
        free(s);
        return cuda_fail(err, r, "cuMemImportFromShareableHandle");
    }
    /* cuMemMap fails when the allocation is smaller than size or of
     * another device's memory than the range is made accessible on. */
    CUmemAccessDesc acc = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = (int)im->dev},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if ((r = cu->MemAddressReserve(&va, (size_t)size, 0, 0, 0)) != CUDA_SUCCESS) {
        rc = cuda_fail(err, r, "cuMemAddressReserve");
        goto fail;
    }
    if ((r = cu->MemMap(va, (size_t)size, 0, s->h, 0)) != CUDA_SUCCESS) {
        cu->MemAddressFree(va, (size_t)size);
        rc = cuda_fail(err, r, "cuMemMap (allocation smaller than the saved size?)");
        goto fail;
    }
    r = cu->MemSetAccess(va, (size_t)size, &acc, 1);
    cu->MemUnmap(va, (size_t)size);
    cu->MemAddressFree(va, (size_t)size);
    if (r != CUDA_SUCCESS) {
        rc = cuda_fail(err, r, "cuMemSetAccess (memory of another device?)");
        goto fail;
    }
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    memset(ret_export, 0, sizeof(*ret_export));
    ret_export->fd = fd;
    ret_export->ro_fd = -1;
    *ret_priv = s;
    return 0;
fail:
    cu->MemRelease(s->h);
    free(s);
    return rc;
}

static const gd_backend_ops vmm_ops = {
    .slab_create = vmm_slab_create,
    .slab_destroy = vmm_slab_destroy,
    .slab_adopt = vmm_slab_adopt,
    .destroy = cuda_destroy,
};

/* cuda-vmm needs VMM and POSIX-fd handles; its granularity is the device's. */
static int vmm_check(const gpubuf_cuda *cu, cuda_impl *im, gd_backend *be, int device,
                     gd_err *err) {
    int vmm = 0, posix = 0;
    size_t gran = 0;
    CUmemAllocationProp prop = vmm_prop(im->dev);
    cu->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, im->dev);
    cu->DeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                           im->dev);
    if (!vmm || !posix)
        return gd_err_set(err, -EOPNOTSUPP,
                          "CUDA device %d (%s) does not support %s: use a cuda-ipc pool", device,
                          be->device_name,
                          !vmm ? "virtual memory management"
                               : "POSIX file descriptor handles for VMM memory");
    CUresult r = cu->MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS)
        return cuda_fail(err, r, "cuMemGetAllocationGranularity");
    if (gran == 0 || (gran & (gran - 1)) || gran > (1ull << 30))
        return gd_err_set(err, GPUBUF_ECUDA, "CUDA device %d reports an allocation granularity "
                          "of %zu bytes", device, gran);
    be->ops = &vmm_ops;
    be->granularity = gran < GD_CUDA_GRANULARITY ? GD_CUDA_GRANULARITY : gran;
    return 0;
}

int gd_backend_cuda_device_count(gd_err *err) {
    const gpubuf_cuda *cu;
    int n = 0;
    if (gpubuf_cuda_load(&cu) < 0) {
        gd_err_set(err, GPUBUF_ENODRIVER, "%s", gpubuf_cuda_load_error());
        return 0;
    }
    if (cu->DeviceGetCount(&n) != CUDA_SUCCESS)
        return 0;
    return n;
}

static int cuda_backend_new(gpubuf_pool_kind kind, int device, gd_backend **ret, gd_err *err) {
    const gpubuf_cuda *cu;
    gd_backend *be = NULL;
    cuda_impl *im = NULL;
    CUuuid uuid;
    CUresult r;
    size_t total = 0;
    int n = 0, rc = gpubuf_cuda_load(&cu);
    if (rc < 0) {
        return gd_err_set(err, rc, "%s", gpubuf_cuda_load_error());
    }
    cu->DeviceGetCount(&n);
    if (device < 0 || device >= n) {
        return gd_err_set(err, GPUBUF_ENODEVICE, "CUDA device %d does not exist (%d visible)", device,
                          n);
    }
    be = calloc(1, sizeof(*be));
    im = calloc(1, sizeof(*im));
    if (!be || !im) {
        rc = gd_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    im->cu = cu;
    if ((r = cu->DeviceGet(&im->dev, device)) != CUDA_SUCCESS ||
        (r = cu->DevicePrimaryCtxRetain(&im->ctx, im->dev)) != CUDA_SUCCESS) {
        rc = cuda_fail(err, r, "primary context");
        goto fail;
    }
    cu->DeviceGetUuid(&uuid, im->dev);
    cu->DeviceTotalMem(&total, im->dev);
    cu->DeviceGetName(be->device_name, (int)sizeof(be->device_name), im->dev);
    be->ops = &cuda_ops;
    be->granularity = GD_CUDA_GRANULARITY;
    if (kind == GPUBUF_POOL_CUDA_VMM && (rc = vmm_check(cu, im, be, device, err)) < 0) {
        cu->DevicePrimaryCtxRelease(im->dev);
        goto fail;
    }
    be->kind = kind;
    be->device = device;
    memcpy(be->uuid, uuid.bytes, 16);
    be->has_uuid = true;
    be->alignment = 512;
    be->device_total = total;
    be->impl = im;
    *ret = be;
    return 0;
fail:
    free(im);
    free(be);
    return rc;
}

int gd_backend_cuda_ipc_new(int device, gd_backend **ret, gd_err *err) {
    return cuda_backend_new(GPUBUF_POOL_CUDA_IPC, device, ret, err);
}

int gd_backend_cuda_vmm_new(int device, gd_backend **ret, gd_err *err) {
    return cuda_backend_new(GPUBUF_POOL_CUDA_VMM, device, ret, err);
}
#else
int gd_backend_cuda_device_count(gd_err *err) {
    gd_err_set(err, GPUBUF_ENODRIVER, "gpubufd was built without CUDA support");
    return 0;
}

int gd_backend_cuda_ipc_new(int device, gd_backend **ret, gd_err *err) {
    (void)device;
    (void)ret;
    return gd_err_set(err, GPUBUF_ENODRIVER,
                      "gpubufd was built without CUDA support (GPUBUF_WITH_CUDA=OFF)");
}

int gd_backend_cuda_vmm_new(int device, gd_backend **ret, gd_err *err) {
    return gd_backend_cuda_ipc_new(device, ret, err);
}
#endif
