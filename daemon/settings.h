/* The limits gpubufd runs under: plain data, filled from the table of
 * configuration keys (config.c) and read by the server (transport limits)
 * and the sessions (protocol limits). One copy lives in the daemon; SIGHUP
 * replaces it in one assignment. */
#ifndef GPUBUFD_SETTINGS_H
#define GPUBUFD_SETTINGS_H

#include <stdint.h>

#include "gpubuf/gpubuf.h"

typedef struct gd_limits {
    uint32_t max_request;            /* bytes of request payload */
    uint32_t max_clients;            /* connections at once */
    uint32_t max_clients_per_uid;    /* 0: no limit */
    uint32_t frames_per_wakeup;      /* requests handled per readable event */
    uint32_t max_queued_replies;     /* a client that reads none of them is dropped */
    uint32_t handshake_timeout_ms;   /* connected but no hello yet; 0: none */
    uint32_t frame_timeout_ms;       /* half a frame received, the rest missing; 0: none */
    uint32_t max_waiters_per_client; /* pending opens per connection (config key) */
    uint64_t max_reply_memory;       /* queued reply bytes of all connections together */
    uint32_t resume_timeout_ms;      /* restored sessions not resumed by then are dropped */
    uint32_t journal_off;            /* state_journal: 0 on, 1 off (no journal after the start),
                                      * 2 switchable by SIGUSR2 (measurement only) */
    uint32_t poll_us;                /* the loop polls this long for the next request; 0: never */
} gd_limits;

/* poll_us: the default and the most the key takes (docs/operations.md). */
#define GD_POLL_US_DEFAULT 50
#define GD_POLL_US_MAX 1000

/* The fds one connection can make the daemon hold: requests stop being
 * handled while this many queued replies hold an fd (the server's
 * backpressure), and the answers of waiting opens woken later hold at most
 * GD_WAITER_REPLY_FDS more (a woken open whose answer would pass that fails
 * with EAGAIN, its reference given back); plus the connection's socket. */
#define GD_QUEUED_REPLY_FDS 64
#define GD_WAITER_REPLY_FDS 64
#define GD_FDS_PER_CLIENT (1 + GD_QUEUED_REPLY_FDS + GD_WAITER_REPLY_FDS)
/* Waiting opens per connection by default (max_waiters_per_client), and the
 * most the key takes: each costs the daemon about GD_WAITER_BYTES while it
 * waits (the waiter, its name, its timer, its index entries) and one queued
 * answer of at most GD_SMALL_REPLY bytes once woken (docs/security.md). */
#define GD_MAX_WAITERS_PER_CLIENT 16384
#define GD_MAX_WAITERS_LIMIT 1000000
#define GD_WAITER_BYTES 512
/* Batches (docs/protocol.md): items per request, and the slabs (each with
 * its fd on host and cuda-vmm pools) one reply describes at most. A batch
 * reply also carries no more fds than the connection's room below
 * GD_QUEUED_REPLY_FDS (at least 1 while its requests are handled), so the
 * budget above holds; an item whose slab does not fit fails with EAGAIN
 * and is sent again (the library does). */
#define GD_BATCH_MAX_ITEMS 4096
#define GD_BATCH_REPLY_FDS 16

/* Replies larger than this (a status of a large registry; every other reply
 * is a few hundred bytes: one buffer, or an error, and at most
 * GPUBUF_USER_DATA_MAX more for a buffer's user bytes) are refused with EAGAIN
 * instead of being queued when they would push the queued reply bytes of all
 * connections past max_reply_memory (docs/security.md, "Reply memory"). */
#define GD_SMALL_REPLY (4096u + GPUBUF_USER_DATA_MAX)
/* The part of max_reply_memory the queued replies of one uid's connections
 * may fill with large replies and batch replies: half, so that one uid's
 * unread replies never leave the other uids without room (docs/security.md,
 * "Reply memory"). */
#define GD_UID_REPLY_SHARE(max_reply_memory) ((max_reply_memory) / 2)

/* Why the server refuses a connection: the limit it reached, stopping, or
 * out of fds. */
typedef enum gd_refusal {
    GD_REFUSE_MAX_CLIENTS,
    GD_REFUSE_MAX_CLIENTS_PER_UID,
    GD_REFUSE_STOPPING,
    GD_REFUSE_NO_FDS, /* the daemon is out of file descriptors */
    GD_REFUSALS
} gd_refusal;

#endif
