/* Session room, ground floor: the replies of single requests and of
 * batches packed without protobuf-c's generic packer. See reply.h.
 *
 * Every alloc, seal, open, release, delete and stat is answered with a
 * Response that holds at most id, status, message, fds and a Buffer (with
 * its Slab). protobuf-c sizes such a reply by walking its descriptors, then
 * walks them again to pack it: about 2,400 instructions a reply, a third of
 * the daemon's work per request under 16 processes of single requests
 * (docs/performance.md, "Replies packed by hand"). Here the same bytes come
 * from straight-line code: the fields in field-number order, each left out
 * when it is zero, empty or absent, as protobuf-c does for proto3 fields.
 * A batch's reply (a BatchReply: columns of packed numbers, one element
 * per item) cost protobuf-c about 580 instructions per item, sized and
 * packed (docs/performance.md, "Batch requests and replies by hand").
 * Any other reply (another body, a Buffer or BatchReply with an array
 * layout, unknown fields) goes to protobuf-c as before.
 * tests/test_reply_pack.c fills every field of these messages through
 * their descriptors and checks the bytes against protobuf-c's. */
#include "reply.h"

#include <string.h>

#include "gpubuf.pb-c.h"
#include "pb_write.h"

/* The fields this file knows; a message that grew more is left to
 * protobuf-c until this file learns them (the test says so first). */
#define RESPONSE_FIELDS 8u
#define BUFFER_FIELDS 17u
#define SLAB_FIELDS 8u
#define BATCH_FIELDS 15u
#define ITEM_ERROR_FIELDS 2u

static size_t slab_size(const Gpubuf__Slab *m) {
    return f_u64(1, m->slab_id) + f_i32(2, (int32_t)m->kind) + f_i32(3, m->device) +
           f_bytes(4, m->device_uuid) + f_u64(5, m->size) + f_bytes(6, m->ipc_handle) +
           f_bool(7, m->keepable) + f_bool(8, m->read_only);
}

static uint8_t *slab_pack(uint8_t *p, const Gpubuf__Slab *m) {
    p = p_u64(p, 1, m->slab_id);
    p = p_i32(p, 2, (int32_t)m->kind);
    p = p_i32(p, 3, m->device);
    p = p_bytes(p, 4, m->device_uuid);
    p = p_u64(p, 5, m->size);
    p = p_bytes(p, 6, m->ipc_handle);
    p = p_bool(p, 7, m->keepable);
    return p_bool(p, 8, m->read_only);
}

/* The Buffer's size; *slab_len: its Slab's (0: none). */
static size_t buffer_size(const Gpubuf__Buffer *m, size_t *slab_len) {
    size_t n = f_u64(1, m->buffer_id) + f_str(2, m->name) + f_str(3, m->pool) +
               f_u64(4, m->size) + f_u64(5, m->offset) + f_i32(6, (int32_t)m->state) +
               f_u64(7, m->refs) + f_u64(9, m->owner_uid) + f_u64(10, m->slab_id) +
               f_bytes(11, m->event_handle) + f_bool(12, m->read_only) +
               f_bytes(14, m->user_data) + f_u64(15, m->lease_left_ms) +
               f_u64(16, m->lease_ttl_ms) + f_bool(17, m->restored);
    *slab_len = m->slab ? slab_size(m->slab) : 0;
    if (m->slab)
        n += f_len(8, *slab_len);
    return n;
}

static uint8_t *buffer_pack(uint8_t *p, const Gpubuf__Buffer *m, size_t slab_len) {
    p = p_u64(p, 1, m->buffer_id);
    p = p_str(p, 2, m->name);
    p = p_str(p, 3, m->pool);
    p = p_u64(p, 4, m->size);
    p = p_u64(p, 5, m->offset);
    p = p_i32(p, 6, (int32_t)m->state);
    p = p_u64(p, 7, m->refs);
    if (m->slab) {
        p = vput(p, PB_TAG(8, PB_LEN));
        p = vput(p, slab_len);
        p = slab_pack(p, m->slab);
    }
    p = p_u64(p, 9, m->owner_uid);
    p = p_u64(p, 10, m->slab_id);
    p = p_bytes(p, 11, m->event_handle);
    p = p_bool(p, 12, m->read_only);
    /* 13, the layout: such a reply is not packed here. */
    p = p_bytes(p, 14, m->user_data);
    p = p_u64(p, 15, m->lease_left_ms);
    p = p_u64(p, 16, m->lease_ttl_ms);
    return p_bool(p, 17, m->restored);
}

/* sint32 */
static inline uint32_t zigzag(int32_t v) {
    return v < 0 ? ((~(uint32_t)v) << 1) | 1u : (uint32_t)v << 1;
}

/* Packed repeated numbers: the payload's length (0: none, and the field is
 * left out), and the field with its tag and length. */
static size_t a_u64(const uint64_t *v, size_t n) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += vlen(v[i]);
    return len;
}
/* uint32, or sint32 (zig: each a zigzagged int32_t). */
static size_t a_u32(const uint32_t *v, size_t n, bool zig) {
    size_t len = 0;
    for (size_t i = 0; i < n; i++)
        len += vlen(zig ? zigzag((int32_t)v[i]) : v[i]);
    return len;
}
static inline size_t f_packed(unsigned num, size_t n, size_t len) {
    return n ? f_len(num, len) : 0;
}
static inline uint8_t *p_head(uint8_t *p, unsigned num, size_t len) {
    p = vput(p, PB_TAG(num, PB_LEN));
    return vput(p, len);
}
static uint8_t *p_a_u64(uint8_t *p, unsigned num, const uint64_t *v, size_t n, size_t len) {
    if (!n)
        return p;
    p = p_head(p, num, len);
    for (size_t i = 0; i < n; i++)
        p = vput(p, v[i]);
    return p;
}
static uint8_t *p_a_u32(uint8_t *p, unsigned num, const uint32_t *v, size_t n, size_t len,
                        bool zig) {
    if (!n)
        return p;
    p = p_head(p, num, len);
    for (size_t i = 0; i < n; i++)
        p = vput(p, zig ? zigzag((int32_t)v[i]) : v[i]);
    return p;
}

static size_t item_error_size(const Gpubuf__BatchItemError *e) {
    return f_u64(1, e->item) + f_str(2, e->message);
}

/* The BatchReply's size; arr: the payloads of its packed arrays. */
static size_t batch_size(const Gpubuf__BatchReply *m, size_t arr[9]) {
    arr[0] = a_u32((const uint32_t *)m->status, m->n_status, true);
    arr[1] = a_u64(m->buffer_id, m->n_buffer_id);
    arr[2] = a_u64(m->size, m->n_size);
    arr[3] = a_u64(m->offset, m->n_offset);
    arr[4] = a_u64(m->slab_id, m->n_slab_id);
    arr[5] = a_u32(m->event_items, m->n_event_items, false);
    arr[6] = a_u32(m->state, m->n_state, false);
    arr[7] = a_u64(m->lease_left_ms, m->n_lease_left_ms);
    arr[8] = a_u32(m->meta_items, m->n_meta_items, false);
    size_t n = f_packed(1, m->n_status, arr[0]) + f_packed(3, m->n_buffer_id, arr[1]) +
               f_packed(4, m->n_size, arr[2]) + f_packed(5, m->n_offset, arr[3]) +
               f_packed(6, m->n_slab_id, arr[4]) + f_bytes(7, m->names) +
               f_packed(9, m->n_event_items, arr[5]) + f_bytes(10, m->events) +
               f_packed(11, m->n_state, arr[6]) + f_packed(14, m->n_lease_left_ms, arr[7]) +
               f_packed(15, m->n_meta_items, arr[8]);
    for (size_t i = 0; i < m->n_errors; i++)
        n += f_len(2, item_error_size(m->errors[i]));
    for (size_t i = 0; i < m->n_slabs; i++)
        n += f_len(8, slab_size(m->slabs[i]));
    for (size_t i = 0; i < m->n_user_data; i++)
        n += f_len(13, m->user_data[i].len);
    return n;
}

static uint8_t *batch_pack(uint8_t *p, const Gpubuf__BatchReply *m, const size_t arr[9]) {
    p = p_a_u32(p, 1, (const uint32_t *)m->status, m->n_status, arr[0], true);
    for (size_t i = 0; i < m->n_errors; i++) {
        const Gpubuf__BatchItemError *e = m->errors[i];
        p = p_head(p, 2, item_error_size(e));
        p = p_u64(p, 1, e->item);
        p = p_str(p, 2, e->message);
    }
    p = p_a_u64(p, 3, m->buffer_id, m->n_buffer_id, arr[1]);
    p = p_a_u64(p, 4, m->size, m->n_size, arr[2]);
    p = p_a_u64(p, 5, m->offset, m->n_offset, arr[3]);
    p = p_a_u64(p, 6, m->slab_id, m->n_slab_id, arr[4]);
    p = p_bytes(p, 7, m->names);
    for (size_t i = 0; i < m->n_slabs; i++) {
        p = p_head(p, 8, slab_size(m->slabs[i]));
        p = slab_pack(p, m->slabs[i]);
    }
    p = p_a_u32(p, 9, m->event_items, m->n_event_items, arr[5], false);
    p = p_bytes(p, 10, m->events);
    p = p_a_u32(p, 11, m->state, m->n_state, arr[6], false);
    /* 12, the layouts: such a reply is not packed here. */
    for (size_t i = 0; i < m->n_user_data; i++)
        p = p_data(p, 13, m->user_data[i].data, m->user_data[i].len);
    p = p_a_u64(p, 14, m->lease_left_ms, m->n_lease_left_ms, arr[7]);
    return p_a_u32(p, 15, m->meta_items, m->n_meta_items, arr[8], false);
}

/* May this file pack the BatchReply b? */
static bool packs_batch(const Gpubuf__BatchReply *b) {
    if (!b || b->n_layouts || b->base.n_unknown_fields ||
        gpubuf__batch_reply__descriptor.n_fields != BATCH_FIELDS ||
        gpubuf__batch_item_error__descriptor.n_fields != ITEM_ERROR_FIELDS ||
        gpubuf__slab__descriptor.n_fields != SLAB_FIELDS)
        return false;
    for (size_t i = 0; i < b->n_errors; i++)
        if (b->errors[i]->base.n_unknown_fields)
            return false;
    for (size_t i = 0; i < b->n_slabs; i++)
        if (b->slabs[i]->base.n_unknown_fields)
            return false;
    return true;
}

/* May this file pack r? */
static bool packs(const Gpubuf__Response *r) {
    if (r->base.n_unknown_fields || r->base.descriptor != &gpubuf__response__descriptor ||
        gpubuf__response__descriptor.n_fields != RESPONSE_FIELDS)
        return false;
    if (r->body_case == GPUBUF__RESPONSE__BODY__NOT_SET)
        return true;
    if (r->body_case == GPUBUF__RESPONSE__BODY_BATCH)
        return packs_batch(r->batch);
    if (r->body_case != GPUBUF__RESPONSE__BODY_BUFFER)
        return false;
    const Gpubuf__Buffer *b = r->buffer;
    if (!b || b->layout || b->base.n_unknown_fields ||
        gpubuf__buffer__descriptor.n_fields != BUFFER_FIELDS)
        return false;
    return !b->slab || (!b->slab->base.n_unknown_fields &&
                        gpubuf__slab__descriptor.n_fields == SLAB_FIELDS);
}

size_t gd_reply_size(const Gpubuf__Response *r, gd_reply_plan *plan) {
    plan->resp = r;
    if (!packs(r)) {
        plan->pack = gd_session_pack;
        plan->msg = r;
        return gpubuf__response__get_packed_size(r);
    }
    plan->pack = gd_reply_pack_fast;
    plan->msg = plan;
    plan->buffer_len = plan->slab_len = 0;
    size_t n = f_u64(1, r->id) + f_u64(2, zigzag(r->status)) + f_str(3, r->message) +
               f_u64(4, r->fds);
    if (r->body_case == GPUBUF__RESPONSE__BODY_BUFFER) {
        plan->buffer_len = buffer_size(r->buffer, &plan->slab_len);
        n += f_len(11, plan->buffer_len);
    } else if (r->body_case == GPUBUF__RESPONSE__BODY_BATCH) {
        plan->batch_len = batch_size(r->batch, plan->arr);
        n += f_len(13, plan->batch_len);
    }
    return n;
}

void gd_reply_pack_fast(const void *msg, uint8_t *dst) {
    const gd_reply_plan *plan = msg;
    const Gpubuf__Response *r = plan->resp;
    uint8_t *p = p_u64(dst, 1, r->id);
    p = p_u64(p, 2, zigzag(r->status));
    p = p_str(p, 3, r->message);
    p = p_u64(p, 4, r->fds);
    if (r->body_case == GPUBUF__RESPONSE__BODY_BUFFER) {
        p = vput(p, PB_TAG(11, PB_LEN));
        p = vput(p, plan->buffer_len);
        buffer_pack(p, r->buffer, plan->slab_len);
    } else if (r->body_case == GPUBUF__RESPONSE__BODY_BATCH) {
        p = p_head(p, 13, plan->batch_len);
        batch_pack(p, r->batch, plan->arr);
    }
}
