#include "daemon.h"

#include <utlist.h>

#include "config.h"
#include "session.h"

/* The server's connections as the sessions' transport. */
static int conn_send(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                     const void *msg, int fd) {
    return gd_conn_send(conn, len, pack, msg, fd);
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
};

static void *on_open(void *data, gd_conn *c, pid_t pid, uid_t uid, gid_t gid) {
    gd_daemon *d = data;
    return gd_session_new(&d->ctx, &conn_transport, c, pid, uid, gid);
}

static void on_frame(void *user, const uint8_t *payload, size_t len) {
    gd_session_frame(user, payload, len);
}

static void on_bad_frame(void *user, int err) {
    gd_session_bad_frame(user, err);
}

static void on_close(void *user) {
    gd_session_free(user);
}

static const gd_server_callbacks callbacks = {
    .on_open = on_open,
    .on_frame = on_frame,
    .on_bad_frame = on_bad_frame,
    .on_close = on_close,
};

int gd_daemon_init(gd_daemon *d, uv_loop_t *loop) {
    gd_context_init(&d->ctx, loop);
    gd_config_defaults(&d->ctx.limits, &d->ctx.reg.quota);
    return gd_server_init(&d->srv, loop, &d->ctx.limits, &callbacks, d);
}

void gd_daemon_stop(gd_daemon *d) {
    gd_session *s;
    if (!d->srv.stopping)
        DL_FOREACH(d->ctx.sessions, s)
            gd_session_shutdown(s);
    gd_server_stop(&d->srv);
}

void gd_daemon_destroy(gd_daemon *d) {
    gd_server_destroy(&d->srv);
    gd_context_destroy(&d->ctx);
}
