#include "daemon.h"

#include <stddef.h>
#include <utlist.h>

#include "config.h"
#include "session.h"
#include "state.h"

/* The server's connections as the sessions' transport. */
static int conn_send(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                     const void *msg, int fd) {
    return gd_conn_send(conn, len, pack, msg, fd);
}

static int conn_send_fds(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                         const void *msg, const int *fds, int n_fds, bool bounded) {
    return gd_conn_send_fds(conn, len, pack, msg, fds, n_fds, bounded);
}

static unsigned conn_fd_room(const void *conn) {
    return gd_conn_fd_room(conn);
}

static unsigned conn_fds_held(const void *conn) {
    return gd_conn_fds_held(conn);
}

static bool conn_reply_room(void *conn, size_t bound) {
    return gd_conn_reply_room(conn, bound);
}

static void conn_close(void *conn) {
    gd_conn_close(conn);
}

static void conn_ready(void *conn) {
    gd_conn_ready(conn);
}

static bool conn_closing(const void *conn) {
    return gd_conn_closing(conn);
}

static const gd_transport conn_transport = {
    .send = conn_send,
    .close = conn_close,
    .ready = conn_ready,
    .closing = conn_closing,
    .send_fds = conn_send_fds,
    .fd_room = conn_fd_room,
    .reply_room = conn_reply_room,
    .fds_held = conn_fds_held,
};

static void *on_open(void *data, gd_conn *c, pid_t pid, uid_t uid, gid_t gid) {
    gd_daemon *d = data;
    return gd_session_new(&d->ctx, &conn_transport, c, pid, uid, gid);
}

/* Every change a request makes is saved as one group before its reply
 * leaves (state.h: gd_state_begin). */
static int on_frame(void *user, const uint8_t *payload, size_t len, uint64_t woke_ns,
                    uint64_t read_ns) {
    gd_state *st = ((gd_session *)user)->ctx->state;
    gd_state_begin(st);
    int r = gd_session_frame_at(user, payload, len, woke_ns, read_ns);
    gd_state_end(st);
    return r;
}

static void on_bad_frame(void *user, int err) {
    gd_session_bad_frame(user, err);
}

/* Why a session ended, as status counts it: the server's reason, or the
 * session's own when it closed the connection itself. */
static gd_end_reason end_reason(const gd_session *s, gd_close_reason why) {
    switch (why) {
    case GD_CLOSE_BY_USER: return s->end != GD_END_NONE ? s->end : GD_END_OTHER;
    case GD_CLOSE_PEER: return GD_END_CLOSED;
    case GD_CLOSE_TIMEOUT: return GD_END_TIMEOUT;
    case GD_CLOSE_BACKLOG: return GD_END_BACKLOG;
    case GD_CLOSE_BAD_FRAME: return GD_END_PROTOCOL;
    case GD_CLOSE_STOP: return GD_END_SHUTDOWN;
    default: return GD_END_OTHER;
    }
}

static void on_close(void *user, gd_close_reason why) {
    gd_session *s = user;
    s->ctx->metrics.ended[end_reason(s, why)]++;
    gd_session_free(s);
}

static size_t on_refuse(void *data, gd_refusal why, uid_t uid, uint32_t limit, uint8_t *payload,
                        size_t cap) {
    gd_daemon *d = data;
    return gd_session_refusal(&d->ctx, why, uid, limit, payload, cap);
}

/* References of departed clients, dropped a bounded number per turn of the
 * loop (docs/architecture.md). */
#define RELEASES_PER_TURN 1024u

static bool on_work(void *data) {
    gd_daemon *d = data;
    return gd_registry_reap(&d->ctx.reg, RELEASES_PER_TURN);
}

static const gd_server_callbacks callbacks = {
    .on_open = on_open,
    .on_frame = on_frame,
    .on_bad_frame = on_bad_frame,
    .on_close = on_close,
    .on_refuse = on_refuse,
    .on_work = on_work,
};

static void want_work(gd_context *ctx) {
    gd_daemon *d = (gd_daemon *)(void *)((char *)ctx - offsetof(gd_daemon, ctx));
    gd_server_want_work(&d->srv);
}

int gd_daemon_init(gd_daemon *d, uv_loop_t *loop) {
    gd_context_init(&d->ctx, loop);
    d->ctx.want_work = want_work;
    gd_config_defaults(&d->ctx.limits, &d->ctx.reg.quota);
    return gd_server_init(&d->srv, loop, &d->ctx.limits, &callbacks, d);
}

void gd_daemon_stop(gd_daemon *d) {
    gd_session *s;
    if (!d->srv.stopping)
        DL_FOREACH(d->ctx.sessions, s)
            gd_session_shutdown(s);
    gd_context_stop(&d->ctx);
    gd_server_stop(&d->srv);
}

void gd_daemon_destroy(gd_daemon *d) {
    gd_server_destroy(&d->srv);
    gd_context_destroy(&d->ctx);
}
