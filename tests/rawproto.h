/* Speaking the protocol by hand: hello requests, framed requests built and
 * sent, responses read, a plain connection. For the suites and seed writers
 * that talk to gpubufd (or a session) without the client library. Nothing
 * here aborts a test: failures are returned, the caller asserts. */
#ifndef GPUBUF_TEST_RAWPROTO_H
#define GPUBUF_TEST_RAWPROTO_H

#include <stddef.h>
#include <stdint.h>

#include "gpubuf.pb-c.h"

/* A hello request (id 1, protocol version 1 only) and the Hello it points
 * to; fill it with rp_hello_init, change fields after if needed. */
typedef struct rp_hello {
    Gpubuf__Request req;
    Gpubuf__Hello hello;
} rp_hello;

/* A hello with capability bits caps and client_name (NULL: none). */
void rp_hello_init(rp_hello *h, uint64_t caps, const char *client_name);

/* A request with id and the body msg of kind body (a Gpubuf__...Request
 * or Gpubuf__Hello that body names): the three lines every hand-built
 * request needs. */
Gpubuf__Request rp_request(uint64_t id, Gpubuf__Request__BodyCase body, void *msg);

/* Write req framed (header and body) at out, which has room for
 * rp_frame_size(req) bytes; returns the frame's length. */
size_t rp_frame(uint8_t *out, const Gpubuf__Request *req);
size_t rp_frame_size(const Gpubuf__Request *req);
/* Append req framed to *buf (grown as needed, *cap its size); 0 or -ENOMEM. */
int rp_append(uint8_t **buf, size_t *len, size_t *cap, const Gpubuf__Request *req);

/* Send req framed on sock, with fd attached when fd >= 0; 0 or -errno. */
int rp_send(int sock, const Gpubuf__Request *req, int fd);
/* Read one response; NULL at end of stream or on error. *ret_fd (when not
 * NULL) gets an attached fd or -1; without ret_fd an attached fd is closed. */
Gpubuf__Response *rp_recv(int sock, int *ret_fd);

/* A plain stream socket connected to path (no hello), whose reads give up
 * after timeout_s seconds; the socket or -errno. */
int rp_connect(const char *path, int timeout_s);

#endif
