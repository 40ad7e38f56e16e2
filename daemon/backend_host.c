/* host backend: slabs are memfd shared memory, passed to clients by SCM_RIGHTS.
 * The memfd is sealed against shrinking so no client can make another's
 * mapping fault with SIGBUS. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"

static int host_slab_create(gd_backend *be, uint64_t size, void **ret_priv,
                            gd_slab_export *ret_export, gd_err *err) {
    (void)be;
    int fd = memfd_create("gpubuf-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = errno;
        gd_err_set(err, -e, "memfd_create: %s", strerror(e));
        return -e;
    }
    if (ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        gd_err_set(err, -e, "ftruncate(%llu): %s", (unsigned long long)size, strerror(e));
        close(fd);
        return -e;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int e = errno;
        gd_err_set(err, -e, "F_ADD_SEALS: %s", strerror(e));
        close(fd);
        return -e;
    }
    memset(ret_export, 0, sizeof(*ret_export));
    ret_export->fd = fd;
    *ret_priv = NULL;
    return 0;
}

static void host_slab_destroy(gd_backend *be, void *priv, gd_slab_export *exp) {
    (void)be;
    (void)priv;
    if (exp->fd >= 0)
        close(exp->fd);
    exp->fd = -1;
}

static void host_destroy(gd_backend *be) {
    (void)be;
}

static const gd_backend_ops host_ops = {
    .slab_create = host_slab_create,
    .slab_destroy = host_slab_destroy,
    .destroy = host_destroy,
};

int gd_backend_host_new(gd_backend **ret, gd_err *err) {
    gd_backend *be = calloc(1, sizeof(*be));
    if (!be)
        return gd_err_set(err, -ENOMEM, "out of memory");
    be->ops = &host_ops;
    be->kind = GPUBUF_POOL_HOST;
    be->device = -1;
    be->alignment = 256;
    be->granularity = gd_backend_granularity(GPUBUF_POOL_HOST);
    snprintf(be->device_name, sizeof(be->device_name), "host");
    *ret = be;
    return 0;
}

gd_backend *gd_backend_free(gd_backend *be) {
    if (be) {
        be->ops->destroy(be);
        free(be);
    }
    return NULL;
}

uint64_t gd_backend_granularity(gpubuf_pool_kind kind) {
    return kind == GPUBUF_POOL_CUDA_IPC ? GD_CUDA_GRANULARITY : (uint64_t)sysconf(_SC_PAGESIZE);
}

const char *gd_pool_kind_name(gpubuf_pool_kind kind) {
    switch (kind) {
    case GPUBUF_POOL_HOST: return "host";
    case GPUBUF_POOL_CUDA_IPC: return "cuda-ipc";
    }
    return "unknown";
}

int gd_pool_kind_parse(const char *s, gpubuf_pool_kind *ret) {
    if (strcmp(s, "host") == 0)
        *ret = GPUBUF_POOL_HOST;
    else if (strcmp(s, "cuda-ipc") == 0 || strcmp(s, "cuda") == 0)
        *ret = GPUBUF_POOL_CUDA_IPC;
    else
        return -EINVAL;
    return 0;
}
