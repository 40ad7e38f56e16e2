/* libgpubuf-client: the buffer life cycle's requests, under the public
 * entry points of client.c (which check the arguments and own the thread's
 * error message): alloc, open, seal, delete, release. Each builds its
 * request (verbs_common.c), sends it (conn.c) and turns the reply into a
 * view (view.c). The connection goes with its last reference, a view's
 * or gpubuf_disconnect()'s. */
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "internal.h"
#include "trace.h"

int gpubuf__buffer_request(gpubuf_client *c, Gpubuf__Request *req, gpubuf_buffer **ret) {
    Gpubuf__Response *resp;
    int fd, r;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__rpc_locked(c, req, &resp, &fd);
    if (r == 0) {
        if (resp->body_case != GPUBUF__RESPONSE__BODY_BUFFER) {
            if (fd >= 0)
                close(fd);
            r = GPUBUF_EPROTOCOL;
        } else {
            r = gpubuf__view_from_reply(c, resp->buffer, fd, ret);
            if (r == 0)
                gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_MAPPED, 0);
        }
        gpubuf__resp_free(c, resp);
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

int gpubuf__alloc_request(gpubuf_client *c, Gpubuf__AllocRequest *a, gpubuf_buffer **ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = a;
    int r = gpubuf__buffer_request(c, &req, ret);
    if (r == 0) {
        (*ret)->allocated = true;
        (*ret)->sealable = true;
    }
    return r;
}

int gpubuf__alloc(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                  gpubuf_buffer **ret) {
    int r;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    lookup l = {0};
    if ((r = gpubuf__alloc_fill(&a, pool, size, name, &l)) < 0)
        return r;
    return gpubuf__alloc_request(c, &a, ret);
}

int gpubuf__open_with(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *opts,
                      gpubuf_buffer **ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    lookup l;
    int r = gpubuf__open_fill(&o, &l, name, id, opts);
    if (r < 0)
        return r;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &o;
    return gpubuf__buffer_request(c, &req, ret);
}

int gpubuf__open(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms, unsigned flags,
                 gpubuf_buffer **ret) {
    gpubuf_lookup o = {.flags = flags, .timeout_ms = timeout_ms};
    if (flags & ~(unsigned)GPUBUF_OPEN_READONLY) /* the owner goes with gpubuf_open_with */
        return gpubuf__fail(-EINVAL, "unknown open flags 0x%x",
                            flags & ~(unsigned)GPUBUF_OPEN_READONLY);
    return gpubuf__open_with(c, name, id, &o, ret);
}

/* A request whose reply carries no body we need. */
static int simple_request(gpubuf_client *c, Gpubuf__Request *req) {
    Gpubuf__Response *resp;
    pthread_mutex_lock(&c->lock);
    int r = gpubuf__rpc_reply_locked(c, req, GPUBUF__RESPONSE__BODY__NOT_SET, &resp);
    if (r == 0)
        gpubuf__resp_free(c, resp);
    pthread_mutex_unlock(&c->lock);
    return r;
}

int gpubuf__seal(gpubuf_buffer *b, bool wait, gpubuf_stream stream, bool on_stream) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    uint8_t ev[64];
    gpubuf_client *c;
    int r;
    c = b->c;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__seal_check(&b);
    if (r == 0 && on_stream) {
        r = gpubuf__record_event(c, b, stream, ev);
        if (r == 0) {
            s.event_handle.data = ev;
            s.event_handle.len = sizeof(ev);
        }
    }
    if (r == 0) {
        s.buffer_id = b->id;
        req.body_case = GPUBUF__REQUEST__BODY_SEAL;
        req.seal = &s;
        if (wait) {
            /* Its own reply, not an earlier asynchronous request's error. */
            Gpubuf__Response *resp;
            r = gpubuf__rpc_reply_locked(c, &req, GPUBUF__RESPONSE__BODY__NOT_SET, &resp);
            if (r == 0)
                gpubuf__resp_free(c, resp);
        } else {
            /* Nothing left for the daemon to refuse: send without waiting. */
            r = gpubuf__send_async_locked(c, &req);
        }
        if (r == 0)
            b->sealable = false;
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

int gpubuf__delete(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *opts) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    lookup l;
    int r;
    if ((r = gpubuf__lookup_make("delete", name, id, opts, GPUBUF_OPEN_OWNER, &l)) < 0)
        return r;
    d.target_case = gpubuf__lookup_fill(&l, &d.name, &d.buffer_id, &d.pool, &d.owner)
                        ? GPUBUF__DELETE_REQUEST__TARGET_NAME
                        : GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID;
    req.body_case = GPUBUF__REQUEST__BODY_DELETE;
    req.delete_ = &d;
    return simple_request(c, &req);
}

int gpubuf__release(gpubuf_buffer *b) {
    int r = 0;
    while (b) {
        if (atomic_fetch_sub(&b->refs, 1) != 1)
            return r;
        gpubuf_buffer *parent = b->parent;
        if (b->owns_ref) {
            gpubuf_client *c = b->c;
            pthread_mutex_lock(&c->lock);
            /* gpubufd restarted without its reference: nothing to release
             * there (the id may name another buffer now). */
            bool live = !b->map || gpubuf__view_live(b);
#ifdef GPUBUF_HAVE_CUDA
            const gpubuf_cuda *cu;
            if (b->event && gpubuf_cuda_load(&cu) == 0)
                cu->EventDestroy(b->event);
            if (!live && b->own_event)
                gpubuf__event_released(c, b, 1); /* the daemon forgot it */
            /* Sealed on a stream whose work still runs: the reference stays
             * (and the daemon keeps handing the event out) until it ends. */
            if (live && b->own_event && gpubuf__event_defer(c, b))
                b->map = NULL;
#endif
            if (!live) {
                gpubuf__mapping_put(c, b->map);
                b->map = NULL;
            }
            if (b->map)
                r = gpubuf__release_locked(c, b->id, b->map, b->read_only);
#ifdef GPUBUF_HAVE_CUDA
            /* The release just sent is request next_id; on a broken
             * connection the daemon forgot the event with the holder. */
            if (b->map && b->own_event)
                gpubuf__event_released(c, b, c->broken ? 1 : c->next_id);
            gpubuf__events_sweep(c, false);
#endif
            gpubuf__view_meta_free(b);
            gpubuf__view_recycle(c, b);
            pthread_mutex_unlock(&c->lock);
            gpubuf__client_unref(c);
        } else {
            gpubuf__view_meta_free(b);
            free(b);
        }
        b = parent; /* a slice held one reference to its parent */
    }
    return r;
}

/* The connection's last reference went (its last view's release, or
 * gpubuf_disconnect()): wait for the seal events, unmap, free. */
void gpubuf__client_unref(gpubuf_client *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
#ifdef GPUBUF_HAVE_CUDA
    /* Wait for the seal events (their deferred releases unmap), then free. */
    gpubuf__events_sweep(c, true);
    free(c->events);
    c->events = NULL;
    c->cap_events = 0;
#endif
    gpubuf__mapping_clear(c);
    while (c->spare) {
        gpubuf_buffer *b = c->spare;
        c->spare = b->parent;
        free(b);
    }
    gpubuf_held *hd, *htmp;
    HASH_ITER(hh, c->held, hd, htmp) {
        HASH_DEL(c->held, hd);
        free(hd);
    }
    while (c->spare_held) {
        hd = c->spare_held;
        c->spare_held = hd->hh.next;
        free(hd);
    }
    gpubuf_trace_dump(); /* GPUBUF_TRACE_TIMING: this process's records so far */
    for (int i = 0; i < c->n_rfds; i++)
        close(c->rfds[i]);
    free(c->rbuf);
    gpubuf__arena_free(&c->arena);
    if (c->fd >= 0)
        close(c->fd);
    if (c->async_hooks)
        c->async_hooks->free(c);
    pthread_mutex_destroy(&c->qlock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
