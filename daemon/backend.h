/* Backend room: where slab memory comes from. One small vtable per kind.
 * The pool above carves slabs into buffers; backends know nothing of buffers. */
#ifndef GPUBUFD_BACKEND_H
#define GPUBUFD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "error.h"
#include "gpubuf/gpubuf.h"

#define GPUBUF_IPC_HANDLE_SIZE 64

/* What a client needs to map a slab. */
typedef struct gd_slab_export {
    int fd;                                   /* host: memfd; cuda-vmm: exported handle; else -1 */
    int ro_fd;                                /* host: read-only file description, made on
                                               * the first read-only open; else -1 */
    uint8_t ipc_handle[GPUBUF_IPC_HANDLE_SIZE]; /* cuda-ipc */
    bool has_ipc_handle;
} gd_slab_export;

typedef struct gd_backend gd_backend;

typedef struct gd_backend_ops {
    /* Create a slab of size bytes. On failure return a negative code and
     * write a sentence into err. */
    int (*slab_create)(gd_backend *be, uint64_t size, void **ret_priv,
                       gd_slab_export *ret_export, gd_err *err);
    void (*slab_destroy)(gd_backend *be, void *priv, gd_slab_export *exp);
    /* Take up a slab of size bytes that a previous daemon made, from the fd
     * it kept (a restart): check that fd is such a slab, and on success own
     * it. NULL for kinds whose memory dies with the process (cuda-ipc). */
    int (*slab_adopt)(gd_backend *be, int fd, uint64_t size, void **ret_priv,
                      gd_slab_export *ret_export, gd_err *err);
    void (*destroy)(gd_backend *be);
} gd_backend_ops;

struct gd_backend {
    const gd_backend_ops *ops;
    gpubuf_pool_kind kind;
    int device;          /* CUDA ordinal, -1 for host */
    uint8_t uuid[16];    /* CUDA device UUID */
    bool has_uuid;
    uint64_t alignment;  /* minimum buffer alignment */
    uint64_t granularity; /* slab sizes are rounded up to this */
    uint64_t device_total; /* device memory, 0 for host */
    char device_name[128];
    void *impl;
};

int gd_backend_host_new(gd_backend **ret, gd_err *err);
int gd_backend_cuda_ipc_new(int device, gd_backend **ret, gd_err *err);
/* -EOPNOTSUPP (and a message) when the device lacks VMM or POSIX-fd handles. */
int gd_backend_cuda_vmm_new(int device, gd_backend **ret, gd_err *err);
/* The fd to send for a read-only open of a slab: host pools, a read-only file
 * description of the memfd (made once, closed with the slab); cuda-vmm, the
 * slab's fd (the importer maps it read-only). -EOPNOTSUPP for cuda-ipc, with
 * a message in err. */
int gd_backend_export_ro(gd_backend *be, gd_slab_export *exp, int *ret_fd, gd_err *err);
/* Number of CUDA devices visible to the daemon; 0 (and a message) when no driver. */
int gd_backend_cuda_device_count(gd_err *err);
gd_backend *gd_backend_free(gd_backend *be);

/* cuda-ipc slabs are multiples of this (cuMemAlloc's large-page size); it is
 * also the smallest granularity of a cuda-vmm pool, whose backend reads the
 * device's own (cuMemGetAllocationGranularity) when it is created. */
#define GD_CUDA_GRANULARITY (2ull << 20)
/* The granularity of a backend of this kind: slab sizes and capacities are
 * multiples of it (host: the page size). */
uint64_t gd_backend_granularity(gpubuf_pool_kind kind);

/* The kind's name is gpubuf_pool_kind_name() (common/util.h). */
int gd_pool_kind_parse(const char *s, gpubuf_pool_kind *ret);

#endif
