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
    /* memfd inodes are created with mode 0777: anyone holding an fd could
     * reopen it for writing through /proc/self/fd. 0400 leaves that to the
     * daemon's uid (and root), so a read-only fd handed to another uid stays
     * read-only. Open fds keep the access they were opened with. */
    if (fchmod(fd, 0400) < 0) {
        int e = errno;
        gd_err_set(err, -e, "fchmod: %s", strerror(e));
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
    ret_export->ro_fd = -1;
    *ret_priv = NULL;
    return 0;
}

static void host_slab_destroy(gd_backend *be, void *priv, gd_slab_export *exp) {
    (void)be;
    (void)priv;
    if (exp->fd >= 0)
        close(exp->fd);
    if (exp->ro_fd >= 0)
        close(exp->ro_fd);
    exp->fd = exp->ro_fd = -1;
}

/* A memfd of this size sealed as host_slab_create seals it. */
static int host_slab_adopt(gd_backend *be, int fd, uint64_t size, void **ret_priv,
                           gd_slab_export *ret_export, gd_err *err) {
    struct stat st;
    int seals;
    const int want = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
    (void)be;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        return gd_err_set(err, -EBADF, "not a memfd");
    if ((seals = fcntl(fd, F_GET_SEALS)) < 0 || (seals & want) != want)
        return gd_err_set(err, -EBADF, "not a sealed memfd");
    if ((uint64_t)st.st_size != size)
        return gd_err_set(err, -EBADF, "memfd of %lld bytes, %llu expected", (long long)st.st_size,
                          (unsigned long long)size);
    if ((fcntl(fd, F_GETFL) & O_ACCMODE) != O_RDWR)
        return gd_err_set(err, -EBADF, "memfd not open for reading and writing");
    memset(ret_export, 0, sizeof(*ret_export));
    ret_export->fd = fd;
    ret_export->ro_fd = -1;
    *ret_priv = NULL;
    return 0;
}

static void host_destroy(gd_backend *be) {
    (void)be;
}

static const gd_backend_ops host_ops = {
    .slab_create = host_slab_create,
    .slab_destroy = host_slab_destroy,
    .slab_adopt = host_slab_adopt,
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
    return kind == GPUBUF_POOL_HOST ? (uint64_t)sysconf(_SC_PAGESIZE) : GD_CUDA_GRANULARITY;
}

int gd_backend_export_ro(gd_backend *be, gd_slab_export *exp, int *ret_fd, gd_err *err) {
    char path[64];
    switch (be->kind) {
    case GPUBUF_POOL_HOST:
        if (exp->ro_fd < 0) {
            /* A new open file description of the same memfd, read-only: a
             * mapping of it cannot be made writable (mprotect fails with
             * EACCES), and a receiver of another uid cannot reopen it for
             * writing through /proc either (the inode is 0400). */
            snprintf(path, sizeof(path), "/proc/self/fd/%d", exp->fd);
            exp->ro_fd = open(path, O_RDONLY | O_CLOEXEC);
            if (exp->ro_fd < 0) {
                int e = errno;
                return gd_err_set(err, -e, "reopening a slab read-only (%s): %s", path,
                                  strerror(e));
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
    /* The registry refuses such opens first, with the full sentence. */
    return gd_err_set(err, -EOPNOTSUPP, "%s memory cannot be mapped read-only",
                      gpubuf_pool_kind_name(be->kind));
}

int gd_pool_kind_parse(const char *s, gpubuf_pool_kind *ret) {
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
