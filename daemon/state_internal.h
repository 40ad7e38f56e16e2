/* State room, inside: what state.c (the journal, the hooks, the fd store)
 * and state_write.c (the slots, groups and snapshots) share. Only the state
 * room includes it. */
#ifndef GPUBUFD_STATE_INTERNAL_H
#define GPUBUFD_STATE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "saved_state.h"
#include "state.h"

/* A slot's mapping dropped (remapped at its next write). */
void gd_slot_unmap(slot *s);
/* Copy len bytes to the slot at off and 8 zero bytes after them (the end
 * of the frames); false when it cannot (errno set). */
bool gd_slot_put(slot *s, uint64_t off, const uint8_t *p, size_t len);
/* Log, once, that the saved state is behind. */
void gd_state_write_failed(gd_state *st, const char *what);
/* Start a group in o (room for its frame header and its first byte), and
 * frame o->p[start..o->len) as a group of generation gen in place. */
size_t gd_group_open(gd_obuf *o);
void gd_group_frame(gd_obuf *o, size_t start, uint64_t gen);
/* Slab and session records as entries of a group. */
void gd_se_slab(gd_obuf *o, const gd_slab *s);
void gd_se_session(gd_obuf *o, const gd_holder *h);
/* A whole snapshot into the inactive slot at once, which becomes the
 * active one. 0 or -errno (logged). */
int gd_state_compact(gd_state *st);
/* Snapshots a step per turn of the loop: init/close the loop handle;
 * start one (a whole one at once without a loop); give it up (the active
 * slot stays the saved state); and a journal group (framed from 0 in
 * group) copied into it as well, while one is under way. */
void gd_state_snap_init(gd_state *st, uv_loop_t *loop);
void gd_state_snap_close(gd_state *st);
void gd_state_snap_start(gd_state *st);
void gd_state_snap_abort(gd_state *st);
void gd_state_snap_journal(gd_state *st, gd_obuf *group);
/* Buffer id left the registry (the buf_gone hook): the walk steps past it. */
void gd_state_snap_gone(gd_state *st, uint64_t id);

#endif
