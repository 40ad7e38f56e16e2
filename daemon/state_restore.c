/* State room, continued: the saved state read back (the newest valid
 * generation replayed, record by record) and restored into the pools and
 * the registry at start. See state.h and docs/architecture.md, "Restart
 * survival". */
#include "state_restore.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include "hash.h"

#include "gpubuf_state.pb-c.h"
#include "layout.h"
#include "log.h"
#include "state_record.h"
#include "util.h"

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

/* The id of a buffer whose state entry came before any record of it (see
 * set_state). */
typedef struct r_early {
    uint64_t id;
    UT_hash_handle hh;
} r_early;

typedef struct replay {
    r_entry *slabs, *bufs, *sessions;
    r_early *early;
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

/* A record or removal of buffer id came: a state entry of it before was
 * not out of order after all (set_state). */
static void early_seen(replay *rp, uint64_t id) {
    r_early *x;
    HASH_FIND(hh, rp->early, &id, sizeof(id), x);
    if (x) {
        HASH_DEL(rp->early, x);
        free(x);
    }
}

/* The state entries whose buffer no record came for, before or after:
 * dropped, and said so. */
static void early_left(replay *rp) {
    r_early *x, *tmp;
    HASH_ITER(hh, rp->early, x, tmp) {
        LOG_WARN_LIMITED("restore: dropped the state of buffer %llu: no record of that buffer "
                         "comes before or after it",
                         (unsigned long long)x->id);
        rp->bad++;
        HASH_DEL(rp->early, x);
        free(x);
    }
}

/* After early_left (gd_state_restore), which empties rp->early. */
static void replay_free(replay *rp) {
    assert(!rp->early);
    table_free(&rp->slabs);
    table_free(&rp->bufs);
    table_free(&rp->sessions);
}

static uint64_t umax(uint64_t a, uint64_t b) {
    return a > b ? a : b;
}

/* The record *m of id (what: the log's word for it) replaces the entry's
 * in table (it moves into the table: *m becomes NULL); one with an id out
 * of range is dropped. False when out of memory. */
static bool upsert(replay *rp, const char *what, r_entry **table, uint64_t id, uint64_t *max,
                   void *mp) {
    ProtobufCMessage **m = mp;
    r_entry *e;
    if (!id_ok(rp, what, "id", id))
        return true;
    *max = umax(*max, id);
    GPUBUF_HASH_GET(*table, id, id, e);
    if (!e)
        return false;
    if (e->m) /* replaced */
        protobuf_c_message_free_unpacked(e->m, NULL);
    e->m = *m;
    *m = NULL;
    return true;
}

/* A removal record (what) of id: its entry leaves table (an id out of
 * range: the record is dropped). True. */
static bool remove_id(replay *rp, const char *what, r_entry **table, uint64_t id, uint64_t *max) {
    r_entry *e;
    if (!id_ok(rp, what, "id", id))
        return true;
    *max = umax(*max, id);
    HASH_FIND(hh, *table, &id, sizeof(id), e);
    if (e)
        entry_free(table, e);
    return true;
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

/* A buffer's state alone. Its record comes before, except in a slot that
 * a snapshot was written into step by step: a request's group goes there
 * whole, also the state of a buffer that the snapshot's walk writes later
 * (with that state: the walk's record is the newer). Such an entry is
 * dropped, and is bad only if no record or removal of its buffer comes
 * after it either (early_left). */
static bool set_state(replay *rp, const Gpubuf__StateBufferState *m) {
    r_entry *e;
    if (!id_ok(rp, "buffer state", "id", m->id))
        return true;
    HASH_FIND(hh, rp->bufs, &m->id, sizeof(m->id), e);
    if (!e) {
        r_early *x;
        HASH_FIND(hh, rp->early, &m->id, sizeof(m->id), x);
        if (!x) {
            if (!(x = malloc(sizeof(*x))))
                return false;
            x->id = m->id;
            HASH_ADD(hh, rp->early, id, sizeof(x->id), x);
        }
        return true;
    }
    BUF_OF(e)->state = m->state; /* checked with the rest of the buffer at restore */
    if (m->state == GPUBUF_STATE_DELETED) {
        BUF_OF(e)->lease_ttl_ms = 0;
        BUF_OF(e)->lease_expires_ns = 0;
    }
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
        return upsert(rp, "slab", &rp->slabs, rec->slab->id, &rp->max_slab, &rec->slab);
    case GPUBUF__STATE_RECORD__REC_SLAB_GONE:
        return remove_id(rp, "slab removal", &rp->slabs, rec->slab_gone, &rp->max_slab);
    case GPUBUF__STATE_RECORD__REC_BUFFER:
        if (rp->early)
            early_seen(rp, rec->buffer->id);
        return upsert(rp, "buffer", &rp->bufs, rec->buffer->id, &rp->max_buffer, &rec->buffer);
    case GPUBUF__STATE_RECORD__REC_BUFFER_GONE:
        if (rp->early)
            early_seen(rp, rec->buffer_gone);
        return remove_id(rp, "buffer removal", &rp->bufs, rec->buffer_gone, &rp->max_buffer);
    case GPUBUF__STATE_RECORD__REC_SESSION:
        return upsert(rp, "session", &rp->sessions, rec->session->id, &rp->max_session,
                      &rec->session);
    case GPUBUF__STATE_RECORD__REC_SESSION_GONE:
        return remove_id(rp, "session removal", &rp->sessions, rec->session_gone,
                         &rp->max_session);
    case GPUBUF__STATE_RECORD__REC_REF:
        return set_ref(rp, rec->ref);
    case GPUBUF__STATE_RECORD__REC_BUFFER_STATE:
        return set_state(rp, rec->buffer_state);
    default:
        rp->bad++;
        return true;
    }
}

/* The version of a slot's valid header (its generation in *gen), or 0. */
static uint32_t slot_header(int fd, uint64_t *gen) {
    uint8_t hdr[STATE_HEADER];
    *gen = 0;
    if (pread(fd, hdr, sizeof(hdr), 0) != (ssize_t)sizeof(hdr))
        return 0;
    if (memcmp(hdr, STATE_MAGIC, 8) != 0 || gd_state_get64(hdr + 24) != gd_state_checksum(hdr, 24))
        return 0;
    uint32_t v = gd_state_get32(hdr + 8);
    if (v != STATE_VERSION_1 && v != STATE_VERSION_2 && v != STATE_VERSION_3 &&
        v != STATE_VERSION) {
        LOG_ERR_LIMITED("restore: the saved state is of version %u; this gpubufd reads versions "
                        "%u to %u only (it was written by a newer gpubufd): it is not restored. "
                        "Run the newer gpubufd again to keep its buffers",
                        v, STATE_VERSION_1, STATE_VERSION);
        return 0;
    }
    *gen = gd_state_get64(hdr + 16);
    return v;
}

uint64_t gd_state_slot_gen(int fd) {
    uint64_t gen;
    return slot_header(fd, &gen) ? gen : 0;
}

/* One packed StateRecord applied. 0, -EINVAL (not a record), -ENOMEM. */
static int replay_record(replay *rp, const uint8_t *p, uint32_t n) {
    Gpubuf__StateRecord *rec = gpubuf__state_record__unpack(NULL, n, p);
    if (!rec)
        return -EINVAL;
    bool ok = apply(rp, rec);
    gpubuf__state_record__free_unpacked(rec, NULL);
    rp->records++;
    return ok ? 0 : -ENOMEM;
}

/* A group (version 2): decoded whole first, then applied, so that a group
 * is replayed whole or not at all. */
static int replay_group(replay *rp, const uint8_t *p, uint32_t n) {
    Gpubuf__StateRecord **recs;
    size_t k;
    int r = gd_se_decode(p, n, &recs, &k);
    if (r < 0)
        return r;
    for (size_t i = 0; i < k; i++) {
        if (r == 0 && !apply(rp, recs[i]))
            r = -ENOMEM;
        gpubuf__state_record__free_unpacked(recs[i], NULL);
    }
    rp->records += k;
    free(recs);
    return r;
}

/* Replay the records of a slot, up to the first torn or bad one; *ret_end
 * is where they end. */
static bool replay_slot(replay *rp, int fd, uint64_t *ret_end) {
    struct stat sb;
    uint64_t gen;
    uint32_t version = slot_header(fd, &gen);
    if (!version || fstat(fd, &sb) < 0 || sb.st_size < (off_t)STATE_HEADER)
        return false;
    size_t size = (size_t)sb.st_size;
    uint8_t *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
        return false;
    size_t off = STATE_HEADER;
    int r = 0;
    while (r == 0 && size - off >= 8) {
        uint32_t n = gd_state_get32(map + off), sum = gd_state_get32(map + off + 4);
        const uint8_t *p = map + off + 8;
        if (version == STATE_VERSION_1) {
            if (n > STATE_MAX_RECORD || n > size - off - 8 ||
                (uint32_t)gd_state_checksum(p, n) != sum)
                break;
            r = replay_record(rp, p, n);
        } else {
            /* 8 zero bytes end the frames; older ones may follow. */
            if (n == 0 || n > STATE_MAX_GROUP || n > size - off - 8 ||
                gd_se_checksum(gen, p, n) != sum)
                break;
            r = p[0] == GD_SE_GROUP ? replay_group(rp, p + 1, n - 1) : replay_record(rp, p, n);
        }
        if (r == -EINVAL) {
            rp->bad++;
            break;
        }
        off += 8 + n;
    }
    munmap(map, size);
    *ret_end = off;
    return r != -ENOMEM;
}

/* ---- restoring --------------------------------------------------------- */

typedef struct restore_log {
    uint32_t slabs, slabs_dropped, bufs, bufs_dropped, sessions;
    uint64_t refs, refs_dropped; /* sums of saved counts: each up to 2^32 - 1 */
} restore_log;

gd_kept_fd *gd_state_kept_find(gd_kept_fd *kept, size_t n, const char *name) {
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
        gd_state_slab_name(name, sizeof(name), s->id);
        gd_kept_fd *k = gd_state_kept_find(kept, n, name);
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

void gd_state_restore(gd_state *st, int fd, gd_kept_fd *kept, size_t n) {
    replay rp;
    uint64_t end = 0;
    memset(&rp, 0, sizeof(rp));
    if (!replay_slot(&rp, fd, &end))
        LOG_ERR("restore: out of memory reading the saved state; restoring what was read");
    early_left(&rp);
    restore(st, &rp, kept, n);
    replay_free(&rp);
}
