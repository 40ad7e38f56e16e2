/* The replies the daemon packs by hand (daemon/reply_pack.c) against
 * protobuf-c: Responses whose every field (found through the messages'
 * descriptors, so that a field added to the protocol is filled too) is set
 * or left empty at random, with small and large values, come out the same,
 * byte for byte, and the same size; the hand packer takes every reply of
 * the shape it knows, and leaves every other shape to protobuf-c. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "wire_values.h"
#include "gpubuf.pb-c.h"
#include "reply.h"


/* Room for the strings and bytes of one reply. */
static char g_text[64][300];
static uint8_t g_data[64][200];
static int g_used;

/* b: empty, or up to 199 random bytes in one of the g_data blocks. */
static void random_bytes(ProtobufCBinaryData *b) {
    b->len = rand() % 3 == 0 ? 0 : (size_t)(rand() % 200);
    b->data = b->len ? g_data[g_used++ % 64] : NULL;
    for (size_t k = 0; k < b->len; k++)
        b->data[k] = (uint8_t)rand();
}

/* Every field of m at random (body: the Response's oneof, set by the
 * caller). Submessages: the Slab always comes from slab; a layout, when
 * set, makes the reply one the hand packer leaves to protobuf-c. */
static void fill(ProtobufCMessage *m, Gpubuf__Slab *slab, Gpubuf__ArrayLayout *layout,
                 bool *layout_set) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        void *at = (char *)m + f->offset;
        ck_assert_msg(f->label != PROTOBUF_C_LABEL_REPEATED || f->type == PROTOBUF_C_TYPE_MESSAGE ||
                          d != &gpubuf__buffer__descriptor,
                      "%s.%s: a repeated field the test does not fill", d->name, f->name);
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            continue; /* the caller picks the body */
        switch (f->type) {
        case PROTOBUF_C_TYPE_UINT64: *(uint64_t *)at = some(); break;
        case PROTOBUF_C_TYPE_UINT32: *(uint32_t *)at = (uint32_t)some(); break;
        case PROTOBUF_C_TYPE_INT32:
        case PROTOBUF_C_TYPE_SINT32: {
            int32_t v = (int32_t)(uint32_t)some();
            if (rand() % 3 == 0)
                v = -(int32_t)(rand() % 3000);
            *(int32_t *)at = v;
            break;
        }
        case PROTOBUF_C_TYPE_ENUM: *(int *)at = rand() % 4; break;
        case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)at = rand() % 2; break;
        case PROTOBUF_C_TYPE_STRING: {
            char *s = g_text[g_used++ % 64];
            int n = rand() % 3 == 0 ? 0 : rand() % 280;
            for (int k = 0; k < n; k++)
                s[k] = (char)(rand() % 2 ? 'a' + rand() % 26 : 1 + rand() % 255);
            s[n] = 0;
            *(char **)at = rand() % 5 == 0 ? NULL : s;
            break;
        }
        case PROTOBUF_C_TYPE_BYTES: {
            random_bytes(at);
            break;
        }
        case PROTOBUF_C_TYPE_MESSAGE:
            if (f->descriptor == &gpubuf__slab__descriptor) {
                bool unused = false;
                gpubuf__slab__init(slab);
                fill(&slab->base, NULL, NULL, &unused);
                *(Gpubuf__Slab **)at = rand() % 4 ? slab : NULL;
            } else if (f->descriptor == &gpubuf__array_layout__descriptor) {
                gpubuf__array_layout__init(layout);
                *layout_set = rand() % 8 == 0;
                *(Gpubuf__ArrayLayout **)at = *layout_set ? layout : NULL;
            } else {
                ck_abort_msg("%s.%s: a message field the test does not fill", d->name, f->name);
            }
            break;
        default:
            ck_abort_msg("%s.%s: a field type the test does not fill", d->name, f->name);
        }
    }
}

/* r packed by the daemon's packer (the hand packer when expect_fast, else
 * protobuf-c through it) and by protobuf-c: the same size and bytes, and
 * nothing written past them; true when the hand packer took it. */
static bool packed_same(const Gpubuf__Response *r, bool expect_fast, int it) {
    static uint8_t mine[1 << 16], theirs[1 << 16];
    gd_reply_plan plan;
    size_t len = gd_reply_size(r, &plan);
    void (*pack)(const void *, uint8_t *) = plan.pack;
    size_t want = gpubuf__response__get_packed_size(r);
    ck_assert_uint_eq(len, want);
    ck_assert_uint_le(len + 16, sizeof(mine));
    ck_assert_msg(expect_fast == (pack == gd_reply_pack_fast),
                  "iteration %d: a reply of %s shape went to the %s packer", it,
                  expect_fast ? "the known" : "another", expect_fast ? "generic" : "hand");
    ck_assert_msg(pack == gd_reply_pack_fast || pack == gd_session_pack, "an unknown packer");
    memset(mine, 0xa5, len + 16);
    pack(plan.msg, mine);
    ck_assert_uint_eq(gpubuf__response__pack(r, theirs), want);
    ck_assert_msg(memcmp(mine, theirs, len) == 0, "iteration %d: the bytes differ", it);
    ck_assert_msg(mine[len] == 0xa5, "iteration %d: packed past its size", it);
    return pack == gd_reply_pack_fast;
}

START_TEST(same_bytes_as_protobuf_c) {
    unsigned fast = 0, slow = 0;
    srand(1234);
    for (int it = 0; it < 50000; it++) {
        Gpubuf__Response r = GPUBUF__RESPONSE__INIT;
        Gpubuf__Buffer b = GPUBUF__BUFFER__INIT;
        Gpubuf__Slab s;
        Gpubuf__ArrayLayout l;
        Gpubuf__HelloReply h = GPUBUF__HELLO_REPLY__INIT;
        bool layout_set = false, other_body = false;
        fill(&r.base, NULL, NULL, &layout_set);
        switch (rand() % 6) {
        case 0: break; /* no body: an error, a release's or a delete's answer */
        case 1:
            r.body_case = GPUBUF__RESPONSE__BODY_HELLO;
            r.hello = &h;
            other_body = true;
            break;
        default:
            gpubuf__buffer__init(&b);
            fill(&b.base, &s, &l, &layout_set);
            r.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
            r.buffer = &b;
        }
        if (packed_same(&r, !other_body && !layout_set, it))
            fast++;
        else
            slow++;
    }
    /* Both paths ran, the hand packer on most replies. */
    ck_assert_uint_gt(fast, 30000);
    ck_assert_uint_gt(slow, 5000);
}
END_TEST

/* Batch replies: every field of a BatchReply (through its descriptor: a
 * field added to the protocol must be handled here first) holds 0 to 40
 * elements at random, errors and slabs filled as above, an array layout now
 * and then (which leaves the reply to protobuf-c); the bytes and the size
 * are protobuf-c's. */
static uint64_t g_u64[16][40];
static uint32_t g_u32[16][40];
static int32_t g_s32[16][40];
static ProtobufCBinaryData g_bin[40];

static void fill_batch(Gpubuf__BatchReply *m, Gpubuf__BatchItemError *errs,
                       Gpubuf__BatchItemError **errp, Gpubuf__Slab *slabs, Gpubuf__Slab **slabp,
                       Gpubuf__ArrayLayout *layout, Gpubuf__ArrayLayout **layoutp,
                       bool *layout_set) {
    const ProtobufCMessageDescriptor *d = &gpubuf__batch_reply__descriptor;
    bool unused = false;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        void *at = (char *)m + f->offset;
        size_t *np = (size_t *)((char *)m + f->quantifier_offset);
        size_t n = (size_t)(rand() % 3 == 0 ? 0 : rand() % 41);
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            ck_assert_msg(f->type == PROTOBUF_C_TYPE_BYTES, "BatchReply.%s: a field the test does not fill",
                          f->name);
            random_bytes(at);
            continue;
        }
        *np = n;
        switch (f->type) {
        case PROTOBUF_C_TYPE_UINT64: {
            uint64_t *v = g_u64[i];
            for (size_t k = 0; k < n; k++)
                v[k] = some();
            *(uint64_t **)at = v;
            break;
        }
        case PROTOBUF_C_TYPE_UINT32: {
            uint32_t *v = g_u32[i];
            for (size_t k = 0; k < n; k++)
                v[k] = (uint32_t)some();
            *(uint32_t **)at = v;
            break;
        }
        case PROTOBUF_C_TYPE_SINT32: {
            int32_t *v = g_s32[i];
            for (size_t k = 0; k < n; k++)
                v[k] = rand() % 2 ? -(int32_t)(rand() % 200000) : (int32_t)(uint32_t)some();
            *(int32_t **)at = v;
            break;
        }
        case PROTOBUF_C_TYPE_BYTES:
            for (size_t k = 0; k < n; k++) {
                g_bin[k].len = (size_t)(rand() % 4 == 0 ? 0 : rand() % 100);
                g_bin[k].data = g_data[g_used++ % 64];
            }
            *(ProtobufCBinaryData **)at = g_bin;
            break;
        case PROTOBUF_C_TYPE_MESSAGE:
            n = n % 4;
            *np = n;
            if (f->descriptor == &gpubuf__batch_item_error__descriptor) {
                for (size_t k = 0; k < n; k++) {
                    gpubuf__batch_item_error__init(&errs[k]);
                    fill(&errs[k].base, NULL, NULL, &unused);
                    errp[k] = &errs[k];
                }
                *(Gpubuf__BatchItemError ***)at = errp;
            } else if (f->descriptor == &gpubuf__slab__descriptor) {
                for (size_t k = 0; k < n; k++) {
                    gpubuf__slab__init(&slabs[k]);
                    fill(&slabs[k].base, NULL, NULL, &unused);
                    slabp[k] = &slabs[k];
                }
                *(Gpubuf__Slab ***)at = slabp;
            } else if (f->descriptor == &gpubuf__array_layout__descriptor) {
                *layout_set = rand() % 8 == 0;
                *np = *layout_set;
                gpubuf__array_layout__init(layout);
                *layoutp = layout;
                *(Gpubuf__ArrayLayout ***)at = layoutp;
            } else {
                ck_abort_msg("BatchReply.%s: a message field the test does not fill", f->name);
            }
            break;
        default:
            ck_abort_msg("BatchReply.%s: a field type the test does not fill", f->name);
        }
    }
}

START_TEST(batch_replies_same_bytes) {
    unsigned fast = 0, slow = 0;
    srand(4321);
    for (int it = 0; it < 20000; it++) {
        Gpubuf__Response r = GPUBUF__RESPONSE__INIT;
        Gpubuf__BatchReply br = GPUBUF__BATCH_REPLY__INIT;
        Gpubuf__BatchItemError errs[4], *errp[4];
        Gpubuf__Slab slabs[4], *slabp[4];
        Gpubuf__ArrayLayout layout, *layoutp[1];
        bool layout_set = false, unused = false;
        fill(&r.base, NULL, NULL, &unused);
        fill_batch(&br, errs, errp, slabs, slabp, &layout, layoutp, &layout_set);
        r.body_case = GPUBUF__RESPONSE__BODY_BATCH;
        r.batch = &br;
        if (packed_same(&r, !layout_set, it))
            fast++;
        else
            slow++;
    }
    ck_assert_uint_gt(fast, 15000);
    ck_assert_uint_gt(slow, 1000);
}
END_TEST

/* The daemon's common replies as the session builds them: a release's
 * answer, an error, an open's Buffer with its Slab (a host slab's device
 * is -1: a ten-byte varint). */
START_TEST(common_replies) {
    uint8_t mine[512], theirs[512];
    Gpubuf__Response r = GPUBUF__RESPONSE__INIT;
    Gpubuf__Buffer b = GPUBUF__BUFFER__INIT;
    Gpubuf__Slab s = GPUBUF__SLAB__INIT;
    gd_reply_plan plan;
    r.id = 7;
    size_t len = gd_reply_size(&r, &plan);
    ck_assert_ptr_eq(plan.pack, gd_reply_pack_fast);
    ck_assert_uint_eq(len, 2);
    plan.pack(plan.msg, mine);
    ck_assert_int_eq(mine[0], 0x08);
    ck_assert_int_eq(mine[1], 7);
    r.status = -2;
    r.message = "no buffer named x";
    len = gd_reply_size(&r, &plan);
    ck_assert_uint_eq(len, gpubuf__response__pack(&r, theirs));
    plan.pack(plan.msg, mine);
    ck_assert_mem_eq(mine, theirs, len);
    r.status = 0;
    r.message = "";
    r.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
    r.buffer = &b;
    b.buffer_id = 1u << 20;
    b.name = "frames/0";
    b.pool = "gpu0";
    b.size = 1 << 20;
    b.state = GPUBUF__BUFFER_STATE__BUFFER_STATE_SEALED;
    b.refs = 2;
    b.slab = &s;
    b.slab_id = 3;
    s.slab_id = 3;
    s.kind = GPUBUF__POOL_KIND__POOL_KIND_HOST;
    s.device = -1;
    s.size = 64u << 20;
    len = gd_reply_size(&r, &plan);
    ck_assert_ptr_eq(plan.pack, gd_reply_pack_fast);
    ck_assert_uint_eq(len, gpubuf__response__pack(&r, theirs));
    plan.pack(plan.msg, mine);
    ck_assert_mem_eq(mine, theirs, len);
    Gpubuf__Response *back = gpubuf__response__unpack(NULL, len, mine);
    ck_assert_ptr_nonnull(back);
    ck_assert_int_eq(back->buffer->slab->device, -1);
    ck_assert_str_eq(back->buffer->name, "frames/0");
    gpubuf__response__free_unpacked(back, NULL);
}
END_TEST

SUITE_MAIN("reply_pack", "pack", NULL, NULL, 120, same_bytes_as_protobuf_c,
           batch_replies_same_bytes, common_replies)
