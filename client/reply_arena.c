/* libgpubuf-client: the room the replies read by gpubuf_dispatch() are
 * unpacked into. Each such reply is settled (its completion built, its view
 * made) before the next one is read, so its fields can live in one block the
 * connection keeps and reuses: no malloc per field and no walk to free them.
 * A reply larger than the block (array metadata, user bytes) takes the rest
 * from malloc and frees it as before. */
#include <stdlib.h>

#include "internal.h"

static void *arena_alloc(void *data, size_t size) {
    gpubuf__arena *a = data;
    size = (size + 15u) & ~(size_t)15u;
    if (size <= sizeof(a->block) - a->used) {
        void *p = a->block + a->used;
        a->used += size;
        return p;
    }
    a->spilled = true;
    return malloc(size);
}

static bool arena_owns(const gpubuf__arena *a, const void *p) {
    const unsigned char *q = p;
    return q >= a->block && q < a->block + sizeof(a->block);
}

static void arena_free(void *data, void *p) {
    if (!arena_owns(data, p))
        free(p);
}

ProtobufCAllocator *gpubuf__arena_take(gpubuf__arena *a) {
    if (a->live)
        return NULL; /* one reply at a time: this one goes to malloc */
    a->alloc.alloc = arena_alloc;
    a->alloc.free = arena_free;
    a->alloc.allocator_data = a;
    a->used = 0;
    a->spilled = false;
    return &a->alloc;
}

void gpubuf__arena_unpacked(gpubuf__arena *a, Gpubuf__Response *resp) {
    a->live = resp; /* NULL: the unpack failed and gave back what it took */
}

void gpubuf__resp_free(gpubuf_client *c, Gpubuf__Response *resp) {
    gpubuf__arena *a = &c->arena;
    if (!resp)
        return;
    if (resp != a->live) {
        gpubuf__response__free_unpacked(resp, NULL);
        return;
    }
    if (a->spilled)
        gpubuf__response__free_unpacked(resp, &a->alloc); /* frees only what spilled */
    a->live = NULL;
    a->used = 0;
}
