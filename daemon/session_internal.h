/* Session room, private: what session.c shares with the files that answer
 * the status request (status.c) and the batches (batch.c). Nothing outside
 * the session room includes it. */
#ifndef GPUBUFD_SESSION_INTERNAL_H
#define GPUBUFD_SESSION_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpubuf.pb-c.h"
#include "session.h"

/* Storage for one Buffer message and its Slab. */
typedef struct buffer_msg {
    Gpubuf__Buffer buf;
    Gpubuf__Slab slab;
    Gpubuf__ArrayLayout layout;
} buffer_msg;

/* Replies (session.c). */
void gd_session_pack(const void *msg, uint8_t *dst);
void gd_session_send(gd_session *s, const Gpubuf__Response *resp, int fd);
void gd_session_reply_error(gd_session *s, uint64_t id, int status, const char *msg);
void gd_session_fill_slab(Gpubuf__Slab *m, const gd_buf *b);
void gd_session_fill_buffer(buffer_msg *m, const gd_buf *b);
bool gd_session_slab_keepable(const gd_session *s, const gd_buf *b, bool ro);

/* The single requests' steps that the batches take too (session.c). */
int gd_session_target(gd_session *s, bool by_name, const char *name, uint64_t bid,
                      const char *pool, bool has_owner, uint32_t owner_uid, gd_target *t,
                      gd_err *err);
void gd_session_open_undo(gd_session *s, const gd_buf *b, bool read_only);
int gd_session_release_one(gd_session *s, uint64_t bid, bool keep, bool read_only, gd_err *err);
int gd_session_alloc_one(gd_session *s, gd_pool *pool, uint64_t size, uint32_t alignment,
                         const char *name, const gd_meta_args *meta, gd_buf **ret, gd_err *err);

/* The status request (status.c). */
void gd_session_status(gd_session *s, uint64_t id, const Gpubuf__StatusRequest *q);

/* The batches (batch.c). */
void gd_session_batch_open(gd_session *s, uint64_t id, const Gpubuf__BatchOpenRequest *q);
void gd_session_batch_release(gd_session *s, uint64_t id, const Gpubuf__BatchReleaseRequest *q);
void gd_session_batch_alloc(gd_session *s, uint64_t id, const Gpubuf__BatchAllocRequest *q);
void gd_session_batch_state(gd_session *s, uint64_t id, const Gpubuf__BatchStateRequest *q);
/* The items of a batch request (0 for any other request). */
size_t gd_session_batch_items(const Gpubuf__Request *req);

#endif
