/* Server room of gpubufd: the libuv loop's listening socket, accepting
 * connections, reading bytes into frames, writing reply frames (with the fd
 * each may carry), corking, backpressure, deadlines. Bytes and fds only: it
 * hands each whole frame payload to its user through callbacks and knows
 * nothing of protobuf, the registry, pools or GPUs. */
#ifndef GPUBUFD_SERVER_H
#define GPUBUFD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "hash.h"
#include <uv.h>

#include "settings.h"

typedef struct gd_server gd_server;
typedef struct gd_conn gd_conn;

/* Why a connection ended (on_close). */
typedef enum gd_close_reason {
    GD_CLOSE_NONE,    /* not closing */
    GD_CLOSE_BY_USER, /* gd_conn_close(): the user decided */
    GD_CLOSE_PEER,    /* the peer closed or broke the connection */
    GD_CLOSE_TIMEOUT, /* no handshake, or half a frame, for too long */
    GD_CLOSE_BACKLOG, /* the peer reads none of its replies */
    GD_CLOSE_BAD_FRAME,
    GD_CLOSE_STOP,  /* gd_server_stop() */
    GD_CLOSE_ERROR, /* out of memory, a reply over the frame limit, libuv */
} gd_close_reason;

/* What the server calls. user is what on_open returned for the connection. */
typedef struct gd_server_callbacks {
    /* A peer connected (credentials from SO_PEERCRED). Return the
     * connection's user pointer, or NULL to refuse it (it is closed). */
    void *(*on_open)(void *data, gd_conn *c, pid_t pid, uid_t uid, gid_t gid);
    /* One whole frame: its payload (the header is checked and stripped).
     * Returns 0 when it was handled, or -EAGAIN when it was not because
     * gd_conn_reply_room() said no: the frame stays, the connection reads
     * and handles nothing more until the reply memory has room, then the
     * frame is handed up again. woke_ns and read_ns: when the loop woke
     * for the last read and when its recvmsg returned (GPUBUF_TRACE_TIMING;
     * 0 when not traced). */
    int (*on_frame)(void *user, const uint8_t *payload, size_t len, uint64_t woke_ns,
                    uint64_t read_ns);
    /* A bad frame header (-EMSGSIZE: too long, GPUBUF_EPROTOCOL: magic,
     * version or flags): the last chance to say why; the connection closes. */
    void (*on_bad_frame)(void *user, int err);
    /* The connection is gone (why) and its last frames were handled: free
     * user. Called from the loop, never from inside another callback. */
    void (*on_close)(void *user, gd_close_reason why);
    /* A peer the server refuses (why; its uid, and the limit it reached):
     * write the payload of one frame that tells it why into payload (at
     * most cap bytes) and return its length, 0 for none. The server sends
     * it at once and closes the connection. Optional. */
    size_t (*on_refuse)(void *data, gd_refusal why, uid_t uid, uint32_t limit, uint8_t *payload,
                        size_t cap);
    /* After connections closed (on_close): the user's deferred work, one
     * bounded step per turn of the loop; return true while some is left.
     * Optional. */
    bool (*on_work)(void *data);
} gd_server_callbacks;

typedef struct gd_outbuf {
    struct gd_outbuf *next, *prev; /* utlist DL: the queue of replies */
    size_t len, off;
    int n_fds; /* fds to send with the first byte (owned dups), 0 when none */
    uint64_t trace_session, trace_request; /* GPUBUF_TRACE_TIMING: whose reply (0: none) */
    int trace_type;
    int *fds;  /* in the same allocation, after data */
    uint8_t data[];
} gd_outbuf;

/* What the connections of one uid have queued (GD_UID_REPLY_SHARE). */
typedef struct gd_uid_use {
    uid_t uid;
    uint32_t n_conns;
    size_t out_bytes; /* queued reply bytes of the uid's connections */
    UT_hash_handle hh;
} gd_uid_use;

/* One accepted connection. */
struct gd_conn {
    uv_poll_t poll;
    uv_timer_t timer; /* handshake and partial-frame deadlines */
    int fd;
    gd_server *srv;
    void *user;
    pid_t pid;
    uid_t uid;
    gd_uid_use *uu; /* its uid's queued replies; NULL until accepted */
    bool ready;     /* the user said the handshake is done */
    bool closing;
    bool corked;    /* replies wait for the end of the current batch of frames */
    bool peer_gone; /* the peer closed or broke the connection: no more replies */
    bool reaping;   /* a step of the final drain of what it sent before going runs */
    bool draining;  /* the final drain started: replies dropped, drain_left set */
    bool pending;   /* on the server's pending list */
    bool eof;       /* the peer closed its side: the frames it sent are handled,
                       a bounded number per turn, and answered, then it goes */
    gd_close_reason why; /* the first reason it was closed for */
    uint8_t *in;
    size_t in_len, in_cap;
    gd_outbuf *out;      /* utlist DL queue */
    int poll_events;     /* events the poll handle watches now (UV_READABLE...) */
    uint32_t out_frames; /* replies queued because the peer is not reading */
    uint32_t out_fds;    /* queued replies that still hold their fd (a dup) */
    size_t out_bytes;
    size_t drain_left; /* bytes the final drain may still read */
    size_t mem_wait;   /* reply bytes a held-back frame needs (gd_conn_reply_room), 0: none */
    gd_conn *mw_next, *mw_prev; /* utlist DL: the server's mem_waiters, first come first */
    gd_conn *next, *prev;   /* utlist DL: the server's connections */
    gd_conn *reap_next;     /* utlist LL: closed, waiting for the reaper */
    gd_conn *pending_next;  /* utlist LL: frames left after the per-wake-up cap */
    bool held;              /* on the server's held list (in_frame) */
    gd_conn *held_next;     /* utlist LL: replies held while another's frame was handled */
};

struct gd_server {
    uv_loop_t *loop;
    const gd_limits *limits; /* the daemon's live limits (SIGHUP changes them) */
    gd_server_callbacks cb;
    void *data; /* for on_open */
    uv_poll_t listen_poll;
    uv_check_t reaper;
    uv_idle_t kick; /* runs connections with frames left over */
    /* Polling for the next request (poll_us): while active the loop does
     * not block; it stops poll_us after the last requests were handled. */
    uv_idle_t spin;
    uint64_t spin_last_ns; /* when requests were last handled */
    int spin_score;        /* >= 0: requests mostly come within poll_us: poll */
    uv_timer_t accept_timer; /* resumes accepting after a pause for want of fds */
    int spare_fd; /* /dev/null, closed to accept and refuse a peer at EMFILE */
    gd_conn *pending;
    int listen_fd;
    bool listen_owned; /* we created the socket file (unlink on exit) */
    bool handles_closed;
    char *socket_path;
    gd_conn *conns;
    gd_conn *reap;
    uint32_t n_conns;
    size_t out_bytes; /* queued reply bytes of all connections (max_reply_memory) */
    gd_uid_use *uids; /* uthash by uid: the uids with connections */
    gd_conn *mem_waiters; /* connections whose next frame waits for reply memory */
    /* The connection whose frame is being handled: replies to others wait
     * for the next turn of the loop, after that request's changes are in
     * the saved state (gd_state_end), as its own replies do. */
    gd_conn *in_frame;
    gd_conn *held; /* utlist LL: the other connections it gave replies to */
    bool stopping;
    bool work; /* cb.on_work has work left */
    /* GPUBUF_TRACE_TIMING: when the loop woke for the last read, and when
     * its recvmsg returned; handed up with each frame (on_frame). */
    uint64_t trace_woke_ns, trace_read_ns;
};

/* Initialise srv on loop. limits must outlive the server. */
int gd_server_init(gd_server *srv, uv_loop_t *loop, const gd_limits *limits,
                   const gd_server_callbacks *cb, void *data);
/* Listen on an already bound and listening fd (systemd), or bind path with
 * mode and (gid not (gid_t)-1) group gid: the path appears already
 * listening (bound under a name of its own, renamed over path). */
int gd_server_listen_fd(gd_server *srv, int fd);
int gd_server_listen_path(gd_server *srv, const char *path, mode_t mode, gid_t gid);
/* Close every connection and the listener; the loop then runs out. */
void gd_server_stop(gd_server *srv);
/* Run on_work at the next turns of the loop until it says it is done. */
void gd_server_want_work(gd_server *srv);
/* After the loop ran out (or when it never ran): free what is left. */
void gd_server_destroy(gd_server *srv);

/* Writes one frame payload of len bytes (msg is the caller's). */
typedef void (*gd_pack_fn)(const void *msg, uint8_t *dst);

/* Queue one frame of len payload bytes written by pack(msg, dst); fd (-1:
 * none) is dup'ed and rides on the frame's first byte. Ownership of nothing
 * is taken. Returns 0, or a negative code when the connection is going or
 * had to be dropped (peer not reading, frame too large, out of memory). */
int gd_conn_send(gd_conn *c, size_t len, gd_pack_fn pack, const void *msg, int fd);
/* The same with n_fds fds (at most GPUBUF_WIRE_MAX_FDS; each dup'ed). bounded:
 * the caller made sure the reply memory had room for it (a batch reply,
 * gd_conn_reply_room()), so it is queued like a small one whatever the
 * budget says now. */
int gd_conn_send_fds(gd_conn *c, size_t len, gd_pack_fn pack, const void *msg, const int *fds,
                     int n_fds, bool bounded);
/* May the frame being handled queue a reply of up to bound bytes (a batch
 * reply, whose items take references that must reach the client)? True
 * when the replies queued for all connections plus bound stay within
 * max_reply_memory and those of the connection's uid plus bound within the
 * uid's share (GD_UID_REPLY_SHARE), each unless nothing is queued there (one
 * reply larger than the budget), or when the connection's replies go
 * nowhere (its peer left).
 * False otherwise: the connection waits (the caller's on_frame returns
 * -EAGAIN) until enough queued replies are written or dropped. */
bool gd_conn_reply_room(gd_conn *c, size_t bound);
/* How many more fds the connection's queued replies may hold before its
 * requests wait (at least 1 while one is being handled). */
unsigned gd_conn_fd_room(const gd_conn *c);
/* How many fds the connection's queued replies hold (dups not yet sent). */
unsigned gd_conn_fds_held(const gd_conn *c);
/* The handshake is done: the handshake deadline gives way to the frame one. */
void gd_conn_ready(gd_conn *c);
/* Schedule the connection's teardown; safe from any callback. */
void gd_conn_close(gd_conn *c);
bool gd_conn_closing(const gd_conn *c);

#endif
