#include "rawproto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

void rp_hello_init(rp_hello *h, uint64_t caps, const char *client_name) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__Hello hello = GPUBUF__HELLO__INIT;
    h->req = req;
    h->hello = hello;
    h->hello.min_version = h->hello.max_version = 1;
    h->hello.capabilities = caps;
    if (client_name)
        h->hello.client_name = (char *)client_name;
    h->req.id = 1;
    h->req.body_case = GPUBUF__REQUEST__BODY_HELLO;
    h->req.hello = &h->hello;
}

Gpubuf__Request rp_request(uint64_t id, Gpubuf__Request__BodyCase body, void *msg) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    req.id = id;
    req.body_case = body;
    /* Every member of the body union is a pointer to a message: store msg
     * in whichever body names. */
    memcpy(&req.hello, &msg, sizeof(msg));
    return req;
}

size_t rp_frame_size(const Gpubuf__Request *req) {
    return GPUBUF_WIRE_HEADER_SIZE + gpubuf__request__get_packed_size(req);
}

size_t rp_frame(uint8_t *out, const Gpubuf__Request *req) {
    size_t n = gpubuf__request__pack(req, out + GPUBUF_WIRE_HEADER_SIZE);
    gpubuf_wire_header_encode(out, (uint32_t)n);
    return GPUBUF_WIRE_HEADER_SIZE + n;
}

int rp_append(uint8_t **buf, size_t *len, size_t *cap, const Gpubuf__Request *req) {
    size_t n = rp_frame_size(req);
    if (*len + n > *cap) {
        size_t want = (*cap ? *cap * 2 : 1 << 20) + n;
        uint8_t *p = realloc(*buf, want);
        if (!p)
            return -ENOMEM;
        *buf = p;
        *cap = want;
    }
    *len += rp_frame(*buf + *len, req);
    return 0;
}

int rp_send(int sock, const Gpubuf__Request *req, int fd) {
    uint8_t *buf = malloc(rp_frame_size(req));
    if (!buf)
        return -ENOMEM;
    int r = gpubuf_wire_send_all(sock, buf, rp_frame(buf, req), fd);
    free(buf);
    return r;
}

Gpubuf__Response *rp_recv(int sock, int *ret_fd) {
    uint8_t *p;
    int afd;
    ssize_t n = gpubuf_wire_read_frame(sock, GPUBUF_WIRE_MAX_RESPONSE, &p, &afd);
    if (ret_fd)
        *ret_fd = -1;
    if (n < 0)
        return NULL;
    Gpubuf__Response *r = gpubuf__response__unpack(NULL, (size_t)n, p);
    free(p);
    if (ret_fd)
        *ret_fd = afd;
    else if (afd >= 0)
        close(afd);
    return r;
}

int rp_connect(const char *path, int timeout_s) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct timeval tv = {timeout_s, 0};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}
