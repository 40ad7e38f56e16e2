/* Session room: decode one request, run it against the registry, reply. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server.h"
#include "util.h"
#include "wire.h"

#define GPUBUF_SERVER_STRING "gpubufd " GPUBUF_VERSION_STRING
/* reply_buffer_fd: a read-only open whose fd is the slab's own (none). */
#define RO_NO_FD (-2)

typedef struct session_waiter {
    gpubuf_waiter w;
    uv_timer_t timer;
    gpubuf_session *s;
    uint64_t request_id;
    bool has_timer;
    bool read_only; /* GPUBUF_OPEN_READONLY */
} session_waiter;

static void reply_error(gpubuf_session *s, uint64_t id, int status, const char *msg) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    resp.id = id;
    resp.status = status;
    resp.message = (char *)(msg ? msg : gpubuf_strerror(status));
    gpubuf_session_send(s, &resp, -1);
}

/* Storage for one Buffer message and its Slab. */
typedef struct buffer_msg {
    Gpubuf__Buffer buf;
    Gpubuf__Slab slab;
} buffer_msg;

static void fill_buffer(buffer_msg *m, const gpubuf_buf *b) {
    gpubuf_slab *sl = b->blk.slab;
    gpubuf_backend *be = b->pool->be;
    gpubuf__buffer__init(&m->buf);
    gpubuf__slab__init(&m->slab);
    m->buf.buffer_id = b->id;
    m->buf.name = b->name ? b->name : (char *)"";
    m->buf.pool = b->pool->name;
    m->buf.size = b->size;
    m->buf.offset = b->blk.offset;
    m->buf.state = (Gpubuf__BufferState)b->state;
    m->buf.refs = b->refs;
    m->buf.owner_uid = b->owner_uid;
    m->buf.slab_id = sl->id;
    m->buf.slab = &m->slab;
    m->slab.slab_id = sl->id;
    m->slab.kind = (Gpubuf__PoolKind)be->kind;
    m->slab.device = be->device;
    m->slab.size = sl->size;
    if (be->has_uuid) {
        m->slab.device_uuid.data = be->uuid;
        m->slab.device_uuid.len = 16;
    }
    if (sl->exp.has_ipc_handle) {
        m->slab.ipc_handle.data = sl->exp.ipc_handle;
        m->slab.ipc_handle.len = GPUBUF_IPC_HANDLE_SIZE;
    }
}

/* Reply with a buffer. map_fd (alloc and open, which take a reference): how
 * to map it, the slab's fd or IPC handle. Otherwise (seal, stat) no handle:
 * nothing is handed out without a reference. ro_fd >= 0: a read-only open,
 * with the fd to send instead of the slab's. */
static void reply_buffer_fd(gpubuf_session *s, uint64_t id, const gpubuf_buf *b, bool map_fd,
                            int ro_fd) {
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    buffer_msg m;
    bool ro = ro_fd >= 0 || (map_fd && ro_fd == RO_NO_FD);
    fill_buffer(&m, b);
    if (!map_fd) {
        m.slab.ipc_handle.len = 0;
        m.slab.ipc_handle.data = NULL;
    } else {
        const uint8_t *ev = gpubuf_registry_event(&s->srv->reg, b);
        if (ev) {
            m.buf.event_handle.data = (uint8_t *)ev;
            m.buf.event_handle.len = GPUBUF_EVENT_HANDLE_SIZE;
        }
    }
    /* Read-only mappings are never kept: the daemon pins slabs, not modes. */
    m.slab.keepable = map_fd && !ro && (s->caps & GPUBUF_CAP_KEEP_MAPPED) &&
                      !b->blk.slab->dedicated;
    m.slab.read_only = ro;
    m.buf.read_only = ro;
    int fd = map_fd ? (ro_fd >= 0 ? ro_fd : b->blk.slab->exp.fd) : -1;
    resp.id = id;
    resp.fds = fd >= 0 ? 1 : 0;
    resp.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
    resp.buffer = &m.buf;
    gpubuf_session_send(s, &resp, fd);
}

static void reply_buffer(gpubuf_session *s, uint64_t id, const gpubuf_buf *b, bool map_fd) {
    reply_buffer_fd(s, id, b, map_fd, -1);
}

/* Reply to an open that took a reference to b. A read-only open sends the
 * fd that maps it read-only; where the memory cannot be (cuda-ipc), the
 * reference is given back and the open fails with -EOPNOTSUPP. */
static void reply_open(gpubuf_session *s, uint64_t id, gpubuf_buf *b, bool read_only) {
    char err[256];
    int fd = -1, r;
    if (!read_only) {
        reply_buffer(s, id, b, true);
        return;
    }
    r = gpubuf_backend_export_ro(b->pool->be, &b->blk.slab->exp, &fd, err, sizeof(err));
    if (r < 0) {
        gpubuf_registry_release(&s->srv->reg, s->holder, b->id);
        reply_error(s, id, r, err);
        return;
    }
    gpubuf_registry_ref_ro(s->holder, b->id, true);
    reply_buffer_fd(s, id, b, true, fd >= 0 ? fd : RO_NO_FD);
}

static void waiter_closed(uv_handle_t *h) {
    free(h->data);
}

static void waiter_dispose(session_waiter *sw) {
    sw->s->n_waiters--;
    if (sw->has_timer) {
        uv_timer_stop(&sw->timer);
        uv_close((uv_handle_t *)&sw->timer, waiter_closed);
    } else {
        free(sw);
    }
}

static void waiter_wake(gpubuf_waiter *w, gpubuf_buf *b) {
    session_waiter *sw = (session_waiter *)w;
    if (!gpubuf_pool_allows(b->pool, sw->s->uid, sw->s->gid)) {
        /* The registry took a reference for us: give it back. */
        gpubuf_registry_release(&sw->s->srv->reg, sw->s->holder, b->id);
        reply_error(sw->s, sw->request_id, -EACCES, "this client may not use the buffer's pool");
    } else {
        reply_open(sw->s, sw->request_id, b, sw->read_only);
    }
    free(w->name);
    waiter_dispose(sw);
}

static void waiter_cancel(gpubuf_waiter *w) {
    session_waiter *sw = (session_waiter *)w;
    free(w->name);
    waiter_dispose(sw);
}

static void waiter_fail(gpubuf_waiter *w, int err) {
    session_waiter *sw = (session_waiter *)w;
    char msg[96];
    if (err == -EDQUOT)
        snprintf(msg, sizeof(msg), "quota: this client holds too many references");
    else
        snprintf(msg, sizeof(msg), "buffer %llu was deleted before it was sealed",
                 (unsigned long long)w->buffer_id);
    reply_error(sw->s, sw->request_id, err, msg);
    free(w->name);
    waiter_dispose(sw);
}

static void waiter_timeout(uv_timer_t *t) {
    session_waiter *sw = t->data;
    char msg[GPUBUF_NAME_MAX + 64];
    gpubuf_registry_unwait(&sw->s->srv->reg, &sw->w);
    if (sw->w.name)
        snprintf(msg, sizeof(msg), "timed out waiting for '%s' to be sealed", sw->w.name);
    else
        snprintf(msg, sizeof(msg), "timed out waiting for buffer %llu to be sealed",
                 (unsigned long long)sw->w.buffer_id);
    reply_error(sw->s, sw->request_id, -ETIMEDOUT, msg);
    free(sw->w.name);
    waiter_dispose(sw);
}

/* Validate a name from the wire; reply with an error and return false if bad. */
static bool check_name(gpubuf_session *s, uint64_t id, const char *name) {
    size_t len = strlen(name);
    if (len > GPUBUF_NAME_MAX) {
        reply_error(s, id, -ENAMETOOLONG, "name longer than 255 bytes");
        return false;
    }
    if (!gpubuf_name_valid(name, len)) {
        reply_error(s, id, -EINVAL, "invalid name (allowed: A-Z a-z 0-9 . _ : / @ + -)");
        return false;
    }
    return true;
}

static void do_hello(gpubuf_session *s, uint64_t id, const Gpubuf__Hello *h) {
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
        gpubuf_session_kill(s);
        return;
    }
    s->hello_done = true;
    snprintf(s->name, sizeof(s->name), "%s", h->client_name ? h->client_name : "");
    hr.version = GPUBUF_PROTOCOL_VERSION;
    hr.server = (char *)GPUBUF_SERVER_STRING;
    hr.session_id = s->holder->id;
    hr.max_request = s->srv->limits.max_request;
    hr.max_response = GPUBUF_WIRE_MAX_RESPONSE;
    if ((h->capabilities & GPUBUF_CAP_KEEP_MAPPED) && s->srv->reg.quota.kept_slabs_per_client) {
        s->caps |= GPUBUF_CAP_KEEP_MAPPED;
        s->holder->kept_cap = s->srv->reg.quota.kept_slabs_per_client;
        hr.max_kept_slabs = s->holder->kept_cap;
    }
    hr.capabilities = s->caps;
    resp.id = id;
    resp.body_case = GPUBUF__RESPONSE__BODY_HELLO;
    resp.hello = &hr;
    gpubuf_session_send(s, &resp, -1);
}

static void do_alloc(gpubuf_session *s, uint64_t id, const Gpubuf__AllocRequest *a) {
    gpubuf_server *srv = s->srv;
    gpubuf_pool *pool;
    gpubuf_buf *b;
    int r;
    if (a->pool && *a->pool) {
        pool = gpubuf_server_find_pool(srv, a->pool);
        if (!pool) {
            char msg[GPUBUF_NAME_MAX + 32];
            snprintf(msg, sizeof(msg), "no pool named '%.255s'", a->pool);
            reply_error(s, id, GPUBUF_ENOPOOL, msg);
            return;
        }
    } else if (srv->n_pools > 0) {
        pool = srv->pools[0];
    } else {
        reply_error(s, id, GPUBUF_ENOPOOL, "the daemon has no pools");
        return;
    }
    if (a->name && *a->name && !check_name(s, id, a->name))
        return;
    if (!gpubuf_pool_allows(pool, s->uid, s->gid)) {
        char msg[GPUBUF_NAME_MAX + 64];
        snprintf(msg, sizeof(msg), "uid %u may not use pool '%.255s'", (unsigned)s->uid,
                 pool->name);
        reply_error(s, id, -EACCES, msg);
        return;
    }
    r = gpubuf_registry_alloc(&srv->reg, s->holder, pool, a->size, a->alignment, a->name, &b);
    if (r < 0) {
        if (r != -EEXIST)
            LOG_INFO("pid %d: alloc %llu bytes from '%s': %s", (int)s->pid,
                     (unsigned long long)a->size, pool->name, srv->reg.last_error);
        reply_error(s, id, r, srv->reg.last_error);
        return;
    }
    reply_buffer(s, id, b, true);
}

static void do_seal(gpubuf_session *s, uint64_t id, const Gpubuf__SealRequest *q) {
    gpubuf_buf *b;
    if (q->event_handle.len != 0 && q->event_handle.len != GPUBUF_EVENT_HANDLE_SIZE) {
        reply_error(s, id, -EINVAL, "a seal event handle has 64 bytes (CUipcEventHandle)");
        return;
    }
    int r = gpubuf_registry_seal_event(&s->srv->reg, s->holder, q->buffer_id,
                                       q->event_handle.len ? q->event_handle.data : NULL, &b);
    if (r < 0) {
        reply_error(s, id, r, s->srv->reg.last_error);
        return;
    }
    /* Waiters woken by the seal may have been this very session; b is alive
     * since the sealer holds a reference. The sealer mapped the buffer when
     * it allocated it: the reply carries no handle. */
    reply_buffer(s, id, b, false);
}

static void do_open(gpubuf_session *s, uint64_t id, const Gpubuf__OpenRequest *q) {
    gpubuf_registry *reg = &s->srv->reg;
    const char *name = NULL;
    uint64_t bid = 0;
    gpubuf_buf *b;
    int r;
    if (q->target_case == GPUBUF__OPEN_REQUEST__TARGET_NAME) {
        name = q->name;
        if (!check_name(s, id, name))
            return;
    } else if (q->target_case == GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID) {
        bid = q->buffer_id;
    } else {
        reply_error(s, id, -EINVAL, "open needs a name or a buffer id");
        return;
    }
    /* Refuse before taking a reference: a buffer of a pool this client may
     * not use is not opened, whatever its state. */
    gpubuf_buf *target = name ? gpubuf_registry_find_name(reg, name)
                              : gpubuf_registry_find_id(reg, bid);
    if (target && !gpubuf_pool_allows(target->pool, s->uid, s->gid)) {
        reply_error(s, id, -EACCES, "this client may not use the buffer's pool");
        return;
    }
    if (target && q->read_only && target->pool->be->kind == GPUBUF_POOL_CUDA_IPC) {
        char err[256];
        int fd;
        int r2 = gpubuf_backend_export_ro(target->pool->be, &target->blk.slab->exp, &fd, err,
                                          sizeof(err));
        reply_error(s, id, r2, err);
        return;
    }
    r = gpubuf_registry_open(reg, s->holder, name, bid, &b);
    if (r == 0) {
        reply_open(s, id, b, q->read_only);
        return;
    }
    if (r != -ENOENT || q->timeout_ms == 0) {
        reply_error(s, id, r, reg->last_error);
        return;
    }
    /* Wait only for something that can still be sealed: any name, or an
     * id that exists in state ALLOCATED. */
    if (!name) {
        gpubuf_buf *t = gpubuf_registry_find_id(reg, bid);
        if (!t || t->state != GPUBUF_STATE_ALLOCATED) {
            reply_error(s, id, r, reg->last_error);
            return;
        }
    }
    if (s->n_waiters >= s->srv->limits.max_waiters_per_client) {
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
    sw->read_only = q->read_only;
    sw->w.holder = s->holder;
    sw->w.buffer_id = bid;
    sw->w.wake = waiter_wake;
    sw->w.cancel = waiter_cancel;
    sw->w.fail = waiter_fail;
    if (q->timeout_ms > 0) {
        uv_timer_init(s->srv->loop, &sw->timer);
        sw->timer.data = sw;
        sw->has_timer = true;
        uv_timer_start(&sw->timer, waiter_timeout, (uint64_t)q->timeout_ms, 0);
    }
    s->n_waiters++;
    gpubuf_registry_wait(reg, &sw->w);
}

static void do_release(gpubuf_session *s, uint64_t id, const Gpubuf__ReleaseRequest *q) {
    bool keep = q->keep_mapped;
    if (keep && !(s->caps & GPUBUF_CAP_KEEP_MAPPED)) {
        /* Still release: the reference is not the client's to keep. */
        gpubuf_registry_release(&s->srv->reg, s->holder, q->buffer_id);
        reply_error(s, id, GPUBUF_EPROTOCOL, "keep_mapped without the KEEP_MAPPED capability");
        return;
    }
    if (q->read_only)
        gpubuf_registry_ref_ro(s->holder, q->buffer_id, false);
    int r = gpubuf_registry_release_keep(&s->srv->reg, s->holder, q->buffer_id, keep);
    if (r < 0) {
        reply_error(s, id, r, s->srv->reg.last_error);
        return;
    }
    reply_error(s, id, 0, "");
}

static void do_unmap(gpubuf_session *s, uint64_t id, const Gpubuf__UnmapRequest *q) {
    int r = gpubuf_registry_unmap(&s->srv->reg, s->holder, q->slab_id);
    reply_error(s, id, r, r < 0 ? s->srv->reg.last_error : "");
}

static void do_delete(gpubuf_session *s, uint64_t id, const Gpubuf__DeleteRequest *q) {
    const char *name = NULL;
    int r;
    if (q->target_case == GPUBUF__DELETE_REQUEST__TARGET_NAME) {
        name = q->name;
        if (!check_name(s, id, name))
            return;
    } else if (q->target_case != GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID) {
        reply_error(s, id, -EINVAL, "delete needs a name or a buffer id");
        return;
    }
    r = gpubuf_registry_delete(&s->srv->reg, s->holder, name, q->buffer_id);
    if (r < 0) {
        reply_error(s, id, r, s->srv->reg.last_error);
        return;
    }
    reply_error(s, id, 0, "");
}

static void do_stat(gpubuf_session *s, uint64_t id, const Gpubuf__StatRequest *q) {
    gpubuf_buf *b = NULL;
    if (q->target_case == GPUBUF__STAT_REQUEST__TARGET_NAME) {
        if (!check_name(s, id, q->name))
            return;
        b = gpubuf_registry_find_name(&s->srv->reg, q->name);
    } else if (q->target_case == GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID) {
        b = gpubuf_registry_find_id(&s->srv->reg, q->buffer_id);
    } else {
        reply_error(s, id, -EINVAL, "stat needs a name or a buffer id");
        return;
    }
    if (!b) {
        reply_error(s, id, -ENOENT, "no such buffer");
        return;
    }
    /* Like status, stat takes no reference and so hands out no handle. */
    reply_buffer(s, id, b, false);
}

/* The buffers as columns: n entries in each array, names NUL-separated.
 * Returns false when out of memory. The arrays are freed by columns_free. */
static bool fill_columns(gpubuf_server *srv, Gpubuf__BufferColumns *c) {
    gpubuf_registry *reg = &srv->reg;
    size_t n = reg->n_buffers, names = 0, i = 0;
    for (gpubuf_buf *b = reg->by_id; b; b = b->hh_id.next)
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
    if (!c->id || !c->size || !c->offset || !c->slab_id || !c->pool || !c->state || !c->refs ||
        !c->owner_uid || !c->names.data)
        return false;
    uint8_t *np = c->names.data;
    for (gpubuf_buf *b = reg->by_id; b && i < n; b = b->hh_id.next, i++) {
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
        c->pool[i] = 0;
        for (int p = 0; p < srv->n_pools; p++)
            if (srv->pools[p] == b->pool) {
                c->pool[i] = (uint32_t)p;
                break;
            }
    }
    c->names.len = (size_t)(np - c->names.data);
    c->n_id = c->n_size = c->n_offset = c->n_slab_id = c->n_pool = c->n_state = c->n_refs =
        c->n_owner_uid = i;
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
    free(c->names.data);
}

static void do_status(gpubuf_session *s, uint64_t id, const Gpubuf__StatusRequest *q) {
    gpubuf_server *srv = s->srv;
    gpubuf_registry *reg = &srv->reg;
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__StatusReply st = GPUBUF__STATUS_REPLY__INIT;
    Gpubuf__PoolStatus *pools = calloc((size_t)srv->n_pools + 1, sizeof(*pools));
    Gpubuf__PoolStatus **ppools = calloc((size_t)srv->n_pools + 1, sizeof(*ppools));
    bool columnar = q && q->columnar;
    Gpubuf__BufferColumns cols = GPUBUF__BUFFER_COLUMNS__INIT;
    size_t nrows = columnar ? 0 : (size_t)reg->n_buffers;
    buffer_msg *bufs = calloc(nrows + 1, sizeof(*bufs));
    Gpubuf__Buffer **pbufs = calloc(nrows + 1, sizeof(*pbufs));
    Gpubuf__ClientStatus *cl = calloc((size_t)srv->n_sessions + 1, sizeof(*cl));
    Gpubuf__ClientStatus **pcl = calloc((size_t)srv->n_sessions + 1, sizeof(*pcl));
    size_t i = 0;
    if (!pools || !ppools || !bufs || !pbufs || !cl || !pcl ||
        (columnar && !fill_columns(srv, &cols))) {
        reply_error(s, id, -ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < srv->n_pools; p++) {
        gpubuf_pool *pool = srv->pools[p];
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
        ppools[p] = &pools[p];
    }
    st.n_pools = (size_t)srv->n_pools;
    st.pools = ppools;
    if (columnar)
        st.buffer_columns = &cols;
    for (gpubuf_buf *b = reg->by_id; b && i < nrows; b = b->hh_id.next, i++) {
        fill_buffer(&bufs[i], b);
        /* No slab message: status hands out no handles, and 100k nested
         * messages would double the cost of packing and unpacking. */
        bufs[i].buf.slab = NULL;
        pbufs[i] = &bufs[i].buf;
    }
    st.n_buffers = i;
    st.buffers = pbufs;
    i = 0;
    for (gpubuf_session *x = srv->sessions; x; x = x->next) {
        if (x->closing || !x->holder)
            continue;
        gpubuf__client_status__init(&cl[i]);
        cl[i].session_id = x->holder->id;
        cl[i].pid = x->pid;
        cl[i].uid = x->uid;
        cl[i].gid = x->gid;
        cl[i].references = x->holder->n_refs;
        cl[i].buffers_held = HASH_CNT(hh, x->holder->refs);
        cl[i].kept_slabs = x->holder->n_kept;
        cl[i].read_only_references = x->holder->n_ro_refs;
        cl[i].name = x->name;
        pcl[i] = &cl[i];
        i++;
    }
    st.n_clients = i;
    st.clients = pcl;
    st.uptime_ms = (gpubuf_now_ns() - srv->started_ns) / 1000000u;
    st.version = (char *)GPUBUF_VERSION_STRING;
    resp.id = id;
    resp.body_case = GPUBUF__RESPONSE__BODY_STATUS_REPLY;
    resp.status_reply = &st;
    gpubuf_session_send(s, &resp, -1);
out:
    columns_free(&cols);
    free(pools);
    free(ppools);
    free(bufs);
    free(pbufs);
    free(cl);
    free(pcl);
}

void gpubuf_session_handle(gpubuf_session *s, const uint8_t *payload, size_t len) {
    Gpubuf__Request *req = gpubuf__request__unpack(NULL, len, payload);
    if (!req) {
        LOG_WARN("pid %d: undecodable request (%zu bytes); disconnecting", (int)s->pid, len);
        reply_error(s, 0, GPUBUF_EPROTOCOL, "request does not decode as gpubuf.Request");
        gpubuf_session_kill(s);
        return;
    }
    if (!s->hello_done && req->body_case != GPUBUF__REQUEST__BODY_HELLO) {
        reply_error(s, req->id, GPUBUF_EPROTOCOL, "the first request must be hello");
        gpubuf_session_kill(s);
        goto out;
    }
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
    default:
        reply_error(s, req->id, -ENOTSUP, "unknown request type");
        break;
    }
out:
    gpubuf__request__free_unpacked(req, NULL);
}
