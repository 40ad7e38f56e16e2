/* The decoder of common replies (client/reply_fast.c) against protobuf-c:
 * on replies packed by protobuf-c with every field of Response, Buffer and
 * Slab in turn, and batch replies (BatchReply: every column, errors,
 * slabs, user bytes, now and then a layout, which is declined), and on
 * those replies cut, flipped and spliced, whatever it accepts protobuf-c
 * accepts, field for field the same (a batch reply: packed again by
 * protobuf-c, the same bytes); what it declines protobuf-c still decodes
 * (the slower path). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "wire_values.h"
#include "internal.h"


static char g_str[3][300];
static uint8_t g_bytes[4][80];

static char *some_str(int k) {
    int n = rand() % 3 == 0 ? 0 : rand() % 280;
    for (int i = 0; i < n; i++)
        g_str[k][i] = (char)(rand() % 2 ? 'a' + rand() % 26 : 1 + rand() % 255);
    g_str[k][n] = 0;
    return g_str[k];
}

static ProtobufCBinaryData some_bytes(int k) {
    ProtobufCBinaryData d = {0, NULL};
    if (rand() % 3) {
        d.len = (size_t)(rand() % 80);
        for (size_t i = 0; i < d.len; i++)
            g_bytes[k][i] = (uint8_t)rand();
        d.data = d.len ? g_bytes[k] : NULL;
    }
    return d;
}

/* A batch reply's columns: n items, some columns empty. */
enum { BN = 60 };
static int32_t g_status[BN];
static uint64_t g_u64[5][BN];
static uint32_t g_u32[3][BN];
static ProtobufCBinaryData g_user[BN];
static Gpubuf__BatchItemError g_err[3], *g_errp[3];
static Gpubuf__Slab g_slab[3], *g_slabp[3];
static Gpubuf__ArrayLayout g_layout, *g_layoutp[1] = {&g_layout};

static size_t some_n(void) {
    return rand() % 4 == 0 ? 0 : (size_t)(rand() % BN);
}

static uint64_t *u64_col(int k, size_t *n) {
    *n = some_n();
    for (size_t i = 0; i < *n; i++)
        g_u64[k][i] = some();
    return g_u64[k];
}

static uint32_t *u32_col(int k, size_t *n) {
    *n = some_n();
    for (size_t i = 0; i < *n; i++)
        g_u32[k][i] = (uint32_t)some();
    return g_u32[k];
}

static void make_batch(Gpubuf__BatchReply *br) {
    br->n_status = some_n();
    br->status = g_status;
    for (size_t i = 0; i < br->n_status; i++)
        g_status[i] = rand() % 2 ? 0 : -(rand() % 200000);
    br->n_errors = (size_t)(rand() % 3);
    br->errors = g_errp;
    for (size_t i = 0; i < br->n_errors; i++) {
        gpubuf__batch_item_error__init(&g_err[i]);
        g_err[i].item = (uint32_t)some();
        g_err[i].message = some_str((int)i);
        g_errp[i] = &g_err[i];
    }
    br->buffer_id = u64_col(0, &br->n_buffer_id);
    br->size = u64_col(1, &br->n_size);
    br->offset = u64_col(2, &br->n_offset);
    br->slab_id = u64_col(3, &br->n_slab_id);
    br->names = some_bytes(0);
    br->n_slabs = (size_t)(rand() % 3);
    br->slabs = g_slabp;
    for (size_t i = 0; i < br->n_slabs; i++) {
        Gpubuf__Slab *s = &g_slab[i];
        gpubuf__slab__init(s);
        s->slab_id = some();
        s->kind = (Gpubuf__PoolKind)(rand() % 4);
        s->device = rand() % 2 ? -1 : rand() % 8;
        s->device_uuid = some_bytes(1);
        s->size = some();
        s->ipc_handle = some_bytes(2);
        s->keepable = rand() % 2;
        s->read_only = rand() % 2;
        g_slabp[i] = s;
    }
    br->event_items = u32_col(0, &br->n_event_items);
    br->events = some_bytes(3);
    br->state = u32_col(1, &br->n_state);
    gpubuf__array_layout__init(&g_layout);
    br->n_layouts = rand() % 8 == 0; /* declined: left to protobuf-c */
    br->layouts = g_layoutp;
    br->n_user_data = some_n() % 8;
    br->user_data = g_user;
    for (size_t i = 0; i < br->n_user_data; i++)
        g_user[i] = some_bytes((int)(i % 4));
    br->lease_left_ms = u64_col(4, &br->n_lease_left_ms);
    br->meta_items = u32_col(2, &br->n_meta_items);
}

/* A reply with some of its fields set, packed; *len its size. */
static uint8_t *make_reply(size_t *len) {
    Gpubuf__Response r = GPUBUF__RESPONSE__INIT;
    Gpubuf__Buffer b = GPUBUF__BUFFER__INIT;
    Gpubuf__Slab s = GPUBUF__SLAB__INIT;
    Gpubuf__ArrayLayout l = GPUBUF__ARRAY_LAYOUT__INIT;
    Gpubuf__BatchReply br = GPUBUF__BATCH_REPLY__INIT;
    r.id = some();
    r.status = rand() % 2 ? 0 : -(rand() % 2000);
    if (rand() % 3 == 0)
        r.message = some_str(0);
    r.fds = (uint32_t)(rand() % 3);
    if (rand() % 4 == 0) {
        r.body_case = GPUBUF__RESPONSE__BODY_BATCH;
        r.batch = &br;
        make_batch(&br);
    } else if (rand() % 5) {
        r.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
        r.buffer = &b;
        b.buffer_id = some();
        b.name = some_str(1);
        b.pool = some_str(2);
        b.size = some();
        b.offset = some();
        b.state = (Gpubuf__BufferState)(rand() % 4);
        b.refs = (uint32_t)some();
        b.owner_uid = (uint32_t)some();
        b.slab_id = some();
        b.event_handle = some_bytes(0);
        b.read_only = rand() % 2;
        b.restored = rand() % 2;
        b.user_data = some_bytes(1);
        b.lease_left_ms = some();
        b.lease_ttl_ms = some();
        if (rand() % 8 == 0)
            b.layout = &l; /* declined: left to protobuf-c */
        if (rand() % 4) {
            b.slab = &s;
            s.slab_id = some();
            s.kind = (Gpubuf__PoolKind)(rand() % 4);
            s.device = rand() % 2 ? -1 : rand() % 8;
            s.device_uuid = some_bytes(2);
            s.size = some();
            s.ipc_handle = some_bytes(3);
            s.keepable = rand() % 2;
            s.read_only = rand() % 2;
        }
    }
    *len = gpubuf__response__get_packed_size(&r);
    uint8_t *out = malloc(*len + 1);
    ck_assert_ptr_nonnull(out);
    gpubuf__response__pack(&r, out);
    return out;
}

static void same_bytes(ProtobufCBinaryData a, ProtobufCBinaryData b) {
    ck_assert_uint_eq(a.len, b.len);
    if (a.len)
        ck_assert_int_eq(memcmp(a.data, b.data, a.len), 0);
}

static void same(const Gpubuf__Response *f, const Gpubuf__Response *p) {
    ck_assert_uint_eq(f->id, p->id);
    ck_assert_int_eq(f->status, p->status);
    ck_assert_str_eq(f->message, p->message);
    ck_assert_uint_eq(f->fds, p->fds);
    ck_assert_int_eq(f->body_case, p->body_case);
    if (f->body_case == GPUBUF__RESPONSE__BODY_BATCH) {
        size_t n = gpubuf__batch_reply__get_packed_size(f->batch);
        ck_assert_uint_eq(n, gpubuf__batch_reply__get_packed_size(p->batch));
        uint8_t *x = malloc(n + 1), *y = malloc(n + 1);
        ck_assert(x && y);
        gpubuf__batch_reply__pack(f->batch, x);
        gpubuf__batch_reply__pack(p->batch, y);
        ck_assert_msg(memcmp(x, y, n) == 0, "a batch reply decoded differently");
        free(x);
        free(y);
        return;
    }
    if (f->body_case != GPUBUF__RESPONSE__BODY_BUFFER)
        return;
    const Gpubuf__Buffer *a = f->buffer, *b = p->buffer;
    ck_assert_uint_eq(a->buffer_id, b->buffer_id);
    ck_assert_str_eq(a->name, b->name);
    ck_assert_str_eq(a->pool, b->pool);
    ck_assert_uint_eq(a->size, b->size);
    ck_assert_uint_eq(a->offset, b->offset);
    ck_assert_int_eq(a->state, b->state);
    ck_assert_uint_eq(a->refs, b->refs);
    ck_assert_uint_eq(a->owner_uid, b->owner_uid);
    ck_assert_uint_eq(a->slab_id, b->slab_id);
    same_bytes(a->event_handle, b->event_handle);
    ck_assert_int_eq(a->read_only, b->read_only);
    ck_assert_int_eq(a->restored, b->restored);
    ck_assert_ptr_null(a->layout);
    ck_assert_ptr_null(b->layout);
    same_bytes(a->user_data, b->user_data);
    ck_assert_uint_eq(a->lease_left_ms, b->lease_left_ms);
    ck_assert_uint_eq(a->lease_ttl_ms, b->lease_ttl_ms);
    ck_assert_int_eq(a->slab == NULL, b->slab == NULL);
    if (!a->slab)
        return;
    const Gpubuf__Slab *s = a->slab, *t = b->slab;
    ck_assert_uint_eq(s->slab_id, t->slab_id);
    ck_assert_int_eq(s->kind, t->kind);
    ck_assert_int_eq(s->device, t->device);
    same_bytes(s->device_uuid, t->device_uuid);
    ck_assert_uint_eq(s->size, t->size);
    same_bytes(s->ipc_handle, t->ipc_handle);
    ck_assert_int_eq(s->keepable, t->keepable);
    ck_assert_int_eq(s->read_only, t->read_only);
}

static gpubuf__arena A;
/* Batch replies decode into a larger block (the connection's heap block). */
static _Alignas(16) unsigned char g_big[1 << 17];

/* Decode data both ways: what the fast path accepts must agree. */
static int check_one(const uint8_t *data, size_t len) {
    gpubuf_arena_init(&A.a, g_big, sizeof(g_big));
    A.live = NULL;
    Gpubuf__Response *f = gpubuf__reply_fast(&A, data, len);
    Gpubuf__Response *p = gpubuf__response__unpack(NULL, len, data);
    if (f) {
        ck_assert_msg(p != NULL, "the fast path accepted %zu bytes protobuf-c refuses", len);
        same(f, p);
    } else {
        ck_assert_uint_eq(A.a.used, 0); /* declined: the arena as it was */
    }
    if (p)
        gpubuf__response__free_unpacked(p, NULL);
    return f != NULL;
}

START_TEST(fast_replies_equal_protobuf_c) {
    int accepted = 0, declined = 0;
    srand(23);
    for (int i = 0; i < 20000; i++) {
        size_t len;
        uint8_t *d = make_reply(&len);
        if (check_one(d, len))
            accepted++;
        else
            declined++;
        free(d);
    }
    /* Most are the common shape; those with a layout or another body are not. */
    ck_assert_int_gt(accepted, 12000);
    ck_assert_int_gt(declined, 500);
}
END_TEST

START_TEST(mutated_replies_never_disagree) {
    srand(24);
    for (int i = 0; i < 30000; i++) {
        size_t len;
        uint8_t *d = make_reply(&len);
        switch (i % 4) {
        case 0: len = len ? (size_t)rand() % len : 0; break; /* cut */
        case 1:
            for (int k = 0; len && k < 1 + rand() % 3; k++)
                d[rand() % len] ^= (uint8_t)(1u << (rand() % 8));
            break;
        case 2:
            if (len)
                d[rand() % len] = (uint8_t)rand();
            break;
        default: /* a field repeated: the reply twice */
        {
            uint8_t *two = malloc(2 * len + 1);
            memcpy(two, d, len);
            memcpy(two + len, d, len);
            free(d);
            d = two;
            len *= 2;
        }
        }
        check_one(d, len);
        free(d);
    }
}
END_TEST

/* protobuf-c refuses a tag or a length prefix padded past 5 bytes (the
 * fuzzer found both accepted here); a padded varint value of up to 10 bytes
 * it reads, and so does this decoder. */
START_TEST(padded_prefixes_follow_protobuf_c) {
    static const uint8_t tag6[] = {0x88, 0x80, 0x80, 0x80, 0x80, 0x00, 0x05};
    static const uint8_t tag5[] = {0x88, 0x80, 0x80, 0x80, 0x00, 0x05};
    static const uint8_t len6[] = {0x1a, 0x85, 0x80, 0x80, 0x80, 0x80, 0x00, 'h', 'e', 'l', 'l', 'o'};
    static const uint8_t len5[] = {0x1a, 0x85, 0x80, 0x80, 0x80, 0x00, 'h', 'e', 'l', 'l', 'o'};
    static const uint8_t val10[] = {0x08, 0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
    ck_assert(!check_one(tag6, sizeof(tag6)));
    ck_assert(check_one(tag5, sizeof(tag5)));
    ck_assert(!check_one(len6, sizeof(len6)));
    ck_assert(check_one(len5, sizeof(len5)));
    ck_assert(check_one(val10, sizeof(val10)));
}
END_TEST

int main(void) {
    Suite *s = suite_create("reply_fast");
    TCase *t = add_case(s, "decode", NULL, NULL, 0);
    add_tests(t, fast_replies_equal_protobuf_c, mutated_replies_never_disagree,
              padded_prefixes_follow_protobuf_c);
    return run_suite(s);
}
