/* The packer of common requests (client/request_pack.c) against protobuf-c:
 * open, stat and delete (by name, by id, with and without a pool and an
 * owner), release, seal and alloc with every field in turn at zero, small
 * and large values, negative timeouts, bools that hold more than 1, empty
 * and long strings and bytes: what it packs is byte for byte what protobuf-c
 * packs; what it declines (an array layout, an empty or NULL name, another
 * body, no room) it leaves for protobuf-c, and it never writes past the
 * room it is given. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "internal.h"
#include "wire_values.h"

static char g_str[3][300];
static uint8_t g_bytes[2][80];

/* NULL, "", or up to 255 bytes (no NUL). */
static char *some_str(int k) {
    switch (rand() % 4) {
    case 0: return NULL;
    case 1: return "";
    default: break;
    }
    int n = 1 + rand() % 255;
    for (int i = 0; i < n; i++)
        g_str[k][i] = (char)(1 + rand() % 255);
    g_str[k][n] = 0;
    return g_str[k];
}

static ProtobufCBinaryData some_bytes(int k) {
    ProtobufCBinaryData d = {0, NULL};
    if (rand() % 2) {
        d.len = (size_t)(1 + rand() % 79);
        for (size_t i = 0; i < d.len; i++)
            g_bytes[k][i] = (uint8_t)rand();
        d.data = g_bytes[k];
    }
    return d;
}

static protobuf_c_boolean some_bool(void) {
    int v = rand() % 4;
    return v == 3 ? 7 : v % 2; /* a true that is not 1 now and then */
}

static int32_t some_timeout(void) {
    switch (rand() % 4) {
    case 0: return 0;
    case 1: return -1;
    case 2: return (int32_t)(rand() % 100000);
    default: return (int32_t)rnd64();
    }
}

/* An open's, stat's or delete's target, pool and owner, at random: the
 * name or the id (a union: only the one of the case is set; its case is 1
 * for the name and 2 for the id in each of the three messages). */
#define SOME_LOOKUP(m, pool_, owner_)                                                              \
    do {                                                                                           \
        (m).target_case = 1 + rand() % 2;                                                          \
        if ((m).target_case == 1)                                                                  \
            (m).name = some_str(0);                                                                \
        else                                                                                       \
            (m).buffer_id = some();                                                                \
        (m).pool = (pool_);                                                                        \
        (m).owner = (owner_);                                                                      \
    } while (0)

/* What the packer made of req against protobuf-c: 1 when packed (the same
 * bytes), 0 when declined; it wrote nothing past cap either way. */
static int check_one(Gpubuf__Request *req, size_t cap) {
    uint8_t out[1024], want[1024];
    memset(out, 0xa5, sizeof(out));
    size_t n = gpubuf__request_pack_fast(req, out, cap);
    for (size_t i = cap; i < sizeof(out); i++)
        ck_assert_msg(out[i] == 0xa5, "wrote byte %zu past the room of %zu", i, cap);
    if (n == 0)
        return 0;
    size_t m = gpubuf__request__get_packed_size(req);
    ck_assert_uint_le(m, sizeof(want));
    gpubuf__request__pack(req, want);
    ck_assert_uint_eq(n, m);
    ck_assert_uint_le(n, cap);
    ck_assert(memcmp(out, want, n) == 0);
    return 1;
}

START_TEST(packed_requests_equal_protobuf_c) {
    int packed[17] = {0}, declined[17] = {0};
    srand(20261203);
    for (int i = 0; i < 20000; i++) {
        Gpubuf__Request req = GPUBUF__REQUEST__INIT;
        Gpubuf__OpenRequest open = GPUBUF__OPEN_REQUEST__INIT;
        Gpubuf__StatRequest stat = GPUBUF__STAT_REQUEST__INIT;
        Gpubuf__DeleteRequest del = GPUBUF__DELETE_REQUEST__INIT;
        Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
        Gpubuf__SealRequest seal = GPUBUF__SEAL_REQUEST__INIT;
        Gpubuf__AllocRequest alloc = GPUBUF__ALLOC_REQUEST__INIT;
        Gpubuf__ExpectedOwner owner = GPUBUF__EXPECTED_OWNER__INIT;
        Gpubuf__ArrayLayout layout = GPUBUF__ARRAY_LAYOUT__INIT;
        Gpubuf__UnmapRequest unmap = GPUBUF__UNMAP_REQUEST__INIT;
        owner.uid = (uint32_t)some();
        Gpubuf__ExpectedOwner *own = rand() % 2 ? &owner : NULL;
        req.id = 1 + some() % UINT64_MAX;
        char *pool = some_str(1);
        switch (rand() % 7) {
        case 0:
            req.body_case = GPUBUF__REQUEST__BODY_OPEN, req.open = &open;
            SOME_LOOKUP(open, pool, own);
            open.timeout_ms = some_timeout();
            open.read_only = some_bool();
            break;
        case 1:
            req.body_case = GPUBUF__REQUEST__BODY_STAT, req.stat = &stat;
            SOME_LOOKUP(stat, pool, own);
            break;
        case 2:
            req.body_case = GPUBUF__REQUEST__BODY_DELETE, req.delete_ = &del;
            SOME_LOOKUP(del, pool, own);
            break;
        case 3:
            req.body_case = GPUBUF__REQUEST__BODY_RELEASE, req.release = &rel;
            rel.buffer_id = some();
            rel.keep_mapped = some_bool();
            rel.read_only = some_bool();
            break;
        case 4:
            req.body_case = GPUBUF__REQUEST__BODY_SEAL, req.seal = &seal;
            seal.buffer_id = some();
            seal.event_handle = some_bytes(0);
            seal.user_data = some_bytes(1);
            seal.ttl_ms = some();
            seal.layout = rand() % 8 == 0 ? &layout : NULL;
            break;
        case 5:
            req.body_case = GPUBUF__REQUEST__BODY_ALLOC, req.alloc = &alloc;
            alloc.pool = pool;
            alloc.size = some();
            alloc.name = some_str(0);
            alloc.alignment = (uint32_t)some();
            alloc.user_data = some_bytes(1);
            alloc.ttl_ms = some();
            alloc.layout = rand() % 8 == 0 ? &layout : NULL;
            break;
        default:
            req.body_case = GPUBUF__REQUEST__BODY_UNMAP, req.unmap = &unmap;
            unmap.slab_id = some();
            break;
        }
        size_t cap = rand() % 4 ? 1024 : (size_t)(rand() % 200);
        int ok = check_one(&req, cap);
        (ok ? packed : declined)[req.body_case - 10]++;
        /* Declined only where it says it declines. */
        if (!ok && cap == 1024) {
            bool layout_or_other = (req.body_case == GPUBUF__REQUEST__BODY_SEAL && seal.layout) ||
                                   (req.body_case == GPUBUF__REQUEST__BODY_ALLOC && alloc.layout) ||
                                   req.body_case == GPUBUF__REQUEST__BODY_UNMAP;
            const char *name = req.body_case == GPUBUF__REQUEST__BODY_OPEN   ? open.name
                               : req.body_case == GPUBUF__REQUEST__BODY_STAT ? stat.name
                                                                             : del.name;
            int tc = req.body_case == GPUBUF__REQUEST__BODY_OPEN   ? (int)open.target_case
                     : req.body_case == GPUBUF__REQUEST__BODY_STAT ? (int)stat.target_case
                                                                   : (int)del.target_case;
            bool empty_name = tc == 1 && (!name || !*name);
            ck_assert_msg(layout_or_other || empty_name, "declined a request of body %d",
                          (int)req.body_case);
        }
    }
    /* Every body it knows was packed many times, and unmap never. */
    for (int b = 11; b <= 16; b++)
        ck_assert_int_gt(packed[b - 10], 1000);
    ck_assert_int_eq(packed[GPUBUF__REQUEST__BODY_UNMAP - 10], 0);
    ck_assert_int_gt(declined[GPUBUF__REQUEST__BODY_UNMAP - 10], 1000);
}
END_TEST

int main(void) {
    Suite *s = suite_create("request_pack");
    TCase *t = add_case(s, "pack", NULL, NULL, 0);
    add_tests(t, packed_requests_equal_protobuf_c);
    return run_suite(s);
}
