/* cuda-ipc backend: slabs are cuMemAlloc allocations in the device's primary
 * context; clients map them with the 64-byte cuIpcGetMemHandle blob. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_driver.h"

#ifdef GPUBUF_HAVE_CUDA
typedef struct cuda_impl {
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUcontext ctx;
} cuda_impl;

typedef struct cuda_slab {
    CUdeviceptr ptr;
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

int gd_backend_cuda_ipc_new(int device, gd_backend **ret, gd_err *err) {
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
    be->kind = GPUBUF_POOL_CUDA_IPC;
    be->device = device;
    memcpy(be->uuid, uuid.bytes, 16);
    be->has_uuid = true;
    be->alignment = 512;
    be->granularity = GD_CUDA_GRANULARITY;
    be->device_total = total;
    be->impl = im;
    *ret = be;
    return 0;
fail:
    free(im);
    free(be);
    return rc;
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
#endif
