/* Backend room: where slab memory comes from. One small vtable per kind.
 * The pool above carves slabs into buffers; backends know nothing of buffers. */
#ifndef GPUBUFD_BACKEND_H
#define GPUBUFD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpubuf/gpubuf.h"

#define GPUBUF_IPC_HANDLE_SIZE 64

/* What a client needs to map a slab. */
typedef struct gpubuf_slab_export {
    int fd;                                   /* host: memfd; cuda-vmm: exported handle; else -1 */
    int ro_fd;                                /* host: read-only file description, made on
                                               * the first read-only open; else -1 */
    uint8_t ipc_handle[GPUBUF_IPC_HANDLE_SIZE]; /* cuda-ipc */
    bool has_ipc_handle;
} gpubuf_slab_export;

typedef struct gpubuf_backend gpubuf_backend;

typedef struct gpubuf_backend_ops {
    /* Create a slab of size bytes. On failure return a negative code and
     * write a sentence into err. */
    int (*slab_create)(gpubuf_backend *be, uint64_t size, void **ret_priv,
                       gpubuf_slab_export *ret_export, char *err, size_t errlen);
    void (*slab_destroy)(gpubuf_backend *be, void *priv, gpubuf_slab_export *exp);
    void (*destroy)(gpubuf_backend *be);
} gpubuf_backend_ops;

struct gpubuf_backend {
    const gpubuf_backend_ops *ops;
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

int gpubuf_backend_host_new(gpubuf_backend **ret, char *err, size_t errlen);
int gpubuf_backend_cuda_ipc_new(int device, gpubuf_backend **ret, char *err, size_t errlen);
/* -EOPNOTSUPP (and a message) when the device lacks VMM or POSIX-fd handles. */
int gpubuf_backend_cuda_vmm_new(int device, gpubuf_backend **ret, char *err, size_t errlen);
/* The fd to send for a read-only open of a slab: host pools, a read-only file
 * description of the memfd (made once, closed with the slab); cuda-vmm, the
 * slab's fd (the importer maps it read-only). -EOPNOTSUPP for cuda-ipc, with
 * a message in err. */
int gpubuf_backend_export_ro(gpubuf_backend *be, gpubuf_slab_export *exp, int *ret_fd, char *err,
                             size_t errlen);
/* Number of CUDA devices visible to the daemon; 0 (and a message) when no driver. */
int gpubuf_backend_cuda_device_count(char *err, size_t errlen);
gpubuf_backend *gpubuf_backend_free(gpubuf_backend *be);

int gpubuf_pool_kind_parse(const char *s, gpubuf_pool_kind *ret);

#endif
