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

/* A batch request (open, release, alloc, state), through its descriptor:
 * each of these holds numbers, bools and strings, single or repeated, at
 * field numbers 1..n in order. Repeated numbers and bools must come packed,
 * as protobuf-c packs them (a bool a byte of 0 or 1); repeated strings one
 * field each. A first pass checks every field and counts the elements of
 * each repeated one, the arrays are taken from the arena at their size, a
 * second pass fills them. Any other shape (a number field twice, an
 * unpacked repeated number, a field it does not know) is declined. */
enum { BATCH_MAX_FIELDS = 8 };

static const ProtobufCFieldDescriptor *field_no(const ProtobufCMessageDescriptor *d, uint32_t f) {
    if (f < 1 || f > d->n_fields || d->fields[f - 1].id != f)
        return NULL;
    return &d->fields[f - 1];
}

/* A packed field's elements: varints (each ends with a byte below 0x80)
 * or bools (one byte each, 0 or 1); 0 with *bad when malformed. */
static size_t packed_count(const uint8_t *p, size_t n, ProtobufCType type, bool *bad) {
    size_t count = 0;
    if (type == PROTOBUF_C_TYPE_BOOL) {
        for (size_t i = 0; i < n; i++)
            *bad |= p[i] > 1;
        return n;
    }
    for (size_t i = 0; i < n; i++)
        count += p[i] < 0x80;
    *bad |= n && p[n - 1] >= 0x80;
    return count;
}

static bool batch_fields(rd *r, const ProtobufCMessageDescriptor *d, void *m, bool fill,
                         size_t count[BATCH_MAX_FIELDS + 1]) {
    uint64_t seen = 0, t, v;
    while (r->p < r->end) {
        const ProtobufCFieldDescriptor *f;
        if (!prefix(r, &t) || !(f = field_no(d, (uint32_t)(t >> 3))))
            return false;
        uint32_t num = (uint32_t)(t >> 3), wt = (uint32_t)(t & 7);
        bool rep = f->label == PROTOBUF_C_LABEL_REPEATED;
        char *at = (char *)m + f->offset;
        size_t *n = (size_t *)(void *)((char *)m + f->quantifier_offset);
        if (!(rep && f->type == PROTOBUF_C_TYPE_STRING)) {
            if (seen >> num & 1)
                return false;
            seen |= 1ull << num;
        }
        if (f->type == PROTOBUF_C_TYPE_STRING) {
            char *str = NULL, **arr = rep ? *(char ***)(void *)at : NULL;
            if (wt != WT_LEN)
                return false;
            if (!fill) {
                const uint8_t *sp;
                size_t sl;
                if (!span(r, &sp, &sl) || memchr(sp, 0, sl))
                    return false;
                count[num] += rep;
            } else if (!text(r, rep ? &str : (char **)(void *)at)) {
                return false;
            } else if (rep) {
                arr[(*n)++] = str;
            }
        } else if (rep) {
            const uint8_t *pp;
            size_t pl;
            bool bad = false;
            if (wt != WT_LEN || !(f->flags & PROTOBUF_C_FIELD_FLAG_PACKED) || !span(r, &pp, &pl))
                return false;
            if (!fill) {
                if (f->type != PROTOBUF_C_TYPE_UINT64 && f->type != PROTOBUF_C_TYPE_BOOL)
                    return false;
                count[num] = packed_count(pp, pl, f->type, &bad);
                if (bad)
                    return false;
            } else if (f->type == PROTOBUF_C_TYPE_BOOL) {
                protobuf_c_boolean *arr = *(protobuf_c_boolean **)(void *)at;
                for (size_t i = 0; i < pl; i++)
                    arr[i] = pp[i];
                *n = pl;
            } else {
                rd sub = {.p = pp, .end = pp + pl, .a = r->a};
                uint64_t *arr = *(uint64_t **)(void *)at;
                while (sub.p < sub.end)
                    if (!varint(&sub, &arr[(*n)++]))
                        return false;
            }
        } else {
            if (wt != WT_VARINT || !varint(r, &v))
                return false;
            switch (f->type) {
            case PROTOBUF_C_TYPE_UINT64: *(uint64_t *)(void *)at = v; break;
            case PROTOBUF_C_TYPE_BOOL:
                if (v > 1)
                    return false;
                *(protobuf_c_boolean *)(void *)at = (protobuf_c_boolean)v;
                break;
            case PROTOBUF_C_TYPE_UINT32:
                if (v > UINT32_MAX)
                    return false;
                *(uint32_t *)(void *)at = (uint32_t)v;
                break;
            case PROTOBUF_C_TYPE_ENUM:
                if (v > INT32_MAX)
                    return false;
                *(int *)(void *)at = (int)v;
                break;
            default: return false;
            }
        }
    }
    return true;
}

static void *batch_msg(rd *r, const ProtobufCMessageDescriptor *d) {
    size_t count[BATCH_MAX_FIELDS + 1] = {0};
    rd sub;
    void *m = submsg(r, d->sizeof_message, &sub);
    if (!m || d->n_fields > BATCH_MAX_FIELDS)
        return NULL;
    protobuf_c_message_init(d, m);
    rd scan = sub;
    if (!batch_fields(&scan, d, m, false, count))
        return NULL;
    for (uint32_t num = 1; num <= d->n_fields; num++) {
        const ProtobufCFieldDescriptor *f = &d->fields[num - 1];
        if (!count[num])
            continue;
        size_t each = f->type == PROTOBUF_C_TYPE_STRING ? sizeof(char *)
                      : f->type == PROTOBUF_C_TYPE_BOOL ? sizeof(protobuf_c_boolean)
                                                        : sizeof(uint64_t);
        void *arr = count[num] > SIZE_MAX / each ? NULL : take(&sub, count[num] * each);
        if (!arr)
            return NULL;
        *(void **)(void *)((char *)m + f->offset) = arr;
    }
    return batch_fields(&sub, d, m, true, count) ? m : NULL;
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
        return (m->batch_open = batch_msg(r, &gpubuf__batch_open_request__descriptor)) != NULL;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE:
        return (m->batch_release = batch_msg(r, &gpubuf__batch_release_request__descriptor)) != NULL;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC:
        return (m->batch_alloc = batch_msg(r, &gpubuf__batch_alloc_request__descriptor)) != NULL;
    case GPUBUF__REQUEST__BODY_BATCH_STATE:
        return (m->batch_state = batch_msg(r, &gpubuf__batch_state_request__descriptor)) != NULL;
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
