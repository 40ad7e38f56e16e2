#include "wire.h"

#include <protobuf-c/protobuf-c.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "gpubuf/gpubuf.h"

static void put_le32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void gpubuf_wire_header_encode(uint8_t out[GPUBUF_WIRE_HEADER_SIZE], uint32_t length) {
    put_le32(out, GPUBUF_WIRE_MAGIC);
    out[4] = (uint8_t)GPUBUF_WIRE_VERSION;
    out[5] = 0;
    out[6] = 0;
    out[7] = 0;
    put_le32(out + 8, length);
}

int gpubuf_wire_header_decode(const uint8_t in[GPUBUF_WIRE_HEADER_SIZE], uint32_t max_length,
                              gpubuf_frame_header *ret) {
    gpubuf_frame_header h;
    h.magic = get_le32(in);
    h.version = (uint16_t)(in[4] | in[5] << 8);
    h.flags = (uint16_t)(in[6] | in[7] << 8);
    h.length = get_le32(in + 8);
    if (h.magic != GPUBUF_WIRE_MAGIC)
        return GPUBUF_EPROTOCOL;
    if (h.version != GPUBUF_WIRE_VERSION)
        return GPUBUF_EVERSION;
    if (h.flags != 0)
        return GPUBUF_EPROTOCOL;
    if (h.length > max_length)
        return -EMSGSIZE;
    *ret = h;
    return 0;
}

ssize_t gpubuf_wire_send_some(int sock, const void *buf, size_t len, int fd) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return gpubuf_wire_sendv(sock, &iov, 1, fd);
}

ssize_t gpubuf_wire_sendv(int sock, const struct iovec *iov, int n_iov, int fd) {
    return gpubuf_wire_sendv_fds(sock, iov, n_iov, &fd, fd >= 0 ? 1 : 0);
}

ssize_t gpubuf_wire_sendv_fds(int sock, const struct iovec *iov, int n_iov, const int *fds,
                              int n_fds) {
    union {
        char buf[CMSG_SPACE(sizeof(int) * GPUBUF_WIRE_MAX_FDS)];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n_iov};
    if (n_fds < 0 || n_fds > (int)GPUBUF_WIRE_MAX_FDS)
        return -EINVAL;
    if (n_fds > 0) {
        memset(&u, 0, sizeof(u));
        msg.msg_control = u.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n_fds);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n_fds);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n_fds);
    }
    for (;;) {
        ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
        if (n >= 0)
            return n;
        if (errno != EINTR)
            return -errno;
    }
}

int gpubuf_wire_send_all(int sock, const void *buf, size_t len, int fd) {
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = gpubuf_wire_send_some(sock, p, len, fd);
        if (n < 0)
            return (int)n;
        fd = -1; /* the fd went with the first byte */
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

ssize_t gpubuf_wire_recv(int sock, void *buf, size_t len, int flags, int *fds, int max_fds,
                         int *n_fds, bool *truncated) {
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    union {
        char buf[CMSG_SPACE(sizeof(int) * GPUBUF_WIRE_MAX_FDS)];
        struct cmsghdr align;
    } u;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = u.buf,
                         .msg_controllen = sizeof(u.buf)};
    ssize_t n;
    *n_fds = 0;
    *truncated = false;
    do {
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    if (msg.msg_flags & MSG_CTRUNC)
        *truncated = true;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*n_fds < max_fds) {
                fds[(*n_fds)++] = fd;
            } else {
                close(fd);
                *truncated = true;
            }
        }
    }
    return n;
}

/* Read exactly len bytes; the fds that come with them go into fds (at most
 * max_fds, the others are closed) and are counted in *n_fds, all of them. */
static int read_exact(int sock, uint8_t *buf, size_t len, int *fds, int max_fds, int *n_fds) {
    size_t got = 0;
    while (got < len) {
        int in[GPUBUF_WIRE_MAX_FDS];
        int n_in;
        bool trunc;
        ssize_t n = gpubuf_wire_recv(sock, buf + got, len - got, 0, in, GPUBUF_WIRE_MAX_FDS, &n_in,
                                     &trunc);
        for (int i = 0; i < n_in; i++, (*n_fds)++) {
            if (*n_fds < max_fds)
                fds[*n_fds] = in[i];
            else
                close(in[i]);
        }
        if (trunc)
            (*n_fds)++; /* more than the control room: counted, so that it shows */
        if (n < 0)
            return (int)n;
        if (n == 0)
            return GPUBUF_EDISCONNECTED;
        got += (size_t)n;
    }
    return 0;
}

ssize_t gpubuf_wire_read_frame_fds(int sock, uint32_t max_length, uint8_t **payload, int *fds,
                                   int max_fds, int *n_fds) {
    uint8_t hdr[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_frame_header h;
    uint8_t *p = NULL;
    int r;
    *n_fds = 0;
    r = read_exact(sock, hdr, sizeof(hdr), fds, max_fds, n_fds);
    if (r < 0)
        goto fail;
    r = gpubuf_wire_header_decode(hdr, max_length, &h);
    if (r < 0)
        goto fail;
    p = malloc(h.length ? h.length : 1);
    if (!p) {
        r = -ENOMEM;
        goto fail;
    }
    r = read_exact(sock, p, h.length, fds, max_fds, n_fds);
    if (r < 0)
        goto fail;
    *payload = p;
    return (ssize_t)h.length;
fail:
    free(p);
    for (int i = 0; i < *n_fds && i < max_fds; i++)
        close(fds[i]);
    *n_fds = 0;
    return r;
}

ssize_t gpubuf_wire_read_frame(int sock, uint32_t max_length, uint8_t **payload, int *fd) {
    int n = 0;
    ssize_t r = gpubuf_wire_read_frame_fds(sock, max_length, payload, fd, 1, &n);
    if (r < 0 || n == 0)
        *fd = -1;
    return r;
}

static bool wire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
    uint64_t r = 0;
    for (unsigned shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        r |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = r;
            return true;
        }
    }
    return false;
}

static const char *nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                              const uint8_t *end, int depth) {
    while (p < end) {
        uint64_t key, n = 0;
        if (!wire_varint(&p, end, &key))
            return NULL;
        switch (key & 7) {
        case 0:
            if (!wire_varint(&p, end, &n))
                return NULL;
            continue;
        case 1: n = 8; break;
        case 5: n = 4; break;
        case 2:
            if (!wire_varint(&p, end, &n))
                return NULL;
            break;
        default: return NULL; /* groups: not in gpubuf.proto */
        }
        if (n > (uint64_t)(end - p))
            return NULL;
        const ProtobufCFieldDescriptor *f =
            (key & 7) == 2 && key >> 3 <= UINT32_MAX
                ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                : NULL;
        if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)n))
            return f->name;
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < 16) {
            const char *r = nul_string(f->descriptor, p, p + n, depth + 1);
            if (r)
                return r;
        }
        p += n;
    }
    return NULL;
}

const char *gpubuf_wire_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *buf,
                                   size_t len) {
    return nul_string(d, buf, buf + len, 0);
}
