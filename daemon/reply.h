/* Session room, ground floor: a session's state (gd_session, and the
 * gd_transport its replies leave through) and how it answers: packing and
 * queuing a reply, error replies, the Buffer and Slab messages. The
 * requests (session.c), the status reply (status.c) and the batches
 * (batch.c) all answer through it. */
#ifndef GPUBUFD_REPLY_H
#define GPUBUFD_REPLY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "context.h"
#include "gpubuf.pb-c.h"

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
    /* How many fds the connection's queued replies hold now. NULL: none. */
    unsigned (*fds_held)(const void *conn);
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
    struct session_waiter *waiting; /* its waiting opens by request id (uthash; session.c) */
    int cur_type;                   /* gd_req_type being handled, -1 between requests (metrics) */
    /* A batch alloc is being answered: the slabs of its buffers reach the
     * client with its reply, after the reply to any of this session's
     * waiting opens that its seals wake (session.c, client_maps). */
    bool batch_alloc;
    gd_end_reason end;              /* why the session closed the connection itself, if it did */
    struct gd_session *next, *prev; /* utlist DL: ctx->sessions */
} gd_session;

/* Storage for one Buffer message and its Slab. */
typedef struct buffer_msg {
    Gpubuf__Buffer buf;
    Gpubuf__Slab slab;
    Gpubuf__ArrayLayout layout;
} buffer_msg;

/* Pack a Response (msg) into dst: the transport's pack callback. */
void gd_session_pack(const void *msg, uint8_t *dst);
/* How one reply is packed. gd_reply_size() fills it and returns the packed
 * size; hand plan.pack and plan.msg to the transport, which packs at once
 * (the plan lives on the caller's stack until then). The replies of single
 * requests (id, status, message, fds and a Buffer without an array layout)
 * and of batches (a BatchReply without array layouts) go to
 * gd_reply_pack_fast (reply_pack.c) with the sizes it found, so nothing is
 * sized twice; any other to gd_session_pack (protobuf-c). Both write the
 * same bytes. */
typedef struct gd_reply_plan {
    void (*pack)(const void *msg, uint8_t *dst);
    const void *msg; /* what pack takes: the plan, or the Response */
    const Gpubuf__Response *resp;
    size_t buffer_len, slab_len; /* gd_reply_pack_fast: the Buffer's and the Slab's sizes */
    /* A BatchReply: its size, and the payload of each packed array
     * (status, buffer_id, size, offset, slab_id, event_items, state,
     * lease_left_ms, meta_items). */
    size_t batch_len, arr[9];
} gd_reply_plan;
size_t gd_reply_size(const Gpubuf__Response *r, gd_reply_plan *plan);
void gd_reply_pack_fast(const void *msg, uint8_t *dst);
/* Queue a reply; the transport dup's fd. */
void gd_session_send(gd_session *s, const Gpubuf__Response *resp, int fd);
/* Close the connection, for why (the first reason counts). */
void gd_session_close(gd_session *s, gd_end_reason why);
/* Reply status (0: success) with msg (NULL: gpubuf_strerror(status)). */
void gd_session_reply_error(gd_session *s, uint64_t id, int status, const char *msg);
/* How to map b's slab: its description, with the IPC handle if it has one. */
void gd_session_fill_slab(Gpubuf__Slab *m, const gd_buf *b);
/* b's array layout as a wire ArrayLayout in l (initialised here), pointing
 * into b's metadata; false (l untouched) when b has none. */
bool gd_session_fill_layout(Gpubuf__ArrayLayout *l, const gd_buf *b);
/* b as a Buffer message (and its Slab), pointing into b. */
void gd_session_fill_buffer(buffer_msg *m, const gd_buf *b);
/* May s keep b's slab mapped after its last view (mode ro)? */
bool gd_session_slab_keepable(const gd_session *s, const gd_buf *b, bool ro);

#endif
