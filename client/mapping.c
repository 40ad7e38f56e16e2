/* The mapping cache: each slab is imported once per connection and unmapped
 * when its last view goes; host copies for host and CUDA views. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"

#ifdef GPUBUF_HAVE_CUDA
/* The primary context of local device `ordinal`, retained once per
 * connection. */
static int client_ctx(gpubuf_client *c, const gpubuf_cuda *cu, int ordinal, CUcontext *ret) {
    CUdevice dev;
    CUresult cr;
    char why[256];
    if (ordinal < 0 || ordinal >= GPUBUF_MAX_DEVICES)
        return GPUBUF_ENODEVICE;
    if (!c->ctx[ordinal]) {
        if ((cr = cu->DeviceGet(&dev, ordinal)) != CUDA_SUCCESS ||
            (cr = cu->DevicePrimaryCtxRetain(&c->ctx[ordinal], dev)) != CUDA_SUCCESS) {
            c->ctx[ordinal] = NULL;
            gpubuf__set_error("%s",
                              gpubuf_cuda_describe(cr, "primary context", why, sizeof(why)));
            return GPUBUF_ECUDA;
        }
    }
    *ret = c->ctx[ordinal];
    return 0;
}

/* The GPU holding the slab (its local ordinal, matched by UUID) and the
 * context to map it into (m->ctx, m->device, m->home). */
static int cuda_target(gpubuf_client *c, const gpubuf_cuda *cu, gpubuf_mapping *m,
                       const Gpubuf__Slab *msg) {
    int r, ordinal = -1;
    /* Devices are matched by UUID: ordinals differ between processes with
     * different CUDA_VISIBLE_DEVICES. */
    if (msg->device_uuid.len != 16 ||
        gpubuf_cuda_device_by_uuid(cu, msg->device_uuid.data, &ordinal) < 0) {
        gpubuf__set_error("the buffer's GPU (daemon device %d) is not visible in this process",
                          msg->device);
        return GPUBUF_ENODEVICE;
    }
    int target = c->device >= 0 ? c->device : ordinal;
    if (target != ordinal) {
        CUdevice dt, dh;
        int can = 0;
        if (cu->DeviceGet(&dt, target) != CUDA_SUCCESS ||
            cu->DeviceGet(&dh, ordinal) != CUDA_SUCCESS ||
            cu->DeviceCanAccessPeer(&can, dt, dh) != CUDA_SUCCESS || !can) {
            gpubuf__set_error("GPU %d cannot access the memory of GPU %d (no peer access "
                              "between them)", target, ordinal);
            return GPUBUF_ENOPEER;
        }
    }
    if ((r = client_ctx(c, cu, target, &m->ctx)) < 0)
        return r;
    m->device = target;
    m->home = ordinal;
    return 0;
}

static int cuda_load(const gpubuf_cuda **cu) {
    int r = gpubuf_cuda_load(cu);
    if (r < 0) {
        gpubuf__set_error("%s", gpubuf_cuda_load_error());
        /* cuInit fails with CUDA_ERROR_NO_DEVICE when none is visible. */
        if (r == GPUBUF_ECUDA && gpubuf_cuda_init_result() == CUDA_ERROR_NO_DEVICE)
            return GPUBUF_ENODEVICE;
    }
    return r;
}

/* cuda-vmm: import the slab's fd, reserve its size, map the whole allocation
 * (CUDA maps an imported allocation only from offset 0) and grant the target
 * device read and write, or read only. Does not consume fd. */
static int map_vmm(gpubuf_client *c, gpubuf_mapping *m, const Gpubuf__Slab *msg, int fd) {
    const gpubuf_cuda *cu;
    CUdeviceptr va = 0;
    CUmemAccessDesc acc;
    CUcontext ignored;
    CUresult cr;
    const char *what;
    char why[256];
    int r;
    if ((r = cuda_load(&cu)) < 0)
        return r;
    if (fd < 0) {
        gpubuf__set_error("gpubufd sent a cuda-vmm slab without its file descriptor");
        return GPUBUF_EPROTOCOL;
    }
    if ((r = cuda_target(c, cu, m, msg)) < 0)
        return r;
    cu->CtxPushCurrent(m->ctx);
    what = "cuMemImportFromShareableHandle";
    cr = cu->MemImportFromShareableHandle(&m->vmm, (void *)(intptr_t)fd,
                                          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    if (cr != CUDA_SUCCESS)
        goto fail;
    what = "cuMemAddressReserve";
    if ((cr = cu->MemAddressReserve(&va, (size_t)m->size, 0, 0, 0)) != CUDA_SUCCESS)
        goto fail_release;
    what = "cuMemMap";
    if ((cr = cu->MemMap(va, (size_t)m->size, 0, m->vmm, 0)) != CUDA_SUCCESS)
        goto fail_free;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = m->device;
    acc.flags = m->read_only ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    what = "cuMemSetAccess";
    if ((cr = cu->MemSetAccess(va, (size_t)m->size, &acc, 1)) != CUDA_SUCCESS)
        goto fail_unmap;
    cu->CtxPopCurrent(&ignored);
    m->base = (uint64_t)va;
    return 0;
fail_unmap:
    cu->MemUnmap(va, (size_t)m->size);
fail_free:
    cu->MemAddressFree(va, (size_t)m->size);
fail_release:
    cu->MemRelease(m->vmm);
fail:
    cu->CtxPopCurrent(&ignored);
    gpubuf__set_error("%s", gpubuf_cuda_describe(cr, what, why, sizeof(why)));
    return cr == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : GPUBUF_ECUDA;
}

static int map_cuda(gpubuf_client *c, gpubuf_mapping *m, const Gpubuf__Slab *msg) {
    const gpubuf_cuda *cu;
    CUipcMemHandle h;
    CUdeviceptr ptr;
    CUcontext ignored;
    CUresult cr;
    char why[256];
    int r;
    if ((r = cuda_load(&cu)) < 0)
        return r;
    if (msg->ipc_handle.len != sizeof(h.reserved)) {
        gpubuf__set_error("gpubufd sent a CUDA slab without IPC handle");
        return GPUBUF_EPROTOCOL;
    }
    if ((r = cuda_target(c, cu, m, msg)) < 0)
        return r;
    memcpy(h.reserved, msg->ipc_handle.data, sizeof(h.reserved));
    cu->CtxPushCurrent(m->ctx);
    cr = cu->IpcOpenMemHandle(&ptr, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    cu->CtxPopCurrent(&ignored);
    if (cr != CUDA_SUCCESS) {
        gpubuf__set_error("%s", gpubuf_cuda_describe(cr, "cuIpcOpenMemHandle", why, sizeof(why)));
        return GPUBUF_ECUDA;
    }
    m->base = (uint64_t)ptr;
    return 0;
}

/* Unmap a cuda-ipc or cuda-vmm slab, in the context it was mapped in. */
static void unmap_device(gpubuf_mapping *m) {
    const gpubuf_cuda *cu;
    CUcontext ignored;
    if (gpubuf_cuda_load(&cu) < 0)
        return;
    cu->CtxPushCurrent(m->ctx);
    if (m->kind == GPUBUF_POOL_CUDA_VMM) {
        cu->MemUnmap((CUdeviceptr)m->base, (size_t)m->size);
        cu->MemAddressFree((CUdeviceptr)m->base, (size_t)m->size);
        cu->MemRelease(m->vmm);
    } else {
        cu->IpcCloseMemHandle((CUdeviceptr)m->base);
    }
    cu->CtxPopCurrent(&ignored);
}
#endif

static void idle_unlink(gpubuf_client *c, gpubuf_mapping *m) {
    assert(c->n_idle > 0);
    DL_DELETE2(c->idle, m, idle_prev, idle_next);
    m->idle_prev = m->idle_next = NULL;
    c->n_idle--;
}

static void idle_push(gpubuf_client *c, gpubuf_mapping *m) {
    DL_PREPEND2(c->idle, m, idle_prev, idle_next);
    c->n_idle++;
}

/* Tell the daemon a kept slab is unmapped (lock held, asynchronous). */
static void send_unmap(gpubuf_client *c, uint64_t slab_id) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__UnmapRequest u = GPUBUF__UNMAP_REQUEST__INIT;
    if (c->broken)
        return;
    u.slab_id = slab_id;
    req.body_case = GPUBUF__REQUEST__BODY_UNMAP;
    req.unmap = &u;
    gpubuf__send_async_locked(c, &req);
}

static void unmap(gpubuf_mapping *m);

/* Unmap m for good, then let the daemon free the slab. */
static void drop(gpubuf_client *c, gpubuf_mapping *m, bool tell) {
    HASH_DEL(c->maps, m);
    c->n_maps--;
    unmap(m);
    if (m->kept) {
        c->n_kept--;
        if (tell)
            send_unmap(c, m->slab_id);
    }
    free(m);
}

void gpubuf__mapping_drop_idle(gpubuf_client *c, bool cuda_only, bool tell) {
    gpubuf_mapping *m, *next;
    DL_FOREACH_SAFE2(c->idle, m, next, idle_next) {
        if (cuda_only && m->kind == GPUBUF_POOL_HOST)
            continue;
        idle_unlink(c, m);
        drop(c, m, tell);
    }
}

void gpubuf__mapping_forget_kept(gpubuf_client *c) {
    gpubuf__mapping_drop_idle(c, false, false);
    for (gpubuf_mapping *m = c->maps; m; m = m->hh.next)
        m->kept = false;
    c->n_kept = 0;
}

void gpubuf__mapping_orphan_all(gpubuf_client *c) {
    gpubuf_mapping *m, *tmp;
    gpubuf__mapping_forget_kept(c); /* no idle slab is left: each has views */
    HASH_ITER(hh, c->maps, m, tmp) {
        HASH_DEL(c->maps, m);
        c->n_maps--;
        m->orphan = true;
    }
}

void gpubuf__mapping_hold(gpubuf_client *c, gpubuf_mapping *m) {
    if (m->views++ == 0)
        idle_unlink(c, m);
}

int gpubuf__mapping_get(gpubuf_client *c, const Gpubuf__Slab *msg, int fd,
                        gpubuf_mapping **ret) {
    gpubuf_mapping *m;
    uint64_t id = msg->slab_id;
    uint64_t key = id * 2 + (msg->read_only ? 1 : 0);
    int r;
    if (id > UINT64_MAX / 2) {
        if (fd >= 0)
            close(fd);
        gpubuf__set_error("gpubufd sent slab id %llu (out of range)", (unsigned long long)id);
        return GPUBUF_EPROTOCOL;
    }
    HASH_FIND(hh, c->maps, &key, sizeof(key), m);
    if (m) {
        if (fd >= 0)
            close(fd); /* already mapped: the fresh fd is not needed */
        gpubuf__mapping_hold(c, m);
        *ret = m;
        return 0;
    }
    m = calloc(1, sizeof(*m));
    if (!m) {
        if (fd >= 0)
            close(fd);
        return -ENOMEM;
    }
    m->key = key;
    m->slab_id = id;
    m->read_only = msg->read_only;
    m->keepable = msg->keepable && !msg->read_only;
    m->kind = (gpubuf_pool_kind)msg->kind;
    m->size = msg->size;
    m->device = -1;
    m->home = -1;
    switch (m->kind) {
    case GPUBUF_POOL_HOST:
        if (fd < 0) {
            gpubuf__set_error("gpubufd sent a host slab without its file descriptor");
            r = GPUBUF_EPROTOCOL;
            break;
        }
        m->host = mmap(NULL, (size_t)m->size, m->read_only ? PROT_READ : PROT_READ | PROT_WRITE,
                       MAP_SHARED, fd, 0);
        if (m->host == MAP_FAILED) {
            r = -errno;
            m->host = NULL;
            gpubuf__set_error("mmap of a %llu-byte slab: %s", (unsigned long long)m->size,
                              strerror(-r));
            break;
        }
        m->base = (uint64_t)(uintptr_t)m->host;
        r = 0;
        break;
    case GPUBUF_POOL_CUDA_IPC:
    case GPUBUF_POOL_CUDA_VMM:
#ifdef GPUBUF_HAVE_CUDA
        if (m->kind == GPUBUF_POOL_CUDA_VMM) {
            r = map_vmm(c, m, msg, fd);
        } else if (m->read_only) {
            gpubuf__set_error("gpubufd sent a read-only cuda-ipc slab (CUDA cannot map one)");
            r = GPUBUF_EPROTOCOL;
        } else {
            r = map_cuda(c, m, msg);
        }
#else
        gpubuf__set_error("libgpubuf-client was built without CUDA support");
        r = GPUBUF_ENODRIVER;
#endif
        break;
    default:
        gpubuf__set_error("unknown pool kind %d", (int)m->kind);
        r = GPUBUF_EPROTOCOL;
        break;
    }
    if (fd >= 0)
        close(fd);
    if (r < 0) {
        free(m);
        return r;
    }
    m->views = 1;
    HASH_ADD(hh, c->maps, key, sizeof(m->key), m);
    c->n_maps++;
    *ret = m;
    return 0;
}

static void unmap(gpubuf_mapping *m) {
    if (m->host)
        munmap(m->host, (size_t)m->size);
#ifdef GPUBUF_HAVE_CUDA
    else if (m->kind == GPUBUF_POOL_CUDA_IPC || m->kind == GPUBUF_POOL_CUDA_VMM)
        unmap_device(m);
#endif
}

bool gpubuf__mapping_put(gpubuf_client *c, gpubuf_mapping *m) {
    return gpubuf__mapping_put_ex(c, m, true);
}

bool gpubuf__mapping_put_ex(gpubuf_client *c, gpubuf_mapping *m, bool evict) {
    if (--m->views > 0)
        return false;
    if (m->orphan) { /* out of the cache, nothing to tell the daemon */
        unmap(m);
        free(m);
        return false;
    }
    if (m->keepable && !c->broken && (m->kept || c->keep_cap > 0)) {
        bool first = !m->kept;
        /* Room for one more kept slab: forget the least recently used. */
        gpubuf_mapping *old = evict && first && c->n_kept >= c->keep_cap && c->idle
                                  ? c->idle->idle_prev /* the tail */
                                  : NULL;
        if (!first || c->n_kept < c->keep_cap || old) {
            if (old)
                idle_unlink(c, old);
            if (first) {
                m->kept = true;
                c->n_kept++;
            }
            /* Idle before the unmap below is sent: sending may read
             * replies, and a view those make on this slab takes m off the
             * idle list (gpubuf__mapping_hold). */
            idle_push(c, m);
            if (old)
                drop(c, old, true);
            /* That send may have read the daemon's goodbye: then the
             * release that would pin this slab is never sent. */
            if (c->broken && m->views == 0) {
                idle_unlink(c, m);
                drop(c, m, true);
                return false;
            }
            return first;
        }
    }
    drop(c, m, true);
    return false;
}

void gpubuf__mapping_clear(gpubuf_client *c) {
    gpubuf_mapping *m, *tmp;
    HASH_ITER(hh, c->maps, m, tmp) {
        HASH_DEL(c->maps, m);
        unmap(m);
        free(m);
    }
    c->n_maps = 0;
    c->n_kept = c->n_idle = 0;
    c->idle = NULL;
#ifdef GPUBUF_HAVE_CUDA
    const gpubuf_cuda *cu;
    for (int i = 0; i < GPUBUF_MAX_DEVICES; i++) {
        CUdevice dev;
        if (c->ctx[i] && gpubuf_cuda_load(&cu) == 0 && cu->DeviceGet(&dev, i) == CUDA_SUCCESS)
            cu->DevicePrimaryCtxRelease(dev);
        c->ctx[i] = NULL;
    }
#endif
}

static int set_device_call(gpubuf_client *c, int device) {
    gpubuf_mapping *m, *tmp;
    uint32_t busy = 0;
    int r = 0;
    pthread_mutex_lock(&c->lock);
    /* Idle slabs were mapped for the old choice: let them go. */
    gpubuf__mapping_drop_idle(c, true, true);
    HASH_ITER(hh, c->maps, m, tmp) {
        if (m->kind != GPUBUF_POOL_HOST)
            busy++;
    }
    if (busy) {
        gpubuf__set_error("%u CUDA slab(s) are mapped on this connection: choose the device "
                          "before opening, or use another connection", busy);
        r = -EBUSY;
    } else if (device >= 0) {
#ifdef GPUBUF_HAVE_CUDA
        const gpubuf_cuda *cu;
        int n = 0;
        if ((r = gpubuf_cuda_load(&cu)) < 0)
            gpubuf__set_error("%s", gpubuf_cuda_load_error());
        else if (cu->DeviceGetCount(&n) != CUDA_SUCCESS || device >= n) {
            gpubuf__set_error("CUDA device %d does not exist in this process (%d visible)",
                              device, n);
            r = GPUBUF_ENODEVICE;
        }
#else
        gpubuf__set_error("libgpubuf-client was built without CUDA support");
        r = GPUBUF_ENODRIVER;
#endif
    }
    if (r == 0)
        c->device = device;
    pthread_mutex_unlock(&c->lock);
    return r;
}

GPUBUF_EXTERN int gpubuf_set_device(gpubuf_client *c, int device) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && device >= -1 && device < GPUBUF_MAX_DEVICES, -EINVAL,
                 "device must be -1 or a CUDA ordinal below %d", GPUBUF_MAX_DEVICES);
    int r = set_device_call(c, device);
    return gpubuf__result(r);
}
