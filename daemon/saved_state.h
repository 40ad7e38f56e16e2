/* State room, ground floor: the saved state's format (its constants, the
 * two slots, the byte order, the checksum, the fd store's names), the
 * state's own record and the kept fds, shared by the writer (state.c) and
 * the reader (state_restore.c). Outside the state room, only state.h
 * includes it. */
#ifndef GPUBUFD_SAVED_STATE_H
#define GPUBUFD_SAVED_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <uv.h>

#include "context.h"
#include "group.h"

/* One fd a previous daemon kept, with its name (LISTEN_FDNAMES, takeover). */
typedef struct gd_kept_fd {
    char name[64];
    int fd; /* -1 once taken or closed */
} gd_kept_fd;

typedef struct gd_state gd_state;

#define STATE_MAGIC "GPBUFST"   /* 8 bytes with its NUL */
/* 4: version 3 and runs of plain buffers alike (state_record.h: BUFFERS,
 * 24 bytes a buffer of an anonymous batch, not 80); 3: version 2 and three
 * more entries (a buffer's compact entry, runs of one session's
 * references, a last reference and its buffer's removal in one); 2: frames
 * hold groups of fixed entries and their checksum is XXH3 of the bytes
 * seeded with the generation and the length; 1: every frame one packed
 * StateRecord under FNV-1a. A successor reads all four; an older gpubufd
 * refuses a version it does not know. */
#define STATE_VERSION 4u
#define STATE_VERSION_3 3u
#define STATE_VERSION_2 2u
#define STATE_VERSION_1 1u
#define GD_STATE_HEADER 32u /* a slot's header (state.h: gd_state_header()) */
#define STATE_HEADER GD_STATE_HEADER
#define STATE_MAX_RECORD (1u << 20) /* one record is a few hundred bytes */
/* A snapshot comes once the slot is twice the last one and at least this
 * long. With a small registry (a few thousand buffers, a snapshot well
 * under 1 MiB) a minimum of 1 MiB made a snapshot every ~1 MiB of journal:
 * under 16 processes batching that was about 270 of gpubufd's 5,500
 * instructions per buffer (docs/performance.md, "Batch requests and replies
 * by hand"). The state's memory bound follows (docs/security.md: about
 * 5 x the snapshot, 10 MiB at least). */
#define STATE_MIN_COMPACT (4ull << 20)
#define STATE_MAP_MIN (1ull << 20) /* the journal mapping grows from here */
#define STATE_MAX_GROUP (64u << 20) /* one group (version 2): a request's changes */

/* gd_obuf, the growable byte buffer of groups: group.h. */

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
    bool no_journal; /* state_journal = off (measurement only): no record after the start */
    bool switchable; /* state_journal = switchable at start (SIGUSR2; a reload changes nothing) */
    slot slots[2];
    int active;
    uint64_t compact_at; /* compact when the active slot grows past this */
    uint64_t records;     /* journal entries written */
    uint64_t groups;      /* and the groups (frames) they went in */
    uint64_t bytes;       /* their bytes, frames included */
    uint64_t journal_ns;  /* time spent writing the timed ones of those */
    uint64_t timed_groups; /* the groups timed: one in 64 */
    uint64_t big_groups, big_bytes, big_ns; /* groups of GD_STATE_BIG_GROUP or more: each timed */
    gd_obuf stage;        /* the group being made: the entries of this request */
    unsigned depth;       /* gd_state_begin() without its gd_state_end() */
    const struct gd_buf *pend; /* a buffer whose entry is still to be staged */
    uint64_t snapshots, snapshot_ns;
    uv_timer_t expiry;
    bool expiry_on;
    struct {                 /* a snapshot made a step per turn (state_write.c) */
        bool on, idle_on;
        uint64_t gen;        /* the generation it will have */
        const struct gd_buf *cursor; /* the next buffer of by_id to write, NULL: done */
        uint64_t *holders;   /* the session ids at its start */
        size_t n_holders, pos_h;
        gd_obuf out;         /* a step's group, kept: no fresh pages each step */
        uv_idle_t idle;
    } snap;
};

/* Little-endian stores and loads: group.h. */

/* FNV-1a: a torn or stale record fails it. */
static inline uint64_t gd_state_checksum(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* The fd store's name of slab id ("slab-ID"). */
static inline void gd_state_slab_name(char *buf, size_t n, uint64_t id) {
    snprintf(buf, n, "slab-%llu", (unsigned long long)id);
}

#endif
