/* Session room: the batches, many items in one request and one reply with a
 * result per item (docs/protocol.md, "Batches"). */
#ifndef GPUBUFD_BATCH_H
#define GPUBUFD_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "reply.h"

void gd_session_batch_open(gd_session *s, uint64_t id, const Gpubuf__BatchOpenRequest *q);
void gd_session_batch_release(gd_session *s, uint64_t id, const Gpubuf__BatchReleaseRequest *q);
void gd_session_batch_alloc(gd_session *s, uint64_t id, const Gpubuf__BatchAllocRequest *q);
void gd_session_batch_state(gd_session *s, uint64_t id, const Gpubuf__BatchStateRequest *q);
/* The items of a batch request (0 for any other request). */
size_t gd_session_batch_items(const Gpubuf__Request *req);
/* The largest reply a batch of n items can get (about 2.5 MiB for
 * GD_BATCH_MAX_ITEMS items; about 22 MiB with each item's metadata). */
size_t gd_session_batch_reply_bound(size_t n, bool with_meta);
/* An open batch whose reply carries each item's metadata. */
bool gd_session_batch_with_meta(const Gpubuf__Request *req);

#endif
