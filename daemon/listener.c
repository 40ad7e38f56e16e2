/* Server room, continued: the listening socket. Binding it (or taking a
 * systemd-activated one), accepting up to 64 connections per wake-up,
 * refusing with a reason (limits, stopping, out of fds: the spare fd) and
 * pausing when no fd is left. See server.h. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <utlist.h>

#include "log.h"
#include "server_internal.h"
#include "util.h"
#include "wire.h"

/* Out of fds with no spare to refuse a connection with: listening pauses
 * this long instead of waking the loop for a connection it cannot take. */
#define ACCEPT_PAUSE_MS 100u

static void on_listen(uv_poll_t *h, int status, int events);

/* The spare fd: held while fds are plenty, closed for a moment when accept
 * fails for want of fds, so that the connection can be accepted, told why
 * and closed instead of waking the loop again and again. */
static void open_spare(gd_server *srv) {
    if (srv->spare_fd < 0)
        srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

int gd_server_listen_fd(gd_server *srv, int fd) {
    int r, fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return -errno;
    r = uv_poll_init(srv->loop, &srv->listen_poll, fd);
    if (r < 0)
        return r;
    srv->listen_fd = fd;
    srv->listen_poll.data = srv;
    open_spare(srv);
    return uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
}

int gd_server_listen_path(gd_server *srv, const char *path, mode_t mode, gid_t gid) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    char tmp[sizeof(sa.sun_path)];
    int fd, r;
    if (!path || !*path || strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    /* A stale socket file of a dead daemon is replaced; a live one is not. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        close(fd);
        return -EADDRINUSE;
    }
    close(fd);
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
        return -EEXIST; /* never remove anything but a stale socket */
    /* Bound, owned and listening under a name of its own first, then renamed
     * over the path in one step: a client that finds the path can connect
     * (no window between bind and listen, or before the group is set). */
    int n = snprintf(tmp, sizeof(tmp), "%s.%ld", path, (long)getpid());
    bool direct = n < 0 || (size_t)n >= sizeof(tmp);
    if (!direct)
        strcpy(sa.sun_path, tmp);
    else
        unlink(path);
    unlink(sa.sun_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    mode_t old = umask(0177);
    r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (r < 0 || chmod(sa.sun_path, mode) < 0 ||
        (gid != (gid_t)-1 && chown(sa.sun_path, (uid_t)-1, gid) < 0) || listen(fd, 512) < 0 ||
        (!direct && rename(tmp, path) < 0)) {
        r = -errno;
        if (r != -EADDRINUSE)
            unlink(sa.sun_path);
        close(fd);
        return r;
    }
    srv->socket_path = strdup(path);
    srv->listen_owned = true;
    r = gd_server_listen_fd(srv, fd);
    if (r < 0 && srv->listen_fd < 0)
        close(fd);
    return r;
}

/* Tell a peer the server will not serve it why (one frame its user writes),
 * then close it. A new socket takes the frame at once. What the peer sent
 * already is read first, so that closing does not reset the connection
 * before the peer has read the reason. */
static void refuse(gd_server *srv, int fd, gd_refusal why, uid_t uid, uint32_t limit) {
    uint8_t frame[GPUBUF_WIRE_HEADER_SIZE + 512];
    char sink[4096];
    size_t len = srv->cb.on_refuse ? srv->cb.on_refuse(srv->data, why, uid, limit,
                                                       frame + GPUBUF_WIRE_HEADER_SIZE,
                                                       sizeof(frame) - GPUBUF_WIRE_HEADER_SIZE)
                                   : 0;
    if (len > 0 && len <= sizeof(frame) - GPUBUF_WIRE_HEADER_SIZE) {
        gpubuf_wire_header_encode(frame, (uint32_t)len);
        (void)!send(fd, frame, GPUBUF_WIRE_HEADER_SIZE + len, MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
        ;
    close(fd);
}

static void on_accept_timer(uv_timer_t *t) {
    gd_server *srv = t->data;
    if (srv->stopping || srv->listen_fd < 0)
        return;
    open_spare(srv);
    int r = uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
    if (r < 0) {
        LOG_ERR_LIMITED("uv_poll_start on the listening socket: %s; retrying", uv_strerror(r));
        r = uv_timer_start(&srv->accept_timer, on_accept_timer, ACCEPT_PAUSE_MS, 0);
        assert(r == 0); /* fails only for a closing handle */
        (void)r;
    }
}

/* Stop watching the listening socket for ACCEPT_PAUSE_MS: a connection
 * left in the backlog would wake the loop at once, again and again. */
static void pause_accepting(gd_server *srv) {
    uv_poll_stop(&srv->listen_poll);
    int r = uv_timer_start(&srv->accept_timer, on_accept_timer, ACCEPT_PAUSE_MS, 0);
    assert(r == 0); /* fails only for a closing handle */
    (void)r;
}

/* accept failed with e (EMFILE, ENFILE: no fd for the connection). Free
 * the spare fd, accept the connection with it, tell the peer why and close
 * it, then take the spare again. Returns true when a connection was
 * refused so (the caller goes on accepting), false when accepting paused. */
static bool refuse_without_fds(gd_server *srv, int e) {
    if (srv->spare_fd >= 0) {
        close(srv->spare_fd);
        srv->spare_fd = -1;
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            struct ucred cred = {.pid = 0, .uid = (uid_t)-1};
            socklen_t cl = sizeof(cred);
            (void)!getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
            LOG_WARN_LIMITED("refusing pid %d: out of file descriptors (%s, %u clients "
                             "connected)",
                             (int)cred.pid, strerror(e), srv->n_conns);
            refuse(srv, fd, GD_REFUSE_NO_FDS, cred.uid, 0);
            open_spare(srv);
            if (srv->spare_fd >= 0)
                return true;
        } else {
            int e2 = errno;
            open_spare(srv);
            if (e2 == EAGAIN || e2 == ECONNABORTED)
                return srv->spare_fd >= 0;
        }
    }
    LOG_WARN_LIMITED("accept: %s; pausing accepting for %u ms", strerror(e), ACCEPT_PAUSE_MS);
    pause_accepting(srv);
    return false;
}

static void on_listen(uv_poll_t *h, int status, int events) {
    gd_server *srv = h->data;
    (void)events;
    if (status < 0)
        return;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == ECONNABORTED)
                return;
            if (e == EINTR)
                continue;
            if (e == EMFILE || e == ENFILE) {
                if (refuse_without_fds(srv, e))
                    continue;
                return;
            }
            /* ENOBUFS, ENOMEM and the like: retry later, not at once. */
            LOG_WARN_LIMITED("accept: %s; pausing accepting for %u ms", strerror(e),
                             ACCEPT_PAUSE_MS);
            pause_accepting(srv);
            return;
        }
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
            close(fd);
            continue;
        }
        if (srv->stopping) {
            refuse(srv, fd, GD_REFUSE_STOPPING, cred.uid, 0);
            continue;
        }
        if (srv->n_conns >= srv->limits->max_clients) {
            LOG_WARN_LIMITED("refusing pid %d: %u clients connected (limit %u)", (int)cred.pid,
                             srv->n_conns, srv->limits->max_clients);
            refuse(srv, fd, GD_REFUSE_MAX_CLIENTS, cred.uid, srv->limits->max_clients);
            continue;
        }
        uint32_t same_uid = 0;
        gd_conn *x;
        DL_FOREACH(srv->conns, x)
            same_uid += !x->closing && x->uid == cred.uid;
        if (srv->limits->max_clients_per_uid && same_uid >= srv->limits->max_clients_per_uid) {
            LOG_WARN_LIMITED("refusing pid %d: uid %u has %u connections (limit %u)", (int)cred.pid,
                             (unsigned)cred.uid, same_uid, srv->limits->max_clients_per_uid);
            refuse(srv, fd, GD_REFUSE_MAX_CLIENTS_PER_UID, cred.uid,
                   srv->limits->max_clients_per_uid);
            continue;
        }
        gd_conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->srv = srv;
        c->pid = cred.pid;
        c->uid = cred.uid;
        int r = gd_conn_start(srv, c);
        if (r < 0) {
            LOG_ERR_LIMITED("pid %d: cannot watch the connection: %s", (int)cred.pid,
                            uv_strerror(r));
            continue;
        }
        DL_PREPEND(srv->conns, c);
        srv->n_conns++;
        if (!gd_conn_uid_attach(c)) {
            gd_conn_close(c);
            continue;
        }
        c->user = srv->cb.on_open(srv->data, c, cred.pid, cred.uid, cred.gid);
        if (!c->user) {
            gd_conn_close(c);
            continue;
        }
        gd_conn_arm_timer(c);
    }
}
