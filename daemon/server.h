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

typedef struct gpubuf_limits {
    uint32_t max_request;      /* bytes of request payload */
    uint32_t max_clients;      /* connections at once */
    uint32_t frames_per_wakeup; /* requests handled per readable event */
    uint32_t max_waiters_per_client;
    uint32_t max_queued_replies; /* a client that reads none of them is dropped */
    uint32_t max_clients_per_uid;
    uint32_t handshake_timeout_ms; /* connected but no hello yet */
    uint32_t frame_timeout_ms;     /* half a frame received, the rest missing */
    gpubuf_quota quota;
} gpubuf_limits;

typedef struct gpubuf_outbuf {
    struct gpubuf_outbuf *next;
    size_t len, off;
    int fd; /* to send with the first byte, -1 when none; owned (dup) */
    uint8_t data[];
} gpubuf_outbuf;

typedef struct gpubuf_server gpubuf_server;

typedef struct gpubuf_session {
    uv_poll_t poll;
    uv_timer_t timer; /* handshake and partial-frame deadlines */
    int fd;
    gpubuf_server *srv;
    gpubuf_holder *holder;
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
    gpubuf_outbuf *out_head, *out_tail;
    int poll_events;     /* events the poll handle watches now (UV_READABLE...) */
    uint32_t out_frames; /* replies queued because the client is not reading */
    size_t out_bytes;
    struct gpubuf_session *next, *prev; /* server list */
    struct gpubuf_session *reap_next;
    struct gpubuf_session *pending_next; /* frames left after the per-wake-up cap */
    bool pending;
} gpubuf_session;

struct gpubuf_server {
    uv_loop_t *loop;
    uv_poll_t listen_poll;
    uv_check_t reaper;
    uv_idle_t kick; /* runs sessions with frames left over */
    gpubuf_session *pending;
    int listen_fd;
    bool listen_owned; /* we created the socket file (unlink on exit) */
    char *socket_path;
    gpubuf_limits limits;
    gpubuf_registry reg;
    gpubuf_pool *pools[GPUBUF_MAX_POOLS];
    int n_pools;
    uint64_t slab_ids;
    gpubuf_session *sessions;
    gpubuf_session *reap;
    uint32_t n_sessions;
    uint64_t started_ns;
    bool stopping;
};

void gpubuf_limits_default(gpubuf_limits *l);

/* Initialise srv on loop (pools are added by the caller before listening). */
void gpubuf_server_init(gpubuf_server *srv, uv_loop_t *loop);
/* Listen on an already bound and listening fd (systemd), or bind path. */
int gpubuf_server_listen_fd(gpubuf_server *srv, int fd);
int gpubuf_server_listen_path(gpubuf_server *srv, const char *path, mode_t mode);
int gpubuf_server_add_pool(gpubuf_server *srv, gpubuf_pool *pool);
gpubuf_pool *gpubuf_server_find_pool(gpubuf_server *srv, const char *name);
/* Close every session and the listener; the loop then runs out. */
void gpubuf_server_stop(gpubuf_server *srv);
/* After the loop ran out: free registry, pools and memory. */
void gpubuf_server_destroy(gpubuf_server *srv);

/* Session side (session.c). */
void gpubuf_session_handle(gpubuf_session *s, const uint8_t *payload, size_t len);
/* Queue a reply; takes ownership of nothing (fd is dup'ed). */
void gpubuf_session_send(gpubuf_session *s, const Gpubuf__Response *resp, int fd);
/* Schedule the session's teardown; safe from any callback. */
void gpubuf_session_kill(gpubuf_session *s);

#endif
