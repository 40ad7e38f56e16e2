/* State room, ground floor: the fixed binary entries of the saved state's
 * version 2 and their checksum. See state_record.h. */
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

#define BUF_FIXED (9 * 8 + 3 * 4 + 1 + 3 * 2) /* a BUFFER entry before its bytes */
#define F_RESTORED 1u
#define F_EVENT 2u
#define F_LAYOUT 4u

/* The growing path of room(), out of line: inlined, it made every entry's
 * writer save six registers for a path it almost never takes. */
__attribute__((noinline, cold)) static uint8_t *grow(gd_obuf *o, size_t n) {
    if (o->oom)
        return NULL;
    if (o->cap - o->len < n) {
        size_t cap = o->cap ? o->cap : 4096;
        while (cap - o->len < n)
            cap *= 2;
        uint8_t *p = realloc(o->p, cap);
        if (!p) {
            o->oom = true;
            return NULL;
        }
        o->p = p;
        o->cap = cap;
    }
    return o->p + o->len;
}

/* Little-endian stores: one move each where the machine is little-endian. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint8_t *put64(uint8_t *p, uint64_t v) {
    memcpy(p, &v, 8);
    return p + 8;
}

static inline uint8_t *put32(uint8_t *p, uint32_t v) {
    memcpy(p, &v, 4);
    return p + 4;
}
#else
static inline uint8_t *put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 8;
}

static inline uint8_t *put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return p + 4;
}
#endif

static inline uint8_t *put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    return p + 2;
}

/* Room for n bytes: the common case (room left) inline. */
static inline uint8_t *room(gd_obuf *o, size_t n) {
    return !o->oom && o->cap - o->len >= n ? o->p + o->len : grow(o, n);
}

uint8_t *gd_obuf_room(gd_obuf *o, size_t n) {
    return room(o, n);
}

static inline void ref_at(gd_obuf *o, uint8_t *p, uint64_t session, uint64_t buffer,
                          uint32_t count, uint32_t ro) {
    *p++ = GD_SE_REF;
    p = put64(p, session);
    p = put64(p, buffer);
    p = put32(p, count);
    put32(p, ro);
    o->len += 25;
}

__attribute__((noinline, cold)) static void ref_grow(gd_obuf *o, uint64_t session,
                                                     uint64_t buffer, uint32_t count,
                                                     uint32_t ro) {
    uint8_t *p = grow(o, 25);
    if (p)
        ref_at(o, p, session, buffer, count, ro);
}

/* The most frequent entry (every reference a request takes or gives back):
 * its common case ends in stores, saving no register. */
void gd_se_ref(gd_obuf *o, uint64_t session, uint64_t buffer, uint32_t count, uint32_t ro) {
    if (o->oom || o->cap - o->len < 25) {
        ref_grow(o, session, buffer, count, ro);
        return;
    }
    ref_at(o, o->p + o->len, session, buffer, count, ro);
}

void gd_se_id(gd_obuf *o, int kind, uint64_t id) {
    uint8_t *p = room(o, 9);
    if (!p)
        return;
    *p = (uint8_t)kind;
    put64(p + 1, id);
    o->len += 9;
}

void gd_se_buffer_state(gd_obuf *o, uint64_t id, uint32_t state) {
    uint8_t *p = room(o, 13);
    if (!p)
        return;
    *p = GD_SE_BUFFER_STATE;
    put32(put64(p + 1, id), state);
    o->len += 13;
}

void gd_se_buffer(gd_obuf *o, const gd_buf *b) {
    gpubuf_layout l;
    Gpubuf__ArrayLayout wl;
    size_t name_len = b->name ? strlen(b->name) : 0, user_len = 0, layout_len = 0;
    const uint8_t *user = gd_meta_user(b, &user_len);
    bool has_layout = gd_meta_layout(b, &l);
    if (has_layout) {
        gpubuf_layout_to_wire(&l, &wl);
        layout_len = gpubuf__array_layout__get_packed_size(&wl);
    }
    size_t n = 1 + BUF_FIXED + name_len + (b->has_event ? GD_EVENT_HANDLE_SIZE : 0) + layout_len +
               user_len;
    uint8_t *p = gd_obuf_room(o, n);
    if (!p)
        return;
    *p++ = GD_SE_BUFFER;
    p = put64(p, b->id);
    p = put64(p, b->blk.slab->id);
    p = put64(p, b->blk.offset);
    p = put64(p, b->blk.size);
    p = put64(p, b->size);
    p = put64(p, b->owner_holder);
    p = put64(p, b->charged);
    p = put64(p, b->has_event ? b->event_holder : 0);
    p = put64(p, b->lease_slot ? b->lease_expires_ns : 0);
    p = put32(p, b->owner_uid);
    p = put32(p, b->lease_slot ? b->lease_ttl_ms : 0);
    p = put32(p, (uint32_t)b->state);
    *p++ = (uint8_t)((b->restored ? F_RESTORED : 0) | (b->has_event ? F_EVENT : 0) |
                     (has_layout ? F_LAYOUT : 0));
    p = put16(p, (uint16_t)name_len);
    p = put16(p, (uint16_t)user_len);
    p = put16(p, (uint16_t)layout_len);
    memcpy(p, b->name ? b->name : "", name_len);
    p += name_len;
    if (b->has_event) {
        memcpy(p, b->event, GD_EVENT_HANDLE_SIZE);
        p += GD_EVENT_HANDLE_SIZE;
    }
    if (has_layout)
        p += gpubuf__array_layout__pack(&wl, p);
    if (user_len)
        memcpy(p, user, user_len);
    o->len += n;
}

void gd_se_record(gd_obuf *o, const Gpubuf__StateRecord *rec) {
    size_t n = gpubuf__state_record__get_packed_size(rec);
    uint8_t *p = gd_obuf_room(o, 5 + n);
    if (!p)
        return;
    *p = GD_SE_RECORD;
    put32(p + 1, (uint32_t)n);
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

static Gpubuf__StateRecord *new_record(void) {
    Gpubuf__StateRecord *rec = malloc(sizeof(*rec));
    if (rec)
        gpubuf__state_record__init(rec);
    return rec;
}

static int dec_buffer(rd *r, Gpubuf__StateRecord *rec) {
    Gpubuf__StateBuffer *m;
    uint32_t state = 0, uid = 0, ttl = 0;
    uint8_t flags = 0;
    uint16_t name_len = 0, user_len = 0, layout_len = 0;
    bool oom = false;
    REC_NEW(rec, m, gpubuf__state_buffer__init, BUFFER, buffer);
    m->name = NULL;
    if (!u64(r, &m->id) || !u64(r, &m->slab_id) || !u64(r, &m->offset) ||
        !u64(r, &m->block_size) || !u64(r, &m->size) || !u64(r, &m->owner_session) ||
        !u64(r, &m->charged) || !u64(r, &m->event_session) || !u64(r, &m->lease_expires_ns) ||
        !u32(r, &uid) || !u32(r, &ttl) || !u32(r, &state) || !take(r, &flags, 1) ||
        !u16(r, &name_len) || !u16(r, &user_len) || !u16(r, &layout_len) ||
        (flags & ~(F_RESTORED | F_EVENT | F_LAYOUT)) || (!(flags & F_LAYOUT) && layout_len) ||
        name_len > GPUBUF_NAME_MAX) {
        return -EINVAL;
    }
    m->owner_uid = uid;
    m->lease_ttl_ms = ttl;
    m->state = state;
    m->restored = (flags & F_RESTORED) != 0;
    if (!(m->name = (char *)dup_bytes(r, name_len, &oom)))
        return oom ? -ENOMEM : -EINVAL; /* a NULL name is freed as none */
    if (memchr(m->name, 0, name_len))
        return -EINVAL;
    if (flags & F_EVENT) {
        if (!(m->event.data = dup_bytes(r, GD_EVENT_HANDLE_SIZE, &oom)))
            return oom ? -ENOMEM : -EINVAL;
        m->event.len = GD_EVENT_HANDLE_SIZE;
    }
    if (flags & F_LAYOUT) {
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

/* One entry of r into rec (owned by rec whatever the outcome). */
static int dec_entry(rd *r, Gpubuf__StateRecord *rec) {
    uint8_t kind;
    uint64_t id;
    if (!take(r, &kind, 1))
        return -EINVAL;
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
    case GD_SE_BUFFER: return dec_buffer(r, rec);
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
    Gpubuf__StateRecord **recs = NULL;
    size_t count = 0, cap = 0;
    int err = 0;
    *ret = NULL;
    *n_ret = 0;
    while (r.left && !err) {
        Gpubuf__StateRecord *rec = NULL;
        if (count == cap) {
            size_t c = cap ? cap * 2 : 64;
            Gpubuf__StateRecord **m = realloc(recs, c * sizeof(*m));
            if (!m) {
                err = -ENOMEM;
                break;
            }
            recs = m;
            cap = c;
        }
        if (r.p[0] == GD_SE_RECORD) {
            uint32_t len = 0;
            take(&r, NULL, 1);
            if (!u32(&r, &len) || len > r.left ||
                !(rec = gpubuf__state_record__unpack(NULL, len, r.p))) {
                err = -EINVAL;
                break;
            }
            take(&r, NULL, len);
        } else if (!(rec = new_record())) {
            err = -ENOMEM;
            break;
        } else {
            err = dec_entry(&r, rec);
        }
        recs[count++] = rec;
    }
    if (err) {
        for (size_t i = 0; i < count; i++)
            gpubuf__state_record__free_unpacked(recs[i], NULL);
        free(recs);
        return err;
    }
    *ret = recs;
    *n_ret = count;
    return 0;
}
