/* libgpubuf-client: the connection's stream. Requests out, replies in (read
 * ahead, in order, with the fds they carry), asynchronous requests settled
 * before the next synchronous reply, and the per-thread error message. */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "internal.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

static _Thread_local char tl_error[512];

void gpubuf__set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof(tl_error), fmt, ap);
    va_end(ap);
}

int gpubuf__fail(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof(tl_error), fmt, ap);
    va_end(ap);
    return err;
}

GPUBUF_EXTERN const char *gpubuf_last_error_message(void) {
    return tl_error;
}

void gpubuf__clear_error(void) {
    tl_error[0] = '\0';
}

int gpubuf__result(int r) {
    if (r >= 0)
        tl_error[0] = '\0';
    else if (!tl_error[0])
        gpubuf__set_error("%s", gpubuf_strerror(r));
    return r;
}

/* Most asynchronous requests in flight before the client waits for their
 * replies: bounds what the daemon queues for a client that never reads. */
#define GPUBUF_MAX_PENDING 64

static int read_reply(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds);

/* Close the fds a reply brought. */
static void close_fds(const int *fds, int n) {
    for (int i = 0; i < n; i++)
        close(fds[i]);
}

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
    gpubuf__response__free_unpacked(resp, NULL);
    return said;
}

static int send_request(gpubuf_client *c, Gpubuf__Request *req) {
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
    plen = gpubuf__request__get_packed_size(req);
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
    gpubuf__request__pack(req, frame + GPUBUF_WIRE_HEADER_SIZE);
    r = gpubuf_wire_send_all(c->fd, frame, plen + GPUBUF_WIRE_HEADER_SIZE, -1);
    if (t_encode) {
        gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_ENCODE, t_encode);
        gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_SENT, 0);
    }
    if (frame != stackbuf)
        free(frame);
    if (r < 0) {
        c->broken = true;
        if ((r == -EPIPE || r == -ECONNRESET) && goodbye(c, &r))
            return r;
        gpubuf__set_error("sending to gpubufd: %s", strerror(-r));
        return r == -EPIPE ? GPUBUF_EDISCONNECTED : r;
    }
    return 0;
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
    ssize_t n = gpubuf_wire_recv(c->fd, c->rbuf + c->rlen, c->rcap - c->rlen, fds,
                                 GPUBUF_WIRE_MAX_FDS, &n_fds, &trunc);
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
    return 0;
}

/* Read one reply frame. Frames are cut from the read-ahead buffer; fds are
 * claimed by the frame that says it carries them (fds arrive in order):
 * fds[0..*n_fds). */
static int read_reply(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds) {
    gpubuf_frame_header h;
    int r;
    while (c->rlen - c->rpos < GPUBUF_WIRE_HEADER_SIZE)
        if ((r = fill_rbuf(c, GPUBUF_WIRE_HEADER_SIZE)) < 0)
            goto broken;
    r = gpubuf_wire_header_decode(c->rbuf + c->rpos, GPUBUF_WIRE_MAX_RESPONSE, &h);
    if (r < 0)
        goto broken;
    while (c->rlen - c->rpos - GPUBUF_WIRE_HEADER_SIZE < h.length)
        if ((r = fill_rbuf(c, GPUBUF_WIRE_HEADER_SIZE + h.length)) < 0)
            goto broken;
    uint64_t t_wake = gpubuf_trace_on() ? gpubuf_now_ns() : 0;
    Gpubuf__Response *resp =
        gpubuf__response__unpack(NULL, h.length, c->rbuf + c->rpos + GPUBUF_WIRE_HEADER_SIZE);
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
            gpubuf__response__free_unpacked(resp, NULL);
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
    c->broken = true;
    gpubuf__set_error("reading from gpubufd: %s", gpubuf_strerror(r));
    return r;
}

/* Account for the reply of an asynchronous request. */
static void settle_async(gpubuf_client *c, Gpubuf__Response *resp, const int *fds, int n_fds) {
    close_fds(fds, n_fds);
    if (resp->status < 0 && c->async_error == 0)
        c->async_error = resp->status;
    c->pending--;
    gpubuf__response__free_unpacked(resp, NULL);
}

int gpubuf__drain_locked(gpubuf_client *c) {
    while (c->pending > 0) {
        Gpubuf__Response *resp;
        int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
        int r = read_reply(c, &resp, fds, &n_fds);
        if (r < 0) {
            c->pending = 0;
            return r;
        }
        if (resp->id == 0 && resp->status < 0) {
            /* Connection-level error (shutdown, bad frame): the stream ends. */
            c->broken = true;
            c->pending = 0;
            r = resp->status;
            gpubuf__response__free_unpacked(resp, NULL);
            close_fds(fds, n_fds);
            return r;
        }
        settle_async(c, resp, fds, n_fds);
    }
    return 0;
}

int gpubuf__send_async_locked(gpubuf_client *c, Gpubuf__Request *req) {
    int r = send_request(c, req);
    if (r < 0)
        return r;
    c->pending++;
    if (c->pending >= GPUBUF_MAX_PENDING)
        return gpubuf__drain_locked(c);
    return 0;
}

int gpubuf__rpc_fds_locked(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                           int *ret_fds, int *ret_n_fds) {
    Gpubuf__Response *resp;
    int r, fds[GPUBUF_WIRE_MAX_FDS], n_fds = 0;

    *ret_n_fds = 0;
    r = send_request(c, req);
    if (r < 0)
        return r;
    /* Replies come in request order: first those of asynchronous requests. */
    for (;;) {
        r = read_reply(c, &resp, fds, &n_fds);
        if (r < 0)
            return r;
        if (resp->id == req->id || resp->id == 0 || c->pending == 0)
            break;
        settle_async(c, resp, fds, n_fds);
    }
    if (resp->id != req->id && resp->id != 0) {
        gpubuf__response__free_unpacked(resp, NULL);
        close_fds(fds, n_fds);
        c->broken = true;
        gpubuf__set_error("gpubufd sent an unexpected reply");
        return GPUBUF_EPROTOCOL;
    }
    if (resp->id == 0 && resp->status < 0) {
        /* Connection-level error (shutdown, bad frame): the stream ends. */
        c->broken = true;
        c->pending = 0;
    }
    if (resp->status < 0) {
        r = resp->status;
        gpubuf__set_error("%s", resp->message && *resp->message ? resp->message
                                                                  : gpubuf_strerror(r));
        gpubuf__response__free_unpacked(resp, NULL);
        close_fds(fds, n_fds);
        return r;
    }
    tl_error[0] = '\0';
    *ret = resp;
    memcpy(ret_fds, fds, (size_t)n_fds * sizeof(int));
    *ret_n_fds = n_fds;
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
        gpubuf__response__free_unpacked(*ret, NULL);
        c->broken = true;
        gpubuf__set_error("gpubufd sent %d fds with a reply that carries one at most", n_fds);
        return GPUBUF_EPROTOCOL;
    }
    if (n_fds == 1)
        *ret_fd = fds[0];
    return 0;
}
