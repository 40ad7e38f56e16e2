/* Unit tests for the session room (daemon/session.c) without sockets: a
 * session, the registry and a host pool driven through an in-memory
 * connection, the way nng tests its protocols over inproc. Requests are
 * packed like a client packs them and handed to gd_session_frame(); replies
 * are unpacked from what the session gives its transport. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "config.h"
#include "context.h"
#include "gpubuf.pb-c.h"
#include "log.h"
#include "rawproto.h"
#include "session.h"
#include "wire.h"
#include "check_main.h"

#define MIB (1024ull * 1024ull)
#define MAX_REPLIES 64

/* One in-memory connection: the replies the session sent, in order. */
typedef struct memconn {
    gd_session *s;
    Gpubuf__Response *replies[MAX_REPLIES];
    int fds[MAX_REPLIES];
    int n_fds[MAX_REPLIES]; /* fds each reply carried (fds[] keeps the first) */
    int n;
    unsigned fd_room; /* what the transport says it has room for (0: 16) */
    bool room_limited; /* reply_room says yes only for bounds up to room */
    size_t room, asked; /* asked: the last bound reply_room was asked for */
    int frame_rc;      /* what gd_session_frame returned last */
    bool closed, ready;
} memconn;

static int mc_send(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                   const void *msg, int fd) {
    memconn *m = conn;
    if (m->closed)
        return -ECONNRESET;
    ck_assert_int_lt(m->n, MAX_REPLIES);
    uint8_t *buf = malloc(len + 1);
    ck_assert_ptr_nonnull(buf);
    pack(msg, buf);
    m->replies[m->n] = gpubuf__response__unpack(NULL, len, buf);
    ck_assert_ptr_nonnull(m->replies[m->n]);
    m->fds[m->n] = fd >= 0 ? dup(fd) : -1;
    m->n_fds[m->n] = fd >= 0;
    m->n++;
    free(buf);
    return 0;
}

static int mc_send_fds(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                       const void *msg, const int *fds, int n_fds, bool bounded) {
    memconn *m = conn;
    ck_assert_int_le(n_fds, GPUBUF_WIRE_MAX_FDS);
    ck_assert_uint_le((unsigned)n_fds, m->fd_room ? m->fd_room : 16);
    for (int i = 0; i < n_fds; i++)
        ck_assert_int_ge(fds[i], 0);
    int r = mc_send(conn, len, pack, msg, n_fds ? fds[0] : -1);
    if (r == 0) {
        const Gpubuf__Response *resp = m->replies[m->n - 1];
        m->n_fds[m->n - 1] = n_fds;
        /* A batch reply never passes the bound its room was asked for. */
        if (bounded && resp->body_case == GPUBUF__RESPONSE__BODY_BATCH)
            ck_assert_uint_le(len, gd_session_batch_reply_bound(resp->batch->n_status,
                                                                 resp->batch->n_layouts > 0));
    }
    return r;
}

static bool mc_reply_room(void *conn, size_t bound) {
    memconn *m = conn;
    m->asked = bound;
    return !m->room_limited || bound <= m->room;
}

static unsigned mc_fd_room(const void *conn) {
    const memconn *m = conn;
    return m->fd_room ? m->fd_room : 16;
}

static void mc_close(void *conn) {
    ((memconn *)conn)->closed = true;
}

static void mc_ready(void *conn) {
    ((memconn *)conn)->ready = true;
}

static bool mc_closing(const void *conn) {
    return ((const memconn *)conn)->closed;
}

static const gd_transport mem_transport = {mc_send,     mc_close,   mc_ready,     mc_closing,
                                           mc_send_fds, mc_fd_room, mc_reply_room, NULL};

static uv_loop_t loop;
static gd_context ctx;

/* Add a host pool (1 MiB slabs, 8 MiB) to ctx whose access list is
 * allow_uid and whose publishers are publish_uid (0: everyone). */
static void add_pool(const char *name, uint32_t allow_uid, uint32_t publish_uid) {
    gd_backend *be;
    gd_pool *pool;
    ck_assert_int_eq(gd_backend_host_new(&be, NULL), 0);
    ck_assert_int_eq(gd_pool_new(name, be, 8 * MIB, MIB, &ctx.slab_ids, &pool, NULL), 0);
    if (allow_uid) {
        pool->allow_uids[0] = allow_uid;
        pool->n_allow_uids = 1;
    }
    if (publish_uid) {
        pool->publish_uids[0] = publish_uid;
        pool->n_publish_uids = 1;
    }
    ck_assert_int_eq(gd_context_add_pool(&ctx, pool), 0);
}

/* A context with one host pool "h" whose access list is allow_uid (0:
 * everyone). */
static void ctx_init(uint32_t allow_uid) {
    gd_log_level = -1; /* quiet */
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    gd_context_init(&ctx, &loop);
    gd_config_defaults(&ctx.limits, &ctx.reg.quota);
    add_pool("h", allow_uid, 0);
}

static void mc_open(memconn *m, uid_t uid) {
    memset(m, 0, sizeof(*m));
    m->s = gd_session_new(&ctx, &mem_transport, m, 4000 + (pid_t)uid, uid, uid);
    ck_assert_ptr_nonnull(m->s);
}

static void mc_forget(memconn *m) {
    for (int i = 0; i < m->n; i++) {
        gpubuf__response__free_unpacked(m->replies[i], NULL);
        if (m->fds[i] >= 0)
            close(m->fds[i]);
    }
    m->n = 0;
}

static void mc_free(memconn *m) {
    gd_session_free(m->s);
    /* What the daemon's loop does over its next turns: drop what the client
     * held, a bounded part at a time. */
    while (gd_registry_reap(&ctx.reg, 64))
        ;
    mc_forget(m);
}

static void ctx_fini(void) {
    gd_context_destroy(&ctx);
    /* Timers of waits close through the loop. */
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}

/* Send one request; return the number of replies it produced. */
static int mc_request(memconn *m, Gpubuf__Request *req) {
    size_t len = gpubuf__request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    int before = m->n;
    ck_assert_ptr_nonnull(buf);
    gpubuf__request__pack(req, buf);
    m->frame_rc = gd_session_frame(m->s, buf, len);
    free(buf);
    return m->n - before;
}

static const Gpubuf__Response *last(const memconn *m) {
    ck_assert_int_gt(m->n, 0);
    return m->replies[m->n - 1];
}

static void hello_status(memconn *m, int status) {
    rp_hello h;
    rp_hello_init(&h, 0, "unit");
    ck_assert_int_eq(mc_request(m, &h.req), 1);
    ck_assert_int_eq(last(m)->status, status);
}

static void hello(memconn *m) {
    hello_status(m, 0);
    ck_assert_int_eq(last(m)->body_case, GPUBUF__RESPONSE__BODY_HELLO);
}

/* A context whose pool allows allow_uid (0: everyone) and a session of uid
 * ua on a, and of ub on b when b is given, each past its hello. */
static void start(uint32_t allow_uid, memconn *a, uid_t ua, memconn *b, uid_t ub) {
    ctx_init(allow_uid);
    mc_open(a, ua);
    hello(a);
    if (b) {
        mc_open(b, ub);
        hello(b);
    }
}

/* Free the sessions (b first, when given) and the context. */
static void finish(memconn *a, memconn *b) {
    if (b)
        mc_free(b);
    mc_free(a);
    ctx_fini();
}

/* Send the request msg (of kind body) with id; it must be answered at once
 * (last(m) is the reply). */
static void send_answered(memconn *m, uint64_t id, Gpubuf__Request__BodyCase body, void *msg) {
    Gpubuf__Request req = rp_request(id, body, msg);
    ck_assert_int_eq(mc_request(m, &req), 1);
}

/* Allocate size bytes named name (NULL: anonymous) in pool ("": the
 * default pool); the reply. */
static const Gpubuf__Response *alloc_in(memconn *m, const char *pool, const char *name,
                                        uint64_t size) {
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = size;
    a.pool = (char *)pool;
    a.name = (char *)(name ? name : "");
    send_answered(m, 10, GPUBUF__REQUEST__BODY_ALLOC, &a);
    return last(m);
}

static const Gpubuf__Response *alloc(memconn *m, const char *name, uint64_t size) {
    return alloc_in(m, "", name, size);
}

static void seal(memconn *m, uint64_t id) {
    Gpubuf__SealRequest q = GPUBUF__SEAL_REQUEST__INIT;
    q.buffer_id = id;
    Gpubuf__Request req = rp_request(11, GPUBUF__REQUEST__BODY_SEAL, &q);
    mc_request(m, &req);
}

/* Open by name (read-only if ro); returns the number of replies (0 while
 * it waits). */
static int open_name_ro(memconn *m, const char *name, int timeout_ms, bool ro) {
    Gpubuf__OpenRequest q = GPUBUF__OPEN_REQUEST__INIT;
    q.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    q.name = (char *)name;
    q.timeout_ms = timeout_ms;
    q.read_only = ro;
    Gpubuf__Request req = rp_request(12, GPUBUF__REQUEST__BODY_OPEN, &q);
    return mc_request(m, &req);
}

static int open_name(memconn *m, const char *name, int timeout_ms) {
    return open_name_ro(m, name, timeout_ms, false);
}

START_TEST(first_request_must_be_hello) {
    memconn m;
    ctx_init(0);
    mc_open(&m, 1000);
    alloc(&m, "x", 64);
    ck_assert_int_eq(last(&m)->status, GPUBUF_EPROTOCOL);
    ck_assert(m.closed);
    ck_assert(!m.ready);
    finish(&m, NULL);
}
END_TEST

START_TEST(hello_makes_the_connection_ready) {
    memconn m;
    ctx_init(0);
    mc_open(&m, 1000);
    hello(&m);
    ck_assert(m.ready);
    ck_assert(!m.closed);
    ck_assert_uint_eq(last(&m)->hello->session_id, m.s->holder->id);
    ck_assert_uint_eq(last(&m)->hello->max_request, ctx.limits.max_request);
    hello_status(&m, GPUBUF_EPROTOCOL); /* twice: a protocol error, the session stays */
    ck_assert(!m.closed);
    finish(&m, NULL);
}
END_TEST

START_TEST(undecodable_request_disconnects) {
    memconn m;
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    ctx_init(0);
    mc_open(&m, 1000);
    gd_session_frame(m.s, junk, sizeof(junk));
    ck_assert_int_eq(m.n, 1);
    ck_assert_int_eq(last(&m)->status, GPUBUF_EPROTOCOL);
    ck_assert(m.closed);
    finish(&m, NULL);
}
END_TEST

START_TEST(alloc_seal_open_across_sessions) {
    memconn a, b;
    start(0, &a, 1000, &b, 1001);
    const Gpubuf__Response *r = alloc(&a, "frame", 4096);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->fds, 1);
    ck_assert_int_ge(a.fds[a.n - 1], 0); /* the host slab's memfd rides along */
    uint64_t id = r->buffer->buffer_id;
    ck_assert_int_eq(open_name(&b, "frame", 0), 1);
    ck_assert_int_eq(last(&b)->status, -ENOENT); /* not sealed yet */
    seal(&a, id);
    ck_assert_int_eq(last(&a)->status, 0);
    ck_assert_int_eq(last(&a)->fds, 0); /* a seal hands out no handle */
    ck_assert_int_eq(open_name(&b, "frame", 0), 1);
    ck_assert_int_eq(last(&b)->status, 0);
    ck_assert_uint_eq(last(&b)->buffer->buffer_id, id);
    ck_assert_int_ge(b.fds[b.n - 1], 0);
    ck_assert_uint_eq(gd_registry_holder_count(b.s->holder, id), 1);
    /* A session that goes drops its references. */
    mc_free(&b);
    ck_assert_uint_eq(gd_registry_find_id(&ctx.reg, id)->refs, 1);
    mc_free(&a);
    /* Named and sealed: it stays until deleted. */
    ck_assert_ptr_nonnull(gd_registry_find_name(&ctx.reg, "frame"));
    ctx_fini();
}
END_TEST

START_TEST(unsealed_buffers_go_with_their_session) {
    memconn a;
    start(0, &a, 1000, NULL, 0);
    ck_assert_int_eq(alloc(&a, "draft", 100)->status, 0);
    ck_assert_int_eq(alloc(&a, NULL, 100)->status, 0);
    ck_assert_uint_eq(ctx.reg.n_buffers, 2);
    mc_free(&a);
    ck_assert_uint_eq(ctx.reg.n_buffers, 0);
    ck_assert_uint_eq(ctx.pools[0]->used, 0);
    ctx_fini();
}
END_TEST

START_TEST(names_are_checked_by_the_registry) {
    memconn a;
    char long_name[GPUBUF_NAME_MAX + 2];
    start(0, &a, 1000, NULL, 0);
    ck_assert_int_eq(alloc(&a, "no spaces", 64)->status, -EINVAL);
    ck_assert_ptr_nonnull(strstr(last(&a)->message, "invalid name"));
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    ck_assert_int_eq(open_name(&a, long_name, 0), 1);
    ck_assert_int_eq(last(&a)->status, -ENAMETOOLONG);
    ck_assert_int_eq(open_name(&a, "/abs", 0), 1);
    ck_assert_int_eq(last(&a)->status, -EINVAL);
    /* The rule it breaks, not a list of allowed characters with '/' in it. */
    ck_assert_ptr_nonnull(strstr(last(&a)->message, "may not start with '/' (use 'abs')"));
    ck_assert_int_eq(alloc(&a, NULL, 0)->status, -EINVAL);
    ck_assert_ptr_nonnull(strstr(last(&a)->message, "size 0: a buffer holds at least 1 byte"));
    ck_assert(!a.closed);
    finish(&a, NULL);
}
END_TEST

/* A refused connection gets one frame that says why, id 0; each refusal is
 * counted by reason. */
START_TEST(refusals_say_why) {
    uint8_t buf[512];
    ctx_init(0);
    size_t n = gd_session_refusal(&ctx, GD_REFUSE_MAX_CLIENTS, 1000, 7, buf, sizeof(buf));
    Gpubuf__Response *r = gpubuf__response__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->id, 0);
    ck_assert_int_eq(r->status, -EUSERS);
    ck_assert_ptr_nonnull(strstr(r->message, "at most max_clients = 7 connections"));
    ck_assert_ptr_nonnull(strstr(r->message, "raise max_clients in gpubuf.conf"));
    gpubuf__response__free_unpacked(r, NULL);
    n = gd_session_refusal(&ctx, GD_REFUSE_MAX_CLIENTS_PER_UID, 1000, 3, buf, sizeof(buf));
    r = gpubuf__response__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(r);
    ck_assert_ptr_nonnull(strstr(r->message, "uid 1000 already has max_clients_per_uid = 3"));
    gpubuf__response__free_unpacked(r, NULL);
    n = gd_session_refusal(&ctx, GD_REFUSE_STOPPING, 1000, 0, buf, sizeof(buf));
    r = gpubuf__response__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, -ESHUTDOWN);
    gpubuf__response__free_unpacked(r, NULL);
    n = gd_session_refusal(&ctx, GD_REFUSE_NO_FDS, 1000, 0, buf, sizeof(buf));
    r = gpubuf__response__unpack(NULL, n, buf);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, -EMFILE);
    ck_assert_ptr_nonnull(strstr(r->message, "out of file descriptors"));
    gpubuf__response__free_unpacked(r, NULL);
    /* No room: no frame, but still counted. */
    ck_assert_uint_eq(gd_session_refusal(&ctx, GD_REFUSE_MAX_CLIENTS, 1000, 7, buf, 8), 0);
    ck_assert_uint_eq(ctx.metrics.refused[GD_REFUSE_MAX_CLIENTS], 2);
    ck_assert_uint_eq(ctx.metrics.refused[GD_REFUSE_MAX_CLIENTS_PER_UID], 1);
    ck_assert_uint_eq(ctx.metrics.refused[GD_REFUSE_STOPPING], 1);
    ck_assert_uint_eq(ctx.metrics.refused[GD_REFUSE_NO_FDS], 1);
    ctx_fini();
}
END_TEST

/* Where requests are dispatched they are counted: by type, their errors by
 * type and code, their time in a bucket; a slab handed to a session that
 * maps nothing in it is an import. */
START_TEST(requests_are_counted) {
    memconn a, b;
    start(0, &a, 1000, &b, 1000);
    const gd_metrics *m = &ctx.metrics;
    ck_assert_uint_eq(m->connections, 2);
    ck_assert_uint_eq(m->req[GD_REQ_HELLO].requests, 2);
    uint64_t id = alloc(&a, "cnt/x", 64)->buffer->buffer_id;
    ck_assert_uint_eq(alloc(&a, "cnt/y", 64)->status, 0); /* same slab: no import */
    ck_assert_int_eq(alloc(&a, "cnt/x", 64)->status, -EEXIST);
    seal(&a, id);
    ck_assert_int_eq(open_name(&b, "cnt/x", 0), 1); /* b maps the slab: an import */
    ck_assert_int_eq(open_name(&b, "cnt/none", 0), 1);
    ck_assert_uint_eq(m->req[GD_REQ_ALLOC].requests, 3);
    ck_assert_uint_eq(m->req[GD_REQ_ALLOC].errors, 1);
    ck_assert_uint_eq(m->req[GD_REQ_OPEN].requests, 2);
    ck_assert_uint_eq(m->req[GD_REQ_OPEN].errors, 1);
    ck_assert_uint_eq(m->req[GD_REQ_SEAL].requests, 1);
    ck_assert_uint_eq(m->slab_imports, 2);
    uint64_t in_buckets = 0, enoent = 0, eexist = 0;
    for (int i = 0; i <= GD_LATENCY_BOUNDS; i++)
        in_buckets += m->req[GD_REQ_ALLOC].buckets[i];
    ck_assert_uint_eq(in_buckets, 3);
    for (uint32_t i = 0; i < m->n_codes; i++) {
        enoent += m->errors[i].code == -ENOENT ? m->errors[i].count : 0;
        eexist += m->errors[i].code == -EEXIST ? m->errors[i].count : 0;
    }
    ck_assert_uint_eq(enoent, 1);
    ck_assert_uint_eq(eexist, 1);
    ck_assert_uint_eq(ctx.pools[0]->stats.bytes_allocated, 2 * 256);
    finish(&a, &b);
}
END_TEST

/* A pool only uid 1000 may use: uid 2000 can neither allocate, nor open,
 * nor be woken with a reference it must give back. */
START_TEST(pool_access_is_refused_with_reason) {
    memconn owner, other;
    start(1000, &owner, 1000, &other, 2000);
    ck_assert_int_eq(alloc(&other, "mine", 64)->status, -EACCES);
    ck_assert_ptr_nonnull(strstr(last(&other)->message, "may not use pool 'h'"));
    /* A waiting open of a name in a pool it may not use is refused at
     * once, before the name is looked up: it never waits there. */
    ck_assert_int_eq(open_name(&other, "later", -1), 1);
    ck_assert_int_eq(last(&other)->status, -EACCES);
    ck_assert_ptr_nonnull(strstr(last(&other)->message, "may not use pool 'h'"));
    ck_assert_uint_eq(ctx.reg.n_waiters, 0);
    /* A bad name is refused as such first, whatever the pool, and found
     * or not (the registry looks a name up before it checks it). */
    ck_assert_int_eq(open_name(&other, "bad name!", 0), 1);
    ck_assert_int_eq(last(&other)->status, -EINVAL);
    ck_assert_int_eq(open_name(&owner, "bad name!", 0), 1);
    ck_assert_int_eq(last(&owner)->status, -EINVAL);
    const Gpubuf__Response *r = alloc(&owner, "later", 64);
    ck_assert_int_eq(r->status, 0);
    uint64_t id = r->buffer->buffer_id;
    /* Refused before it is sealed too, and by id: the buffer's pool decides. */
    ck_assert_int_eq(open_name(&other, "later", 0), 1);
    ck_assert_int_eq(last(&other)->status, -EACCES);
    int before = other.n;
    seal(&owner, id);
    ck_assert_int_eq(other.n, before);
    ck_assert_uint_eq(other.s->holder->n_refs, 0);
    ck_assert_uint_eq(gd_registry_find_id(&ctx.reg, id)->refs, 1);
    ck_assert_uint_eq(ctx.reg.n_waiters, 0);
    ck_assert_uint_eq(other.s->n_waiters, 0);
    finish(&owner, &other);
}
END_TEST

START_TEST(waiting_open_times_out_on_the_loop) {
    memconn a;
    start(0, &a, 1000, NULL, 0);
    ck_assert_int_eq(open_name(&a, "never", 20), 0);
    ck_assert_uint_eq(a.s->n_waiters, 1);
    /* Poll the loop until the reply is there (the timer fires once). */
    while (a.n < 2)
        uv_run(&loop, UV_RUN_ONCE);
    ck_assert_int_eq(last(&a)->status, -ETIMEDOUT);
    ck_assert_ptr_nonnull(strstr(last(&a)->message, "'never'"));
    ck_assert_uint_eq(a.s->n_waiters, 0);
    finish(&a, NULL);
}
END_TEST

START_TEST(session_going_cancels_its_waits) {
    memconn a;
    start(0, &a, 1000, NULL, 0);
    ck_assert_int_eq(open_name(&a, "x", 60000), 0);
    ck_assert_int_eq(open_name(&a, "y", -1), 0);
    ck_assert_uint_eq(ctx.reg.n_waiters, 2);
    mc_free(&a);
    ck_assert_uint_eq(ctx.reg.n_waiters, 0);
    ctx_fini();
}
END_TEST

START_TEST(status_lists_live_sessions_only) {
    memconn a, b;
    Gpubuf__StatusRequest q = GPUBUF__STATUS_REQUEST__INIT;
    start(0, &a, 1000, &b, 1001);
    Gpubuf__Request req = rp_request(5, GPUBUF__REQUEST__BODY_STATUS, &q);
    ck_assert_int_eq(mc_request(&a, &req), 1);
    ck_assert_uint_eq(last(&a)->status_reply->n_clients, 2);
    ck_assert_uint_eq(last(&a)->status_reply->n_pools, 1);
    b.closed = true; /* going, not yet freed */
    ck_assert_int_eq(mc_request(&a, &req), 1);
    ck_assert_uint_eq(last(&a)->status_reply->n_clients, 1);
    ck_assert_uint_eq(last(&a)->status_reply->clients[0]->uid, 1000);
    finish(&a, &b);
}
END_TEST

START_TEST(shutdown_says_why_and_closes) {
    memconn a;
    start(0, &a, 1000, NULL, 0);
    gd_session_shutdown(a.s);
    ck_assert_int_eq(last(&a)->status, -ESHUTDOWN);
    ck_assert(a.closed);
    gd_session_bad_frame(a.s, -EMSGSIZE); /* closed: nothing more is sent */
    ck_assert_int_eq(last(&a)->status, -ESHUTDOWN);
    finish(&a, NULL);
}
END_TEST

/* A log line a client can trigger is let through GD_LOG_BURST times per
 * window; the first one after the window says how many were dropped. */
START_TEST(log_lines_are_rate_limited) {
    gd_log_limit l = {0};
    uint32_t sup = 99;
    for (unsigned i = 0; i < GD_LOG_BURST; i++) {
        ck_assert(gd_log_allow(&l, &sup));
        ck_assert_uint_eq(sup, 0);
    }
    for (unsigned i = 0; i < 1000; i++)
        ck_assert(!gd_log_allow(&l, &sup));
    l.window_start_ms -= GD_LOG_WINDOW_MS; /* the window is over */
    ck_assert(gd_log_allow(&l, &sup));
    ck_assert_uint_eq(sup, 1000);
    ck_assert(gd_log_allow(&l, &sup));
    ck_assert_uint_eq(sup, 0);
}
END_TEST

/* ---- names per pool ------------------------------------------------------ */

/* The squatting scenario of issue 11: the default pool "h" only TRUSTED
 * (and root) may use; "pub" is open to every uid, and with only_trusted
 * only TRUSTED may give buffers names there. */
#define TRUSTED 1000
#define SQUATTER 2000

static void ctx_init_pub(bool only_trusted) {
    ctx_init(TRUSTED);
    add_pool("pub", 0, only_trusted ? TRUSTED : 0);
}

static memconn *session_of(memconn *m, uid_t uid) {
    mc_open(m, uid);
    hello(m);
    return m;
}

/* ctx_init_pub(false) and a session each for a squatter and for a trusted
 * producer and consumer. */
static void squat_init(memconn *squatter, memconn *producer, memconn *consumer) {
    ctx_init_pub(false);
    session_of(squatter, SQUATTER);
    session_of(producer, TRUSTED);
    session_of(consumer, TRUSTED);
}

/* A sealed buffer of m named name in pool ("" : the default); its id. */
static uint64_t publish_in(memconn *m, const char *pool, const char *name) {
    const Gpubuf__Response *r = alloc_in(m, pool, name, 64);
    ck_assert_msg(r->status == 0, "alloc %s in '%s': %s", name, pool, r->message);
    uint64_t id = r->buffer->buffer_id;
    seal(m, id);
    ck_assert_int_eq(last(m)->status, 0);
    return id;
}

/* Open, stat or delete (body) name in pool ("": none named), expecting
 * owner when owner >= 0; returns the number of replies (0: an open waits). */
static int lookup(memconn *m, Gpubuf__Request__BodyCase body, const char *pool, const char *name,
                  long owner, int timeout_ms) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    Gpubuf__StatRequest st = GPUBUF__STAT_REQUEST__INIT;
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    Gpubuf__ExpectedOwner eo = GPUBUF__EXPECTED_OWNER__INIT;
    eo.uid = (uint32_t)owner;
    Gpubuf__ExpectedOwner *pe = owner >= 0 ? &eo : NULL;
    req.id = 21;
    req.body_case = body;
    if (body == GPUBUF__REQUEST__BODY_OPEN) {
        o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
        o.name = (char *)name;
        o.pool = (char *)pool;
        o.owner = pe;
        o.timeout_ms = timeout_ms;
        req.open = &o;
    } else if (body == GPUBUF__REQUEST__BODY_STAT) {
        st.target_case = GPUBUF__STAT_REQUEST__TARGET_NAME;
        st.name = (char *)name;
        st.pool = (char *)pool;
        st.owner = pe;
        req.stat = &st;
    } else {
        d.target_case = GPUBUF__DELETE_REQUEST__TARGET_NAME;
        d.name = (char *)name;
        d.pool = (char *)pool;
        d.owner = pe;
        req.delete_ = &d;
    }
    return mc_request(m, &req);
}

#define OPEN GPUBUF__REQUEST__BODY_OPEN
#define STAT GPUBUF__REQUEST__BODY_STAT
#define DELETE GPUBUF__REQUEST__BODY_DELETE

static bool has(const Gpubuf__Response *r, const char *text) {
    return r->message && strstr(r->message, text);
}

/* A uid allowed only in "pub" publishes "frames" and "late" first: the
 * trusted producer still publishes "frames" in its own (default) pool, and
 * the trusted consumer's unqualified opens, waiting ones included, only ever
 * get the trusted buffers. */
START_TEST(names_cannot_be_squatted_across_pools) {
    memconn squatter, producer, consumer;
    squat_init(&squatter, &producer, &consumer);
    uint64_t fake = publish_in(&squatter, "pub", "frames");
    /* The squatter cannot reach the default pool at all. */
    ck_assert_int_eq(alloc_in(&squatter, "", "frames2", 64)->status, -EACCES);
    ck_assert_int_eq(lookup(&squatter, OPEN, "", "anything", -1, -1), 1);
    ck_assert_int_eq(last(&squatter)->status, -EACCES);
    /* Not published in the default pool yet: not found, and the message
     * says where a buffer of that name is (and whose). */
    ck_assert_int_eq(lookup(&consumer, OPEN, "", "frames", -1, 0), 1);
    ck_assert_int_eq(last(&consumer)->status, -ENOENT);
    ck_assert(has(last(&consumer), "in pool 'h' (the default pool)"));
    ck_assert(has(last(&consumer), "'/pub/frames'"));
    ck_assert(has(last(&consumer), "of uid 2000"));
    /* The trusted producer is not blocked by the other pool's name. */
    const Gpubuf__Response *r = alloc_in(&producer, "", "frames", 64);
    ck_assert_msg(r->status == 0, "%s", r->message);
    uint64_t real = r->buffer->buffer_id;
    ck_assert_uint_ne(real, fake);
    /* A second "frames" in the same pool is still refused. */
    ck_assert_int_eq(alloc_in(&producer, "h", "frames", 64)->status, -EEXIST);
    ck_assert(has(last(&producer), "exists in pool 'h'"));
    /* A waiting open of "frames" is not answered with the squatter's. */
    ck_assert_int_eq(lookup(&consumer, OPEN, "", "frames", -1, -1), 0);
    seal(&producer, real);
    ck_assert_int_eq(last(&consumer)->status, 0);
    ck_assert_uint_eq(last(&consumer)->buffer->buffer_id, real);
    ck_assert_str_eq(last(&consumer)->buffer->pool, "h");
    /* A name the squatter publishes first while the consumer waits. */
    ck_assert_int_eq(lookup(&consumer, OPEN, "", "late", -1, -1), 0);
    int before = consumer.n;
    publish_in(&squatter, "pub", "late");
    ck_assert_int_eq(consumer.n, before); /* still waiting */
    uint64_t late = publish_in(&producer, "", "late");
    ck_assert_int_eq(consumer.n, before + 1);
    ck_assert_uint_eq(last(&consumer)->buffer->buffer_id, late);
    /* Naming the pool finds the other one; stat and delete look in one pool. */
    ck_assert_int_eq(lookup(&consumer, OPEN, "pub", "frames", -1, 0), 1);
    ck_assert_uint_eq(last(&consumer)->buffer->buffer_id, fake);
    ck_assert_int_eq(lookup(&consumer, STAT, "", "frames", -1, 0), 1);
    ck_assert_uint_eq(last(&consumer)->buffer->buffer_id, real);
    ck_assert_int_eq(lookup(&consumer, OPEN, "nosuch", "frames", -1, 0), 1);
    ck_assert_int_eq(last(&consumer)->status, GPUBUF_ENOPOOL);
    ck_assert_int_eq(lookup(&squatter, DELETE, "", "frames", -1, 0), 1);
    ck_assert_int_eq(last(&squatter)->status, -EPERM); /* root's, not its own */
    ck_assert_int_eq(lookup(&squatter, DELETE, "pub", "frames", -1, 0), 1);
    ck_assert_int_eq(last(&squatter)->status, 0);
    ck_assert_ptr_nonnull(gd_registry_find_name(&ctx.reg, "frames"));
    mc_free(&consumer);
    mc_free(&producer);
    finish(&squatter, NULL);
}
END_TEST

/* publish_uids: only the listed uids (and root) give buffers names in
 * "pub"; anyone the pool allows may still allocate anonymous buffers. */
START_TEST(publishers_rule_refuses_with_reason) {
    memconn squatter, producer;
    ctx_init_pub(true);
    session_of(&squatter, SQUATTER);
    session_of(&producer, TRUSTED);
    ck_assert_int_eq(alloc_in(&squatter, "pub", "frames", 64)->status, -EPERM);
    ck_assert(has(last(&squatter), "uid 2000 may not give buffers names in pool 'pub'"));
    ck_assert_int_eq(alloc_in(&squatter, "pub", NULL, 64)->status, 0);
    publish_in(&producer, "pub", "frames");
    /* Before the name is looked up: the refusal does not say it is taken. */
    ck_assert_int_eq(alloc_in(&squatter, "pub", "frames", 64)->status, -EPERM);
    memconn root;
    session_of(&root, 0);
    publish_in(&root, "pub", "root-frames");
    /* Status shows the rule and the default pool. */
    Gpubuf__StatusRequest sq = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Request req = rp_request(30, GPUBUF__REQUEST__BODY_STATUS, &sq);
    ck_assert_int_eq(mc_request(&root, &req), 1);
    const Gpubuf__StatusReply *st = last(&root)->status_reply;
    ck_assert_uint_eq(st->n_pools, 2);
    ck_assert(st->pools[0]->default_pool && !st->pools[1]->default_pool);
    ck_assert_str_eq(st->pools[0]->publishers, "");
    ck_assert_str_eq(st->pools[1]->publishers, "uid 1000");
    mc_free(&root);
    mc_free(&producer);
    finish(&squatter, NULL);
}
END_TEST

/* An open, stat or delete that names the owner it expects is refused
 * (-EPERM, with the owner in the sentence) for another uid's buffer; a
 * waiting open is refused when such a buffer is sealed under its name. */
START_TEST(expected_owner_mismatch_is_refused) {
    memconn squatter, producer, consumer;
    squat_init(&squatter, &producer, &consumer);
    publish_in(&squatter, "pub", "frames");
    uint64_t mine = publish_in(&producer, "pub", "mine");
    for (int body = 0; body < 3; body++) {
        Gpubuf__Request__BodyCase b = body == 0 ? OPEN : body == 1 ? STAT : DELETE;
        ck_assert_int_eq(lookup(&consumer, b, "pub", "frames", TRUSTED, 0), 1);
        ck_assert_int_eq(last(&consumer)->status, -EPERM);
        ck_assert(has(last(&consumer), "belongs to uid 2000, not to uid 1000"));
    }
    ck_assert_uint_eq(consumer.s->holder->n_refs, 0);
    ck_assert_int_eq(lookup(&consumer, OPEN, "pub", "mine", TRUSTED, 0), 1);
    ck_assert_uint_eq(last(&consumer)->buffer->buffer_id, mine);
    /* Owner 0 is an owner too (not "none"). */
    ck_assert_int_eq(lookup(&consumer, OPEN, "pub", "mine", 0, 0), 1);
    ck_assert_int_eq(last(&consumer)->status, -EPERM);
    /* Waiting: the squatter's seal fails the wait at once. */
    ck_assert_int_eq(lookup(&consumer, OPEN, "pub", "w", TRUSTED, -1), 0);
    const Gpubuf__Response *r = alloc_in(&squatter, "pub", "w", 64);
    uint64_t w = r->buffer->buffer_id;
    /* Allocated, not sealed: a new open with the owner is refused at once. */
    ck_assert_int_eq(lookup(&producer, OPEN, "pub", "w", TRUSTED, -1), 1);
    ck_assert_int_eq(last(&producer)->status, -EPERM);
    int before = consumer.n;
    seal(&squatter, w);
    ck_assert_int_eq(consumer.n, before + 1);
    ck_assert_int_eq(last(&consumer)->status, -EPERM);
    ck_assert(has(last(&consumer), "belongs to uid 2000"));
    ck_assert_uint_eq(ctx.reg.n_waiters, 0);
    ck_assert_uint_eq(consumer.s->holder->n_refs, 1); /* "mine" only */
    mc_free(&consumer);
    mc_free(&producer);
    finish(&squatter, NULL);
}
END_TEST

/* ---- batches ------------------------------------------------------------ */

static const Gpubuf__BatchReply *batch_reply(const memconn *m, size_t n) {
    const Gpubuf__Response *r = last(m);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->body_case, GPUBUF__RESPONSE__BODY_BATCH);
    ck_assert_uint_eq(r->batch->n_status, n);
    return r->batch;
}

/* The daemon's sentence for item i. */
static const char *item_msg(const Gpubuf__BatchReply *br, uint32_t i) {
    for (size_t k = 0; k < br->n_errors; k++)
        if (br->errors[k]->item == i)
            return br->errors[k]->message;
    return "";
}

/* The targets of a batch request q (names, then buffer ids), and the slabs
 * the client has mapped. */
#define BATCH_TARGETS(q, names_, n_names_, ids_, n_ids_)                                          \
    ((q).n_names = (n_names_), (q).names = (names_), (q).n_buffer_ids = (n_ids_),                \
     (q).buffer_ids = (ids_))
#define BATCH_MAPPED(q, mapped_, n_mapped_)                                                       \
    ((q).n_mapped_slabs = (n_mapped_), (q).mapped_slabs = (mapped_))

static const Gpubuf__BatchReply *batch_open(memconn *m, char **names, size_t n_names,
                                            uint64_t *ids, size_t n_ids, uint64_t *mapped,
                                            size_t n_mapped) {
    Gpubuf__BatchOpenRequest q = GPUBUF__BATCH_OPEN_REQUEST__INIT;
    BATCH_TARGETS(q, names, n_names, ids, n_ids);
    BATCH_MAPPED(q, mapped, n_mapped);
    send_answered(m, 20, GPUBUF__REQUEST__BODY_BATCH_OPEN, &q);
    return batch_reply(m, n_names + n_ids);
}

static const Gpubuf__Response *batch_state(memconn *m, Gpubuf__BatchStateOp op, char **names,
                                           size_t n_names, uint64_t *ids, size_t n_ids) {
    Gpubuf__BatchStateRequest q = GPUBUF__BATCH_STATE_REQUEST__INIT;
    q.op = op;
    BATCH_TARGETS(q, names, n_names, ids, n_ids);
    send_answered(m, 21, GPUBUF__REQUEST__BODY_BATCH_STATE, &q);
    return last(m);
}

static const Gpubuf__Response *batch_release(memconn *m, uint64_t *ids, size_t n) {
    Gpubuf__BatchReleaseRequest q = GPUBUF__BATCH_RELEASE_REQUEST__INIT;
    q.n_buffer_ids = n;
    q.buffer_ids = ids;
    send_answered(m, 22, GPUBUF__REQUEST__BODY_BATCH_RELEASE, &q);
    return last(m);
}

static const Gpubuf__Response *batch_alloc(memconn *m, uint64_t size, size_t n, bool seal,
                                           uint64_t *mapped, size_t n_mapped) {
    Gpubuf__BatchAllocRequest q = GPUBUF__BATCH_ALLOC_REQUEST__INIT;
    uint64_t sizes[64];
    ck_assert_uint_le(n, 64);
    for (size_t i = 0; i < n; i++)
        sizes[i] = size;
    q.n_sizes = n;
    q.sizes = sizes;
    q.seal = seal;
    BATCH_MAPPED(q, mapped, n_mapped);
    send_answered(m, 23, GPUBUF__REQUEST__BODY_BATCH_ALLOC, &q);
    return last(m);
}

START_TEST(batch_items_fail_independently) {
    memconn a, b;
    start(1000, &a, 1000, &b, 2000);
    const Gpubuf__Response *r = alloc(&a, "x", 4096);
    uint64_t x = r->buffer->buffer_id, xslab = r->buffer->slab_id;
    seal(&a, x);
    uint64_t y = alloc(&a, "y", 4096)->buffer->buffer_id; /* not sealed */
    /* Found, missing, not sealed yet, a bad name; by id: found, unknown. */
    char *names[] = {"x", "missing", "y", "bad name!"};
    uint64_t ids[] = {x, 999999};
    const Gpubuf__BatchReply *br = batch_open(&a, names, 4, ids, 2, NULL, 0);
    ck_assert_int_eq(br->status[0], 0);
    ck_assert_int_eq(br->status[1], -ENOENT);
    ck_assert_ptr_nonnull(strstr(item_msg(br, 1), "missing"));
    ck_assert_int_eq(br->status[2], -ENOENT);
    ck_assert_int_eq(br->status[3], -EINVAL);
    ck_assert_int_eq(br->status[4], 0);
    ck_assert_int_eq(br->status[5], -ENOENT);
    ck_assert_uint_eq(br->n_errors, 4);
    ck_assert_uint_eq(br->buffer_id[0], x);
    ck_assert_uint_eq(br->buffer_id[4], x);
    ck_assert_uint_eq(br->slab_id[4], xslab);
    ck_assert_uint_eq(br->buffer_id[1], 0);
    /* Names: one per item, "" for failed ones. */
    ck_assert_mem_eq(br->names.data, "x\0\0\0\0x\0\0", 8);
    /* The slab is described once, with its fd. */
    ck_assert_uint_eq(br->n_slabs, 1);
    ck_assert_uint_eq(br->slabs[0]->slab_id, xslab);
    ck_assert_int_eq(a.n_fds[a.n - 1], 1);
    ck_assert_uint_eq(gd_registry_holder_count(a.s->holder, x), 3);
    /* A slab the client says it maps travels no more. */
    br = batch_open(&a, names, 1, NULL, 0, &xslab, 1);
    ck_assert_int_eq(br->status[0], 0);
    ck_assert_uint_eq(br->n_slabs, 0);
    ck_assert_int_eq(a.n_fds[a.n - 1], 0);
    /* No access to the pool. */
    br = batch_open(&b, names, 1, NULL, 0, NULL, 0);
    ck_assert_int_eq(br->status[0], -EACCES);
    ck_assert_uint_eq(b.s->holder->n_refs, 0);
    /* Seal: y once; twice and x are in the wrong state. */
    uint64_t seal_ids[] = {y, y, x};
    r = batch_state(&a, GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_SEAL, NULL, 0, seal_ids, 3);
    br = batch_reply(&a, 3);
    ck_assert_int_eq(br->status[0], 0);
    ck_assert_int_eq(br->status[1], GPUBUF_ESTATE);
    ck_assert_int_eq(br->status[2], GPUBUF_ESTATE);
    ck_assert_int_eq(gd_registry_find_id(&ctx.reg, y)->state, GPUBUF_STATE_SEALED);
    /* Release: a holds x four times (alloc, three opens); the fifth fails. */
    uint64_t rel[] = {x, x, x, x, x, 424242};
    r = batch_release(&a, rel, 6);
    br = batch_reply(&a, 6);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(br->status[i], 0);
    ck_assert_int_eq(br->status[4], GPUBUF_ENOTHELD);
    ck_assert_int_eq(br->status[5], GPUBUF_ENOTHELD);
    ck_assert_uint_eq(gd_registry_holder_count(a.s->holder, x), 0);
    ck_assert_uint_eq(gd_registry_find_id(&ctx.reg, x)->refs, 0);
    /* Delete: b may not (another uid), a may; a missing name fails alone. */
    char *del[] = {"x", "nope"};
    batch_state(&b, GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_DELETE, del, 1, NULL, 0);
    ck_assert_int_eq(batch_reply(&b, 1)->status[0], -EPERM);
    batch_state(&a, GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_DELETE, del, 2, NULL, 0);
    br = batch_reply(&a, 2);
    ck_assert_int_eq(br->status[0], 0);
    ck_assert_int_eq(br->status[1], -ENOENT);
    ck_assert_ptr_null(gd_registry_find_name(&ctx.reg, "x"));
    /* Items and their errors are counted by batch type. */
    ck_assert_uint_eq(ctx.metrics.batch[GD_REQ_BATCH_OPEN - GD_REQ_BATCH_OPEN].items, 8);
    ck_assert_uint_eq(ctx.metrics.batch[GD_REQ_BATCH_OPEN - GD_REQ_BATCH_OPEN].item_errors, 5);
    ck_assert_uint_eq(ctx.metrics.req[GD_REQ_BATCH_RELEASE].requests, 1);
    ck_assert_uint_eq(ctx.metrics.batch[GD_REQ_BATCH_RELEASE - GD_REQ_BATCH_OPEN].item_errors,
                      2);
    ck_assert_uint_eq(ctx.metrics.req[GD_REQ_BATCH_DELETE].requests, 2);
    mc_forget(&a);
    mc_forget(&b);
    finish(&a, &b);
}
END_TEST

/* with_meta: one metadata entry per item, or (sparse_meta) entries only
 * for items that have a layout, user bytes or a lease, listed in
 * meta_items: a plain buffer's costs nothing in the reply. */
START_TEST(batch_open_meta_dense_or_sparse) {
    memconn a;
    start(1000, &a, 0, NULL, 0);
    uint64_t x = alloc(&a, "x", 4096)->buffer->buffer_id;
    seal(&a, x);
    uint64_t ids[] = {x, 999999, x};
    for (int sparse = 0; sparse <= 1; sparse++) {
        Gpubuf__BatchOpenRequest q = GPUBUF__BATCH_OPEN_REQUEST__INIT;
        BATCH_TARGETS(q, NULL, 0, ids, 3);
        q.with_meta = true;
        q.sparse_meta = sparse;
        send_answered(&a, 20, GPUBUF__REQUEST__BODY_BATCH_OPEN, &q);
        const Gpubuf__BatchReply *br = batch_reply(&a, 3);
        ck_assert_int_eq(br->status[0], 0);
        ck_assert_int_eq(br->status[1], -ENOENT);
        ck_assert_uint_eq(br->n_layouts, sparse ? 0 : 3);
        ck_assert_uint_eq(br->n_user_data, sparse ? 0 : 3);
        ck_assert_uint_eq(br->n_lease_left_ms, sparse ? 0 : 3);
        ck_assert_uint_eq(br->n_meta_items, 0);
        if (!sparse)
            ck_assert_uint_eq(br->layouts[0]->dtype_bits, 0); /* none: an empty layout */
    }
    ck_assert_uint_eq(gd_registry_holder_count(a.s->holder, x), 5);
    mc_forget(&a);
    finish(&a, NULL);
}
END_TEST

START_TEST(oversize_and_malformed_batches_are_refused) {
    memconn a;
    start(0, &a, 1000, NULL, 0);
    uint64_t *ids = calloc(GD_BATCH_MAX_ITEMS + 1, sizeof(*ids));
    ck_assert_ptr_nonnull(ids);
    const Gpubuf__Response *r = batch_release(&a, ids, GD_BATCH_MAX_ITEMS + 1);
    ck_assert_int_eq(r->status, -E2BIG);
    ck_assert_ptr_nonnull(strstr(r->message, "at most 4096 items"));
    /* At the limit it is taken (each item fails alone: nothing is held). */
    r = batch_release(&a, ids, GD_BATCH_MAX_ITEMS);
    ck_assert_int_eq(batch_reply(&a, GD_BATCH_MAX_ITEMS)->status[0], GPUBUF_ENOTHELD);
    free(ids);
    r = batch_state(&a, GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_UNSPECIFIED, NULL, 0, NULL, 0);
    ck_assert_int_eq(r->status, -EINVAL);
    char *names[] = {"a"};
    r = batch_state(&a, GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_SEAL, names, 1, NULL, 0);
    ck_assert_int_eq(r->status, -EINVAL);
    /* The hello says the limits. */
    mc_forget(&a);
    finish(&a, NULL);
}
END_TEST

START_TEST(batch_reply_carries_at_most_its_fd_room) {
    memconn a;
    start(0, &a, 1000, NULL, 0);
    /* 600 KiB buffers of a pool of 1 MiB slabs: one slab each. */
    a.fd_room = 3;
    const Gpubuf__Response *r = batch_alloc(&a, 600 * 1024, 6, true, NULL, 0);
    const Gpubuf__BatchReply *br = batch_reply(&a, 6);
    ck_assert_int_eq(r->fds, 3);
    ck_assert_int_eq(a.n_fds[a.n - 1], 3);
    ck_assert_uint_eq(br->n_slabs, 3);
    uint64_t mapped[3];
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(br->status[i], 0);
        ck_assert_uint_eq(br->state[i], GPUBUF_STATE_SEALED);
        mapped[i] = br->slabs[i]->slab_id;
    }
    for (int i = 3; i < 6; i++) {
        ck_assert_int_eq(br->status[i], -EAGAIN);
        ck_assert_ptr_nonnull(strstr(item_msg(br, (uint32_t)i), "send the item again"));
    }
    /* The refused items left nothing behind. */
    ck_assert_uint_eq(ctx.reg.n_buffers, 3);
    ck_assert_uint_eq(a.s->holder->n_refs, 3);
    /* Sent again, with the slabs mapped by now: they fit. */
    a.fd_room = 0;
    r = batch_alloc(&a, 600 * 1024, 3, true, mapped, 3);
    br = batch_reply(&a, 3);
    ck_assert_int_eq(r->fds, 3);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(br->status[i], 0);
        for (int k = 0; k < 3; k++)
            ck_assert_uint_ne(br->slabs[i]->slab_id, mapped[k]);
    }
    ck_assert_uint_eq(ctx.reg.n_buffers, 6);
    mc_forget(&a);
    finish(&a, NULL);
}
END_TEST

/* A batch whose largest reply the reply memory has no room for is left
 * unhandled (no reference taken, no reply) and handled whole once there is
 * room; replies with the longest names and sentences stay within the bound
 * (mc_send_fds checks every batch reply against it). */
START_TEST(batch_waits_for_reply_memory) {
    memconn a;
    char longname[GPUBUF_NAME_MAX + 1], missing[GPUBUF_NAME_MAX + 1];
    start(0, &a, 1000, NULL, 0);
    memset(longname, 'n', GPUBUF_NAME_MAX);
    longname[GPUBUF_NAME_MAX] = 0;
    memcpy(missing, longname, sizeof(missing));
    missing[0] = 'm';
    const Gpubuf__Response *r = alloc(&a, longname, 4096);
    uint64_t x = r->buffer->buffer_id;
    seal(&a, x);
    /* Room for a reply of 7 items, not 8. */
    a.room_limited = true;
    a.room = gd_session_batch_reply_bound(7, false);
    ck_assert_uint_gt(gd_session_batch_reply_bound(8, false), a.room);
    uint64_t ids[8];
    char *names[8];
    for (int i = 0; i < 8; i++) {
        ids[i] = x;
        names[i] = i % 2 ? longname : missing;
    }
    Gpubuf__BatchOpenRequest q = GPUBUF__BATCH_OPEN_REQUEST__INIT;
    q.n_names = 8;
    q.names = names;
    Gpubuf__Request req = rp_request(30, GPUBUF__REQUEST__BODY_BATCH_OPEN, &q);
    ck_assert_int_eq(mc_request(&a, &req), 0);
    ck_assert_int_eq(a.frame_rc, -EAGAIN);
    ck_assert_uint_eq(a.asked, gd_session_batch_reply_bound(8, false));
    ck_assert_uint_eq(a.s->holder->n_refs, 1); /* the allocation's only */
    /* Single requests and smaller batches go on meanwhile. */
    const Gpubuf__BatchReply *br = batch_open(&a, NULL, 0, ids, 7, NULL, 0);
    ck_assert_int_eq(a.frame_rc, 0);
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(br->status[i], 0);
    ck_assert_uint_eq(a.s->holder->n_refs, 8);
    /* Room now: the same frame is handled, longest names and errors. */
    a.room = gd_session_batch_reply_bound(8, false);
    ck_assert_int_eq(mc_request(&a, &req), 1);
    ck_assert_int_eq(a.frame_rc, 0);
    br = batch_reply(&a, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(br->status[i], i % 2 ? 0 : -ENOENT);
    ck_assert_uint_eq(br->n_errors, 4);
    ck_assert_uint_eq(a.s->holder->n_refs, 12);
    /* A batch of more items than allowed is refused whatever the room. */
    a.room = 0;
    uint64_t many[GD_BATCH_MAX_ITEMS + 1];
    for (size_t i = 0; i <= GD_BATCH_MAX_ITEMS; i++)
        many[i] = x;
    Gpubuf__BatchReleaseRequest rq = GPUBUF__BATCH_RELEASE_REQUEST__INIT;
    rq.n_buffer_ids = GD_BATCH_MAX_ITEMS + 1;
    rq.buffer_ids = many;
    req.body_case = GPUBUF__REQUEST__BODY_BATCH_RELEASE;
    req.batch_release = &rq;
    ck_assert_int_eq(mc_request(&a, &req), 1);
    ck_assert_int_eq(last(&a)->status, -E2BIG);
    mc_forget(&a);
    finish(&a, NULL);
}
END_TEST

/* ---- slabs sent once (GPUBUF_CAP_SLAB_ONCE) ------------------------------ */

static void hello_caps(memconn *m, uint64_t caps) {
    rp_hello h;
    rp_hello_init(&h, caps, NULL);
    ck_assert_int_eq(mc_request(m, &h.req), 1);
    ck_assert_int_eq(last(m)->status, 0);
    ck_assert_uint_eq(last(m)->hello->capabilities, caps);
}

/* Open name (read-only if ro); the reply must succeed. Returns whether it
 * carried the slab's fd (checked against Response.fds). */
static bool open_fd(memconn *m, const char *name, bool ro) {
    ck_assert_int_eq(open_name_ro(m, name, 0, ro), 1);
    const Gpubuf__Response *r = last(m);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->fds, m->fds[m->n - 1] >= 0 ? 1 : 0);
    ck_assert(r->buffer->read_only == ro && r->buffer->slab->read_only == ro);
    return r->fds == 1;
}

static void release_ref(memconn *m, uint64_t id, bool ro, bool keep) {
    Gpubuf__ReleaseRequest q = GPUBUF__RELEASE_REQUEST__INIT;
    q.buffer_id = id;
    q.read_only = ro;
    q.keep_mapped = keep;
    send_answered(m, 13, GPUBUF__REQUEST__BODY_RELEASE, &q);
    ck_assert_int_eq(last(m)->status, 0);
}

/* With SLAB_ONCE, an alloc or open reply carries the slab's fd only when
 * the connection holds no other reference of the same mode in that slab
 * and does not keep it mapped; without it, every such reply does. */
START_TEST(slab_fd_is_sent_only_when_not_mapped) {
    memconn a, b, old;
    ctx_init(0);
    mc_open(&a, 1000);
    hello_caps(&a, GPUBUF_CAP_SLAB_ONCE | GPUBUF_CAP_KEEP_MAPPED);
    mc_open(&b, 1000);
    hello_caps(&b, GPUBUF_CAP_SLAB_ONCE);
    mc_open(&old, 1000);
    hello_caps(&old, 0);
    /* a: the first allocation in a slab brings its fd, the second not. */
    const Gpubuf__Response *r = alloc(&a, "x", 4096);
    ck_assert_int_eq(r->fds, 1);
    uint64_t x = r->buffer->buffer_id, slab = r->buffer->slab_id;
    seal(&a, x);
    r = alloc(&a, "y", 4096);
    ck_assert_uint_eq(r->buffer->slab_id, slab);
    ck_assert_int_eq(r->fds, 0);
    ck_assert_int_eq(r->buffer->slab->ipc_handle.len, 0);
    uint64_t y = r->buffer->buffer_id;
    seal(&a, y);
    /* b: first open of the slab with its fd; while it holds that, none. */
    ck_assert(open_fd(&b, "x", false));
    ck_assert(!open_fd(&b, "x", false));
    ck_assert(!open_fd(&b, "y", false));
    /* Read-only is another mapping: its own fd once. */
    ck_assert(open_fd(&b, "y", true));
    ck_assert(!open_fd(&b, "x", true));
    /* All read-write references go: the next read-write open maps again,
     * while the read-only ones still need no fd. */
    release_ref(&b, x, false, false);
    release_ref(&b, x, false, false);
    release_ref(&b, y, false, false);
    ck_assert(open_fd(&b, "y", false));
    release_ref(&b, y, false, false);
    release_ref(&b, y, true, false);
    ck_assert(!open_fd(&b, "y", true));
    release_ref(&b, x, true, false);
    release_ref(&b, y, true, false);
    ck_assert(open_fd(&b, "x", true));
    release_ref(&b, x, true, false);
    ck_assert_uint_eq(b.s->holder->n_refs, 0);
    /* a keeps the slab mapped after its last reference: no fd then, until
     * it says it unmapped it. */
    release_ref(&a, x, false, false);
    release_ref(&a, y, false, true);
    ck_assert_uint_eq(a.s->holder->n_kept, 1);
    ck_assert(!open_fd(&a, "x", false));
    release_ref(&a, x, false, true);
    Gpubuf__UnmapRequest u = GPUBUF__UNMAP_REQUEST__INIT;
    u.slab_id = slab;
    Gpubuf__Request req = rp_request(14, GPUBUF__REQUEST__BODY_UNMAP, &u);
    ck_assert_int_eq(mc_request(&a, &req), 1);
    ck_assert_int_eq(last(&a)->status, 0);
    ck_assert(open_fd(&a, "x", false));
    /* A client without the capability gets the fd every time. */
    ck_assert(open_fd(&old, "x", false));
    ck_assert(open_fd(&old, "x", false));
    ck_assert(open_fd(&old, "y", true));
    ck_assert(open_fd(&old, "y", true));
    mc_forget(&a);
    mc_forget(&b);
    mc_forget(&old);
    mc_free(&old);
    finish(&a, &b);
}
END_TEST

int main(void) {
    const TTest *tests[] = {
        first_request_must_be_hello,
        hello_makes_the_connection_ready,
        undecodable_request_disconnects,
        alloc_seal_open_across_sessions,
        unsealed_buffers_go_with_their_session,
        names_are_checked_by_the_registry,
        refusals_say_why,
        requests_are_counted,
        pool_access_is_refused_with_reason,
        waiting_open_times_out_on_the_loop,
        session_going_cancels_its_waits,
        status_lists_live_sessions_only,
        shutdown_says_why_and_closes,
        log_lines_are_rate_limited,
        names_cannot_be_squatted_across_pools,
        publishers_rule_refuses_with_reason,
        expected_owner_mismatch_is_refused,
        batch_items_fail_independently, batch_open_meta_dense_or_sparse,
        oversize_and_malformed_batches_are_refused,
        batch_reply_carries_at_most_its_fd_room,
        batch_waits_for_reply_memory,
        slab_fd_is_sent_only_when_not_mapped,
    };
    Suite *s = suite_create("session");
    TCase *t = add_case(s, "inproc", NULL, NULL, 0);
    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++)
        tcase_add_test(t, tests[i]);
    return run_suite(s);
}
