/* The decoder of common requests (daemon/request_fast.c) against
 * protobuf-c: on requests packed by protobuf-c with every field of their
 * bodies filled at random through the descriptors (so that a field added to
 * the protocol is filled too), and on those requests cut, flipped and
 * spliced, whatever it accepts protobuf-c accepts, and the two structs pack
 * to the same bytes; every request of the shape it knows it accepts; what it
 * declines leaves its arena as it was. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "check_main.h"
#include "gpubuf.pb-c.h"
#include "session.h"
#include "wire_values.h"

static char g_text[32][64];
static uint8_t g_data[32][80];
static int g_used;
static bool g_layout;  /* a layout is set: not the decoder's shape */
static Gpubuf__ExpectedOwner g_owner;
static Gpubuf__ArrayLayout g_layout_msg;

/* A repeated field of a batch request: 0 to 40 numbers, bools or strings
 * (names of up to 30 bytes, some empty). */
static uint64_t g_u64[8][40];
static protobuf_c_boolean g_bool[8][40];
static char g_names[8][40][32];
static char *g_name_ptrs[8][40];

static void fill_repeated(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
    size_t n = rand() % 3 == 0 ? 0 : (size_t)(rand() % 41);
    unsigned slot = f->id % 8;
    *(size_t *)(void *)((char *)m + f->quantifier_offset) = n;
    void **at = (void **)(void *)((char *)m + f->offset);
    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT64:
        for (size_t k = 0; k < n; k++)
            g_u64[slot][k] = some();
        *at = g_u64[slot];
        break;
    case PROTOBUF_C_TYPE_BOOL:
        for (size_t k = 0; k < n; k++)
            g_bool[slot][k] = rand() % 2;
        *at = g_bool[slot];
        break;
    case PROTOBUF_C_TYPE_STRING:
        for (size_t k = 0; k < n; k++) {
            int len = rand() % 5 == 0 ? 0 : rand() % 31;
            for (int c = 0; c < len; c++)
                g_names[slot][k][c] = (char)('a' + rand() % 26);
            g_names[slot][k][len] = 0;
            g_name_ptrs[slot][k] = g_names[slot][k];
        }
        *at = g_name_ptrs[slot];
        break;
    default:
        ck_abort_msg("%s.%s: a repeated field the test does not fill", m->descriptor->name,
                     f->name);
    }
}

/* Every field of m at random; one member (or none) of each oneof. */
static void fill(ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        void *at = (char *)m + f->offset;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t *which = (uint32_t *)(void *)((char *)m + f->quantifier_offset);
            if (*which || rand() % 3 == 0)
                continue;
            *which = f->id;
        }
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            fill_repeated(m, f);
            continue;
        }
        switch (f->type) {
        case PROTOBUF_C_TYPE_UINT64: *(uint64_t *)at = some(); break;
        case PROTOBUF_C_TYPE_UINT32: *(uint32_t *)at = (uint32_t)some(); break;
        case PROTOBUF_C_TYPE_INT32: {
            int32_t v = (int32_t)(uint32_t)some();
            *(int32_t *)at = rand() % 3 == 0 ? -(int32_t)(rand() % 3000) : v;
            break;
        }
        case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)at = rand() % 2; break;
        case PROTOBUF_C_TYPE_ENUM: *(int *)at = rand() % 4; break;
        case PROTOBUF_C_TYPE_STRING: {
            char *s = g_text[g_used++ % 32];
            int n = rand() % 4 == 0 ? 0 : rand() % 60;
            for (int k = 0; k < n; k++)
                s[k] = (char)('a' + rand() % 26);
            s[n] = 0;
            *(char **)at = s;
            break;
        }
        case PROTOBUF_C_TYPE_BYTES: {
            ProtobufCBinaryData *b = at;
            b->len = rand() % 3 == 0 ? 0 : (size_t)(rand() % 80);
            b->data = b->len ? g_data[g_used++ % 32] : NULL;
            for (size_t k = 0; k < b->len; k++)
                b->data[k] = (uint8_t)rand();
            break;
        }
        case PROTOBUF_C_TYPE_MESSAGE:
            if (f->descriptor == &gpubuf__expected_owner__descriptor) {
                gpubuf__expected_owner__init(&g_owner);
                fill(&g_owner.base);
                *(void **)at = rand() % 2 ? &g_owner : NULL;
            } else if (f->descriptor == &gpubuf__array_layout__descriptor) {
                gpubuf__array_layout__init(&g_layout_msg);
                g_layout = rand() % 8 == 0;
                *(void **)at = g_layout ? &g_layout_msg : NULL;
            } else {
                ck_abort_msg("%s.%s: a message field the test does not fill", d->name, f->name);
            }
            break;
        default: ck_abort_msg("%s.%s: a field type the test does not fill", d->name, f->name);
        }
    }
}

/* A request with a random body, packed into out; its length. *known: of
 * the shape the decoder must take. */
static size_t make_request(uint8_t *out, bool *known) {
    Gpubuf__Request r = GPUBUF__REQUEST__INIT;
    union {
        Gpubuf__AllocRequest alloc;
        Gpubuf__SealRequest seal;
        Gpubuf__OpenRequest open;
        Gpubuf__ReleaseRequest release;
        Gpubuf__DeleteRequest del;
        Gpubuf__StatRequest stat;
        Gpubuf__UnmapRequest unmap;
        Gpubuf__CancelRequest cancel;
        Gpubuf__StatusRequest status;
        Gpubuf__BatchOpenRequest batch_open;
        Gpubuf__BatchReleaseRequest batch_release;
        Gpubuf__BatchAllocRequest batch_alloc;
        Gpubuf__BatchStateRequest batch_state;
    } b;
    g_layout = false;
    r.id = some();
    *known = true;
    switch (rand() % 14) {
    case 0: gpubuf__alloc_request__init(&b.alloc), r.alloc = &b.alloc; break;
    case 1: gpubuf__seal_request__init(&b.seal), r.seal = &b.seal; break;
    case 2: gpubuf__open_request__init(&b.open), r.open = &b.open; break;
    case 3: gpubuf__release_request__init(&b.release), r.release = &b.release; break;
    case 4: gpubuf__delete_request__init(&b.del), r.delete_ = &b.del; break;
    case 5: gpubuf__stat_request__init(&b.stat), r.stat = &b.stat; break;
    case 6: gpubuf__unmap_request__init(&b.unmap), r.unmap = &b.unmap; break;
    case 7: gpubuf__cancel_request__init(&b.cancel), r.cancel = &b.cancel; break;
    case 8: gpubuf__status_request__init(&b.status), r.status = &b.status, *known = false; break;
    case 9:
        gpubuf__batch_open_request__init(&b.batch_open), r.batch_open = &b.batch_open;
        break;
    case 10:
        gpubuf__batch_release_request__init(&b.batch_release);
        r.batch_release = &b.batch_release;
        break;
    case 11:
        gpubuf__batch_alloc_request__init(&b.batch_alloc), r.batch_alloc = &b.batch_alloc;
        break;
    case 12:
        gpubuf__batch_state_request__init(&b.batch_state), r.batch_state = &b.batch_state;
        break;
    default: break; /* no body */
    }
    static const Gpubuf__Request__BodyCase cases[] = {
        GPUBUF__REQUEST__BODY_ALLOC,   GPUBUF__REQUEST__BODY_SEAL,   GPUBUF__REQUEST__BODY_OPEN,
        GPUBUF__REQUEST__BODY_RELEASE, GPUBUF__REQUEST__BODY_DELETE, GPUBUF__REQUEST__BODY_STAT,
        GPUBUF__REQUEST__BODY_UNMAP,   GPUBUF__REQUEST__BODY_CANCEL, GPUBUF__REQUEST__BODY_STATUS,
        GPUBUF__REQUEST__BODY_BATCH_OPEN, GPUBUF__REQUEST__BODY_BATCH_RELEASE,
        GPUBUF__REQUEST__BODY_BATCH_ALLOC, GPUBUF__REQUEST__BODY_BATCH_STATE};
    if (r.alloc) { /* the body's field: the one whose message type it is */
        ProtobufCMessage *m = (ProtobufCMessage *)(void *)&b;
        for (unsigned k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
            const ProtobufCFieldDescriptor *f =
                protobuf_c_message_descriptor_get_field(&gpubuf__request__descriptor, cases[k]);
            if (f && f->descriptor == m->descriptor)
                r.body_case = cases[k];
        }
        fill(m);
        if (m->descriptor == &gpubuf__alloc_request__descriptor ||
            m->descriptor == &gpubuf__seal_request__descriptor)
            *known = *known && !g_layout;
    }
    size_t len = gpubuf__request__pack(&r, out);
    return len;
}

/* Decode data both ways and compare. */
static bool same_as_protobuf_c(const uint8_t *data, size_t len, int it) {
    static _Alignas(16) unsigned char block[64 * 1024];
    static uint8_t p1[16384], p2[16384];
    gpubuf_arena a;
    gpubuf_arena_init(&a, block, sizeof(block));
    Gpubuf__Request *fast = gd_request_fast(&a, data, len);
    Gpubuf__Request *slow = gpubuf__request__unpack(NULL, len, data);
    if (!fast) {
        ck_assert_msg(a.used == 0, "iteration %d: a declined request kept arena room", it);
        if (slow)
            gpubuf__request__free_unpacked(slow, NULL);
        return false;
    }
    ck_assert_msg(slow != NULL, "iteration %d: the decoder took what protobuf-c refuses", it);
    ck_assert_uint_eq(fast->body_case, slow->body_case);
    size_t n1 = gpubuf__request__get_packed_size(fast), n2 = gpubuf__request__get_packed_size(slow);
    ck_assert_uint_eq(n1, n2);
    ck_assert_uint_le(n1, sizeof(p1));
    gpubuf__request__pack(fast, p1);
    gpubuf__request__pack(slow, p2);
    ck_assert_msg(memcmp(p1, p2, n1) == 0, "iteration %d: the two decodings differ", it);
    gpubuf__request__free_unpacked(slow, NULL);
    return true;
}

START_TEST(common_requests_equal_protobuf_c) {
    static uint8_t buf[16384];
    unsigned taken = 0;
    srand(4321);
    for (int it = 0; it < 40000; it++) {
        bool known;
        size_t len = make_request(buf, &known);
        bool took = same_as_protobuf_c(buf, len, it);
        ck_assert_msg(took || !known, "iteration %d: declined a request of its own shape", it);
        taken += took;
    }
    ck_assert_uint_gt(taken, 20000);
}
END_TEST

START_TEST(mutated_requests_never_disagree) {
    static uint8_t a[16384], b[16384], m[32768];
    unsigned taken = 0;
    srand(8765);
    for (int it = 0; it < 60000; it++) {
        bool known;
        size_t la = make_request(a, &known), lb = make_request(b, &known), lm;
        switch (rand() % 4) {
        case 0: /* cut */
            lm = la ? (size_t)rand() % la : 0;
            memcpy(m, a, lm);
            break;
        case 1: /* a byte flipped */
            memcpy(m, a, la);
            lm = la;
            if (la)
                m[rand() % la] ^= (uint8_t)(1 + rand() % 255);
            break;
        case 2: /* two requests end to end: a merge for protobuf-c */
            memcpy(m, a, la);
            memcpy(m + la, b, lb);
            lm = la + lb;
            break;
        default: /* a random byte inserted */
            lm = la ? (size_t)rand() % la : 0;
            memcpy(m, a, lm);
            m[lm] = (uint8_t)rand();
            memcpy(m + lm + 1, a + lm, la - lm);
            lm = la + 1;
        }
        taken += same_as_protobuf_c(m, lm, it);
    }
    ck_assert_uint_gt(taken, 1000);
}
END_TEST

/* A string with a NUL byte: protobuf-c keeps it up to the NUL, and the
 * session, which scans only what this decoder declines, refuses it with
 * its own message; so the decoder must decline every one. */
START_TEST(nul_strings_declined) {
    static const uint8_t frames[][16] = {
        /* id 1, open {name "a\0b"} */
        {9, 0x08, 0x01, 0x6a, 0x05, 0x0a, 0x03, 'a', 0x00, 'b'},
        /* id 1, open {buffer_id 5, pool "\0"} */
        {9, 0x08, 0x01, 0x6a, 0x05, 0x10, 0x05, 0x2a, 0x01, 0x00},
        /* id 1, alloc {pool "p\0", size 1} */
        {10, 0x08, 0x01, 0x5a, 0x06, 0x0a, 0x02, 'p', 0x00, 0x10, 0x01},
        /* id 1, alloc {size 1, name "\0x"} */
        {10, 0x08, 0x01, 0x5a, 0x06, 0x10, 0x01, 0x1a, 0x02, 0x00, 'x'},
        /* id 1, delete {name "x\0"} */
        {8, 0x08, 0x01, 0x7a, 0x04, 0x0a, 0x02, 'x', 0x00},
        /* id 1, stat {buffer_id 2, pool "\0"} */
        {10, 0x08, 0x01, 0x82, 0x01, 0x05, 0x10, 0x02, 0x1a, 0x01, 0x00},
    };
    for (size_t i = 0; i < sizeof(frames) / sizeof(frames[0]); i++) {
        const uint8_t *f = frames[i] + 1;
        size_t len = frames[i][0];
        Gpubuf__Request *slow = gpubuf__request__unpack(NULL, len, f);
        ck_assert_msg(slow != NULL, "frame %zu: protobuf-c refuses it", i);
        gpubuf__request__free_unpacked(slow, NULL);
        ck_assert_msg(!same_as_protobuf_c(f, len, (int)i), "frame %zu: a NUL byte taken", i);
    }
    /* The same frames without the NUL byte are taken. */
    static const uint8_t clean[] = {0x08, 0x01, 0x6a, 0x05, 0x0a, 0x03, 'a', 'c', 'b'};
    ck_assert(same_as_protobuf_c(clean, sizeof(clean), 99));
}
END_TEST

SUITE_MAIN("request_fast", "decode", NULL, NULL, 120, common_requests_equal_protobuf_c,
           mutated_requests_never_disagree, nul_strings_declined)
