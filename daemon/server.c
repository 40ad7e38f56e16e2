#include "server_internal.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <utlist.h>

#include "gpubuf/gpubuf.h"
#include "log.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

#define READ_CHUNK (64u * 1024u)
/* Backpressure: while this much of a client's replies waits to be written,
 * the daemon reads and handles no more of its requests. One reply may pass
 * the mark (a status of a large registry), so a client holds at most this
 * plus one reply in the daemon's memory. */
#define OUT_HIGH_WATER (1u << 20)
/* Backpressure on fds: while queued replies hold this many fds (each a dup
 * of a slab fd), no more requests are handled. A pass stops before a frame
 * once the mark is reached and a frame yields at most the room left below
 * it (gd_conn_fd_room(): one for a single request, up to
 * GD_BATCH_REPLY_FDS for a batch), so requests make the daemon hold at most
 * this many fds for a connection; waiting opens answered later add at most
 * GD_WAITER_REPLY_FDS (docs/security.md). */
#define OUT_FDS_HIGH_WATER ((unsigned)GD_QUEUED_REPLY_FDS)
/* Backpressure on the number of queued replies, far below
 * max_queued_replies: a pass adds at most one reply per frame and waiting
 * opens at most max_waiters_per_client more (counted on top of the limit),
 * so a client that reads its replies, however late, is held back and never
 * meets it. */
#define OUT_FRAMES_HIGH_WATER 1024u
/* Replies queued in a pass leave before its next frame is handled once
 * they reach this much (a batch's reply: 250 items make about 12 KiB): the
 * client works on them while the daemon handles the next request, which a
 * client that sends a batch in several requests has sent already. Smaller
 * replies wait for the pass's end, for one write. */
#define OUT_FLUSH_EARLY (8u * 1024u)
/* What the final drain of a departed client reads at most. */
#define DRAIN_MAX (4u << 20)
/* Work of the reaper per turn of the loop, in frames of departed clients
 * applied plus connections closed: however many clients leave at once, a
 * turn does at most this much of it (docs/architecture.md). */
#define REAP_PER_TURN 128u

static void on_conn_io(uv_poll_t *h, int status, int events);
static void on_reap(uv_check_t *h);
static void on_kick(uv_idle_t *h);
static void on_spin(uv_idle_t *h);
static int process_frames(gd_conn *c, uint32_t limit);
static int process_frames_corked(gd_conn *c, uint32_t limit);
static bool grow_in(gd_conn *c);
static ssize_t read_in(gd_conn *c, size_t max);
static bool backlogged(const gd_conn *c);
static bool has_complete_frame(const gd_conn *c);
static void conn_free_out(gd_conn *c);
static void maybe_pend(gd_conn *c);

/* Deadline for a connection whose handshake is not done, or that sits on
 * half a frame. */
static void on_conn_timer(uv_timer_t *t) {
    gd_conn *c = t->data;
    LOG_WARN_LIMITED("pid %d: %s for %u ms; disconnecting", (int)c->pid,
                     c->ready ? "incomplete frame" : "no handshake",
                     c->ready ? c->srv->limits->frame_timeout_ms
                              : c->srv->limits->handshake_timeout_ms);
    gd_conn_end(c, GD_CLOSE_TIMEOUT);
}

void gd_conn_arm_timer(gd_conn *c) {
    uint32_t ms = 0;
    if (c->closing)
        return;
    if (!c->ready)
        ms = c->srv->limits->handshake_timeout_ms;
    else if (c->in_len > 0 && !has_complete_frame(c))
        ms = c->srv->limits->frame_timeout_ms; /* whole frames held back are no stall */
    if (ms == 0) {
        uv_timer_stop(&c->timer);
        return;
    }
    /* Restart only when no deadline runs yet: trickling bytes do not
     * extend it. */
    if (!uv_is_active((uv_handle_t *)&c->timer)) {
        int r = uv_timer_start(&c->timer, on_conn_timer, ms, 0);
        if (r < 0) {
            LOG_ERR_LIMITED("pid %d: uv_timer_start: %s; disconnecting", (int)c->pid,
                            uv_strerror(r));
            gd_conn_end(c, GD_CLOSE_ERROR);
        }
    }
}

/* Start (or keep) the idle handle that makes the loop come back without
 * blocking: it runs pending connections and lets the reaper run. */
static void kick(gd_server *srv) {
    int r = uv_idle_start(&srv->kick, on_kick);
    /* Fails only for a closing handle or a NULL callback. */
    assert(r == 0);
    (void)r;
}

/* Everything a client sent before it went away is handled: a seal or a
 * release written just before exit() must not be lost, also when its
 * unread replies held back its requests. Its replies go nowhere (the queue
 * is dropped first). Runs at reaping time, for connections whose peer left,
 * at most frames_per_wakeup requests per turn of the loop and no more than
 * *turn_left (the reaper's budget for the turn, decreased by the frames
 * handled) so the loop stays responsive. Returns true when nothing is left
 * to handle. */
static bool drain_step(gd_conn *c, uint32_t *turn_left) {
    if (!c->draining) {
        /* Only what the socket held when the drain starts, at most
         * DRAIN_MAX: a peer that keeps writing cannot hold the
         * connection here. */
        int queued = 0;
        if (ioctl(c->fd, FIONREAD, &queued) < 0 || queued < 0)
            queued = 0;
        c->drain_left = (size_t)queued < DRAIN_MAX ? (size_t)queued : DRAIN_MAX;
        c->draining = true;
        conn_free_out(c);
    }
    uint32_t limit = c->srv->limits->frames_per_wakeup;
    uint32_t budget = limit < *turn_left ? limit : *turn_left;
    bool done = false;
    c->reaping = true;
    c->closing = false;
    for (;;) {
        int n = process_frames_corked(c, budget);
        if (c->closing || n < 0) {
            done = true;
            break;
        }
        budget -= (uint32_t)n;
        *turn_left -= (uint32_t)n;
        if (has_complete_frame(c))
            break; /* the rest on the next turn */
        if (c->drain_left == 0 || !grow_in(c) || c->closing || c->in_cap == c->in_len) {
            done = true;
            break;
        }
        ssize_t r = read_in(c, c->drain_left);
        if (r <= 0) {
            done = true;
            break;
        }
        c->drain_left -= (size_t)r;
        if (budget == 0)
            break;
    }
    c->closing = true;
    c->reaping = false;
    return done;
}

int gd_server_init(gd_server *srv, uv_loop_t *loop, const gd_limits *limits,
                   const gd_server_callbacks *cb, void *data) {
    int r;
    assert(limits && cb && cb->on_open && cb->on_frame && cb->on_close);
    memset(srv, 0, sizeof(*srv));
    srv->loop = loop;
    srv->limits = limits;
    srv->cb = *cb;
    srv->data = data;
    srv->listen_fd = -1;
    srv->spare_fd = -1;
    if ((r = uv_check_init(loop, &srv->reaper)) < 0)
        return r;
    srv->reaper.data = srv;
    if ((r = uv_idle_init(loop, &srv->kick)) < 0) {
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        return r;
    }
    srv->kick.data = srv;
    if ((r = uv_idle_init(loop, &srv->spin)) < 0) {
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        uv_close((uv_handle_t *)&srv->kick, NULL);
        return r;
    }
    srv->spin.data = srv;
    if ((r = uv_timer_init(loop, &srv->accept_timer)) < 0) {
        uv_close((uv_handle_t *)&srv->reaper, NULL);
        uv_close((uv_handle_t *)&srv->kick, NULL);
        uv_close((uv_handle_t *)&srv->spin, NULL);
        return r;
    }
    srv->accept_timer.data = srv;
    return 0;
}

/* Queued replies were written or dropped: connections waiting for reply
 * memory whose frame now fits go on, first come first (one that does not
 * fit the global budget stops the rest, so a large batch is not passed over
 * forever; one whose own uid's share is full is passed over: its uid's
 * backlog holds it back, not anyone else's). */
static void mem_wake(gd_server *srv) {
    size_t sum = 0;
    gd_conn *c, *tmp;
    DL_FOREACH_SAFE2(srv->mem_waiters, c, tmp, mw_next) {
        size_t used = srv->out_bytes + sum;
        if (used != 0 && used + c->mem_wait > srv->limits->max_reply_memory)
            break;
        if (!gd_budget_uid_room(c, c->mem_wait))
            continue;
        sum += c->mem_wait;
        DL_DELETE2(srv->mem_waiters, c, mw_prev, mw_next);
        c->mem_wait = 0;
        gd_conn_update_poll(c);
        maybe_pend(c);
    }
}

static void conn_free_out(gd_conn *c) {
    gd_outbuf *o, *tmp;
    DL_FOREACH_SAFE(c->out, o, tmp) {
        DL_DELETE(c->out, o);
        for (int i = 0; i < o->n_fds; i++)
            close(o->fds[i]);
        free(o);
    }
    bool freed = c->out_bytes > 0;
    gd_budget_out_sub(c, c->out_bytes);
    c->out_frames = 0;
    c->out_fds = 0;
    if (freed)
        mem_wake(c->srv);
}

static void on_timer_closed(uv_handle_t *h) {
    gd_conn *c = h->data;
    gd_budget_uid_detach(c);
    close(c->fd);
    free(c->in);
    free(c);
}

static void on_conn_closed(uv_handle_t *h) {
    gd_conn *c = h->data;
    uv_close((uv_handle_t *)&c->timer, on_timer_closed);
}

static void close_loop_handles(gd_server *srv) {
    if (srv->handles_closed)
        return;
    srv->handles_closed = true;
    uv_close((uv_handle_t *)&srv->reaper, NULL);
    uv_close((uv_handle_t *)&srv->kick, NULL);
    uv_close((uv_handle_t *)&srv->spin, NULL);
    uv_close((uv_handle_t *)&srv->accept_timer, NULL);
}

static void on_reap(uv_check_t *h) {
    gd_server *srv = h->data;
    gd_conn *later = NULL; /* still draining: back on the list for the next turn */
    uint32_t budget = REAP_PER_TURN;
    while (srv->reap) {
        gd_conn *c = srv->reap;
        LL_DELETE2(srv->reap, c, reap_next);
        if (budget == 0) {
            /* The rest on the next turn, before those stepped in this one,
             * so that every departing connection gets its turn. */
            LL_PREPEND2(srv->reap, c, reap_next);
            LL_CONCAT2(srv->reap, later, reap_next);
            later = srv->reap;
            srv->reap = NULL;
            break;
        }
        budget--;
        if (c->pending) {
            LL_DELETE2(srv->pending, c, pending_next);
            c->pending = false;
        }
        /* A connection its user refused has no user to tell. */
        if (c->user) {
            if (c->peer_gone && !drain_step(c, &budget)) {
                LL_PREPEND2(later, c, reap_next);
                continue;
            }
            srv->cb.on_close(c->user, c->why != GD_CLOSE_NONE ? c->why : GD_CLOSE_ERROR);
            c->user = NULL;
            srv->work = srv->cb.on_work != NULL;
        }
        conn_free_out(c);
        DL_DELETE(srv->conns, c);
        assert(srv->n_conns > 0);
        srv->n_conns--;
        uv_close((uv_handle_t *)&c->poll, on_conn_closed);
    }
    if (srv->work)
        kick(srv); /* on_work runs from the idle handle */
    if (later) {
        srv->reap = later; /* the check handle and the idle one stay active */
        return;
    }
    uv_check_stop(&srv->reaper);
    if (srv->stopping && !srv->conns)
        close_loop_handles(srv);
}

static bool has_complete_frame(const gd_conn *c) {
    if (c->in_len < GPUBUF_WIRE_HEADER_SIZE)
        return false;
    uint32_t len = (uint32_t)c->in[8] | (uint32_t)c->in[9] << 8 | (uint32_t)c->in[10] << 16 |
                   (uint32_t)c->in[11] << 24;
    /* A bad header counts as complete: processing it disconnects. */
    return len > c->srv->limits->max_request || c->in_len - GPUBUF_WIRE_HEADER_SIZE >= len;
}

/* After a capped wake-up, queue the connection so the loop comes back to it
 * without waiting for the socket to become readable again. */
static void maybe_pend(gd_conn *c) {
    if (c->closing || c->pending || backlogged(c) || !has_complete_frame(c))
        return;
    c->pending = true;
    LL_PREPEND2(c->srv->pending, c, pending_next);
    kick(c->srv);
}

/* After a bounded batch of frames: come back for the rest, or, once a peer
 * that closed its side has all its frames answered, let it go. */
static void after_frames(gd_conn *c) {
    if (c->eof && !has_complete_frame(c)) {
        gd_conn_peer_left(c);
        return;
    }
    maybe_pend(c);
    gd_conn_arm_timer(c);
}

static void on_kick(uv_idle_t *h) {
    gd_server *srv = h->data;
    gd_conn *list = srv->pending;
    srv->pending = NULL;
    while (list) {
        gd_conn *c = list;
        list = c->pending_next;
        c->pending_next = NULL;
        c->pending = false;
        if (process_frames(c, srv->limits->frames_per_wakeup) >= 0)
            after_frames(c);
    }
    if (srv->work)
        srv->work = srv->cb.on_work(srv->data);
    /* Stay active while connections wait to be reaped: the check handle that
     * reaps them runs only if the poll does not block. */
    if (!srv->pending && !srv->reap && !srv->work)
        uv_idle_stop(&srv->kick);
}

void gd_server_want_work(gd_server *srv) {
    if (!srv->cb.on_work || srv->stopping)
        return;
    srv->work = true;
    kick(srv);
}

void gd_conn_close(gd_conn *c) {
    gd_conn_end(c, GD_CLOSE_BY_USER);
}

/* Close c, remembering the first reason given. */
void gd_conn_end(gd_conn *c, gd_close_reason why) {
    if (c->why == GD_CLOSE_NONE)
        c->why = why;
    if (c->reaping) {
        c->closing = true; /* stops the final drain */
        return;
    }
    if (c->closing)
        return;
    c->closing = true;
    gd_budget_mem_unwait(c);
    uv_poll_stop(&c->poll);
    uv_timer_stop(&c->timer);
    LL_PREPEND2(c->srv->reap, c, reap_next);
    int r = uv_check_start(&c->srv->reaper, on_reap);
    assert(r == 0); /* fails only for a closing handle */
    (void)r;
    /* An active idle handle keeps the next poll from blocking, so the
     * reaper runs soon also when the close came from a timer. */
    kick(c->srv);
}

bool gd_conn_closing(const gd_conn *c) {
    return c->closing;
}

void gd_conn_ready(gd_conn *c) {
    c->ready = true;
}

static void on_poll_only_closed(uv_handle_t *h) {
    gd_conn *c = h->data;
    close(c->fd);
    free(c);
}

/* Set up the handles of an accepted connection. On failure c is freed and
 * its fd closed (through close callbacks when a handle was initialised). */
int gd_conn_start(gd_server *srv, gd_conn *c) {
    int r = uv_poll_init(srv->loop, &c->poll, c->fd);
    if (r < 0) {
        close(c->fd);
        free(c);
        return r;
    }
    c->poll.data = c;
    if ((r = uv_timer_init(srv->loop, &c->timer)) < 0) {
        uv_close((uv_handle_t *)&c->poll, on_poll_only_closed);
        return r;
    }
    c->timer.data = c;
    if ((r = uv_poll_start(&c->poll, UV_READABLE, on_conn_io)) < 0) {
        uv_close((uv_handle_t *)&c->poll, on_conn_closed);
        return r;
    }
    c->poll_events = UV_READABLE;
    return 0;
}

/* The global reply budget full, or its uid's share of it, a connection with
 * replies of its own still queued is held back too: it gets no more requests
 * handled until its peer reads (a peer that reads is woken by its socket
 * turning writable). One with nothing queued is still served, so a bystander
 * gets its answer. */
static bool backlogged(const gd_conn *c) {
    return c->mem_wait || c->out_bytes >= OUT_HIGH_WATER || c->out_fds >= OUT_FDS_HIGH_WATER ||
           c->out_frames >= OUT_FRAMES_HIGH_WATER ||
           (c->out_bytes && (c->srv->out_bytes >= c->srv->limits->max_reply_memory || gd_budget_uid_full(c)));
}

/* Watch what the connection needs now. Only a change reaches libuv:
 * restarting a poll handle with the same events still costs epoll_ctl calls
 * (two per request, before this check). */
void gd_conn_update_poll(gd_conn *c) {
    if (c->closing)
        return;
    int want = (backlogged(c) || c->eof ? 0 : UV_READABLE) | (c->out ? UV_WRITABLE : 0);
    if (want == c->poll_events)
        return;
    int r = uv_poll_start(&c->poll, want, on_conn_io);
    if (r < 0) {
        LOG_ERR_LIMITED("pid %d: uv_poll_start: %s; disconnecting", (int)c->pid, uv_strerror(r));
        gd_conn_end(c, GD_CLOSE_ERROR);
        return;
    }
    c->poll_events = want;
}

static int flush_some(gd_conn *c);

/* Write queued replies: up to 64 frames per sendmsg. A frame that carries
 * fds starts its own sendmsg, so the fds ride on the frame's first byte. */
int gd_conn_flush(gd_conn *c) {
    size_t before = c->out_bytes;
    int r = flush_some(c);
    if (c->out_bytes < before && c->srv->mem_waiters)
        mem_wake(c->srv);
    return r;
}

static int flush_some(gd_conn *c) {
    while (c->out) {
        struct iovec iov[64];
        int n_iov = 0, n_fds = 0;
        for (gd_outbuf *o = c->out; o && n_iov < 64; o = o->next) {
            if (o != c->out && o->n_fds > 0)
                break;
            if (o == c->out && o->off == 0)
                n_fds = o->n_fds;
            iov[n_iov].iov_base = o->data + o->off;
            iov[n_iov].iov_len = o->len - o->off;
            n_iov++;
        }
        ssize_t n = gpubuf_wire_sendv_fds(c->fd, iov, n_iov, c->out->fds, n_fds);
        if (n < 0)
            return n == -EAGAIN ? 0 : (int)n;
        while (n > 0) {
            gd_outbuf *o = c->out;
            if (o->n_fds > 0) {
                for (int i = 0; i < o->n_fds; i++)
                    close(o->fds[i]);
                assert(c->out_fds >= (uint32_t)o->n_fds);
                c->out_fds -= (uint32_t)o->n_fds;
                o->n_fds = 0;
            }
            size_t left = o->len - o->off;
            if ((size_t)n < left) {
                o->off += (size_t)n;
                return 0; /* the socket is full */
            }
            n -= (ssize_t)left;
            DL_DELETE(c->out, o);
            if (o->trace_request)
                gpubuf_trace(o->trace_session, o->trace_request, o->trace_type,
                             GPUBUF_TRACE_D_WRITTEN, 0);
            assert(c->out_frames > 0);
            c->out_frames--;
            gd_budget_out_sub(c, o->len);
            free(o);
        }
    }
    return 0;
}

unsigned gd_conn_fds_held(const gd_conn *c) {
    return c->out_fds;
}

unsigned gd_conn_fd_room(const gd_conn *c) {
    return c->out_fds < OUT_FDS_HIGH_WATER ? OUT_FDS_HIGH_WATER - c->out_fds : 0;
}

/* Send the replies held while another connection's frames were handled
 * (gd_conn_send_fds), at the end of that batch of frames: their changes are
 * saved now (the frame callback's gd_state_end). A connection closed
 * meanwhile is still allocated (freed by its close callback). */
static void flush_held(gd_server *srv) {
    while (srv->held) {
        gd_conn *h = srv->held;
        LL_DELETE2(srv->held, h, held_next);
        h->held = false;
        if (h->closing || !h->out || h->corked)
            continue;
        if (gd_conn_flush(h) < 0)
            gd_conn_peer_left(h);
        else
            gd_conn_update_poll(h);
    }
}

/* Handle up to limit complete frames from c->in; their replies leave in as
 * few writes as possible. Returns the number handled, or -1 when the
 * connection was closed. */
static int process_frames(gd_conn *c, uint32_t limit) {
    c->corked = true;
    int r = process_frames_corked(c, limit);
    c->corked = false;
    /* Flush even when the batch ended in a disconnection: the last reply
     * says why. */
    if (c->out) {
        if (gd_conn_flush(c) < 0)
            gd_conn_peer_left(c);
        else
            gd_conn_update_poll(c);
    } else if (c->mem_wait) {
        gd_conn_update_poll(c); /* stop reading while the frame waits */
    }
    return c->closing ? -1 : r;
}

static int process_frames_corked(gd_conn *c, uint32_t limit) {
    size_t pos = 0;
    uint32_t done = 0;
    while (done < limit && !c->closing && !backlogged(c)) {
        gpubuf_frame_header h;
        if (c->in_len - pos < GPUBUF_WIRE_HEADER_SIZE)
            break;
        int r = gpubuf_wire_header_decode(c->in + pos, c->srv->limits->max_request, &h);
        if (r < 0) {
            LOG_WARN_LIMITED("pid %d: bad frame header (%s); disconnecting", (int)c->pid,
                             gpubuf_strerror(r));
            if (c->srv->cb.on_bad_frame)
                c->srv->cb.on_bad_frame(c->user, r);
            gd_conn_end(c, GD_CLOSE_BAD_FRAME);
            break;
        }
        if (c->in_len - pos - GPUBUF_WIRE_HEADER_SIZE < h.length)
            break;
        c->srv->in_frame = c;
        r = c->srv->cb.on_frame(c->user, c->in + pos + GPUBUF_WIRE_HEADER_SIZE, h.length,
                                c->srv->trace_woke_ns, c->srv->trace_read_ns);
        c->srv->in_frame = NULL;
        if (r == -EAGAIN)
            break; /* held back until the reply memory has room (mem_wait) */
        pos += GPUBUF_WIRE_HEADER_SIZE + h.length;
        done++;
        /* This frame's changes are saved (gd_state_end in on_frame). */
        if (c->out_bytes >= OUT_FLUSH_EARLY && !c->closing && c->in_len - pos > 0 &&
            gd_conn_flush(c) < 0) {
            gd_conn_peer_left(c);
            break;
        }
    }
    /* The replies these frames gave other connections (woken opens) leave
     * now, one write per connection for the whole batch rather than one
     * per frame: every frame's changes are saved by now. */
    if (c->srv->held)
        flush_held(c->srv);
    if (pos) {
        memmove(c->in, c->in + pos, c->in_len - pos);
        c->in_len -= pos;
    }
    return c->closing ? -1 : (int)done;
}

/* The peer closed or broke the connection. */
void gd_conn_peer_left(gd_conn *c) {
    c->peer_gone = true;
    gd_conn_end(c, GD_CLOSE_PEER);
}

/* Make room to read: the input buffer grows to one maximal frame plus one
 * chunk, never more. False when out of memory (the connection is closed). */
static bool grow_in(gd_conn *c) {
    size_t need = c->in_len + READ_CHUNK;
    size_t max = (size_t)c->srv->limits->max_request + GPUBUF_WIRE_HEADER_SIZE + READ_CHUNK;
    if (need > c->in_cap) {
        size_t cap = c->in_cap ? c->in_cap : READ_CHUNK;
        while (cap < need)
            cap *= 2;
        if (cap > max)
            cap = max;
        if (cap > c->in_cap) {
            uint8_t *p = realloc(c->in, cap);
            if (!p) {
                gd_conn_end(c, GD_CLOSE_ERROR);
                return false;
            }
            c->in = p;
            c->in_cap = cap;
        }
    }
    return true;
}

/* One recvmsg of at most max bytes into the input buffer; fds a client sends
 * are closed. */
static ssize_t read_in(gd_conn *c, size_t max) {
    int fds[GPUBUF_WIRE_MAX_FDS];
    int n_fds;
    bool trunc;
    size_t room = c->in_cap - c->in_len;
    ssize_t n = gpubuf_wire_recv(c->fd, c->in + c->in_len, room < max ? room : max, 0, fds,
                                 GPUBUF_WIRE_MAX_FDS, &n_fds, &trunc);
    for (int i = 0; i < n_fds; i++)
        close(fds[i]); /* clients never send fds: drop them */
    if (n_fds || trunc)
        LOG_WARN_LIMITED("pid %d sent file descriptors; closed them", (int)c->pid);
    if (n > 0)
        c->in_len += (size_t)n;
    return n;
}

/* ---- polling for the next request (poll_us) -------------------------------
 * A client that waits for a reply polls for it (client-api.md); the daemon
 * polls for the next request the same way: after handling requests, the
 * loop looks for more without blocking (an active idle handle makes libuv's
 * epoll_wait return at once) until poll_us have passed, then blocks. A
 * request that comes meanwhile is read without the wake-up of a sleeping
 * thread. The loop polls only while requests mostly come within poll_us of
 * the last ones: a score, one point up for a request that does (capped), two
 * down for one that does not (floored), polling at 0 and above. Sparse
 * requests thus cost no polling; a stream of them, or a client's quick
 * succession of requests, brings it back. */

/* Requests were handled: poll for the next while that pays. */
static void spin_start(gd_server *srv) {
    srv->spin_last_ns = gpubuf_now_ns();
    if (srv->spin_score < 0 || srv->stopping || uv_is_active((uv_handle_t *)&srv->spin))
        return;
    int r = uv_idle_start(&srv->spin, on_spin);
    assert(r == 0); /* fails only for a closing handle or a NULL callback */
    (void)r;
}

static void on_spin(uv_idle_t *h) {
    gd_server *srv = h->data;
    if (gpubuf_now_ns() - srv->spin_last_ns > (uint64_t)srv->limits->poll_us * 1000u)
        uv_idle_stop(h);
}

static void on_conn_io(uv_poll_t *h, int status, int events) {
    gd_conn *c = h->data;
    gd_server *srv = c->srv;
    uint64_t woke = gpubuf_trace_on() ? gpubuf_now_ns() : 0;
    if (c->closing)
        return;
    if (status < 0) {
        gd_conn_peer_left(c);
        return;
    }
    if (events & UV_WRITABLE) {
        if (gd_conn_flush(c) < 0) {
            gd_conn_peer_left(c);
            return;
        }
        gd_conn_update_poll(c);
        maybe_pend(c); /* frames held back while replies were backlogged */
    }
    if (!(events & UV_READABLE) || backlogged(c) || c->closing || c->eof)
        return;
    /* Frames left over from the previous wake-up go first. */
    if (process_frames(c, srv->limits->frames_per_wakeup) < 0)
        return;
    if (!grow_in(c))
        return;
    if (c->in_cap == c->in_len) {
        /* Buffer full of unprocessed frames: let the next wake-up drain it. */
        return;
    }
    ssize_t n = read_in(c, SIZE_MAX);
    if (woke) {
        srv->trace_woke_ns = woke;
        srv->trace_read_ns = gpubuf_now_ns();
    }
    bool spin = n > 0 && srv->limits->poll_us > 0;
    if (spin) /* a request came: within poll_us of the last ones? */
        gpubuf_poll_score(&srv->spin_score, (woke ? woke : gpubuf_now_ns()) - srv->spin_last_ns <=
                                                (uint64_t)srv->limits->poll_us * 1000u);
    if (n == -EAGAIN)
        return;
    if (n == 0) {
        /* The peer is done sending: answer what it sent before going, a
         * bounded batch per turn like any other frames. */
        c->eof = true;
        gd_conn_update_poll(c);
        if (!c->closing && process_frames(c, srv->limits->frames_per_wakeup) >= 0)
            after_frames(c);
        return;
    }
    if (n < 0) {
        gd_conn_peer_left(c);
        return;
    }
    int done = process_frames(c, srv->limits->frames_per_wakeup);
    if (spin)
        spin_start(srv);
    if (done >= 0) {
        maybe_pend(c);
        if (done > 0) /* whole frames arrived: a new deadline for the next one */
            uv_timer_stop(&c->timer);
        gd_conn_arm_timer(c);
    }
}

void gd_server_stop(gd_server *srv) {
    gd_conn *c;
    if (srv->stopping)
        return;
    srv->stopping = true;
    if (srv->listen_fd >= 0) {
        uv_poll_stop(&srv->listen_poll);
        uv_close((uv_handle_t *)&srv->listen_poll, NULL);
        uv_timer_stop(&srv->accept_timer);
        close(srv->listen_fd);
        srv->listen_fd = -1;
        if (srv->listen_owned && srv->socket_path)
            unlink(srv->socket_path);
    }
    DL_FOREACH(srv->conns, c)
    gd_conn_end(c, GD_CLOSE_STOP);
    if (!srv->conns)
        close_loop_handles(srv);
}

void gd_server_destroy(gd_server *srv) {
    gd_uid_use *u, *tmp;
    HASH_ITER(hh, srv->uids, u, tmp) { /* none left once every connection is freed */
        HASH_DEL(srv->uids, u);
        free(u);
    }
    if (srv->spare_fd >= 0)
        close(srv->spare_fd);
    srv->spare_fd = -1;
    free(srv->socket_path);
    srv->socket_path = NULL;
}
