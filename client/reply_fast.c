/* libgpubuf-client: decoding a reply. The replies read without blocking
 * (gpubuf_dispatch()) are unpacked into the connection's arena: each such
 * reply is settled (its completion built, its view made) before the next one
 * is read, so its fields can live in one block the connection keeps and
 * reuses: no malloc per field and no walk to free them. A reply larger than
 * the block (array metadata, user bytes) takes the rest from malloc and frees
 * it as before.
 *
 * The replies an event loop reads most are decoded without protobuf-c's
 * generic unpack. A Response whose fields are id, status,
 * message, fds and a Buffer (with a Slab) is what every woken open, alloc,
 * seal and stat answer is; protobuf-c's unpack of it costs about 4,300
 * instructions (docs/performance.md, "Asynchronous opens"), this one a tenth.
 * A batch's reply (a BatchReply without array layouts) goes through
 * pb_msg() (pb_read.h), by its descriptor: protobuf-c took about 520
 * instructions an item of a batch open ("Batch requests and replies by
 * hand").
 * It builds the very structs protobuf-c builds, in the connection's arena
 * (below), and declines (NULL) whatever is not that shape: another
 * body, a layout, a field it does not know, a field twice, a wire type that
 * does not match, a block too small. protobuf-c then decodes it as before,
 * so a declined reply means nothing but the slower path.
 * tests/test_reply_fast.c checks it against protobuf-c on generated and
 * mutated replies. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "pb_read.h"

static bool slab(rd *r, Gpubuf__Slab *m) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        if (wt != (f == 4 || f == 6 ? WT_LEN : WT_VARINT))
            return false;
        switch (f) {
        case 1: bad = !varint(r, &v), m->slab_id = v; break;
        case 2: bad = !varint(r, &v), m->kind = (Gpubuf__PoolKind)(int32_t)v; break;
        case 3: bad = !varint(r, &v), m->device = (int32_t)v; break;
        case 4: bad = !bytes(r, &m->device_uuid); break;
        case 5: bad = !varint(r, &v), m->size = v; break;
        case 6: bad = !bytes(r, &m->ipc_handle); break;
        case 7: bad = !varint(r, &v), m->keepable = v != 0; break;
        case 8: bad = !varint(r, &v), m->read_only = v != 0; break;
        default: return false;
        }
    }
    return !bad;
}

static bool buffer(rd *r, Gpubuf__Buffer *m) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        bool len = f == 2 || f == 3 || f == 8 || f == 11 || f == 14;
        if (wt != (len ? WT_LEN : WT_VARINT))
            return false;
        switch (f) {
        case 1: bad = !varint(r, &v), m->buffer_id = v; break;
        case 2: bad = !str(r, &m->name); break;
        case 3: bad = !str(r, &m->pool); break;
        case 4: bad = !varint(r, &v), m->size = v; break;
        case 5: bad = !varint(r, &v), m->offset = v; break;
        case 6: bad = !varint(r, &v), m->state = (Gpubuf__BufferState)(int32_t)v; break;
        case 7: bad = !varint(r, &v), m->refs = (uint32_t)v; break;
        case 8: {
            rd sub;
            Gpubuf__Slab *s = submsg(r, sizeof(*s), &sub);
            if (!s)
                return false;
            *s = (Gpubuf__Slab)GPUBUF__SLAB__INIT;
            bad = !slab(&sub, s);
            m->slab = s;
            break;
        }
        case 9: bad = !varint(r, &v), m->owner_uid = (uint32_t)v; break;
        case 10: bad = !varint(r, &v), m->slab_id = v; break;
        case 11: bad = !bytes(r, &m->event_handle); break;
        case 12: bad = !varint(r, &v), m->read_only = v != 0; break;
        case 14: bad = !bytes(r, &m->user_data); break;
        case 15: bad = !varint(r, &v), m->lease_left_ms = v; break;
        case 16: bad = !varint(r, &v), m->lease_ttl_ms = v; break;
        case 17: bad = !varint(r, &v), m->restored = v != 0; break;
        default: return false; /* 13 (a layout) and anything newer */
        }
    }
    return !bad;
}

static bool response(rd *r, Gpubuf__Response *m) {
    uint64_t seen = 0, v = 0;
    uint32_t f, wt;
    bool bad = false;
    while (!bad && tag(r, &f, &wt, &seen, &bad)) {
        if (wt != (f == 3 || f == 11 || f == 13 ? WT_LEN : WT_VARINT))
            return false;
        switch (f) {
        case 1: bad = !varint(r, &v), m->id = v; break;
        case 2:
            bad = !varint(r, &v);
            m->status = (int32_t)((uint32_t)v >> 1) ^ -(int32_t)((uint32_t)v & 1);
            break;
        case 3: bad = !str(r, &m->message); break;
        case 4: bad = !varint(r, &v), m->fds = (uint32_t)v; break;
        case 11: {
            rd sub;
            Gpubuf__Buffer *b = submsg(r, sizeof(*b), &sub);
            if (!b)
                return false;
            *b = (Gpubuf__Buffer)GPUBUF__BUFFER__INIT;
            bad = !buffer(&sub, b);
            m->body_case = GPUBUF__RESPONSE__BODY_BUFFER;
            m->buffer = b;
            break;
        }
        case 13:
            if (!(m->batch = pb_msg(r, &gpubuf__batch_reply__descriptor)))
                return false;
            m->body_case = GPUBUF__RESPONSE__BODY_BATCH;
            break;
        default: return false; /* the other bodies, anything newer */
        }
    }
    return !bad;
}

/* batch: only a batch's reply (the only replies whose readers all free
 * them with gpubuf__resp_free while the arena's heap block holds them). */
static Gpubuf__Response *decode_fast(gpubuf_arena *a, const uint8_t *data, size_t len,
                                     bool batch) {
    rd r = {.p = data, .end = data + len, .a = a};
    size_t used = a->used;
    Gpubuf__Response *m = take(&r, sizeof(*m));
    if (m) {
        *m = (Gpubuf__Response)GPUBUF__RESPONSE__INIT;
        if (response(&r, m) && (!batch || m->body_case == GPUBUF__RESPONSE__BODY_BATCH))
            return m;
    }
    a->used = used; /* declined: what it took goes back */
    return NULL;
}

Gpubuf__Response *gpubuf__reply_fast(gpubuf__arena *a, const uint8_t *data, size_t len) {
    return decode_fast(&a->a, data, len, false);
}

/* ---- the arena, and the one way in: a reply's bytes to a Response ----- */

/* A batch's reply a blocking call reads: into the heap block, which grows
 * to about what such a reply takes decoded (a number of one byte becomes 8,
 * a Slab of a few bytes a struct of ~90); one that does not fit, and every
 * other reply, goes to protobuf-c with malloc. */
#define BIG_SLACK (16u << 10)
#define BIG_KEEP (1u << 20) /* a larger block goes when its reply does */
#define BIG_MAX (64u << 20) /* a reply that would need more goes to protobuf-c */

static Gpubuf__Response *decode_big(gpubuf__arena *a, const uint8_t *body, size_t len) {
    size_t want = len <= (BIG_MAX - BIG_SLACK) / 8 ? 8 * len + BIG_SLACK : 0;
    if (!a->big_live && want) {
        if (a->big_cap < want) {
            free(a->big_block);
            a->big_cap = 0;
            a->big_block = malloc(want); /* 16-byte aligned (glibc) */
            if (a->big_block)
                a->big_cap = want;
        }
        if (a->big_block) {
            gpubuf_arena_init(&a->big, a->big_block, a->big_cap);
            if ((a->big_live = decode_fast(&a->big, body, len, true)))
                return a->big_live;
            if (a->big_cap > BIG_KEEP) /* declined: a large block goes now */
                gpubuf__arena_free(a);
        }
    }
    return gpubuf__response__unpack(NULL, len, body);
}

Gpubuf__Response *gpubuf__reply_decode(gpubuf__arena *a, bool in_arena, bool batch,
                                       const uint8_t *body, size_t len) {
    if (batch && (!in_arena || a->live))
        return decode_big(a, body, len);
    if (a->live) /* one reply at a time in the block */
        return gpubuf__response__unpack(NULL, len, body);
    gpubuf_arena_init(&a->a, a->block, sizeof(a->block));
    Gpubuf__Response *resp = gpubuf__reply_fast(a, body, len);
    if (!resp) {
        /* A blocking call's reply of another shape (a status, a hello) may
         * be kept after the call or freed with free_unpacked: malloc. */
        if (!in_arena)
            return gpubuf__response__unpack(NULL, len, body);
        resp = gpubuf__response__unpack(&a->a.alloc, len, body);
    }
    a->live = resp; /* NULL: the unpack failed and gave back what it took */
    return resp;
}

void gpubuf__resp_free(gpubuf_client *c, Gpubuf__Response *resp) {
    gpubuf__arena *a = &c->arena;
    if (!resp)
        return;
    if (resp == a->big_live) {
        a->big_live = NULL;
        if (a->big_cap > BIG_KEEP)
            gpubuf__arena_free(a);
        return;
    }
    if (resp != a->live) {
        gpubuf__response__free_unpacked(resp, NULL);
        return;
    }
    if (a->a.spilled)
        gpubuf__response__free_unpacked(resp, &a->a.alloc); /* frees only what spilled */
    a->live = NULL;
    gpubuf_arena_reset(&a->a);
}

void gpubuf__arena_free(gpubuf__arena *a) {
    free(a->big_block);
    a->big_block = NULL;
    a->big_cap = 0;
}
