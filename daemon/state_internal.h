/* State room, private: what state.c (the journal writer, the fd store)
 * shares with state_restore.c (the saved state read back and restored at
 * start). Nothing outside the state room includes it. */
#ifndef GPUBUFD_STATE_INTERNAL_H
#define GPUBUFD_STATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "state.h"

#define STATE_MAGIC "GPBUFST"   /* 8 bytes with its NUL */
#define STATE_VERSION 1u
#define STATE_HEADER GD_STATE_HEADER
#define STATE_MAX_RECORD (1u << 20) /* one record is a few hundred bytes */
#define STATE_MIN_COMPACT (1ull << 20)
#define STATE_MAP_MIN (1ull << 20) /* the journal mapping grows from here */

typedef struct slot {
    int fd;
    uint64_t gen; /* 0: holds nothing valid */
    uint64_t len; /* bytes written, header included */
    uint8_t *map; /* the journal's shared mapping of fd (cap bytes), or NULL */
    uint64_t cap;
} slot;

struct gd_state {
    gd_context *ctx;
    bool fdstore;
    bool frozen;
    bool failed; /* a write failed: the kept state is behind (logged once) */
    slot slots[2];
    int active;
    uint64_t compact_at; /* compact when the active slot grows past this */
    uint64_t records;     /* journal records written */
    uint64_t journal_ns;  /* time spent writing them */
    uint64_t snapshots, snapshot_ns;
    uv_timer_t expiry;
    bool expiry_on;
};

static inline uint32_t gd_state_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t gd_state_get64(const uint8_t *p) {
    return (uint64_t)gd_state_get32(p) | (uint64_t)gd_state_get32(p + 4) << 32;
}

/* FNV-1a: a torn or stale record fails it. */
uint64_t gd_state_checksum(const void *p, size_t n);
/* The fd store's name of slab id ("slab-ID"). */
void gd_state_slab_name(char *buf, size_t n, uint64_t id);
/* The generation of a slot's header, 0 when it has none valid. */
uint64_t gd_state_slot_gen(int fd);
/* The fd named name among kept (not taken yet), or NULL. */
gd_kept_fd *gd_state_kept_find(gd_kept_fd *kept, size_t n, const char *name);
/* Replay the saved state in the slot fd and restore the registry and the
 * pools from it, with the slab fds in kept (state_restore.c). */
void gd_state_restore(gd_state *st, int fd, gd_kept_fd *kept, size_t n);

#endif
