/* Takeover room: gpubufd hands its listening socket, slabs and saved state
 * to a successor started with --takeover, in two phases, so that a
 * successor that cannot start loses nothing.
 *
 * 1. Hand over. The successor does what can fail first (configuration, fd
 *    limit, pools), takes the lock SOCKET.takeover.lock (one successor at
 *    a time), asks the running daemon (TakeoverRequest) and receives every
 *    fd over its own socket SOCKET.takeover.PID in HandoverFds frames. The
 *    running daemon keeps its own copy of each fd and, meanwhile, runs
 *    nothing else: no client is served, no change happens to the state.
 * 2. Commit. The successor restores, listens on the passed socket and says
 *    ready (HandoverStatus 0); the running daemon answers 0 and stops, and
 *    the successor serves. A successor that fails says why (or dies, or
 *    says nothing within GD_TAKEOVER_READY_MS, and is then killed): the
 *    running daemon writes its state anew above anything the successor
 *    wrote and serves on, its clients and listening socket as they were.
 */
#ifndef GPUBUFD_TAKEOVER_H
#define GPUBUFD_TAKEOVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "daemon.h"
#include "error.h"
#include "state.h"

#define GD_TAKEOVER_BATCH 16           /* fds per HandoverFds frame (GPUBUF_WIRE_MAX_FDS) */
#define GD_TAKEOVER_MAX_FDS 65536      /* fds a successor takes, at most */
#define GD_TAKEOVER_IO_MS 30000        /* each step of the hand over */
#define GD_TAKEOVER_READY_MS 60000     /* from the last fd sent to the successor's ready */
#define GD_TAKEOVER_MAX_FRAME 65536u   /* a handover frame's payload, at most */

/* ---- the running daemon's side ---------------------------------------- */

/* Let d be taken over (sets d->ctx.takeover). on_commit runs once a
 * successor serves: stop, leaving the socket file to the successor. */
void gd_takeover_serve(gd_daemon *d, void (*on_commit)(gd_daemon *d));

/* Read the successor's HandoverStatus from sock (blocking; the socket's
 * receive timeout bounds it): its status (0: ready) with the reason in
 * why, or a negative error of the frame itself (-EAGAIN: timed out,
 * GPUBUF_EDISCONNECTED: gone, GPUBUF_EPROTOCOL: not a HandoverStatus).
 * *ret_status is set only when 0 is returned. */
int gd_takeover_read_status(int sock, int *ret_status, char *why, size_t n_why);

/* ---- the successor's side --------------------------------------------- */

/* What a successor received so far (phase 1). */
typedef struct gd_handover_rx {
    gd_kept_fd *fds;
    size_t n, cap;
    bool done;
} gd_handover_rx;

/* One HandoverFds frame (payload, len) that came with n_fds fds: its fds
 * go into rx with their names. Returns 1 after the last frame, 0 when more
 * are to come, GPUBUF_EPROTOCOL for a frame that does not check out (names
 * and fds differ in number, a bad name, too many fds, a total that is not
 * what came); the frame's fds are closed then. -ENOMEM likewise. */
int gd_handover_rx_frame(gd_handover_rx *rx, const uint8_t *payload, size_t len, const int *fds,
                         int n_fds);
/* Close what rx holds (fds not taken: -1) and free it. */
void gd_handover_rx_free(gd_handover_rx *rx);

typedef struct gd_takeover {
    int lock_fd; /* SOCKET.takeover.lock, locked; -1 */
    int conn;    /* the hand over connection; -1 */
    pid_t from;  /* the running daemon */
    gd_handover_rx rx;
} gd_takeover;

void gd_takeover_init(gd_takeover *t);
/* Take SOCKET.takeover.lock: -EBUSY, with the holder in err, when another
 * successor holds it. */
int gd_takeover_lock(gd_takeover *t, const char *socket_path, gd_err *err);
/* Phase 1: ask the gpubufd on socket_path and receive its fds into t->rx. */
int gd_takeover_receive(gd_takeover *t, const char *socket_path, gd_err *err);
/* Phase 2: tell the running daemon this one is ready and wait for it to
 * let go (as long as its connection stays open). 0: serve now. */
int gd_takeover_ready(gd_takeover *t, gd_err *err);
/* Give up after phase 1 (the state is frozen already): tell the running
 * daemon why; it serves on. */
void gd_takeover_abort(gd_takeover *t, int err, const char *why);
/* Close the connection and release the lock. */
void gd_takeover_end(gd_takeover *t);

/* Test hook: with GPUBUFD_TEST_TAKEOVER=PHASE (or PHASE:stop) in the
 * environment, a successor kills itself with SIGKILL (or stops with
 * SIGSTOP) at PHASE: locked, asked, received, restored or ready. */
void gd_takeover_test_hook(const char *phase);

#endif
