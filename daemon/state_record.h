/* State room, ground floor: the entries of a saved state of version 2, in
 * a fixed binary layout (little-endian), and their checksum. A frame of
 * version 2 holds either one packed StateRecord (as in version 1) or, when
 * its first byte is 0 (no StateRecord starts so: field number 0 does not
 * exist), a group: the byte 0 then entries back to back, each a kind byte
 * and its fields:
 *
 *   REF          u64 session, u64 buffer, u32 count, u32 read_only
 *   BUFFER_GONE, SESSION_GONE, SLAB_GONE   u64 id
 *   BUFFER       u64 id, slab_id, offset, block_size, size, owner_session,
 *                charged, event_session, lease_expires_ns; u32 owner_uid,
 *                lease_ttl_ms, state; u8 flags (1 restored, 2 event,
 *                4 layout); u16 name_len, u16 user_len, u16 layout_len;
 *                then the name, the event (64 bytes) if any, the layout
 *                (a packed ArrayLayout) if any, the user bytes
 *   RECORD       u32 n, then n bytes of a packed StateRecord (slabs,
 *                sessions, counters: rare)
 *   BUFFER_STATE u64 id, u32 state: only the state changed (DELETED: the
 *                lease went too)
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

#include "gpubuf_state.pb-c.h"
#include "registry.h"
#include "saved_state.h" /* gd_obuf */

enum {
    GD_SE_GROUP = 0, /* a frame's first byte: a group of entries follows */
    GD_SE_REF = 1,
    GD_SE_BUFFER_GONE = 2,
    GD_SE_SESSION_GONE = 3,
    GD_SE_SLAB_GONE = 4,
    GD_SE_BUFFER = 5,
    GD_SE_RECORD = 6,
    GD_SE_BUFFER_STATE = 7,
};

/* Room for n more bytes at o->p + o->len, or NULL (o->oom set). */
uint8_t *gd_obuf_room(gd_obuf *o, size_t n);

/* Append one entry to o. */
void gd_se_ref(gd_obuf *o, uint64_t session, uint64_t buffer, uint32_t count, uint32_t ro);
void gd_se_id(gd_obuf *o, int kind, uint64_t id);
void gd_se_buffer(gd_obuf *o, const gd_buf *b);
void gd_se_buffer_state(gd_obuf *o, uint64_t id, uint32_t state);
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
