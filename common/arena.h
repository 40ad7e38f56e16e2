/* A protobuf-c allocator over a block of the caller's: what a message unpacks
 * takes room in the block, and what does not fit comes from malloc (the
 * arena is then "spilled"). The client unpacks the replies an event loop
 * reads into one (client/reply_fast.c), gpubufd its requests (daemon/
 * session.c): one message at a time, no malloc per field, nothing to walk
 * when it goes. */
#ifndef GPUBUF_ARENA_H
#define GPUBUF_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct gpubuf_arena {
    ProtobufCAllocator alloc; /* pass &a->alloc to an unpack or a free_unpacked */
    unsigned char *block;     /* 16-byte aligned */
    size_t size, used;
    bool spilled; /* something came from malloc since the last reset */
} gpubuf_arena;

/* An arena over block (size bytes, 16-byte aligned), empty. */
void gpubuf_arena_init(gpubuf_arena *a, void *block, size_t size);
/* Empty again: what was in the block is gone (what spilled is freed by a
 * free_unpacked with &a->alloc first). */
void gpubuf_arena_reset(gpubuf_arena *a);
/* size bytes (rounded up to 16) of the block; NULL when they do not fit
 * (nothing spills). */
void *gpubuf_arena_take(gpubuf_arena *a, size_t size);
/* True when p lies in the block. */
bool gpubuf_arena_owns(const gpubuf_arena *a, const void *p);

#endif
