/* libgpubuf-client: views. A root view is made from a Buffer reply over a
 * mapping of its slab and holds one daemon reference, counted in the
 * connection's held set (what a resume claims back); its release request
 * gives it back. Slices keep their parent alive. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "util.h"

/* ---- the held set: references of live root views, by buffer id ---------- */

void gpubuf__held(gpubuf_client *c, uint64_t id, bool read_only, bool add) {
    gpubuf_held *h;
    unsigned hv; /* the id hashed once, for the find and the add */
    HASH_VALUE(&id, sizeof(id), hv);
    HASH_FIND_BYHASHVALUE(hh, c->held, &id, sizeof(id), hv, h);
    if (add) {
        if (!h) { /* new: an entry whose count falls to 0 goes */
            if ((h = c->spare_held)) {
                c->spare_held = h->hh.next;
                c->n_spare_held--;
            } else if (!(h = malloc(sizeof(*h)))) {
                return; /* out of memory: a resume would not claim it */
            }
            h->id = id;
            h->count = h->ro = 0;
            h->gen = c->gen;
            HASH_ADD_BYHASHVALUE(hh, c->held, id, sizeof(h->id), hv, h);
            GPUBUF_HASH_KEEP_LOAD(hh, c->held);
        }
        h->count++;
        h->ro += read_only;
        return;
    }
    if (!h)
        return;
    if (read_only && h->ro)
        h->ro--;
    if (--h->count == 0) {
        HASH_DEL(c->held, h);
        if (c->n_spare_held + 1 > GPUBUF_SPARE_VIEWS) { /* (0 in sanitizer builds) */
            free(h);
        } else {
            h->hh.next = c->spare_held;
            c->spare_held = h;
            c->n_spare_held++;
        }
    }
}

bool gpubuf__view_live(const gpubuf_buffer *b) {
    gpubuf_held *h;
    while (b->parent)
        b = b->parent;
    HASH_FIND(hh, b->c->held, &b->id, sizeof(b->id), h);
    return h && h->gen <= b->gen;
}

int gpubuf__view_check(const gpubuf_buffer *b) {
    if (gpubuf__view_live(b))
        return 0;
    return gpubuf__fail(GPUBUF_ENOTHELD,
                        "this view's buffer is gone: gpubufd restarted without this "
                        "connection's session or without the buffer, so the view holds no "
                        "reference (its memory stays mapped until it is released); release "
                        "the view, then open or allocate the buffer again");
}

/* ---- root views --------------------------------------------------------- */

#ifdef GPUBUF_HAVE_CUDA
/* A new root view whose reply carried a seal event: import it now, while
 * the producer must keep it (lock held). An event that cannot be imported
 * any more has completed: has_event is cleared. */
static void event_import(gpubuf_buffer *b) {
    const gpubuf_cuda *cu;
    CUipcEventHandle h;
    CUcontext ignored;
    if (b->map->kind == GPUBUF_POOL_HOST || gpubuf_cuda_load(&cu) < 0) {
        b->has_event = false;
        return;
    }
    memcpy(h.reserved, b->event_handle, sizeof(h.reserved));
    cu->CtxPushCurrent(b->map->ctx);
    /* The producer destroys an event only once it has completed and the
     * daemon no longer hands it out: one that cannot be opened now needs no
     * wait. */
    if (cu->IpcOpenEventHandle(&b->event, h) != CUDA_SUCCESS) {
        b->event = NULL;
        b->has_event = false;
    }
    cu->CtxPopCurrent(&ignored);
}
#endif

/* A new root view of buffer id, size bytes at offset of its slab, before its
 * mapping (lock held): it holds one daemon reference (the held set counts
 * it) and one reference to c. event: the seal event's handle, or NULL. */
static int view_make(gpubuf_client *c, uint64_t id, uint64_t offset, uint64_t size,
                     const char *name, bool read_only, const uint8_t *event,
                     gpubuf_buffer **ret) {
    gpubuf_buffer *b = c->spare;
    if (b) {
        c->spare = b->parent;
        c->n_spare--;
        memset(b, 0, sizeof(*b));
    } else if (!(b = calloc(1, sizeof(*b)))) {
        return -ENOMEM;
    }
    atomic_init(&b->refs, 1);
    b->c = c;
    b->id = id;
    b->offset = offset;
    b->size = size;
    b->owns_ref = true;
    b->read_only = read_only;
    if (event) {
        memcpy(b->event_handle, event, sizeof(b->event_handle));
        b->has_event = true;
    }
    if (name) { /* cut to the room, as snprintf would (calloc zeroed the rest) */
        size_t n = strnlen(name, sizeof(b->name) - 1);
        memcpy(b->name, name, n);
    }
    b->gen = c->gen;
    gpubuf__held(c, b->id, b->read_only, true);
    atomic_fetch_add(&c->refs, 1);
    *ret = b;
    return 0;
}

void gpubuf__view_recycle(gpubuf_client *c, gpubuf_buffer *b) {
    if (c->n_spare + 1 > GPUBUF_SPARE_VIEWS) { /* (0 in sanitizer builds: no spares) */
        free(b);
        return;
    }
    b->parent = c->spare;
    c->spare = b;
    c->n_spare++;
}

/* The view's mapping came: b takes map's view count, and imports its seal
 * event in map's context. */
static void view_attach(gpubuf_buffer *b, gpubuf_mapping *map) {
    b->map = map;
#ifdef GPUBUF_HAVE_CUDA
    if (b->has_event)
        event_import(b);
#endif
}

int gpubuf__view_new(gpubuf_client *c, gpubuf_mapping *map, uint64_t id, uint64_t offset,
                     uint64_t size, const char *name, bool read_only, const uint8_t *event,
                     gpubuf_buffer **ret) {
    int r = view_make(c, id, offset, size, name, read_only && map->read_only, event, ret);
    if (r == 0)
        view_attach(*ret, map);
    return r;
}

/* Build a root view from a Buffer reply. Lock held. Consumes fd. The view
 * is made first, then the slab mapped under it: a mapping is never made
 * for a view that cannot be. */
static int make_view(gpubuf_client *c, const Gpubuf__Buffer *m, int fd, gpubuf_buffer **ret) {
    gpubuf_mapping *map;
    gpubuf_buffer *b;
    int r;
    if (!m || !m->slab || m->offset > m->slab->size || m->size > m->slab->size - m->offset) {
        if (fd >= 0)
            close(fd);
        gpubuf__set_error("gpubufd described a buffer outside its slab");
        return GPUBUF_EPROTOCOL;
    }
    /* The layout and user bytes first: a malformed one maps nothing. */
    gpubuf_buffer meta = {0};
    if ((m->layout || m->user_data.len) && (r = gpubuf__view_meta(&meta, m)) < 0) {
        if (fd >= 0)
            close(fd);
        gpubuf__view_meta_free(&meta);
        return r;
    }
    /* The mapping's access is the slab's: read only when the slab is. */
    r = view_make(c, m->buffer_id, m->offset, m->size, m->name,
                  m->read_only && m->slab->read_only,
                  m->event_handle.len == sizeof(meta.event_handle) ? m->event_handle.data : NULL,
                  &b);
    if (r < 0) {
        if (fd >= 0)
            close(fd);
    } else if ((r = gpubuf__mapping_get(c, m->slab, fd, &map)) < 0) {
        gpubuf__held(c, b->id, b->read_only, false);
        atomic_fetch_sub(&c->refs, 1);
        gpubuf__view_recycle(c, b);
    }
    if (r < 0) {
        gpubuf__view_meta_free(&meta);
        return r;
    }
    view_attach(b, map);
    b->layout = meta.layout;
    b->user = meta.user;
    b->user_len = meta.user_len;
    *ret = b;
    return 0;
}

int gpubuf__view_from_reply(gpubuf_client *c, const Gpubuf__Buffer *m, int fd,
                            gpubuf_buffer **ret) {
    int r = make_view(c, m, fd, ret);
    if (r < 0) /* mapping failed: give the reference back */
        gpubuf__send_release(c, m->buffer_id, false, m->read_only);
    return r;
}

/* ---- the release request ------------------------------------------------ */

/* Tell the daemon to drop one reference (lock held). Asynchronous: the
 * client tracks its references, so the daemon cannot refuse a release it
 * sends; a later request on the connection (or gpubuf_flush) reads the reply. */
int gpubuf__send_release(gpubuf_client *c, uint64_t id, bool keep_mapped, bool read_only) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    rel.buffer_id = id;
    rel.keep_mapped = keep_mapped;
    rel.read_only = read_only;
    req.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    req.release = &rel;
    return gpubuf__send_async_locked(c, &req);
}

int gpubuf__release_locked(gpubuf_client *c, uint64_t id, gpubuf_mapping *map, bool read_only) {
    /* Unmap (or keep the slab, pinned by this very release) before the
     * daemon may recycle the memory. */
    bool keep = gpubuf__mapping_put(c, map);
    gpubuf__held(c, id, read_only, false);
    /* Not connected: a resume claims only what views still hold. */
    return c->broken ? 0 : gpubuf__send_release(c, id, keep, read_only);
}

/* ---- what a view shows, slices ------------------------------------------ */

GPUBUF_EXTERN gpubuf_buffer *gpubuf_buffer_ref(gpubuf_buffer *b) {
    if (b)
        atomic_fetch_add(&b->refs, 1);
    return b;
}

GPUBUF_EXTERN uint64_t gpubuf_buffer_device_ptr(const gpubuf_buffer *b) {
    return b ? b->map->base + b->offset : 0;
}

GPUBUF_EXTERN void *gpubuf_buffer_host_ptr(const gpubuf_buffer *b) {
    if (!b || !b->map->host)
        return NULL;
    return (char *)b->map->host + b->offset;
}

GPUBUF_EXTERN uint64_t gpubuf_buffer_size(const gpubuf_buffer *b) {
    return b ? b->size : 0;
}

GPUBUF_EXTERN int gpubuf_buffer_device(const gpubuf_buffer *b) {
    return b ? b->map->device : -1;
}

GPUBUF_EXTERN int gpubuf_buffer_memory_device(const gpubuf_buffer *b) {
    return b ? b->map->home : -1;
}

GPUBUF_EXTERN gpubuf_pool_kind gpubuf_buffer_pool_kind(const gpubuf_buffer *b) {
    return b ? b->map->kind : (gpubuf_pool_kind)0;
}

GPUBUF_EXTERN uint64_t gpubuf_buffer_id(const gpubuf_buffer *b) {
    return b ? b->id : 0;
}

GPUBUF_EXTERN const char *gpubuf_buffer_name(const gpubuf_buffer *b) {
    return b ? b->name : "";
}

GPUBUF_EXTERN int gpubuf_buffer_read_only(const gpubuf_buffer *b) {
    return b && b->map->read_only ? 1 : 0;
}

static int buffer_slice_call(gpubuf_buffer *b, uint64_t offset, uint64_t length,
                             gpubuf_buffer **ret) {
    gpubuf_buffer *s;
    if (offset > b->size || length > b->size - offset) {
        gpubuf__set_error("slice [%llu, +%llu) outside a view of %llu bytes",
                          (unsigned long long)offset, (unsigned long long)length,
                          (unsigned long long)b->size);
        return GPUBUF_ERANGE;
    }
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    atomic_init(&s->refs, 1);
    s->c = b->c;
    s->parent = gpubuf_buffer_ref(b);
    s->map = b->map;
    s->id = b->id;
    s->offset = b->offset + offset;
    s->size = length;
    s->owns_ref = false;
    memcpy(s->name, b->name, sizeof(s->name));
    *ret = s;
    return 0;
}

GPUBUF_EXTERN int gpubuf_buffer_slice(gpubuf_buffer *b, uint64_t offset, uint64_t length,
                                      gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b && ret, -EINVAL, "a slice needs a view and a place for the slice");
    int r = buffer_slice_call(b, offset, length, ret);
    return gpubuf__result(r);
}
