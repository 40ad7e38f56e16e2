/* Session room: decode one request, run it against the registry, reply. */
#include "session.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hash.h"
#include <utlist.h>

#include "arena.h"
#include "gpubuf.pb-c.h"
#include "hello.h"
#include "item.h"
#include "layout.h"
#include "log.h"
#include "status.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

typedef struct session_waiter {
    gd_waiter w;
    uv_timer_t timer;
    gd_session *s;
    uint64_t request_id;
    bool has_timer;
    UT_hash_handle hh; /* gd_session.waiting, by request_id (cancel) */
} session_waiter;

/* Does the client map the slab of what o hands out in o's mode already,
 * apart from the reference just taken (GPUBUF_CAP_SLAB_ONCE)? Then the reply
 * needs no fd or handle. Not while a batch alloc of the session is being
 * answered: a reference it took counts in slab_mapped, but the slab reaches
 * the client with the batch's reply, after this one (a waiting open woken by
 * the batch's seal); the client drops a slab's fd it has already. */
static bool client_maps(const gd_session *s, const gd_opened *o) {
    return (s->caps & GPUBUF_CAP_SLAB_ONCE) && o->slab_mapped && !s->batch_alloc;
}

/* Reply with buffer b. o (alloc and open, which take a reference; o->buf is
 * b): how to map it, the slab's fd or IPC handle unless the client maps the
 * slab already, and the seal event. o NULL (seal, stat): no handle, nothing
 * is handed out without a reference. A read-only open's fd is ro_fd. */
static void reply_buffer_mode(gd_session *s, uint64_t id, const gd_buf *b, const gd_opened *o,
                              int ro_fd) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    buffer_msg m;
    bool map_fd = o != NULL, ro = o && o->read_only;
    bool send_map = map_fd && !client_maps(s, o);
    gd_session_fill_buffer(&m, b);
    if (!send_map) {
        m.slab.ipc_handle.len = 0;
        m.slab.ipc_handle.data = NULL;
    }
    if (map_fd) {
        const uint8_t *ev = o->event;
        if (ev) {
            m.buf.event_handle.data = (uint8_t *)ev;
            m.buf.event_handle.len = GD_EVENT_HANDLE_SIZE;
        }
    }
    m.slab.keepable = map_fd && gd_session_slab_keepable(s, b, ro);
    m.slab.read_only = ro;
    m.buf.read_only = ro;
    if (map_fd)
        gd_metrics_handed(&s->ctx->metrics, s->holder, b);
    int fd = send_map ? (ro ? ro_fd : b->blk.slab->exp.fd) : -1;
    resp.id = id;
    resp.fds = fd >= 0 ? 1 : 0;
    resp.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
    resp.buffer = &m.buf;
    gd_session_send(s, &resp, fd);
}

/* Reply with b, no handle (seal, stat, renew). */
static void reply_buffer(gd_session *s, uint64_t id, const gd_buf *b) {
    reply_buffer_mode(s, id, b, NULL, -1);
}

/* Reply to an alloc or open that took a reference (read-only if
 * o->read_only, which the registry allowed and marked): a read-only open
 * sends the fd that maps it read-only. Should that fd not be had (out of
 * fds), the reference goes back. */
static void reply_open(gd_session *s, uint64_t id, const gd_opened *o) {
    gd_err err = {0};
    gd_buf *b = o->buf;
    int fd = -1, r;
    if (!o->read_only || client_maps(s, o)) {
        reply_buffer_mode(s, id, b, o, -1);
        return;
    }
    r = gd_backend_export_ro(b->pool->be, &b->blk.slab->exp, &fd, &err);
    if (r < 0) {
        gd_session_open_undo(s, b, true);
        gd_session_reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    reply_buffer_mode(s, id, b, o, fd);
}

/* A waiting open's late error reply, counted as an open's. */
static void reply_open_error(session_waiter *sw, int status, const char *msg) {
    int saved = sw->s->cur_type;
    sw->s->cur_type = GD_REQ_OPEN;
    gd_session_reply_error(sw->s, sw->request_id, status, msg);
    sw->s->cur_type = saved;
}

static void waiter_closed(uv_handle_t *h) {
    free(h->data);
}

static void waiter_dispose(session_waiter *sw) {
    assert(sw->s->n_waiters > 0);
    sw->s->n_waiters--;
    HASH_DEL(sw->s->waiting, sw);
    if (sw->has_timer) {
        uv_timer_stop(&sw->timer);
        uv_close((uv_handle_t *)&sw->timer, waiter_closed);
    } else {
        free(sw);
    }
}

/* The answer to a woken open needs an fd (the client does not map the slab
 * yet) while the connection's queued replies hold their share of fds and
 * those of woken opens (GD_WAITER_REPLY_FDS more): the fd budget of
 * docs/security.md. */
static bool waiter_fd_budget_full(const gd_session *s, const gd_opened *o) {
    const gd_buf *b = o->buf;
    if (client_maps(s, o) || !s->io->fds_held)
        return false;
    if (!o->read_only && b->blk.slab->exp.fd < 0)
        return false; /* a cuda-ipc handle travels in the message */
    return s->io->fds_held(s->conn) >= GD_QUEUED_REPLY_FDS + GD_WAITER_REPLY_FDS;
}

static void waiter_wake(gd_waiter *w, gd_buf *b) {
    session_waiter *sw = (session_waiter *)w;
    (void)b; /* w->opened describes it */
    if (waiter_fd_budget_full(sw->s, &w->opened)) {
        gd_session_open_undo(sw->s, w->opened.buf, w->opened.read_only);
        reply_open_error(sw, -EAGAIN,
                         "the buffer was sealed, but this connection's unread replies hold "
                         "as many file descriptors as gpubufd keeps for it: read the replies "
                         "(dispatch them), then open the buffer again");
    } else {
        reply_open(sw->s, sw->request_id, &w->opened);
    }
    free(w->name);
    waiter_dispose(sw);
}

static void waiter_cancel(gd_waiter *w) {
    session_waiter *sw = (session_waiter *)w;
    free(w->name);
    waiter_dispose(sw);
}

static void waiter_fail(gd_waiter *w, const gd_err *err) {
    session_waiter *sw = (session_waiter *)w;
    reply_open_error(sw, err->code, err->msg);
    free(w->name);
    waiter_dispose(sw);
}

static void waiter_timeout(uv_timer_t *t) {
    session_waiter *sw = t->data;
    gd_context *ctx = sw->s->ctx;
    /* Thousands of waits may end at the same moment: a turn of the loop
     * answers a bounded number, the rest wait a millisecond more (a timer
     * due now would run again in this very turn). */
    uint64_t turn = uv_now(ctx->loop);
    if (turn != ctx->expiry_turn) {
        ctx->expiry_turn = turn;
        ctx->expiries = 0;
    }
    if (ctx->expiries >= GD_EXPIRIES_PER_TURN) {
        int r = uv_timer_start(&sw->timer, waiter_timeout, 1, 0);
        assert(r == 0); /* fails only without a callback */
        (void)r;
        return;
    }
    ctx->expiries++;
    gd_err e = {.code = -ETIMEDOUT};
    gd_registry_unwait(&ctx->reg, &sw->w);
    if (sw->w.name) {
        snprintf(e.msg, sizeof(e.msg), "timed out waiting for '%s' in pool '%s' to be sealed",
                 sw->w.name, sw->w.pool->name);
        gd_registry_hint_pools(&ctx->reg, sw->w.holder, ctx->pools, ctx->n_pools, sw->w.pool,
                               sw->w.name, &e);
    } else {
        snprintf(e.msg, sizeof(e.msg), "timed out waiting for buffer %llu to be sealed",
                 (unsigned long long)sw->w.buffer_id);
    }
    ctx->metrics.open_timeouts++;
    reply_open_error(sw, -ETIMEDOUT, e.msg);
    free(sw->w.name);
    waiter_dispose(sw);
}

/* The metadata of an alloc or seal request as registry arguments; layout is
 * their storage. -EINVAL for a wire layout that does not convert. */
static int meta_args(const Gpubuf__ArrayLayout *wl, const ProtobufCBinaryData *user,
                     uint64_t ttl_ms, gpubuf_layout *layout, gd_meta_args *ret, gd_err *err) {
    memset(ret, 0, sizeof(*ret));
    if (wl) {
        int r = gpubuf_layout_from_wire(wl, layout, err->msg, sizeof(err->msg));
        if (r < 0)
            return err->code = r;
        ret->layout = layout;
    }
    ret->user = user->data;
    ret->user_len = user->len;
    ret->ttl_ms = ttl_ms;
    return 0;
}

static void do_alloc(gd_session *s, uint64_t id, const Gpubuf__AllocRequest *a) {
    gd_err err = {0};
    gd_pool *pool = NULL;
    gd_buf *b;
    gpubuf_layout layout;
    gd_meta_args meta;
    int r = meta_args(a->layout, &a->user_data, a->ttl_ms, &layout, &meta, &err);
    if (r == 0)
        r = gd_context_pool(s->ctx, a->pool, &pool, &err);
    if (r == 0)
        r = gd_session_alloc_one(s, pool, a->size, a->alignment, a->name, &meta, &b, &err);
    if (r < 0) {
        gd_session_reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    if (b->lease_slot)
        gd_context_leases_arm(s->ctx);
    gd_opened o;
    gd_registry_opened(&s->ctx->reg, s->holder, b, false, &o);
    reply_open(s, id, &o);
}

static void do_seal(gd_session *s, uint64_t id, const Gpubuf__SealRequest *q) {
    gd_err err = {0};
    gd_buf *b;
    if (q->event_handle.len != 0 && q->event_handle.len != GD_EVENT_HANDLE_SIZE) {
        gd_session_reply_error(s, id, -EINVAL,
                               "a seal event handle has 64 bytes (CUipcEventHandle)");
        return;
    }
    gpubuf_layout layout;
    gd_meta_args meta;
    int r = meta_args(q->layout, &q->user_data, q->ttl_ms, &layout, &meta, &err);
    if (r == 0)
        r = gd_registry_seal_meta(&s->ctx->reg, s->holder, q->buffer_id,
                                  q->event_handle.len ? q->event_handle.data : NULL, &meta, &b,
                                  &err);
    if (r < 0) {
        gd_session_reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    if (b->lease_slot)
        gd_context_leases_arm(s->ctx);
    /* Waiters woken by the seal may have been this very session; b is alive
     * since the sealer holds a reference. The sealer mapped the buffer when
     * it allocated it: the reply carries no handle. */
    reply_buffer(s, id, b);
}

/* Reply with err; a name not found in its pool says which other pool the
 * client may use has it. */
static void reply_target_error(gd_session *s, uint64_t id, const gd_target *t, int r,
                               gd_err *err) {
    if (r == -ENOENT && t->name)
        gd_registry_hint_pools(&s->ctx->reg, s->holder, s->ctx->pools, s->ctx->n_pools, t->pool,
                               t->name, err);
    gd_session_reply_error(s, id, r, gd_err_msg(err, r));
}

/* Where an open, delete or stat points (q names a buffer by name in a pool,
 * or by id, maybe with the owner it expects), into t: true with *ret the
 * outcome of gd_session_target(), false after an error reply when q names
 * neither (verb: the request). */
#define REQUEST_TARGET(s, id, q, CASE, verb, t, err, ret)                                          \
    request_target((s), (id), (verb), (q)->target_case == CASE##_NAME,                             \
                   (q)->target_case == CASE##_BUFFER_ID, (q)->name, (q)->buffer_id, (q)->pool,     \
                   (q)->owner, (t), (err), (ret))

static bool request_target(gd_session *s, uint64_t id, const char *verb, bool by_name, bool by_id,
                           const char *name, uint64_t bid, const char *pool,
                           const Gpubuf__ExpectedOwner *owner, gd_target *t, gd_err *err,
                           int *ret) {
    if (!by_name && !by_id) {
        char msg[64];
        snprintf(msg, sizeof(msg), "%s needs a name or a buffer id", verb);
        gd_session_reply_error(s, id, -EINVAL, msg);
        return false;
    }
    *ret = gd_session_target(s, by_name, name, bid, pool, owner != NULL, owner ? owner->uid : 0, t,
                             err);
    return true;
}

static void do_open(gd_session *s, uint64_t id, const Gpubuf__OpenRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    gd_err err = {0};
    gd_target t;
    bool waitable = false;
    gd_opened o;
    int r;
    if (!REQUEST_TARGET(s, id, q, GPUBUF__OPEN_REQUEST__TARGET, "open", &t, &err, &r))
        return;
    if (r == 0)
        r = gd_registry_open_one(reg, s->holder, &t, q->read_only, &o, &waitable, &err);
    if (r == 0) {
        reply_open(s, id, &o);
        return;
    }
    /* Wait only for something that can still be sealed. */
    if (r != -ENOENT || q->timeout_ms == 0 || !waitable) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    const char *name = t.name;
    uint64_t bid = t.id;
    if (s->n_waiters >= s->ctx->limits.max_waiters_per_client) {
        char msg[192];
        snprintf(msg, sizeof(msg),
                 "too many pending opens on this connection: it has %u waiting, the most "
                 "max_waiters_per_client allows; wait for some to end, or use another connection",
                 s->n_waiters);
        gd_session_reply_error(s, id, -EAGAIN, msg);
        return;
    }
    session_waiter *sw = calloc(1, sizeof(*sw));
    if (!sw || (name && !(sw->w.name = strdup(name)))) {
        free(sw);
        gd_session_reply_error(s, id, -ENOMEM, "out of memory");
        return;
    }
    sw->s = s;
    sw->request_id = id;
    sw->w.holder = s->holder;
    sw->w.buffer_id = bid;
    sw->w.pool = t.pool;
    sw->w.has_owner = t.has_owner;
    sw->w.owner_uid = t.owner_uid;
    sw->w.read_only = q->read_only;
    sw->w.wake = waiter_wake;
    sw->w.cancel = waiter_cancel;
    sw->w.fail = waiter_fail;
    if (q->timeout_ms > 0) {
        /* Initialising a timer cannot fail on Linux; starting one fails only
         * without a callback. */
        r = uv_timer_init(s->ctx->loop, &sw->timer);
        if (r < 0) {
            free(sw->w.name);
            free(sw);
            gd_session_reply_error(s, id, r, uv_strerror(r));
            return;
        }
        sw->timer.data = sw;
        sw->has_timer = true;
        r = uv_timer_start(&sw->timer, waiter_timeout, (uint64_t)q->timeout_ms, 0);
        assert(r == 0);
    }
    s->n_waiters++;
    HASH_ADD(hh, s->waiting, request_id, sizeof(sw->request_id), sw);
    GPUBUF_HASH_KEEP_LOAD(hh, s->waiting);
    gd_registry_wait(reg, &sw->w);
}

/* Cancel a waiting open of this connection: it is answered ECANCELED, its
 * wait and timer go. One not waiting (woken, timed out, never sent) is left
 * alone; the cancel succeeds either way. */
static void do_cancel(gd_session *s, uint64_t id, const Gpubuf__CancelRequest *q) {
    session_waiter *sw;
    uint64_t rid = q->request_id;
    HASH_FIND(hh, s->waiting, &rid, sizeof(rid), sw);
    if (sw) {
        gd_registry_unwait(&s->ctx->reg, &sw->w);
        reply_open_error(sw, -ECANCELED, "the open was cancelled by the client");
        free(sw->w.name);
        waiter_dispose(sw);
    }
    gd_session_reply_error(s, id, 0, "");
}

static void do_release(gd_session *s, uint64_t id, const Gpubuf__ReleaseRequest *q) {
    gd_err err = {0};
    int r = gd_session_release_one(s, q->buffer_id, q->keep_mapped, q->read_only, &err);
    gd_session_reply_error(s, id, r, r < 0 ? gd_err_msg(&err, r) : "");
}

static void do_unmap(gd_session *s, uint64_t id, const Gpubuf__UnmapRequest *q) {
    gd_err err = {0};
    int r = gd_registry_unmap(&s->ctx->reg, s->holder, q->slab_id, &err);
    gd_session_reply_error(s, id, r, r < 0 ? gd_err_msg(&err, r) : "");
}

static void do_delete(gd_session *s, uint64_t id, const Gpubuf__DeleteRequest *q) {
    gd_err err = {0};
    gd_target t;
    int r;
    if (!REQUEST_TARGET(s, id, q, GPUBUF__DELETE_REQUEST__TARGET, "delete", &t, &err, &r))
        return;
    if (r == 0)
        r = gd_registry_delete_target(&s->ctx->reg, s->holder, &t, &err);
    if (r < 0) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    gd_session_reply_error(s, id, 0, "");
}

static void do_stat(gd_session *s, uint64_t id, const Gpubuf__StatRequest *q) {
    gd_buf *b = NULL;
    gd_err err = {0};
    gd_target t;
    int r;
    if (!REQUEST_TARGET(s, id, q, GPUBUF__STAT_REQUEST__TARGET, "stat", &t, &err, &r))
        return;
    if (r == 0)
        r = gd_registry_stat(&s->ctx->reg, &t, &b, &err);
    if (r < 0) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    /* Like status, stat takes no reference and so hands out no handle. */
    reply_buffer(s, id, b);
}

/* gpubufd --takeover asks for everything: the daemon's own uid or root. */
static void do_takeover(gd_session *s, uint64_t id, const Gpubuf__TakeoverRequest *q) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    gd_err err = {0};
    int r;
    if (s->uid != 0 && s->uid != geteuid()) {
        gd_session_reply_error(s, id, -EPERM, "only gpubufd's own uid or root may take it over");
        return;
    }
    if (!q->path || !q->path[0] || q->path[0] != '/') {
        gd_session_reply_error(s, id, -EINVAL, "takeover needs the absolute path of a socket");
        return;
    }
    if (!s->ctx->takeover) {
        gd_session_reply_error(s, id, -EOPNOTSUPP, "this gpubufd cannot be taken over");
        return;
    }
    if ((r = s->ctx->takeover(s->ctx, s->pid, q->path, &err)) < 0) {
        gd_session_reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    LOG_NOTICE("pid %d takes gpubufd over (socket %s)", (int)s->pid, q->path);
    resp.id = id;
    gd_session_send(s, &resp, -1);
}

static void do_renew(gd_session *s, uint64_t id, const Gpubuf__RenewRequest *q) {
    gd_err err = {0};
    gd_target t;
    gd_buf *b;
    if (q->target_case != GPUBUF__RENEW_REQUEST__TARGET_NAME &&
        q->target_case != GPUBUF__RENEW_REQUEST__TARGET_BUFFER_ID) {
        gd_session_reply_error(s, id, -EINVAL, "renew needs a name or a buffer id");
        return;
    }
    int r = gd_session_target(s, q->target_case == GPUBUF__RENEW_REQUEST__TARGET_NAME, q->name,
                           q->buffer_id, q->pool, false, 0, &t, &err);
    if (r == 0)
        r = gd_registry_renew(&s->ctx->reg, s->holder, &t, q->ttl_ms, &b, &err);
    if (r < 0) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    gd_context_leases_arm(s->ctx);
    /* Like stat: no reference taken, no handle handed out. */
    reply_buffer(s, id, b);
}

static gd_req_type req_type(const Gpubuf__Request *req) {
    Gpubuf__Request__BodyCase body = req->body_case;
    switch (body) {
    case GPUBUF__REQUEST__BODY_HELLO: return GD_REQ_HELLO;
    case GPUBUF__REQUEST__BODY_ALLOC: return GD_REQ_ALLOC;
    case GPUBUF__REQUEST__BODY_SEAL: return GD_REQ_SEAL;
    case GPUBUF__REQUEST__BODY_OPEN: return GD_REQ_OPEN;
    case GPUBUF__REQUEST__BODY_RELEASE: return GD_REQ_RELEASE;
    case GPUBUF__REQUEST__BODY_UNMAP: return GD_REQ_UNMAP;
    case GPUBUF__REQUEST__BODY_DELETE: return GD_REQ_DELETE;
    case GPUBUF__REQUEST__BODY_STAT: return GD_REQ_STAT;
    case GPUBUF__REQUEST__BODY_STATUS: return GD_REQ_STATUS;
    case GPUBUF__REQUEST__BODY_RENEW: return GD_REQ_RENEW;
    case GPUBUF__REQUEST__BODY_BATCH_OPEN: return GD_REQ_BATCH_OPEN;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE: return GD_REQ_BATCH_RELEASE;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC: return GD_REQ_BATCH_ALLOC;
    case GPUBUF__REQUEST__BODY_BATCH_STATE:
        return req->batch_state->op == GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_SEAL
                   ? GD_REQ_BATCH_SEAL
                   : GD_REQ_BATCH_DELETE;
    default: return GD_REQ_OTHER;
    }
}

/* Requests are unpacked into one block that every frame reuses: no malloc
 * per field (a batch of 1,000 names made 1,000 of them, 72 us of a 740 us
 * batch open on the H200) and no walk to free them. What does not fit
 * comes from malloc. One request at a time: the daemon has one thread, and
 * no handler keeps a pointer into its request past the frame (they went
 * with gpubuf__request__free_unpacked before); a frame handled while one
 * is (none is today) unpacks with malloc. */
static struct {
    gpubuf_arena a;
    bool busy; /* a request is in it */
    _Alignas(16) unsigned char block[64 * 1024];
} arena;

/* *fast: decoded by gd_request_fast (request_fast.c), which takes no
 * string with a NUL byte, so the frame need not be scanned for one. */
static Gpubuf__Request *request_unpack(const uint8_t *payload, size_t len, bool *fast) {
    *fast = false;
    if (arena.busy)
        return gpubuf__request__unpack(NULL, len, payload);
    gpubuf_arena_init(&arena.a, arena.block, sizeof(arena.block));
    Gpubuf__Request *req = gd_request_fast(&arena.a, payload, len);
    if (req)
        *fast = true;
    else
        req = gpubuf__request__unpack(&arena.a.alloc, len, payload);
    arena.busy = req != NULL;
    return req;
}

static void request_free(Gpubuf__Request *req) {
    if (!arena.busy || !gpubuf_arena_owns(&arena.a, req)) {
        gpubuf__request__free_unpacked(req, NULL);
        return;
    }
    if (arena.a.spilled) /* frees only what came from malloc */
        gpubuf__request__free_unpacked(req, &arena.a.alloc);
    arena.busy = false;
    gpubuf_arena_reset(&arena.a);
}

int gd_session_frame(gd_session *s, const uint8_t *payload, size_t len) {
    return gd_session_frame_at(s, payload, len, 0, 0);
}

int gd_session_frame_at(gd_session *s, const uint8_t *payload, size_t len, uint64_t woke_ns,
                        uint64_t read_ns) {
    bool fast;
    Gpubuf__Request *req = request_unpack(payload, len, &fast);
    if (!req) {
        LOG_WARN_LIMITED("pid %d: undecodable request (%zu bytes); disconnecting", (int)s->pid,
                         len);
        gd_session_reply_error(s, 0, GPUBUF_EPROTOCOL, "request does not decode as gpubuf.Request");
        gd_session_close(s, GD_END_PROTOCOL);
        return 0;
    }
    /* A batch starts only when its largest reply fits in the daemon's reply
     * memory: its items take references, and their reply must then be
     * queued whatever else waits. Too many items: the small error below. */
    size_t items = gd_session_batch_items(req);
    if (items && items <= GD_BATCH_MAX_ITEMS && s->hello_done && s->io->reply_room &&
        !s->io->reply_room(s->conn, gd_session_batch_reply_bound(items, gd_session_batch_with_meta(req)))) {
        request_free(req);
        return -EAGAIN;
    }
    if (!s->hello_done && req->body_case != GPUBUF__REQUEST__BODY_HELLO) {
        gd_session_reply_error(s, req->id, GPUBUF_EPROTOCOL, "the first request must be hello");
        gd_session_close(s, GD_END_PROTOCOL);
        goto out;
    }
    const char *nul = fast ? NULL : gpubuf_wire_nul_string(&gpubuf__request__descriptor, payload, len);
    if (nul) {
        char msg[128];
        snprintf(msg, sizeof(msg),
                 "string field '%s' of the request contains a NUL byte; strings may not", nul);
        gd_session_reply_error(s, req->id, -EINVAL, msg);
        if (!s->hello_done)
            gd_session_close(s, GD_END_PROTOCOL);
        goto out;
    }
    gd_req_type type = req_type(req);
    uint64_t t0 = gpubuf_now_ns();
    if (gpubuf_trace_on()) {
        gpubuf_trace(s->holder->id, req->id, (int)type, GPUBUF_TRACE_D_WAKE, woke_ns);
        gpubuf_trace(s->holder->id, req->id, (int)type, GPUBUF_TRACE_D_READ, read_ns);
        gpubuf_trace(s->holder->id, req->id, (int)type, GPUBUF_TRACE_D_DECODED, t0);
    }
    s->cur_type = (int)type;
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_HELLO: gd_session_hello(s, req->id, req->hello); break;
    case GPUBUF__REQUEST__BODY_ALLOC: do_alloc(s, req->id, req->alloc); break;
    case GPUBUF__REQUEST__BODY_SEAL: do_seal(s, req->id, req->seal); break;
    case GPUBUF__REQUEST__BODY_OPEN: do_open(s, req->id, req->open); break;
    case GPUBUF__REQUEST__BODY_RELEASE: do_release(s, req->id, req->release); break;
    case GPUBUF__REQUEST__BODY_UNMAP: do_unmap(s, req->id, req->unmap); break;
    case GPUBUF__REQUEST__BODY_DELETE: do_delete(s, req->id, req->delete_); break;
    case GPUBUF__REQUEST__BODY_STAT: do_stat(s, req->id, req->stat); break;
    case GPUBUF__REQUEST__BODY_STATUS: gd_session_status(s, req->id, req->status); break;
    case GPUBUF__REQUEST__BODY_RENEW: do_renew(s, req->id, req->renew); break;
    case GPUBUF__REQUEST__BODY_BATCH_OPEN:
        gd_session_batch_open(s, req->id, req->batch_open);
        break;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE:
        gd_session_batch_release(s, req->id, req->batch_release);
        break;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC:
        gd_session_batch_alloc(s, req->id, req->batch_alloc);
        break;
    case GPUBUF__REQUEST__BODY_BATCH_STATE:
        gd_session_batch_state(s, req->id, req->batch_state);
        break;
    case GPUBUF__REQUEST__BODY_TAKEOVER: do_takeover(s, req->id, req->takeover); break;
    case GPUBUF__REQUEST__BODY_CANCEL: do_cancel(s, req->id, req->cancel); break;
    default:
        gd_session_reply_error(s, req->id, -ENOTSUP, "unknown request type");
        break;
    }
    s->cur_type = -1;
    gd_metrics_request(&s->ctx->metrics, type, gpubuf_now_ns() - t0);
out:
    request_free(req);
    return 0;
}

void gd_session_bad_frame(gd_session *s, int err) {
    gd_session_reply_error(s, 0, err,
                err == -EMSGSIZE ? "request frame too large"
                                 : "bad frame header (magic, version or flags)");
}

void gd_session_shutdown(gd_session *s) {
    /* Best effort: a client blocked in a request reads this error. */
    gd_session_reply_error(s, 0, -ESHUTDOWN, "gpubufd is shutting down");
    gd_session_close(s, GD_END_SHUTDOWN);
}

gd_session *gd_session_new(gd_context *ctx, const gd_transport *io, void *conn, pid_t pid,
                           uid_t uid, gid_t gid) {
    gd_session *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    if (!(s->holder = gd_registry_holder_new(&ctx->reg, pid, uid, gid))) {
        if (errno == EOVERFLOW)
            LOG_ERR_LIMITED("pid %d: connection closed: gpubufd has given out every session id "
                            "(up to %llu) and ids never go back; start gpubufd afresh, without "
                            "its saved state",
                            (int)pid, (unsigned long long)GD_ID_MAX);
        free(s);
        return NULL;
    }
    s->ctx = ctx;
    s->io = io;
    s->conn = conn;
    s->cur_type = -1;
    ctx->metrics.connections++;
    s->pid = pid;
    s->uid = uid;
    s->gid = gid;
    DL_PREPEND(ctx->sessions, s);
    ctx->n_sessions++;
    LOG_DEBUG("session %llu: pid %d uid %d", (unsigned long long)s->holder->id, (int)pid,
              (int)uid);
    return s;
}

void gd_session_free(gd_session *s) {
    if (!s)
        return;
    LOG_DEBUG("session %llu (pid %d) closed", (unsigned long long)s->holder->id, (int)s->pid);
    /* Cancels the waits (their callbacks free them) now; everything the
     * client held is dropped by gd_registry_reap(), a bounded part per turn
     * of the loop. */
    gd_registry_holder_leave(&s->ctx->reg, s->holder);
    assert(s->n_waiters == 0);
    DL_DELETE(s->ctx->sessions, s);
    assert(s->ctx->n_sessions > 0);
    s->ctx->n_sessions--;
    free(s);
}

size_t gd_session_refusal(gd_context *ctx, gd_refusal why, uid_t uid, uint32_t limit,
                          uint8_t *payload, size_t cap) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    char msg[256];
    if (why >= GD_REFUSALS)
        return 0;
    ctx->metrics.refused[why]++;
    switch (why) {
    case GD_REFUSE_MAX_CLIENTS:
        resp.status = -EUSERS;
        snprintf(msg, sizeof(msg),
                 "gpubufd refused the connection: it serves at most max_clients = %u "
                 "connections and all are taken; close connections you do not need, or raise "
                 "max_clients in gpubuf.conf",
                 limit);
        break;
    case GD_REFUSE_MAX_CLIENTS_PER_UID:
        resp.status = -EUSERS;
        snprintf(msg, sizeof(msg),
                 "gpubufd refused the connection: uid %u already has max_clients_per_uid = %u "
                 "connections open; close connections you do not need, or raise "
                 "max_clients_per_uid in gpubuf.conf",
                 (unsigned)uid, limit);
        break;
    case GD_REFUSE_NO_FDS:
        resp.status = -EMFILE;
        snprintf(msg, sizeof(msg),
                 "gpubufd refused the connection: it is out of file descriptors "
                 "(RLIMIT_NOFILE); try again later, or raise LimitNOFILE= or lower max_clients");
        break;
    default: /* GD_REFUSE_STOPPING */
        resp.status = -ESHUTDOWN;
        snprintf(msg, sizeof(msg), "gpubufd is shutting down: connect again once it has restarted");
        break;
    }
    resp.message = msg;
    size_t len = gpubuf__response__get_packed_size(&resp);
    if (len > cap)
        return 0;
    return gpubuf__response__pack(&resp, payload);
}
