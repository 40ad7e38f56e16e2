/* State room: the saved state read back and restored at start
 * (state_restore.c). */
#ifndef GPUBUFD_STATE_RESTORE_H
#define GPUBUFD_STATE_RESTORE_H

#include <stddef.h>
#include <stdint.h>

#include "saved_state.h"

/* The generation of a slot's header, 0 when it has none valid. */
uint64_t gd_state_slot_gen(int fd);
/* The fd named name among kept (not taken yet), or NULL. */
gd_kept_fd *gd_state_kept_find(gd_kept_fd *kept, size_t n, const char *name);
/* Replay the saved state in the slot fd and restore the registry and the
 * pools from it, with the slab fds in kept. */
void gd_state_restore(gd_state *st, int fd, gd_kept_fd *kept, size_t n);

#endif
