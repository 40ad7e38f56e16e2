/* Takeover room: the two-phase hand over of gpubufd to a successor. See
 * takeover.h. Frames and fd passing are proto/wire.c's. */
#include "takeover.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "gpubuf.pb-c.h"
#include "log.h"
#include "util.h"
#include "wire.h"

/* ---- both sides -------------------------------------------------------- */

static int unix_addr(struct sockaddr_un *sa, const char *path) {
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(sa->sun_path))
        return -ENAMETOOLONG;
    memcpy(sa->sun_path, path, strlen(path) + 1);
    return 0;
}

/* Bound each blocking send and receive on sock; 0 ms: no bound. */
static void set_timeout(int sock, int ms) {
    struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
    (void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* One frame: msg packed after the header, with n_fds fds on its first byte. */
static int send_msg(int sock, const ProtobufCMessage *msg, const int *fds, int n_fds) {
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(GPUBUF_WIRE_HEADER_SIZE + len);
    int r;
    if (!buf)
        return -ENOMEM;
    gpubuf_wire_header_encode(buf, (uint32_t)len);
    protobuf_c_message_pack(msg, buf + GPUBUF_WIRE_HEADER_SIZE);
    struct iovec iov = {.iov_base = buf, .iov_len = GPUBUF_WIRE_HEADER_SIZE + len};
    ssize_t n = gpubuf_wire_sendv_fds(sock, &iov, 1, fds, n_fds);
    if (n < 0)
        r = (int)n;
    else /* the rest of a stream write cut short (a signal): no fds with it */
        r = gpubuf_wire_send_all(sock, buf + n, iov.iov_len - (size_t)n, -1);
    free(buf);
    return r;
}

static int send_status(int sock, int status, const char *why) {
    Gpubuf__HandoverStatus hs = GPUBUF__HANDOVER_STATUS__INIT;
    hs.status = status;
    hs.message = (char *)(why ? why : "");
    return send_msg(sock, &hs.base, NULL, 0);
}

int gd_takeover_read_status(int sock, int *ret_status, char *why, size_t n_why) {
    uint8_t *p = NULL;
    int fds[1], n_fds = 0;
    ssize_t len = gpubuf_wire_read_frame_fds(sock, GD_TAKEOVER_MAX_FRAME, &p, fds, 1, &n_fds);
    if (len < 0)
        return len == -EWOULDBLOCK ? -EAGAIN : (int)len;
    if (n_fds > 0) {
        close(fds[0]);
        free(p);
        return GPUBUF_EPROTOCOL;
    }
    Gpubuf__HandoverStatus *hs = gpubuf__handover_status__unpack(NULL, (size_t)len, p);
    bool bad = !hs || gpubuf_wire_nul_string(&gpubuf__handover_status__descriptor, p, (size_t)len) ||
               hs->status > 0;
    free(p);
    if (bad) {
        if (hs)
            gpubuf__handover_status__free_unpacked(hs, NULL);
        return GPUBUF_EPROTOCOL;
    }
    *ret_status = hs->status;
    snprintf(why, n_why, "%s", hs->message ? hs->message : "");
    /* Only what prints: the reason goes to the log. */
    for (char *c = why; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '?';
    gpubuf__handover_status__free_unpacked(hs, NULL);
    return 0;
}

/* ---- the running daemon's side ---------------------------------------- */

static struct {
    gd_daemon *d;
    void (*on_commit)(gd_daemon *d);
    uv_timer_t timer;
    bool pending;
    pid_t pid;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
} g_srv;

/* Send every fd with its name, GD_TAKEOVER_BATCH a frame, then the last
 * frame with the total. */
static int send_fds(int sock, const gd_kept_fd *fds, size_t n) {
    char *names[GD_TAKEOVER_BATCH];
    int batch[GD_TAKEOVER_BATCH], r;
    for (size_t i = 0; i < n; i += GD_TAKEOVER_BATCH) {
        Gpubuf__HandoverFds hf = GPUBUF__HANDOVER_FDS__INIT;
        size_t k = 0;
        for (; i + k < n && k < GD_TAKEOVER_BATCH; k++) {
            names[k] = (char *)fds[i + k].name;
            batch[k] = fds[i + k].fd;
        }
        hf.names = names;
        hf.n_names = k;
        if ((r = send_msg(sock, &hf.base, batch, (int)k)) < 0)
            return r;
    }
    Gpubuf__HandoverFds last = GPUBUF__HANDOVER_FDS__INIT;
    last.done = true;
    last.total = n;
    return send_msg(sock, &last.base, NULL, 0);
}

/* The fds to hand over: the state's and the listening socket. */
static size_t handover_fds(gd_kept_fd **ret) {
    gd_kept_fd *fds = NULL;
    size_t n = gd_state_fds(g_srv.d->ctx.state, &fds);
    gd_kept_fd *all = fds ? realloc(fds, (n + 1) * sizeof(*fds)) : NULL;
    if (!all) {
        free(fds);
        *ret = NULL;
        return 0;
    }
    snprintf(all[n].name, sizeof(all[n].name), "listen");
    all[n++].fd = g_srv.d->srv.listen_fd;
    *ret = all;
    return n;
}

/* After the fds went: wait for the successor's word. 1: it is ready and was
 * told to serve; 0: it gave up, went away or was stopped (logged). */
static int await_ready(int sock, pid_t pid) {
    char why[256] = "";
    int status = 0, r;
    set_timeout(sock, GD_TAKEOVER_READY_MS);
    r = gd_takeover_read_status(sock, &status, why, sizeof(why));
    if (r == -EAGAIN) {
        LOG_ERR("takeover: gpubufd pid %d did not say it serves within %d s; killing it "
                "(SIGKILL) and serving on",
                (int)pid, GD_TAKEOVER_READY_MS / 1000);
        kill(pid, SIGKILL);
        /* Its end closes when it is dead: then nothing writes the state. */
        set_timeout(sock, GD_TAKEOVER_IO_MS);
        while (gd_takeover_read_status(sock, &status, why, sizeof(why)) == 0)
            ;
        return 0;
    }
    if (r < 0) {
        LOG_ERR("takeover: gpubufd pid %d went away before it served (%s); serving on", (int)pid,
                r == GPUBUF_EDISCONNECTED ? "its connection closed" : gpubuf_strerror(r));
        return 0;
    }
    if (status < 0) {
        LOG_ERR("takeover: gpubufd pid %d could not start (%s); serving on", (int)pid,
                why[0] ? why : gpubuf_strerror(status));
        return 0;
    }
    set_timeout(sock, GD_TAKEOVER_IO_MS);
    if ((r = send_status(sock, 0, NULL)) < 0) {
        LOG_ERR("takeover: gpubufd pid %d went away before it served (%s); serving on", (int)pid,
                strerror(-r));
        return 0;
    }
    return 1;
}

/* Phase 1 and the commit, at one turn of the loop: nothing else runs
 * meanwhile, so the state the successor restores is the state there is. */
static void on_handover(uv_timer_t *t) {
    struct sockaddr_un sa;
    struct ucred cred = {0};
    socklen_t clen = sizeof(cred);
    gd_kept_fd *fds = NULL;
    size_t n = 0;
    int sock = -1, r, ready = 0;
    bool sent = false;
    uv_close((uv_handle_t *)t, NULL);
    if ((r = unix_addr(&sa, g_srv.path)) < 0 ||
        (sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        (set_timeout(sock, GD_TAKEOVER_IO_MS), connect(sock, (struct sockaddr *)&sa, sizeof(sa))) <
            0) {
        LOG_ERR("takeover: cannot connect to %s: %s; serving on", g_srv.path,
                strerror(r < 0 ? -r : errno));
        goto out;
    }
    /* Only the process that asked gets the memory. */
    if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 || cred.pid != g_srv.pid) {
        LOG_ERR("takeover: %s is not the requesting process's; serving on", g_srv.path);
        goto out;
    }
    if (!(n = handover_fds(&fds))) {
        LOG_ERR("takeover: out of memory; serving on");
        goto out;
    }
    sent = true; /* from the first fd on, the successor may restore */
    if ((r = send_fds(sock, fds, n)) < 0) {
        LOG_ERR("takeover: sending the fds to gpubufd pid %d: %s; serving on", (int)cred.pid,
                strerror(-r));
        goto out;
    }
    LOG_NOTICE("takeover: handed %zu fd(s) to gpubufd pid %d; waiting for it to serve", n,
               (int)cred.pid);
    ready = await_ready(sock, cred.pid);
out:
    free(fds);
    if (sock >= 0)
        close(sock);
    g_srv.pending = false;
    if (ready) {
        LOG_NOTICE("takeover: gpubufd pid %d serves now; exiting", (int)cred.pid);
        g_srv.on_commit(g_srv.d);
        return;
    }
    if (sent && gd_state_rewrite(g_srv.d->ctx.state) < 0)
        LOG_ERR("takeover: cannot write the saved state anew; a restart may restore what "
                "the successor saw");
}

/* The session room's takeover request (context.h): checked there, run at
 * the next turn of the loop, once its reply went out. */
static int on_takeover(gd_context *ctx, pid_t pid, const char *path, gd_err *err) {
    if (!ctx->state)
        return gd_err_set(err, -EOPNOTSUPP, "this gpubufd keeps no state to hand over");
    if (g_srv.pending || g_srv.d->srv.stopping)
        return gd_err_set(err, -EBUSY, "a takeover or a shutdown is under way");
    if (strlen(path) >= sizeof(g_srv.path))
        return gd_err_set(err, -ENAMETOOLONG, "takeover path too long");
    int r = uv_timer_init(ctx->loop, &g_srv.timer);
    if (r == 0 && (r = uv_timer_start(&g_srv.timer, on_handover, 0, 0)) < 0)
        uv_close((uv_handle_t *)&g_srv.timer, NULL);
    if (r < 0)
        return gd_err_set(err, r, "%s", uv_strerror(r));
    snprintf(g_srv.path, sizeof(g_srv.path), "%s", path);
    g_srv.pid = pid;
    g_srv.pending = true;
    return 0;
}

void gd_takeover_serve(gd_daemon *d, void (*on_commit)(gd_daemon *d)) {
    g_srv.d = d;
    g_srv.on_commit = on_commit;
    d->ctx.takeover = on_takeover;
}

/* ---- the successor's side --------------------------------------------- */

/* A name the state room knows the form of: printable, no separator. */
static bool name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((gd_kept_fd *)0)->name))
        return false;
    for (; *s; s++)
        if ((unsigned char)*s <= 0x20 || *s == 0x7f || *s == '/')
            return false;
    return true;
}

static void close_fds(const int *fds, int n) {
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

int gd_handover_rx_frame(gd_handover_rx *rx, const uint8_t *payload, size_t len, const int *fds,
                         int n_fds) {
    Gpubuf__HandoverFds *hf = NULL;
    int r = GPUBUF_EPROTOCOL;
    if (rx->done || n_fds < 0 || n_fds > GD_TAKEOVER_BATCH)
        goto fail;
    hf = gpubuf__handover_fds__unpack(NULL, len, payload);
    if (!hf || gpubuf_wire_nul_string(&gpubuf__handover_fds__descriptor, payload, len))
        goto fail;
    if (hf->done) {
        if (n_fds || hf->n_names || hf->total != rx->n)
            goto fail;
        rx->done = true;
        gpubuf__handover_fds__free_unpacked(hf, NULL);
        return 1;
    }
    if (hf->n_names != (size_t)n_fds || n_fds == 0 || rx->n + (size_t)n_fds > GD_TAKEOVER_MAX_FDS)
        goto fail;
    for (int i = 0; i < n_fds; i++)
        if (!name_ok(hf->names[i]))
            goto fail;
    if (rx->n + (size_t)n_fds > rx->cap) {
        size_t cap = rx->cap ? rx->cap * 2 : 256;
        gd_kept_fd *p = realloc(rx->fds, cap * sizeof(*p));
        if (!p) {
            r = -ENOMEM;
            goto fail;
        }
        rx->fds = p;
        rx->cap = cap;
    }
    for (int i = 0; i < n_fds; i++) {
        snprintf(rx->fds[rx->n].name, sizeof(rx->fds[0].name), "%s", hf->names[i]);
        rx->fds[rx->n++].fd = fds[i];
    }
    gpubuf__handover_fds__free_unpacked(hf, NULL);
    return 0;
fail:
    if (hf)
        gpubuf__handover_fds__free_unpacked(hf, NULL);
    close_fds(fds, n_fds > GD_TAKEOVER_BATCH ? GD_TAKEOVER_BATCH : n_fds);
    return r;
}

void gd_handover_rx_free(gd_handover_rx *rx) {
    for (size_t i = 0; i < rx->n; i++)
        if (rx->fds[i].fd >= 0)
            close(rx->fds[i].fd);
    free(rx->fds);
    memset(rx, 0, sizeof(*rx));
}

void gd_takeover_init(gd_takeover *t) {
    memset(t, 0, sizeof(*t));
    t->lock_fd = t->conn = -1;
}

void gd_takeover_test_hook(const char *phase) {
    const char *h = getenv("GPUBUFD_TEST_TAKEOVER");
    size_t n = strlen(phase);
    if (!h || strncmp(h, phase, n) != 0 || (h[n] != '\0' && strcmp(h + n, ":stop") != 0))
        return;
    LOG_NOTICE("takeover: test hook at '%s'", phase);
    raise(h[n] ? SIGSTOP : SIGKILL);
}

int gd_takeover_lock(gd_takeover *t, const char *socket_path, gd_err *err) {
    char path[PATH_MAX];
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    if ((size_t)snprintf(path, sizeof(path), "%s.takeover.lock", socket_path) >= sizeof(path))
        return gd_err_set(err, -ENAMETOOLONG, "socket path too long");
    t->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (t->lock_fd < 0)
        return gd_err_set(err, -errno, "cannot open %s: %s", path, strerror(errno));
    if (fcntl(t->lock_fd, F_SETLK, &fl) == 0) {
        gd_takeover_test_hook("locked");
        return 0;
    }
    int e = errno;
    struct flock who = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    bool known = fcntl(t->lock_fd, F_GETLK, &who) == 0 && who.l_type != F_UNLCK;
    close(t->lock_fd);
    t->lock_fd = -1;
    if (e != EAGAIN && e != EACCES)
        return gd_err_set(err, -e, "cannot lock %s: %s", path, strerror(e));
    char pid[32] = "";
    if (known)
        snprintf(pid, sizeof(pid), " (pid %d)", (int)who.l_pid);
    return gd_err_set(err, -EBUSY,
                      "another gpubufd --takeover%s is taking over the gpubufd on %s; only one "
                      "may at a time: let it finish, then see which daemon serves "
                      "(gpubufctl status)",
                      pid, socket_path);
}

/* One request to the running daemon over sock; 0 when its reply says so,
 * else the status with the daemon's sentence in why. */
static int rpc(int sock, Gpubuf__Request *req, char *why, size_t n_why) {
    uint8_t *payload = NULL;
    int fd = -1, r;
    if ((r = send_msg(sock, &req->base, NULL, 0)) < 0)
        return r;
    ssize_t got = gpubuf_wire_read_frame(sock, GPUBUF_WIRE_MAX_RESPONSE, &payload, &fd);
    if (fd >= 0)
        close(fd);
    if (got < 0)
        return got == -EWOULDBLOCK ? -ETIMEDOUT : (int)got;
    Gpubuf__Response *resp = gpubuf__response__unpack(NULL, (size_t)got, payload);
    free(payload);
    if (!resp)
        return GPUBUF_EPROTOCOL;
    r = resp->status;
    if (r < 0)
        snprintf(why, n_why, "%s", resp->message ? resp->message : "");
    gpubuf__response__free_unpacked(resp, NULL);
    return r > 0 ? GPUBUF_EPROTOCOL : r;
}

/* Ask the running daemon on socket_path to hand over to path. */
static int ask(const char *socket_path, const char *path, gd_err *err) {
    struct sockaddr_un sa;
    char why[256] = "";
    int sock, r;
    if ((r = unix_addr(&sa, socket_path)) < 0)
        return gd_err_set(err, r, "socket path too long");
    if ((sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return gd_err_set(err, -errno, "socket: %s", strerror(errno));
    set_timeout(sock, GD_TAKEOVER_IO_MS);
    if (connect(sock, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = -errno;
        close(sock);
        return gd_err_set(err, r, "no gpubufd to take over on %s: %s", socket_path,
                          strerror(-r));
    }
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__Hello hello = GPUBUF__HELLO__INIT;
    Gpubuf__TakeoverRequest tk = GPUBUF__TAKEOVER_REQUEST__INIT;
    hello.min_version = hello.max_version = GPUBUF_PROTOCOL_VERSION;
    hello.client_name = (char *)"gpubufd --takeover";
    req.id = 1;
    req.body_case = GPUBUF__REQUEST__BODY_HELLO;
    req.hello = &hello;
    if ((r = rpc(sock, &req, why, sizeof(why))) == 0) {
        tk.path = (char *)path;
        req.id = 2;
        req.body_case = GPUBUF__REQUEST__BODY_TAKEOVER;
        req.takeover = &tk;
        r = rpc(sock, &req, why, sizeof(why));
    }
    close(sock);
    if (r < 0)
        return gd_err_set(err, r, "the running gpubufd refused: %s",
                          why[0] ? why : gpubuf_strerror(r));
    return 0;
}

/* Take the fds, frame by frame, until the last. */
static int take_fds(gd_takeover *t, gd_err *err) {
    for (;;) {
        uint8_t *p = NULL;
        int fds[GD_TAKEOVER_BATCH], n_fds = 0;
        ssize_t len = gpubuf_wire_read_frame_fds(t->conn, GD_TAKEOVER_MAX_FRAME, &p, fds,
                                                 GD_TAKEOVER_BATCH, &n_fds);
        if (len < 0)
            return gd_err_set(err, (int)len, "receiving the fds: %s",
                              len == -EWOULDBLOCK           ? "timed out"
                              : len == GPUBUF_EDISCONNECTED ? "the running gpubufd closed"
                                                            : gpubuf_strerror((int)len));
        int r = gd_handover_rx_frame(&t->rx, p, (size_t)len, fds, n_fds);
        free(p);
        if (r < 0)
            return gd_err_set(err, r, "receiving the fds: %s",
                              r == -ENOMEM ? "out of memory" : "a frame that does not check out");
        if (r == 1)
            return 0;
    }
}

int gd_takeover_receive(gd_takeover *t, const char *socket_path, gd_err *err) {
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct sockaddr_un own;
    int lsock = -1, r;
    if ((size_t)snprintf(path, sizeof(path), "%s.takeover.%ld", socket_path, (long)getpid()) >=
        sizeof(path))
        return gd_err_set(err, -ENAMETOOLONG, "socket path too long for %s.takeover.PID",
                          socket_path);
    (void)unix_addr(&own, path);
    unlink(path); /* ours by its pid: a dead one's of the same pid at most */
    if ((lsock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
        return gd_err_set(err, -errno, "socket: %s", strerror(errno));
    mode_t old = umask(0177);
    r = bind(lsock, (struct sockaddr *)&own, sizeof(own)) < 0 || listen(lsock, 1) < 0 ? -errno : 0;
    umask(old);
    if (r < 0) {
        gd_err_set(err, r, "cannot listen on %s: %s", path, strerror(-r));
        goto out;
    }
    if ((r = ask(socket_path, path, err)) < 0)
        goto out;
    gd_takeover_test_hook("asked");
    struct pollfd pfd = {.fd = lsock, .events = POLLIN};
    if (poll(&pfd, 1, GD_TAKEOVER_IO_MS) <= 0 ||
        (t->conn = accept4(lsock, NULL, NULL, SOCK_CLOEXEC)) < 0) {
        r = gd_err_set(err, -ETIMEDOUT, "the running gpubufd did not connect back");
        goto out;
    }
    unlink(path); /* connected: nobody else needs the name */
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    if (getsockopt(t->conn, SOL_SOCKET, SO_PEERCRED, &cred, &clen) < 0 ||
        (cred.uid != geteuid() && cred.uid != 0)) {
        r = gd_err_set(err, -EPERM, "a process of another uid connected back; refused");
        goto out;
    }
    t->from = cred.pid;
    set_timeout(t->conn, GD_TAKEOVER_IO_MS);
    if ((r = take_fds(t, err)) < 0)
        goto out;
    gd_takeover_test_hook("received");
out:
    if (lsock >= 0)
        close(lsock);
    unlink(path);
    return r;
}

int gd_takeover_ready(gd_takeover *t, gd_err *err) {
    char why[256] = "";
    int status = 0, r;
    if ((r = send_status(t->conn, 0, NULL)) < 0)
        return gd_err_set(err, r, "the running gpubufd went away before it let go (%s); it "
                                  "served on",
                          strerror(-r));
    gd_takeover_test_hook("ready");
    /* Its answer comes as long as its end is open: a bound of ours could
     * run out while it commits, and then no daemon would serve. */
    set_timeout(t->conn, 0);
    r = gd_takeover_read_status(t->conn, &status, why, sizeof(why));
    if (r < 0 || status < 0)
        return gd_err_set(err, r < 0 ? r : status,
                          "the running gpubufd did not let go (%s); it serves on",
                          r == GPUBUF_EDISCONNECTED ? "it closed the connection"
                          : r < 0                   ? gpubuf_strerror(r)
                                                    : why);
    return 0;
}

void gd_takeover_abort(gd_takeover *t, int err, const char *why) {
    if (t->conn >= 0)
        (void)send_status(t->conn, err < 0 ? err : -EIO, why);
}

void gd_takeover_end(gd_takeover *t) {
    if (t->conn >= 0)
        close(t->conn);
    if (t->lock_fd >= 0)
        close(t->lock_fd);
    gd_handover_rx_free(&t->rx);
    t->conn = t->lock_fd = -1;
}
