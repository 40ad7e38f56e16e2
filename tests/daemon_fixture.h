/* A daemon D with one host pool (256 MiB, 4 MiB slabs) started for each test
 * of the suites that speak the protocol themselves (test_protocol.c,
 * test_backpressure.c, test_operations.c), and raw requests to it; the
 * frames are built by rawproto.h and sent and read by the harness. */
#ifndef GPUBUF_TEST_DAEMON_FIXTURE_H
#define GPUBUF_TEST_DAEMON_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpubuf.pb-c.h"
#include "harness.h"

/* The checked fixture's setup: start D (td_stop_clean stops it). */
void start_default(void);

/* A plain connection to D (no hello) whose reads give up after 5 s. */
int raw_connect(void);

/* Write one framed stat-by-id request at out; returns its length. */
size_t pack_stat(uint8_t *out, uint64_t request_id, uint64_t buffer_id);

/* The daemon still serves a well-behaved client. */
void assert_serving(void);

/* One raw request/response; the response's status. *ret_buf/ret_slab get a
 * buffer reply's ids (attached fds are closed). */
int raw_call(int fd, Gpubuf__Request *req, uint64_t *ret_buf, uint64_t *ret_slab,
             bool *ret_keepable);
/* Allocate size bytes named name (NULL: anonymous) over fd: raw_call's
 * status and ids. */
int raw_alloc_named(int fd, uint64_t size, const char *name, uint64_t *ret_buf,
                    uint64_t *ret_slab, bool *ret_keepable);
/* A status request over fd, in columns or rows; the reply must succeed. */
Gpubuf__Response *raw_status(int fd, bool columnar);

#endif
