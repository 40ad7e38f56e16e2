/* Session room: one per connection. It speaks the protocol (decode,
 * dispatch, encode), keeps the peer's credentials and its registry holder
 * (the references the client holds), and works on the daemon context handed
 * to it. It moves no bytes itself: frames come in through gd_session_frame()
 * and replies leave through the transport it was given, so the session runs
 * as well over a socket (the server) as over an in-memory connection
 * (tests/test_session.c). */
#ifndef GPUBUFD_SESSION_H
#define GPUBUFD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "context.h"

/* Where replies go. conn is the transport's own connection. */
typedef struct gd_transport {
    /* Queue one reply frame of len payload bytes that pack(msg, dst)
     * writes; fd (-1: none) is dup'ed and rides on the frame. */
    int (*send)(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                const void *msg, int fd);
    /* Disconnect (the transport calls gd_session_free() later). */
    void (*close)(void *conn);
    /* The handshake is done. */
    void (*ready)(void *conn);
    /* True once the connection is going. */
    bool (*closing)(const void *conn);
    /* send() with n_fds fds (at most GPUBUF_WIRE_MAX_FDS); bounded: the
     * reply's size is bounded (a batch reply), queue it like a small one. */
    int (*send_fds)(void *conn, size_t len, void (*pack)(const void *msg, uint8_t *dst),
                    const void *msg, const int *fds, int n_fds, bool bounded);
    /* How many fds a reply may carry now without passing the connection's
     * fd budget (at least 1 while a request is handled). */
    unsigned (*fd_room)(const void *conn);
    /* May the request being handled queue a reply of up to bound bytes?
     * When not, the request is left unhandled (gd_session_frame() returns
     * -EAGAIN) and the transport hands it again later. NULL: always. */
    bool (*reply_room)(void *conn, size_t bound);
} gd_transport;

typedef struct gd_session {
    gd_context *ctx;
    const gd_transport *io;
    void *conn;
    gd_holder *holder;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    char name[64];
    bool hello_done;
    uint64_t caps; /* capability bits granted at hello (GPUBUF_CAP_*) */
    uint32_t n_waiters;
    int cur_type;                   /* gd_req_type being handled, -1 between requests (metrics) */
    gd_end_reason end;              /* why the session closed the connection itself, if it did */
    struct gd_session *next, *prev; /* utlist DL: ctx->sessions */
} gd_session;

/* A new session for a peer with these credentials: NULL when out of memory. */
gd_session *gd_session_new(gd_context *ctx, const gd_transport *io, void *conn, pid_t pid,
                           uid_t uid, gid_t gid);
/* Handle one request frame's payload. Returns 0, or -EAGAIN when it was
 * left unhandled because the transport has no room for its reply yet (a
 * batch: see gd_transport.reply_room); hand the same frame again later. */
int gd_session_frame(gd_session *s, const uint8_t *payload, size_t len);
/* The same for a frame the transport read at read_ns after a wake-up at
 * woke_ns (GPUBUF_TRACE_TIMING; 0: now): the trace's first two steps. */
int gd_session_frame_at(gd_session *s, const uint8_t *payload, size_t len, uint64_t woke_ns,
                        uint64_t read_ns);
/* The largest reply a batch of n items can get (about 2.5 MiB for
 * GD_BATCH_MAX_ITEMS items). */
size_t gd_session_batch_reply_bound(size_t n);
/* The transport got a bad frame header (err): say why before it closes. */
void gd_session_bad_frame(gd_session *s, int err);
/* The daemon stops: tell the client and disconnect. */
void gd_session_shutdown(gd_session *s);
/* The connection is gone: cancel the waits, drop every reference, free s. */
void gd_session_free(gd_session *s);
/* A connection refused before it got a session (why; its uid, the limit it
 * reached): write the payload of the frame that tells the client why into
 * payload (at most cap bytes); its length, or 0 when it does not fit.
 * Counts the refusal. */
size_t gd_session_refusal(gd_context *ctx, gd_refusal why, uid_t uid, uint32_t limit,
                          uint8_t *payload, size_t cap);

#endif
