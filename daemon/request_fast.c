/* Session room: the requests a client sends most, decoded without
 * protobuf-c's generic unpack. See session.h.
 *
 * A Request whose body is an alloc or a seal (without an array layout), an
 * open, a release, a delete, a stat, an unmap, a cancel or a batch (open,
 * release, alloc, seal or delete) is most of what gpubufd reads;
 * protobuf-c's unpack of one cost about 1,260 instructions (docs/
 * performance.md, "Replies packed by hand"), of a batch about 400 an item
 * ("Batch requests and replies by hand"). This decoder builds the
 * very structs protobuf-c builds, in the daemon's request arena, and
 * declines (NULL) whatever is not that shape or that it is not sure
 * protobuf-c reads the same way: another body, a layout, a field it does
 * not know, a field twice, both targets of a oneof, a wire type that does
 * not match, a string with a NUL byte (protobuf-c would keep the string up
 * to it; the session refuses such a request with its own message). A
 * declined request goes to protobuf-c as before.
 * tests/test_request_fast.c checks it against protobuf-c on generated and
 * mutated requests. */
#include "session.h"

#include "gpubuf.pb-c.h"
#include "pb_read.h"

/* A string without a NUL byte (see above). */
static inline bool text(rd *r, char **out) {
    return str_field(r, out, true);
}

static bool owner(rd *r, Gpubuf__ExpectedOwner **out) {
    rd sub;
    Gpubuf__ExpectedOwner *m = submsg(r, sizeof(*m), &sub);
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    if (!m)
        return false;
    *m = (Gpubuf__ExpectedOwner)GPUBUF__EXPECTED_OWNER__INIT;
    while (!bad && tag(&sub, &f, &wt, &seen, &bad)) {
        if (f != 1 || wt != WT_VARINT)
            return false;
        bad = !varint(&sub, &v), m->uid = (uint32_t)v;
    }
    *out = m;
    return !bad;
}

static bool alloc(rd *r, Gpubuf__AllocRequest *m) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        if (wt != (f == 1 || f == 3 || f == 6 ? WT_LEN : WT_VARINT))
            return false;
        switch (f) {
        case 1: bad = !text(r, &m->pool); break;
        case 2: bad = !varint(r, &v), m->size = v; break;
        case 3: bad = !text(r, &m->name); break;
        case 4: bad = !varint(r, &v), m->alignment = (uint32_t)v; break;
        case 6: bad = !bytes(r, &m->user_data); break;
        case 7: bad = !varint(r, &v), m->ttl_ms = v; break;
        default: return false; /* 5, the layout, and anything newer */
        }
    }
    return !bad;
}

static bool seal(rd *r, Gpubuf__SealRequest *m) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        if (wt != (f == 2 || f == 4 ? WT_LEN : WT_VARINT))
            return false;
        switch (f) {
        case 1: bad = !varint(r, &v), m->buffer_id = v; break;
        case 2: bad = !bytes(r, &m->event_handle); break;
        case 4: bad = !bytes(r, &m->user_data); break;
        case 5: bad = !varint(r, &v), m->ttl_ms = v; break;
        default: return false; /* 3, the layout, and anything newer */
        }
    }
    return !bad;
}

/* Open, delete and stat: a target (name 1 or buffer_id 2, one of them),
 * a pool and an owner at the numbers given, open's timeout and read_only
 * at 3 and 4. */
typedef struct target_msg {
    int *target_case;
    char **name;
    uint64_t *buffer_id;
    char **pool;
    Gpubuf__ExpectedOwner **owner;
    int32_t *timeout_ms;
    protobuf_c_boolean *read_only;
    uint32_t pool_field, owner_field;
} target_msg;

static bool target(rd *r, const target_msg *t) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        bool len = f == 1 || f == t->pool_field || f == t->owner_field;
        if (wt != (len ? WT_LEN : WT_VARINT))
            return false;
        if (f == 1 || f == 2) {
            if (*t->target_case) /* both: protobuf-c keeps the last */
                return false;
            *t->target_case = (int)f;
            if (f == 1)
                bad = !text(r, t->name);
            else
                bad = !varint(r, &v), *t->buffer_id = v;
        } else if (f == t->pool_field) {
            bad = !text(r, t->pool);
        } else if (f == t->owner_field) {
            bad = !owner(r, t->owner);
        } else if (f == 3 && t->timeout_ms) {
            bad = !varint(r, &v), *t->timeout_ms = (int32_t)(uint32_t)v;
        } else if (f == 4 && t->read_only) {
            bad = !varint(r, &v), *t->read_only = v != 0;
        } else {
            return false;
        }
    }
    return !bad;
}

static bool release(rd *r, Gpubuf__ReleaseRequest *m) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        if (wt != WT_VARINT || f > 3)
            return false;
        bad = !varint(r, &v);
        if (f == 1)
            m->buffer_id = v;
        else if (f == 2)
            m->keep_mapped = v != 0;
        else
            m->read_only = v != 0;
    }
    return !bad;
}

/* A message of one varint field 1 (unmap, cancel). */
static bool one_id(rd *r, uint64_t *id) {
    uint64_t seen = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        if (f != 1 || wt != WT_VARINT)
            return false;
        bad = !varint(r, id);
    }
    return !bad;
}

/* The body at field f: its struct in the arena, decoded from sub. */
static bool body(rd *r, uint32_t f, Gpubuf__Request *m) {
    rd sub;
    switch (f) {
    case GPUBUF__REQUEST__BODY_ALLOC: {
        Gpubuf__AllocRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__AllocRequest)GPUBUF__ALLOC_REQUEST__INIT;
        m->alloc = b;
        return alloc(&sub, b);
    }
    case GPUBUF__REQUEST__BODY_SEAL: {
        Gpubuf__SealRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__SealRequest)GPUBUF__SEAL_REQUEST__INIT;
        m->seal = b;
        return seal(&sub, b);
    }
    case GPUBUF__REQUEST__BODY_OPEN: {
        Gpubuf__OpenRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__OpenRequest)GPUBUF__OPEN_REQUEST__INIT;
        m->open = b;
        target_msg t = {(int *)&b->target_case, &b->name, &b->buffer_id, &b->pool, &b->owner,
                        &b->timeout_ms, &b->read_only, 5, 6};
        return target(&sub, &t);
    }
    case GPUBUF__REQUEST__BODY_DELETE: {
        Gpubuf__DeleteRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__DeleteRequest)GPUBUF__DELETE_REQUEST__INIT;
        m->delete_ = b;
        target_msg t = {(int *)&b->target_case, &b->name, &b->buffer_id, &b->pool, &b->owner,
                        NULL, NULL, 3, 4};
        return target(&sub, &t);
    }
    case GPUBUF__REQUEST__BODY_STAT: {
        Gpubuf__StatRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__StatRequest)GPUBUF__STAT_REQUEST__INIT;
        m->stat = b;
        target_msg t = {(int *)&b->target_case, &b->name, &b->buffer_id, &b->pool, &b->owner,
                        NULL, NULL, 3, 4};
        return target(&sub, &t);
    }
    case GPUBUF__REQUEST__BODY_RELEASE: {
        Gpubuf__ReleaseRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__ReleaseRequest)GPUBUF__RELEASE_REQUEST__INIT;
        m->release = b;
        return release(&sub, b);
    }
    case GPUBUF__REQUEST__BODY_UNMAP: {
        Gpubuf__UnmapRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__UnmapRequest)GPUBUF__UNMAP_REQUEST__INIT;
        m->unmap = b;
        return one_id(&sub, &b->slab_id);
    }
    case GPUBUF__REQUEST__BODY_CANCEL: {
        Gpubuf__CancelRequest *b = submsg(r, sizeof(*b), &sub);
        if (!b)
            return false;
        *b = (Gpubuf__CancelRequest)GPUBUF__CANCEL_REQUEST__INIT;
        m->cancel = b;
        return one_id(&sub, &b->request_id);
    }
    case GPUBUF__REQUEST__BODY_BATCH_OPEN:
        return (m->batch_open = pb_msg(r, &gpubuf__batch_open_request__descriptor)) != NULL;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE:
        return (m->batch_release = pb_msg(r, &gpubuf__batch_release_request__descriptor)) != NULL;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC:
        return (m->batch_alloc = pb_msg(r, &gpubuf__batch_alloc_request__descriptor)) != NULL;
    case GPUBUF__REQUEST__BODY_BATCH_STATE:
        return (m->batch_state = pb_msg(r, &gpubuf__batch_state_request__descriptor)) != NULL;
    default: return false; /* hello, status, renew, takeover, anything newer */
    }
}

Gpubuf__Request *gd_request_fast(gpubuf_arena *a, const uint8_t *data, size_t len) {
    rd r = {.p = data, .end = data + len, .a = a};
    size_t used = a->used;
    Gpubuf__Request *m = take(&r, sizeof(*m));
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = !m;
    if (m)
        *m = (Gpubuf__Request)GPUBUF__REQUEST__INIT;
    while (!bad && tag(&r, &f, &wt, &seen, &bad)) {
        if (f == 1 && wt == WT_VARINT) {
            bad = !varint(&r, &v), m->id = v;
        } else if (f != 1 && wt == WT_LEN && m->body_case == GPUBUF__REQUEST__BODY__NOT_SET) {
            m->body_case = (Gpubuf__Request__BodyCase)f;
            bad = !body(&r, f, m);
        } else {
            bad = true;
        }
    }
    if (!bad && m)
        return m;
    a->used = used; /* declined: what it took goes back */
    return NULL;
}
