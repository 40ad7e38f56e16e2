/* Session room: one item of a request, the steps that a single request and
 * each item of a batch take alike: what it targets, an alloc, a release,
 * and an open's reference given back when its reply cannot be made. */
#ifndef GPUBUFD_ITEM_H
#define GPUBUFD_ITEM_H

#include <stdbool.h>
#include <stdint.h>

#include "reply.h"

/* The target of an open, stat or delete: a name or id, the pool the
 * request names (empty: none) and the owner it expects. 0, or an error
 * (GPUBUF_ENOPOOL) with its sentence in err. */
int gd_session_target(gd_session *s, bool by_name, const char *name, uint64_t bid,
                      const char *pool, bool has_owner, uint32_t owner_uid, gd_target *t,
                      gd_err *err);
/* Give back the reference an open took (read-only if read_only). */
void gd_session_open_undo(gd_session *s, const gd_buf *b, bool read_only);
/* Release one reference (release and batch release). */
int gd_session_release_one(gd_session *s, uint64_t bid, bool keep, bool read_only, gd_err *err);
/* Allocate one buffer from pool (alloc and batch alloc). */
int gd_session_alloc_one(gd_session *s, gd_pool *pool, uint64_t size, uint32_t alignment,
                         const char *name, const gd_meta_args *meta, gd_buf **ret, gd_err *err);

#endif
