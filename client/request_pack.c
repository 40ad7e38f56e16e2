/* libgpubuf-client: the single requests of a buffer's life packed by hand.
 * protobuf-c's get_packed_size and pack of an open request by name took
 * 3,400 instructions (callgrind, a warm open of 14,000 in all); these are a
 * tenth of that. As gpubufd's replies (daemon/reply_pack.c), through the
 * same writers (common/pb_write.h): sized first, then written in
 * field-number order, a proto3 field at its zero value left out, a oneof's
 * member always there: the bytes protobuf-c writes. Whatever this does not
 * know it declines (0): another body, an array layout, an empty or NULL
 * name of a oneof (protobuf-c leaves a oneof's string at its default out),
 * a request larger than the room. protobuf-c then packs it as before.
 * tests/test_request_pack.c checks them against protobuf-c on generated
 * requests. */
#include <string.h>

#include "internal.h"
#include "pb_write.h"

_Static_assert(GPUBUF__OPEN_REQUEST__TARGET_NAME == 1 && GPUBUF__STAT_REQUEST__TARGET_NAME == 1 &&
                   GPUBUF__DELETE_REQUEST__TARGET_NAME == 1 &&
                   GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID == 2 &&
                   GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID == 2 &&
                   GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID == 2,
               "a target's case is its field number");

/* The target of an open, stat or delete: a name (field 1) or an id (2).
 * False when declined; else its size in *n. */
static bool target_size(int target_case, const char *name, uint64_t id, size_t *n) {
    if (target_case == 1 && name && *name)
        *n = f_str(1, name);
    else if (target_case == 2)
        *n = f_u64_set(2, id);
    else
        return false;
    return true;
}

static uint8_t *target_pack(uint8_t *p, int target_case, const char *name, uint64_t id) {
    return target_case == 1 ? p_str(p, 1, name) : p_u64_set(p, 2, id);
}

/* ExpectedOwner as field num: left out when NULL, its uid left out at 0. */
static size_t owner_size(unsigned num, const Gpubuf__ExpectedOwner *o) {
    return o ? f_len(num, f_u64(1, o->uid)) : 0;
}

static uint8_t *owner_pack(uint8_t *p, unsigned num, const Gpubuf__ExpectedOwner *o) {
    if (!o)
        return p;
    p = vput(vput(p, PB_TAG(num, PB_LEN)), f_u64(1, o->uid));
    return p_u64(p, 1, o->uid);
}

/* A stat's or a delete's body: target, pool (3), owner (4). */
static bool lookup_size(int target_case, const char *name, uint64_t id, const char *pool,
                        const Gpubuf__ExpectedOwner *o, size_t *n) {
    if (!target_size(target_case, name, id, n))
        return false;
    *n += f_str(3, pool) + owner_size(4, o);
    return true;
}

static uint8_t *lookup_pack(uint8_t *p, int target_case, const char *name, uint64_t id,
                            const char *pool, const Gpubuf__ExpectedOwner *o) {
    p = target_pack(p, target_case, name, id);
    p = p_str(p, 3, pool);
    return owner_pack(p, 4, o);
}

/* The body's field number (0: declined) and size in *n. */
static unsigned body_size(const Gpubuf__Request *req, size_t *n) {
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_OPEN: {
        const Gpubuf__OpenRequest *m = req->open;
        if (!target_size((int)m->target_case, m->name, m->buffer_id, n))
            return 0;
        *n += f_i32(3, m->timeout_ms) + f_bool(4, m->read_only) + f_str(5, m->pool) +
              owner_size(6, m->owner);
        return 13;
    }
    case GPUBUF__REQUEST__BODY_STAT: {
        const Gpubuf__StatRequest *m = req->stat;
        return lookup_size((int)m->target_case, m->name, m->buffer_id, m->pool, m->owner, n)
                   ? 16
                   : 0;
    }
    case GPUBUF__REQUEST__BODY_DELETE: {
        const Gpubuf__DeleteRequest *m = req->delete_;
        return lookup_size((int)m->target_case, m->name, m->buffer_id, m->pool, m->owner, n)
                   ? 15
                   : 0;
    }
    case GPUBUF__REQUEST__BODY_RELEASE: {
        const Gpubuf__ReleaseRequest *m = req->release;
        *n = f_u64(1, m->buffer_id) + f_bool(2, m->keep_mapped) + f_bool(3, m->read_only);
        return 14;
    }
    case GPUBUF__REQUEST__BODY_SEAL: {
        const Gpubuf__SealRequest *m = req->seal;
        *n = f_u64(1, m->buffer_id) + f_bytes(2, m->event_handle) + f_bytes(4, m->user_data) +
             f_u64(5, m->ttl_ms);
        return m->layout ? 0 : 12;
    }
    case GPUBUF__REQUEST__BODY_ALLOC: {
        const Gpubuf__AllocRequest *m = req->alloc;
        *n = f_str(1, m->pool) + f_u64(2, m->size) + f_str(3, m->name) +
             f_u64(4, m->alignment) + f_bytes(6, m->user_data) + f_u64(7, m->ttl_ms);
        return m->layout ? 0 : 11;
    }
    default: return 0;
    }
}

/* The body whose size body_size() gave. */
static void body_pack(uint8_t *p, const Gpubuf__Request *req) {
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_OPEN: {
        const Gpubuf__OpenRequest *m = req->open;
        p = target_pack(p, (int)m->target_case, m->name, m->buffer_id);
        p = p_i32(p, 3, m->timeout_ms);
        p = p_bool(p, 4, m->read_only);
        p = p_str(p, 5, m->pool);
        owner_pack(p, 6, m->owner);
        break;
    }
    case GPUBUF__REQUEST__BODY_STAT: {
        const Gpubuf__StatRequest *m = req->stat;
        lookup_pack(p, (int)m->target_case, m->name, m->buffer_id, m->pool, m->owner);
        break;
    }
    case GPUBUF__REQUEST__BODY_DELETE: {
        const Gpubuf__DeleteRequest *m = req->delete_;
        lookup_pack(p, (int)m->target_case, m->name, m->buffer_id, m->pool, m->owner);
        break;
    }
    case GPUBUF__REQUEST__BODY_RELEASE: {
        const Gpubuf__ReleaseRequest *m = req->release;
        p = p_u64(p, 1, m->buffer_id);
        p = p_bool(p, 2, m->keep_mapped);
        p_bool(p, 3, m->read_only);
        break;
    }
    case GPUBUF__REQUEST__BODY_SEAL: {
        const Gpubuf__SealRequest *m = req->seal;
        p = p_u64(p, 1, m->buffer_id);
        p = p_bytes(p, 2, m->event_handle);
        p = p_bytes(p, 4, m->user_data);
        p_u64(p, 5, m->ttl_ms);
        break;
    }
    default: { /* alloc: body_size() took no other */
        const Gpubuf__AllocRequest *m = req->alloc;
        p = p_str(p, 1, m->pool);
        p = p_u64(p, 2, m->size);
        p = p_str(p, 3, m->name);
        p = p_u64(p, 4, m->alignment);
        p = p_bytes(p, 6, m->user_data);
        p_u64(p, 7, m->ttl_ms);
        break;
    }
    }
}

size_t gpubuf__request_pack_fast(const Gpubuf__Request *req, uint8_t *out, size_t cap) {
    size_t n = 0;
    unsigned num = body_size(req, &n);
    if (!num)
        return 0;
    size_t total = f_u64(1, req->id) + f_len(num, n);
    if (total > cap)
        return 0;
    uint8_t *p = p_u64(out, 1, req->id);
    body_pack(vput(vput(p, PB_TAG(num, PB_LEN)), n), req);
    return total;
}
