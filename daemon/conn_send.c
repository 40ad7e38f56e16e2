/* Server room, continued: a reply queued on a connection. Its frame is
 * built (header, the packed message, its fds duplicated) within the
 * connection's limits and the reply memory of everyone and of its uid, then
 * written at once, held until the end of another connection's batch of
 * frames (flush_held in server.c), or left for the socket to turn
 * writable. See server.h. */
#include "server_internal.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utlist.h>

#include "log.h"
#include "trace.h"
#include "wire.h"

int gd_conn_send(gd_conn *c, size_t plen, gd_pack_fn pack, const void *msg, int fd) {
    return gd_conn_send_fds(c, plen, pack, msg, &fd, fd >= 0 ? 1 : 0, false);
}

int gd_conn_send_fds(gd_conn *c, size_t plen, gd_pack_fn pack, const void *msg, const int *fds,
                     int n_fds, bool bounded) {
    gd_outbuf *o;
    bool was_empty = !c->out;
    size_t data_len;
    assert(n_fds >= 0 && n_fds <= (int)GPUBUF_WIRE_MAX_FDS);
    if (c->closing || c->peer_gone)
        return -ECONNRESET;
    /* The answers of its waiting opens come on top of the replies to its
     * requests: a client that reads late is not dropped for them. */
    if (c->out_frames >=
        c->srv->limits->max_queued_replies + c->srv->limits->max_waiters_per_client) {
        LOG_WARN_LIMITED("pid %d reads none of its %u queued replies; disconnecting", (int)c->pid,
                         c->out_frames);
        gd_conn_end(c, GD_CLOSE_BACKLOG);
        return -ENOBUFS;
    }
    if (plen > GPUBUF_WIRE_MAX_RESPONSE) {
        LOG_ERR_LIMITED("reply of %zu bytes exceeds the frame limit", plen);
        gd_conn_end(c, GD_CLOSE_ERROR);
        return -EMSGSIZE;
    }
    if (plen > GD_SMALL_REPLY && n_fds == 0 && !bounded &&
        (c->srv->out_bytes + GPUBUF_WIRE_HEADER_SIZE + plen > c->srv->limits->max_reply_memory ||
         !gd_budget_uid_room(c, GPUBUF_WIRE_HEADER_SIZE + plen)))
        return -EAGAIN; /* nothing queued: the caller answers with a small error */
    /* The fds live after the data, aligned. */
    data_len = (GPUBUF_WIRE_HEADER_SIZE + plen + sizeof(int) - 1) / sizeof(int) * sizeof(int);
    o = malloc(sizeof(*o) + data_len + (size_t)n_fds * sizeof(int));
    if (!o) {
        gd_conn_end(c, GD_CLOSE_ERROR);
        return -ENOMEM;
    }
    o->off = 0;
    o->len = GPUBUF_WIRE_HEADER_SIZE + plen;
    o->fds = (int *)(void *)(o->data + data_len);
    for (o->n_fds = 0; o->n_fds < n_fds; o->n_fds++) {
        o->fds[o->n_fds] = fcntl(fds[o->n_fds], F_DUPFD_CLOEXEC, 0);
        if (o->fds[o->n_fds] < 0) {
            int e = errno;
            LOG_ERR_LIMITED("pid %d: cannot duplicate the fd of a reply (%s); disconnecting",
                            (int)c->pid, strerror(e));
            for (int i = 0; i < o->n_fds; i++)
                close(o->fds[i]);
            free(o);
            gd_conn_end(c, GD_CLOSE_ERROR);
            return -e;
        }
    }
    gpubuf_wire_header_encode(o->data, (uint32_t)plen);
    pack(msg, o->data + GPUBUF_WIRE_HEADER_SIZE);
    o->trace_request = 0;
    if (gpubuf_trace_on() &&
        gpubuf_trace_tag(&o->trace_session, &o->trace_request, &o->trace_type))
        gpubuf_trace(o->trace_session, o->trace_request, o->trace_type, GPUBUF_TRACE_D_ENCODED,
                     0);
    DL_APPEND(c->out, o);
    c->out_frames++;
    c->out_fds += (uint32_t)o->n_fds;
    gd_budget_out_add(c, o->len);
    if (was_empty && !c->corked && c->srv->in_frame && c->srv->in_frame != c) {
        /* A reply another connection's request made (a waiting open it
         * woke): it leaves once that request's batch of frames is done and
         * their changes are saved (flush_held): one write for the answers
         * of many seals. */
        if (!c->held) {
            c->held = true;
            LL_PREPEND2(c->srv->held, c, held_next);
        }
    } else if (was_empty && !c->corked) {
        int r = gd_conn_flush(c);
        if (r < 0) {
            gd_conn_peer_left(c);
            return r;
        }
        if (c->out)
            gd_conn_update_poll(c);
    }
    return 0;
}
