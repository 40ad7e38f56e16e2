/* libgpubuf-client: the connection's stream. Requests out, replies in (read
 * ahead, in order, with the fds they carry), asynchronous requests settled
 * before the next synchronous reply. */
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

/* Most asynchronous requests in flight before the client waits for their
 * replies: bounds what the daemon queues for a client that never reads. */
#define GPUBUF_MAX_PENDING 64

static int read_reply(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds);

/* The event-loop layer is told through c->async_hooks (lock held): async.c
 * sets them when the connection first uses it; until then (NULL) no request
 * of it was started and there is nothing to tell. */
static int reconnect(gpubuf_client *c);

/* Close the fds a reply brought. */
static void close_fds(const int *fds, int n) {
    for (int i = 0; i < n; i++)
        close(fds[i]);
}
static int rpc(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret, int *ret_fds,
               int *ret_n_fds, bool *ret_unsent);

/* The daemon closed the connection: it may have said why first (a refused
 * connection, a shutdown) in a connection-level error frame (id 0). True
 * when it did: the message is then its reason. *ret_err becomes its status
 * during the handshake (a refused connection: gpubuf_connect() returns
 * why), and GPUBUF_EDISCONNECTED on a connection that was established. */
static bool goodbye(gpubuf_client *c, int *ret_err) {
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    Gpubuf__Response *resp;
    int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
    bool said = false;
    if (poll(&p, 1, 100) <= 0)
        return false;
    if (read_reply(c, &resp, fds, &n_fds) < 0)
        return false;
    if (resp->id == 0 && resp->status < 0) {
        const char *why =
            resp->message && *resp->message ? resp->message : gpubuf_strerror(resp->status);
        if (c->session_id == 0) {
            *ret_err = resp->status;
            gpubuf__set_error("%s", why);
        } else {
            *ret_err = GPUBUF_EDISCONNECTED;
            gpubuf__set_error("gpubufd closed the connection: %s", why);
        }
        said = true;
    }
    close_fds(fds, n_fds);
    gpubuf__resp_free(c, resp);
    return said;
}

/* Send req, of at most max bytes (else -EMSGSIZE, nothing sent). */
static int send_request_max(gpubuf_client *c, Gpubuf__Request *req, size_t max) {
    uint8_t stackbuf[512];
    uint8_t *frame = stackbuf;
    size_t plen;
    int r;
    if (c->broken) {
        gpubuf__set_error("the connection to gpubufd is closed");
        return GPUBUF_EDISCONNECTED;
    }
    req->id = ++c->next_id;
    uint64_t t_encode = gpubuf_trace_on() ? gpubuf_now_ns() : 0;
    /* The common single requests by hand (request_pack.c), the others and
     * those that do not fit the stack buffer with protobuf-c. */
    plen = gpubuf__request_pack_fast(req, stackbuf + GPUBUF_WIRE_HEADER_SIZE,
                                     sizeof(stackbuf) - GPUBUF_WIRE_HEADER_SIZE);
    bool packed = plen > 0;
    if (!packed)
        plen = gpubuf__request__get_packed_size(req);
    if (plen > max && max < c->max_request)
        return -EMSGSIZE; /* a request sent ahead: too large for that */
    if (plen > c->max_request) {
        gpubuf__set_error("request of %zu bytes exceeds the daemon's limit of %u", plen,
                          c->max_request);
        return -EMSGSIZE;
    }
    if (plen + GPUBUF_WIRE_HEADER_SIZE > sizeof(stackbuf)) {
        frame = malloc(plen + GPUBUF_WIRE_HEADER_SIZE);
        if (!frame)
            return -ENOMEM;
    }
    gpubuf_wire_header_encode(frame, (uint32_t)plen);
    if (!packed)
        gpubuf__request__pack(req, frame + GPUBUF_WIRE_HEADER_SIZE);
    r = gpubuf_wire_send_all(c->fd, frame, plen + GPUBUF_WIRE_HEADER_SIZE, -1);
    c->sent_ns = gpubuf_now_ns();
    if (t_encode) {
        gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_ENCODE, t_encode);
        gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_SENT, 0);
    }
    if (frame != stackbuf)
        free(frame);
    if (r < 0) {
        c->broken = true;
        if (c->async_hooks)
            c->async_hooks->fail_all(c, GPUBUF_EDISCONNECTED);
        if ((r == -EPIPE || r == -ECONNRESET) && goodbye(c, &r))
            return r;
        gpubuf__set_error("sending to gpubufd: %s", strerror(-r));
        return r == -EPIPE ? GPUBUF_EDISCONNECTED : r;
    }
    return 0;
}

static int send_request(gpubuf_client *c, Gpubuf__Request *req) {
    return send_request_max(c, req, c->max_request);
}

/* A blocking read is about to wait for the reply to the request sent at
 * c->sent_ns: poll without sleeping until c->spin_max_ns after the send,
 * while replies have mostly been coming within that time (c->spin_score
 * >= 0). When they have not (a loaded daemon, many clients sharing the
 * CPUs, opens that wait for seals), the thread sleeps at once, as before. */
static void spin_for_reply(const gpubuf_client *c) {
    if (c->spin_max_ns == 0 || c->spin_score < 0)
        return;
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    uint64_t until = c->sent_ns + c->spin_max_ns;
    while (gpubuf_now_ns() < until && poll(&p, 1, 0) == 0)
        ;
}

/* Read more reply bytes (and fds) into the read-ahead buffer. */
static int fill_rbuf(gpubuf_client *c, size_t need) {
    if (c->rpos > 0 && c->rpos == c->rlen)
        c->rpos = c->rlen = 0;
    if (c->rlen + need > c->rcap) {
        /* Compact first, then grow. */
        if (c->rpos > 0) {
            memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
            c->rlen -= c->rpos;
            c->rpos = 0;
        }
        if (c->rlen + need > c->rcap) {
            size_t cap = c->rcap ? c->rcap : 64 * 1024;
            while (cap < c->rlen + need)
                cap *= 2;
            uint8_t *p = realloc(c->rbuf, cap);
            if (!p)
                return -ENOMEM;
            c->rbuf = p;
            c->rcap = cap;
        }
    }
    int fds[GPUBUF_WIRE_MAX_FDS];
    int n_fds;
    bool trunc;
    if (!c->nonblock)
        spin_for_reply(c);
    size_t room = c->rcap - c->rlen;
    ssize_t n = gpubuf_wire_recv(c->fd, c->rbuf + c->rlen, room, c->nonblock ? MSG_DONTWAIT : 0,
                                 fds, GPUBUF_WIRE_MAX_FDS, &n_fds, &trunc);
    for (int i = 0; i < n_fds; i++) {
        if (c->n_rfds < (int)(sizeof(c->rfds) / sizeof(c->rfds[0])))
            c->rfds[c->n_rfds++] = fds[i];
        else
            close(fds[i]);
    }
    if (n < 0)
        return (int)n == -ECONNRESET ? GPUBUF_EDISCONNECTED : (int)n;
    if (n == 0)
        return GPUBUF_EDISCONNECTED;
    c->rlen += (size_t)n;
    /* Less than there was room for: the socket held no more just now (or
     * the read stopped at a frame carrying fds). */
    c->rshort = c->nonblock && (size_t)n < room;
    return 0;
}

/* Read one reply frame. Frames are cut from the read-ahead buffer; fds are
 * claimed by the frame that says it carries them (fds arrive in order):
 * fds[0..*n_fds). */
static int read_reply(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds) {
    gpubuf_frame_header h;
    size_t need = 0; /* bytes the frame needs read ahead; 0: what is there may do */
    int r;
    for (;;) {
        /* Without blocking, once a read came back short, the rest is left
         * for the next call: the socket stays readable if more came since,
         * and this saves the system call that would say -EAGAIN. */
        if (need > 0 && c->nonblock && c->rshort) {
            r = -EAGAIN;
            goto broken;
        }
        if (need > 0 && (r = fill_rbuf(c, need)) < 0)
            goto broken;
        need = GPUBUF_WIRE_HEADER_SIZE;
        if (c->rlen - c->rpos < need)
            continue;
        r = gpubuf_wire_header_decode(c->rbuf + c->rpos, GPUBUF_WIRE_MAX_RESPONSE, &h);
        if (r < 0)
            goto broken;
        need += h.length;
        if (c->rlen - c->rpos >= need)
            break;
    }

    uint64_t t_wake = gpubuf_trace_on() ? gpubuf_now_ns() : 0;
    /* A reply read without blocking is settled before the next is read: it
     * is unpacked into the connection's arena; so is a blocking call's reply
     * of the common shape (a Buffer, or none), which its reader frees
     * before the lock goes (gpubuf__resp_free). protobuf-c's unpack and
     * free of a warm open's reply took 6,200 instructions, a fifth of the
     * client's open (callgrind; docs/performance.md). */
    Gpubuf__Response *resp =
        gpubuf__reply_decode(&c->arena, c->nonblock, c->batch_wait,
                             c->rbuf + c->rpos + GPUBUF_WIRE_HEADER_SIZE, h.length);
    if (t_wake && resp) {
        gpubuf_trace(c->session_id, resp->id, -1, GPUBUF_TRACE_C_WAKE, t_wake);
        gpubuf_trace(c->session_id, resp->id, -1, GPUBUF_TRACE_C_DECODED, 0);
    }
    c->rpos += GPUBUF_WIRE_HEADER_SIZE + h.length;
    if (c->rpos == c->rlen && c->rcap > (1u << 20)) {
        /* A large reply (a status) is done: give its room back. */
        free(c->rbuf);
        c->rbuf = NULL;
        c->rpos = c->rlen = c->rcap = 0;
    }
    if (!resp) {
        r = GPUBUF_EPROTOCOL;
        goto broken;
    }
    *n_fds = 0;
    if (resp->id > c->acked_id)
        c->acked_id = resp->id;
    if (resp->fds > 0) {
        /* The fds travel on this frame's first byte: they have been received
         * by the time the frame is complete. */
        if (resp->fds > GPUBUF_WIRE_MAX_FDS || (int)resp->fds > c->n_rfds) {
            gpubuf__resp_free(c, resp);
            r = GPUBUF_EPROTOCOL;
            goto broken;
        }
        int k = (int)resp->fds;
        memcpy(fds, c->rfds, (size_t)k * sizeof(int));
        memmove(c->rfds, c->rfds + k, (size_t)(c->n_rfds - k) * sizeof(int));
        c->n_rfds -= k;
        *n_fds = k;
    }
    *ret = resp;
    return 0;
broken:
    if (r == -EAGAIN && c->nonblock)
        return r; /* no whole frame yet: what was read stays read ahead */
    c->broken = true;
    gpubuf__set_error("reading from gpubufd: %s", gpubuf_strerror(r));
    if (c->async_hooks)
        c->async_hooks->fail_all(c, r);
    return r;
}

int gpubuf__read_reply_nb(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds) {
    c->nonblock = true;
    int r = read_reply(c, ret, fds, n_fds);
    c->nonblock = false;
    return r;
}

/* Account for the reply of an asynchronous request. */
static void settle_async(gpubuf_client *c, Gpubuf__Response *resp, const int *fds, int n_fds) {
    close_fds(fds, n_fds);
    if (resp->status < 0 && c->async_error == 0)
        c->async_error = resp->status;
    c->pending--;
    gpubuf__resp_free(c, resp);
}

static int recover(gpubuf_client *c, int r, const Gpubuf__Request *req, bool unsent,
                   bool may_resend);
static int session_lost_error(gpubuf_client *c, bool unsent);

void gpubuf__settle_reply(gpubuf_client *c, Gpubuf__Response *resp, int *fds, int n_fds) {
    if (resp->id == 0 && resp->status < 0) {
        /* Connection-level error (shutdown, bad frame): the stream ends. */
        c->broken = true;
        c->pending = 0;
        gpubuf__set_error("%s", resp->message && *resp->message ? resp->message
                                                                  : gpubuf_strerror(resp->status));
        if (c->async_hooks)
            c->async_hooks->fail_all(c, resp->status);
        gpubuf__resp_free(c, resp);
        close_fds(fds, n_fds);
        return;
    }
    if (c->async_hooks && c->async_hooks->reply(c, resp, fds, n_fds))
        return;
    if (c->pending > 0) {
        settle_async(c, resp, fds, n_fds);
        return;
    }
    /* Nobody asked for it: the stream is out of step. */
    gpubuf__resp_free(c, resp);
    close_fds(fds, n_fds);
    c->broken = true;
    gpubuf__set_error("gpubufd sent an unexpected reply");
    if (c->async_hooks)
        c->async_hooks->fail_all(c, GPUBUF_EPROTOCOL);
}

int gpubuf__drain_locked(gpubuf_client *c) {
    while (c->pending > 0) {
        Gpubuf__Response *resp;
        int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
        int r = read_reply(c, &resp, fds, &n_fds);
        if (r < 0) {
            c->pending = 0; /* gone with the connection */
            return recover(c, r, NULL, false, false);
        }
        if (resp->id == 0 && resp->status < 0) {
            /* Connection-level error (shutdown, bad frame): the stream ends. */
            c->broken = true;
            c->pending = 0;
            r = resp->status;
            if (c->async_hooks)
                c->async_hooks->fail_all(c, r);
            gpubuf__resp_free(c, resp);
            close_fds(fds, n_fds);
            return recover(c, r, NULL, false, false);
        }
        if (c->async_hooks && c->async_hooks->reply(c, resp, fds, n_fds))
            continue;
        settle_async(c, resp, fds, n_fds);
    }
    return 0;
}

int gpubuf__send_op_locked(gpubuf_client *c, Gpubuf__Request *req) {
    /* A connection lost earlier: reconnect first, as a synchronous call does. */
    if (c->broken && !c->closing && c->reconnect_ms > 0 && c->session_id && reconnect(c) < 0)
        return gpubuf__fail(GPUBUF_EDISCONNECTED,
                            "the connection to gpubufd is closed and reconnecting failed for "
                            "%d ms: this request was not sent",
                            c->reconnect_ms);
    if (c->session_lost)
        return session_lost_error(c, true);
    int r = send_request(c, req);
    for (int tries = 0; r < 0; tries++) {
        if ((r = recover(c, r, req, true, tries == 0)) != 1)
            return r;
        r = send_request(c, req);
    }
    return 0;
}

int gpubuf__send_async_locked(gpubuf_client *c, Gpubuf__Request *req) {
    /* A reconnect a release made found the session gone: this call says so. */
    if (c->session_lost && req->body_case != GPUBUF__REQUEST__BODY_RELEASE &&
        req->body_case != GPUBUF__REQUEST__BODY_UNMAP)
        return session_lost_error(c, true);
    int r = send_request(c, req);
    if (r < 0 && (req->body_case == GPUBUF__REQUEST__BODY_RELEASE ||
                  req->body_case == GPUBUF__REQUEST__BODY_UNMAP)) {
        /* Done by the reconnect: the resume claims only live views, and
         * keeps no slab. */
        r = recover(c, r, req, true, true);
        return r == -ECONNRESET ? 0 : r;
    }
    /* Not sent (the daemon was gone): sent again after the reconnect. */
    for (int tries = 0; r < 0; tries++) {
        if ((r = recover(c, r, req, true, tries == 0)) != 1)
            return r;
        r = send_request(c, req);
    }
    c->pending++;
    if (c->pending >= GPUBUF_MAX_PENDING && !c->ahead)
        return gpubuf__drain_locked(c);
    return 0;
}

/* The daemon's answer to a resume (lock held): views of buffers it no
 * longer has for us stay mapped, but hold nothing: their release is not
 * sent, and requests on them fail (gpubuf__view_check). n_claimed: the
 * first entries of c->held the hello claimed. */
static void resume_outcome(gpubuf_client *c, const Gpubuf__HelloReply *hr, size_t n_claimed) {
    gpubuf_held *h, *tmp;
    size_t seen = 0;
    bool had = c->held != NULL, dropped = false;
    HASH_ITER(hh, c->held, h, tmp) {
        bool lost = !hr->resumed || seen++ >= n_claimed;
        for (size_t k = 0; k < hr->n_lost && !lost; k++)
            lost = hr->lost[k] == h->id;
        if (lost) {
            HASH_DEL(c->held, h);
            free(h);
            dropped = true;
        }
    }
    if (dropped)
        c->gen++;
    c->resume_refs = hr->resumed ? hr->references_kept : 0;
    if (hr->resumed) {
        c->reconnects++;
        return;
    }
    /* A new session: ids of the old one's slabs may name other slabs now. */
    if (c->on_session_lost)
        c->on_session_lost(c);
    if (had) {
        c->session_lost = true;
        snprintf(c->resume_why, sizeof(c->resume_why), "%s",
                 hr->resume_refused && *hr->resume_refused ? hr->resume_refused
                                                           : "gpubufd did not say why");
    }
}

int gpubuf__hello_locked(gpubuf_client *c, bool resume) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__Hello hello = GPUBUF__HELLO__INIT;
    Gpubuf__HeldRef *held = NULL, **pheld = NULL;
    Gpubuf__Response *resp;
    char name[64];
    int r;
    size_t n = resume ? HASH_COUNT(c->held) : 0, i = 0;
    /* A HeldRef packs into at most 24 bytes: the claims that fit in one
     * request of the daemon's max_request go; views beyond them lose their
     * reference (docs/client-api.md, "Restart"). */
    size_t fit = c->max_request > 512 ? (c->max_request - 512) / 24 : 0;
    if (n > fit)
        n = fit;
    snprintf(name, sizeof(name), "%s", program_invocation_short_name);
    hello.min_version = GPUBUF_PROTOCOL_VERSION;
    hello.max_version = GPUBUF_PROTOCOL_VERSION;
    hello.client_name = name;
    hello.capabilities = GPUBUF_CAP_KEEP_MAPPED | GPUBUF_CAP_SLAB_ONCE;
    if (resume) {
        held = calloc(n + 1, sizeof(*held));
        pheld = calloc(n + 1, sizeof(*pheld));
        if (!held || !pheld) {
            free(held);
            free(pheld);
            return -ENOMEM;
        }
        for (gpubuf_held *h = c->held; h && i < n; h = h->hh.next, i++) {
            gpubuf__held_ref__init(&held[i]);
            held[i].buffer_id = h->id;
            held[i].count = h->count;
            held[i].read_only = h->ro;
            pheld[i] = &held[i];
        }
        hello.resume_session = c->session_id;
        hello.n_held = i;
        hello.held = pheld;
        /* Those not claimed are lost: dropped below with the daemon's list. */
    }
    req.body_case = GPUBUF__REQUEST__BODY_HELLO;
    req.hello = &hello;
    c->in_hello = true;
    r = gpubuf__rpc_reply_locked(c, &req, GPUBUF__RESPONSE__BODY_HELLO, &resp);
    c->in_hello = false;
    free(held);
    free(pheld);
    if (r < 0)
        return r;
    const Gpubuf__HelloReply *hr = resp->hello;
    c->session_id = hr->session_id;
    if (hr->max_request >= 256)
        c->max_request = hr->max_request;
    c->max_batch_items = hr->max_batch_items;
    c->keep_cap = 0;
    if (hr->capabilities & GPUBUF_CAP_KEEP_MAPPED)
        c->keep_cap = hr->max_kept_slabs < GPUBUF_KEEP_SLABS ? hr->max_kept_slabs
                                                              : GPUBUF_KEEP_SLABS;
    if (resume)
        resume_outcome(c, hr, i);
    gpubuf__resp_free(c, resp);
    return 0;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The daemon went away: connect again (pausing 10 ms, doubling up to 500 ms,
 * for at most reconnect_ms) and resume the session with the references the
 * live views hold. Their mappings stay as they are. Lock held. */
static int reconnect(gpubuf_client *c) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint64_t deadline = now_ms() + (uint64_t)c->reconnect_ms;
    int pause = GPUBUF_RECONNECT_FIRST_MS, r = GPUBUF_EDISCONNECTED;
    memcpy(sa.sun_path, c->path, sizeof(c->path) < sizeof(sa.sun_path) ? sizeof(c->path)
                                                                          : sizeof(sa.sun_path));
    /* What was in flight is gone with the old connection. */
    if (c->pending && !c->async_error)
        c->async_error = -ECONNRESET;
    c->pending = 0;
    if (c->async_hooks)
        c->async_hooks->fail_all(c, -ECONNRESET);
    for (int i = 0; i < c->n_rfds; i++)
        close(c->rfds[i]);
    c->n_rfds = 0;
    c->rpos = c->rlen = 0;
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->conn_no++;
    if (c->on_reconnect)
        c->on_reconnect(c);
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -errno;
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            c->fd = fd;
            c->broken = false;
            if (c->async_hooks)
                c->async_hooks->watch(c);
            r = gpubuf__hello_locked(c, true);
            if (r == 0)
                return 0;
            close(c->fd);
            c->fd = -1;
            c->broken = true;
        } else {
            close(fd);
        }
        if (now_ms() + (uint64_t)pause > deadline)
            return r;
        sleep_ms(pause);
        pause = pause * 2 > GPUBUF_RECONNECT_MAX_PAUSE_MS ? GPUBUF_RECONNECT_MAX_PAUSE_MS
                                                         : pause * 2;
    }
}

/* Requests the library sends again when their reply was lost with the
 * connection: they only read, so whether the old daemon handled them does
 * not matter (docs/client-api.md, "Restart"). */
static bool idempotent(const Gpubuf__Request *req) {
    return req && (req->body_case == GPUBUF__REQUEST__BODY_STAT ||
                   req->body_case == GPUBUF__REQUEST__BODY_STATUS);
}

/* Requests whose effect the reconnect has already: releases (the resume
 * claims only the references of live views) and an unmap (a resumed
 * session keeps no slab). Never sent again. */
static bool done_by_resume(const Gpubuf__Request *req) {
    return req && (req->body_case == GPUBUF__REQUEST__BODY_RELEASE ||
                   req->body_case == GPUBUF__REQUEST__BODY_BATCH_RELEASE ||
                   req->body_case == GPUBUF__REQUEST__BODY_UNMAP);
}

/* The daemon restarted without the session whose views held references:
 * say so once, on the call that meets it (unsent: the call's request was
 * not sent to the old daemon). -ECONNRESET. */
static int session_lost_error(gpubuf_client *c, bool unsent) {
    c->session_lost = false;
    return gpubuf__fail(-ECONNRESET,
                        "the daemon restarted without your session (%s): your views' buffers "
                        "are gone (their memory stays mapped in this process, but requests "
                        "on those views fail); release those views, then open or allocate "
                        "the buffers again. The connection works again; this call %s: make "
                        "it again",
                        c->resume_why,
                        unsent ? "was not carried out"
                               : "was in flight, and whether the old gpubufd applied it is "
                                 "unknown");
}

/* A request (req; NULL: the replies of asynchronous requests) met the end
 * of the connection with r (the daemon stopped or died). unsent: the daemon
 * cannot have handled it (the send failed, or its shutdown notice came
 * first). Reconnects when allowed. Returns 1 when the request is to be sent
 * again (never sent, or idempotent; only while may_resend), else the call's
 * error, with its message; r when there is no reconnecting. */
static int recover(gpubuf_client *c, int r, const Gpubuf__Request *req, bool unsent,
                   bool may_resend) {
    bool lost = r == GPUBUF_EDISCONNECTED || r == -EPIPE || r == -ECONNRESET || r == -ESHUTDOWN;
    char what[96];
    if (!lost || !c->broken || c->in_hello || c->closing || c->reconnect_ms <= 0)
        return r;
    uint32_t before = c->reconnects;
    if (reconnect(c) < 0)
        return gpubuf__fail(GPUBUF_EDISCONNECTED,
                            "the connection to gpubufd was lost and reconnecting failed for "
                            "%d ms%s",
                            c->reconnect_ms,
                            unsent && req ? ": this request was not sent" : "");
    if (done_by_resume(req)) /* callers count it done; a lost session is for the next call */
        return gpubuf__fail(-ECONNRESET, "the connection to gpubufd was lost; reconnected: "
                                         "the release was done by the reconnect");
    if (c->session_lost)
        return session_lost_error(c, unsent);
    if (may_resend && (unsent || idempotent(req)))
        return 1;
    if (c->reconnects != before)
        snprintf(what, sizeof(what), "resumed the session: %u reference%s kept",
                 c->resume_refs, c->resume_refs == 1 ? "" : "s");
    else
        snprintf(what, sizeof(what), "started a new session (the old one held no references)");
    if (!req)
        return gpubuf__fail(-ECONNRESET,
                            "the connection to gpubufd was lost while seals or releases sent "
                            "earlier were unanswered, so whether gpubufd applied them is "
                            "unknown; reconnected to gpubufd and %s: check the buffers "
                            "concerned",
                            what);
    if (unsent || idempotent(req))
        return gpubuf__fail(-ECONNRESET,
                            "the connection to gpubufd was lost twice before this request was "
                            "answered (gpubufd restarted again); reconnected to gpubufd and %s: "
                            "retry the request",
                            what);
    return gpubuf__fail(-ECONNRESET,
                        "the connection to gpubufd was lost while this request was in flight, "
                        "so whether gpubufd applied it is unknown; reconnected to gpubufd and "
                        "%s, the views stay valid: retry the request (a retried seal may "
                        "answer \"already sealed\", a retried delete \"no such buffer\")",
                        what);
}

/* The tries after a first one of req that failed with r (unsent as that
 * try left it): each recovers from the failure of the one before, then
 * sends again. */
static int rpc_again(gpubuf_client *c, Gpubuf__Request *req, int r, bool unsent,
                     Gpubuf__Response **ret, int *ret_fds, int *ret_n_fds) {
    for (int tries = 1; r < 0; tries++) {
        if ((r = recover(c, r, req, unsent, tries == 1)) != 1)
            return r;
        unsent = true;
        r = rpc(c, req, ret, ret_fds, ret_n_fds, &unsent);
    }
    return r;
}

int gpubuf__rpc_fds_locked(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                           int *ret_fds, int *ret_n_fds) {
    bool unsent = true;
    int r = rpc(c, req, ret, ret_fds, ret_n_fds, &unsent);
    return r < 0 ? rpc_again(c, req, r, unsent, ret, ret_fds, ret_n_fds) : r;
}

static int rpc_wait(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                    int *ret_fds, int *ret_n_fds, bool *ret_unsent);

/* The most a request sent ahead may hold: the client sends it before it
 * reads the reply before it, so the socket's buffer must take it whole
 * whatever the daemon does meanwhile (a daemon held back by that unread
 * reply reads nothing). Larger requests take the synchronous path. */
#define AHEAD_MAX_BYTES (64u * 1024u)

int gpubuf__rpc_start_locked(gpubuf_client *c, Gpubuf__Request *req, uint32_t *ret_conn) {
    /* Whatever needs a recovery first takes the synchronous path. */
    if (c->broken || c->session_lost || c->in_hello)
        return GPUBUF_EDISCONNECTED;
    *ret_conn = c->conn_no;
    int r = send_request_max(c, req, AHEAD_MAX_BYTES);
    if (r == 0)
        c->ahead++;
    return r;
}

int gpubuf__rpc_finish_locked(gpubuf_client *c, Gpubuf__Request *req, uint32_t conn,
                              Gpubuf__Response **ret, int *ret_fds, int *ret_n_fds) {
    bool unsent = false;
    int r;
    *ret_n_fds = 0;
    assert(c->ahead > 0);
    c->ahead--;
    if (c->conn_no != conn) {
        /* A reconnect for an earlier reply: this request went with the old
         * connection. It goes again when that daemon's shutdown notice
         * said it handled nothing after the earlier one. */
        if (!(c->shut_known && c->shut_conn == conn))
            return gpubuf__fail(-ECONNRESET,
                                "the connection to gpubufd was lost while this request was in "
                                "flight, so whether gpubufd applied it is unknown; reconnected "
                                "to gpubufd, the views stay valid: retry the request");
        unsent = true;
        r = rpc(c, req, ret, ret_fds, ret_n_fds, &unsent);
    } else {
        /* A connection broken since the send (an earlier reply found it
         * so) is not read: its stream may be out of step. */
        r = c->broken ? GPUBUF_EDISCONNECTED
                      : rpc_wait(c, req, ret, ret_fds, ret_n_fds, &unsent);
    }
    return r < 0 ? rpc_again(c, req, r, unsent, ret, ret_fds, ret_n_fds) : r;
}

/* One request and its reply. *ret_unsent stays true while the daemon
 * cannot have handled the request (see recover()). */
static int rpc(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret, int *ret_fds,
               int *ret_n_fds, bool *ret_unsent) {
    int r;

    *ret_n_fds = 0;
    /* A connection lost earlier (an asynchronous request found it gone). */
    if (c->broken && !c->in_hello && !c->closing && c->reconnect_ms > 0 && c->session_id) {
        if (reconnect(c) < 0) {
            gpubuf__set_error("the connection to gpubufd is closed and reconnecting failed "
                              "for %d ms: this request was not sent",
                              c->reconnect_ms);
            return GPUBUF_EDISCONNECTED;
        }
    }
    /* A reconnect (this one, or one a release made) found the session gone. */
    if (c->session_lost && !c->in_hello)
        return session_lost_error(c, true);
    r = send_request(c, req);
    if (r < 0)
        return r;
    *ret_unsent = false;
    return rpc_wait(c, req, ret, ret_fds, ret_n_fds, ret_unsent);
}

static int rpc_wait_reply(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                          int *ret_fds, int *ret_n_fds, bool *ret_unsent);

/* The reply of req, sent on this connection. A batch's reply is decoded
 * into the arena's heap block (reply_fast.c): every reader of a batch's
 * reply, and every path of this wait, frees with gpubuf__resp_free. */
static int rpc_wait(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                    int *ret_fds, int *ret_n_fds, bool *ret_unsent) {
    /* A wait inside another (a reconnect's hello) gives the outer its flag back. */
    bool was = c->batch_wait;
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_BATCH_OPEN:
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE:
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC:
    case GPUBUF__REQUEST__BODY_BATCH_STATE: c->batch_wait = true; break;
    default: c->batch_wait = false; break;
    }
    int r = rpc_wait_reply(c, req, ret, ret_fds, ret_n_fds, ret_unsent);
    c->batch_wait = was;
    return r;
}

static int rpc_wait_reply(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                          int *ret_fds, int *ret_n_fds, bool *ret_unsent) {
    Gpubuf__Response *resp;
    int r, fds[GPUBUF_WIRE_MAX_FDS], n_fds = 0;

    *ret_n_fds = 0;
    /* Replies come in request order: first those of asynchronous requests. */
    for (;;) {
        r = read_reply(c, &resp, fds, &n_fds);
        if (r < 0)
            return r;
        if (resp->id == req->id || resp->id == 0)
            break;
        if (c->async_hooks && c->async_hooks->reply(c, resp, fds, n_fds))
            continue; /* a started request's: delivered by gpubuf_dispatch() */
        if (c->pending == 0)
            break;
        settle_async(c, resp, fds, n_fds);
    }
    if (resp->id == req->id) /* for spin_for_reply(): a reply within the polling time? */
        gpubuf_poll_score(&c->spin_score, gpubuf_now_ns() - c->sent_ns <= c->spin_max_ns);
    if (c->async_hooks)
        c->async_hooks->kick(c);
    if (resp->id != req->id && resp->id != 0) {
        gpubuf__resp_free(c, resp);
        close_fds(fds, n_fds);
        c->broken = true;
        gpubuf__set_error("gpubufd sent an unexpected reply");
        return GPUBUF_EPROTOCOL;
    }
    if (resp->id == 0 && resp->status < 0) {
        /* Connection-level error (shutdown, bad frame): the stream ends.
         * The shutdown notice follows the replies of every request the
         * daemon handled: this one was not. */
        c->broken = true;
        c->pending = 0;
        if (c->async_hooks)
            c->async_hooks->fail_all(c, resp->status);
        *ret_unsent = resp->status == -ESHUTDOWN;
        if (*ret_unsent) { /* nor any request sent after this one */
            c->shut_conn = c->conn_no;
            c->shut_known = true;
        }
    }
    if (resp->status < 0) {
        r = resp->status;
        gpubuf__set_error("%s", resp->message && *resp->message ? resp->message
                                                                  : gpubuf_strerror(r));
        gpubuf__resp_free(c, resp);
        close_fds(fds, n_fds);
        return r;
    }
    gpubuf__clear_error();
    *ret = resp;
    memcpy(ret_fds, fds, (size_t)n_fds * sizeof(int));
    *ret_n_fds = n_fds;
    return 0;
}

int gpubuf__rpc_reply_locked(gpubuf_client *c, Gpubuf__Request *req, int body_case,
                             Gpubuf__Response **ret) {
    int fd;
    int r = gpubuf__rpc_locked(c, req, ret, &fd);
    if (r < 0)
        return r;
    if (fd >= 0)
        close(fd);
    if (body_case != GPUBUF__RESPONSE__BODY__NOT_SET && (int)(*ret)->body_case != body_case) {
        gpubuf__resp_free(c, *ret);
        return GPUBUF_EPROTOCOL;
    }
    return 0;
}

int gpubuf__rpc_locked(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                       int *ret_fd) {
    int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
    int r = gpubuf__rpc_fds_locked(c, req, ret, fds, &n_fds);
    *ret_fd = -1;
    if (r < 0)
        return r;
    if (n_fds > 1) {
        /* A single request's reply carries one fd at most. */
        close_fds(fds, n_fds);
        gpubuf__resp_free(c, *ret);
        c->broken = true;
        gpubuf__set_error("gpubufd sent %d fds with a reply that carries one at most", n_fds);
        return GPUBUF_EPROTOCOL;
    }
    if (n_fds == 1)
        *ret_fd = fds[0];
    return 0;
}
