/* State room, ground floor: the entries of a saved state of version 4
 * (and 3, 2), in a fixed binary layout (little-endian), and their checksum.
 * A frame holds either one packed StateRecord (as in version 1) or, when
 * its first byte is 0 (no StateRecord starts so: field number 0 does not
 * exist), a group: the byte 0 then entries back to back, each a kind byte
 * and its fields. What a version 4 gpubufd writes:
 *
 *   BUFFERS      a run of plain buffers (no name, metadata, event or
 *                lease) alike: u64 owner_session, size, block_size,
 *                charged; u32 owner_uid, state; u8 flags (1 restored, 16
 *                owner reference); u32 count, read_only (the owner
 *                session's reference to each, as in BUFFER3; 0 without
 *                flag 16); u32 n (1 or more); then n times u64 id,
 *                slab_id, offset (version 4)
 *   BUFFER3      (any other buffer) u64 id, slab_id, offset, block_size,
 *                size, owner_session,
 *                charged; u32 owner_uid, state; u8 flags (1 restored,
 *                2 event, 4 layout, 8 lease, 16 owner reference); u16
 *                name_len, user_len, layout_len; then u64 event_session if
 *                event, u64 lease_expires_ns and u32 lease_ttl_ms if lease,
 *                u32 count and u32 read_only if owner reference (the owner
 *                session's reference to the buffer, as a REFS entry of one
 *                would say), the name, the event (64 bytes) if any, the
 *                layout (a packed ArrayLayout) if any, the user bytes
 *   REFS         u64 session, u32 n (1 or more), then n times u64 buffer,
 *                u32 count, u32 read_only: the session's count of
 *                references to each buffer (0: none)
 *   REF_GONE     u64 session, u64 buffer: the session's last reference to
 *                the buffer went (count 0), and with it the buffer
 *   BUFFER_GONE, SESSION_GONE, SLAB_GONE   u64 id
 *   BUFFER_STATE u64 id, u32 state: only the state changed (DELETED: the
 *                lease went too)
 *   RECORD       u32 n, then n bytes of a packed StateRecord (slabs,
 *                sessions, counters: rare)
 *
 * and what version 2 wrote besides, still read:
 *
 *   REF          u64 session, u64 buffer, u32 count, u32 read_only
 *   BUFFER       as BUFFER3 without the flags 8 and 16, with u64
 *                event_session and lease_expires_ns after charged and u32
 *                lease_ttl_ms after owner_uid, always (0: none)
 *
 * A group is the unit of the journal: every change one request made (a
 * whole batch) is one group, written before the request's reply is sent,
 * and replayed whole or not at all. See docs/architecture.md, "Restart
 * survival". */
#ifndef GPUBUFD_STATE_RECORD_H
#define GPUBUFD_STATE_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gpubuf_state.pb-c.h"
#include "registry.h"
#include "group.h"       /* gd_obuf, gd_se_ref */
#include "saved_state.h"

enum {
    GD_SE_GROUP = 0, /* a frame's first byte: a group of entries follows */
    GD_SE_REF = 1,
    /* 2: GD_SE_BUFFER_GONE (group.h) */
    GD_SE_SESSION_GONE = 3,
    GD_SE_SLAB_GONE = 4,
    GD_SE_BUFFER = 5,
    GD_SE_RECORD = 6,
    /* 7: GD_SE_BUFFER_STATE (group.h) */
    GD_SE_BUFFER3 = 8,
    /* 9: GD_SE_REFS, 10: GD_SE_REF_GONE (group.h) */
    GD_SE_BUFFERS = 11,
};

/* BUFFER3's flags, and its size before the optional fields. */
enum {
    GD_SE_F_RESTORED = 1,
    GD_SE_F_EVENT = 2,
    GD_SE_F_LAYOUT = 4,
    GD_SE_F_LEASE = 8,     /* BUFFER3 only */
    GD_SE_F_OWNER_REF = 16 /* BUFFER3 only */
};
#define GD_SE_BUF3_FIXED (7 * 8 + 2 * 4 + 1 + 3 * 2)

/* gd_obuf_room, gd_se_ref (a reference count, into a run of its
 * session's), gd_se_id, gd_se_ref_gone and gd_se_buffer_state: group.h.
 * A plain buffer's entry is inline too (a batch writes one per buffer). */

/* The fixed part of b's BUFFER3 entry up to its flags, at p; the byte
 * after. */
static inline uint8_t *gd_se_buffer3_fixed(uint8_t *p, const gd_buf *b) {
    *p++ = GD_SE_BUFFER3;
    p = gd_state_put64(p, b->id);
    p = gd_state_put64(p, b->blk.slab->id);
    p = gd_state_put64(p, b->blk.offset);
    p = gd_state_put64(p, b->blk.size);
    p = gd_state_put64(p, b->size);
    p = gd_state_put64(p, b->owner_holder);
    p = gd_state_put64(p, b->charged);
    p = gd_state_put32(p, b->owner_uid);
    return gd_state_put32(p, (uint32_t)b->state);
}

/* Whether b has no name, metadata, event or lease (an anonymous batch's
 * buffer): its entry is then the fixed part and the owner's count. */
static inline bool gd_se_buffer_is_plain(const gd_buf *b) {
    return !b->name && !b->meta && !b->has_event && !b->lease_slot;
}

/* A BUFFERS entry (a run of plain buffers, version 4): its head, then n
 * items; the offsets of its fields in the head. */
#define GD_SE_BRUN_HEAD (1 + 4 * 8 + 2 * 4 + 1 + 3 * 4)
#define GD_SE_BRUN_ITEM 24u /* u64 id, slab_id, offset */
enum {
    GD_SE_BRUN_SESSION = 1,
    GD_SE_BRUN_SIZE = 9,
    GD_SE_BRUN_BLOCK = 17,
    GD_SE_BRUN_CHARGED = 25,
    GD_SE_BRUN_UID = 33,
    GD_SE_BRUN_STATE = 37,
    GD_SE_BRUN_FLAGS = 41,
    GD_SE_BRUN_COUNT = 42,
    GD_SE_BRUN_RO = 46,
    GD_SE_BRUN_N = 50
};

/* Whether the run's head at h says what b's entry would (all but its id,
 * slab and offset). */
static inline bool gd_se_brun_same(const uint8_t *h, const gd_buf *b, uint8_t flags, uint32_t count,
                                   uint32_t ro) {
    return gd_state_get64(h + GD_SE_BRUN_SESSION) == b->owner_holder &&
           gd_state_get64(h + GD_SE_BRUN_SIZE) == b->size &&
           gd_state_get64(h + GD_SE_BRUN_BLOCK) == b->blk.size &&
           gd_state_get64(h + GD_SE_BRUN_CHARGED) == b->charged &&
           gd_state_get32(h + GD_SE_BRUN_UID) == b->owner_uid &&
           gd_state_get32(h + GD_SE_BRUN_STATE) == (uint32_t)b->state &&
           h[GD_SE_BRUN_FLAGS] == flags && gd_state_get32(h + GD_SE_BRUN_COUNT) == count &&
           gd_state_get32(h + GD_SE_BRUN_RO) == ro;
}

/* b's item (id, slab, offset) at p + len, the end of o's last entry, the
 * run at p + at: its count up, o's length on. In locals: a store through
 * uint8_t * may alias o's fields (as in gd_se_ref). */
static inline void gd_se_brun_item(gd_obuf *o, uint8_t *p, size_t at, size_t len, const gd_buf *b) {
    gd_state_put64(gd_state_put64(gd_state_put64(p + len, b->id), b->blk.slab->id), b->blk.offset);
    gd_state_put32(p + at + GD_SE_BRUN_N, gd_state_get32(p + at + GD_SE_BRUN_N) + 1);
    len += GD_SE_BRUN_ITEM;
    o->len = len;
    o->brun_end = len;
}

/* b's entry when the fast path below cannot take it (state_record.c): an
 * item of the run that is o's last entry after growing o, else a new run
 * of b alone. */
void gd_se_brun_next(gd_obuf *o, const gd_buf *b, uint8_t flags, uint32_t count, uint32_t ro);

/* gd_se_buffer of a plain buffer: an item of the run that is o's last
 * entry when that run says the rest of b's entry (an anonymous batch's
 * buffers: one owner, size and state), else a new run. 24 bytes a buffer
 * in a run, against 80 for a BUFFER3 entry of its own. */
static inline void gd_se_buffer_plain(gd_obuf *o, const gd_buf *b, const uint32_t owner_ref[2]) {
    uint8_t flags =
        (uint8_t)((b->restored ? GD_SE_F_RESTORED : 0) | (owner_ref ? GD_SE_F_OWNER_REF : 0));
    uint32_t count = owner_ref ? owner_ref[0] : 0, ro = owner_ref ? owner_ref[1] : 0;
    size_t len = o->len, at = o->brun_at;
    uint8_t *p = o->p;
    if (o->brun_end != len || len == 0 || o->cap - len < GD_SE_BRUN_ITEM ||
        !gd_se_brun_same(p + at, b, flags, count, ro)) {
        gd_se_brun_next(o, b, flags, count, ro);
        return;
    }
    gd_se_brun_item(o, p, at, len, b);
}

/* gd_se_buffer of any other buffer (state_record.c). */
void gd_se_buffer_full(gd_obuf *o, const gd_buf *b, const uint32_t owner_ref[2]);

/* b's entry; owner_ref (NULL: none): the count and read-only count of b's
 * owner's reference to b, said with it. */
static inline void gd_se_buffer(gd_obuf *o, const gd_buf *b, const uint32_t owner_ref[2]) {
    if (gd_se_buffer_is_plain(b))
        gd_se_buffer_plain(o, b, owner_ref);
    else
        gd_se_buffer_full(o, b, owner_ref);
}
void gd_se_record(gd_obuf *o, const Gpubuf__StateRecord *rec);

/* The checksum of a frame of version 2: XXH3 (64 bits folded to 32) of its
 * bytes, seeded with the slot's generation and the frame's length, so that
 * a frame left over from an older generation in the same memfd, or read
 * with a torn length, fails. */
uint32_t gd_se_checksum(uint64_t gen, const uint8_t *p, uint32_t n);

/* Decode the entries of a group (p[0..n), after its first byte) into
 * records, each as protobuf-c would unpack it (free each with
 * gpubuf__state_record__free_unpacked(rec, NULL)). *ret is allocated (free
 * it); *n_ret records. -EINVAL: a malformed group (nothing returned);
 * -ENOMEM. */
int gd_se_decode(const uint8_t *p, size_t n, Gpubuf__StateRecord ***ret, size_t *n_ret);

#endif
