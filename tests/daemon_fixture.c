/* The suites of gpubufd facing peers that speak the protocol themselves
 * (test_protocol.c, test_backpressure.c, test_operations.c): a daemon with
 * one host pool per test, and raw requests to it. */
#include "daemon_fixture.h"

#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "wire.h"

void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=256M,slab=4M", NULL};
    td_start(&D, args);
}

int raw_connect(void) {
    return td_raw_connect(&D, 60); /* a hang, not a slow machine, fails it */
}

/* Write one framed stat-by-id request at out; returns its length. */
size_t pack_stat(uint8_t *out, uint64_t request_id, uint64_t buffer_id) {
    Gpubuf__StatRequest st = GPUBUF__STAT_REQUEST__INIT;
    st.target_case = GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID;
    st.buffer_id = buffer_id;
    Gpubuf__Request req = rp_request(request_id, GPUBUF__REQUEST__BODY_STAT, &st);
    return rp_frame(out, &req);
}

/* The daemon still serves a well-behaved client. */
void assert_serving(void) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, NULL, &b), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}

/* One raw request/response; the response's status. *ret_buf/ret_slab get a
 * buffer reply's ids (attached fds are closed). */
int raw_call(int fd, Gpubuf__Request *req, uint64_t *ret_buf, uint64_t *ret_slab,
             bool *ret_keepable) {
    td_raw_send(fd, req);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    int st = r->status;
    if (r->body_case == GPUBUF__RESPONSE__BODY_BUFFER) {
        if (ret_buf)
            *ret_buf = r->buffer->buffer_id;
        if (ret_slab)
            *ret_slab = r->buffer->slab_id;
        if (ret_keepable)
            *ret_keepable = r->buffer->slab && r->buffer->slab->keepable;
    }
    gpubuf__response__free_unpacked(r, NULL);
    return st;
}

int raw_alloc_named(int fd, uint64_t size, const char *name, uint64_t *ret_buf,
                    uint64_t *ret_slab, bool *ret_keepable) {
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = size;
    if (name)
        a.name = (char *)name;
    Gpubuf__Request req = rp_request(10, GPUBUF__REQUEST__BODY_ALLOC, &a);
    return raw_call(fd, &req, ret_buf, ret_slab, ret_keepable);
}

Gpubuf__Response *raw_status(int fd, bool columnar) {
    Gpubuf__StatusRequest sr = GPUBUF__STATUS_REQUEST__INIT;
    sr.columnar = columnar;
    Gpubuf__Request req = rp_request(20, GPUBUF__REQUEST__BODY_STATUS, &sr);
    return td_raw_expect(fd, &req, GPUBUF__RESPONSE__BODY_STATUS_REPLY);
}
