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
#include "saved_state.h"
#include "state_record.h"
#include "state_restore.h"
#include "util.h"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
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

static void header(uint8_t *hdr, uint32_t version, uint64_t gen) {
    memset(hdr, 0, STATE_HEADER);
    memcpy(hdr, STATE_MAGIC, 8);
    put32(hdr + 8, version);
    put64(hdr + 16, gen);
    put64(hdr + 24, gd_state_checksum(hdr, 24));
}

void gd_state_header(uint8_t *out, uint64_t gen) {
    header(out, STATE_VERSION_1, gen);
}

size_t gd_state_frame(uint8_t *out, const uint8_t *rec, uint32_t n) {
    memmove(out + 8, rec, n);
    put32(out, n);
    put32(out + 4, (uint32_t)gd_state_checksum(out + 8, n));
    return (size_t)n + 8;
}

void gd_state_header_v2(uint8_t *out, uint64_t gen) {
    header(out, STATE_VERSION, gen);
}

size_t gd_state_frame_v2(uint8_t *out, uint64_t gen, const uint8_t *rec, uint32_t n) {
    memmove(out + 8, rec, n);
    put32(out, n);
    put32(out + 4, gd_se_checksum(gen, out + 8, n));
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

static void slot_unmap(slot *s) {
    if (s->map)
        munmap(s->map, s->cap);
    s->map = NULL;
    s->cap = 0;
}

/* Room for need bytes in the slot's shared mapping: journal records are
 * copied into it, no system call each. The memfd's pages are the kept
 * state itself, so a record is saved once copied, whatever kills the
 * daemon next. The file grows by doubling (1 MiB at least) and never
 * shrinks: a snapshot writes over the pages the slot had (no page faults
 * on the hot path after the first round); 8 zero bytes after the last
 * frame end the replay, and a frame of an older generation left further
 * on fails its checksum (which covers the generation). */
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
    if ((fstat(s->fd, &sb) < 0 || (uint64_t)sb.st_size < cap) && ftruncate(s->fd, (off_t)cap) < 0)
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
static void frame_group(gd_obuf *o, size_t start, uint64_t gen) {
    uint32_t n = (uint32_t)(o->len - start - 8);
    put32(o->p + start, n);
    put32(o->p + start + 4, gd_se_checksum(gen, o->p + start + 8, n));
}

/* Open a group in o: room for its frame header, then its first byte. */
static size_t open_group(gd_obuf *o) {
    size_t start = o->len;
    uint8_t *p = gd_obuf_room(o, 9);
    if (p) {
        memset(p, 0, 9); /* the frame's header (filled by frame_group), GD_SE_GROUP */
        o->len += 9;
    }
    return start;
}

#define SNAPSHOT_GROUP (256u << 10) /* a snapshot's groups are about this long */

/* The whole registry as groups of entries of generation gen: counters,
 * slabs, sessions, buffers, refs. Not one group: the header, written
 * last, makes a snapshot whole. */
static void snapshot(const gd_context *ctx, gd_obuf *o, uint64_t gen) {
    Gpubuf__StateCounters c;
    size_t g = open_group(o);
#define NEXT_GROUP()                                                                               \
    do {                                                                                           \
        if (o->len - g > SNAPSHOT_GROUP && !o->oom) {                                              \
            frame_group(o, g, gen);                                                                \
            g = open_group(o);                                                                     \
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
        gd_se_buffer(o, b);
        NEXT_GROUP();
    }
    for (const gd_holder *h = ctx->reg.holders; h; h = h->hh.next)
        for (const gd_ref *r = h->refs; r; r = r->hh.next) {
            gd_se_ref(o, h->id, r->buffer_id, r->count, r->ro);
            NEXT_GROUP();
        }
#undef NEXT_GROUP
    if (!o->oom)
        frame_group(o, g, gen);
}

/* Copy len bytes to the slot at off and 8 zero bytes after them (the end
 * of the replay), through its mapping (or pwrite when it cannot map). */
static bool slot_put(slot *s, uint64_t off, const uint8_t *p, size_t len) {
    static const uint8_t end[8];
    if (slot_room(s, off + len + sizeof(end))) {
        memcpy(s->map + off, p, len);
        memset(s->map + off + len, 0, sizeof(end));
        return true;
    }
    return write_all(s->fd, p, len, off) && write_all(s->fd, end, sizeof(end), off + len);
}

/* Write a full snapshot into the inactive slot and make it the active one.
 * The active slot is not touched: a kill at any point leaves one whole. */
static int compact(gd_state *st) {
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
        write_failed(st, "snapshot");
        return -ENOMEM;
    }
    header(hdr, STATE_VERSION, gen);
    /* The old header goes first, the new one last: in between the slot
     * holds nothing valid. */
    if (!slot_put(to, 0, none, sizeof(none)) || !slot_put(to, STATE_HEADER, o.p, o.len) ||
        !(to->map ? (memcpy(to->map, hdr, sizeof(hdr)), true)
                  : write_all(to->fd, hdr, sizeof(hdr), 0))) {
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

/* Write the staged entries as one group to the active slot, before any
 * reply that tells of them leaves (gd_state_end); compact when the slot
 * has grown enough. */
static void commit(gd_state *st) {
    slot *s = &st->slots[st->active];
    gd_obuf *o = &st->stage;
    if (o->len <= 9 && !o->oom)
        return;
    uint64_t t0 = gpubuf_now_ns();
    if (o->oom) {
        errno = ENOMEM;
        write_failed(st, "journal");
    } else {
        frame_group(o, 0, s->gen);
        if (slot_put(s, s->len, o->p, o->len))
            s->len += o->len;
        else
            write_failed(st, "journal");
    }
    o->len = 0;
    o->oom = false;
    open_group(o);
    st->groups++;
    st->journal_ns += gpubuf_now_ns() - t0;
    if (s->len > st->compact_at)
        compact(st);
}

void gd_state_begin(gd_state *st) {
    if (st)
        st->depth++;
}

void gd_state_end(gd_state *st) {
    if (st && st->depth && --st->depth == 0)
        commit(st);
}

/* Make room for one more entry of at most n bytes in the stage; a group
 * that would grow past STATE_MAX_GROUP is written first (a request never
 * makes one that large: max_request and the batch limits bound it). */
static bool stage_room(gd_state *st, size_t n) {
    if (st->frozen || st->no_journal)
        return false;
    if (st->stage.len + n > STATE_MAX_GROUP)
        commit(st);
    st->records++;
    return true;
}

/* An entry staged: written at once outside of a request. */
static void staged(gd_state *st) {
    if (st->depth == 0)
        commit(st);
}

static void hook_buf(void *arg, const gd_buf *b) {
    gd_state *st = arg;
    if (!stage_room(st, 1 + 128 + GPUBUF_NAME_MAX + GD_EVENT_HANDLE_SIZE + 8192))
        return;
    gd_se_buffer(&st->stage, b);
    staged(st);
}

static void hook_id(gd_state *st, int kind, uint64_t id) {
    if (!stage_room(st, 9))
        return;
    gd_se_id(&st->stage, kind, id);
    staged(st);
}

static void hook_buf_gone(void *arg, uint64_t id) {
    hook_id(arg, GD_SE_BUFFER_GONE, id);
}

static void hook_ref(void *arg, const gd_holder *h, uint64_t buffer_id, uint32_t count,
                     uint32_t ro) {
    gd_state *st = arg;
    if (!stage_room(st, 25))
        return;
    gd_se_ref(&st->stage, h->id, buffer_id, count, ro);
    staged(st);
}

static void hook_holder(void *arg, const gd_holder *h) {
    gd_state *st = arg;
    Gpubuf__StateSession m;
    if (!stage_room(st, 256))
        return;
    holder_msg(&m, h);
    put_msg(&st->stage, GPUBUF__STATE_RECORD__REC_SESSION, &m);
    staged(st);
}

static void hook_holder_gone(void *arg, uint64_t id) {
    hook_id(arg, GD_SE_SESSION_GONE, id);
}

static void hook_slab(void *arg, const gd_slab *s, bool created) {
    gd_state *st = arg;
    char name[64];
    if (st->frozen)
        return;
    gd_state_slab_name(name, sizeof(name), s->id);
    if (created) {
        Gpubuf__StateSlab m;
        if (stage_room(st, 256 + GPUBUF_NAME_MAX)) {
            slab_msg(&m, s);
            put_msg(&st->stage, GPUBUF__STATE_RECORD__REC_SLAB, &m);
            staged(st);
        }
        gd_state_store_fd(st, name, s->exp.fd);
    } else {
        hook_id(st, GD_SE_SLAB_GONE, s->id);
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

/* The state slot named name among kept: its fd (taken), or a new memfd. */
static int slot_fd(gd_kept_fd *kept, size_t n, const char *name, bool *ret_kept) {
    gd_kept_fd *k = gd_state_kept_find(kept, n, name);
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
    bool have[2];
    int best = -1;
    if (!st)
        return gd_err_set(err, -ENOMEM, "out of memory");
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
        st->slots[i].gen = have[i] ? gd_state_slot_gen(st->slots[i].fd) : 0;
        if (st->slots[i].gen && (best < 0 || st->slots[i].gen > st->slots[best].gen))
            best = i;
    }
    if (best >= 0) {
        gd_state_restore(st, st->slots[best].fd, kept, n);
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
    open_group(&st->stage);
    st->no_journal = ctx->limits.journal_off != 0;
    if (st->no_journal)
        LOG_WARN("state_journal = off (for measurement only): no change is journalled, a restart "
                 "loses every change made from now on");
    else {
        ctx->reg.hooks = &hooks;
        ctx->reg.hooks_arg = st;
    }
    ctx->state = st;
    gd_state_store_fd(st, "state-0", st->slots[0].fd);
    gd_state_store_fd(st, "state-1", st->slots[1].fd);
    for (int i = 0; i < ctx->n_pools; i++)
        for (gd_slab *s = ctx->pools[i]->slabs; s; s = s->next) {
            char name[64];
            gd_state_slab_name(name, sizeof(name), s->id);
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
    commit(st);
    st->frozen = true;
    LOG_INFO("saved state: %llu journal entries in %llu group(s), %.2f us per group on average; "
             "%llu snapshot(s), %.1f ms in all",
             (unsigned long long)st->records, (unsigned long long)st->groups,
             st->groups ? (double)st->journal_ns / 1e3 / (double)st->groups : 0.0,
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
    for (int i = 0; i < 2; i++) {
        slot_unmap(&st->slots[i]); /* its size may have changed meanwhile */
        st->slots[i].gen = gd_state_slot_gen(st->slots[i].fd);
    }
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
    free(st->stage.p);
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
            gd_state_slab_name(out[i].name, sizeof(out[i].name), s->id);
            out[i++].fd = s->exp.fd;
        }
    return i;
}

uint64_t gd_state_bytes(const gd_state *st) {
    return st ? st->slots[st->active].len : 0;
}
