/* Server and session rooms of gpubufd.
 *
 * server: the libuv loop, the listening socket, reading bytes into frames and
 *         writing reply frames (with their fds) back. Knows nothing of GPUs.
 * session: one per connection: peer credentials, the registry holder with its
 *         references, request decoding and dispatch into the registry. */
#ifndef GPUBUFD_SERVER_H
#define GPUBUFD_SERVER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "gpubuf.pb-c.h"
#include "registry.h"

#define GPUBUF_MAX_POOLS 64

typedef struct gd_limits {
    uint32_t max_request;      /* bytes of request payload */
    uint32_t max_clients;      /* connections at once */
    uint32_t frames_per_wakeup; /* requests handled per readable event */
    uint32_t max_waiters_per_client;
    uint32_t max_queued_replies; /* a client that reads none of them is dropped */
    uint32_t max_clients_per_uid;
    uint32_t handshake_timeout_ms; /* connected but no hello yet */
    uint32_t frame_timeout_ms;     /* half a frame received, the rest missing */
    gd_quota quota;
} gd_limits;

typedef struct gd_outbuf {
    struct gd_outbuf *next;
    size_t len, off;
    int fd; /* to send with the first byte, -1 when none; owned (dup) */
    uint8_t data[];
} gd_outbuf;

typedef struct gd_server gd_server;

typedef struct gd_session {
    uv_poll_t poll;
    uv_timer_t timer; /* handshake and partial-frame deadlines */
    int fd;
    gd_server *srv;
    gd_holder *holder;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    char name[64];
    bool hello_done;
    uint64_t caps;       /* capability bits granted at hello (GPUBUF_CAP_*) */
    bool closing;
    bool corked; /* replies wait for the end of the current batch of requests */
    bool peer_gone; /* the client closed or broke the connection: no more replies */
    bool reaping;   /* the final drain of what it sent before going is running */
    uint32_t n_waiters;
    uint8_t *in;
    size_t in_len, in_cap;
    gd_outbuf *out_head, *out_tail;
    int poll_events;     /* events the poll handle watches now (UV_READABLE...) */
    uint32_t out_frames; /* replies queued because the client is not reading */
    size_t out_bytes;
    struct gd_session *next, *prev; /* server list */
    struct gd_session *reap_next;
    struct gd_session *pending_next; /* frames left after the per-wake-up cap */
    bool pending;
} gd_session;

struct gd_server {
    uv_loop_t *loop;
    uv_poll_t listen_poll;
    uv_check_t reaper;
    uv_idle_t kick; /* runs sessions with frames left over */
    gd_session *pending;
    int listen_fd;
    bool listen_owned; /* we created the socket file (unlink on exit) */
    char *socket_path;
    gd_limits limits;
    gd_registry reg;
    gd_pool *pools[GPUBUF_MAX_POOLS];
    int n_pools;
    uint64_t slab_ids;
    gd_session *sessions;
    gd_session *reap;
    uint32_t n_sessions;
    uint64_t started_ns;
    bool stopping;
};

void gd_limits_default(gd_limits *l);

/* Initialise srv on loop (pools are added by the caller before listening). */
void gd_server_init(gd_server *srv, uv_loop_t *loop);
/* Listen on an already bound and listening fd (systemd), or bind path. */
int gd_server_listen_fd(gd_server *srv, int fd);
int gd_server_listen_path(gd_server *srv, const char *path, mode_t mode);
int gd_server_add_pool(gd_server *srv, gd_pool *pool);
gd_pool *gd_server_find_pool(gd_server *srv, const char *name);
/* Close every session and the listener; the loop then runs out. */
void gd_server_stop(gd_server *srv);
/* After the loop ran out: free registry, pools and memory. */
void gd_server_destroy(gd_server *srv);

/* Session side (session.c). */
void gd_session_handle(gd_session *s, const uint8_t *payload, size_t len);
/* Queue a reply; takes ownership of nothing (fd is dup'ed). */
void gd_session_send(gd_session *s, const Gpubuf__Response *resp, int fd);
/* Schedule the session's teardown; safe from any callback. */
void gd_session_kill(gd_session *s);

#endif
