/* The saved state's entries of version 2 (daemon/state_record.c) as a
 * hostile state gives them: every entry decodes to the record it says, and
 * a group cut anywhere, of an unknown kind, with a name too long or holding
 * a NUL, with bad flags or a record longer than what is left, is refused
 * whole (nothing returned, nothing leaked: the sanitizer build checks). */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "saved_state.h"
#include "state.h"
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

static Suite *suite(void) {
    Suite *s = suite_create("state_record");
    TCase *t = add_case(s, "entries", NULL, NULL, 0);
    add_tests(t, entries_decode_to_their_records, a_group_cut_anywhere_is_refused_whole,
              bad_entries_are_refused, frames_of_another_generation_fail,
              long_frames_hash_as_the_inline_code);
    return s;
}

int main(void) {
    return run_suite(suite());
}
