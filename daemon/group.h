/* State room, basement: the growable byte buffer that a saved state's
 * groups are made in (gd_obuf), its little-endian stores, and the entry
 * that the registry itself appends to it inside a request: a run of one
 * session's reference counts (GD_SE_REFS, state_record.h has the other
 * entries). Nothing here knows the registry, so the registry can include
 * it (registry.c: gd_registry.ref_sink) without a loop. */
#ifndef GPUBUFD_GROUP_H
#define GPUBUFD_GROUP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* A growable byte buffer. run_at, run_end and run_session: the run of
 * references (GD_SE_REFS) that a next reference of that session extends,
 * while it is the last entry (run_end == len; 0: none). Whatever resets
 * len opens a group after (gd_group_open()), which ends the run.
 * pend_buffer and pend_session (0: none): a buffer whose own entry is yet
 * to come, and its owner: that session's count of references to it is kept
 * in pend_ref (pend_has_ref) rather than appended, for the buffer's entry
 * to carry (state.c, pend_write). An alloc's owner reference is then no
 * entry of its own, and a later count of it in the same request, kept
 * there too, is never written before the buffer's entry. */
typedef struct gd_obuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
    size_t run_at, run_end;
    uint64_t run_session;
    /* The run of plain buffers (GD_SE_BUFFERS, state_record.h) that a next
     * plain buffer alike extends, while it is the last entry (brun_end ==
     * len; 0: none), as run_at and run_end for references. */
    size_t brun_at, brun_end;
    uint64_t pend_buffer, pend_session;
    uint32_t pend_ref[2];
    uint32_t pend_n; /* counts kept aside (entries the registry counted, none written) */
    bool pend_has_ref;
    /* Inside a request, no snapshot under way: the registry appends a
     * buffer's state and removal entries itself too (registry.c), as it
     * does its reference counts, while the group is under GD_OBUF_DIRECT_MAX;
     * else they go through its hooks (which write a group that grows past
     * the largest one a replay takes, STATE_MAX_GROUP, in parts). */
    bool direct;
} gd_obuf;

#define GD_OBUF_DIRECT_MAX (32u << 20)

/* Little-endian stores, returning the byte after: one move each where the
 * machine is little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint8_t *gd_state_put64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
    return p + 8;
}

static inline uint8_t *gd_state_put32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
    return p + 4;
}
#else
static inline uint8_t *gd_state_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}

static inline uint8_t *gd_state_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}
#endif

/* Little-endian loads: one move each where the machine is little-endian
 * (a run's head is read for every buffer that might extend it). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint32_t gd_state_get32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static inline uint64_t gd_state_get64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
#else
static inline uint32_t gd_state_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t gd_state_get64(const uint8_t *p) {
    return (uint64_t)gd_state_get32(p) | (uint64_t)gd_state_get32(p + 4) << 32;
}
#endif

/* The growing path of gd_obuf_room: out of line (inlined, it made every
 * entry's writer save six registers for a path it almost never takes). */
uint8_t *gd_obuf_grow(gd_obuf *o, size_t n);

/* Room for n more bytes at o->p + o->len, or NULL (o->oom set). */
static inline uint8_t *gd_obuf_room(gd_obuf *o, size_t n) {
    return !o->oom && o->cap - o->len >= n ? o->p + o->len : gd_obuf_grow(o, n);
}

/* The kinds of the entries the registry may append itself (state_record.h
 * has the others). */
#define GD_SE_BUFFER_GONE 2
#define GD_SE_BUFFER_STATE 7
#define GD_SE_REFS 9
#define GD_SE_REF_GONE 10
#define GD_SE_RUN_HEAD 13u /* a REFS entry's kind, u64 session, u32 n */
#define GD_SE_RUN_ITEM 16u /* and each item: u64 buffer, u32 count, u32 read_only */

/* Append one entry to o: inline, the journal writes several for every
 * buffer of a batch (callgrind, batchmix: a call and its frame were a third
 * of such an entry). */
static inline void gd_se_id(gd_obuf *o, int kind, uint64_t id) {
    uint8_t *p = gd_obuf_room(o, 9);
    if (!p)
        return;
    *p = (uint8_t)kind;
    gd_state_put64(p + 1, id);
    o->len += 9;
}

static inline void gd_se_ref_gone(gd_obuf *o, uint64_t session, uint64_t buffer) {
    uint8_t *p = gd_obuf_room(o, 17);
    if (!p)
        return;
    *p = GD_SE_REF_GONE;
    gd_state_put64(gd_state_put64(p + 1, session), buffer);
    o->len += 17;
}

static inline void gd_se_buffer_state(gd_obuf *o, uint64_t id, uint32_t state) {
    uint8_t *p = gd_obuf_room(o, 13);
    if (!p)
        return;
    *p = GD_SE_BUFFER_STATE;
    gd_state_put32(gd_state_put64(p + 1, id), state);
    o->len += 13;
}

/* Append a REFS entry of session's one reference to o. */
void gd_se_ref_run(gd_obuf *o, uint64_t session, uint64_t buffer, uint32_t count, uint32_t ro);

/* Append one reference to o: to o's run of session's references while that
 * run is o's last entry, else as a new run. The most frequent entry (every
 * reference a request takes or gives back): its common case inline, in
 * locals (a store through uint8_t * may alias o's fields: written through
 * o, each was loaded again after the run's count was stored). A buffer
 * that ran out of memory (o->oom) still takes items within its capacity:
 * its group is dropped whole when written (state.c, commit). The owner's
 * count of the pending buffer is kept aside (pend_ref, above). */
static inline void gd_se_ref(gd_obuf *o, uint64_t session, uint64_t buffer, uint32_t count,
                             uint32_t ro) {
    if (buffer == o->pend_buffer && session == o->pend_session) {
        o->pend_ref[0] = count;
        o->pend_ref[1] = ro;
        o->pend_has_ref = true;
        o->pend_n++;
        return;
    }
    size_t len = o->len, at = o->run_at;
    uint8_t *p = o->p;
    if (o->run_end != len || len == 0 || o->run_session != session ||
        o->cap - len < GD_SE_RUN_ITEM) {
        gd_se_ref_run(o, session, buffer, count, ro);
        return;
    }
    gd_state_put32(gd_state_put32(gd_state_put64(p + len, buffer), count), ro);
    gd_state_put32(p + at + 9, gd_state_get32(p + at + 9) + 1);
    len += GD_SE_RUN_ITEM;
    o->len = len;
    o->run_end = len;
}

#endif
