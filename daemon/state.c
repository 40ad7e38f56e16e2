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
#include "hash.h"

#ifdef GPUBUF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "gpubuf_state.pb-c.h"
#include "layout.h"
#include "log.h"
#include "saved_state.h"
#include "state_internal.h"
#include "state_record.h"
#include "state_restore.h"
#include "util.h"

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

static void pend_write(gd_state *st);

/* The pending buffer's entry (pend_write, below), if any. Its writing is
 * out of line: inlined, it made every hook save the registers it needs
 * (callgrind, batchmix: hook_buf about 35 instructions a call, most of
 * them that). */
static inline void pend_put(gd_state *st) {
    if (st->pend)
        pend_write(st);
}

/* Write the staged entries as one group to the active slot, before any
 * reply that tells of them leaves (gd_state_end), and into the snapshot
 * under way if any; start a snapshot when the slot has grown enough. */
static void commit(gd_state *st) {
    /* First: staging the pending entry may write a group of its own (a
     * stage near STATE_MAX_GROUP), and that may switch the active slot. */
    pend_put(st);
    slot *s = &st->slots[st->active];
    gd_obuf *o = &st->stage;
    st->records += st->ctx->reg.ref_sink_n;
    st->ctx->reg.ref_sink_n = 0;
    if (o->len <= 9 && !o->oom)
        return;
    /* One group in 64 is timed, for the average the log gives at stop: two
     * clock reads for every request that changes something were 38 of the
     * about 350 instructions of a group here (callgrind, latency phase;
     * through the vDSO), and are a system call each where the clock source
     * has no vDSO path. */
    bool timed = (st->groups & 63) == 0;
    size_t len0 = o->len;
    /* With a switchable journal (measurement only), a big group is timed
     * each (gd_state_stats), and counted only when written; a daemon that
     * cannot be switched makes no clock read for it. */
    bool big = st->switchable && len0 >= GD_STATE_BIG_GROUP && !o->oom;
    uint64_t t0 = timed || big ? gpubuf_now_ns() : 0;
    if (o->oom) {
        errno = ENOMEM;
        gd_state_write_failed(st, "journal");
    } else {
        gd_group_frame(o, 0, s->gen);
        st->bytes += o->len;
        if (gd_slot_put(s, s->len, o->p, o->len))
            s->len += o->len;
        else
            gd_state_write_failed(st, "journal");
        gd_state_snap_journal(st, o);
    }
    o->len = 0;
    o->oom = false;
    gd_group_open(o);
    st->groups++;
    if (timed || big) {
        uint64_t dt = gpubuf_now_ns() - t0;
        if (timed) {
            st->journal_ns += dt;
            st->timed_groups++;
        }
        if (big) {
            st->big_groups++;
            st->big_bytes += len0;
            st->big_ns += dt;
        }
    }
    if (s->len > st->compact_at)
        gd_state_snap_start(st);
}

void gd_state_begin(gd_state *st) {
    if (!st)
        return;
    gd_registry *reg = &st->ctx->reg;
    if (st->depth++ == 0 && reg->hooks && !st->frozen && !st->no_journal) {
        reg->ref_sink = &st->stage;
        st->stage.direct = !st->snap.on; /* a removal must move the snapshot's walk on */
    }
}

void gd_state_end(gd_state *st) {
    if (st && st->depth && --st->depth == 0) {
        st->ctx->reg.ref_sink = NULL;
        commit(st);
    }
}

/* Make room for one more entry of at most n bytes in the stage; a group
 * that would grow past STATE_MAX_GROUP is written first (a request never
 * makes one that large: max_request and the batch limits bound it; the
 * reference counts a request's registry appends itself, gd_registry.ref_sink,
 * skip this check: a batch of the most items, 4,096, makes about 120 KiB). */
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

/* A buffer's entry. Inside a request it is staged when the next entry
 * other than a reference comes, or when the request ends: a buffer changed
 * twice in a row (an alloc and its seal in one batch) is encoded once, as it
 * is then. The group is applied whole, so the earlier state of the buffer is
 * never seen, and a reference entry may come before it (references are
 * counts, applied in any order to one buffer record). The owner's count
 * of references to it while it is pending (an alloc's first, and any
 * change of it after) is kept aside by the stage (gd_obuf.pend_ref) and
 * goes into it: one entry for an alloc, and no count of the owner's before
 * the buffer's entry, where its later count would undo it.
 * A buffer freed before its entry was staged needs none: its removal
 * follows (with the owner's reference, if any, gone). Every change that
 * frees a gd_buf (gd_registry_buf_free) calls buf_gone first, so pend never
 * points to freed memory. */
static void pend_clear(gd_state *st) {
    gd_obuf *o = &st->stage;
    st->records -= o->pend_n; /* counted as entries of their own (by the registry): none is */
    st->pend = NULL;
    o->pend_buffer = o->pend_session = 0;
    o->pend_n = 0;
    o->pend_has_ref = false;
}

__attribute__((noinline)) static void pend_write(gd_state *st) {
    const gd_buf *b = st->pend;
    uint32_t ref[2] = {st->stage.pend_ref[0], st->stage.pend_ref[1]};
    bool owner_ref = st->stage.pend_has_ref;
    pend_clear(st);
    if (!stage_room(st, 1 + 128 + GPUBUF_NAME_MAX + GD_EVENT_HANDLE_SIZE + 8192))
        return;
    gd_se_buffer(&st->stage, b, owner_ref ? ref : NULL);
}

static void hook_buf(void *arg, const gd_buf *b) {
    gd_state *st = arg;
    /* Pending already (an alloc's seal in the same request): its entry is
     * written as it is then. Only inside a request: outside, staged() has
     * written it at once. */
    if (st->pend == b || st->frozen || st->no_journal)
        return;
    pend_put(st);
    st->pend = b;
    st->stage.pend_buffer = b->id;
    st->stage.pend_session = b->owner_holder;
    staged(st);
}

static void hook_buf_state(void *arg, const gd_buf *b) {
    gd_state *st = arg;
    /* A pending entry says the state its buffer has then; any other
     * buffer's pending entry must come before this one. */
    if (st->pend == b)
        return;
    pend_put(st);
    if (!stage_room(st, 13))
        return;
    gd_se_buffer_state(&st->stage, b->id, (uint32_t)b->state);
    staged(st);
}

static void hook_id(gd_state *st, int kind, uint64_t id) {
    pend_put(st);
    if (!stage_room(st, 9))
        return;
    gd_se_id(&st->stage, kind, id);
    staged(st);
}

/* A buffer's removal; last_ref: the holder whose last reference to it
 * went with it (the registry wrote no count of 0 for it), said in the same
 * entry (REF_GONE), or 0. */
static void hook_buf_gone(void *arg, uint64_t id, uint64_t last_ref) {
    gd_state *st = arg;
    if (st->pend && st->pend->id == id) {
        gd_obuf *o = &st->stage;
        uint64_t owner = o->pend_session;
        uint32_t ref[2] = {o->pend_ref[0], o->pend_ref[1]};
        bool had = o->pend_has_ref;
        pend_clear(st);
        /* The owner's count kept aside (0: a buffer is freed without
         * references) goes with it, unless the removal says it (REF_GONE):
         * a count an earlier group saved must not outlive the buffer. */
        if (had && last_ref != owner && stage_room(st, GD_SE_RUN_HEAD + GD_SE_RUN_ITEM))
            gd_se_ref(o, owner, id, ref[0], ref[1]);
    }
    gd_state_snap_gone(arg, id);
    pend_put(st);
    if (!stage_room(st, 17))
        return;
    if (last_ref)
        gd_se_ref_gone(&st->stage, last_ref, id);
    else
        gd_se_id(&st->stage, GD_SE_BUFFER_GONE, id);
    staged(st);
}

/* A reference count outside a request (inside one the registry appends it
 * to the group itself: gd_registry.ref_sink). */
static void hook_ref(void *arg, const gd_holder *h, uint64_t buffer_id, uint32_t count,
                     uint32_t ro) {
    gd_state *st = arg;
    if (!stage_room(st, GD_SE_RUN_HEAD + GD_SE_RUN_ITEM))
        return;
    gd_se_ref(&st->stage, h->id, buffer_id, count, ro);
    staged(st);
}

static void hook_holder(void *arg, const gd_holder *h) {
    gd_state *st = arg;
    pend_put(st);
    if (!stage_room(st, 256))
        return;
    gd_se_session(&st->stage, h);
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
    pend_put(st);
    gd_state_slab_name(name, sizeof(name), s->id);
    if (created) {
        if (stage_room(st, 256 + GPUBUF_NAME_MAX)) {
            gd_se_slab(&st->stage, s);
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
    .buf_state = hook_buf_state,
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
    if (gd_state_compact(st) < 0) {
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
    gd_group_open(&st->stage);
    st->no_journal = ctx->limits.journal_off == 1;
    if (st->no_journal)
        LOG_WARN("state_journal = off (for measurement only): no change is journalled, a restart "
                 "loses every change made from now on");
    else {
        ctx->reg.hooks = &hooks;
        ctx->reg.hooks_arg = st;
    }
    st->switchable = ctx->limits.journal_off == 2;
    if (st->switchable)
        LOG_WARN("state_journal = switchable (for measurement only): SIGUSR2 turns the journal "
                 "off, and on again; while it is off a restart loses every change");
    ctx->state = st;
    gd_state_store_fd(st, "state-0", st->slots[0].fd);
    gd_state_store_fd(st, "state-1", st->slots[1].fd);
    for (int i = 0; i < ctx->n_pools; i++)
        for (gd_slab *s = ctx->pools[i]->slabs; s; s = s->next) {
            char name[64];
            gd_state_slab_name(name, sizeof(name), s->id);
            gd_state_store_fd(st, name, s->exp.fd);
        }
    gd_state_snap_init(st, ctx->loop);
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

/* Before the kept state is handed on (a stop, a takeover): a switchable
 * journal turned off goes on again, a whole snapshot, so that who restores
 * it (`who`) finds the registry as it is, not as it was when the journal
 * stopped (buffers deleted since would come back over memory given to
 * others). */
static void journal_back_on(gd_state *st, const char *who) {
    if (st->switchable && st->no_journal && gd_state_switch(st) < 0)
        LOG_ERR("saved state: the journal was off and no snapshot could be written: %s "
                "restores the state of when it was turned off",
                who);
}

void gd_state_freeze(gd_state *st) {
    if (!st || st->frozen)
        return;
    journal_back_on(st, "a restart");
    commit(st);
    st->frozen = true;
    LOG_INFO("saved state: %llu journal entries in %llu group(s), %.1f MiB, %.2f us per group on "
             "average (one in 64 timed); %llu snapshot(s), %.1f ms in all; memfds mapped %.1f "
             "and %.1f MiB",
             (unsigned long long)st->records, (unsigned long long)st->groups,
             (double)st->bytes / 1048576.0,
             st->timed_groups ? (double)st->journal_ns / 1e3 / (double)st->timed_groups : 0.0,
             (unsigned long long)st->snapshots, (double)st->snapshot_ns / 1e6,
             (double)st->slots[0].cap / 1048576.0, (double)st->slots[1].cap / 1048576.0);
    st->ctx->reg.hooks = NULL;
    st->ctx->reg.ref_sink = NULL; /* (a signal's work: never inside a request) */
    for (int i = 0; i < st->ctx->n_pools; i++)
        st->ctx->pools[i]->slab_hook = NULL;
    if (st->expiry_on) {
        st->expiry_on = false;
        uv_close((uv_handle_t *)&st->expiry, NULL);
    }
    gd_state_snap_close(st);
}

int gd_state_switch(gd_state *st) {
    if (!st || st->frozen)
        return -ESRCH;
    if (!st->switchable)
        return -EPERM;
    if (!st->no_journal) {
        /* What the hooks staged is written, a snapshot under way is
         * dropped (it follows the journal, which stops), no hook runs. */
        commit(st);
        gd_state_snap_abort(st);
        st->ctx->reg.hooks = NULL;
        st->ctx->reg.ref_sink = NULL;
        st->no_journal = true;
        return 0;
    }
    /* On again: a whole snapshot of the registry as it is now, then the
     * journal follows it, as at start. */
    if (gd_state_compact(st) < 0)
        return -EIO; /* a journal after the old snapshot would miss changes: off it stays */
    st->no_journal = false;
    st->ctx->reg.hooks = &hooks;
    st->ctx->reg.hooks_arg = st;
    return 1;
}

void gd_state_stats_get(const gd_state *st, gd_state_stats *out) {
    *out = (gd_state_stats){0};
    if (!st)
        return;
    *out = (gd_state_stats){.groups = st->groups,
                            .bytes = st->bytes,
                            .big_groups = st->big_groups,
                            .big_bytes = st->big_bytes,
                            .big_ns = st->big_ns,
                            .snapshots = st->snapshots,
                            .snapshot_ns = st->snapshot_ns};
}

int gd_state_rewrite(gd_state *st) {
    if (!st || st->frozen)
        return 0;
    /* A successor that got the fds may have written a snapshot of its own
     * into the slot that is not ours (never into ours, whose generation
     * is the highest it saw): read both generations again, so that ours
     * goes above it, into that slot; ours stays whole meanwhile. */
    for (int i = 0; i < 2; i++) {
        gd_slot_unmap(&st->slots[i]); /* its size may have changed meanwhile */
        st->slots[i].gen = gd_state_slot_gen(st->slots[i].fd);
    }
    if (st->slots[st->active].gen == 0)
        LOG_WARN("saved state: the active slot lost its header; writing a new snapshot");
    gd_state_snap_abort(st);
    return gd_state_compact(st);
}

void gd_state_free(gd_state *st) {
    if (!st)
        return;
    for (int i = 0; i < 2; i++) {
        gd_slot_unmap(&st->slots[i]);
        if (st->slots[i].fd >= 0)
            close(st->slots[i].fd);
    }
    if (st->ctx->state == st)
        st->ctx->state = NULL;
    gd_state_snap_abort(st);
    free(st->snap.out.p);
    free(st->stage.p);
    free(st);
}

size_t gd_state_fds(gd_state *st, gd_kept_fd **ret) {
    size_t n = 2, i = 0;
    journal_back_on(st, "the successor");
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
            if (s->exp.fd < 0)
                continue; /* cuda-ipc: no fd outlives the daemon (as in the fd store) */
            gd_state_slab_name(out[i].name, sizeof(out[i].name), s->id);
            out[i++].fd = s->exp.fd;
        }
    return i;
}

uint64_t gd_state_bytes(const gd_state *st) {
    return st ? st->slots[st->active].len : 0;
}
