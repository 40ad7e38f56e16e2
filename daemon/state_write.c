/* State room: writing the saved state's slots: their shared mappings, the
 * framing of groups, and snapshots, whole (at start, after a takeover given
 * up) or a step per turn of the loop (the journal's compaction), so that a
 * large registry never stalls the loop. See state.h and state_internal.h. */
#include "state_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "hash.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#include "log.h"
#include "state_record.h"
#include "util.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Copy to a slot without pulling its lines into the cache: the daemon never
 * reads a slot back, and a journal written at hundreds of MB/s through the
 * cache evicts the registry that the next request needs. Non-temporal
 * stores, made visible by the sfence before the end mark and the next group
 * (16 processes of batched requests on the H200: 4.08, 3.56, 5.07 M ops/s
 * with memcpy against 4.34, 4.17, 5.65 M ops/s so, in three alternating
 * rounds; docs/performance.md). */
static void slot_copy(uint8_t *dst, const uint8_t *src, size_t len) {
#if defined(__SSE2__)
    if (len >= 256) {
        for (; (uintptr_t)dst & 15u; len--)
            *dst++ = *src++;
        for (; len >= 64; len -= 64, dst += 64, src += 64) {
            __m128i a = _mm_loadu_si128((const __m128i *)(const void *)src);
            __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(src + 16));
            __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(src + 32));
            __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(src + 48));
            _mm_stream_si128((__m128i *)(void *)dst, a);
            _mm_stream_si128((__m128i *)(void *)(dst + 16), b);
            _mm_stream_si128((__m128i *)(void *)(dst + 32), c);
            _mm_stream_si128((__m128i *)(void *)(dst + 48), d);
        }
        _mm_sfence();
    }
#endif
    memcpy(dst, src, len);
}


static void header(uint8_t *hdr, uint32_t version, uint64_t gen) {
    memset(hdr, 0, STATE_HEADER);
    memcpy(hdr, STATE_MAGIC, 8);
    gd_state_put32(hdr + 8, version);
    gd_state_put64(hdr + 16, gen);
    gd_state_put64(hdr + 24, gd_state_checksum(hdr, 24));
}

void gd_state_header(uint8_t *out, uint64_t gen) {
    header(out, STATE_VERSION_1, gen);
}

size_t gd_state_frame(uint8_t *out, const uint8_t *rec, uint32_t n) {
    memmove(out + 8, rec, n);
    gd_state_put32(out, n);
    gd_state_put32(out + 4, (uint32_t)gd_state_checksum(out + 8, n));
    return (size_t)n + 8;
}

void gd_state_header_v2(uint8_t *out, uint64_t gen) {
    header(out, STATE_VERSION_2, gen);
}

size_t gd_state_frame_v2(uint8_t *out, uint64_t gen, const uint8_t *rec, uint32_t n) {
    memmove(out + 8, rec, n);
    gd_state_put32(out, n);
    gd_state_put32(out + 4, gd_se_checksum(gen, out + 8, n));
    return (size_t)n + 8;
}

static bool write_all(int fd, const void *buf, size_t len, uint64_t off) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t w = pwrite(fd, p, len, (off_t)off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        len -= (size_t)w;
        off += (uint64_t)w;
    }
    return true;
}

void gd_slot_unmap(slot *s) {
    if (s->map)
        munmap(s->map, s->cap);
    s->map = NULL;
    s->cap = 0;
}

/* Room for need bytes in the slot's shared mapping: journal records are
 * copied into it, no system call each. The memfd's pages are the kept
 * state itself, so a record is saved once copied, whatever kills the
 * daemon next. The file grows by a quarter (1 MiB at least; doubling left
 * up to half of it unused, resident: 490 -> 316 B of it per buffer at 100k
 * buffers, docs/performance.md) and never
 * shrinks: a snapshot writes over the pages the slot had (no page faults
 * on the hot path after the first round); 8 zero bytes after the last
 * frame end the replay, and a frame of an older generation left further
 * on fails its checksum (which covers the generation). */
static bool slot_room(slot *s, uint64_t need) {
    if (s->map && need <= s->cap)
        return true;
    uint64_t grown = s->cap + s->cap / 4;
    uint64_t cap = grown > need ? grown : need;
    if (cap < STATE_MAP_MIN)
        cap = STATE_MAP_MIN;
    struct stat sb;
    if (fstat(s->fd, &sb) < 0)
        return false;
    if ((uint64_t)sb.st_size > cap)
        cap = (uint64_t)sb.st_size; /* never cut what another start wrote */
    else if ((uint64_t)sb.st_size < cap && ftruncate(s->fd, (off_t)cap) < 0)
        return false;
    /* Grown in place where it can: the pages already mapped keep their
     * page table entries (a new mapping would fault each one in again,
     * some 30k faults per growth of a 100k-buffer state). */
    void *m = s->map ? mremap(s->map, s->cap, cap, MREMAP_MAYMOVE) : MAP_FAILED;
    if (m == MAP_FAILED) {
        gd_slot_unmap(s);
        m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
        if (m == MAP_FAILED)
            return false;
    }
    /* The new pages at once, in one call, rather than a fault each on the
     * journal's path (kernels before 5.14 say EINVAL: they fault). */
    uint64_t had = s->map ? s->cap : 0; /* mremap kept those */
    madvise((uint8_t *)m + had, cap - had, MADV_POPULATE_WRITE);
    s->map = m;
    s->cap = cap;
    return true;
}

void gd_state_write_failed(gd_state *st, const char *what) {
    if (!st->failed)
        LOG_ERR("saving the state (%s): %s; a restart now would lose changes", what,
                strerror(errno));
    st->failed = true;
}

static void slab_msg(Gpubuf__StateSlab *m, const gd_slab *s) {
    gpubuf__state_slab__init(m);
    m->id = s->id;
    m->pool = s->pool->name;
    m->size = s->size;
    m->dedicated = s->dedicated;
}

static void holder_msg(Gpubuf__StateSession *m, const gd_holder *h) {
    gpubuf__state_session__init(m);
    m->id = h->id;
    m->pid = (int32_t)h->pid;
    m->uid = (uint32_t)h->uid;
    m->gid = (uint32_t)h->gid;
}

static void counters_msg(Gpubuf__StateCounters *m, const gd_context *ctx) {
    gpubuf__state_counters__init(m);
    m->next_buffer_id = ctx->reg.next_buffer_id;
    m->next_session_id = ctx->reg.next_holder_id;
    m->next_slab_id = ctx->slab_ids;
    m->restarts = ctx->restarts;
}

/* A record of one message m of kind what, as an entry of o. */
static void put_msg(gd_obuf *o, Gpubuf__StateRecord__RecCase what, void *m) {
    Gpubuf__StateRecord rec = GPUBUF__STATE_RECORD__INIT;
    rec.rec_case = what;
    switch (what) {
    case GPUBUF__STATE_RECORD__REC_SLAB: rec.slab = m; break;
    case GPUBUF__STATE_RECORD__REC_SESSION: rec.session = m; break;
    case GPUBUF__STATE_RECORD__REC_COUNTERS: rec.counters = m; break;
    default: break;
    }
    gd_se_record(o, &rec);
}

/* Frame o->p[start..o->len) (a group, its first byte GD_SE_GROUP) in place:
 * its 8 bytes of length and checksum were left free before it. */
void gd_group_frame(gd_obuf *o, size_t start, uint64_t gen) {
    uint32_t n = (uint32_t)(o->len - start - 8);
    gd_state_put32(o->p + start, n);
    gd_state_put32(o->p + start + 4, gd_se_checksum(gen, o->p + start + 8, n));
}

/* Open a group in o: room for its frame header, then its first byte. */
size_t gd_group_open(gd_obuf *o) {
    size_t start = o->len;
    uint8_t *p = gd_obuf_room(o, 9);
    if (p) {
        memset(p, 0, 9); /* the frame's header (filled by gd_group_frame), GD_SE_GROUP */
        o->len += 9;
    }
    o->run_end = o->brun_end = 0; /* a run does not go on into another group */
    return start;
}

#define SNAPSHOT_GROUP (256u << 10) /* a snapshot's groups are about this long */

/* The whole registry as groups of entries of generation gen: counters,
 * slabs, sessions, buffers, refs. Not one group: the header, written
 * last, makes a snapshot whole. */
static void snapshot(const gd_context *ctx, gd_obuf *o, uint64_t gen) {
    Gpubuf__StateCounters c;
    size_t g = gd_group_open(o);
#define NEXT_GROUP()                                                                               \
    do {                                                                                           \
        if (o->len - g > SNAPSHOT_GROUP && !o->oom) {                                              \
            gd_group_frame(o, g, gen);                                                                \
            g = gd_group_open(o);                                                                     \
        }                                                                                          \
    } while (0)
    counters_msg(&c, ctx);
    put_msg(o, GPUBUF__STATE_RECORD__REC_COUNTERS, &c);
    for (int i = 0; i < ctx->n_pools; i++)
        for (gd_slab *s = ctx->pools[i]->slabs; s; s = s->next) {
            Gpubuf__StateSlab m;
            slab_msg(&m, s);
            put_msg(o, GPUBUF__STATE_RECORD__REC_SLAB, &m);
            NEXT_GROUP();
        }
    for (const gd_holder *h = ctx->reg.holders; h; h = h->hh.next) {
        Gpubuf__StateSession m;
        holder_msg(&m, h);
        put_msg(o, GPUBUF__STATE_RECORD__REC_SESSION, &m);
        NEXT_GROUP();
    }
    for (const gd_buf *b = ctx->reg.by_id; b; b = b->hh_id.next) {
        gd_se_buffer(o, b, NULL);
        NEXT_GROUP();
    }
    for (const gd_holder *h = ctx->reg.holders; h; h = h->hh.next)
        for (const gd_ref *r = h->refs; r; r = r->hh.next) {
            gd_se_ref(o, h->id, r->buffer_id, r->count, r->ro);
            NEXT_GROUP();
        }
#undef NEXT_GROUP
    if (!o->oom)
        gd_group_frame(o, g, gen);
}

/* Copy len bytes to the slot at off and 8 zero bytes after them (the end
 * of the replay), through its mapping (or pwrite when it cannot map). */
bool gd_slot_put(slot *s, uint64_t off, const uint8_t *p, size_t len) {
    static const uint8_t end[8];
    if (slot_room(s, off + len + sizeof(end))) {
        slot_copy(s->map + off, p, len);
        memset(s->map + off + len, 0, sizeof(end));
        return true;
    }
    return write_all(s->fd, p, len, off) && write_all(s->fd, end, sizeof(end), off + len);
}

/* The header alone (no end mark after it: the first frame is there). */
static bool slot_header(slot *s, const uint8_t *hdr) {
    if (s->map && s->cap >= STATE_HEADER) {
        memcpy(s->map, hdr, STATE_HEADER);
        return true;
    }
    return write_all(s->fd, hdr, STATE_HEADER, 0);
}

/* Write a full snapshot into the inactive slot and make it the active one.
 * The active slot is not touched: a kill at any point leaves one whole. */
int gd_state_compact(gd_state *st) {
    slot *to = &st->slots[!st->active];
    const slot *from = &st->slots[st->active];
    gd_obuf o = {0};
    uint8_t hdr[STATE_HEADER];
    uint64_t gen = (from->gen > to->gen ? from->gen : to->gen) + 1, t0 = gpubuf_now_ns();
    static const uint8_t none[STATE_HEADER];
    snapshot(st->ctx, &o, gen);
    if (o.oom) {
        free(o.p);
        errno = ENOMEM;
        gd_state_write_failed(st, "snapshot");
        return -ENOMEM;
    }
    header(hdr, STATE_VERSION, gen);
    /* The old header goes first, the new one last: in between the slot
     * holds nothing valid. */
    if (!gd_slot_put(to, 0, none, sizeof(none)) || !gd_slot_put(to, STATE_HEADER, o.p, o.len) ||
        !slot_header(to, hdr)) {
        free(o.p);
        gd_state_write_failed(st, "snapshot");
        return -errno;
    }
    to->gen = gen;
    to->len = STATE_HEADER + o.len;
    st->snapshots++;
    st->snapshot_ns += gpubuf_now_ns() - t0;
    st->active = !st->active;
    st->compact_at = to->len * 2 > STATE_MIN_COMPACT ? to->len * 2 : STATE_MIN_COMPACT;
    free(o.p);
    return 0;
}


void gd_se_slab(gd_obuf *o, const gd_slab *s) {
    Gpubuf__StateSlab m;
    slab_msg(&m, s);
    put_msg(o, GPUBUF__STATE_RECORD__REC_SLAB, &m);
}

void gd_se_session(gd_obuf *o, const gd_holder *h) {
    Gpubuf__StateSession m;
    holder_msg(&m, h);
    put_msg(o, GPUBUF__STATE_RECORD__REC_SESSION, &m);
}

/* ---- a snapshot a step per turn of the loop ---------------------------- */

/* A snapshot made while the daemon serves goes into the inactive slot a
 * group per turn of the loop (SNAPSHOT_GROUP bytes): first the counters,
 * slabs and sessions of its start, then the buffers (a walk of the
 * registry's by_id list) and the references of the sessions of its start,
 * as they are when their group is written.
 * Meanwhile every journal group goes into both slots, in order: records are
 * upserts keyed by id (a reference count, not a change of it), so replaying
 * the slot in order gives the registry as it is, whatever step a change
 * fell between. The header comes last; until then the active slot is the
 * saved state, whole, and a kill loses nothing. */

static void snap_stop(gd_state *st) {
    if (st->snap.idle_on)
        uv_idle_stop(&st->snap.idle);
    free(st->snap.holders);
    st->snap.holders = NULL;
    st->snap.cursor = NULL;
    st->snap.on = false;
    /* The step buffer stays for the next snapshot (freed with the state). */
}

void gd_state_snap_abort(gd_state *st) {
    if (!st->snap.on)
        return;
    snap_stop(st);
    st->slots[!st->active].gen = 0; /* its header was cut at the start */
}

/* One group into the snapshot's slot; false (snapshot given up) on failure. */
static bool snap_put(gd_state *st, gd_obuf *o, size_t g) {
    slot *to = &st->slots[!st->active];
    if (!o->oom)
        gd_group_frame(o, g, st->snap.gen);
    if (o->oom || !gd_slot_put(to, to->len, o->p, o->len)) {
        if (o->oom)
            errno = ENOMEM;
        gd_state_write_failed(st, "snapshot");
        gd_state_snap_abort(st);
        return false;
    }
    to->len += o->len;
    return true;
}

void gd_state_snap_journal(gd_state *st, gd_obuf *group) {
    if (st->snap.on)
        snap_put(st, group, 0);
}

static void snap_finish(gd_state *st) {
    slot *to = &st->slots[!st->active];
    uint8_t hdr[STATE_HEADER];
    header(hdr, STATE_VERSION, st->snap.gen);
    if (!slot_header(to, hdr)) {
        gd_state_write_failed(st, "snapshot");
        gd_state_snap_abort(st);
        return;
    }
    to->gen = st->snap.gen;
    st->active = !st->active;
    st->compact_at = to->len * 2 > STATE_MIN_COMPACT ? to->len * 2 : STATE_MIN_COMPACT;
    st->snapshots++;
    snap_stop(st);
}

static void snap_step(uv_idle_t *idle) {
    gd_state *st = idle->data;
    gd_registry *reg = &st->ctx->reg;
    gd_obuf *o = &st->snap.out;
    uint64_t t0 = gpubuf_now_ns();
    o->len = 0;
    o->oom = false;
    size_t g = gd_group_open(o);
    for (; st->snap.cursor && o->len < SNAPSHOT_GROUP; st->snap.cursor = st->snap.cursor->hh_id.next)
        gd_se_buffer(o, st->snap.cursor, NULL);
    while (!st->snap.cursor && st->snap.pos_h < st->snap.n_holders && o->len < SNAPSHOT_GROUP) {
        const gd_holder *h;
        uint64_t id = st->snap.holders[st->snap.pos_h++];
        HASH_FIND(hh, reg->holders, &id, sizeof(id), h);
        for (const gd_ref *r = h ? h->refs : NULL; r; r = r->hh.next)
            gd_se_ref(o, h->id, r->buffer_id, r->count, r->ro);
    }
    bool ok = o->len <= 9 || snap_put(st, o, g);
    if (ok && !st->snap.cursor && st->snap.pos_h == st->snap.n_holders)
        snap_finish(st);
    st->snapshot_ns += gpubuf_now_ns() - t0;
}

void gd_state_snap_start(gd_state *st) {
    gd_registry *reg = &st->ctx->reg;
    slot *to = &st->slots[!st->active];
    const slot *from = &st->slots[st->active];
    static const uint8_t none[STATE_HEADER];
    size_t nh = 0;
    if (st->snap.on || st->frozen)
        return;
    if (!st->snap.idle_on) { /* no loop (tests): a whole snapshot at once */
        gd_state_compact(st);
        return;
    }
    uint64_t t0 = gpubuf_now_ns();
    for (const gd_holder *h = reg->holders; h; h = h->hh.next)
        nh++;
    st->snap.holders = malloc((nh + 1) * sizeof(uint64_t));
    if (!st->snap.holders) {
        snap_stop(st);
        gd_state_compact(st);
        return;
    }
    nh = 0;
    for (const gd_holder *h = reg->holders; h; h = h->hh.next)
        st->snap.holders[nh++] = h->id;
    st->snap.n_holders = nh;
    st->snap.pos_h = 0;
    /* The buffers in the order of by_id (no lookup each): one gone meanwhile
     * moves the cursor on (gd_state_snap_gone); new ones come at the end. */
    st->snap.cursor = reg->by_id;
    st->snap.gen = (from->gen > to->gen ? from->gen : to->gen) + 1;
    st->snap.on = true;
    st->stage.direct = false; /* removals through the hook: gd_state_snap_gone */
    /* The old header goes first: from here until the end the slot holds
     * nothing valid. */
    to->gen = 0;
    to->len = STATE_HEADER;
    gd_obuf o = {0};
    size_t g = gd_group_open(&o);
    Gpubuf__StateCounters c;
    counters_msg(&c, st->ctx);
    put_msg(&o, GPUBUF__STATE_RECORD__REC_COUNTERS, &c);
    for (int i = 0; i < st->ctx->n_pools; i++)
        for (gd_slab *s = st->ctx->pools[i]->slabs; s; s = s->next)
            gd_se_slab(&o, s);
    for (const gd_holder *h = reg->holders; h; h = h->hh.next)
        gd_se_session(&o, h);
    if (!gd_slot_put(to, 0, none, sizeof(none))) {
        gd_state_write_failed(st, "snapshot");
        gd_state_snap_abort(st);
    } else if (snap_put(st, &o, g)) {
        uv_idle_start(&st->snap.idle, snap_step);
    }
    free(o.p);
    st->snapshot_ns += gpubuf_now_ns() - t0;
}

void gd_state_snap_gone(gd_state *st, uint64_t id) {
    /* Out of by_id already, not freed yet: its next is still the walk's. */
    if (st->snap.cursor && st->snap.cursor->id == id)
        st->snap.cursor = st->snap.cursor->hh_id.next;
}

void gd_state_snap_init(gd_state *st, uv_loop_t *loop) {
    if (uv_idle_init(loop, &st->snap.idle) == 0) {
        st->snap.idle.data = st;
        st->snap.idle_on = true;
        uv_unref((uv_handle_t *)&st->snap.idle);
    }
}

void gd_state_snap_close(gd_state *st) {
    gd_state_snap_abort(st);
    free(st->snap.out.p);
    memset(&st->snap.out, 0, sizeof(st->snap.out));
    if (st->snap.idle_on) {
        st->snap.idle_on = false;
        uv_close((uv_handle_t *)&st->snap.idle, NULL);
    }
}
