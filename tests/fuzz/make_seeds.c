/* Writes the seed corpus: valid conversations (hello, then every request
 * type) for the fuzzer to mutate. Usage: make_seeds DIR */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpubuf.pb-c.h"
#include "wire.h"

static size_t put(uint8_t *out, Gpubuf__Request *req) {
    size_t n = gpubuf__request__pack(req, out + GPUBUF_WIRE_HEADER_SIZE);
    gpubuf_wire_header_encode(out, (uint32_t)n);
    return n + GPUBUF_WIRE_HEADER_SIZE;
}

static size_t hello(uint8_t *out) {
    Gpubuf__Request r = GPUBUF__REQUEST__INIT;
    Gpubuf__Hello h = GPUBUF__HELLO__INIT;
    h.min_version = h.max_version = 1;
    h.client_name = (char *)"seed";
    r.id = 1;
    r.body_case = GPUBUF__REQUEST__BODY_HELLO;
    r.hello = &h;
    return put(out, &r);
}

static void save(const char *dir, const char *name, const uint8_t *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

int main(int argc, char **argv) {
    uint8_t b[4096];
    size_t n;
    if (argc != 2)
        return 2;
    const char *dir = argv[1];
    n = hello(b);
    save(dir, "hello", b, n);

    /* hello, alloc named, seal 1, open by name, stat, release, delete, status */
    Gpubuf__Request r = GPUBUF__REQUEST__INIT;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = 4096;
    a.name = (char *)"seed/a";
    r.id = 2;
    r.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    r.alloc = &a;
    n += put(b + n, &r);
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    s.buffer_id = 1;
    r.id = 3;
    r.body_case = GPUBUF__REQUEST__BODY_SEAL;
    r.seal = &s;
    n += put(b + n, &r);
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = (char *)"seed/a";
    o.timeout_ms = 0;
    r.id = 4;
    r.body_case = GPUBUF__REQUEST__BODY_OPEN;
    r.open = &o;
    n += put(b + n, &r);
    Gpubuf__StatRequest st = GPUBUF__STAT_REQUEST__INIT;
    st.target_case = GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID;
    st.buffer_id = 1;
    r.id = 5;
    r.body_case = GPUBUF__REQUEST__BODY_STAT;
    r.stat = &st;
    n += put(b + n, &r);
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    rel.buffer_id = 1;
    r.id = 6;
    r.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    r.release = &rel;
    n += put(b + n, &r);
    n += put(b + n, &r); /* double release */
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    d.target_case = GPUBUF__DELETE_REQUEST__TARGET_NAME;
    d.name = (char *)"seed/a";
    r.id = 7;
    r.body_case = GPUBUF__REQUEST__BODY_DELETE;
    r.delete_ = &d;
    n += put(b + n, &r);
    Gpubuf__StatusRequest sr = GPUBUF__STATUS_REQUEST__INIT;
    r.id = 8;
    r.body_case = GPUBUF__REQUEST__BODY_STATUS;
    r.status = &sr;
    n += put(b + n, &r);
    save(dir, "lifecycle", b, n);

    /* hello, anonymous alloc, waiting opens by id and by name */
    n = hello(b);
    a.name = (char *)"";
    a.alignment = 4096;
    r.id = 2;
    r.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    r.alloc = &a;
    n += put(b + n, &r);
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID;
    o.buffer_id = 2;
    o.timeout_ms = 50;
    r.id = 3;
    r.body_case = GPUBUF__REQUEST__BODY_OPEN;
    r.open = &o;
    n += put(b + n, &r);
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = (char *)"later";
    o.timeout_ms = -1;
    r.id = 4;
    n += put(b + n, &r);
    save(dir, "waits", b, n);

    /* KEEP_MAPPED: hello with the capability, alloc, release keeping the
     * slab, unmap (twice), a dedicated slab released with keep_mapped */
    n = 0;
    {
        Gpubuf__Hello h = GPUBUF__HELLO__INIT;
        h.min_version = h.max_version = 1;
        h.capabilities = GPUBUF_CAP_KEEP_MAPPED;
        r.id = 1;
        r.body_case = GPUBUF__REQUEST__BODY_HELLO;
        r.hello = &h;
        n += put(b + n, &r);
    }
    a.name = (char *)"";
    a.alignment = 0;
    a.size = 4096;
    r.id = 2;
    r.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    r.alloc = &a;
    n += put(b + n, &r);
    rel.buffer_id = 1;
    rel.keep_mapped = 1;
    r.id = 3;
    r.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    r.release = &rel;
    n += put(b + n, &r);
    Gpubuf__UnmapRequest u = GPUBUF__UNMAP_REQUEST__INIT;
    u.slab_id = 1;
    r.id = 4;
    r.body_case = GPUBUF__REQUEST__BODY_UNMAP;
    r.unmap = &u;
    n += put(b + n, &r);
    n += put(b + n, &r);
    a.size = 64u << 20;
    r.id = 5;
    r.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    r.alloc = &a;
    n += put(b + n, &r);
    rel.buffer_id = 2;
    r.id = 6;
    r.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    r.release = &rel;
    n += put(b + n, &r);
    sr.columnar = 1;
    r.id = 7;
    r.body_case = GPUBUF__REQUEST__BODY_STATUS;
    r.status = &sr;
    n += put(b + n, &r);
    save(dir, "kept", b, n);

    /* Read-only opens and seal events: alloc, a seal with a short event
     * handle, a seal with a full one (refused on host pools), a plain seal,
     * a read-only open, a read-only release, a waiting read-only open, status */
    n = hello(b);
    a.name = (char *)"seed/ro";
    a.size = 8192;
    r.id = 2;
    r.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    r.alloc = &a;
    n += put(b + n, &r);
    uint8_t ev[64] = {0x42};
    s.buffer_id = 1;
    s.event_handle.data = ev;
    s.event_handle.len = 10;
    r.id = 3;
    r.body_case = GPUBUF__REQUEST__BODY_SEAL;
    r.seal = &s;
    n += put(b + n, &r);
    s.event_handle.len = 64;
    n += put(b + n, &r);
    s.event_handle.len = 0;
    n += put(b + n, &r);
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = (char *)"seed/ro";
    o.timeout_ms = 0;
    o.read_only = 1;
    r.id = 4;
    r.body_case = GPUBUF__REQUEST__BODY_OPEN;
    r.open = &o;
    n += put(b + n, &r);
    rel.buffer_id = 1;
    rel.keep_mapped = 0;
    rel.read_only = 1;
    r.id = 5;
    r.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    r.release = &rel;
    n += put(b + n, &r);
    o.name = (char *)"seed/ro2";
    o.timeout_ms = 20;
    r.id = 6;
    r.body_case = GPUBUF__REQUEST__BODY_OPEN;
    r.open = &o;
    n += put(b + n, &r);
    sr.columnar = 0;
    r.id = 7;
    r.body_case = GPUBUF__REQUEST__BODY_STATUS;
    r.status = &sr;
    n += put(b + n, &r);
    save(dir, "readonly", b, n);

    /* Restart: a hello resuming a session (none is detached here) with
     * held references, one named twice; a takeover request (refused: the
     * target has no takeover); a status. */
    {
        Gpubuf__Request q = GPUBUF__REQUEST__INIT;
        Gpubuf__Hello h = GPUBUF__HELLO__INIT;
        Gpubuf__HeldRef hr[3] = {GPUBUF__HELD_REF__INIT, GPUBUF__HELD_REF__INIT,
                                 GPUBUF__HELD_REF__INIT};
        Gpubuf__HeldRef *ph[3] = {&hr[0], &hr[1], &hr[2]};
        Gpubuf__TakeoverRequest tk = GPUBUF__TAKEOVER_REQUEST__INIT;
        hr[0].buffer_id = 1;
        hr[0].count = 2;
        hr[0].read_only = 1;
        hr[1].buffer_id = 7;
        hr[1].count = 1;
        hr[2].buffer_id = 1;
        hr[2].count = 5;
        h.min_version = h.max_version = 1;
        h.client_name = (char *)"seed";
        h.resume_session = 3;
        h.n_held = 3;
        h.held = ph;
        q.id = 1;
        q.body_case = GPUBUF__REQUEST__BODY_HELLO;
        q.hello = &h;
        n = put(b, &q);
        tk.path = (char *)"/tmp/seed.takeover";
        q.id = 2;
        q.body_case = GPUBUF__REQUEST__BODY_TAKEOVER;
        q.takeover = &tk;
        n += put(b + n, &q);
        q.id = 3;
        q.body_case = GPUBUF__REQUEST__BODY_STATUS;
        q.status = &sr;
        n += put(b + n, &q);
        save(dir, "restart", b, n);
    }
    return 0;
}
