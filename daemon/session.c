/* Session room: decode one request, run it against the registry, reply. */
#include "session.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "gpubuf.pb-c.h"
#include "layout.h"
#include "log.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

#define GPUBUF_SERVER_STRING "gpubufd " GPUBUF_VERSION_STRING

/* The public enums travel as their wire twins by a plain cast. */
_Static_assert((int)GPUBUF_STATE_ALLOCATED == (int)GPUBUF__BUFFER_STATE__BUFFER_STATE_ALLOCATED &&
                   (int)GPUBUF_STATE_SEALED == (int)GPUBUF__BUFFER_STATE__BUFFER_STATE_SEALED &&
                   (int)GPUBUF_STATE_DELETED == (int)GPUBUF__BUFFER_STATE__BUFFER_STATE_DELETED,
               "gpubuf_state and gpubuf.BufferState differ");
_Static_assert((int)GPUBUF_POOL_HOST == (int)GPUBUF__POOL_KIND__POOL_KIND_HOST &&
                   (int)GPUBUF_POOL_CUDA_IPC == (int)GPUBUF__POOL_KIND__POOL_KIND_CUDA_IPC &&
                   (int)GPUBUF_POOL_CUDA_VMM == (int)GPUBUF__POOL_KIND__POOL_KIND_CUDA_VMM,
               "gpubuf_pool_kind and gpubuf.PoolKind differ");

typedef struct session_waiter {
    gd_waiter w;
    uv_timer_t timer;
    gd_session *s;
    uint64_t request_id;
    bool has_timer;
} session_waiter;

static void pack_response(const void *msg, uint8_t *dst) {
    gpubuf__response__pack(msg, dst);
}

/* Queue a reply; the transport dup's fd. Error replies are counted by code
 * and by the type of the request being answered. A large reply the
 * daemon's reply memory has no room for (-EAGAIN from the transport: nothing
 * was queued) is answered with a small EAGAIN error instead. */
static void send_response(gd_session *s, const Gpubuf__Response *resp, int fd) {
    if (resp->status < 0)
        gd_metrics_error(&s->ctx->metrics, s->cur_type, resp->status);
    bool trace = gpubuf_trace_on() && resp->id;
    if (trace) {
        gpubuf_trace(s->holder->id, resp->id, s->cur_type, GPUBUF_TRACE_D_HANDLED, 0);
        gpubuf_trace_set_tag(s->holder->id, resp->id, s->cur_type);
    }
    int r = s->io->send(s->conn, gpubuf__response__get_packed_size(resp), pack_response, resp, fd);
    if (trace)
        gpubuf_trace_set_tag(0, 0, -1);
    if (r == -EAGAIN && resp->status >= 0) {
        Gpubuf__Response e = GPUBUF__RESPONSE__INIT;
        e.id = resp->id;
        e.status = -EAGAIN;
        e.message = "the daemon's reply memory is full (max_reply_memory); retry later";
        send_response(s, &e, -1);
    }
}

/* Close the connection, for why (the first reason counts). */
static void session_close(gd_session *s, gd_end_reason why) {
    if (s->end == GD_END_NONE)
        s->end = why;
    s->io->close(s->conn);
}

static void reply_error(gd_session *s, uint64_t id, int status, const char *msg) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    resp.id = id;
    resp.status = status;
    resp.message = (char *)(msg ? msg : gpubuf_strerror(status));
    send_response(s, &resp, -1);
}

/* Storage for one Buffer message and its Slab. */
typedef struct buffer_msg {
    Gpubuf__Buffer buf;
    Gpubuf__Slab slab;
    Gpubuf__ArrayLayout layout;
} buffer_msg;

/* b's layout, user bytes and lease into m (pointing into b). */
static void fill_meta(buffer_msg *m, const gd_buf *b, uint64_t now_ns) {
    const gd_meta *me = b->meta;
    if (me && me->has_layout) {
        gpubuf__array_layout__init(&m->layout);
        m->layout.dtype_code = me->dtype.code;
        m->layout.dtype_bits = me->dtype.bits;
        m->layout.dtype_lanes = me->dtype.lanes;
        m->layout.n_shape = me->ndim;
        m->layout.shape = (int64_t *)me->dims;
        if (me->has_strides) {
            m->layout.n_strides = me->ndim;
            m->layout.strides = (int64_t *)me->dims + me->ndim;
        }
        m->layout.byte_offset = me->byte_offset;
        m->buf.layout = &m->layout;
    }
    size_t len;
    const uint8_t *user = gd_meta_user(b, &len);
    m->buf.user_data.data = (uint8_t *)user;
    m->buf.user_data.len = len;
    m->buf.lease_left_ms = gd_registry_lease_left_ms(b, now_ns);
    m->buf.lease_ttl_ms = b->lease_slot ? b->lease_ttl_ms : 0;
}

/* How to map b's slab: its description, with the IPC handle if it has one. */
static void fill_slab(Gpubuf__Slab *m, const gd_buf *b) {
    gd_slab *sl = b->blk.slab;
    gd_backend *be = b->pool->be;
    gpubuf__slab__init(m);
    m->slab_id = sl->id;
    m->kind = (Gpubuf__PoolKind)be->kind;
    m->device = be->device;
    m->size = sl->size;
    if (be->has_uuid) {
        m->device_uuid.data = be->uuid;
        m->device_uuid.len = 16;
    }
    if (sl->exp.has_ipc_handle) {
        m->ipc_handle.data = sl->exp.ipc_handle;
        m->ipc_handle.len = GPUBUF_IPC_HANDLE_SIZE;
    }
}

/* May this session keep b's slab mapped after its last view (not for
 * read-only mappings: the daemon pins slabs, not modes)? */
static bool slab_keepable(const gd_session *s, const gd_buf *b, bool ro) {
    return !ro && (s->caps & GPUBUF_CAP_KEEP_MAPPED) && !b->blk.slab->dedicated;
}

static void fill_buffer(buffer_msg *m, const gd_buf *b) {
    gd_slab *sl = b->blk.slab;
    gpubuf__buffer__init(&m->buf);
    fill_slab(&m->slab, b);
    m->buf.buffer_id = b->id;
    m->buf.name = b->name ? b->name : (char *)"";
    m->buf.pool = b->pool->name;
    m->buf.size = b->size;
    m->buf.offset = b->blk.offset;
    m->buf.state = (Gpubuf__BufferState)b->state;
    m->buf.refs = b->refs;
    m->buf.owner_uid = b->owner_uid;
    m->buf.slab_id = sl->id;
    m->buf.restored = b->restored;
    m->buf.slab = &m->slab;
    if (b->meta || b->lease_slot)
        fill_meta(m, b, gpubuf_now_ns());
}

/* Does the client map b's slab in mode ro already, apart from the reference
 * just taken (GPUBUF_CAP_SLAB_ONCE)? Then the reply needs no fd or handle. */
static bool client_maps(gd_session *s, const gd_buf *b, bool ro) {
    return (s->caps & GPUBUF_CAP_SLAB_ONCE) && gd_registry_slab_mapped(s->holder, b, ro);
}

/* Reply with a buffer. map_fd (alloc and open, which take a reference): how
 * to map it, the slab's fd or IPC handle unless the client maps the slab
 * already, and the seal event. Otherwise (seal, stat) no handle: nothing is
 * handed out without a reference. ro: a read-only open, whose fd is ro_fd. */
static void reply_buffer_mode(gd_session *s, uint64_t id, const gd_buf *b, bool map_fd, bool ro,
                              int ro_fd) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    buffer_msg m;
    bool send_map = map_fd && !client_maps(s, b, ro);
    fill_buffer(&m, b);
    if (!send_map) {
        m.slab.ipc_handle.len = 0;
        m.slab.ipc_handle.data = NULL;
    }
    if (map_fd) {
        const uint8_t *ev = gd_registry_event(&s->ctx->reg, b);
        if (ev) {
            m.buf.event_handle.data = (uint8_t *)ev;
            m.buf.event_handle.len = GD_EVENT_HANDLE_SIZE;
        }
    }
    m.slab.keepable = map_fd && slab_keepable(s, b, ro);
    m.slab.read_only = ro;
    m.buf.read_only = ro;
    if (map_fd)
        gd_metrics_handed(&s->ctx->metrics, s->holder, b);
    int fd = send_map ? (ro ? ro_fd : b->blk.slab->exp.fd) : -1;
    resp.id = id;
    resp.fds = fd >= 0 ? 1 : 0;
    resp.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
    resp.buffer = &m.buf;
    send_response(s, &resp, fd);
}

static void reply_buffer(gd_session *s, uint64_t id, const gd_buf *b, bool map_fd) {
    reply_buffer_mode(s, id, b, map_fd, false, -1);
}

/* Give back the reference an open took (read-only if read_only): its reply
 * could not be made. */
static void open_undo(gd_session *s, const gd_buf *b, bool read_only) {
    uint64_t bid = b->id;
    if (read_only)
        gd_registry_ref_ro(s->holder, bid, false);
    gd_registry_release(&s->ctx->reg, s->holder, bid, NULL);
}

/* Reply to an open that took a reference to b (read-only if read_only, which
 * the registry allowed and marked): a read-only open sends the fd that maps it
 * read-only. Should that fd not be had (out of fds), the reference goes back. */
static void reply_open(gd_session *s, uint64_t id, gd_buf *b, bool read_only) {
    gd_err err = {0};
    int fd = -1, r;
    if (!read_only || client_maps(s, b, true)) {
        reply_buffer_mode(s, id, b, true, read_only, -1);
        return;
    }
    r = gd_backend_export_ro(b->pool->be, &b->blk.slab->exp, &fd, &err);
    if (r < 0) {
        open_undo(s, b, true);
        reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    reply_buffer_mode(s, id, b, true, true, fd);
}

/* A waiting open's late error reply, counted as an open's. */
static void reply_open_error(session_waiter *sw, int status, const char *msg) {
    int saved = sw->s->cur_type;
    sw->s->cur_type = GD_REQ_OPEN;
    reply_error(sw->s, sw->request_id, status, msg);
    sw->s->cur_type = saved;
}

static void waiter_closed(uv_handle_t *h) {
    free(h->data);
}

static void waiter_dispose(session_waiter *sw) {
    assert(sw->s->n_waiters > 0);
    sw->s->n_waiters--;
    if (sw->has_timer) {
        uv_timer_stop(&sw->timer);
        uv_close((uv_handle_t *)&sw->timer, waiter_closed);
    } else {
        free(sw);
    }
}

static void waiter_wake(gd_waiter *w, gd_buf *b) {
    session_waiter *sw = (session_waiter *)w;
    reply_open(sw->s, sw->request_id, b, w->read_only);
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

/* Why session sid cannot be resumed by s (old: the holder of that id, if
 * any), as a clause for the client's message. */
static void refusal(const gd_session *s, const gd_holder *old, uint64_t sid, char *why,
                    size_t len) {
    if (old && old->detached)
        snprintf(why, len, "session %llu belongs to another process",
                 (unsigned long long)sid);
    else if (old)
        snprintf(why, len, "session %llu is in use by another connection",
                 (unsigned long long)sid);
    else if (!s->ctx->restarts)
        snprintf(why, len, "gpubufd started without saved state");
    else
        snprintf(why, len, "session %llu is not in gpubufd's saved state: it was released "
                           "after resume_timeout_ms, or ended before the restart",
                 (unsigned long long)sid);
}

/* Hello with resume_session: take up the restored (detached) session of
 * this very process (same pid and uid), keeping the references the client
 * says its views hold. *ret_lost: the held buffers the session no longer
 * has. False when there is no such session (the client starts afresh):
 * why says why. */
static bool resume(gd_session *s, const Gpubuf__Hello *h, uint64_t **ret_lost, size_t *ret_n,
                   char *why, size_t why_len) {
    gd_registry *reg = &s->ctx->reg;
    gd_holder *old;
    uint64_t sid = h->resume_session;
    size_t n = 0;
    HASH_FIND(hh, reg->holders, &sid, sizeof(sid), old);
    if (!old || !old->detached || old->pid != s->pid || old->uid != s->uid) {
        refusal(s, old, sid, why, why_len);
        LOG_INFO("pid %d: no session %llu to resume (%s)", (int)s->pid,
                 (unsigned long long)sid, why);
        return false;
    }
    gd_held *held = calloc(h->n_held + 1, sizeof(*held));
    uint64_t *lost = calloc(h->n_held + 1, sizeof(*lost));
    if (!held || !lost) {
        free(held);
        free(lost);
        snprintf(why, why_len, "gpubufd is out of memory");
        return false;
    }
    for (size_t i = 0; i < h->n_held; i++) {
        held[n].buffer_id = h->held[i]->buffer_id;
        held[n].count = h->held[i]->count;
        held[n++].ro = h->held[i]->read_only;
    }
    qsort(held, n, sizeof(*held), gd_held_cmp);
    /* An id named twice counts once, with the larger claim. */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (k && held[k - 1].buffer_id == held[i].buffer_id) {
            if (held[i].count > held[k - 1].count)
                held[k - 1] = held[i];
        } else {
            held[k++] = held[i];
        }
    }
    gd_registry_holder_drop(reg, s->holder); /* the fresh one: empty */
    s->holder = old;
    *ret_n = gd_registry_resume(reg, old, held, k, lost);
    *ret_lost = lost;
    LOG_INFO("session %llu (pid %d) resumed: %u reference(s) kept, %zu buffer(s) lost",
             (unsigned long long)sid, (int)s->pid, old->n_refs, *ret_n);
    free(held);
    return true;
}

static void do_hello(gd_session *s, uint64_t id, const Gpubuf__Hello *h) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__HelloReply hr = GPUBUF__HELLO_REPLY__INIT;
    if (s->hello_done) {
        reply_error(s, id, GPUBUF_EPROTOCOL, "hello sent twice");
        return;
    }
    if (h->min_version > GPUBUF_PROTOCOL_VERSION || h->max_version < GPUBUF_PROTOCOL_VERSION) {
        char msg[128];
        snprintf(msg, sizeof(msg), "client speaks versions %u..%u, daemon speaks %u",
                 h->min_version, h->max_version, GPUBUF_PROTOCOL_VERSION);
        reply_error(s, id, GPUBUF_EVERSION, msg);
        session_close(s, GD_END_PROTOCOL);
        return;
    }
    s->hello_done = true;
    s->io->ready(s->conn);
    /* Shown by gpubufctl and in the log: printable UTF-8, cut on a character. */
    const char *cn = h->client_name ? h->client_name : "";
    gpubuf_text_clean(s->name, sizeof(s->name), cn, strlen(cn));
    uint64_t *lost = NULL;
    char why[160] = "";
    if (h->resume_session) {
        hr.resumed = resume(s, h, &lost, &hr.n_lost, why, sizeof(why));
        hr.lost = lost;
        hr.references_kept = hr.resumed ? s->holder->n_refs : 0;
        hr.resume_refused = why;
    }
    hr.restarts = s->ctx->restarts;
    hr.version = GPUBUF_PROTOCOL_VERSION;
    hr.server = (char *)GPUBUF_SERVER_STRING;
    hr.session_id = s->holder->id;
    hr.max_request = s->ctx->limits.max_request;
    hr.max_response = GPUBUF_WIRE_MAX_RESPONSE;
    if ((h->capabilities & GPUBUF_CAP_KEEP_MAPPED) && s->ctx->reg.quota.kept_slabs_per_client) {
        s->caps |= GPUBUF_CAP_KEEP_MAPPED;
        s->holder->kept_cap = s->ctx->reg.quota.kept_slabs_per_client;
        hr.max_kept_slabs = s->holder->kept_cap;
    }
    s->caps |= h->capabilities & GPUBUF_CAP_SLAB_ONCE;
    hr.capabilities = s->caps;
    hr.max_batch_items = GD_BATCH_MAX_ITEMS;
    hr.max_batch_slabs = GD_BATCH_REPLY_FDS;
    resp.id = id;
    resp.body_case = GPUBUF__RESPONSE__BODY_HELLO;
    resp.hello = &hr;
    send_response(s, &resp, -1);
    free(lost);
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

/* Allocate one buffer from pool (alloc and batch alloc); failures the
 * operator should see are logged. */
static int alloc_one(gd_session *s, gd_pool *pool, uint64_t size, uint32_t alignment,
                     const char *name, const gd_meta_args *meta, gd_buf **ret, gd_err *err) {
    int r = gd_registry_alloc_meta(&s->ctx->reg, s->holder, pool, size, alignment, name, meta,
                                   ret, err);
    if (r < 0 && r != -EEXIST && r != -EACCES && r != -EPERM && r != GPUBUF_ENOPOOL)
        LOG_LIMITED(GPUBUF_LOG_INFO, "pid %d: alloc %llu bytes from '%s': %s", (int)s->pid,
                    (unsigned long long)size, pool->name, gd_err_msg(err, r));
    return r;
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
        r = alloc_one(s, pool, a->size, a->alignment, a->name, &meta, &b, &err);
    if (r < 0) {
        reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    if (b->lease_slot)
        gd_context_leases_arm(s->ctx);
    reply_buffer(s, id, b, true);
}

static void do_seal(gd_session *s, uint64_t id, const Gpubuf__SealRequest *q) {
    gd_err err = {0};
    gd_buf *b;
    if (q->event_handle.len != 0 && q->event_handle.len != GD_EVENT_HANDLE_SIZE) {
        reply_error(s, id, -EINVAL, "a seal event handle has 64 bytes (CUipcEventHandle)");
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
        reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    if (b->lease_slot)
        gd_context_leases_arm(s->ctx);
    /* Waiters woken by the seal may have been this very session; b is alive
     * since the sealer holds a reference. The sealer mapped the buffer when
     * it allocated it: the reply carries no handle. */
    reply_buffer(s, id, b, false);
}

/* The target of an open, stat or delete: a name or id, the pool the
 * request names (empty: none) and the owner it expects. 0, or an error
 * (GPUBUF_ENOPOOL) with its sentence in err. */
static int request_target(gd_session *s, bool by_name, const char *name, uint64_t bid,
                          const char *pool, bool has_owner, uint32_t owner_uid, gd_target *t,
                          gd_err *err) {
    memset(t, 0, sizeof(*t));
    if (by_name)
        t->name = name;
    else
        t->id = bid;
    t->has_owner = has_owner;
    t->owner_uid = owner_uid;
    if (pool && *pool)
        return gd_context_pool(s->ctx, pool, &t->pool, err);
    return 0;
}

/* Reply with err; a name not found in its pool says which other pool the
 * client may use has it. */
static void reply_target_error(gd_session *s, uint64_t id, const gd_target *t, int r,
                               gd_err *err) {
    if (r == -ENOENT && t->name)
        gd_registry_hint_pools(&s->ctx->reg, s->holder, s->ctx->pools, s->ctx->n_pools, t->pool,
                               t->name, err);
    reply_error(s, id, r, gd_err_msg(err, r));
}

static void do_open(gd_session *s, uint64_t id, const Gpubuf__OpenRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    gd_err err = {0};
    gd_target t;
    bool waitable = false;
    gd_buf *b;
    int r;
    if (q->target_case != GPUBUF__OPEN_REQUEST__TARGET_NAME &&
        q->target_case != GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID) {
        reply_error(s, id, -EINVAL, "open needs a name or a buffer id");
        return;
    }
    r = request_target(s, q->target_case == GPUBUF__OPEN_REQUEST__TARGET_NAME, q->name,
                       q->buffer_id, q->pool, q->owner != NULL, q->owner ? q->owner->uid : 0, &t, &err);
    if (r == 0)
        r = gd_registry_open_target(reg, s->holder, &t, q->read_only, &b, &waitable, &err);
    if (r == 0) {
        reply_open(s, id, b, q->read_only);
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
        reply_error(s, id, -EAGAIN, "too many pending opens on this connection");
        return;
    }
    session_waiter *sw = calloc(1, sizeof(*sw));
    if (!sw || (name && !(sw->w.name = strdup(name)))) {
        free(sw);
        reply_error(s, id, -ENOMEM, "out of memory");
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
            reply_error(s, id, r, uv_strerror(r));
            return;
        }
        sw->timer.data = sw;
        sw->has_timer = true;
        r = uv_timer_start(&sw->timer, waiter_timeout, (uint64_t)q->timeout_ms, 0);
        assert(r == 0);
    }
    s->n_waiters++;
    gd_registry_wait(reg, &sw->w);
}

/* Release one reference (release and batch release). */
static int release_one(gd_session *s, uint64_t bid, bool keep, bool read_only, gd_err *err) {
    if (read_only)
        gd_registry_ref_ro(s->holder, bid, false);
    if (keep && !(s->caps & GPUBUF_CAP_KEEP_MAPPED)) {
        /* Still release: the reference is not the client's to keep. */
        gd_registry_release(&s->ctx->reg, s->holder, bid, NULL);
        return gd_err_set(err, GPUBUF_EPROTOCOL, "keep_mapped without the KEEP_MAPPED capability");
    }
    return gd_registry_release_keep(&s->ctx->reg, s->holder, bid, keep, err);
}

static void do_release(gd_session *s, uint64_t id, const Gpubuf__ReleaseRequest *q) {
    gd_err err = {0};
    int r = release_one(s, q->buffer_id, q->keep_mapped, q->read_only, &err);
    reply_error(s, id, r, r < 0 ? gd_err_msg(&err, r) : "");
}

static void do_unmap(gd_session *s, uint64_t id, const Gpubuf__UnmapRequest *q) {
    gd_err err = {0};
    int r = gd_registry_unmap(&s->ctx->reg, s->holder, q->slab_id, &err);
    reply_error(s, id, r, r < 0 ? gd_err_msg(&err, r) : "");
}

static void do_delete(gd_session *s, uint64_t id, const Gpubuf__DeleteRequest *q) {
    gd_err err = {0};
    gd_target t;
    int r;
    if (q->target_case != GPUBUF__DELETE_REQUEST__TARGET_NAME &&
        q->target_case != GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID) {
        reply_error(s, id, -EINVAL, "delete needs a name or a buffer id");
        return;
    }
    r = request_target(s, q->target_case == GPUBUF__DELETE_REQUEST__TARGET_NAME, q->name,
                       q->buffer_id, q->pool, q->owner != NULL, q->owner ? q->owner->uid : 0, &t, &err);
    if (r == 0)
        r = gd_registry_delete_target(&s->ctx->reg, s->holder, &t, &err);
    if (r < 0) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    reply_error(s, id, 0, "");
}

static void do_stat(gd_session *s, uint64_t id, const Gpubuf__StatRequest *q) {
    gd_buf *b = NULL;
    gd_err err = {0};
    gd_target t;
    int r;
    if (q->target_case != GPUBUF__STAT_REQUEST__TARGET_NAME &&
        q->target_case != GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID) {
        reply_error(s, id, -EINVAL, "stat needs a name or a buffer id");
        return;
    }
    r = request_target(s, q->target_case == GPUBUF__STAT_REQUEST__TARGET_NAME, q->name,
                       q->buffer_id, q->pool, q->owner != NULL, q->owner ? q->owner->uid : 0, &t, &err);
    if (r == 0)
        r = gd_registry_stat(&s->ctx->reg, &t, &b, &err);
    if (r < 0) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    /* Like status, stat takes no reference and so hands out no handle. */
    reply_buffer(s, id, b, false);
}

/* The metadata columns (BufferColumns 10 to 14) for n buffers, each only
 * when some buffer has what it describes: a registry without metadata sends
 * none. false when out of memory. */
static bool meta_columns_alloc(const gd_registry *reg, Gpubuf__BufferColumns *c, size_t n) {
    if (reg->n_layouts) {
        c->dtype = malloc((n + 1) * sizeof(*c->dtype));
        c->ndim = malloc((n + 1) * sizeof(*c->ndim));
        c->shape = malloc((reg->layout_dims + 1) * sizeof(*c->shape));
        if (!c->dtype || !c->ndim || !c->shape)
            return false;
    }
    if (reg->n_user_meta && !(c->user_bytes = malloc((n + 1) * sizeof(*c->user_bytes))))
        return false;
    if (reg->n_leases && !(c->lease_left_ms = malloc((n + 1) * sizeof(*c->lease_left_ms))))
        return false;
    return true;
}

/* Element i of the metadata columns: buffer b's (now: gpubuf_now_ns()). */
static void meta_columns_put(const gd_registry *reg, Gpubuf__BufferColumns *c, size_t i,
                             const gd_buf *b, uint64_t now) {
    const gd_meta *m = b->meta;
    bool lay = m && m->has_layout;
    if (c->dtype) {
        c->dtype[i] = lay ? m->dtype.code | (uint32_t)m->dtype.bits << 8 |
                                (uint32_t)m->dtype.lanes << 16
                          : 0;
        c->ndim[i] = lay ? m->ndim + 1u : 0;
        for (uint32_t k = 0; lay && k < m->ndim && c->n_shape < reg->layout_dims; k++)
            c->shape[c->n_shape++] = m->dims[k];
        c->n_dtype = c->n_ndim = i + 1;
    }
    if (c->user_bytes) {
        c->user_bytes[i] = m ? m->user_len : 0;
        c->n_user_bytes = i + 1;
    }
    if (c->lease_left_ms) {
        c->lease_left_ms[i] = gd_registry_lease_left_ms(b, now);
        c->n_lease_left_ms = i + 1;
    }
}

/* The buffers as columns: n entries in each array, names NUL-separated.
 * Returns false when out of memory. The arrays are freed by columns_free. */
static bool fill_columns(const gd_context *ctx, Gpubuf__BufferColumns *c) {
    const gd_registry *reg = &ctx->reg;
    size_t n = reg->n_buffers, names = 0, i = 0;
    uint64_t now = gpubuf_now_ns();
    for (gd_buf *b = reg->by_id; b; b = b->hh_id.next)
        names += (b->name ? strlen(b->name) : 0) + 1;
    gpubuf__buffer_columns__init(c);
    c->id = malloc((n + 1) * sizeof(*c->id));
    c->size = malloc((n + 1) * sizeof(*c->size));
    c->offset = malloc((n + 1) * sizeof(*c->offset));
    c->slab_id = malloc((n + 1) * sizeof(*c->slab_id));
    c->pool = malloc((n + 1) * sizeof(*c->pool));
    c->state = malloc((n + 1) * sizeof(*c->state));
    c->refs = malloc((n + 1) * sizeof(*c->refs));
    c->owner_uid = malloc((n + 1) * sizeof(*c->owner_uid));
    c->names.data = malloc(names + 1);
    /* Only after a restart: a column of false says nothing. */
    if (ctx->restarts)
        c->restored = malloc((n + 1) * sizeof(*c->restored));
    if (!c->id || !c->size || !c->offset || !c->slab_id || !c->pool || !c->state || !c->refs ||
        !c->owner_uid || !c->names.data || (ctx->restarts && !c->restored) ||
        !meta_columns_alloc(reg, c, n))
        return false;
    uint8_t *np = c->names.data;
    for (gd_buf *b = reg->by_id; b && i < n; b = b->hh_id.next, i++) {
        size_t len = b->name ? strlen(b->name) : 0;
        memcpy(np, b->name ? b->name : "", len + 1);
        np += len + 1;
        c->id[i] = b->id;
        c->size[i] = b->size;
        c->offset[i] = b->blk.offset;
        c->slab_id[i] = b->blk.slab->id;
        c->state[i] = (uint32_t)b->state;
        c->refs[i] = b->refs;
        c->owner_uid[i] = b->owner_uid;
        if (c->restored)
            c->restored[i] = b->restored;
        c->pool[i] = 0;
        for (int p = 0; p < ctx->n_pools; p++)
            if (ctx->pools[p] == b->pool) {
                c->pool[i] = (uint32_t)p;
                break;
            }
        meta_columns_put(reg, c, i, b, now);
    }
    c->names.len = (size_t)(np - c->names.data);
    c->n_id = c->n_size = c->n_offset = c->n_slab_id = c->n_pool = c->n_state = c->n_refs =
        c->n_owner_uid = i;
    c->n_restored = c->restored ? i : 0;
    return true;
}

static void columns_free(Gpubuf__BufferColumns *c) {
    free(c->id);
    free(c->size);
    free(c->offset);
    free(c->slab_id);
    free(c->pool);
    free(c->state);
    free(c->refs);
    free(c->owner_uid);
    free(c->restored);
    free(c->names.data);
    free(c->dtype);
    free(c->ndim);
    free(c->shape);
    free(c->user_bytes);
    free(c->lease_left_ms);
}

/* A Counters message and everything it points to, in one block: no
 * allocation per element. */
typedef struct counters_msg {
    Gpubuf__Counters c;
    Gpubuf__RequestCounters rq[GD_REQ_TYPES];
    Gpubuf__RequestCounters *prq[GD_REQ_TYPES];
    Gpubuf__ErrorCounter er[GD_METRICS_MAX_CODES];
    Gpubuf__ErrorCounter *per[GD_METRICS_MAX_CODES];
    Gpubuf__PoolCounters pc[GPUBUF_MAX_POOLS];
    Gpubuf__PoolCounters *ppc[GPUBUF_MAX_POOLS];
    Gpubuf__NamedCounter refused[GD_REFUSALS], *prefused[GD_REFUSALS];
    Gpubuf__NamedCounter ended[GD_END_REASONS], *pended[GD_END_REASONS];
} counters_msg;

/* The context's counters and its pools' as a Counters message; strings
 * point at static names and pool names, arrays into ctx and o. */
static void fill_counters(gd_context *ctx, counters_msg *o) {
    const gd_metrics *m = &ctx->metrics;
    Gpubuf__Counters *c = &o->c;
    size_t n = 0;
    gpubuf__counters__init(c);
    for (int t = 0; t < GD_REQ_TYPES; t++) {
        /* "other" and the batches are left out while nothing of that type came. */
        if (t >= GD_REQ_OTHER && m->req[t].requests == 0)
            continue;
        Gpubuf__RequestCounters *r = &o->rq[n];
        gpubuf__request_counters__init(r);
        r->type = (char *)gd_metrics_type_names[t];
        r->requests = m->req[t].requests;
        r->errors = m->req[t].errors;
        r->duration_ns = m->req[t].duration_ns;
        r->n_duration_buckets = GD_LATENCY_BOUNDS + 1;
        r->duration_buckets = (uint64_t *)m->req[t].buckets;
        o->prq[n++] = r;
    }
    c->n_requests = n;
    c->requests = o->prq;
    c->n_bucket_bounds = GD_LATENCY_BOUNDS;
    c->bucket_bounds = (double *)gd_metrics_bounds;
    for (uint32_t i = 0; i < m->n_codes; i++) {
        gpubuf__error_counter__init(&o->er[i]);
        o->er[i].code = m->errors[i].code;
        o->er[i].count = m->errors[i].count;
        o->per[i] = &o->er[i];
    }
    c->n_errors = m->n_codes;
    c->errors = o->per;
    for (int i = 0; i < ctx->n_pools; i++) {
        const gd_pool *p = ctx->pools[i];
        Gpubuf__PoolCounters *x = &o->pc[i];
        gpubuf__pool_counters__init(x);
        x->pool = p->name;
        x->bytes_allocated = p->stats.bytes_allocated;
        x->bytes_freed = p->stats.bytes_freed;
        x->slabs_created = p->stats.slabs_created;
        x->slabs_destroyed = p->stats.slabs_destroyed;
        x->alloc_failures = p->stats.alloc_failures;
        o->ppc[i] = x;
    }
    c->n_pools = (size_t)ctx->n_pools;
    c->pools = o->ppc;
    for (int i = 0; i < GD_REFUSALS; i++) {
        gpubuf__named_counter__init(&o->refused[i]);
        o->refused[i].name = (char *)gd_metrics_refusal_names[i];
        o->refused[i].count = m->refused[i];
        o->prefused[i] = &o->refused[i];
    }
    c->n_refused = GD_REFUSALS;
    c->refused = o->prefused;
    n = 0;
    for (int i = GD_END_NONE + 1; i < GD_END_REASONS; i++) {
        gpubuf__named_counter__init(&o->ended[n]);
        o->ended[n].name = (char *)gd_metrics_end_names[i];
        o->ended[n].count = m->ended[i];
        o->pended[n] = &o->ended[n];
        n++;
    }
    c->n_disconnects = n;
    c->disconnects = o->pended;
    c->slab_imports = m->slab_imports;
    c->connections = m->connections;
    c->open_timeouts = m->open_timeouts;
}

/* A pool's publish rule as status shows it: "uid 1000, gid 27" ("" when
 * everyone the pool allows may publish; uid 0 always may). */
static void format_publishers(const gd_pool *p, char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < p->n_publish_uids + p->n_publish_gids && len < n; i++) {
        bool gid = i >= p->n_publish_uids;
        uint32_t v = gid ? p->publish_gids[i - p->n_publish_uids] : p->publish_uids[i];
        len += (size_t)snprintf(out + len, n - len, "%s%s %u", i ? ", " : "", gid ? "gid" : "uid",
                                (unsigned)v);
    }
}

#define PUBLISHERS_TEXT 1024 /* 64 entries of at most 16 bytes */

static void do_status(gd_session *s, uint64_t id, const Gpubuf__StatusRequest *q) {
    gd_context *ctx = s->ctx;
    gd_registry *reg = &ctx->reg;
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__StatusReply st = GPUBUF__STATUS_REPLY__INIT;
    Gpubuf__PoolStatus *pools = calloc((size_t)ctx->n_pools + 1, sizeof(*pools));
    Gpubuf__PoolStatus **ppools = calloc((size_t)ctx->n_pools + 1, sizeof(*ppools));
    bool columnar = q && q->columnar;
    Gpubuf__BufferColumns cols = GPUBUF__BUFFER_COLUMNS__INIT;
    size_t nrows = columnar ? 0 : (size_t)reg->n_buffers;
    buffer_msg *bufs = calloc(nrows + 1, sizeof(*bufs));
    Gpubuf__Buffer **pbufs = calloc(nrows + 1, sizeof(*pbufs));
    size_t n_cl = (size_t)ctx->n_sessions + reg->n_detached;
    Gpubuf__ClientStatus *cl = calloc(n_cl + 1, sizeof(*cl));
    Gpubuf__ClientStatus **pcl = calloc(n_cl + 1, sizeof(*pcl));
    counters_msg *counters = malloc(sizeof(*counters));
    char(*pubs)[PUBLISHERS_TEXT] = calloc((size_t)ctx->n_pools + 1, sizeof(*pubs));
    Gpubuf__BatchCounters bc[GD_BATCH_TYPES], *pbc[GD_BATCH_TYPES];
    size_t i = 0;
    if (!pools || !ppools || !bufs || !pbufs || !cl || !pcl || !counters || !pubs ||
        (columnar && !fill_columns(ctx, &cols))) {
        reply_error(s, id, -ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < ctx->n_pools; p++) {
        gd_pool *pool = ctx->pools[p];
        gpubuf__pool_status__init(&pools[p]);
        pools[p].name = pool->name;
        pools[p].kind = (Gpubuf__PoolKind)pool->be->kind;
        pools[p].device = pool->be->device;
        if (pool->be->has_uuid) {
            pools[p].device_uuid.data = pool->be->uuid;
            pools[p].device_uuid.len = 16;
        }
        pools[p].capacity = pool->capacity;
        pools[p].used = pool->used;
        pools[p].reserved = pool->reserved;
        pools[p].slabs = pool->n_slabs;
        pools[p].slab_size = pool->slab_size;
        pools[p].buffers = pool->n_blocks;
        pools[p].default_pool = pool == reg->default_pool;
        format_publishers(pool, pubs[p], sizeof(pubs[p]));
        pools[p].publishers = pubs[p];
        ppools[p] = &pools[p];
    }
    st.n_pools = (size_t)ctx->n_pools;
    st.pools = ppools;
    if (columnar)
        st.buffer_columns = &cols;
    for (gd_buf *b = reg->by_id; b && i < nrows; b = b->hh_id.next, i++) {
        fill_buffer(&bufs[i], b);
        /* No slab message: status hands out no handles, and 100k nested
         * messages would double the cost of packing and unpacking. */
        bufs[i].buf.slab = NULL;
        pbufs[i] = &bufs[i].buf;
    }
    st.n_buffers = i;
    st.buffers = pbufs;
    i = 0;
    gd_session *x;
    DL_FOREACH(ctx->sessions, x) {
        if (x->io->closing(x->conn) || !x->holder)
            continue;
        gpubuf__client_status__init(&cl[i]);
        cl[i].session_id = x->holder->id;
        cl[i].pid = x->pid;
        cl[i].uid = x->uid;
        cl[i].gid = x->gid;
        cl[i].references = x->holder->n_refs;
        cl[i].buffers_held = HASH_CNT(hh, x->holder->refs);
        cl[i].kept_slabs = x->holder->n_kept;
        cl[i].waiting_opens = x->n_waiters;
        cl[i].read_only_references = x->holder->n_ro_refs;
        cl[i].name = x->name;
        pcl[i] = &cl[i];
        i++;
    }
    /* Restored sessions whose clients have not come back yet. */
    for (gd_holder *h = reg->holders; h && reg->n_detached && i < n_cl; h = h->hh.next) {
        if (!h->detached)
            continue;
        gpubuf__client_status__init(&cl[i]);
        cl[i].session_id = h->id;
        cl[i].pid = h->pid;
        cl[i].uid = h->uid;
        cl[i].gid = h->gid;
        cl[i].references = h->n_refs;
        cl[i].buffers_held = HASH_CNT(hh, h->refs);
        cl[i].read_only_references = h->n_ro_refs;
        cl[i].name = (char *)"";
        cl[i].detached = true;
        pcl[i] = &cl[i];
        i++;
    }
    st.n_clients = i;
    st.restarts = ctx->restarts;
    st.restored_buffers = ctx->restored_buffers;
    st.clients = pcl;
    fill_counters(ctx, counters);
    st.counters = &counters->c;
    Gpubuf__LeaseStatus leases = GPUBUF__LEASE_STATUS__INIT;
    leases.active = reg->n_leases;
    leases.expired = reg->leases_expired;
    leases.renewed = reg->leases_renewed;
    leases.max_ttl_ms = reg->quota.max_lease_ms ? reg->quota.max_lease_ms : UINT32_MAX;
    st.leases = &leases;
    for (int t = 0; t < GD_BATCH_TYPES; t++) {
        gpubuf__batch_counters__init(&bc[t]);
        bc[t].type = (char *)gd_metrics_type_names[GD_REQ_BATCH_OPEN + t];
        bc[t].items = ctx->metrics.batch[t].items;
        bc[t].item_errors = ctx->metrics.batch[t].item_errors;
        pbc[t] = &bc[t];
    }
    st.n_batches = GD_BATCH_TYPES;
    st.batches = pbc;
    st.uptime_ms = (gpubuf_now_ns() - ctx->started_ns) / 1000000u;
    st.version = (char *)GPUBUF_VERSION_STRING;
    resp.id = id;
    resp.body_case = GPUBUF__RESPONSE__BODY_STATUS_REPLY;
    resp.status_reply = &st;
    send_response(s, &resp, -1);
out:
    columns_free(&cols);
    free(pools);
    free(ppools);
    free(bufs);
    free(pbufs);
    free(cl);
    free(pcl);
    free(counters);
    free(pubs);
}

/* gpubufd --takeover asks for everything: the daemon's own uid or root. */
static void do_takeover(gd_session *s, uint64_t id, const Gpubuf__TakeoverRequest *q) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    gd_err err = {0};
    int r;
    if (s->uid != 0 && s->uid != geteuid()) {
        reply_error(s, id, -EPERM, "only gpubufd's own uid or root may take it over");
        return;
    }
    if (!q->path || !q->path[0] || q->path[0] != '/') {
        reply_error(s, id, -EINVAL, "takeover needs the absolute path of a socket");
        return;
    }
    if (!s->ctx->takeover) {
        reply_error(s, id, -EOPNOTSUPP, "this gpubufd cannot be taken over");
        return;
    }
    if ((r = s->ctx->takeover(s->ctx, s->pid, q->path, &err)) < 0) {
        reply_error(s, id, r, gd_err_msg(&err, r));
        return;
    }
    LOG_NOTICE("pid %d takes gpubufd over (socket %s)", (int)s->pid, q->path);
    resp.id = id;
    send_response(s, &resp, -1);
}

static void do_renew(gd_session *s, uint64_t id, const Gpubuf__RenewRequest *q) {
    gd_err err = {0};
    gd_target t;
    gd_buf *b;
    if (q->target_case != GPUBUF__RENEW_REQUEST__TARGET_NAME &&
        q->target_case != GPUBUF__RENEW_REQUEST__TARGET_BUFFER_ID) {
        reply_error(s, id, -EINVAL, "renew needs a name or a buffer id");
        return;
    }
    int r = request_target(s, q->target_case == GPUBUF__RENEW_REQUEST__TARGET_NAME, q->name,
                           q->buffer_id, q->pool, false, 0, &t, &err);
    if (r == 0)
        r = gd_registry_renew(&s->ctx->reg, s->holder, &t, q->ttl_ms, &b, &err);
    if (r < 0) {
        reply_target_error(s, id, &t, r, &err);
        return;
    }
    gd_context_leases_arm(s->ctx);
    /* Like stat: no reference taken, no handle handed out. */
    reply_buffer(s, id, b, false);
}

/* ---- Batches: many items in one request, one reply with a result per item
 * (docs/protocol.md, "Batches"). Each item runs the single request's code
 * path; a failed item changes nothing and the others go on. */

/* One batch reply being built: element i of each array is item i. */
typedef struct batch {
    gd_session *s;
    gd_req_type type;
    size_t n;               /* items */
    bool buffers;           /* open, alloc: the items' buffers are described */
    bool read_only;         /* open: read-only references and mappings */
    int32_t *status;
    uint64_t *ids, *sizes, *offsets, *slab_ids;
    uint32_t *states;
    uint8_t *names;         /* NUL-terminated names, back to back */
    size_t names_len, names_cap;
    Gpubuf__BatchItemError *errs;
    Gpubuf__BatchItemError **perrs;
    size_t n_errs;
    uint32_t *ev_items;
    uint8_t *events;        /* GD_EVENT_HANDLE_SIZE per entry of ev_items */
    size_t n_ev;
    uint64_t *mapped;       /* the client's mapped slabs, sorted */
    size_t n_mapped;
    Gpubuf__Slab slabs[GD_BATCH_REPLY_FDS];
    Gpubuf__Slab *pslabs[GD_BATCH_REPLY_FDS];
    int fds[GD_BATCH_REPLY_FDS];
    unsigned n_slabs, n_fds, max_slabs;
} batch;

static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void batch_free(batch *bt) {
    for (size_t i = 0; i < bt->n_errs; i++)
        free(bt->errs[i].message);
    free(bt->ids); /* the block of the per-item arrays */
    free(bt->names);
    free(bt->errs);
    free(bt->perrs);
    free(bt->events);
    free(bt->mapped);
}

/* Start a batch of n items; false (and an error reply) when it is refused
 * whole: too many items, or out of memory. */
static bool batch_init(batch *bt, gd_session *s, uint64_t id, gd_req_type type, size_t n,
                       bool buffers, const uint64_t *mapped, size_t n_mapped) {
    memset(bt, 0, sizeof(*bt));
    bt->s = s;
    bt->type = type;
    bt->n = n;
    bt->buffers = buffers;
    if (n > GD_BATCH_MAX_ITEMS) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "a batch holds at most %u items (HelloReply.max_batch_items); this one has %zu: "
                 "split it",
                 (unsigned)GD_BATCH_MAX_ITEMS, n);
        reply_error(s, id, -E2BIG, msg);
        return false;
    }
    if (n_mapped > GD_BATCH_MAX_ITEMS * 4u) {
        reply_error(s, id, -E2BIG, "a batch lists at most 16384 mapped slabs");
        return false;
    }
    /* One block for the per-item arrays: status, 4 x u64, state, event item. */
    size_t per = sizeof(int32_t) + 4 * sizeof(uint64_t) + 2 * sizeof(uint32_t);
    uint8_t *p = calloc(n + 1, per);
    bt->names_cap = buffers ? (n + 1) * (GPUBUF_NAME_MAX + 1) : 1;
    bt->names = malloc(bt->names_cap);
    bt->errs = calloc(n + 1, sizeof(*bt->errs));
    bt->perrs = calloc(n + 1, sizeof(*bt->perrs));
    bt->mapped = n_mapped ? malloc(n_mapped * sizeof(uint64_t)) : NULL;
    if (!p || !bt->names || !bt->errs || !bt->perrs || (n_mapped && !bt->mapped)) {
        free(p);
        batch_free(bt);
        reply_error(s, id, -ENOMEM, "out of memory");
        return false;
    }
    bt->ids = (uint64_t *)(void *)p;
    bt->sizes = bt->ids + (n + 1);
    bt->offsets = bt->sizes + (n + 1);
    bt->slab_ids = bt->offsets + (n + 1);
    bt->status = (int32_t *)(void *)(bt->slab_ids + (n + 1));
    bt->states = (uint32_t *)(void *)(bt->status + (n + 1));
    bt->ev_items = bt->states + (n + 1);
    if (n_mapped) {
        memcpy(bt->mapped, mapped, n_mapped * sizeof(uint64_t));
        qsort(bt->mapped, n_mapped, sizeof(uint64_t), u64_cmp);
    }
    bt->n_mapped = n_mapped;
    /* Never more fds than the connection's budget has room for. */
    unsigned room = s->io->fd_room ? s->io->fd_room(s->conn) : 1;
    bt->max_slabs = room < GD_BATCH_REPLY_FDS ? (room ? room : 1) : GD_BATCH_REPLY_FDS;
    return true;
}

/* Append an item's name (or "") to the names column (room for the longest
 * name of every item was made at the start). */
static void batch_name(batch *bt, const char *name) {
    size_t len = name ? strlen(name) : 0;
    assert(bt->names_len + len + 1 <= bt->names_cap);
    memcpy(bt->names + bt->names_len, name ? name : "", len);
    bt->names[bt->names_len + len] = 0;
    bt->names_len += len + 1;
}

/* Item i failed with r and err's sentence. */
static void batch_fail(batch *bt, size_t i, int r, const gd_err *err) {
    Gpubuf__BatchItemError *e = &bt->errs[bt->n_errs];
    bt->status[i] = r;
    if (bt->buffers)
        batch_name(bt, "");
    gpubuf__batch_item_error__init(e);
    e->item = (uint32_t)i;
    /* Without memory for the sentence, the code alone says it. */
    if ((e->message = strdup(gd_err_msg(err, r)))) {
        bt->perrs[bt->n_errs] = e;
        bt->n_errs++;
    }
    gd_metrics_error(&bt->s->ctx->metrics, -1, r);
    bt->s->ctx->metrics.batch[bt->type - GD_REQ_BATCH_OPEN].item_errors++;
}

/* Describe b's slab in the reply unless the client maps it already or the
 * reply does: 0, -EAGAIN when the reply has no room for another slab, or
 * the error of making a read-only fd. */
static int batch_slab(batch *bt, gd_buf *b, gd_err *err) {
    gd_slab *sl = b->blk.slab;
    uint64_t sid = sl->id;
    int fd = -1, r;
    if (bt->n_mapped && bsearch(&sid, bt->mapped, bt->n_mapped, sizeof(sid), u64_cmp))
        return 0;
    for (unsigned k = 0; k < bt->n_slabs; k++)
        if (bt->slabs[k].slab_id == sid)
            return 0;
    if (bt->n_slabs >= bt->max_slabs)
        return gd_err_set(err, -EAGAIN,
                          "this reply describes its limit of %u new slabs; send the item again "
                          "(after mapping those)",
                          bt->max_slabs);
    if (bt->read_only) {
        if ((r = gd_backend_export_ro(b->pool->be, &sl->exp, &fd, err)) < 0)
            return r;
    } else {
        fd = sl->exp.fd;
    }
    Gpubuf__Slab *m = &bt->slabs[bt->n_slabs];
    fill_slab(m, b);
    m->keepable = slab_keepable(bt->s, b, bt->read_only);
    m->read_only = bt->read_only;
    bt->pslabs[bt->n_slabs++] = m;
    if (fd >= 0)
        bt->fds[bt->n_fds++] = fd;
    bt->s->ctx->metrics.slab_imports++;
    return 0;
}

/* Item i succeeded; b (NULL for release, seal, delete) is its buffer. */
static void batch_ok(batch *bt, size_t i, const gd_buf *b) {
    bt->status[i] = 0;
    if (!bt->buffers || !b)
        return;
    bt->ids[i] = b->id;
    bt->sizes[i] = b->size;
    bt->offsets[i] = b->blk.offset;
    bt->slab_ids[i] = b->blk.slab->id;
    bt->states[i] = (uint32_t)b->state;
    batch_name(bt, b->name);
}

/* Item i took a reference to b (open, alloc): describe its slab and its seal
 * event. False when the slab does not fit (the caller undoes the item). */
static bool batch_buffer(batch *bt, size_t i, gd_buf *b, gd_err *err, int *ret) {
    int r = batch_slab(bt, b, err);
    if (r < 0) {
        *ret = r;
        return false;
    }
    const uint8_t *ev = gd_registry_event(&bt->s->ctx->reg, b);
    if (ev) {
        if (!bt->events && !(bt->events = malloc((bt->n + 1) * GD_EVENT_HANDLE_SIZE))) {
            *ret = gd_err_set(err, -ENOMEM, "out of memory");
            return false;
        }
        bt->ev_items[bt->n_ev] = (uint32_t)i;
        memcpy(bt->events + bt->n_ev * GD_EVENT_HANDLE_SIZE, ev, GD_EVENT_HANDLE_SIZE);
        bt->n_ev++;
    }
    batch_ok(bt, i, b);
    return true;
}

/* Send the reply and free the batch. */
static void batch_reply_send(batch *bt, uint64_t id) {
    gd_session *s = bt->s;
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__BatchReply br = GPUBUF__BATCH_REPLY__INIT;
    size_t n = bt->n;
    br.n_status = n;
    br.status = bt->status;
    br.n_errors = bt->n_errs;
    br.errors = bt->perrs;
    if (bt->buffers) {
        br.n_buffer_id = br.n_size = br.n_offset = br.n_slab_id = br.n_state = n;
        br.buffer_id = bt->ids;
        br.size = bt->sizes;
        br.offset = bt->offsets;
        br.slab_id = bt->slab_ids;
        br.state = bt->states;
        br.names.data = bt->names;
        br.names.len = bt->names_len;
        br.n_slabs = bt->n_slabs;
        br.slabs = bt->pslabs;
        br.n_event_items = bt->n_ev;
        br.event_items = bt->ev_items;
        br.events.data = bt->events;
        br.events.len = bt->n_ev * GD_EVENT_HANDLE_SIZE;
    }
    s->ctx->metrics.batch[bt->type - GD_REQ_BATCH_OPEN].items += n;
    resp.id = id;
    resp.fds = bt->n_fds;
    resp.body_case = GPUBUF__RESPONSE__BODY_BATCH;
    resp.batch = &br;
    /* At most gd_session_batch_reply_bound(n) bytes, for which the reply
     * memory had room before the batch was handled (gd_session_frame): it
     * is queued whatever the budget says now, so the references its items
     * took always reach the client. */
    size_t len = gpubuf__response__get_packed_size(&resp);
    assert(len <= gd_session_batch_reply_bound(n));
    s->io->send_fds(s->conn, len, pack_response, &resp, bt->fds, (int)bt->n_fds, true);
    batch_free(bt);
}

/* A batch item's target: a name, plain (the default pool) or qualified
 * (/POOL/NAME), or an id (any pool); the same lookup as a single request's. */
static int batch_target(gd_session *s, const char *name, uint64_t bid, gd_target *t,
                        gd_err *err) {
    char pool[GPUBUF_NAME_MAX + 1];
    const char *plain = name;
    if (name) {
        int r = gpubuf_name_split(name, pool, &plain, err->msg, sizeof(err->msg));
        if (r < 0)
            return r;
    }
    return request_target(s, name != NULL, plain, bid, name ? pool : NULL, false, 0, t, err);
}

static void do_batch_open(gd_session *s, uint64_t id, const Gpubuf__BatchOpenRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    batch bt;
    size_t n = q->n_names + q->n_buffer_ids;
    if (!batch_init(&bt, s, id, GD_REQ_BATCH_OPEN, n, true, q->mapped_slabs, q->n_mapped_slabs))
        return;
    bt.read_only = q->read_only;
    for (size_t i = 0; i < n; i++) {
        gd_err err = {0};
        gd_buf *b;
        bool by_name = i < q->n_names;
        gd_target t;
        int r = batch_target(s, by_name ? q->names[i] : NULL,
                             by_name ? 0 : q->buffer_ids[i - q->n_names], &t, &err);
        if (r == 0)
            r = gd_registry_open_target(reg, s->holder, &t, q->read_only, &b, NULL, &err);
        if (r == 0 && !batch_buffer(&bt, i, b, &err, &r))
            open_undo(s, b, q->read_only);
        if (r < 0)
            batch_fail(&bt, i, r, &err);
    }
    batch_reply_send(&bt, id);
}

static void do_batch_release(gd_session *s, uint64_t id, const Gpubuf__BatchReleaseRequest *q) {
    batch bt;
    size_t n = q->n_buffer_ids;
    if ((q->n_keep_mapped && q->n_keep_mapped != n) || (q->n_read_only && q->n_read_only != n)) {
        reply_error(s, id, -EINVAL,
                    "keep_mapped and read_only have no entry or one per buffer id");
        return;
    }
    if (!batch_init(&bt, s, id, GD_REQ_BATCH_RELEASE, n, false, NULL, 0))
        return;
    for (size_t i = 0; i < n; i++) {
        gd_err err = {0};
        int r = release_one(s, q->buffer_ids[i], q->n_keep_mapped && q->keep_mapped[i],
                            q->n_read_only && q->read_only[i], &err);
        if (r < 0)
            batch_fail(&bt, i, r, &err);
        else
            batch_ok(&bt, i, NULL);
    }
    batch_reply_send(&bt, id);
}

static void do_batch_alloc(gd_session *s, uint64_t id, const Gpubuf__BatchAllocRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    gd_err perr = {0};
    gd_pool *pool;
    batch bt;
    size_t n = q->n_sizes;
    if (q->n_names && q->n_names != n) {
        reply_error(s, id, -EINVAL, "names has no entry or one per size");
        return;
    }
    int r = gd_context_pool(s->ctx, q->pool, &pool, &perr);
    if (r < 0) {
        reply_error(s, id, r, gd_err_msg(&perr, r));
        return;
    }
    if (!batch_init(&bt, s, id, GD_REQ_BATCH_ALLOC, n, true, q->mapped_slabs, q->n_mapped_slabs))
        return;
    for (size_t i = 0; i < n; i++) {
        gd_err err = {0};
        gd_buf *b;
        r = alloc_one(s, pool, q->sizes[i], q->alignment, q->n_names ? q->names[i] : NULL, NULL,
                      &b, &err);
        if (r == 0 && q->seal)
            r = gd_registry_seal_event(reg, s->holder, b->id, NULL, &b, &err);
        if (r == 0 && !batch_buffer(&bt, i, b, &err, &r)) {
            /* Not handed out: the buffer goes again. */
            uint64_t bid = b->id;
            gd_registry_delete(reg, s->holder, NULL, bid, NULL);
            gd_registry_release(reg, s->holder, bid, NULL);
        }
        if (r < 0)
            batch_fail(&bt, i, r, &err);
    }
    batch_reply_send(&bt, id);
}

static void do_batch_state(gd_session *s, uint64_t id, const Gpubuf__BatchStateRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    bool seal = q->op == GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_SEAL;
    size_t n = q->n_names + q->n_buffer_ids;
    batch bt;
    if (!seal && q->op != GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_DELETE) {
        reply_error(s, id, -EINVAL, "a batch state request needs op seal or delete");
        return;
    }
    if (seal && q->n_names) {
        reply_error(s, id, -EINVAL, "a batch seal takes buffer ids only");
        return;
    }
    if (!batch_init(&bt, s, id, seal ? GD_REQ_BATCH_SEAL : GD_REQ_BATCH_DELETE, n, false, NULL,
                    0))
        return;
    for (size_t i = 0; i < n; i++) {
        gd_err err = {0};
        gd_buf *b;
        bool by_name = i < q->n_names;
        uint64_t bid = by_name ? 0 : q->buffer_ids[i - q->n_names];
        gd_target t;
        int r;
        if (seal)
            r = gd_registry_seal_event(reg, s->holder, bid, NULL, &b, &err);
        else if ((r = batch_target(s, by_name ? q->names[i] : NULL, bid, &t, &err)) == 0)
            r = gd_registry_delete_target(reg, s->holder, &t, &err);
        if (r < 0)
            batch_fail(&bt, i, r, &err);
        else
            batch_ok(&bt, i, NULL);
    }
    batch_reply_send(&bt, id);
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

/* Bytes of one item in a batch reply at most: its status, buffer id, size,
 * offset, slab id and state (varints), its name, its error (item number and
 * sentence, each with its tag and length) and its seal event. */
#define BATCH_ITEM_REPLY_MAX                                                                    \
    (5u + 4u * 10u + 5u + (GPUBUF_NAME_MAX + 1u) + (3u + 6u + 3u + sizeof(((gd_err *)0)->msg)) + \
     5u + GD_EVENT_HANDLE_SIZE)
/* One Slab message at most (ids and sizes as varints, the 16-byte UUID, the
 * 64-byte IPC handle, flags, tags and lengths), and the rest of a reply:
 * the envelope, the column tags and lengths. */
#define BATCH_SLAB_REPLY_MAX 160u
#define BATCH_REPLY_FIXED 256u

size_t gd_session_batch_reply_bound(size_t n) {
    return BATCH_REPLY_FIXED + GD_BATCH_REPLY_FDS * BATCH_SLAB_REPLY_MAX +
           n * BATCH_ITEM_REPLY_MAX;
}

/* The items of a batch request (0 for any other request). */
static size_t batch_items(const Gpubuf__Request *req) {
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_BATCH_OPEN:
        return req->batch_open->n_names + req->batch_open->n_buffer_ids;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE: return req->batch_release->n_buffer_ids;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC: return req->batch_alloc->n_sizes;
    case GPUBUF__REQUEST__BODY_BATCH_STATE:
        return req->batch_state->n_names + req->batch_state->n_buffer_ids;
    default: return 0;
    }
}

int gd_session_frame(gd_session *s, const uint8_t *payload, size_t len) {
    Gpubuf__Request *req = gpubuf__request__unpack(NULL, len, payload);
    if (!req) {
        LOG_WARN_LIMITED("pid %d: undecodable request (%zu bytes); disconnecting", (int)s->pid,
                         len);
        reply_error(s, 0, GPUBUF_EPROTOCOL, "request does not decode as gpubuf.Request");
        session_close(s, GD_END_PROTOCOL);
        return 0;
    }
    /* A batch starts only when its largest reply fits in the daemon's reply
     * memory: its items take references, and their reply must then be
     * queued whatever else waits. Too many items: the small error below. */
    size_t items = batch_items(req);
    if (items && items <= GD_BATCH_MAX_ITEMS && s->hello_done && s->io->reply_room &&
        !s->io->reply_room(s->conn, gd_session_batch_reply_bound(items))) {
        gpubuf__request__free_unpacked(req, NULL);
        return -EAGAIN;
    }
    if (!s->hello_done && req->body_case != GPUBUF__REQUEST__BODY_HELLO) {
        reply_error(s, req->id, GPUBUF_EPROTOCOL, "the first request must be hello");
        session_close(s, GD_END_PROTOCOL);
        goto out;
    }
    const char *nul = gpubuf_wire_nul_string(&gpubuf__request__descriptor, payload, len);
    if (nul) {
        char msg[128];
        snprintf(msg, sizeof(msg),
                 "string field '%s' of the request contains a NUL byte; strings may not", nul);
        reply_error(s, req->id, -EINVAL, msg);
        if (!s->hello_done)
            session_close(s, GD_END_PROTOCOL);
        goto out;
    }
    gd_req_type type = req_type(req);
    uint64_t t0 = gpubuf_now_ns();
    if (gpubuf_trace_on()) {
        uint64_t woke, read;
        gpubuf_trace_stashed(&woke, &read);
        gpubuf_trace(s->holder->id, req->id, (int)type, GPUBUF_TRACE_D_WAKE, woke);
        gpubuf_trace(s->holder->id, req->id, (int)type, GPUBUF_TRACE_D_READ, read);
        gpubuf_trace(s->holder->id, req->id, (int)type, GPUBUF_TRACE_D_DECODED, t0);
    }
    s->cur_type = (int)type;
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_HELLO: do_hello(s, req->id, req->hello); break;
    case GPUBUF__REQUEST__BODY_ALLOC: do_alloc(s, req->id, req->alloc); break;
    case GPUBUF__REQUEST__BODY_SEAL: do_seal(s, req->id, req->seal); break;
    case GPUBUF__REQUEST__BODY_OPEN: do_open(s, req->id, req->open); break;
    case GPUBUF__REQUEST__BODY_RELEASE: do_release(s, req->id, req->release); break;
    case GPUBUF__REQUEST__BODY_UNMAP: do_unmap(s, req->id, req->unmap); break;
    case GPUBUF__REQUEST__BODY_DELETE: do_delete(s, req->id, req->delete_); break;
    case GPUBUF__REQUEST__BODY_STAT: do_stat(s, req->id, req->stat); break;
    case GPUBUF__REQUEST__BODY_STATUS: do_status(s, req->id, req->status); break;
    case GPUBUF__REQUEST__BODY_RENEW: do_renew(s, req->id, req->renew); break;
    case GPUBUF__REQUEST__BODY_BATCH_OPEN: do_batch_open(s, req->id, req->batch_open); break;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE:
        do_batch_release(s, req->id, req->batch_release);
        break;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC: do_batch_alloc(s, req->id, req->batch_alloc); break;
    case GPUBUF__REQUEST__BODY_BATCH_STATE: do_batch_state(s, req->id, req->batch_state); break;
    case GPUBUF__REQUEST__BODY_TAKEOVER: do_takeover(s, req->id, req->takeover); break;
    default:
        reply_error(s, req->id, -ENOTSUP, "unknown request type");
        break;
    }
    s->cur_type = -1;
    gd_metrics_request(&s->ctx->metrics, type, gpubuf_now_ns() - t0);
out:
    gpubuf__request__free_unpacked(req, NULL);
    return 0;
}

void gd_session_bad_frame(gd_session *s, int err) {
    reply_error(s, 0, err,
                err == -EMSGSIZE ? "request frame too large"
                                 : "bad frame header (magic, version or flags)");
}

void gd_session_shutdown(gd_session *s) {
    /* Best effort: a client blocked in a request reads this error. */
    reply_error(s, 0, -ESHUTDOWN, "gpubufd is shutting down");
    session_close(s, GD_END_SHUTDOWN);
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
