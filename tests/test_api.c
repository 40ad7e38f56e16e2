/* The public API's rules (docs/client-api.md, "Conventions" and "Names"):
 * the deprecated names still link and do what their new names do, every
 * entry checks its arguments with the documented code and sentence, and the
 * status snapshot's _at accessors agree with its arrays. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "harness.h"

static void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=64M,slab=4M", NULL};
    td_start(&D, args);
}

/* A float32 vector of 4 elements: 16 bytes. */
static const gpubuf_layout VEC4 = {
    .dtype = {.code = 2, .bits = 32, .lanes = 1}, .ndim = 1, .shape = {4}};

static void assert_info_eq(const gpubuf_buffer_info *a, const gpubuf_buffer_info *b) {
    ck_assert_uint_eq(a->id, b->id);
    ck_assert_str_eq(a->name, b->name);
    ck_assert_str_eq(a->pool, b->pool);
    ck_assert_uint_eq(a->size, b->size);
    ck_assert_int_eq(a->state, b->state);
    ck_assert_uint_eq(a->refs, b->refs);
    ck_assert_uint_eq(a->owner_uid, b->owner_uid);
}

/* ---- deprecated names ---------------------------------------------------- */

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"

START_TEST(deprecated_aliases_are_the_new_functions) {
    /* The same symbol: a program linked against the old name runs the new code. */
    ck_assert_ptr_eq((void *)gpubuf_alloc_ex, (void *)gpubuf_alloc_with);
    ck_assert_ptr_eq((void *)gpubuf_seal_ex, (void *)gpubuf_seal_sync_with);
    ck_assert_ptr_eq((void *)gpubuf_stat_ex, (void *)gpubuf_stat_meta);
}
END_TEST

START_TEST(deprecated_names_behave_as_the_new_ones) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_meta meta = {.layout = &VEC4, .user_data = "hi", .user_size = 2};
    gpubuf_buffer *old_b, *new_b, *v_old, *v_new;

    /* alloc and seal with metadata, through the old names and the new ones. */
    ck_assert_int_eq(gpubuf_alloc_ex(c, NULL, 16, "api/old", &meta, &old_b), 0);
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 16, "api/new", &meta, &new_b), 0);
    ck_assert_int_eq(gpubuf_seal_ex(old_b, NULL), 0);
    ck_assert_int_eq(gpubuf_seal_sync_with(new_b, NULL), 0);
    ck_assert_int_eq(gpubuf_seal_ex(old_b, NULL), GPUBUF_ESTATE);
    char msg_old[512];
    snprintf(msg_old, sizeof(msg_old), "%s", gpubuf_last_error_message());
    ck_assert_int_eq(gpubuf_seal_sync_with(new_b, NULL), GPUBUF_ESTATE);
    ck_assert_str_eq(gpubuf_last_error_message(), msg_old);

    /* stat: the same answer by either name. */
    gpubuf_buffer_info i_old, i_new;
    static gpubuf_buffer_meta m_old, m_new;
    ck_assert_int_eq(gpubuf_stat_ex(c, "api/old", 0, NULL, &i_old, &m_old), 0);
    ck_assert_int_eq(gpubuf_stat_meta(c, "api/old", 0, NULL, &i_new, &m_new), 0);
    assert_info_eq(&i_old, &i_new);
    ck_assert_int_eq(m_old.has_layout, 1);
    ck_assert_int_eq(m_new.has_layout, 1);
    ck_assert_uint_eq(m_old.layout.shape[0], 4);
    ck_assert_uint_eq(m_new.layout.shape[0], 4);
    ck_assert_uint_eq(m_old.user_size, 2);
    ck_assert_mem_eq(m_old.user_data, m_new.user_data, 2);

    /* open: gpubuf_open_ex(flags, timeout) is gpubuf_open_with({flags, timeout}). */
    gpubuf_lookup ro = {.flags = GPUBUF_OPEN_READONLY};
    ck_assert_int_eq(gpubuf_open_ex(c, "api/new", 0, 0, GPUBUF_OPEN_READONLY, &v_old), 0);
    ck_assert_int_eq(gpubuf_open_with(c, "api/new", 0, &ro, &v_new), 0);
    ck_assert_uint_eq(gpubuf_buffer_id(v_old), gpubuf_buffer_id(v_new));
    ck_assert_int_eq(gpubuf_buffer_read_only(v_old), 1);
    ck_assert_int_eq(gpubuf_buffer_read_only(v_new), 1);
    ck_assert_uint_eq(gpubuf_buffer_size(v_old), gpubuf_buffer_size(v_new));
    ck_assert_ptr_nonnull(gpubuf_buffer_layout(v_old));
    ck_assert_ptr_nonnull(gpubuf_buffer_layout(v_new));

    /* ... by id too, and they fail alike. */
    gpubuf_release(v_old);
    gpubuf_release(v_new);
    uint64_t id = gpubuf_buffer_id(old_b);
    ck_assert_int_eq(gpubuf_open_ex(c, NULL, id, 0, 0, &v_old), 0);
    ck_assert_int_eq(gpubuf_open_with(c, NULL, id, NULL, &v_new), 0);
    ck_assert_uint_eq(gpubuf_buffer_id(v_old), gpubuf_buffer_id(v_new));
    gpubuf_release(v_old);
    gpubuf_release(v_new);
    ck_assert_int_eq(gpubuf_open_ex(c, "api/none", 0, 0, 0, &v_old), -ENOENT);
    snprintf(msg_old, sizeof(msg_old), "%s", gpubuf_last_error_message());
    ck_assert_int_eq(gpubuf_open_with(c, "api/none", 0, NULL, &v_new), -ENOENT);
    ck_assert_str_eq(gpubuf_last_error_message(), msg_old);
    /* gpubuf_open_ex() never took the owner flag: it still refuses it. */
    ck_assert_int_eq(gpubuf_open_ex(c, "api/new", 0, 0, GPUBUF_OPEN_OWNER, &v_old), -EINVAL);
    ck_assert_str_eq(gpubuf_last_error_message(), "unknown open flags 0x2");

    gpubuf_release(old_b);
    gpubuf_release(new_b);
    gpubuf_disconnect(c);
}
END_TEST

#pragma GCC diagnostic pop

/* ---- argument checks ------------------------------------------------------- */

/* call fails with code, the thread's message is msg, and *ret was not written. */
#define ASSERT_REFUSED(call, code, msg)                                                            \
    do {                                                                                           \
        ck_assert_int_eq((call), (code));                                                          \
        ck_assert_str_eq(gpubuf_last_error_message(), (msg));                                      \
    } while (0)

START_TEST(arguments_are_checked_at_every_entry) {
    gpubuf_buffer *const untouched = (gpubuf_buffer *)0x1;
    gpubuf_buffer *b = untouched;
    gpubuf_client *c = (gpubuf_client *)0x1; /* never used: the checks come first */
    gpubuf_buffer_info info;
    gpubuf_status *s = NULL;
    const char *name = "x";
    char buf[4];

    ASSERT_REFUSED(gpubuf_connect(NULL, NULL), -EINVAL,
                   "gpubuf_connect needs a place for the connection");
    ASSERT_REFUSED(gpubuf_open(NULL, "x", 0, &b), -EINVAL,
                   "an open needs a connection and a place for the view");
    ASSERT_REFUSED(gpubuf_open(c, "x", 0, NULL), -EINVAL,
                   "an open needs a connection and a place for the view");
    ASSERT_REFUSED(gpubuf_open(c, NULL, 0, &b), -EINVAL,
                   "gpubuf_open needs a name (gpubuf_open_id opens by id)");
    ASSERT_REFUSED(gpubuf_open_id(NULL, 1, 0, &b), -EINVAL,
                   "an open needs a connection and a place for the view");
    ASSERT_REFUSED(gpubuf_open_with(NULL, "x", 0, NULL, &b), -EINVAL,
                   "an open needs a connection and a place for the view");
    ck_assert_ptr_eq(b, untouched);
    ASSERT_REFUSED(gpubuf_alloc(NULL, NULL, 16, NULL, &b), -EINVAL,
                   "gpubuf_alloc needs a connection and a place for the view");
    ASSERT_REFUSED(gpubuf_alloc(c, NULL, 0, NULL, &b), -EINVAL,
                   "size 0: a buffer holds at least 1 byte");
    ASSERT_REFUSED(gpubuf_alloc_with(NULL, NULL, 16, NULL, NULL, &b), -EINVAL,
                   "gpubuf_alloc_with needs a connection and a place for the view");
    ck_assert_ptr_eq(b, untouched);
    ASSERT_REFUSED(gpubuf_seal(NULL), -EINVAL, "no buffer given (NULL) to seal");
    ASSERT_REFUSED(gpubuf_seal_sync(NULL), -EINVAL, "no buffer given (NULL) to seal");
    ASSERT_REFUSED(gpubuf_seal_stream(NULL, NULL), -EINVAL, "no buffer given (NULL) to seal");
    ASSERT_REFUSED(gpubuf_seal_sync_with(NULL, NULL), -EINVAL, "no buffer given (NULL) to seal");
    ASSERT_REFUSED(gpubuf_flush(NULL), -EINVAL, "gpubuf_flush needs a connection");
    ASSERT_REFUSED(gpubuf_delete(NULL, "x"), -EINVAL, "a delete needs a connection");
    ASSERT_REFUSED(gpubuf_delete(c, NULL), -EINVAL,
                   "gpubuf_delete needs a name (gpubuf_delete_id deletes by id)");
    ASSERT_REFUSED(gpubuf_delete_id(NULL, 1), -EINVAL, "a delete needs a connection");
    ASSERT_REFUSED(gpubuf_delete_with(NULL, "x", 0, NULL), -EINVAL, "a delete needs a connection");
    ASSERT_REFUSED(gpubuf_stat(NULL, "x", &info), -EINVAL,
                   "a stat needs a connection and a place for the answer");
    ASSERT_REFUSED(gpubuf_stat(c, NULL, &info), -EINVAL, "gpubuf_stat needs a name");
    ASSERT_REFUSED(gpubuf_stat_with(c, "x", 0, NULL, NULL), -EINVAL,
                   "a stat needs a connection and a place for the answer");
    ASSERT_REFUSED(gpubuf_stat_meta(NULL, "x", 0, NULL, &info, NULL), -EINVAL,
                   "a stat needs a connection and a place for the answer");
    ASSERT_REFUSED(gpubuf_renew(NULL, "x", 0, 0), -EINVAL, "gpubuf_renew needs a connection");
    ASSERT_REFUSED(gpubuf_status_get(NULL, &s), -EINVAL,
                   "gpubuf_status_get needs a connection and a place for the snapshot");
    ck_assert_ptr_null(s);
    ASSERT_REFUSED(gpubuf_set_device(NULL, -1), -EINVAL,
                   "device must be -1 or a CUDA ordinal below 64");
    ASSERT_REFUSED(gpubuf_set_device(c, 64), -EINVAL,
                   "device must be -1 or a CUDA ordinal below 64");
    ASSERT_REFUSED(gpubuf_set_reconnect(NULL, 0), -EINVAL,
                   "gpubuf_set_reconnect needs a connection");
    ASSERT_REFUSED(gpubuf_set_reconnect(c, -1), -EINVAL, "reconnect time must be 0 or more ms");
    ASSERT_REFUSED(gpubuf_buffer_slice(NULL, 0, 0, &b), -EINVAL,
                   "a slice needs a view and a place for the slice");
    ASSERT_REFUSED(gpubuf_buffer_copy_to_host(NULL, 0, buf, 4), -EINVAL,
                   "no view given (NULL) to copy");
    ASSERT_REFUSED(gpubuf_buffer_copy_from_host(NULL, 0, buf, 4), -EINVAL,
                   "no view given (NULL) to copy");
    ASSERT_REFUSED(gpubuf_buffer_copy(NULL, 0, NULL, 0, 4, NULL), -EINVAL,
                   "a copy needs two views (dst and src)");
    ASSERT_REFUSED(gpubuf_buffer_wait(NULL, NULL), -EINVAL, "no view given (NULL) to wait for");
    ASSERT_REFUSED(gpubuf_open_many(NULL, 1, &name, NULL, 0, &b, NULL), -EINVAL,
                   "gpubuf_open_many needs a connection and its items");
    ASSERT_REFUSED(gpubuf_open_many(c, 1, NULL, NULL, 0, &b, NULL), -EINVAL,
                   "gpubuf_open_many needs names or ids");
    ASSERT_REFUSED(gpubuf_open_many(c, 1, &name, NULL, 0x80, &b, NULL), -EINVAL,
                   "unknown open flags 0x80");
    ASSERT_REFUSED(gpubuf_alloc_many(c, NULL, 1, NULL, NULL, 0, &b, NULL), -EINVAL,
                   "gpubuf_alloc_many needs sizes");
    ASSERT_REFUSED(gpubuf_seal_many(NULL, 1, NULL), -EINVAL, "gpubuf_seal_many needs buffers");
    ASSERT_REFUSED(gpubuf_delete_many(NULL, 1, &name, NULL, NULL), -EINVAL,
                   "gpubuf_delete_many needs a connection and its items");
    ASSERT_REFUSED(gpubuf_layout_check(NULL, 16), -EINVAL, "no layout given (NULL)");
    ASSERT_REFUSED(gpubuf_status_buffer_at(NULL, 0, NULL), -EINVAL,
                   "gpubuf_status_buffer_at needs a snapshot and a place for the entry");
    ck_assert_ptr_eq(b, untouched);

    /* A call that succeeds leaves "" behind it. */
    ck_assert_int_eq(gpubuf_layout_check(&VEC4, 16), 0);
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    /* Destructors accept NULL and succeed. */
    ck_assert_int_eq(gpubuf_release(NULL), 0);
    ck_assert_int_eq(gpubuf_release_many(NULL, 3, NULL), 0);
    ck_assert_ptr_null(gpubuf_disconnect(NULL));
    ck_assert_ptr_null(gpubuf_status_free(NULL));
}
END_TEST

/* ---- status entries -------------------------------------------------------- */

START_TEST(status_entries_agree_with_the_arrays) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_meta meta = {.layout = &VEC4};
    gpubuf_buffer *a, *b;
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 16, "api/a", &meta, &a), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 100, "api/b", &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);

    gpubuf_status *s;
    ck_assert_int_eq(gpubuf_status_get(c, &s), 0);
    ck_assert_uint_ge(s->n_buffers, 2);
    for (size_t i = 0; i < s->n_buffers; i++) {
        gpubuf_status_buffer_item it;
        ck_assert_int_eq(gpubuf_status_buffer_at(s, i, &it), 0);
        ck_assert_uint_eq(it.buffer.id, s->buffers[i].id);
        ck_assert_str_eq(it.buffer.name, s->buffers[i].name);
        ck_assert_uint_eq(it.buffer.size, s->buffers[i].size);
        ck_assert_int_eq(it.restored, s->buffer_restored ? s->buffer_restored[i] : 0);
        ck_assert_int_eq(it.meta.has_layout, s->buffer_meta[i].has_layout);
        ck_assert_uint_eq(it.meta.ndim, s->buffer_meta[i].ndim);
        if (strcmp(it.buffer.name, "api/a") == 0) {
            ck_assert_int_eq(it.meta.has_layout, 1);
            ck_assert_int_eq(it.meta.shape[0], 4);
        }
    }
    for (size_t i = 0; i < s->n_pools; i++) {
        gpubuf_status_pool_item it;
        ck_assert_int_eq(gpubuf_status_pool_at(s, i, &it), 0);
        ck_assert_str_eq(it.pool.name, s->pools[i].name);
        ck_assert_str_eq(it.publishers, s->pool_publishers[i]);
        ck_assert_int_eq(it.is_default, strcmp(s->pools[i].name, s->default_pool) == 0);
    }
    gpubuf_status_pool_item p;
    ck_assert_int_eq(gpubuf_status_pool_at(s, 0, &p), 0);
    ck_assert_str_eq(p.pool.name, "host");
    ck_assert_int_eq(p.is_default, 1);
    for (size_t i = 0; i < s->n_clients; i++) {
        gpubuf_status_client_item it;
        ck_assert_int_eq(gpubuf_status_client_at(s, i, &it), 0);
        ck_assert_uint_eq(it.client.session_id, s->clients[i].session_id);
        ck_assert_int_eq(it.detached, s->client_detached ? s->client_detached[i] : 0);
    }

    /* Past the end: GPUBUF_ERANGE, with a sentence that says so. */
    gpubuf_status_client_item ci;
    char want[128];
    snprintf(want, sizeof(want), "no client %zu in a snapshot of %zu", s->n_clients, s->n_clients);
    ck_assert_int_eq(gpubuf_status_client_at(s, s->n_clients, &ci), GPUBUF_ERANGE);
    ck_assert_str_eq(gpubuf_last_error_message(), want);

    gpubuf_status_free(s);
    gpubuf_release(a);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("api");
    TCase *plain = tcase_create("checks");
    tcase_add_test(plain, deprecated_aliases_are_the_new_functions);
    tcase_add_test(plain, arguments_are_checked_at_every_entry);
    suite_add_tcase(s, plain);
    TCase *t = tcase_create("daemon");
    tcase_add_checked_fixture(t, start_default, td_stop_clean);
    tcase_set_timeout(t, 60);
    tcase_add_test(t, deprecated_names_behave_as_the_new_ones);
    tcase_add_test(t, status_entries_agree_with_the_arrays);
    suite_add_tcase(s, t);
    return run_suite(s);
}
