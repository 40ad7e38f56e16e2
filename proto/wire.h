/* Frame layer shared by gpubufd and libgpubuf-client.
 *
 * A frame is a fixed 12-byte little-endian header followed by a packed
 * protobuf message (gpubuf.proto). File descriptors ride on the frame that
 * names them as SCM_RIGHTS ancillary data on the first byte of the header.
 */
#ifndef GPUBUF_WIRE_H
#define GPUBUF_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define GPUBUF_WIRE_MAGIC 0x46425047u /* "GPBF" little-endian */
#define GPUBUF_WIRE_HEADER_SIZE 12u
#define GPUBUF_WIRE_VERSION 1u
/* Default request limit; the daemon accepts a configured limit up to the hard one. */
#define GPUBUF_WIRE_MAX_REQUEST (64u * 1024u)
#define GPUBUF_WIRE_MAX_REQUEST_HARD (16u * 1024u * 1024u)
#define GPUBUF_WIRE_MAX_RESPONSE (256u * 1024u * 1024u)
/* Most fds one frame carries: one for a single reply, up to this many for
 * a batch reply (one per slab it describes; the daemon's
 * GD_BATCH_REPLY_FDS). */
#define GPUBUF_WIRE_MAX_FDS 16

/* Hello.capabilities bits. KEEP_MAPPED: the client may keep a slab mapped
 * after its last view goes (ReleaseRequest.keep_mapped) and says when it
 * unmaps it (UnmapRequest); the daemon does not free such a slab meanwhile. */
#define GPUBUF_CAP_KEEP_MAPPED 1u
/* SLAB_ONCE: a single alloc or open reply carries the slab's fd or IPC
 * handle only when the connection does not map the slab in that mode
 * already (it holds no other reference of that mode in it and keeps it not
 * mapped); the client maps a slab while it holds a reference in it and
 * unmaps it before sending the release of the last one (docs/protocol.md,
 * "Slabs sent once"). */
#define GPUBUF_CAP_SLAB_ONCE 2u

typedef struct gpubuf_frame_header {
    uint32_t magic;
    uint16_t version;
    uint16_t flags;
    uint32_t length;
} gpubuf_frame_header;

/* The name of the first string field, at any depth of the packed message
 * buf of type d, whose bytes contain a NUL, or NULL when none does.
 * protobuf-c hands strings out NUL-terminated, so such a string would be
 * cut short silently: "a\0b" would read as "a". Call it on a message that
 * unpacked. */
struct ProtobufCMessageDescriptor;
const char *gpubuf_wire_nul_string(const struct ProtobufCMessageDescriptor *d,
                                   const uint8_t *buf, size_t len);

void gpubuf_wire_header_encode(uint8_t out[GPUBUF_WIRE_HEADER_SIZE], uint32_t length);

/* Decode and validate a header: magic, version and length <= max_length.
 * Returns 0, or GPUBUF_EPROTOCOL (magic), GPUBUF_EVERSION (version) or
 * -EMSGSIZE (length above max_length). */
int gpubuf_wire_header_decode(const uint8_t in[GPUBUF_WIRE_HEADER_SIZE], uint32_t max_length,
                              gpubuf_frame_header *ret);

/* Send all of buf (header + payload) with fd (or -1) attached to the first
 * byte. Blocking fd: loops until everything is sent. Returns 0 or -errno. */
int gpubuf_wire_send_all(int sock, const void *buf, size_t len, int fd);

/* One sendmsg() call on a non-blocking socket; fd (or -1) is attached.
 * Returns bytes sent (>= 0) or -errno (-EAGAIN included). */
ssize_t gpubuf_wire_send_some(int sock, const void *buf, size_t len, int fd);

/* One sendmsg() of several buffers; fd (or -1) rides on the first byte.
 * Returns bytes sent or -errno. */
struct iovec;
ssize_t gpubuf_wire_sendv(int sock, const struct iovec *iov, int n_iov, int fd);
/* The same with n_fds fds (at most GPUBUF_WIRE_MAX_FDS) on the first byte. */
ssize_t gpubuf_wire_sendv_fds(int sock, const struct iovec *iov, int n_iov, const int *fds,
                              int n_fds);

/* One recvmsg() with flags (MSG_DONTWAIT or 0) besides MSG_CMSG_CLOEXEC.
 * Received fds are stored in fds (up to max_fds) and counted in *n_fds;
 * surplus fds are closed and *truncated set. Returns bytes read (0 at end of
 * stream) or -errno (-EAGAIN: nothing to read with MSG_DONTWAIT). */
ssize_t gpubuf_wire_recv(int sock, void *buf, size_t len, int flags, int *fds, int max_fds,
                         int *n_fds, bool *truncated);

/* Blocking helper: read one whole frame. *payload is malloc'ed (free it).
 * Collects at most one fd into *fd (-1 when none). Returns payload length
 * or a negative error (GPUBUF_EDISCONNECTED at end of stream). */
ssize_t gpubuf_wire_read_frame(int sock, uint32_t max_length, uint8_t **payload, int *fd);
/* The same, collecting the fds that came with the frame into fds (at most
 * max_fds; the others are closed). *n_fds counts every fd that came, so
 * that a caller sees a frame that carried more than it allows (it closes
 * the first min(*n_fds, max_fds) itself). On error none is left open and
 * *n_fds is 0. */
ssize_t gpubuf_wire_read_frame_fds(int sock, uint32_t max_length, uint8_t **payload, int *fds,
                                   int max_fds, int *n_fds);

#endif
