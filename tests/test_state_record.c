/* The saved state's entries of versions 2 to 4 (daemon/state_record.c) as
 * the writer makes them and as a hostile state gives them: every entry
 * decodes to the records it says, and a group cut anywhere, of an unknown
 * kind, with a name too long or holding a NUL, with bad flags, an empty or
 * too long run (of references or of buffers), or a
 * record longer than what is left, is
 * refused whole (nothing returned, nothing leaked: the sanitizer build
 * checks). */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "saved_state.h"
#include "state.h"
#include "state_internal.h"
#include "state_record.h"
#define XXH_INLINE_ALL
#include <xxhash.h>

static size_t le(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
    return (size_t)n;
}

/* A BUFFER entry: id 7 in slab 3, name, with an event and user bytes. */
static size_t buffer_entry(uint8_t *p, const char *name, uint16_t name_len, uint8_t flags) {
    size_t n = 0;
    p[n++] = GD_SE_BUFFER;
    const uint64_t u64s[9] = {7, 3, 4096, 8192, 5000, 11, 8192, 12, 0};
    for (int i = 0; i < 9; i++)
        n += le(p + n, u64s[i], 8);
    n += le(p + n, 1000, 4);                  /* owner uid */
    n += le(p + n, 0, 4);                     /* lease ttl */
    n += le(p + n, GPUBUF_STATE_SEALED, 4);   /* state */
    p[n++] = flags;
    n += le(p + n, name_len, 2);
    n += le(p + n, 3, 2); /* user bytes */
    n += le(p + n, 0, 2); /* layout */
    memcpy(p + n, name, name_len);
    n += name_len;
    if (flags & 2) {
        memset(p + n, 0xee, GD_EVENT_HANDLE_SIZE);
        n += GD_EVENT_HANDLE_SIZE;
    }
    memcpy(p + n, "abc", 3);
    return n + 3;
}

static size_t ref_entry(uint8_t *p) {
    size_t n = 0;
    p[n++] = GD_SE_REF;
    n += le(p + n, 11, 8);
    n += le(p + n, 7, 8);
    n += le(p + n, 2, 4);
    n += le(p + n, 1, 4);
    return n;
}

static void free_recs(Gpubuf__StateRecord **r, size_t n) {
    for (size_t i = 0; i < n; i++)
        gpubuf__state_record__free_unpacked(r[i], NULL);
    free(r);
}

START_TEST(entries_decode_to_their_records) {
    uint8_t g[1024];
    size_t n = buffer_entry(g, "a/b", 3, 2);
    n += ref_entry(g + n);
    g[n++] = GD_SE_BUFFER_GONE;
    n += le(g + n, 7, 8);
    g[n++] = GD_SE_BUFFER_STATE;
    n += le(g + n, 9, 8);
    n += le(g + n, GPUBUF_STATE_DELETED, 4);
    Gpubuf__StateRecord **r;
    size_t k;
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), 0);
    ck_assert_uint_eq(k, 4);
    ck_assert_int_eq(r[3]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER_STATE);
    ck_assert_uint_eq(r[3]->buffer_state->id, 9);
    ck_assert_uint_eq(r[3]->buffer_state->state, GPUBUF_STATE_DELETED);
    free_recs(r, k);
    ck_assert_int_eq(gd_se_decode(g, n - 1, &r, &k), -EINVAL); /* cut in its state */
    ck_assert_int_eq(gd_se_decode(g, n - 13, &r, &k), 0);      /* without it */
    ck_assert_uint_eq(k, 3);
    free_recs(r, k);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), 0);
    ck_assert_int_eq(r[0]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER);
    const Gpubuf__StateBuffer *b = r[0]->buffer;
    ck_assert_uint_eq(b->id, 7);
    ck_assert_uint_eq(b->slab_id, 3);
    ck_assert_uint_eq(b->offset, 4096);
    ck_assert_uint_eq(b->block_size, 8192);
    ck_assert_uint_eq(b->size, 5000);
    ck_assert_uint_eq(b->owner_session, 11);
    ck_assert_uint_eq(b->event_session, 12);
    ck_assert_uint_eq(b->owner_uid, 1000);
    ck_assert_uint_eq(b->state, GPUBUF_STATE_SEALED);
    ck_assert_str_eq(b->name, "a/b");
    ck_assert_uint_eq(b->event.len, GD_EVENT_HANDLE_SIZE);
    ck_assert_uint_eq(b->user_data.len, 3);
    ck_assert_mem_eq(b->user_data.data, "abc", 3);
    ck_assert_ptr_null(b->layout);
    ck_assert_int_eq(r[1]->rec_case, GPUBUF__STATE_RECORD__REC_REF);
    ck_assert_uint_eq(r[1]->ref->session, 11);
    ck_assert_uint_eq(r[1]->ref->buffer, 7);
    ck_assert_uint_eq(r[1]->ref->count, 2);
    ck_assert_uint_eq(r[1]->ref->read_only, 1);
    ck_assert_int_eq(r[2]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER_GONE);
    ck_assert_uint_eq(r[2]->buffer_gone, 7);
    free_recs(r, k);
}
END_TEST

START_TEST(a_group_cut_anywhere_is_refused_whole) {
    uint8_t g[1024];
    size_t n = ref_entry(g);
    n += buffer_entry(g + n, "name", 4, 2);
    n += ref_entry(g + n);
    for (size_t cut = 1; cut < n; cut++) {
        Gpubuf__StateRecord **r = (void *)1;
        size_t k = 99;
        int e = gd_se_decode(g, cut, &r, &k);
        if (cut == 25 || cut == n - 25) { /* whole entries: fine */
            ck_assert_int_eq(e, 0);
            free_recs(r, k);
            continue;
        }
        ck_assert_msg(e == -EINVAL, "cut at %zu: %d", cut, e);
        ck_assert_ptr_null(r);
        ck_assert_uint_eq(k, 0);
    }
}
END_TEST

START_TEST(bad_entries_are_refused) {
    uint8_t g[2048];
    Gpubuf__StateRecord **r;
    size_t k, n;
    char longname[300];
    memset(longname, 'x', sizeof(longname));
    /* An unknown kind after a good entry: nothing of the group. */
    n = ref_entry(g);
    g[n++] = 0x7f;
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    /* A name longer than a name can be, or holding a NUL. */
    n = buffer_entry(g, longname, 256, 0);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    n = buffer_entry(g, "a\0b", 3, 0);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    /* Flags it does not know; a layout length without the layout flag. */
    n = buffer_entry(g, "a", 1, 0x80);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    n = buffer_entry(g, "a", 1, 0);
    g[1 + 72 + 12 + 1 + 4] = 5; /* layout_len = 5 */
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    /* A layout that is no ArrayLayout. */
    n = buffer_entry(g, "a", 1, 4);
    g[1 + 72 + 12 + 1 + 4] = 3;
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    /* A protobuf record longer than the group, and one that is no record. */
    g[0] = GD_SE_RECORD;
    le(g + 1, 1000, 4);
    ck_assert_int_eq(gd_se_decode(g, 40, &r, &k), -EINVAL);
    le(g + 1, 4, 4);
    memset(g + 5, 0xff, 4);
    ck_assert_int_eq(gd_se_decode(g, 9, &r, &k), -EINVAL);
    /* Nothing at all is a group of nothing. */
    ck_assert_int_eq(gd_se_decode(g, 0, &r, &k), 0);
    ck_assert_uint_eq(k, 0);
    free(r);
}
END_TEST

START_TEST(frames_of_another_generation_fail) {
    uint8_t rec[64], a[80], b[80];
    memset(rec, 0x42, sizeof(rec));
    gd_state_frame_v2(a, 5, rec, sizeof(rec));
    gd_state_frame_v2(b, 6, rec, sizeof(rec));
    ck_assert_mem_eq(a, b, 4); /* the same length */
    ck_assert_int_ne(memcmp(a + 4, b + 4, 4), 0);
    ck_assert_uint_ne(gd_se_checksum(5, rec, 63), gd_se_checksum(5, rec, 64));
}
END_TEST

/* A frame's checksum is XXH3 whichever code computes it: libxxhash's
 * dispatcher (frames over 240 bytes, the widest vector unit of the CPU) and
 * the inline code agree, at every length around the switch and far past it,
 * so a state written on one CPU reads on another. */
START_TEST(long_frames_hash_as_the_inline_code) {
    enum { MAX = 70000 };
    uint8_t *p = malloc(MAX);
    ck_assert_ptr_nonnull(p);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < MAX; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[i] = (uint8_t)x;
    }
    for (uint32_t n = 0; n < MAX; n = n < 600 ? n + 1 : n * 3 / 2 + 7) {
        for (uint64_t gen = 1; gen < 1u << 20; gen <<= 7) {
            uint32_t len = n;
            const uint8_t *q = p + (MAX - len) % 13; /* unaligned too */
            XXH64_hash_t want = XXH3_64bits_withSeed(q, len, gen ^ ((uint64_t)len << 40));
            ck_assert_msg(gd_se_checksum(gen, q, len) == (uint32_t)(want ^ (want >> 32)),
                          "length %u, generation %llu", len, (unsigned long long)gen);
        }
    }
    free(p);
}
END_TEST

/* What the writer of version 3 makes decodes to what it was given: a
 * buffer with every optional field and its owner's reference, one without,
 * runs of references (one per session while the next is the same
 * session's, none across groups), a last reference gone with its buffer. */
START_TEST(version_3_entries_round_trip) {
    gd_slab slab;
    gd_buf b, plain;
    memset(&slab, 0, sizeof(slab));
    memset(&b, 0, sizeof(b));
    slab.id = 3;
    b.id = 7;
    b.blk.slab = &slab;
    b.blk.offset = 4096;
    b.blk.size = 8192;
    b.size = 5000;
    b.state = GPUBUF_STATE_SEALED;
    b.owner_uid = 1000;
    b.owner_holder = 11;
    b.charged = 8192;
    b.restored = true;
    b.has_event = true;
    b.event_holder = 12;
    memset(b.event, 0xee, sizeof(b.event));
    b.lease_slot = 1;
    b.lease_expires_ns = 123456789;
    b.lease_ttl_ms = 5000;
    char name[] = "a/b";
    b.name = name;
    gd_meta *m = calloc(1, sizeof(*m) + 2 * sizeof(int64_t) + 3);
    ck_assert_ptr_nonnull(m);
    m->dtype = (gpubuf_dtype){.code = 2, .bits = 32, .lanes = 1};
    m->ndim = 2;
    m->has_layout = true;
    m->dims[0] = 10;
    m->dims[1] = 100;
    m->user_len = 3;
    memcpy(m->dims + 2, "abc", 3);
    b.meta = m;
    plain = b;
    plain.id = 8;
    plain.name = NULL;
    plain.meta = NULL;
    plain.has_event = plain.restored = false;
    plain.lease_slot = 0;

    gd_obuf o;
    memset(&o, 0, sizeof(o));
    const uint32_t ref[2] = {2, 1};
    gd_se_buffer(&o, &b, ref);
    gd_se_buffer(&o, &plain, NULL);
    gd_se_ref(&o, 11, 8, 1, 0);
    gd_se_ref(&o, 11, 9, 3, 0); /* the same run */
    gd_se_ref(&o, 12, 8, 1, 1); /* a new one */
    gd_se_ref_gone(&o, 12, 9);
    gd_se_ref(&o, 12, 10, 4, 0); /* after another entry: a new run */
    size_t before = o.len;
    ck_assert_uint_eq(gd_group_open(&o), before);
    gd_se_ref(&o, 12, 11, 5, 0); /* another group: a new run */
    ck_assert(!o.oom);

    Gpubuf__StateRecord **r;
    size_t k;
    ck_assert_int_eq(gd_se_decode(o.p, before, &r, &k), 0);
    ck_assert_uint_eq(k, 9);
    ck_assert_int_eq(r[0]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER);
    const Gpubuf__StateBuffer *d = r[0]->buffer;
    ck_assert_uint_eq(d->id, 7);
    ck_assert_uint_eq(d->slab_id, 3);
    ck_assert_uint_eq(d->offset, 4096);
    ck_assert_uint_eq(d->block_size, 8192);
    ck_assert_uint_eq(d->size, 5000);
    ck_assert_uint_eq(d->owner_session, 11);
    ck_assert_uint_eq(d->charged, 8192);
    ck_assert_uint_eq(d->event_session, 12);
    ck_assert_uint_eq(d->lease_expires_ns, 123456789);
    ck_assert_uint_eq(d->lease_ttl_ms, 5000);
    ck_assert_uint_eq(d->owner_uid, 1000);
    ck_assert_uint_eq(d->state, GPUBUF_STATE_SEALED);
    ck_assert(d->restored);
    ck_assert_str_eq(d->name, "a/b");
    ck_assert_uint_eq(d->event.len, GD_EVENT_HANDLE_SIZE);
    ck_assert_uint_eq(d->event.data[63], 0xee);
    ck_assert_ptr_nonnull(d->layout);
    ck_assert_uint_eq(d->layout->n_shape, 2);
    ck_assert_int_eq(d->layout->shape[1], 100);
    ck_assert_uint_eq(d->user_data.len, 3);
    ck_assert_mem_eq(d->user_data.data, "abc", 3);
    /* its owner's reference, said with it */
    ck_assert_int_eq(r[1]->rec_case, GPUBUF__STATE_RECORD__REC_REF);
    ck_assert_uint_eq(r[1]->ref->session, 11);
    ck_assert_uint_eq(r[1]->ref->buffer, 7);
    ck_assert_uint_eq(r[1]->ref->count, 2);
    ck_assert_uint_eq(r[1]->ref->read_only, 1);
    d = r[2]->buffer;
    ck_assert_int_eq(r[2]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER);
    ck_assert_uint_eq(d->id, 8);
    ck_assert_uint_eq(d->event_session, 0);
    ck_assert_uint_eq(d->lease_expires_ns, 0);
    ck_assert_uint_eq(d->lease_ttl_ms, 0);
    ck_assert(!d->restored);
    ck_assert_uint_eq(d->event.len, 0);
    ck_assert_ptr_null(d->layout);
    const uint64_t want[6][4] = {{11, 8, 1, 0}, {11, 9, 3, 0}, {12, 8, 1, 1},
                                 {12, 9, 0, 0}, {0},           {12, 10, 4, 0}};
    for (int i = 0; i < 6; i++) {
        if (i == 4) {
            ck_assert_int_eq(r[3 + i]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER_GONE);
            ck_assert_uint_eq(r[3 + i]->buffer_gone, 9);
            continue;
        }
        ck_assert_int_eq(r[3 + i]->rec_case, GPUBUF__STATE_RECORD__REC_REF);
        ck_assert_uint_eq(r[3 + i]->ref->session, want[i][0]);
        ck_assert_uint_eq(r[3 + i]->ref->buffer, want[i][1]);
        ck_assert_uint_eq(r[3 + i]->ref->count, want[i][2]);
        ck_assert_uint_eq(r[3 + i]->ref->read_only, want[i][3]);
    }
    free_recs(r, k);
    /* The runs: 11's two references in one entry, then 12's, then 12's
     * again after the REF_GONE; the next group's is its own. */
    size_t at = before - GD_SE_RUN_HEAD - GD_SE_RUN_ITEM;
    ck_assert_uint_eq(o.p[at], GD_SE_REFS);
    ck_assert_uint_eq(o.p[at - 17], GD_SE_REF_GONE);
    ck_assert_uint_eq(o.p[at - 17 - GD_SE_RUN_HEAD - GD_SE_RUN_ITEM], GD_SE_REFS);
    at -= 17 + 2 * GD_SE_RUN_HEAD + 3 * GD_SE_RUN_ITEM;
    ck_assert_uint_eq(o.p[at], GD_SE_REFS);
    ck_assert_uint_eq(gd_state_get32(o.p + at + 9), 2);
    ck_assert_uint_eq(o.p[before + 9], GD_SE_REFS);
    ck_assert_uint_eq(o.len, before + 9 + GD_SE_RUN_HEAD + GD_SE_RUN_ITEM);
    free(o.p);
    free(m);
}
END_TEST

/* Runs and compact buffers a hostile state gives: refused whole. */
START_TEST(bad_version_3_entries_are_refused) {
    uint8_t g[256];
    Gpubuf__StateRecord **r;
    size_t k, n = 0;
    /* A run of no reference, and one longer than what is left. */
    g[n++] = GD_SE_REFS;
    n += le(g + n, 11, 8);
    n += le(g + n, 0, 4);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    le(g + 9, 2, 4);
    n += le(g + n, 7, 8);
    n += le(g + n, 1, 4);
    n += le(g + n, 0, 4);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    le(g + 9, 1, 4);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), 0);
    ck_assert_uint_eq(k, 1);
    free_recs(r, k);
    le(g + 9, 0x40000000, 4); /* n * 16 wraps in 32 bits */
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    /* A REF_GONE cut short. */
    g[0] = GD_SE_REF_GONE;
    ck_assert_int_eq(gd_se_decode(g, 12, &r, &k), -EINVAL);
    ck_assert_int_eq(gd_se_decode(g, 17, &r, &k), 0);
    ck_assert_uint_eq(k, 2);
    free_recs(r, k);
    /* A version 2 buffer with a flag of version 3; a compact one with a flag
     * no version has, or cut in its optional fields. */
    n = buffer_entry(g, "a", 1, 8);
    ck_assert_int_eq(gd_se_decode(g, n, &r, &k), -EINVAL);
    gd_slab slab = {.id = 1};
    gd_buf b;
    memset(&b, 0, sizeof(b));
    b.id = 2;
    b.blk.slab = &slab;
    b.lease_slot = 1;
    gd_obuf o;
    memset(&o, 0, sizeof(o));
    const uint32_t ref[2] = {1, 0};
    gd_se_buffer(&o, &b, ref);
    ck_assert_int_eq(gd_se_decode(o.p, o.len, &r, &k), 0);
    ck_assert_uint_eq(k, 2);
    free_recs(r, k);
    for (size_t cut = 1; cut < o.len; cut++)
        ck_assert_int_eq(gd_se_decode(o.p, cut, &r, &k), -EINVAL);
    o.p[1 + 7 * 8 + 2 * 4] |= 0x20;
    ck_assert_int_eq(gd_se_decode(o.p, o.len, &r, &k), -EINVAL);
    free(o.p);
}
END_TEST

/* Buffer entries ahead of the checks below: plain buffers of one owner,
 * sizes and state as an anonymous batch makes them. */
static void plain_buf(gd_buf *b, gd_slab *slab, uint64_t id, uint64_t size) {
    memset(b, 0, sizeof(*b));
    b->id = id;
    b->blk.slab = slab;
    b->blk.offset = id * 4096;
    b->blk.size = 4096;
    b->size = size;
    b->state = GPUBUF_STATE_SEALED;
    b->owner_uid = 1000;
    b->owner_holder = 11;
    b->charged = 4096;
}

/* The runs of version 4 as the writer makes them: plain buffers alike in
 * one BUFFERS entry (24 bytes each after the first), a new run where any
 * shared field differs, after another entry, and in another group; each
 * decodes to the records a BUFFER3 entry of its own would. */
START_TEST(version_4_runs_round_trip) {
    gd_slab slab;
    memset(&slab, 0, sizeof(slab));
    slab.id = 3;
    gd_buf b[6];
    for (int i = 0; i < 6; i++)
        plain_buf(&b[i], &slab, 20 + (uint64_t)i, 4000);
    b[3].size = 100; /* another size: another run */
    b[4].restored = true;
    gd_obuf o;
    memset(&o, 0, sizeof(o));
    size_t g = gd_group_open(&o) + 9;
    const uint32_t ref[2] = {1, 0};
    for (int i = 0; i < 3; i++)
        gd_se_buffer(&o, &b[i], ref);
    ck_assert_uint_eq(o.len, g + GD_SE_BRUN_HEAD + 3 * GD_SE_BRUN_ITEM);
    ck_assert_uint_eq(o.p[g], GD_SE_BUFFERS);
    ck_assert_uint_eq(gd_state_get32(o.p + g + GD_SE_BRUN_N), 3);
    gd_se_buffer(&o, &b[3], ref);  /* another size */
    gd_se_buffer(&o, &b[4], NULL); /* restored, without the owner's reference */
    ck_assert_uint_eq(o.len, g + 3 * GD_SE_BRUN_HEAD + 5 * GD_SE_BRUN_ITEM);
    gd_se_buffer_state(&o, 20, GPUBUF_STATE_DELETED);
    b[5].restored = true;
    gd_se_buffer(&o, &b[5], NULL); /* like b[4], after another entry */
    ck_assert_uint_eq(o.len, g + 4 * GD_SE_BRUN_HEAD + 6 * GD_SE_BRUN_ITEM + 13);
    ck_assert(!o.oom);

    Gpubuf__StateRecord **r;
    size_t k;
    ck_assert_int_eq(gd_se_decode(o.p + g, o.len - g, &r, &k), 0);
    ck_assert_uint_eq(k, 6 + 4 + 1); /* 6 buffers, 4 with their owner's reference, a state */
    size_t i = 0;
    for (int j = 0; j < 6; j++) {
        if (j == 5) {
            ck_assert_int_eq(r[i]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER_STATE);
            ck_assert_uint_eq(r[i++]->buffer_state->id, 20);
        }
        ck_assert_int_eq(r[i]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER);
        const Gpubuf__StateBuffer *d = r[i++]->buffer;
        ck_assert_uint_eq(d->id, b[j].id);
        ck_assert_uint_eq(d->slab_id, 3);
        ck_assert_uint_eq(d->offset, b[j].blk.offset);
        ck_assert_uint_eq(d->block_size, 4096);
        ck_assert_uint_eq(d->size, b[j].size);
        ck_assert_uint_eq(d->owner_session, 11);
        ck_assert_uint_eq(d->charged, 4096);
        ck_assert_uint_eq(d->owner_uid, 1000);
        ck_assert_uint_eq(d->state, GPUBUF_STATE_SEALED);
        ck_assert(d->restored == (j >= 4));
        ck_assert_str_eq(d->name, "");
        ck_assert_ptr_null(d->layout);
        if (j >= 4)
            continue;
        ck_assert_int_eq(r[i]->rec_case, GPUBUF__STATE_RECORD__REC_REF);
        ck_assert_uint_eq(r[i]->ref->session, 11);
        ck_assert_uint_eq(r[i]->ref->buffer, b[j].id);
        ck_assert_uint_eq(r[i]->ref->count, 1);
        ck_assert_uint_eq(r[i++]->ref->read_only, 0);
    }
    ck_assert_uint_eq(i, k);
    free_recs(r, k);
    /* No run goes on into the next group, nor into the group opened after
     * the stage was emptied (state.c, commit). */
    size_t next = o.len;
    gd_group_open(&o);
    gd_se_buffer(&o, &b[5], NULL);
    ck_assert_uint_eq(o.len, next + 9 + GD_SE_BRUN_HEAD + GD_SE_BRUN_ITEM);
    o.len = 0;
    gd_group_open(&o);
    gd_se_buffer(&o, &b[5], NULL);
    ck_assert_uint_eq(o.len, 9 + GD_SE_BRUN_HEAD + GD_SE_BRUN_ITEM);
    ck_assert_uint_eq(o.p[9], GD_SE_BUFFERS);
    /* Nor into bytes of the next group that look like the run where it
     * ended (as another writer's would): a run goes on only as written in
     * its own group. */
    size_t end = o.len;
    o.len = 0;
    gd_group_open(&o);
    o.len = end; /* the same bytes again, not written as a run */
    gd_se_buffer(&o, &b[5], NULL);
    ck_assert_uint_eq(o.len, end + GD_SE_BRUN_HEAD + GD_SE_BRUN_ITEM);
    free(o.p);
}
END_TEST

/* Every field a run's head says parts two buffers that differ in it
 * alone, and says it: the second buffer's record has its own value. */
START_TEST(a_run_parts_at_every_shared_field) {
    gd_slab slab = {.id = 3};
    for (int f = 0; f < 10; f++) {
        gd_buf x, y;
        plain_buf(&x, &slab, 5, 100);
        plain_buf(&y, &slab, 6, 100);
        uint32_t rx[2] = {1, 0}, ry[2] = {1, 0};
        const uint32_t *py = ry;
        switch (f) {
        case 0: y.owner_holder = 12; break;
        case 1: y.size = 101; break;
        case 2: y.blk.size = 8192; break;
        case 3: y.charged = 8192; break;
        case 4: y.owner_uid = 1001; break;
        case 5: y.state = GPUBUF_STATE_ALLOCATED; break;
        case 6: ry[0] = 2; break;
        case 7: ry[1] = 1; break;
        case 8: y.restored = true; break;
        default: py = NULL; break; /* no owner's reference */
        }
        gd_obuf o;
        memset(&o, 0, sizeof(o));
        size_t g = gd_group_open(&o) + 9;
        gd_se_buffer(&o, &x, rx);
        gd_se_buffer(&o, &y, py);
        ck_assert_msg(o.len == g + 2 * (GD_SE_BRUN_HEAD + GD_SE_BRUN_ITEM), "field %d", f);
        Gpubuf__StateRecord **r;
        size_t k;
        ck_assert_int_eq(gd_se_decode(o.p + g, o.len - g, &r, &k), 0);
        ck_assert_uint_eq(k, py ? 4 : 3);
        const Gpubuf__StateBuffer *d = r[2]->buffer;
        ck_assert_int_eq(r[2]->rec_case, GPUBUF__STATE_RECORD__REC_BUFFER);
        ck_assert_uint_eq(d->id, 6);
        ck_assert_uint_eq(d->owner_session, y.owner_holder);
        ck_assert_uint_eq(d->size, y.size);
        ck_assert_uint_eq(d->block_size, y.blk.size);
        ck_assert_uint_eq(d->charged, y.charged);
        ck_assert_uint_eq(d->owner_uid, y.owner_uid);
        ck_assert_uint_eq(d->state, (uint32_t)y.state);
        ck_assert(d->restored == y.restored);
        if (py) {
            ck_assert_uint_eq(r[3]->ref->count, ry[0]);
            ck_assert_uint_eq(r[3]->ref->read_only, ry[1]);
        }
        free_recs(r, k);
        free(o.p);
    }
}
END_TEST

/* A run longer than the stage's first allocation (4 KiB: about 170
 * items) grows it and stays one entry. */
START_TEST(a_long_run_grows_the_stage) {
    enum { N = 1000 };
    gd_slab slab = {.id = 3};
    gd_obuf o;
    memset(&o, 0, sizeof(o));
    size_t g = gd_group_open(&o) + 9;
    for (uint64_t id = 1; id <= N; id++) {
        gd_buf b;
        plain_buf(&b, &slab, id, 64);
        gd_se_buffer(&o, &b, NULL);
    }
    ck_assert(!o.oom);
    ck_assert_uint_ge(o.cap, o.len);
    ck_assert_uint_eq(o.len, g + GD_SE_BRUN_HEAD + N * GD_SE_BRUN_ITEM);
    ck_assert_uint_eq(gd_state_get32(o.p + g + GD_SE_BRUN_N), N);
    Gpubuf__StateRecord **r;
    size_t k;
    ck_assert_int_eq(gd_se_decode(o.p + g, o.len - g, &r, &k), 0);
    ck_assert_uint_eq(k, N);
    for (size_t i = 0; i < k; i++) {
        ck_assert_uint_eq(r[i]->buffer->id, i + 1);
        ck_assert_uint_eq(r[i]->buffer->offset, (i + 1) * 4096);
    }
    free_recs(r, k);
    free(o.p);
}
END_TEST

/* Runs of buffers as a hostile state gives them: refused whole. */
START_TEST(bad_version_4_runs_are_refused) {
    gd_slab slab = {.id = 3};
    gd_buf b[2];
    plain_buf(&b[0], &slab, 5, 10);
    plain_buf(&b[1], &slab, 6, 10);
    gd_obuf o;
    memset(&o, 0, sizeof(o));
    gd_group_open(&o);
    const uint32_t ref[2] = {2, 1};
    gd_se_buffer(&o, &b[0], ref);
    gd_se_buffer(&o, &b[1], ref);
    uint8_t *p = o.p + 9;
    size_t n = o.len - 9;
    Gpubuf__StateRecord **r;
    size_t k;
    ck_assert_int_eq(gd_se_decode(p, n, &r, &k), 0);
    ck_assert_uint_eq(k, 4);
    free_recs(r, k);
    for (size_t cut = 1; cut < n; cut++)
        ck_assert_msg(gd_se_decode(p, cut, &r, &k) == -EINVAL, "cut at %zu", cut);
    /* Counts of 0 and more than what is left (wrapping in 32 bits too). */
    const uint32_t bad[] = {0, 3, 0x40000000, 0xaaaaaaab};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gd_state_put32(p + GD_SE_BRUN_N, bad[i]);
        ck_assert_msg(gd_se_decode(p, n, &r, &k) == -EINVAL, "count %u", bad[i]);
    }
    gd_state_put32(p + GD_SE_BRUN_N, 2);
    /* A flag a run of plain buffers has not (an event, a layout, a lease,
     * none at all), and an owner's count without its flag. */
    for (unsigned f = 2; f <= 128; f *= 2) {
        if (f == GD_SE_F_OWNER_REF)
            continue;
        p[GD_SE_BRUN_FLAGS] |= (uint8_t)f;
        ck_assert_msg(gd_se_decode(p, n, &r, &k) == -EINVAL, "flag %u", f);
        p[GD_SE_BRUN_FLAGS] &= (uint8_t)~f;
    }
    p[GD_SE_BRUN_FLAGS] &= (uint8_t)~GD_SE_F_OWNER_REF;
    ck_assert_int_eq(gd_se_decode(p, n, &r, &k), -EINVAL);
    gd_state_put32(p + GD_SE_BRUN_COUNT, 0);
    gd_state_put32(p + GD_SE_BRUN_RO, 0);
    ck_assert_int_eq(gd_se_decode(p, n, &r, &k), 0); /* no reference said: none decoded */
    ck_assert_uint_eq(k, 2);
    free_recs(r, k);
    /* A run of no buffer, whatever follows it: here a whole entry of its
     * own (a buffer's state), which would decode if the run were skipped. */
    uint8_t g[GD_SE_BRUN_HEAD + 13];
    memcpy(g, p, GD_SE_BRUN_HEAD);
    gd_state_put32(g + GD_SE_BRUN_N, 0);
    g[GD_SE_BRUN_HEAD] = GD_SE_BUFFER_STATE;
    gd_state_put32(gd_state_put64(g + GD_SE_BRUN_HEAD + 1, 5), GPUBUF_STATE_DELETED);
    ck_assert_int_eq(gd_se_decode(g + GD_SE_BRUN_HEAD, 13, &r, &k), 0);
    free_recs(r, k);
    ck_assert_int_eq(gd_se_decode(g, sizeof(g), &r, &k), -EINVAL);
    free(o.p);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("state_record");
    TCase *t = add_case(s, "entries", NULL, NULL, 0);
    add_tests(t, entries_decode_to_their_records, a_group_cut_anywhere_is_refused_whole,
              bad_entries_are_refused, frames_of_another_generation_fail,
              long_frames_hash_as_the_inline_code, version_3_entries_round_trip,
              bad_version_3_entries_are_refused, version_4_runs_round_trip,
              a_run_parts_at_every_shared_field, a_long_run_grows_the_stage,
              bad_version_4_runs_are_refused);
    return s;
}

int main(void) {
    return run_suite(suite());
}
