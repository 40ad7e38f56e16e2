/* State room: what survives a restart of gpubufd. The slabs of host and
 * cuda-vmm pools live as long as some process holds an fd of them; the
 * daemon keeps those fds where they outlive it (systemd's fd store, or a
 * successor started with --takeover) together with its saved state: two
 * memfds ("state-0", "state-1") holding a snapshot of the registry followed
 * by a journal of every change since, appended before the change is
 * answered (proto/gpubuf_state.proto). A SIGKILL therefore loses nothing a
 * client was told. At start the state is read back, checked record by
 * record against the slabs and the pools, and the registry rebuilt;
 * sessions come back detached until their clients resume them. */
#ifndef GPUBUFD_STATE_H
#define GPUBUFD_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "context.h"
#include "saved_state.h" /* gd_kept_fd, gd_state */

/* Start saving the state of ctx (its pools exist, no client yet): restore
 * what kept (n fds, may be 0) holds first, taking the fds named state-* and
 * slab-* (the others are left to the caller), and log what was restored
 * and what dropped. With fdstore, every kept fd is also handed to the
 * service manager (sd_notify FDSTORE=1) and the fds of slabs that go are
 * removed from it. On success ctx->state is set. */
int gd_state_open(gd_context *ctx, gd_kept_fd *kept, size_t n, bool fdstore, gd_err *err);
/* Stop saving: what the daemon does from now on (closing the sessions,
 * freeing the registry as it stops) is not a change of the kept state. */
void gd_state_freeze(gd_state *st);
/* A takeover was given up after the fds went to the successor: write a
 * fresh snapshot of the running daemon above whatever the successor wrote
 * into the shared state memfds, so that the next start restores ours.
 * 0 or -errno (logged). */
int gd_state_rewrite(gd_state *st);
/* Free st (after gd_state_freeze); its fds are closed. NULL is fine. */
void gd_state_free(gd_state *st);
/* The fds to hand to a successor: the state memfds and every slab's that
 * has one (a cuda-ipc slab has none: its buffers end with this daemon, as
 * at a restart), with their names. *ret is allocated (free it); the fds stay st's. */
size_t gd_state_fds(gd_state *st, gd_kept_fd **ret);
/* Hand fd to the service manager under name (no-op without fdstore). */
void gd_state_store_fd(gd_state *st, const char *name, int fd);
/* Drop the detached sessions older than the resume timeout now (also run
 * from a timer): they leave the registry and the saved state at once, their
 * references go through gd_registry_reap() (ctx->want_work), a bounded
 * number per turn of the loop. Returns how many went. */
uint32_t gd_state_expire(gd_state *st);
/* The saved state's framing of version 1, for tests and the fuzz target
 * that write states as a previous daemon did: gd_state_header() fills the
 * 32-byte header of a slot of generation gen; gd_state_frame() writes one record
 * (n bytes of a packed StateRecord, n <= 1 MiB) with its length and
 * checksum to out (n + 8 bytes) and returns n + 8. The header's size is
 * GD_STATE_HEADER (saved_state.h). */
void gd_state_header(uint8_t *out, uint64_t gen);
size_t gd_state_frame(uint8_t *out, const uint8_t *rec, uint32_t n);
/* The changes between gd_state_begin() and its gd_state_end() (one request:
 * daemon.c around each frame) go into the journal as one group, replayed
 * whole or not at all, written at gd_state_end(): before the reply that
 * tells of them leaves (server.c holds the other connections' replies
 * meanwhile). Nested calls count; outside of them a change is written at
 * once. NULL is fine. */
void gd_state_begin(gd_state *st);
void gd_state_end(gd_state *st);
/* The writers of a version 2 state (tests, fuzz): gd_state_header_v2()
 * fills the header of generation gen, gd_state_frame_v2() frames n bytes
 * (a packed StateRecord, or a group: state_record.h) of that generation.
 * Versions 3 and 4 frame the same way; version 4's header is what gpubufd
 * writes. */
void gd_state_header_v2(uint8_t *out, uint64_t gen);
size_t gd_state_frame_v2(uint8_t *out, uint64_t gen, const uint8_t *rec, uint32_t n);
/* state_journal = switchable (measurement only): turn the journal off
 * (what is staged is written first; 0) or on again (after a whole snapshot
 * of the registry; 1). -EPERM when the key is not switchable, -ESRCH
 * without a journal to switch (frozen), -EIO when the snapshot could not be
 * written (the journal stays off; the write error is logged). */
int gd_state_switch(gd_state *st);
/* What the journal did since start (state_journal = switchable: the log of
 * each SIGUSR2 that turns it off gives the difference over the time it was
 * on, for the benchmark's journal pairs, bench/pairs.c). With a switchable
 * journal, groups of GD_STATE_BIG_GROUP bytes or more (a batch's) are each
 * timed (otherwise not counted), from their
 * framing to their copy into the slot (and into a snapshot under way) and
 * the next group's opening; smaller ones are not (the entries themselves
 * are appended during the request's registry work, untimed). */
#define GD_STATE_BIG_GROUP 4096u
typedef struct gd_state_stats {
    uint64_t groups, bytes;                /* groups written, their bytes */
    uint64_t big_groups, big_bytes, big_ns; /* of those, the big ones and their time */
    uint64_t snapshots, snapshot_ns;       /* snapshots, whole or a step per turn */
} gd_state_stats;
void gd_state_stats_get(const gd_state *st, gd_state_stats *out);
/* Bytes of the active state memfd, and the records written since start
 * (status, benchmarks). */
uint64_t gd_state_bytes(const gd_state *st);

#endif
