/* libgpubuf-client: the single requests of a buffer's life packed by hand.
 * protobuf-c's get_packed_size and pack of an open request by name took
 * 3,400 instructions (callgrind, a warm open of 14,000 in all); these are a
 * tenth of that. They write exactly the bytes protobuf-c writes (fields in
 * number order, a proto3 field at its zero value left out, a oneof's member
 * always there), and decline (0) whatever they do not know: another body,
 * an array layout, a field value protobuf-c would treat otherwise (a NULL
 * string of a oneof), a request that does not fit. protobuf-c then packs it
 * as before. tests/test_request_pack.c checks them against protobuf-c on
 * generated requests. */
#include <string.h>

#include "internal.h"

typedef struct wr {
    uint8_t *p, *end;
} wr;

/* A varint of up to 10 bytes; false when there is no room. */
static bool put_varint(wr *w, uint64_t v) {
    if (w->end - w->p < 10)
        return false;
    while (v >= 0x80) {
        *w->p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *w->p++ = (uint8_t)v;
    return true;
}

static bool put_tag(wr *w, uint32_t field, uint32_t wire_type) {
    return put_varint(w, (uint64_t)field << 3 | wire_type);
}

enum { WT_VARINT = 0, WT_LEN = 2 };

static bool put_u64(wr *w, uint32_t field, uint64_t v) {
    return put_tag(w, field, WT_VARINT) && put_varint(w, v);
}

/* Left out at 0, as proto3 leaves a plain field at its zero value out. */
static bool opt_u64(wr *w, uint32_t field, uint64_t v) {
    return v == 0 || put_u64(w, field, v);
}

/* int32 as protobuf encodes it: a negative value sign-extended, 10 bytes. */
static bool opt_i32(wr *w, uint32_t field, int32_t v) {
    return v == 0 || put_u64(w, field, (uint64_t)(int64_t)v);
}

static bool put_bytes(wr *w, uint32_t field, const void *p, size_t n) {
    if (!put_tag(w, field, WT_LEN) || !put_varint(w, n) || (size_t)(w->end - w->p) < n)
        return false;
    memcpy(w->p, p, n);
    w->p += n;
    return true;
}

/* A bool as protobuf-c writes it: 1 when true, whatever its int holds. */
static bool opt_bool(wr *w, uint32_t field, protobuf_c_boolean v) {
    return !v || put_u64(w, field, 1);
}

static bool opt_str(wr *w, uint32_t field, const char *s) {
    return !s || !*s || put_bytes(w, field, s, strlen(s));
}

static bool opt_bytes(wr *w, uint32_t field, const ProtobufCBinaryData *b) {
    return b->len == 0 || put_bytes(w, field, b->data, b->len);
}

/* A oneof target: name (a string; NULL or empty declined, as protobuf-c
 * leaves out a oneof's string at its default) or an id (even 0). */
static bool target(wr *w, int target_case, const char *name, uint64_t id, int by_name,
                   int by_id) {
    if (target_case == by_name)
        return name && *name && put_bytes(w, 1, name, strlen(name));
    if (target_case == by_id)
        return put_u64(w, 2, id);
    return target_case == 0;
}

/* ExpectedOwner: left out when NULL; its uid left out at 0. */
static bool owner(wr *w, uint32_t field, const Gpubuf__ExpectedOwner *o) {
    if (!o)
        return true;
    uint8_t in[16];
    wr s = {in, in + sizeof(in)};
    return opt_u64(&s, 1, o->uid) && put_bytes(w, field, in, (size_t)(s.p - in));
}

static bool open_body(wr *w, const Gpubuf__OpenRequest *m) {
    return target(w, (int)m->target_case, m->name, m->buffer_id,
                  GPUBUF__OPEN_REQUEST__TARGET_NAME, GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID) &&
           opt_i32(w, 3, m->timeout_ms) && opt_bool(w, 4, m->read_only) && opt_str(w, 5, m->pool) &&
           owner(w, 6, m->owner);
}

static bool stat_body(wr *w, const Gpubuf__StatRequest *m) {
    return target(w, (int)m->target_case, m->name, m->buffer_id,
                  GPUBUF__STAT_REQUEST__TARGET_NAME, GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID) &&
           opt_str(w, 3, m->pool) && owner(w, 4, m->owner);
}

static bool delete_body(wr *w, const Gpubuf__DeleteRequest *m) {
    return target(w, (int)m->target_case, m->name, m->buffer_id,
                  GPUBUF__DELETE_REQUEST__TARGET_NAME, GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID) &&
           opt_str(w, 3, m->pool) && owner(w, 4, m->owner);
}

static bool release_body(wr *w, const Gpubuf__ReleaseRequest *m) {
    return opt_u64(w, 1, m->buffer_id) && opt_bool(w, 2, m->keep_mapped) &&
           opt_bool(w, 3, m->read_only);
}

static bool seal_body(wr *w, const Gpubuf__SealRequest *m) {
    return !m->layout && opt_u64(w, 1, m->buffer_id) && opt_bytes(w, 2, &m->event_handle) &&
           opt_bytes(w, 4, &m->user_data) && opt_u64(w, 5, m->ttl_ms);
}

static bool alloc_body(wr *w, const Gpubuf__AllocRequest *m) {
    return !m->layout && opt_str(w, 1, m->pool) && opt_u64(w, 2, m->size) &&
           opt_str(w, 3, m->name) && opt_u64(w, 4, m->alignment) &&
           opt_bytes(w, 6, &m->user_data) && opt_u64(w, 7, m->ttl_ms);
}

size_t gpubuf__request_pack_fast(const Gpubuf__Request *req, uint8_t *out, size_t cap) {
    /* The body first, behind room for its tag and length (at most 1 + 3
     * bytes: a body here is under 2 MiB), then moved up to them. */
    enum { ROOM = 1 + 10 + 2 + 3 };
    if (cap < ROOM)
        return 0;
    wr w = {out + ROOM, out + cap};
    bool ok;
    uint32_t field;
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_OPEN: field = 13, ok = open_body(&w, req->open); break;
    case GPUBUF__REQUEST__BODY_RELEASE: field = 14, ok = release_body(&w, req->release); break;
    case GPUBUF__REQUEST__BODY_SEAL: field = 12, ok = seal_body(&w, req->seal); break;
    case GPUBUF__REQUEST__BODY_ALLOC: field = 11, ok = alloc_body(&w, req->alloc); break;
    case GPUBUF__REQUEST__BODY_STAT: field = 16, ok = stat_body(&w, req->stat); break;
    case GPUBUF__REQUEST__BODY_DELETE: field = 15, ok = delete_body(&w, req->delete_); break;
    default: return 0;
    }
    size_t body = (size_t)(w.p - (out + ROOM));
    if (!ok || body >= (1u << 21))
        return 0;
    uint8_t head[3 * 10 + 6]; /* put_varint wants room for 10 bytes each time */
    wr h = {head, head + sizeof(head)};
    if (!opt_u64(&h, 1, req->id) || !put_tag(&h, field, WT_LEN) || !put_varint(&h, body))
        return 0;
    size_t n = (size_t)(h.p - head);
    memmove(out + n, out + ROOM, body);
    memcpy(out, head, n);
    return n + body;
}
