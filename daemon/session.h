/* Session room: one per connection. It speaks the protocol (decode,
 * dispatch, encode), keeps the peer's credentials and its registry holder
 * (the references the client holds), and works on the daemon context handed
 * to it. It moves no bytes itself: frames come in through gd_session_frame()
 * and replies leave through the transport it was given, so the session runs
 * as well over a socket (the server) as over an in-memory connection
 * (tests/test_session.c). */
#ifndef GPUBUFD_SESSION_H
#define GPUBUFD_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "arena.h"
#include "batch.h"
#include "context.h"
#include "reply.h"

/* A new session for a peer with these credentials: NULL when out of memory. */
gd_session *gd_session_new(gd_context *ctx, const gd_transport *io, void *conn, pid_t pid,
                           uid_t uid, gid_t gid);
/* Handle one request frame's payload. Returns 0, or -EAGAIN when it was
 * left unhandled because the transport has no room for its reply yet (a
 * batch: see gd_transport.reply_room); hand the same frame again later. */
int gd_session_frame(gd_session *s, const uint8_t *payload, size_t len);
/* The same for a frame the transport read at read_ns after a wake-up at
 * woke_ns (GPUBUF_TRACE_TIMING; 0: now): the trace's first two steps. */
int gd_session_frame_at(gd_session *s, const uint8_t *payload, size_t len, uint64_t woke_ns,
                        uint64_t read_ns);
/* The transport got a bad frame header (err): say why before it closes. */
void gd_session_bad_frame(gd_session *s, int err);
/* The daemon stops: tell the client and disconnect. */
void gd_session_shutdown(gd_session *s);
/* The common requests decoded without protobuf-c (request_fast.c): the
 * Request protobuf-c's unpack would build, in arena a; NULL (nothing taken)
 * for any other request, which protobuf-c then decodes. */
Gpubuf__Request *gd_request_fast(gpubuf_arena *a, const uint8_t *data, size_t len);
/* The connection is gone: cancel the waits, drop every reference, free s. */
void gd_session_free(gd_session *s);
/* A connection refused before it got a session (why; its uid, the limit it
 * reached): write the payload of the frame that tells the client why into
 * payload (at most cap bytes); its length, or 0 when it does not fit.
 * Counts the refusal. */
size_t gd_session_refusal(gd_context *ctx, gd_refusal why, uid_t uid, uint32_t limit,
                          uint8_t *payload, size_t cap);

#endif
