/* Stream order: seal events (producer), waits (consumer); and the copies
 * between views and host memory, synchronous or enqueued on a stream. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* A view's memory as seen by the host (host pools), else NULL. */
static char *host_bytes(const gpubuf_buffer *b) {
    return b->map->host ? (char *)b->map->host + b->offset : NULL;
}

static int check_range(const gpubuf_buffer *b, uint64_t offset, uint64_t length) {
    if (offset > b->size || length > b->size - offset) {
        gpubuf__set_error("copy of [%llu, +%llu) outside a view of %llu bytes",
                          (unsigned long long)offset, (unsigned long long)length,
                          (unsigned long long)b->size);
        return GPUBUF_ERANGE;
    }
    return 0;
}

static const gpubuf_buffer *root_of(const gpubuf_buffer *b) {
    while (b->parent)
        b = b->parent;
    return b;
}

#ifdef GPUBUF_HAVE_CUDA
static int cuda_fail(CUresult cr, const char *what) {
    char why[256];
    gpubuf__set_error("%s", gpubuf_cuda_describe(cr, what, why, sizeof(why)));
    return GPUBUF_ECUDA;
}

void gpubuf__events_sweep(gpubuf_client *c, bool wait) {
    const gpubuf_cuda *cu;
    uint32_t kept = 0;
    if (c->n_events == 0 || gpubuf_cuda_load(&cu) < 0)
        return;
    for (uint32_t i = 0; i < c->n_events; i++) {
        struct gpubuf_event_rec *e = &c->events[i];
        if (wait)
            cu->EventSynchronize(e->ev);
        if (e->deferred_map && (wait || cu->EventQuery(e->ev) != CUDA_ERROR_NOT_READY)) {
            /* Its work is done: the sealing view's release goes now, and the
             * daemon stops handing the event out once it applies it. */
            gpubuf__release_locked(c, e->deferred_id, e->deferred_map, e->deferred_ro);
            e->deferred_map = NULL;
            e->released_at = c->broken ? 1 : c->next_id;
        }
        if (!wait && (!e->released_at || e->released_at > c->acked_id ||
                      cu->EventQuery(e->ev) == CUDA_ERROR_NOT_READY)) {
            c->events[kept++] = *e; /* the daemon may still hand it out, or it runs */
            continue;
        }
        cu->EventDestroy(e->ev);
    }
    c->n_events = kept;
}

bool gpubuf__event_defer(gpubuf_client *c, gpubuf_buffer *b) {
    const gpubuf_cuda *cu;
    if (c->broken || gpubuf_cuda_load(&cu) < 0 || cu->EventQuery(b->own_event) != CUDA_ERROR_NOT_READY)
        return false;
    for (uint32_t i = 0; i < c->n_events; i++) {
        struct gpubuf_event_rec *e = &c->events[i];
        if (e->ev == b->own_event) {
            e->deferred_map = b->map;
            e->deferred_id = b->id;
            e->deferred_ro = b->read_only;
            b->own_event = NULL;
            return true;
        }
    }
    return false;
}

void gpubuf__event_released(gpubuf_client *c, gpubuf_buffer *b, uint64_t release_id) {
    for (uint32_t i = 0; i < c->n_events; i++) {
        if (c->events[i].ev == b->own_event) {
            c->events[i].released_at = release_id ? release_id : 1;
            break;
        }
    }
    b->own_event = NULL;
}

int gpubuf__record_event(gpubuf_client *c, gpubuf_buffer *b, gpubuf_stream stream,
                         uint8_t ret_handle[64]) {
    const gpubuf_cuda *cu;
    CUipcEventHandle h;
    CUcontext ignored;
    CUevent ev = NULL;
    CUresult cr;
    int r;
    if (b->map->kind == GPUBUF_POOL_HOST) {
        gpubuf__set_error("a host-pool buffer has no GPU work to order: use gpubuf_seal()");
        return -EINVAL;
    }
    if ((r = gpubuf_cuda_load(&cu)) < 0) {
        gpubuf__set_error("%s", gpubuf_cuda_load_error());
        return r;
    }
    gpubuf__events_sweep(c, false);
    if (c->n_events == c->cap_events) {
        uint32_t cap = c->cap_events ? c->cap_events * 2 : 16;
        struct gpubuf_event_rec *n = realloc(c->events, cap * sizeof(*n));
        if (!n) {
            gpubuf__set_error("out of memory");
            return -ENOMEM;
        }
        c->events = n;
        c->cap_events = cap;
    }
    cu->CtxPushCurrent(b->map->ctx);
    cr = cu->EventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING);
    if (cr == CUDA_SUCCESS)
        cr = cu->EventRecord(ev, (CUstream)stream);
    if (cr == CUDA_SUCCESS)
        cr = cu->IpcGetEventHandle(&h, ev);
    cu->CtxPopCurrent(&ignored);
    if (cr != CUDA_SUCCESS) {
        if (ev)
            cu->EventDestroy(ev);
        return cuda_fail(cr, "recording the seal event");
    }
    memset(&c->events[c->n_events], 0, sizeof(c->events[0]));
    c->events[c->n_events].ev = ev;
    c->n_events++;
    b->own_event = ev;
    memcpy(ret_handle, h.reserved, 64);
    return 0;
}

/* Make stream wait for view b's seal event, in b's context (none: 0). */
static int wait_event(const gpubuf_cuda *cu, const gpubuf_buffer *view, gpubuf_stream stream) {
    const gpubuf_buffer *b = root_of(view);
    CUcontext ignored;
    CUresult cr;
    if (!b->has_event || !b->event)
        return 0;
    cu->CtxPushCurrent(b->map->ctx);
    cr = cu->StreamWaitEvent((CUstream)stream, b->event, 0);
    cu->CtxPopCurrent(&ignored);
    return cr == CUDA_SUCCESS ? 0 : cuda_fail(cr, "cuStreamWaitEvent");
}

static int buffer_wait_call(gpubuf_buffer *view, gpubuf_stream stream) {
    const gpubuf_cuda *cu;
    int r;
    if (!root_of(view)->has_event)
        return 0;
    if ((r = gpubuf_cuda_load(&cu)) < 0) {
        gpubuf__set_error("%s", gpubuf_cuda_load_error());
        return r;
    }
    return wait_event(cu, view, stream);
}

/* Copy n bytes between a device address and host memory: enqueued on stream,
 * or synchronous (cuMemcpyDtoH / cuMemcpyHtoD) when not async. */
static int copy_device(const gpubuf_buffer *b, uint64_t offset, void *host, uint64_t n,
                       gpubuf_stream stream, bool to_host, bool async) {
    static const char *const what[2][2] = {{"cuMemcpyHtoD", "cuMemcpyHtoDAsync"},
                                           {"cuMemcpyDtoH", "cuMemcpyDtoHAsync"}};
    const gpubuf_cuda *cu;
    CUcontext ignored;
    CUresult cr;
    int r;
    if ((r = gpubuf_cuda_load(&cu)) < 0) {
        gpubuf__set_error("%s", gpubuf_cuda_load_error());
        return r;
    }
    /* Reading a buffer sealed on a stream: after the producer's work. */
    if (to_host && (r = wait_event(cu, b, async ? stream : NULL)) < 0)
        return r;
    CUdeviceptr d = (CUdeviceptr)(b->map->base + b->offset + offset);
    cu->CtxPushCurrent(b->map->ctx);
    if (to_host)
        cr = async ? cu->MemcpyDtoHAsync(host, d, (size_t)n, (CUstream)stream)
                   : cu->MemcpyDtoH(host, d, (size_t)n);
    else
        cr = async ? cu->MemcpyHtoDAsync(d, host, (size_t)n, (CUstream)stream)
                   : cu->MemcpyHtoD(d, host, (size_t)n);
    cu->CtxPopCurrent(&ignored);
    if (cr != CUDA_SUCCESS)
        return cuda_fail(cr, what[to_host][async]);
    return 0;
}
#else
static int buffer_wait_call(gpubuf_buffer *view, gpubuf_stream stream) {
    (void)stream;
    if (!root_of(view)->has_event)
        return 0;
    gpubuf__set_error("libgpubuf-client was built without CUDA support");
    return GPUBUF_ENODRIVER;
}

int gpubuf__record_event(gpubuf_client *c, gpubuf_buffer *b, gpubuf_stream stream,
                         uint8_t ret_handle[64]) {
    (void)c, (void)stream, (void)ret_handle;
    if (b->map->kind == GPUBUF_POOL_HOST) {
        gpubuf__set_error("a host-pool buffer has no GPU work to order: use gpubuf_seal()");
        return -EINVAL;
    }
    gpubuf__set_error("libgpubuf-client was built without CUDA support");
    return GPUBUF_ENODRIVER;
}

static int copy_device(const gpubuf_buffer *b, uint64_t offset, void *host, uint64_t n,
                       gpubuf_stream stream, bool to_host, bool async) {
    (void)b, (void)offset, (void)host, (void)n, (void)stream, (void)to_host, (void)async;
    gpubuf__set_error("libgpubuf-client was built without CUDA support");
    return GPUBUF_ENODRIVER;
}
#endif

/* Between a view and host memory: checked, then memcpy for host pools. */
static int copy_host(const gpubuf_buffer *b, uint64_t offset, void *host, uint64_t length,
                     gpubuf_stream stream, bool to_host, bool async) {
    int r;
    if (!to_host && b->map->read_only) {
        gpubuf__set_error("the view was opened read-only");
        return -EPERM;
    }
    if ((r = check_range(b, offset, length)) < 0 || length == 0)
        return r;
    if (host_bytes(b)) {
        if (to_host)
            memcpy(host, host_bytes(b) + offset, (size_t)length);
        else
            memcpy(host_bytes(b) + offset, host, (size_t)length);
        return 0;
    }
    return copy_device(b, offset, host, length, stream, to_host, async);
}

GPUBUF_EXTERN int gpubuf_buffer_copy_to_host(const gpubuf_buffer *b, uint64_t offset, void *dst,
                                             uint64_t length) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no view given (NULL) to copy");
    GPUBUF_CHECK(dst || !length, -EINVAL, "no host memory given (NULL) to copy to");
    int r = copy_host(b, offset, dst, length, NULL, true, false);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_buffer_copy_from_host(gpubuf_buffer *b, uint64_t offset,
                                               const void *src, uint64_t length) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no view given (NULL) to copy");
    GPUBUF_CHECK(src || !length, -EINVAL, "no host memory given (NULL) to copy from");
    int r = copy_host(b, offset, (void *)src, length, NULL, false, false);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_buffer_copy_to_host_async(const gpubuf_buffer *b, uint64_t offset,
                                                   void *dst, uint64_t length,
                                                   gpubuf_stream stream) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no view given (NULL) to copy");
    GPUBUF_CHECK(dst || !length, -EINVAL, "no host memory given (NULL) to copy to");
    int r = copy_host(b, offset, dst, length, stream, true, true);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_buffer_copy_from_host_async(gpubuf_buffer *b, uint64_t offset,
                                                     const void *src, uint64_t length,
                                                     gpubuf_stream stream) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no view given (NULL) to copy");
    GPUBUF_CHECK(src || !length, -EINVAL, "no host memory given (NULL) to copy from");
    int r = copy_host(b, offset, (void *)src, length, stream, false, true);
    return gpubuf__result(r);
}

static int buffer_copy_call(gpubuf_buffer *dst, uint64_t dst_offset, const gpubuf_buffer *src,
                            uint64_t src_offset, uint64_t length, gpubuf_stream stream) {
    int r;
    if (dst->map->read_only) {
        gpubuf__set_error("the destination view was opened read-only");
        return -EPERM;
    }
    if ((r = check_range(dst, dst_offset, length)) < 0 ||
        (r = check_range(src, src_offset, length)) < 0 || length == 0)
        return r;
    if (host_bytes(dst) && host_bytes(src)) {
        memmove(host_bytes(dst) + dst_offset, host_bytes(src) + src_offset, (size_t)length);
        return 0;
    }
    if (host_bytes(dst))
        return copy_device(src, src_offset, host_bytes(dst) + dst_offset, length, stream, true,
                           true);
    if (host_bytes(src))
        return copy_device(dst, dst_offset, host_bytes(src) + src_offset, length, stream, false,
                           true);
#ifdef GPUBUF_HAVE_CUDA
    const gpubuf_cuda *cu;
    CUcontext ignored;
    CUresult cr;
    if ((r = gpubuf_cuda_load(&cu)) < 0) {
        gpubuf__set_error("%s", gpubuf_cuda_load_error());
        return r;
    }
    if ((r = wait_event(cu, src, stream)) < 0)
        return r;
    CUdeviceptr d = (CUdeviceptr)(dst->map->base + dst->offset + dst_offset);
    CUdeviceptr s = (CUdeviceptr)(src->map->base + src->offset + src_offset);
    cu->CtxPushCurrent(dst->map->ctx);
    if (dst->map->ctx == src->map->ctx)
        cr = cu->MemcpyDtoDAsync(d, s, (size_t)length, (CUstream)stream);
    else
        cr = cu->MemcpyPeerAsync(d, dst->map->ctx, s, src->map->ctx, (size_t)length,
                                 (CUstream)stream);
    cu->CtxPopCurrent(&ignored);
    if (cr != CUDA_SUCCESS)
        return cuda_fail(cr, dst->map->ctx == src->map->ctx ? "cuMemcpyDtoDAsync"
                                                            : "cuMemcpyPeerAsync");
    return 0;
#else
    gpubuf__set_error("libgpubuf-client was built without CUDA support");
    return GPUBUF_ENODRIVER;
#endif
}

GPUBUF_EXTERN int gpubuf_buffer_wait(gpubuf_buffer *view, gpubuf_stream stream) {
    gpubuf__clear_error();
    GPUBUF_CHECK(view, -EINVAL, "no view given (NULL) to wait for");
    int r = buffer_wait_call(view, stream);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_buffer_copy(gpubuf_buffer *dst, uint64_t dst_offset,
                                     const gpubuf_buffer *src, uint64_t src_offset, uint64_t length,
                                     gpubuf_stream stream) {
    gpubuf__clear_error();
    GPUBUF_CHECK(dst && src, -EINVAL, "a copy needs two views (dst and src)");
    int r = buffer_copy_call(dst, dst_offset, src, src_offset, length, stream);
    return gpubuf__result(r);
}
