/* libgpubuf-client: array layouts, user bytes and leases of buffers: the
 * requests that set, renew and read them (stat), over lifecycle.c. What views
 * and status snapshots carry of them is meta_view.c's, below lifecycle.c. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "layout.h"

/* ---- checks ----------------------------------------------------------------- */

static int layout_check(const gpubuf_layout *l, uint64_t size) {
    char msg[256];
    int r = gpubuf_layout_validate(l, size, msg, sizeof(msg));
    if (r < 0)
        gpubuf__set_error("%s", msg);
    return r;
}

GPUBUF_EXTERN int gpubuf_layout_check(const gpubuf_layout *layout, uint64_t size) {
    gpubuf__clear_error();
    GPUBUF_CHECK(layout, -EINVAL, "no layout given (NULL)");
    int r = layout_check(layout, size);
    return gpubuf__result(r);
}

/* What the daemon would refuse of meta for a buffer of size bytes (0: not
 * known here, as at seal), checked before a round trip. */
static int meta_check(const gpubuf_meta *meta, uint64_t size) {
    int r;
    if (meta->user_size > GPUBUF_USER_DATA_MAX)
        return gpubuf__fail(-EINVAL, "%zu user bytes: a buffer carries at most %d",
                            meta->user_size, GPUBUF_USER_DATA_MAX);
    if (meta->user_size && !meta->user_data)
        return gpubuf__fail(-EINVAL, "user_size is %zu but user_data is NULL", meta->user_size);
    if (meta->layout && (r = layout_check(meta->layout, size)) < 0)
        return r;
    return 0;
}

/* ---- requests ------------------------------------------------------------- */

/* meta as the fields of an alloc or seal request; wl holds the layout. */
static void meta_to_wire(const gpubuf_meta *meta, Gpubuf__ArrayLayout *wl,
                         Gpubuf__ArrayLayout **ret_layout, ProtobufCBinaryData *ret_user,
                         uint64_t *ret_ttl) {
    if (meta->layout) {
        gpubuf_layout_to_wire(meta->layout, wl);
        *ret_layout = wl;
    }
    ret_user->data = (uint8_t *)meta->user_data;
    ret_user->len = meta->user_size;
    *ret_ttl = meta->ttl_ms;
}

static int alloc_with_call(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                           const gpubuf_meta *meta, gpubuf_buffer **ret) {
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    Gpubuf__ArrayLayout wl;
    int r;
    lookup l;
    if (name && *name) { /* "/POOL/NAME" names the pool too, as in gpubuf_alloc() */
        gpubuf_lookup o = {.pool = pool};
        if ((r = gpubuf__lookup_make("alloc", name, 0, &o, 0, &l)) < 0)
            return r;
        pool = l.pool;
        name = l.name;
    }
    if (meta && (r = meta_check(meta, size)) < 0)
        return r;
    a.pool = (char *)(pool ? pool : "");
    a.size = size;
    a.name = (char *)(name ? name : "");
    if (meta)
        meta_to_wire(meta, &wl, &a.layout, &a.user_data, &a.ttl_ms);
    return gpubuf__alloc_request(c, &a, ret);
}

GPUBUF_EXTERN int gpubuf_alloc_with(gpubuf_client *c, const char *pool, uint64_t size,
                                    const char *name, const gpubuf_meta *meta,
                                    gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "%s needs a connection and a place for the view", __func__);
    GPUBUF_CHECK(size > 0, -EINVAL, "size 0: a buffer holds at least 1 byte");
    int r = alloc_with_call(c, pool, size, name, meta, ret);
    return gpubuf__result(r);
}

static int seal_with_call(gpubuf_buffer *b, const gpubuf_meta *meta) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    Gpubuf__ArrayLayout wl;
    Gpubuf__Response *resp;
    gpubuf_client *c;
    int fd, r;
    c = b->c;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__seal_check(&b);
    if (r == 0 && meta)
        r = meta_check(meta, b->size);
    if (r < 0)
        goto out;
    s.buffer_id = b->id;
    if (meta)
        meta_to_wire(meta, &wl, &s.layout, &s.user_data, &s.ttl_ms);
    req.body_case = GPUBUF__REQUEST__BODY_SEAL;
    req.seal = &s;
    r = gpubuf__rpc_locked(c, &req, &resp, &fd);
    if (r < 0)
        goto out;
    if (fd >= 0)
        close(fd);
    b->sealable = false;
    /* The view describes what the daemon now holds. */
    if (resp->body_case == GPUBUF__RESPONSE__BODY_BUFFER) {
        gpubuf__view_meta_free(b);
        r = gpubuf__view_meta(b, resp->buffer);
    }
    gpubuf__resp_free(c, resp);
out:
    pthread_mutex_unlock(&c->lock);
    return r;
}

GPUBUF_EXTERN int gpubuf_seal_sync_with(gpubuf_buffer *b, const gpubuf_meta *meta) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = seal_with_call(b, meta);
    return gpubuf__result(r);
}

static int renew_call(gpubuf_client *c, const char *name, uint64_t id, uint64_t ttl_ms) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__RenewRequest q = GPUBUF__RENEW_REQUEST__INIT;
    Gpubuf__Response *resp;
    Gpubuf__ExpectedOwner *no_owner;
    lookup l;
    int r;
    if ((r = gpubuf__lookup_make("renew", name, id, NULL, 0, &l)) < 0)
        return r;
    q.target_case = gpubuf__lookup_fill(&l, &q.name, &q.buffer_id, &q.pool, &no_owner)
                        ? GPUBUF__RENEW_REQUEST__TARGET_NAME
                        : GPUBUF__RENEW_REQUEST__TARGET_BUFFER_ID;
    q.ttl_ms = ttl_ms;
    req.body_case = GPUBUF__REQUEST__BODY_RENEW;
    req.renew = &q;
    pthread_mutex_lock(&c->lock);
    if ((r = gpubuf__rpc_reply_locked(c, &req, GPUBUF__RESPONSE__BODY_BUFFER, &resp)) == 0)
        gpubuf__resp_free(c, resp);
    pthread_mutex_unlock(&c->lock);
    return r;
}

GPUBUF_EXTERN int gpubuf_renew(gpubuf_client *c, const char *name, uint64_t id, uint64_t ttl_ms) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_renew needs a connection");
    int r = renew_call(c, name, id, ttl_ms);
    return gpubuf__result(r);
}

int gpubuf__stat_meta(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *o,
                      gpubuf_buffer_info *ret, gpubuf_buffer_meta *ret_meta) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatRequest q = GPUBUF__STAT_REQUEST__INIT;
    Gpubuf__Response *resp;
    char msg[256];
    lookup l;
    int r;
    if ((r = gpubuf__lookup_make("stat", name, id, o, GPUBUF_OPEN_OWNER, &l)) < 0)
        return r;
    q.target_case = gpubuf__lookup_fill(&l, &q.name, &q.buffer_id, &q.pool, &q.owner)
                        ? GPUBUF__STAT_REQUEST__TARGET_NAME
                        : GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID;
    req.body_case = GPUBUF__REQUEST__BODY_STAT;
    req.stat = &q;
    pthread_mutex_lock(&c->lock);
    if ((r = gpubuf__rpc_reply_locked(c, &req, GPUBUF__RESPONSE__BODY_BUFFER, &resp)) < 0) {
        pthread_mutex_unlock(&c->lock);
        return r;
    }
    const Gpubuf__Buffer *m = resp->buffer;
    gpubuf_buffer_meta meta;
    memset(&meta, 0, offsetof(gpubuf_buffer_meta, user_data));
    if (m->layout) {
        if (gpubuf_layout_from_wire(m->layout, &meta.layout, msg, sizeof(msg)) < 0) {
            r = gpubuf__fail(GPUBUF_EPROTOCOL, "gpubufd sent a malformed layout: %s", msg);
            goto out;
        }
        meta.has_layout = 1;
    }
    if (m->user_data.len > GPUBUF_USER_DATA_MAX) {
        r = gpubuf__fail(GPUBUF_EPROTOCOL, "gpubufd sent %zu user bytes", m->user_data.len);
        goto out;
    }
    meta.user_size = m->user_data.len;
    meta.lease_left_ms = m->lease_left_ms;
    meta.lease_ttl_ms = m->lease_ttl_ms;
    gpubuf__copy_info(ret, m);
    if (ret_meta) {
        memcpy(ret_meta, &meta, offsetof(gpubuf_buffer_meta, user_data));
        if (m->user_data.len)
            memcpy(ret_meta->user_data, m->user_data.data, m->user_data.len);
        ret_meta->lease_left_ms = meta.lease_left_ms;
        ret_meta->lease_ttl_ms = meta.lease_ttl_ms;
    }
out:
    gpubuf__resp_free(c, resp);
    pthread_mutex_unlock(&c->lock);
    return r;
}

GPUBUF_EXTERN int gpubuf_stat_meta(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer_info *ret,
                                   gpubuf_buffer_meta *ret_meta) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "a stat needs a connection and a place for the answer");
    int r = gpubuf__stat_meta(c, name, id, o, ret, ret_meta);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_stat(gpubuf_client *c, const char *name, gpubuf_buffer_info *ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(name, -EINVAL, "gpubuf_stat needs a name");
    GPUBUF_CHECK(c && ret, -EINVAL, "a stat needs a connection and a place for the answer");
    int r = gpubuf__stat_meta(c, name, 0, NULL, ret, NULL);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_stat_with(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer_info *ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "a stat needs a connection and a place for the answer");
    int r = gpubuf__stat_meta(c, name, id, o, ret, NULL);
    return gpubuf__result(r);
}

/* ---- the names these calls had before 0.4 (deprecated, still exported) -------- */

GPUBUF_EXTERN int gpubuf_alloc_ex(gpubuf_client *c, const char *pool, uint64_t size,
                                  const char *name, const gpubuf_meta *meta, gpubuf_buffer **ret)
    GPUBUF_ALIAS(gpubuf_alloc_with);
GPUBUF_EXTERN int gpubuf_seal_ex(gpubuf_buffer *b, const gpubuf_meta *meta)
    GPUBUF_ALIAS(gpubuf_seal_sync_with);
GPUBUF_EXTERN int gpubuf_stat_ex(gpubuf_client *c, const char *name, uint64_t id,
                                 const gpubuf_lookup *o, gpubuf_buffer_info *ret,
                                 gpubuf_buffer_meta *ret_meta) GPUBUF_ALIAS(gpubuf_stat_meta);
