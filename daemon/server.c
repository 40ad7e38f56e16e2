#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "util.h"
#include "wire.h"

#define READ_CHUNK (64u * 1024u)
/* Backpressure: while this much of a client's replies waits to be written,
 * the daemon reads and handles no more of its requests. One reply may pass
 * the mark (a status of a large registry), so a client holds at most this
 * plus one reply in the daemon's memory. */
#define OUT_HIGH_WATER (1u << 20)
/* What the final drain of a departed client reads at most. */
#define DRAIN_MAX (4u << 20)

void gd_limits_default(gd_limits *l) {
    l->max_request = GPUBUF_WIRE_MAX_REQUEST;
    l->max_clients = 4096;
    l->frames_per_wakeup = 32;
    l->max_waiters_per_client = 64;
    l->max_queued_replies = 4096;
    l->max_clients_per_uid = 1024;
    l->handshake_timeout_ms = 10000;
    l->frame_timeout_ms = 10000;
    l->quota.buffers_per_client = 1u << 20;
    l->quota.bytes_per_client = 0;
    l->quota.buffers_per_uid = 1u << 20;
    l->quota.bytes_per_uid = 0;
    l->quota.refs_per_client = 1u << 20;
    l->quota.kept_slabs_per_client = 8;
}

/* Deadline for a session that has not said hello, or sits on half a frame. */
static void on_session_timer(uv_timer_t *t) {
    gd_session *s = t->data;
    LOG_WARN("pid %d: %s for %u ms; disconnecting", (int)s->pid,
             s->hello_done ? "incomplete frame" : "no handshake",
             s->hello_done ? s->srv->limits.frame_timeout_ms
                           : s->srv->limits.handshake_timeout_ms);
    gd_session_kill(s);
}

static void arm_timer(gd_session *s) {
    uint32_t ms = 0;
    if (s->closing)
        return;
    if (!s->hello_done)
        ms = s->srv->limits.handshake_timeout_ms;
    else if (s->in_len > 0)
        ms = s->srv->limits.frame_timeout_ms;
    if (ms == 0) {
        uv_timer_stop(&s->timer);
        return;
    }
    /* Restart only when no deadline runs yet: trickling bytes do not
     * extend it. */
    if (!uv_is_active((uv_handle_t *)&s->timer))
        uv_timer_start(&s->timer, on_session_timer, ms, 0);
}

static void on_listen(uv_poll_t *h, int status, int events);
static void on_session_io(uv_poll_t *h, int status, int events);
static void on_reap(uv_check_t *h);
static void on_kick(uv_idle_t *h);
static int process_frames(gd_session *s, uint32_t limit);
static int process_frames_corked(gd_session *s, uint32_t limit);
static bool grow_in(gd_session *s);
static ssize_t read_in(gd_session *s, size_t max);
static void peer_left(gd_session *s);
static bool backlogged(const gd_session *s);

/* Everything a client sent before it went away is applied: a seal or a
 * release written just before exit() must not be lost. Its replies go
 * nowhere. Runs at reaping time, for sessions whose peer left. */
static void final_drain(gd_session *s) {
    /* Only what the socket held when the drain starts, at most DRAIN_MAX: a
     * peer that keeps writing cannot hold the loop here. */
    int queued = 0;
    if (ioctl(s->fd, FIONREAD, &queued) < 0 || queued < 0)
        queued = 0;
    size_t budget = (size_t)queued < DRAIN_MAX ? (size_t)queued : DRAIN_MAX;
    s->reaping = true;
    s->closing = false;
    for (;;) {
        process_frames_corked(s, UINT32_MAX);
        if (s->closing || budget == 0 || !grow_in(s) || s->in_cap == s->in_len)
            break;
        ssize_t n = read_in(s, budget);
        if (n <= 0)
            break;
        budget -= (size_t)n;
    }
    s->closing = true;
    s->reaping = false;
}

void gd_server_init(gd_server *srv, uv_loop_t *loop) {
    memset(srv, 0, sizeof(*srv));
    srv->loop = loop;
    srv->listen_fd = -1;
    gd_limits_default(&srv->limits);
    gd_registry_init(&srv->reg);
    srv->started_ns = gpubuf_now_ns();
    uv_check_init(loop, &srv->reaper);
    srv->reaper.data = srv;
    uv_idle_init(loop, &srv->kick);
    srv->kick.data = srv;
}

int gd_server_add_pool(gd_server *srv, gd_pool *pool) {
    if (srv->n_pools >= GPUBUF_MAX_POOLS)
        return -ENOSPC;
    if (gd_server_find_pool(srv, pool->name))
        return -EEXIST;
    pool->next_slab_id = &srv->slab_ids;
    srv->pools[srv->n_pools++] = pool;
    return 0;
}

gd_pool *gd_server_find_pool(gd_server *srv, const char *name) {
    for (int i = 0; i < srv->n_pools; i++)
        if (strcmp(srv->pools[i]->name, name) == 0)
            return srv->pools[i];
    return NULL;
}

int gd_server_listen_fd(gd_server *srv, int fd) {
    int r, fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    srv->listen_fd = fd;
    r = uv_poll_init(srv->loop, &srv->listen_poll, fd);
    if (r < 0)
        return r;
    srv->listen_poll.data = srv;
    return uv_poll_start(&srv->listen_poll, UV_READABLE, on_listen);
}

int gd_server_listen_path(gd_server *srv, const char *path, mode_t mode) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
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
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return -EEXIST; /* never remove anything but a stale socket */
        unlink(path);
    }
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    mode_t old = umask(0177);
    r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (r < 0 || chmod(path, mode) < 0 || listen(fd, 512) < 0) {
        r = -errno;
        close(fd);
        return r;
    }
    srv->socket_path = strdup(path);
    srv->listen_owned = true;
    return gd_server_listen_fd(srv, fd);
}

static void session_free_out(gd_session *s) {
    while (s->out_head) {
        gd_outbuf *o = s->out_head;
        s->out_head = o->next;
        if (o->fd >= 0)
            close(o->fd);
        free(o);
    }
    s->out_tail = NULL;
}

static void on_timer_closed(uv_handle_t *h) {
    gd_session *s = h->data;
    close(s->fd);
    free(s->in);
    free(s);
}

static void on_session_closed(uv_handle_t *h) {
    gd_session *s = h->data;
    uv_close((uv_handle_t *)&s->timer, on_timer_closed);
}

static void on_reap(uv_check_t *h) {
    gd_server *srv = h->data;
    while (srv->reap) {
        gd_session *s = srv->reap;
        srv->reap = s->reap_next;
        if (s->pending) {
            gd_session **pp = &srv->pending;
            while (*pp != s)
                pp = &(*pp)->pending_next;
            *pp = s->pending_next;
            s->pending = false;
        }
        LOG_DEBUG("session %llu (pid %d) closed", (unsigned long long)s->holder->id, (int)s->pid);
        if (s->peer_gone)
            final_drain(s);
        gd_registry_holder_drop(&srv->reg, s->holder);
        s->holder = NULL;
        session_free_out(s);
        if (s->prev)
            s->prev->next = s->next;
        else
            srv->sessions = s->next;
        if (s->next)
            s->next->prev = s->prev;
        srv->n_sessions--;
        uv_close((uv_handle_t *)&s->poll, on_session_closed);
    }
    uv_check_stop(&srv->reaper);
    if (srv->stopping && !srv->sessions) {
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        uv_close((uv_handle_t *)&srv->kick, NULL);
    }
}

static bool has_complete_frame(const gd_session *s) {
    if (s->in_len < GPUBUF_WIRE_HEADER_SIZE)
        return false;
    uint32_t len = (uint32_t)s->in[8] | (uint32_t)s->in[9] << 8 | (uint32_t)s->in[10] << 16 |
                   (uint32_t)s->in[11] << 24;
    /* A bad header counts as complete: processing it disconnects. */
    return len > s->srv->limits.max_request ||
           s->in_len - GPUBUF_WIRE_HEADER_SIZE >= len;
}

/* After a capped wake-up, queue the session so the loop comes back to it
 * without waiting for the socket to become readable again. */
static void maybe_pend(gd_session *s) {
    if (s->closing || s->pending || backlogged(s) || !has_complete_frame(s))
        return;
    s->pending = true;
    s->pending_next = s->srv->pending;
    s->srv->pending = s;
    uv_idle_start(&s->srv->kick, on_kick);
}

static void on_kick(uv_idle_t *h) {
    gd_server *srv = h->data;
    gd_session *list = srv->pending;
    srv->pending = NULL;
    while (list) {
        gd_session *s = list;
        list = s->pending_next;
        s->pending = false;
        if (process_frames(s, srv->limits.frames_per_wakeup) >= 0) {
            maybe_pend(s);
            arm_timer(s);
        }
    }
    /* Stay active while sessions wait to be reaped: the check handle that
     * reaps them runs only if the poll does not block. */
    if (!srv->pending && !srv->reap)
        uv_idle_stop(&srv->kick);
}

void gd_session_kill(gd_session *s) {
    if (s->reaping) {
        s->closing = true; /* stops the final drain */
        return;
    }
    if (s->closing)
        return;
    s->closing = true;
    uv_poll_stop(&s->poll);
    uv_timer_stop(&s->timer);
    s->reap_next = s->srv->reap;
    s->srv->reap = s;
    uv_check_start(&s->srv->reaper, on_reap);
    /* An active idle handle keeps the next poll from blocking, so the
     * reaper runs soon also when the kill came from a timer. */
    uv_idle_start(&s->srv->kick, on_kick);
}

static void on_listen(uv_poll_t *h, int status, int events) {
    gd_server *srv = h->data;
    (void)events;
    if (status < 0)
        return;
    for (int i = 0; i < 64; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
                LOG_WARN("accept: %s", strerror(errno));
            return;
        }
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0) {
            close(fd);
            continue;
        }
        if (srv->n_sessions >= srv->limits.max_clients || srv->stopping) {
            LOG_WARN("refusing pid %d: %u clients connected (limit %u)", (int)cred.pid,
                     srv->n_sessions, srv->limits.max_clients);
            close(fd);
            continue;
        }
        uint32_t same_uid = 0;
        for (gd_session *x = srv->sessions; x; x = x->next)
            same_uid += !x->closing && x->uid == cred.uid;
        if (srv->limits.max_clients_per_uid && same_uid >= srv->limits.max_clients_per_uid) {
            LOG_WARN("refusing pid %d: uid %u has %u connections (limit %u)", (int)cred.pid,
                     (unsigned)cred.uid, same_uid, srv->limits.max_clients_per_uid);
            close(fd);
            continue;
        }
        gd_session *s = calloc(1, sizeof(*s));
        if (!s || !(s->holder = gd_registry_holder_new(&srv->reg, cred.pid, cred.uid,
                                                           cred.gid))) {
            free(s);
            close(fd);
            continue;
        }
        s->fd = fd;
        s->srv = srv;
        s->pid = cred.pid;
        s->uid = cred.uid;
        s->gid = cred.gid;
        uv_poll_init(srv->loop, &s->poll, fd);
        s->poll.data = s;
        uv_poll_start(&s->poll, UV_READABLE, on_session_io);
        s->poll_events = UV_READABLE;
        uv_timer_init(srv->loop, &s->timer);
        s->timer.data = s;
        arm_timer(s);
        s->next = srv->sessions;
        if (srv->sessions)
            srv->sessions->prev = s;
        srv->sessions = s;
        srv->n_sessions++;
        LOG_DEBUG("session %llu: pid %d uid %d", (unsigned long long)s->holder->id, (int)s->pid,
                  (int)s->uid);
    }
}

static bool backlogged(const gd_session *s) {
    return s->out_bytes >= OUT_HIGH_WATER;
}

/* Watch what the session needs now. Only a change reaches libuv: restarting
 * a poll handle with the same events still costs epoll_ctl calls (two per
 * request, before this check). */
static void update_poll(gd_session *s) {
    if (s->closing)
        return;
    int want = (backlogged(s) ? 0 : UV_READABLE) | (s->out_head ? UV_WRITABLE : 0);
    if (want == s->poll_events)
        return;
    s->poll_events = want;
    uv_poll_start(&s->poll, want, on_session_io);
}

/* Write queued replies: up to 64 frames per sendmsg. A frame that carries
 * an fd starts its own sendmsg, so the fd rides on the frame's first byte. */
static int flush_out(gd_session *s) {
    while (s->out_head) {
        struct iovec iov[64];
        int n_iov = 0, fd = -1;
        for (gd_outbuf *o = s->out_head; o && n_iov < 64; o = o->next) {
            if (o != s->out_head && o->fd >= 0)
                break;
            if (o == s->out_head && o->off == 0)
                fd = o->fd;
            iov[n_iov].iov_base = o->data + o->off;
            iov[n_iov].iov_len = o->len - o->off;
            n_iov++;
        }
        ssize_t n = gpubuf_wire_sendv(s->fd, iov, n_iov, fd);
        if (n < 0)
            return n == -EAGAIN ? 0 : (int)n;
        while (n > 0) {
            gd_outbuf *o = s->out_head;
            if (o->fd >= 0) {
                close(o->fd);
                o->fd = -1;
            }
            size_t left = o->len - o->off;
            if ((size_t)n < left) {
                o->off += (size_t)n;
                return 0; /* the socket is full */
            }
            n -= (ssize_t)left;
            s->out_head = o->next;
            if (!s->out_head)
                s->out_tail = NULL;
            s->out_frames--;
            s->out_bytes -= o->len;
            free(o);
        }
    }
    return 0;
}

void gd_session_send(gd_session *s, const Gpubuf__Response *resp, int fd) {
    size_t plen = gpubuf__response__get_packed_size(resp);
    gd_outbuf *o;
    bool was_empty = !s->out_head;
    if (s->closing || s->peer_gone)
        return;
    if (s->out_frames >= s->srv->limits.max_queued_replies) {
        LOG_WARN("pid %d reads none of its %u queued replies; disconnecting", (int)s->pid,
                 s->out_frames);
        gd_session_kill(s);
        return;
    }
    if (plen > GPUBUF_WIRE_MAX_RESPONSE) {
        LOG_ERR("reply of %zu bytes exceeds the frame limit", plen);
        gd_session_kill(s);
        return;
    }
    o = malloc(sizeof(*o) + GPUBUF_WIRE_HEADER_SIZE + plen);
    if (!o) {
        gd_session_kill(s);
        return;
    }
    o->next = NULL;
    o->off = 0;
    o->len = GPUBUF_WIRE_HEADER_SIZE + plen;
    o->fd = fd >= 0 ? fcntl(fd, F_DUPFD_CLOEXEC, 0) : -1;
    if (fd >= 0 && o->fd < 0) {
        LOG_ERR("dup: %s", strerror(errno));
        free(o);
        gd_session_kill(s);
        return;
    }
    gpubuf_wire_header_encode(o->data, (uint32_t)plen);
    gpubuf__response__pack(resp, o->data + GPUBUF_WIRE_HEADER_SIZE);
    if (s->out_tail)
        s->out_tail->next = o;
    else
        s->out_head = o;
    s->out_tail = o;
    s->out_frames++;
    s->out_bytes += o->len;
    if (was_empty && !s->corked) {
        int r = flush_out(s);
        if (r < 0) {
            peer_left(s);
            return;
        }
        if (s->out_head)
            update_poll(s);
    }
}

static int process_frames_corked(gd_session *s, uint32_t limit);

/* Handle up to limit complete frames from s->in; their replies leave in as
 * few writes as possible. Returns the number handled, or -1 when the
 * session was killed. */
static int process_frames(gd_session *s, uint32_t limit) {
    s->corked = true;
    int r = process_frames_corked(s, limit);
    s->corked = false;
    /* Flush even when the batch ended in a disconnection: the last reply
     * says why. */
    if (s->out_head) {
        if (flush_out(s) < 0)
            peer_left(s);
        else
            update_poll(s);
    }
    return s->closing ? -1 : r;
}

static int process_frames_corked(gd_session *s, uint32_t limit) {
    size_t pos = 0;
    uint32_t done = 0;
    while (done < limit && !s->closing && !backlogged(s)) {
        gpubuf_frame_header h;
        if (s->in_len - pos < GPUBUF_WIRE_HEADER_SIZE)
            break;
        int r = gpubuf_wire_header_decode(s->in + pos, s->srv->limits.max_request, &h);
        if (r < 0) {
            LOG_WARN("pid %d: bad frame header (%s); disconnecting", (int)s->pid,
                     gpubuf_strerror(r));
            Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
            resp.status = r;
            resp.message = (char *)(r == -EMSGSIZE ? "request frame too large"
                                                   : "bad frame header (magic, version or flags)");
            gd_session_send(s, &resp, -1);
            gd_session_kill(s);
            return -1;
        }
        if (s->in_len - pos - GPUBUF_WIRE_HEADER_SIZE < h.length)
            break;
        gd_session_handle(s, s->in + pos + GPUBUF_WIRE_HEADER_SIZE, h.length);
        pos += GPUBUF_WIRE_HEADER_SIZE + h.length;
        done++;
    }
    if (pos) {
        memmove(s->in, s->in + pos, s->in_len - pos);
        s->in_len -= pos;
    }
    return s->closing ? -1 : (int)done;
}

/* The client closed or broke the connection. */
static void peer_left(gd_session *s) {
    s->peer_gone = true;
    gd_session_kill(s);
}

/* Make room to read: the input buffer grows to one maximal frame plus one
 * chunk, never more. False when out of memory (the session is killed). */
static bool grow_in(gd_session *s) {
    gd_server *srv = s->srv;
    size_t need = s->in_len + READ_CHUNK;
    if (need > s->in_cap) {
        size_t cap = s->in_cap ? s->in_cap : READ_CHUNK;
        while (cap < need)
            cap *= 2;
        /* Never more than one maximal frame plus one chunk. */
        if (cap > (size_t)srv->limits.max_request + GPUBUF_WIRE_HEADER_SIZE + READ_CHUNK)
            cap = (size_t)srv->limits.max_request + GPUBUF_WIRE_HEADER_SIZE + READ_CHUNK;
        if (cap > s->in_cap) {
            uint8_t *p = realloc(s->in, cap);
            if (!p) {
                gd_session_kill(s);
                return false;
            }
            s->in = p;
            s->in_cap = cap;
        }
    }
    return true;
}

/* One recvmsg of at most max bytes into the input buffer; fds a client sends
 * are closed. */
static ssize_t read_in(gd_session *s, size_t max) {
    int fds[GPUBUF_WIRE_MAX_FDS];
    int n_fds;
    bool trunc;
    size_t room = s->in_cap - s->in_len;
    ssize_t n = gpubuf_wire_recv(s->fd, s->in + s->in_len, room < max ? room : max, fds,
                                 GPUBUF_WIRE_MAX_FDS, &n_fds, &trunc);
    for (int i = 0; i < n_fds; i++)
        close(fds[i]); /* clients never send fds: drop them */
    if (n_fds || trunc)
        LOG_WARN("pid %d sent file descriptors; closed them", (int)s->pid);
    if (n > 0)
        s->in_len += (size_t)n;
    return n;
}

static void on_session_io(uv_poll_t *h, int status, int events) {
    gd_session *s = h->data;
    gd_server *srv = s->srv;
    if (s->closing)
        return;
    if (status < 0) {
        peer_left(s);
        return;
    }
    if (events & UV_WRITABLE) {
        if (flush_out(s) < 0) {
            peer_left(s);
            return;
        }
        update_poll(s);
        maybe_pend(s); /* frames held back while replies were backlogged */
    }
    if (!(events & UV_READABLE) || backlogged(s))
        return;
    /* Frames left over from the previous wake-up go first. */
    if (process_frames(s, srv->limits.frames_per_wakeup) < 0)
        return;
    if (!grow_in(s))
        return;
    if (s->in_cap == s->in_len) {
        /* Buffer full of unprocessed frames: let the next wake-up drain it. */
        return;
    }
    ssize_t n = read_in(s, SIZE_MAX);
    if (n == -EAGAIN)
        return;
    if (n == 0) {
        /* The peer is done sending: answer what it sent before going. */
        process_frames(s, UINT32_MAX);
        peer_left(s);
        return;
    }
    if (n < 0) {
        peer_left(s);
        return;
    }
    int done = process_frames(s, srv->limits.frames_per_wakeup);
    if (done >= 0) {
        maybe_pend(s);
        if (done > 0) /* whole frames arrived: a new deadline for the next one */
            uv_timer_stop(&s->timer);
        arm_timer(s);
    }
}

void gd_server_stop(gd_server *srv) {
    if (srv->stopping)
        return;
    srv->stopping = true;
    if (srv->listen_fd >= 0) {
        uv_poll_stop(&srv->listen_poll);
        uv_close((uv_handle_t *)&srv->listen_poll, NULL);
        close(srv->listen_fd);
        srv->listen_fd = -1;
        if (srv->listen_owned && srv->socket_path)
            unlink(srv->socket_path);
    }
    for (gd_session *s = srv->sessions; s; s = s->next) {
        Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
        resp.status = -ESHUTDOWN;
        resp.message = (char *)"gpubufd is shutting down";
        /* Best effort: a client blocked in a request reads this error. */
        gd_session_send(s, &resp, -1);
        gd_session_kill(s);
    }
    if (!srv->sessions) {
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        uv_close((uv_handle_t *)&srv->kick, NULL);
    }
}

void gd_server_destroy(gd_server *srv) {
    gd_registry_destroy(&srv->reg);
    for (int i = 0; i < srv->n_pools; i++)
        srv->pools[i] = gd_pool_free(srv->pools[i]);
    srv->n_pools = 0;
    free(srv->socket_path);
}
