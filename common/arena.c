/* The allocator of arena.h. */
#include "arena.h"

#include <stdlib.h>

void *gpubuf_arena_take(gpubuf_arena *a, size_t size) {
    size = (size + 15u) & ~(size_t)15u;
    if (size > a->size - a->used)
        return NULL;
    void *p = a->block + a->used;
    a->used += size;
    return p;
}

bool gpubuf_arena_owns(const gpubuf_arena *a, const void *p) {
    const unsigned char *q = p;
    return q >= a->block && q < a->block + a->size;
}

static void *arena_alloc(void *data, size_t size) {
    gpubuf_arena *a = data;
    void *p = gpubuf_arena_take(a, size);
    if (p)
        return p;
    a->spilled = true;
    return malloc(size);
}

static void arena_free(void *data, void *p) {
    if (!gpubuf_arena_owns(data, p))
        free(p);
}

void gpubuf_arena_reset(gpubuf_arena *a) {
    a->used = 0;
    a->spilled = false;
}

void gpubuf_arena_init(gpubuf_arena *a, void *block, size_t size) {
    a->alloc.alloc = arena_alloc;
    a->alloc.free = arena_free;
    a->alloc.allocator_data = a;
    a->block = block;
    a->size = size;
    gpubuf_arena_reset(a);
}
