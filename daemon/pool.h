/* Pool room: carves backend slabs into buffers.
 *
 * Regular slabs have the pool's slab size; a request larger than that gets a
 * dedicated slab of its own (rounded to the backend's granularity). Inside a
 * slab, free extents sit in two red-black trees, one ordered by offset (to
 * coalesce with both neighbours on free) and one by (length, offset) (best
 * fit): allocating and freeing cost O(log n) in the slab's free extents (times
 * the number of slabs, which the capacity bounds), never a scan of them.
 * Allocation is best fit over all slabs (or first over the slabs a client
 * already maps, see gd_pool_alloc_prefer). The pool grows slab by slab
 * until its capacity; an empty regular slab is kept as a spare only if no
 * other spare exists, so bytes go back to the backend. Pure bookkeeping apart
 * from the backend calls: unit-tested on the host backend. */
#ifndef GPUBUFD_POOL_H
#define GPUBUFD_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include <bsd/sys/tree.h>

#include "backend.h"

/* One free extent of a slab, in both of the slab's trees. */
typedef struct gd_extent {
    uint64_t off, len;
    RB_ENTRY(gd_extent) by_off;
    RB_ENTRY(gd_extent) by_len;
} gd_extent;
RB_HEAD(gd_extents_off, gd_extent);
RB_HEAD(gd_extents_len, gd_extent);

typedef struct gd_slab {
    uint64_t id;
    uint64_t size;
    uint64_t used;    /* bytes in live blocks */
    uint32_t blocks;  /* live blocks */
    uint32_t pins;    /* clients keeping it mapped without a block in it */
    bool dedicated;
    void *priv;
    gd_slab_export exp;
    struct gd_extents_off free_off; /* free extents, never adjacent */
    struct gd_extents_len free_len; /* the same by (length, offset) */
    uint32_t n_free;
    struct gd_pool *pool;
    struct gd_slab *next, *prev; /* utlist DL: the pool's slabs */
} gd_slab;

/* The largest id gpubufd gives a slab, a buffer or a session: ids count up
 * from 1 and never go back or wrap (a second buffer with a live id would
 * be answered for the first). 2^53 - 1 is exact in a double (JSON readers
 * of the status) and lasts 285 years at a million ids a second; a saved
 * state naming a larger id is damaged or forged, and restore drops it. */
#define GD_ID_MAX ((1ull << 53) - 1)

typedef struct gd_block {
    gd_slab *slab;
    uint64_t offset;
    uint64_t size; /* rounded size actually taken */
} gd_block;

typedef struct gd_pool {
    char *name;
    gd_backend *be;
    uint64_t capacity;   /* upper bound on bytes in slabs */
    uint64_t slab_size;
    uint64_t reserved;   /* bytes in slabs */
    uint64_t used;       /* bytes in live blocks */
    uint32_t n_slabs;
    uint32_t n_blocks;
    gd_slab *slabs;
    uint64_t *next_slab_id; /* shared counter: slab ids are unique per daemon */
    /* Who may allocate from and open buffers of this pool: uid 0, and when
     * both lists are empty, everyone who can connect. */
    uint32_t allow_uids[32], allow_gids[32];
    int n_allow_uids, n_allow_gids;
    /* Who may give buffers names in this pool (publish_uids/publish_gids):
     * uid 0, and when both lists are empty, everyone the pool allows. */
    uint32_t publish_uids[32], publish_gids[32];
    int n_publish_uids, n_publish_gids;
    /* Told of each slab made (created) and given back (!created): the
     * daemon's saved state keeps the slabs' fds (state.c). Optional. */
    void (*slab_hook)(void *arg, const gd_slab *s, bool created);
    void *slab_hook_arg;
    /* Counters since the pool was made (status, metrics). */
    struct {
        uint64_t bytes_allocated, bytes_freed; /* block sizes, after alignment */
        uint64_t slabs_created, slabs_destroyed;
        uint64_t alloc_failures;
    } stats;
} gd_pool;

/* Create a pool over backend be (the pool takes ownership of be). */
int gd_pool_new(const char *name, gd_backend *be, uint64_t capacity, uint64_t slab_size,
                uint64_t *slab_id_counter, gd_pool **ret, gd_err *err);
gd_pool *gd_pool_free(gd_pool *p);

/* Allocate size bytes aligned to align (0: the backend's alignment; must be a
 * power of two no larger than the slab granularity).
 * Returns 0, -EINVAL, GPUBUF_EPOOLFULL, -EOVERFLOW when a new slab is needed
 * and every slab id up to GD_ID_MAX was given out, or a backend error (code
 * and sentence in err). */
int gd_pool_alloc(gd_pool *p, uint64_t size, uint64_t align, gd_block *ret, gd_err *err);
/* The same, placing the block in one of the n_prefer regular slabs of p in
 * prefer (best fit among them) when one has room, before looking at the
 * others: a client's new buffers go to slabs its process has mapped. */
int gd_pool_alloc_prefer(gd_pool *p, uint64_t size, uint64_t align,
                             gd_slab *const *prefer, uint32_t n_prefer, gd_block *ret, gd_err *err);

/* Give a block back; may destroy its slab (not while it is pinned). */
void gd_pool_release(gd_pool *p, const gd_block *b);

/* A client keeps regular slab s mapped: it outlives its last block until
 * unpinned, as the exporter must not free memory another process maps. */
void gd_pool_pin(gd_slab *s);
/* Drop one pin; an empty, unpinned slab then goes like an empty one in
 * gd_pool_release. */
void gd_pool_unpin(gd_pool *p, gd_slab *s);

/* Restart: take up a slab (with its id) that a previous daemon made, from
 * the fd it kept; on success the pool owns fd. -ERANGE for an id of 0 or
 * beyond GD_ID_MAX, -EOPNOTSUPP for kinds whose memory does not outlive the
 * daemon, GPUBUF_EPOOLFULL beyond the capacity, or the backend's refusal. */
int gd_pool_adopt_slab(gd_pool *p, uint64_t id, uint64_t size, bool dedicated, int fd,
                       gd_slab **ret, gd_err *err);
/* Restart: take the block [offset, offset + size) of slab s, which must be
 * free (-EINVAL otherwise: out of the slab, or overlapping another). */
int gd_pool_claim(gd_pool *p, gd_slab *s, uint64_t offset, uint64_t size, gd_block *ret,
                  gd_err *err);
/* After a restore: give back the slabs left without blocks (one spare of
 * the regular ones stays). */
void gd_pool_trim(gd_pool *p);

/* May a client with these credentials use pool p? */
bool gd_pool_allows(const gd_pool *p, uint32_t uid, uint32_t gid);

/* May a client with these credentials name buffers in pool p (it must also
 * be allowed in p)? */
bool gd_pool_may_publish(const gd_pool *p, uint32_t uid, uint32_t gid);

/* Largest free extent of the pool's existing slabs (for tests and status). */
uint64_t gd_pool_largest_free(const gd_pool *p);

/* The free extents of slab s in offset order: the first (NULL when none),
 * and the one after e (NULL after the last). */
const gd_extent *gd_slab_free_first(const gd_slab *s);
const gd_extent *gd_slab_free_next(const gd_extent *e);

#endif
