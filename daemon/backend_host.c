/* host backend: slabs are memfd shared memory, passed to clients by SCM_RIGHTS.
 * The memfd is sealed against shrinking so no client can make another's
 * mapping fault with SIGBUS. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend.h"
#include "util.h"

static int host_slab_create(gpubuf_backend *be, uint64_t size, void **ret_priv,
                            gpubuf_slab_export *ret_export, char *err, size_t errlen) {
    (void)be;
    int fd = memfd_create("gpubuf-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "memfd_create: %s", strerror(e));
        return -e;
    }
    if (ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        snprintf(err, errlen, "ftruncate(%llu): %s", (unsigned long long)size, strerror(e));
        close(fd);
        return -e;
    }
    /* memfd inodes are created with mode 0777: anyone holding an fd could
     * reopen it for writing through /proc/self/fd. 0400 leaves that to the
     * daemon's uid (and root), so a read-only fd handed to another uid stays
     * read-only. Open fds keep the access they were opened with. */
    if (fchmod(fd, 0400) < 0) {
        int e = errno;
        snprintf(err, errlen, "fchmod: %s", strerror(e));
        close(fd);
        return -e;
    }
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int e = errno;
        snprintf(err, errlen, "F_ADD_SEALS: %s", strerror(e));
        close(fd);
        return -e;
    }
    memset(ret_export, 0, sizeof(*ret_export));
    ret_export->fd = fd;
    ret_export->ro_fd = -1;
    *ret_priv = NULL;
    return 0;
}

static void host_slab_destroy(gpubuf_backend *be, void *priv, gpubuf_slab_export *exp) {
    (void)be;
    (void)priv;
    if (exp->fd >= 0)
        close(exp->fd);
    if (exp->ro_fd >= 0)
        close(exp->ro_fd);
    exp->fd = exp->ro_fd = -1;
}

static void host_destroy(gpubuf_backend *be) {
    (void)be;
}

static const gpubuf_backend_ops host_ops = {
    .slab_create = host_slab_create,
    .slab_destroy = host_slab_destroy,
    .destroy = host_destroy,
};

int gpubuf_backend_host_new(gpubuf_backend **ret, char *err, size_t errlen) {
    gpubuf_backend *be = calloc(1, sizeof(*be));
    (void)err;
    (void)errlen;
    if (!be)
        return -ENOMEM;
    be->ops = &host_ops;
    be->kind = GPUBUF_POOL_HOST;
    be->device = -1;
    be->alignment = 256;
    be->granularity = (uint64_t)sysconf(_SC_PAGESIZE);
    snprintf(be->device_name, sizeof(be->device_name), "host");
    *ret = be;
    return 0;
}

gpubuf_backend *gpubuf_backend_free(gpubuf_backend *be) {
    if (be) {
        be->ops->destroy(be);
        free(be);
    }
    return NULL;
}

int gpubuf_backend_export_ro(gpubuf_backend *be, gpubuf_slab_export *exp, int *ret_fd, char *err,
                             size_t errlen) {
    char path[64];
    switch (be->kind) {
    case GPUBUF_POOL_HOST:
        if (exp->ro_fd < 0) {
            /* A new open file description of the same memfd, read-only: a
             * mapping of it cannot be made writable (mprotect fails with
             * EACCES), and the fd cannot be reopened for writing by its
             * receiver through /proc either (no write permission on it). */
            snprintf(path, sizeof(path), "/proc/self/fd/%d", exp->fd);
            exp->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
            if (exp->ro_fd < 0) {
                int e = errno;
                snprintf(err, errlen, "reopening a slab read-only (%s): %s", path, strerror(e));
                return -e;
            }
        }
        *ret_fd = exp->ro_fd;
        return 0;
    case GPUBUF_POOL_CUDA_VMM:
        *ret_fd = exp->fd;
        return 0;
    case GPUBUF_POOL_CUDA_IPC:
        break;
    }
    snprintf(err, errlen, "%s memory cannot be mapped read-only (CUDA IPC handles are always "
             "writable): open without the read-only flag, or use a cuda-vmm or host pool",
             gpubuf_pool_kind_name(be->kind));
    return -EOPNOTSUPP;
}

int gpubuf_pool_kind_parse(const char *s, gpubuf_pool_kind *ret) {
    if (strcmp(s, "host") == 0)
        *ret = GPUBUF_POOL_HOST;
    else if (strcmp(s, "cuda-ipc") == 0 || strcmp(s, "cuda") == 0)
        *ret = GPUBUF_POOL_CUDA_IPC;
    else if (strcmp(s, "cuda-vmm") == 0)
        *ret = GPUBUF_POOL_CUDA_VMM;
    else
        return -EINVAL;
    return 0;
}
