/* State room: the saved registry (snapshot + journal in two memfds), the fd
 * store, and the restore at start. See state.h. */
#include "state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uthash.h>

#ifdef GPUBUF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "gpubuf_state.pb-c.h"
#include "layout.h"
#include "log.h"
#include "util.h"

#define STATE_MAGIC "GPBUFST"   /* 8 bytes with its NUL */
#define STATE_VERSION 1u
#define STATE_HEADER GD_STATE_HEADER
#define STATE_MAX_RECORD (1u << 20) /* one record is a few hundred bytes */
#define STATE_MIN_COMPACT (1ull << 20)
#define STATE_MAP_MIN (1ull << 20) /* the journal mapping grows from here */

typedef struct slot {
    int fd;
    uint64_t gen; /* 0: holds nothing valid */
    uint64_t len; /* bytes written, header included */
    uint8_t *map; /* the journal's shared mapping of fd (cap bytes), or NULL */
    uint64_t cap;
} slot;

struct gd_state {
    gd_context *ctx;
    bool fdstore;
    bool frozen;
    bool failed; /* a write failed: the kept state is behind (logged once) */
    slot slots[2];
    int active;
    uint64_t compact_at; /* compact when the active slot grows past this */
    uint64_t records;     /* journal records written */
    uint64_t journal_ns;  /* time spent writing them */
    uint64_t snapshots, snapshot_ns;
    uv_timer_t expiry;
    bool expiry_on;
};

/* FNV-1a: a torn or stale record fails it. */
static uint64_t checksum(const void *p, size_t n) {
    const uint8_t *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) {
    return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32;
}

/* ---- the fd store ------------------------------------------------------ */

void gd_state_store_fd(gd_state *st, const char *name, int fd) {
#ifdef GPUBUF_HAVE_SYSTEMD
    char msg[128];
    if (!st || !st->fdstore || fd < 0)
        return;
    snprintf(msg, sizeof(msg), "FDSTORE=1\nFDNAME=%s\nFDPOLL=0", name);
    int r = sd_pid_notify_with_fds(0, 0, msg, &fd, 1);
    if (r <= 0)
        LOG_WARN_LIMITED("cannot hand %s to the service manager's fd store: %s", name,
                         r < 0 ? strerror(-r) : "no NOTIFY_SOCKET");
#else
    (void)st;
    (void)name;
    (void)fd;
#endif
}

static void store_remove(gd_state *st, const char *name) {
#ifdef GPUBUF_HAVE_SYSTEMD
    char msg[128];
    if (!st->fdstore)
        return;
    snprintf(msg, sizeof(msg), "FDSTOREREMOVE=1\nFDNAME=%s", name);
    sd_pid_notify(0, 0, msg);
#else
    (void)st;
    (void)name;
#endif
}

/* ---- writing ----------------------------------------------------------- */

/* A growable byte buffer for records. */
typedef struct obuf {
    uint8_t *p;
    size_t len, cap;
    bool oom;
} obuf;

static uint8_t *obuf_room(obuf *o, size_t n) {
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

static void header(uint8_t *hdr, uint64_t gen) {
    memset(hdr, 0, STATE_HEADER);
    memcpy(hdr, STATE_MAGIC, 8);
    put32(hdr + 8, STATE_VERSION);
    put64(hdr + 16, gen);
    put64(hdr + 24, checksum(hdr, 24));
}

void gd_state_header(uint8_t *out, uint64_t gen) {
    header(out, gen);
}

size_t gd_state_frame(uint8_t *out, const uint8_t *rec, uint32_t n) {
    memmove(out + 8, rec, n);
    put32(out, n);
    put32(out + 4, (uint32_t)checksum(out + 8, n));
    return (size_t)n + 8;
}

/* Append one framed record to o. */
static void put_record(obuf *o, const Gpubuf__StateRecord *rec) {
    size_t n = gpubuf__state_record__get_packed_size(rec);
    uint8_t *p = obuf_room(o, 8 + n);
    if (!p)
        return;
    gpubuf__state_record__pack(rec, p + 8);
    put32(p, (uint32_t)n);
    put32(p + 4, (uint32_t)checksum(p + 8, n));
    o->len += 8 + n;
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

static void slot_unmap(slot *s) {
    if (s->map)
        munmap(s->map, s->cap);
    s->map = NULL;
    s->cap = 0;
}

/* Room for need bytes in the slot's shared mapping: journal records are
 * copied into it, no system call each. The memfd's pages are the kept
 * state itself, so a record is saved once copied, whatever kills the
 * daemon next. The file grows by doubling (1 MiB at least); the zeros past
 * the records end the replay like a torn record. */
static bool slot_room(slot *s, uint64_t need) {
    if (s->map && need <= s->cap)
        return true;
    uint64_t cap = s->cap * 2 > need ? s->cap * 2 : need;
    if (cap < STATE_MAP_MIN)
        cap = STATE_MAP_MIN;
    struct stat sb;
    if (fstat(s->fd, &sb) == 0 && (uint64_t)sb.st_size > cap)
        cap = (uint64_t)sb.st_size; /* never cut what another start wrote */
    slot_unmap(s);
    if (ftruncate(s->fd, (off_t)cap) < 0)
        return false;
    void *m = mmap(NULL, cap, PROT_READ | PROT_WRITE, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED)
        return false;
    s->map = m;
    s->cap = cap;
    return true;
}

static void write_failed(gd_state *st, const char *what) {
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

/* A buffer's record and what its metadata points to. */
typedef struct buf_rec {
    Gpubuf__StateBuffer m;
    Gpubuf__ArrayLayout wl;
    gpubuf_layout l;
} buf_rec;

static void buf_msg(buf_rec *br, const gd_buf *b) {
    Gpubuf__StateBuffer *m = &br->m;
    size_t user_len;
    gpubuf__state_buffer__init(m);
    m->id = b->id;
    m->name = b->name ? b->name : (char *)"";
    m->slab_id = b->blk.slab->id;
    m->offset = b->blk.offset;
    m->block_size = b->blk.size;
    m->size = b->size;
    m->state = (uint32_t)b->state;
    m->owner_uid = b->owner_uid;
    m->owner_session = b->owner_holder;
    m->charged = b->charged;
    if (b->has_event) {
        m->event.data = (uint8_t *)b->event;
        m->event.len = GD_EVENT_HANDLE_SIZE;
        m->event_session = b->event_holder;
    }
    m->restored = b->restored;
    if (gd_meta_layout(b, &br->l)) { /* strides only when they were given */
        gpubuf_layout_to_wire(&br->l, &br->wl);
        m->layout = &br->wl;
    }
    m->user_data.data = (uint8_t *)gd_meta_user(b, &user_len);
    m->user_data.len = user_len;
    if (b->lease_slot) {
        m->lease_ttl_ms = b->lease_ttl_ms;
        m->lease_expires_ns = b->lease_expires_ns;
    }
}

static void holder_msg(Gpubuf__StateSession *m, const gd_holder *h) {
    gpubuf__state_session__init(m);
    m->id = h->id;
    m->pid = (int32_t)h->pid;
    m->uid = (uint32_t)h->uid;
    m->gid = (uint32_t)h->gid;
}

static void ref_msg(Gpubuf__StateRef *m, uint64_t holder, uint64_t buffer, uint32_t count,
                    uint32_t ro) {
    gpubuf__state_ref__init(m);
    m->session = holder;
    m->buffer = buffer;
    m->count = count;
    m->read_only = ro;
}

static void counters_msg(Gpubuf__StateCounters *m, const gd_context *ctx) {
    gpubuf__state_counters__init(m);
    m->next_buffer_id = ctx->reg.next_buffer_id;
    m->next_session_id = ctx->reg.next_holder_id;
    m->next_slab_id = ctx->slab_ids;
    m->restarts = ctx->restarts;
}

/* A record of one message m of kind what. */
static Gpubuf__StateRecord record(Gpubuf__StateRecord__RecCase what, void *m) {
    Gpubuf__StateRecord rec = GPUBUF__STATE_RECORD__INIT;
    rec.rec_case = what;
    switch (what) {
    case GPUBUF__STATE_RECORD__REC_SLAB: rec.slab = m; break;
    case GPUBUF__STATE_RECORD__REC_BUFFER: rec.buffer = m; break;
    case GPUBUF__STATE_RECORD__REC_SESSION: rec.session = m; break;
    case GPUBUF__STATE_RECORD__REC_REF: rec.ref = m; break;
    case GPUBUF__STATE_RECORD__REC_COUNTERS: rec.counters = m; break;
    default: break;
    }
    return rec;
}

static void put_msg(obuf *o, Gpubuf__StateRecord__RecCase what, void *m) {
    Gpubuf__StateRecord rec = record(what, m);
    put_record(o, &rec);
}

/* The whole registry as records: counters, slabs, sessions, buffers, refs. */
static void snapshot(const gd_context *ctx, obuf *o) {
    Gpubuf__StateCounters c;
    counters_msg(&c, ctx);
    put_msg(o, GPUBUF__STATE_RECORD__REC_COUNTERS, &c);
    for (int i = 0; i < ctx->n_pools; i++)
        for (gd_slab *s = ctx->pools[i]->slabs; s; s = s->next) {
            Gpubuf__StateSlab m;
            slab_msg(&m, s);
            put_msg(o, GPUBUF__STATE_RECORD__REC_SLAB, &m);
        }
    for (const gd_holder *h = ctx->reg.holders; h; h = h->hh.next) {
        Gpubuf__StateSession m;
        holder_msg(&m, h);
        put_msg(o, GPUBUF__STATE_RECORD__REC_SESSION, &m);
    }
    for (const gd_buf *b = ctx->reg.by_id; b; b = b->hh_id.next) {
        buf_rec br;
        buf_msg(&br, b);
        put_msg(o, GPUBUF__STATE_RECORD__REC_BUFFER, &br.m);
    }
    for (const gd_holder *h = ctx->reg.holders; h; h = h->hh.next)
        for (const gd_ref *r = h->refs; r; r = r->hh.next) {
            Gpubuf__StateRef m;
            ref_msg(&m, h->id, r->buffer_id, r->count, r->ro);
            put_msg(o, GPUBUF__STATE_RECORD__REC_REF, &m);
        }
}

/* Write a full snapshot into the inactive slot and make it the active one.
 * The active slot is not touched: a kill at any point leaves one whole. */
static int compact(gd_state *st) {
    slot *to = &st->slots[!st->active];
    const slot *from = &st->slots[st->active];
    obuf o = {0};
    slot_unmap(to); /* it is cut to nothing and written anew below */
    uint8_t hdr[STATE_HEADER];
    snapshot(st->ctx, &o);
    if (o.oom) {
        free(o.p);
        errno = ENOMEM;
        write_failed(st, "snapshot");
        return -ENOMEM;
    }
    uint64_t gen = (from->gen > to->gen ? from->gen : to->gen) + 1, t0 = gpubuf_now_ns();
    header(hdr, gen);
    /* The header goes last: until then the slot holds nothing valid. */
    if (ftruncate(to->fd, 0) < 0 || !write_all(to->fd, o.p, o.len, STATE_HEADER) ||
        !write_all(to->fd, hdr, sizeof(hdr), 0)) {
        free(o.p);
        write_failed(st, "snapshot");
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

/* Append one record to the active slot; compact when it has grown enough. */
static void append(gd_state *st, const Gpubuf__StateRecord *rec) {
    uint8_t stack[1024];
    obuf o = {.p = stack, .cap = sizeof(stack)};
    slot *s = &st->slots[st->active];
    if (st->frozen)
        return;
    uint64_t t0 = gpubuf_now_ns();
    size_t n = gpubuf__state_record__get_packed_size(rec);
    if (n + 8 > sizeof(stack)) {
        o.p = NULL;
        o.cap = 0;
    }
    put_record(&o, rec);
    if (!o.oom && slot_room(s, s->len + o.len)) {
        memcpy(s->map + s->len, o.p, o.len);
        s->len += o.len;
    } else if (o.oom || !write_all(s->fd, o.p, o.len, s->len)) {
        write_failed(st, "journal");
    } else {
        s->len += o.len;
    }
    if (o.p != stack)
        free(o.p);
    st->records++;
    st->journal_ns += gpubuf_now_ns() - t0;
    if (s->len > st->compact_at)
        compact(st);
}

static void append_msg(gd_state *st, Gpubuf__StateRecord__RecCase what, void *m) {
    Gpubuf__StateRecord rec = record(what, m);
    append(st, &rec);
}

static void hook_buf(void *arg, const gd_buf *b) {
    buf_rec br;
    buf_msg(&br, b);
    append_msg(arg, GPUBUF__STATE_RECORD__REC_BUFFER, &br.m);
}

static void hook_id(gd_state *st, Gpubuf__StateRecord__RecCase what, uint64_t id) {
    Gpubuf__StateRecord rec = GPUBUF__STATE_RECORD__INIT;
    rec.rec_case = what;
    if (what == GPUBUF__STATE_RECORD__REC_BUFFER_GONE)
        rec.buffer_gone = id;
    else if (what == GPUBUF__STATE_RECORD__REC_SESSION_GONE)
        rec.session_gone = id;
    else
        rec.slab_gone = id;
    append(st, &rec);
}

static void hook_buf_gone(void *arg, uint64_t id) {
    hook_id(arg, GPUBUF__STATE_RECORD__REC_BUFFER_GONE, id);
}

static void hook_ref(void *arg, const gd_holder *h, uint64_t buffer_id, uint32_t count,
                     uint32_t ro) {
    Gpubuf__StateRef m;
    ref_msg(&m, h->id, buffer_id, count, ro);
    append_msg(arg, GPUBUF__STATE_RECORD__REC_REF, &m);
}

static void hook_holder(void *arg, const gd_holder *h) {
    Gpubuf__StateSession m;
    holder_msg(&m, h);
    append_msg(arg, GPUBUF__STATE_RECORD__REC_SESSION, &m);
}

static void hook_holder_gone(void *arg, uint64_t id) {
    hook_id(arg, GPUBUF__STATE_RECORD__REC_SESSION_GONE, id);
}

static void slab_name(char *buf, size_t n, uint64_t id) {
    snprintf(buf, n, "slab-%llu", (unsigned long long)id);
}

static void hook_slab(void *arg, const gd_slab *s, bool created) {
    gd_state *st = arg;
    char name[64];
    if (st->frozen)
        return;
    slab_name(name, sizeof(name), s->id);
    if (created) {
        Gpubuf__StateSlab m;
        slab_msg(&m, s);
        append_msg(st, GPUBUF__STATE_RECORD__REC_SLAB, &m);
        gd_state_store_fd(st, name, s->exp.fd);
    } else {
        hook_id(st, GPUBUF__STATE_RECORD__REC_SLAB_GONE, s->id);
        store_remove(st, name);
    }
}

static const gd_registry_hooks hooks = {
    .buf = hook_buf,
    .buf_gone = hook_buf_gone,
    .ref = hook_ref,
    .holder = hook_holder,
    .holder_gone = hook_holder_gone,
};

/* ---- reading ----------------------------------------------------------- */

/* The saved state replayed: the last record of each id wins. */
typedef struct r_ref {
    uint64_t buffer;
    uint32_t count, ro;
    UT_hash_handle hh;
} r_ref;

/* A slab, a buffer or a session, with its last record (a StateSlab,
 * StateBuffer or StateSession) and, for sessions, their references. */
typedef struct r_entry {
    uint64_t id;
    ProtobufCMessage *m;
    r_ref *refs;
    gd_slab *slab; /* a slab's, once restored */
    UT_hash_handle hh;
} r_entry;

typedef struct replay {
    r_entry *slabs, *bufs, *sessions;
    Gpubuf__StateCounters counters;
    uint64_t max_buffer, max_session, max_slab;
    uint64_t records, bad;
} replay;

/* Is id one gpubufd gives (1..GD_ID_MAX)? If not, the record naming it is
 * dropped, and said so: the saved state is input, and an id near 2^64
 * would make the ids given next wrap onto ones in use. */
static bool id_ok(replay *rp, const char *record, const char *field, uint64_t id) {
    if (id != 0 && id <= GD_ID_MAX)
        return true;
    LOG_WARN_LIMITED("restore: dropped a %s record: its %s %llu is outside 1..%llu, the ids "
                     "gpubufd gives (a damaged or forged state)",
                     record, field, (unsigned long long)id, (unsigned long long)GD_ID_MAX);
    rp->bad++;
    return false;
}

/* A saved counter (the last id given) beyond GD_ID_MAX is not taken: the
 * ids continue after the highest one in the records instead. */
static uint64_t counter(const char *what, uint64_t v) {
    if (v <= GD_ID_MAX)
        return v;
    LOG_WARN_LIMITED("restore: ignored %s %llu: beyond %llu, the largest id gpubufd gives (a "
                     "damaged or forged state); ids continue after the highest one restored",
                     what, (unsigned long long)v, (unsigned long long)GD_ID_MAX);
    return 0;
}

#define SLAB_OF(e) ((Gpubuf__StateSlab *)(e)->m)
#define BUF_OF(e) ((Gpubuf__StateBuffer *)(e)->m)
#define SESSION_OF(e) ((Gpubuf__StateSession *)(e)->m)

static void entry_free(r_entry **table, r_entry *e) {
    r_ref *r, *tmp;
    HASH_DEL(*table, e);
    HASH_ITER(hh, e->refs, r, tmp) {
        HASH_DEL(e->refs, r);
        free(r);
    }
    protobuf_c_message_free_unpacked(e->m, NULL);
    free(e);
}

static void table_free(r_entry **table) {
    r_entry *e, *tmp;
    HASH_ITER(hh, *table, e, tmp) {
        entry_free(table, e);
    }
}

static void replay_free(replay *rp) {
    table_free(&rp->slabs);
    table_free(&rp->bufs);
    table_free(&rp->sessions);
}

static uint64_t umax(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

/* The record *m of id replaces the entry's (it moves into the table: *m
 * becomes NULL). False when out of memory. */
static bool upsert(r_entry **table, uint64_t id, uint64_t *max, void *mp) {
    ProtobufCMessage **m = mp;
    r_entry *e;
    *max = umax(*max, id);
    HASH_FIND(hh, *table, &id, sizeof(id), e);
    if (!e) {
        if (!(e = calloc(1, sizeof(*e))))
            return false;
        e->id = id;
        HASH_ADD(hh, *table, id, sizeof(e->id), e);
    } else {
        protobuf_c_message_free_unpacked(e->m, NULL);
    }
    e->m = *m;
    *m = NULL;
    return true;
}

static void remove_id(r_entry **table, uint64_t id, uint64_t *max) {
    r_entry *e;
    if (max)
        *max = umax(*max, id);
    HASH_FIND(hh, *table, &id, sizeof(id), e);
    if (e)
        entry_free(table, e);
}

/* A session's count of references to one buffer (0: none). */
static bool set_ref(replay *rp, const Gpubuf__StateRef *m) {
    r_entry *x;
    r_ref *r;
    if (!id_ok(rp, "reference", "session id", m->session) ||
        !id_ok(rp, "reference", "buffer id", m->buffer))
        return true;
    HASH_FIND(hh, rp->sessions, &m->session, sizeof(m->session), x);
    if (!x) {
        LOG_WARN_LIMITED("restore: dropped %u reference(s) of session %llu to buffer %llu: no "
                         "record of that session comes before",
                         m->count, (unsigned long long)m->session,
                         (unsigned long long)m->buffer);
        rp->bad++;
        return true;
    }
    HASH_FIND(hh, x->refs, &m->buffer, sizeof(m->buffer), r);
    if (m->count == 0) {
        if (r) {
            HASH_DEL(x->refs, r);
            free(r);
        }
        return true;
    }
    if (!r) {
        if (!(r = calloc(1, sizeof(*r))))
            return false;
        r->buffer = m->buffer;
        HASH_ADD(hh, x->refs, buffer, sizeof(r->buffer), r);
    }
    r->count = m->count;
    r->ro = m->read_only < m->count ? m->read_only : m->count;
    return true;
}

/* Apply one record; false when out of memory. */
static bool apply(replay *rp, Gpubuf__StateRecord *rec) {
    switch (rec->rec_case) {
    case GPUBUF__STATE_RECORD__REC_COUNTERS:
        rp->counters.next_buffer_id = counter("next_buffer_id", rec->counters->next_buffer_id);
        rp->counters.next_session_id = counter("next_session_id", rec->counters->next_session_id);
        rp->counters.next_slab_id = counter("next_slab_id", rec->counters->next_slab_id);
        rp->counters.restarts = rec->counters->restarts;
        return true;
    case GPUBUF__STATE_RECORD__REC_SLAB:
        if (!id_ok(rp, "slab", "id", rec->slab->id))
            return true;
        return upsert(&rp->slabs, rec->slab->id, &rp->max_slab, &rec->slab);
    case GPUBUF__STATE_RECORD__REC_SLAB_GONE:
        if (id_ok(rp, "slab removal", "id", rec->slab_gone))
            remove_id(&rp->slabs, rec->slab_gone, &rp->max_slab);
        return true;
    case GPUBUF__STATE_RECORD__REC_BUFFER:
        if (!id_ok(rp, "buffer", "id", rec->buffer->id))
            return true;
        return upsert(&rp->bufs, rec->buffer->id, &rp->max_buffer, &rec->buffer);
    case GPUBUF__STATE_RECORD__REC_BUFFER_GONE:
        if (id_ok(rp, "buffer removal", "id", rec->buffer_gone))
            remove_id(&rp->bufs, rec->buffer_gone, &rp->max_buffer);
        return true;
    case GPUBUF__STATE_RECORD__REC_SESSION:
        if (!id_ok(rp, "session", "id", rec->session->id))
            return true;
        return upsert(&rp->sessions, rec->session->id, &rp->max_session, &rec->session);
    case GPUBUF__STATE_RECORD__REC_SESSION_GONE:
        if (id_ok(rp, "session removal", "id", rec->session_gone))
            remove_id(&rp->sessions, rec->session_gone, &rp->max_session);
        return true;
    case GPUBUF__STATE_RECORD__REC_REF:
        return set_ref(rp, rec->ref);
    default:
        rp->bad++;
        return true;
    }
}

/* The generation of a slot's header, 0 when it has none valid. */
static uint64_t slot_gen(int fd) {
    uint8_t hdr[STATE_HEADER];
    if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
        return 0;
    if (memcmp(hdr, STATE_MAGIC, 8) != 0 || get32(hdr + 8) != STATE_VERSION ||
        get64(hdr + 24) != checksum(hdr, 24))
        return 0;
    return get64(hdr + 16);
}

/* Replay the records of a slot, up to the first torn or bad one; *ret_end
 * is where they end. */
static bool replay_slot(replay *rp, int fd, uint64_t *ret_end) {
    struct stat sb;
    if (fstat(fd, &sb) < 0 || sb.st_size < (off_t)STATE_HEADER)
        return false;
    size_t size = (size_t)sb.st_size;
    uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return false;
    size_t off = STATE_HEADER;
    bool ok = true;
    while (ok && size - off >= 8) {
        uint32_t n = get32(map + off), sum = get32(map + off + 4);
        if (n > STATE_MAX_RECORD || n > size - off - 8 ||
            (uint32_t)checksum(map + off + 8, n) != sum)
            break;
        Gpubuf__StateRecord *rec = gpubuf__state_record__unpack(NULL, n, map + off + 8);
        if (!rec) {
            rp->bad++;
            break;
        }
        ok = apply(rp, rec);
        gpubuf__state_record__free_unpacked(rec, NULL);
        rp->records++;
        off += 8 + n;
    }
    munmap(map, size);
    *ret_end = off;
    return ok;
}

/* ---- restoring --------------------------------------------------------- */

typedef struct restore_log {
    uint32_t slabs, slabs_dropped, bufs, bufs_dropped, sessions;
    uint64_t refs, refs_dropped; /* sums of saved counts: each up to 2^32 - 1 */
} restore_log;

static gd_kept_fd *kept_find(gd_kept_fd *kept, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (kept[i].fd >= 0 && strcmp(kept[i].name, name) == 0)
            return &kept[i];
    return NULL;
}

static void restore_slabs(gd_state *st, replay *rp, gd_kept_fd *kept, size_t n, restore_log *lg) {
    r_entry *e, *tmp;
    HASH_ITER(hh, rp->slabs, e, tmp) {
        const Gpubuf__StateSlab *s = SLAB_OF(e);
        char name[64];
        gd_err err = {0};
        gd_slab *slab;
        slab_name(name, sizeof(name), s->id);
        gd_kept_fd *k = kept_find(kept, n, name);
        gd_pool *pool = gd_context_find_pool(st->ctx, s->pool);
        int r = -ENOENT;
        if (!k)
            gd_err_set(&err, -ENOENT, "its fd was not kept");
        else if (!pool)
            gd_err_set(&err, -ENOENT, "no such pool is configured now");
        else if ((r = gd_pool_adopt_slab(pool, s->id, s->size, s->dedicated, k->fd, &slab,
                                         &err)) == 0) {
            k->fd = -1; /* the pool's now */
            /* Pinned until the restore is done: a buffer dropped on the
             * way must not take with it a slab whose other buffers are
             * still to come (nor leave e->slab pointing at a freed one). */
            gd_pool_pin(slab);
            e->slab = slab;
        }
        if (r < 0) {
            char pn[GPUBUF_NAME_MAX + 1]; /* the state is input: no control bytes logged */
            gpubuf_text_clean(pn, sizeof(pn), s->pool, strlen(s->pool));
            LOG_WARN_LIMITED("restore: dropped slab %llu of pool '%s' (%llu bytes): %s",
                     (unsigned long long)s->id, pn, (unsigned long long)s->size,
                     err.msg);
            lg->slabs_dropped++;
        } else {
            lg->slabs++;
        }
    }
}

/* A restored slab by id: one lookup, so that restoring takes a time in
 * proportion to the records, not to buffers times slabs. */
static gd_slab *find_slab(replay *rp, uint64_t id) {
    r_entry *e;
    HASH_FIND(hh, rp->slabs, &id, sizeof(id), e);
    return e ? e->slab : NULL;
}

static void restore_bufs(gd_state *st, replay *rp, restore_log *lg) {
    gd_context *ctx = st->ctx;
    r_entry *rb, *tmp;
    HASH_ITER(hh, rp->bufs, rb, tmp) {
        const Gpubuf__StateBuffer *m = BUF_OF(rb);
        gd_err err = {0};
        gd_buf t, *b;
        gpubuf_layout l;
        gd_meta_args meta = {.layout = m->layout ? &l : NULL,
                             .user = m->user_data.data,
                             .user_len = m->user_data.len,
                             .ttl_ms = m->lease_ttl_ms};
        memset(&t, 0, sizeof(t));
        gd_slab *slab = find_slab(rp, m->slab_id);
        int r = -EINVAL;
        if (!slab)
            gd_err_set(&err, -ENOENT, "its slab %llu was not restored",
                       (unsigned long long)m->slab_id);
        else if (m->state < GPUBUF_STATE_ALLOCATED || m->state > GPUBUF_STATE_DELETED)
            gd_err_set(&err, -EINVAL, "state %u", m->state);
        else if (m->size == 0 || m->size > m->block_size || m->charged > m->block_size)
            gd_err_set(&err, -EINVAL, "size %llu in a block of %llu", (unsigned long long)m->size,
                       (unsigned long long)m->block_size);
        else if (m->event.len != 0 && m->event.len != GD_EVENT_HANDLE_SIZE)
            gd_err_set(&err, -EINVAL, "event of %zu bytes", m->event.len);
        else if (m->layout && gpubuf_layout_from_wire(m->layout, &l, err.msg, sizeof(err.msg)) < 0)
            err.code = -EINVAL;
        else if ((r = gd_pool_claim(slab->pool, slab, m->offset, m->block_size, &t.blk, &err)) ==
                 0) {
            t.id = m->id;
            t.name = m->name[0] ? m->name : NULL;
            t.pool = slab->pool;
            t.size = m->size;
            t.state = (gpubuf_state)m->state;
            t.owner_uid = m->owner_uid;
            t.owner_holder = m->owner_session;
            t.charged = m->charged;
            t.restored = true;
            if (m->event.len) {
                t.has_event = true;
                t.event_holder = m->event_session;
                memcpy(t.event, m->event.data, GD_EVENT_HANDLE_SIZE);
            }
            if ((r = gd_registry_restore_buf(&ctx->reg, &t, &b, &err)) < 0)
                gd_pool_release(slab->pool, &t.blk);
            /* Its layout checked as an alloc's; a bad one drops it (freed
             * at once: nothing references it yet). */
            else if ((r = gd_registry_restore_meta(&ctx->reg, b, &meta, m->lease_expires_ns,
                                                   &err)) < 0)
                gd_registry_unpublish(&ctx->reg, b);
        }
        if (r < 0) {
            char name[GPUBUF_NAME_MAX + 1]; /* cut, no control bytes logged */
            gpubuf_text_clean(name, sizeof(name), m->name, strlen(m->name));
            LOG_WARN_LIMITED("restore: dropped buffer %llu%s%s%s: %s", (unsigned long long)m->id,
                     name[0] ? " ('" : "", name, name[0] ? "')" : "", err.msg);
            lg->bufs_dropped++;
        } else {
            lg->bufs++;
        }
    }
}

/* Owners are charged when their session is restored before the buffer:
 * sessions go first, then buffers, then the references. */
static void restore(gd_state *st, replay *rp, gd_kept_fd *kept, size_t n) {
    gd_context *ctx = st->ctx;
    restore_log lg = {0};
    uint64_t t0 = gpubuf_now_ns();
    restore_slabs(st, rp, kept, n, &lg);
    /* Holders first (owners get charged), their references after the buffers. */
    r_entry *x, *xtmp;
    HASH_ITER(hh, rp->sessions, x, xtmp) {
        const Gpubuf__StateSession *m = SESSION_OF(x);
        if (x->refs && !gd_registry_restore_holder(&ctx->reg, x->id, (pid_t)m->pid,
                                                   (uid_t)m->uid, (gid_t)m->gid))
            LOG_WARN_LIMITED("restore: dropped session %llu (pid %d) and its references: out "
                             "of memory",
                             (unsigned long long)x->id, (int)m->pid);
    }
    restore_bufs(st, rp, &lg);
    HASH_ITER(hh, rp->sessions, x, xtmp) {
        gd_holder *h;
        r_ref *r, *rtmp;
        if (!x->refs)
            continue;
        HASH_FIND(hh, ctx->reg.holders, &x->id, sizeof(x->id), h);
        if (!h)
            continue;
        lg.sessions++;
        HASH_ITER(hh, x->refs, r, rtmp) {
            gd_err err = {0};
            gd_buf *b = gd_registry_find_id(&ctx->reg, r->buffer);
            if (!b)
                gd_err_set(&err, -ENOENT, "the buffer was not restored");
            if (!b || gd_registry_restore_ref(&ctx->reg, h, b, r->count, r->ro, &err) < 0) {
                LOG_WARN_LIMITED("restore: dropped %u reference(s) of session %llu to buffer "
                                 "%llu: %s",
                                 r->count, (unsigned long long)x->id,
                                 (unsigned long long)r->buffer, err.msg);
                lg.refs_dropped += r->count;
                continue;
            }
            lg.refs += r->count;
        }
    }
    gd_registry_restore_done(&ctx->reg);
    r_entry *e, *etmp;
    HASH_ITER(hh, rp->slabs, e, etmp) {
        if (e->slab)
            gd_pool_unpin(e->slab->pool, e->slab);
        e->slab = NULL;
    }
    for (int i = 0; i < ctx->n_pools; i++)
        gd_pool_trim(ctx->pools[i]);
    /* Ids never go back, also those of records that are gone. */
    ctx->reg.next_buffer_id =
        umax(ctx->reg.next_buffer_id, umax(rp->counters.next_buffer_id, rp->max_buffer));
    ctx->reg.next_holder_id =
        umax(ctx->reg.next_holder_id, umax(rp->counters.next_session_id, rp->max_session));
    ctx->slab_ids = umax(ctx->slab_ids, umax(rp->counters.next_slab_id, rp->max_slab));
    ctx->restarts = rp->counters.restarts + (rp->counters.restarts < UINT32_MAX);
    ctx->restored_buffers = ctx->reg.n_buffers;
    /* The lease heap is whole again: leases that expired while the daemon
     * was down are due at once, at the loop's first turn. */
    gd_context_leases_arm(ctx);
    LOG_NOTICE("restart %u: restored %u slab(s), %u buffer(s) (%u left after dropping "
               "unreachable ones), %u session(s) waiting to resume with %llu reference(s) from "
               "%llu record(s) in %.1f ms; dropped %u slab(s), %u buffer(s), %llu reference(s), "
               "%llu bad record(s)",
               ctx->restarts, lg.slabs, lg.bufs, ctx->reg.n_buffers, ctx->reg.n_detached,
               (unsigned long long)lg.refs, (unsigned long long)rp->records,
               (double)(gpubuf_now_ns() - t0) / 1e6, lg.slabs_dropped, lg.bufs_dropped,
               (unsigned long long)lg.refs_dropped, (unsigned long long)rp->bad);
}

/* The state slot named name among kept: its fd (taken), or a new memfd. */
static int slot_fd(gd_kept_fd *kept, size_t n, const char *name, bool *ret_kept) {
    gd_kept_fd *k = kept_find(kept, n, name);
    struct stat sb;
    *ret_kept = false;
    if (k) {
        int fd = k->fd;
        k->fd = -1;
        if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && (fcntl(fd, F_GETFL) & O_ACCMODE) == O_RDWR) {
            *ret_kept = true;
            return fd;
        }
        LOG_WARN("restore: %s is not a writable memfd; ignored", name);
        close(fd);
    }
    return memfd_create("gpubufd-state", MFD_CLOEXEC);
}

static void on_expiry(uv_timer_t *t) {
    gd_state *st = t->data;
    gd_state_expire(st);
    if (st->ctx->reg.n_detached == 0)
        uv_timer_stop(t);
}

uint32_t gd_state_expire(gd_state *st) {
    gd_registry *reg = &st->ctx->reg;
    uint64_t now = gpubuf_now_ns(), limit = (uint64_t)st->ctx->limits.resume_timeout_ms * 1000000u;
    uint32_t n = 0;
    gd_holder *h, *tmp;
    if (reg->n_detached == 0)
        return 0;
    HASH_ITER(hh, reg->holders, h, tmp) {
        if (!h->detached || now - h->detached_ns < limit)
            continue;
        LOG_NOTICE("session %llu (pid %d) did not resume within %u ms: released its %u "
                   "reference(s)",
                   (unsigned long long)h->id, (int)h->pid, st->ctx->limits.resume_timeout_ms,
                   h->n_refs);
        /* Gone from the saved state now; its references go a bounded part
         * per turn of the loop, like a departed client's. */
        gd_registry_holder_leave(reg, h);
        n++;
    }
    if (n && st->ctx->want_work)
        st->ctx->want_work(st->ctx);
    return n;
}

int gd_state_open(gd_context *ctx, gd_kept_fd *kept, size_t n, bool fdstore, gd_err *err) {
    gd_state *st = calloc(1, sizeof(*st));
    replay rp;
    bool have[2];
    int best = -1;
    if (!st)
        return gd_err_set(err, -ENOMEM, "out of memory");
    memset(&rp, 0, sizeof(rp));
    st->ctx = ctx;
    st->fdstore = fdstore;
    st->slots[0].fd = slot_fd(kept, n, "state-0", &have[0]);
    st->slots[1].fd = slot_fd(kept, n, "state-1", &have[1]);
    if (st->slots[0].fd < 0 || st->slots[1].fd < 0) {
        int e = errno;
        if (st->slots[0].fd >= 0)
            close(st->slots[0].fd);
        if (st->slots[1].fd >= 0)
            close(st->slots[1].fd);
        free(st);
        return gd_err_set(err, -e, "memfd_create: %s", strerror(e));
    }
    for (int i = 0; i < 2; i++) {
        st->slots[i].gen = have[i] ? slot_gen(st->slots[i].fd) : 0;
        if (st->slots[i].gen && (best < 0 || st->slots[i].gen > st->slots[best].gen))
            best = i;
    }
    if (best >= 0) {
        uint64_t end = 0;
        if (!replay_slot(&rp, st->slots[best].fd, &end))
            LOG_ERR("restore: out of memory reading the saved state; restoring what was read");
        restore(st, &rp, kept, n);
        replay_free(&rp);
        st->active = best;
    } else if (have[0] || have[1]) {
        LOG_WARN("restore: the saved state has no valid snapshot; starting empty");
    }
    /* Slab fds no record took: memory nothing refers to any more. */
    for (size_t i = 0; i < n; i++)
        if (kept[i].fd >= 0 && strncmp(kept[i].name, "slab-", 5) == 0) {
            LOG_WARN("restore: dropped %s: no saved record names it", kept[i].name);
            close(kept[i].fd);
            kept[i].fd = -1;
            store_remove(st, kept[i].name);
        }
    for (int i = 0; i < ctx->n_pools; i++) {
        if (ctx->pools[i]->be->kind == GPUBUF_POOL_CUDA_IPC)
            LOG_NOTICE("pool '%s' is cuda-ipc: its memory dies with gpubufd, a restart frees "
                       "every buffer in it (cuda-vmm pools survive restarts)",
                       ctx->pools[i]->name);
    }
    /* A fresh snapshot of what was restored, then the journal follows it. */
    uint64_t t0 = gpubuf_now_ns();
    if (compact(st) < 0) {
        gd_state_free(st);
        return gd_err_set(err, -EIO, "cannot write the state memfd");
    }
    LOG_INFO("saved state: a snapshot of %llu bytes made in %.1f ms, in a memfd of gpubufd "
             "(not on disk)%s",
             (unsigned long long)st->slots[st->active].len, (double)(gpubuf_now_ns() - t0) / 1e6,
             fdstore ? "; the service manager's fd store keeps it across a restart"
                     : "; nothing else keeps it: only a gpubufd started with --takeover gets "
                       "it, a plain restart starts empty");
    /* From now on every change is journalled. */
    for (int i = 0; i < ctx->n_pools; i++) {
        ctx->pools[i]->slab_hook = hook_slab;
        ctx->pools[i]->slab_hook_arg = st;
    }
    ctx->reg.hooks = &hooks;
    ctx->reg.hooks_arg = st;
    ctx->state = st;
    gd_state_store_fd(st, "state-0", st->slots[0].fd);
    gd_state_store_fd(st, "state-1", st->slots[1].fd);
    for (int i = 0; i < ctx->n_pools; i++)
        for (gd_slab *s = ctx->pools[i]->slabs; s; s = s->next) {
            char name[64];
            slab_name(name, sizeof(name), s->id);
            gd_state_store_fd(st, name, s->exp.fd);
        }
    if (uv_timer_init(ctx->loop, &st->expiry) == 0) {
        st->expiry.data = st;
        st->expiry_on = true;
        if (ctx->reg.n_detached) {
            uint64_t every = ctx->limits.resume_timeout_ms / 4;
            uv_timer_start(&st->expiry, on_expiry, ctx->limits.resume_timeout_ms,
                           every < 100 ? 100 : every > 1000 ? 1000 : every);
        }
        uv_unref((uv_handle_t *)&st->expiry);
    }
    return 0;
}

void gd_state_freeze(gd_state *st) {
    if (!st || st->frozen)
        return;
    st->frozen = true;
    LOG_INFO("saved state: %llu journal record(s), %.2f us each on average; %llu snapshot(s), "
             "%.1f ms in all",
             (unsigned long long)st->records,
             st->records ? (double)st->journal_ns / 1e3 / (double)st->records : 0.0,
             (unsigned long long)st->snapshots, (double)st->snapshot_ns / 1e6);
    st->ctx->reg.hooks = NULL;
    for (int i = 0; i < st->ctx->n_pools; i++)
        st->ctx->pools[i]->slab_hook = NULL;
    if (st->expiry_on) {
        st->expiry_on = false;
        uv_close((uv_handle_t *)&st->expiry, NULL);
    }
}

int gd_state_rewrite(gd_state *st) {
    if (!st || st->frozen)
        return 0;
    /* A successor that got the fds may have written a snapshot of its own
     * into the slot that is not ours (never into ours, whose generation
     * is the highest it saw): read both generations again, so that ours
     * goes above it, into that slot; ours stays whole meanwhile. */
    for (int i = 0; i < 2; i++)
        st->slots[i].gen = slot_gen(st->slots[i].fd);
    if (st->slots[st->active].gen == 0)
        LOG_WARN("saved state: the active slot lost its header; writing a new snapshot");
    return compact(st);
}

void gd_state_free(gd_state *st) {
    if (!st)
        return;
    for (int i = 0; i < 2; i++) {
        slot_unmap(&st->slots[i]);
        if (st->slots[i].fd >= 0)
            close(st->slots[i].fd);
    }
    if (st->ctx->state == st)
        st->ctx->state = NULL;
    free(st);
}

size_t gd_state_fds(gd_state *st, gd_kept_fd **ret) {
    size_t n = 2, i = 0;
    for (int p = 0; p < st->ctx->n_pools; p++)
        n += st->ctx->pools[p]->n_slabs;
    gd_kept_fd *out = calloc(n, sizeof(*out));
    *ret = out;
    if (!out)
        return 0;
    for (int k = 0; k < 2; k++) {
        snprintf(out[i].name, sizeof(out[i].name), "state-%d", k);
        out[i++].fd = st->slots[k].fd;
    }
    for (int p = 0; p < st->ctx->n_pools; p++)
        for (gd_slab *s = st->ctx->pools[p]->slabs; s && i < n; s = s->next) {
            slab_name(out[i].name, sizeof(out[i].name), s->id);
            out[i++].fd = s->exp.fd;
        }
    return i;
}

uint64_t gd_state_bytes(const gd_state *st) {
    return st ? st->slots[st->active].len : 0;
}
