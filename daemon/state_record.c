/* State room, ground floor: the fixed binary entries of the saved state's
 * versions 2 to 4 and their checksum. See state_record.h. */
#include "state_record.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
/* xxHash inline (XXH3): the header alone, nothing to link. */
#define XXH_INLINE_ALL
#include <xxhash.h>
#ifdef GPUBUF_HAVE_XXH_DISPATCH
/* libxxhash's dispatcher (xxh_x86dispatch.h; that header cannot come after
 * XXH_INLINE_ALL, which makes its declarations static). */
XXH64_hash_t XXH3_64bits_withSeed_dispatch(const void *input, size_t len, XXH64_hash_t seed);
#define LONG_XXH3 XXH3_64bits_withSeed_dispatch
#else
#define LONG_XXH3 XXH3_64bits_withSeed /* no dispatcher (not x86): the inline code */
#endif

#include "layout.h"

#define BUF_FIXED (9 * 8 + 3 * 4 + 1 + 3 * 2) /* a BUFFER entry (version 2) before its bytes */

static inline uint8_t *put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    return p + 2;
}

/* b's layout packed into out (NULL: its size only); 0: b has none. Out of
 * line: few buffers have one, and its structs would make every buffer's
 * entry a large frame. */
__attribute__((noinline)) static size_t layout_pack(const gd_buf *b, uint8_t *out) {
    gpubuf_layout l;
    Gpubuf__ArrayLayout wl;
    if (!gd_meta_layout(b, &l))
        return 0;
    gpubuf_layout_to_wire(&l, &wl);
    return out ? gpubuf__array_layout__pack(&wl, out) : gpubuf__array_layout__get_packed_size(&wl);
}

void gd_se_buffer_full(gd_obuf *o, const gd_buf *b, const uint32_t owner_ref[2]) {
    size_t name_len = b->name ? strlen(b->name) : 0, user_len = 0, layout_len = 0;
    const uint8_t *user = NULL;
    bool has_layout = b->meta && b->meta->has_layout;
    if (b->meta) {
        user = gd_meta_user(b, &user_len);
        if (has_layout)
            layout_len = layout_pack(b, NULL);
    }
    uint8_t flags =
        (uint8_t)((b->restored ? GD_SE_F_RESTORED : 0) | (b->has_event ? GD_SE_F_EVENT : 0) |
                  (has_layout ? GD_SE_F_LAYOUT : 0) | (b->lease_slot ? GD_SE_F_LEASE : 0) |
                  (owner_ref ? GD_SE_F_OWNER_REF : 0));
    size_t n = 1 + GD_SE_BUF3_FIXED + (b->has_event ? 8 + GD_EVENT_HANDLE_SIZE : 0) +
               (b->lease_slot ? 12 : 0) + (owner_ref ? 8 : 0) + name_len + layout_len + user_len;
    uint8_t *p = gd_obuf_room(o, n);
    if (!p)
        return;
    p = gd_se_buffer3_fixed(p, b);
    *p++ = flags;
    p = put16(p, (uint16_t)name_len);
    p = put16(p, (uint16_t)user_len);
    p = put16(p, (uint16_t)layout_len);
    if (b->has_event)
        p = gd_state_put64(p, b->event_holder);
    if (b->lease_slot)
        p = gd_state_put32(gd_state_put64(p, b->lease_expires_ns), b->lease_ttl_ms);
    if (owner_ref)
        p = gd_state_put32(gd_state_put32(p, owner_ref[0]), owner_ref[1]);
    if (name_len) {
        memcpy(p, b->name, name_len);
        p += name_len;
    }
    if (b->has_event) {
        memcpy(p, b->event, GD_EVENT_HANDLE_SIZE);
        p += GD_EVENT_HANDLE_SIZE;
    }
    if (has_layout)
        p += layout_pack(b, p);
    if (user_len)
        memcpy(p, user, user_len);
    o->len += n;
}

void gd_se_brun_next(gd_obuf *o, const gd_buf *b, uint8_t flags, uint32_t count, uint32_t ro) {
    /* The run goes on where only the stage was full; else a new one, its
     * head with no item yet. */
    bool goes_on = o->brun_end == o->len && o->len && !o->oom &&
                   gd_se_brun_same(o->p + o->brun_at, b, flags, count, ro);
    uint8_t *p = gd_obuf_room(o, (goes_on ? 0 : GD_SE_BRUN_HEAD) + GD_SE_BRUN_ITEM);
    if (!p)
        return;
    if (!goes_on) {
        o->brun_at = o->len;
        *p = GD_SE_BUFFERS;
        p = gd_state_put64(p + 1, b->owner_holder);
        p = gd_state_put64(p, b->size);
        p = gd_state_put64(p, b->blk.size);
        p = gd_state_put64(p, b->charged);
        p = gd_state_put32(p, b->owner_uid);
        p = gd_state_put32(p, (uint32_t)b->state);
        *p++ = flags;
        gd_state_put32(gd_state_put32(gd_state_put32(p, count), ro), 0);
        o->len += GD_SE_BRUN_HEAD;
    }
    gd_se_brun_item(o, o->p, o->brun_at, o->len, b);
}

void gd_se_record(gd_obuf *o, const Gpubuf__StateRecord *rec) {
    size_t n = gpubuf__state_record__get_packed_size(rec);
    uint8_t *p = gd_obuf_room(o, 5 + n);
    if (!p)
        return;
    *p = GD_SE_RECORD;
    gd_state_put32(p + 1, (uint32_t)n);
    gpubuf__state_record__pack(rec, p + 5);
    o->len += 5 + n;
}

uint32_t gd_se_checksum(uint64_t gen, const uint8_t *p, uint32_t n) {
    /* The length in the seed too: a frame read with a torn length fails.
     * A long frame (a batch's group, a snapshot's) is hashed by libxxhash's
     * dispatcher, which picks the widest vector unit the CPU has (AVX2,
     * AVX-512) where the inline code has SSE2; the value is the same. Up
     * to 240 bytes XXH3 has no vector loop: the inline code, no call. */
    uint64_t seed = gen ^ ((uint64_t)n << 40);
    XXH64_hash_t h = n > 240 ? LONG_XXH3(p, n, seed) : XXH3_64bits_withSeed(p, n, seed);
    return (uint32_t)(h ^ (h >> 32));
}

/* ---- decoding ---------------------------------------------------------- */

typedef struct rd {
    const uint8_t *p;
    size_t left;
} rd;

static bool take(rd *r, void *out, size_t n) {
    if (r->left < n)
        return false;
    if (out)
        memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return true;
}

static bool u64(rd *r, uint64_t *v) {
    uint8_t b[8];
    if (!take(r, b, 8))
        return false;
    *v = 0;
    for (int i = 7; i >= 0; i--)
        *v = *v << 8 | b[i];
    return true;
}

static bool u32(rd *r, uint32_t *v) {
    uint8_t b[4];
    if (!take(r, b, 4))
        return false;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return true;
}

static bool u16(rd *r, uint16_t *v) {
    uint8_t b[2];
    if (!take(r, b, 2))
        return false;
    *v = (uint16_t)(b[0] | b[1] << 8);
    return true;
}

/* n bytes of r, copied into fresh memory (NUL-terminated); NULL when short
 * or out of memory (*oom). */
static uint8_t *dup_bytes(rd *r, size_t n, bool *oom) {
    if (r->left < n)
        return NULL;
    uint8_t *d = malloc(n + 1);
    if (!d) {
        *oom = true;
        return NULL;
    }
    memcpy(d, r->p, n);
    d[n] = 0;
    r->p += n;
    r->left -= n;
    return d;
}

/* m = a new message (init: its init function), rec's oneof member field
 * (case CASE), freed with rec from here on; without memory, the caller
 * returns -ENOMEM. */
#define REC_NEW(rec, m, init, CASE, field)                                                         \
    do {                                                                                           \
        if (!((m) = malloc(sizeof(*(m)))))                                                         \
            return -ENOMEM;                                                                        \
        init(m);                                                                                   \
        (rec)->rec_case = GPUBUF__STATE_RECORD__REC_##CASE;                                        \
        (rec)->field = (m);                                                                        \
    } while (0)

/* The records a group decodes to, growing. */
typedef struct recs {
    Gpubuf__StateRecord **v;
    size_t n, cap;
} recs;

/* rec at the end of out; false without memory (rec freed). */
static bool append(recs *out, Gpubuf__StateRecord *rec) {
    if (out->n == out->cap) {
        size_t c = out->cap ? out->cap * 2 : 64;
        Gpubuf__StateRecord **m = realloc(out->v, c * sizeof(*m));
        if (!m) {
            gpubuf__state_record__free_unpacked(rec, NULL);
            return false;
        }
        out->v = m;
        out->cap = c;
    }
    out->v[out->n++] = rec;
    return true;
}

/* A new empty record at the end of out; NULL without memory. */
static Gpubuf__StateRecord *push(recs *out) {
    Gpubuf__StateRecord *rec = malloc(sizeof(*rec));
    if (!rec)
        return NULL;
    gpubuf__state_record__init(rec);
    return append(out, rec) ? rec : NULL;
}

/* A reference record: session's count and read-only count of buffer. */
static int put_ref(recs *out, uint64_t session, uint64_t buffer, uint32_t count, uint32_t ro) {
    Gpubuf__StateRecord *rec = push(out);
    Gpubuf__StateRef *m;
    if (!rec)
        return -ENOMEM;
    REC_NEW(rec, m, gpubuf__state_ref__init, REF, ref);
    m->session = session;
    m->buffer = buffer;
    m->count = count;
    m->read_only = ro;
    return 0;
}
/* A BUFFER (v3: BUFFER3) entry into rec; a BUFFER3's owner reference
 * into *ref (ref[2] = 1 when it has one). */
static int dec_buffer(rd *r, Gpubuf__StateRecord *rec, bool v3, uint32_t ref[3]) {
    Gpubuf__StateBuffer *m;
    uint32_t state = 0, uid = 0, ttl = 0;
    uint8_t flags = 0;
    uint16_t name_len = 0, user_len = 0, layout_len = 0;
    bool oom = false;
    REC_NEW(rec, m, gpubuf__state_buffer__init, BUFFER, buffer);
    m->name = NULL;
    unsigned known = GD_SE_F_RESTORED | GD_SE_F_EVENT | GD_SE_F_LAYOUT |
                     (v3 ? GD_SE_F_LEASE | GD_SE_F_OWNER_REF : 0);
    if (!u64(r, &m->id) || !u64(r, &m->slab_id) || !u64(r, &m->offset) ||
        !u64(r, &m->block_size) || !u64(r, &m->size) || !u64(r, &m->owner_session) ||
        !u64(r, &m->charged) ||
        (!v3 && (!u64(r, &m->event_session) || !u64(r, &m->lease_expires_ns))) ||
        !u32(r, &uid) || (!v3 && !u32(r, &ttl)) || !u32(r, &state) || !take(r, &flags, 1) ||
        !u16(r, &name_len) || !u16(r, &user_len) || !u16(r, &layout_len) || (flags & ~known) ||
        (!(flags & GD_SE_F_LAYOUT) && layout_len) || name_len > GPUBUF_NAME_MAX) {
        return -EINVAL;
    }
    if (v3 && (((flags & GD_SE_F_EVENT) && !u64(r, &m->event_session)) ||
               ((flags & GD_SE_F_LEASE) && (!u64(r, &m->lease_expires_ns) || !u32(r, &ttl))) ||
               ((flags & GD_SE_F_OWNER_REF) && (!u32(r, &ref[0]) || !u32(r, &ref[1])))))
        return -EINVAL;
    ref[2] = (flags & GD_SE_F_OWNER_REF) != 0;
    m->owner_uid = uid;
    m->lease_ttl_ms = ttl;
    m->state = state;
    m->restored = (flags & GD_SE_F_RESTORED) != 0;
    if (!(m->name = (char *)dup_bytes(r, name_len, &oom)))
        return oom ? -ENOMEM : -EINVAL; /* a NULL name is freed as none */
    if (memchr(m->name, 0, name_len))
        return -EINVAL;
    if (flags & GD_SE_F_EVENT) {
        if (!(m->event.data = dup_bytes(r, GD_EVENT_HANDLE_SIZE, &oom)))
            return oom ? -ENOMEM : -EINVAL;
        m->event.len = GD_EVENT_HANDLE_SIZE;
    }
    if (flags & GD_SE_F_LAYOUT) {
        if (r->left < layout_len ||
            !(m->layout = gpubuf__array_layout__unpack(NULL, layout_len, r->p)))
            return -EINVAL;
        take(r, NULL, layout_len);
    }
    if (user_len) {
        if (!(m->user_data.data = dup_bytes(r, user_len, &oom)))
            return oom ? -ENOMEM : -EINVAL;
        m->user_data.len = user_len;
    }
    return 0;
}

/* A BUFFERS entry (after its kind byte) into one buffer record per item,
 * each followed by its owner's reference record when the head says one. */
static int dec_buffers(rd *r, recs *out) {
    uint64_t session = 0, size = 0, block = 0, charged = 0;
    uint32_t uid = 0, state = 0, count = 0, ro = 0, n = 0;
    uint8_t flags = 0;
    bool oom = false;
    if (!u64(r, &session) || !u64(r, &size) || !u64(r, &block) || !u64(r, &charged) ||
        !u32(r, &uid) || !u32(r, &state) || !take(r, &flags, 1) || !u32(r, &count) ||
        !u32(r, &ro) || !u32(r, &n) || n == 0 || n > r->left / GD_SE_BRUN_ITEM ||
        (flags & ~(GD_SE_F_RESTORED | GD_SE_F_OWNER_REF)) ||
        (!(flags & GD_SE_F_OWNER_REF) && (count || ro)))
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        Gpubuf__StateRecord *rec = push(out);
        Gpubuf__StateBuffer *m;
        if (!rec)
            return -ENOMEM;
        REC_NEW(rec, m, gpubuf__state_buffer__init, BUFFER, buffer);
        /* A name of 0 bytes, as a BUFFER3 entry without one decodes to. */
        if (!(m->name = (char *)dup_bytes(r, 0, &oom)))
            return -ENOMEM;
        u64(r, &m->id);
        u64(r, &m->slab_id);
        u64(r, &m->offset);
        m->block_size = block;
        m->size = size;
        m->owner_session = session;
        m->charged = charged;
        m->owner_uid = uid;
        m->state = state;
        m->restored = (flags & GD_SE_F_RESTORED) != 0;
        if ((flags & GD_SE_F_OWNER_REF) && put_ref(out, session, m->id, count, ro) < 0)
            return -ENOMEM;
    }
    return 0;
}

/* One entry of r into the records it says, at the end of out (owned by out
 * whatever the outcome). */
static int dec_entry(rd *r, recs *out) {
    uint8_t kind;
    uint64_t id = 0, session = 0;
    uint32_t n = 0;
    Gpubuf__StateRecord *rec;
    if (!take(r, &kind, 1))
        return -EINVAL;
    switch (kind) {
    case GD_SE_REFS:
        if (!u64(r, &session) || !u32(r, &n) || n == 0 || n > r->left / GD_SE_RUN_ITEM)
            return -EINVAL;
        for (uint32_t i = 0; i < n; i++) {
            uint32_t count = 0, ro = 0;
            int e;
            u64(r, &id);
            u32(r, &count);
            u32(r, &ro);
            if ((e = put_ref(out, session, id, count, ro)) < 0)
                return e;
        }
        return 0;
    case GD_SE_REF_GONE:
        if (!u64(r, &session) || !u64(r, &id))
            return -EINVAL;
        if (put_ref(out, session, id, 0, 0) < 0 || !(rec = push(out)))
            return -ENOMEM;
        rec->rec_case = GPUBUF__STATE_RECORD__REC_BUFFER_GONE;
        rec->buffer_gone = id;
        return 0;
    case GD_SE_BUFFERS: return dec_buffers(r, out);
    case GD_SE_RECORD:
        if (!u32(r, &n) || n > r->left)
            return -EINVAL;
        if (!(rec = gpubuf__state_record__unpack(NULL, n, r->p)))
            return -EINVAL;
        take(r, NULL, n);
        return append(out, rec) ? 0 : -ENOMEM;
    default: break;
    }
    if (!(rec = push(out)))
        return -ENOMEM;
    switch (kind) {
    case GD_SE_REF: {
        Gpubuf__StateRef *m;
        REC_NEW(rec, m, gpubuf__state_ref__init, REF, ref);
        if (!u64(r, &m->session) || !u64(r, &m->buffer) || !u32(r, &m->count) ||
            !u32(r, &m->read_only))
            return -EINVAL;
        return 0;
    }
    case GD_SE_BUFFER_GONE:
    case GD_SE_SESSION_GONE:
    case GD_SE_SLAB_GONE:
        if (!u64(r, &id))
            return -EINVAL;
        if (kind == GD_SE_BUFFER_GONE) {
            rec->rec_case = GPUBUF__STATE_RECORD__REC_BUFFER_GONE;
            rec->buffer_gone = id;
        } else if (kind == GD_SE_SESSION_GONE) {
            rec->rec_case = GPUBUF__STATE_RECORD__REC_SESSION_GONE;
            rec->session_gone = id;
        } else {
            rec->rec_case = GPUBUF__STATE_RECORD__REC_SLAB_GONE;
            rec->slab_gone = id;
        }
        return 0;
    case GD_SE_BUFFER:
    case GD_SE_BUFFER3: {
        uint32_t ref[3] = {0, 0, 0};
        int e = dec_buffer(r, rec, kind == GD_SE_BUFFER3, ref);
        if (e == 0 && ref[2])
            e = put_ref(out, rec->buffer->owner_session, rec->buffer->id, ref[0], ref[1]);
        return e;
    }
    case GD_SE_BUFFER_STATE: {
        Gpubuf__StateBufferState *m;
        REC_NEW(rec, m, gpubuf__state_buffer_state__init, BUFFER_STATE, buffer_state);
        return u64(r, &m->id) && u32(r, &m->state) ? 0 : -EINVAL;
    }
    default: return -EINVAL;
    }
}

int gd_se_decode(const uint8_t *p, size_t n, Gpubuf__StateRecord ***ret, size_t *n_ret) {
    rd r = {p, n};
    recs out = {NULL, 0, 0};
    int err = 0;
    *ret = NULL;
    *n_ret = 0;
    while (r.left && !err)
        err = dec_entry(&r, &out);
    if (err) {
        for (size_t i = 0; i < out.n; i++)
            gpubuf__state_record__free_unpacked(out.v[i], NULL);
        free(out.v);
        return err;
    }
    *ret = out.v;
    *n_ret = out.n;
    return 0;
}
