/* Registry room, continued: allocation. The checks of a new buffer (its
 * name, the pool's allow and publish lists, the quotas), its block from the
 * pool, its id, its name and the creator's reference. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry_internal.h"
#include "util.h"

int gd_registry_alloc(gd_registry *r, gd_holder *h, gd_pool *pool, uint64_t size,
                      uint64_t align, const char *name, gd_buf **ret, gd_err *err) {
    return gd_registry_alloc_charged(r, h, pool, size, align, name, 0, ret, err);
}

int gd_registry_alloc_charged(gd_registry *r, gd_holder *h, gd_pool *pool, uint64_t size,
                              uint64_t align, const char *name, uint64_t meta_extra,
                              gd_buf **ret, gd_err *err) {
    gd_buf *b;
    int rc;
    if (name && *name) {
        if ((rc = gd_registry_check_name(name, err)) < 0)
            return rc;
    } else {
        name = NULL;
    }
    if ((rc = gd_registry_check_pool(h, pool, err)) < 0)
        return rc;
    /* Refused before the name is looked up: who may not publish here
     * learns nothing of the names taken. */
    if (name && !gd_pool_may_publish(pool, h->uid, h->gid))
        return gd_err_set(err, -EPERM,
                          "uid %u may not give buffers names in pool '%s' (its publish_uids/"
                          "publish_gids): allocate an anonymous buffer, or publish in a pool "
                          "that lets it",
                          (unsigned)h->uid, pool->name);
    if (name && gd_registry_find_pool_name(r, pool, name))
        return gd_err_set(err, -EEXIST, "a buffer named '%s' exists in pool '%s'", name,
                          pool->name);
    if (size == 0)
        return gd_err_set(err, -EINVAL, "size 0: a buffer holds at least 1 byte");
    if (r->next_buffer_id >= GD_ID_MAX)
        return gd_err_set(err, -EOVERFLOW,
                          "gpubufd has given out every buffer id (up to %llu) and ids never go "
                          "back: new buffers need gpubufd started afresh, without its saved "
                          "state",
                          (unsigned long long)GD_ID_MAX);
    const gd_quota *q = &r->quota;
    gd_uid_usage *u = gd_registry_uid_usage(r, h->uid, false);
    /* What the pool will take: the size rounded to the pool's alignment. */
    uint64_t charge = size > UINT64_MAX / 2 ? size : gpubuf_align_up(size, pool->be->alignment);
    if (q->buffers_per_client && h->n_owned >= q->buffers_per_client)
        return gd_err_set(err, -EDQUOT, "quota: this client owns %u buffers (limit %u)", h->n_owned,
                    q->buffers_per_client);
    if (q->bytes_per_client && (charge > q->bytes_per_client ||
                                h->owned_bytes > q->bytes_per_client - charge))
        return gd_err_set(err, -EDQUOT, "quota: %llu more bytes exceed this client's limit of %llu",
                    (unsigned long long)charge, (unsigned long long)q->bytes_per_client);
    if (u && q->buffers_per_uid && u->buffers >= q->buffers_per_uid)
        return gd_err_set(err, -EDQUOT, "quota: uid %u owns %u buffers (limit %u)", (unsigned)h->uid,
                    u->buffers, q->buffers_per_uid);
    if (q->bytes_per_uid &&
        (charge > q->bytes_per_uid || (u && u->bytes > q->bytes_per_uid - charge)))
        return gd_err_set(err, -EDQUOT, "quota: %llu more bytes exceed uid %u's limit of %llu",
                    (unsigned long long)charge, (unsigned)h->uid,
                    (unsigned long long)q->bytes_per_uid);
    if (q->refs_per_client && h->n_refs >= q->refs_per_client)
        return gd_err_set(err, -EDQUOT, "quota: this client holds %u references (limit %u)", h->n_refs,
                    q->refs_per_client);
    uint64_t meta = gd_meta_charge(name, NULL) + meta_extra;
    if ((rc = gd_registry_check_meta(r, h, meta, err)) < 0)
        return rc;
    if (!(u = gd_registry_uid_usage(r, h->uid, true)))
        return gd_err_set(err, -ENOMEM, "out of memory");
    b = gd_registry_buf_new(r);
    if (!b)
        return gd_err_set(err, -ENOMEM, "out of memory");
    if (name && gd_registry_buf_name(b, pool, name) < 0) {
        free(b);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    gd_slab *prefer[GPUBUF_PREFER_SLABS];
    uint32_t n_prefer = 0;
    gd_holder_slab *hs, *hstmp;
    HASH_ITER(hh, h->slabs, hs, hstmp) {
        if (n_prefer == GPUBUF_PREFER_SLABS)
            break;
        if (hs->slab->pool == pool && !hs->slab->dedicated)
            prefer[n_prefer++] = hs->slab;
    }
    rc = gd_pool_alloc_prefer(pool, size, align, prefer, n_prefer, &b->blk, err);
    if (rc < 0) {
        if (err && !err->msg[0])
            gd_err_set(err, rc, "allocation failed");
        free(b->key);
        free(b);
        if (u->buffers == 0)
            gd_registry_uid_drop(r, u);
        return rc;
    }
    b->id = ++r->next_buffer_id;
    b->pool = pool;
    b->size = size;
    b->state = GPUBUF_STATE_ALLOCATED;
    b->owner_uid = (uint32_t)h->uid;
    b->owner_holder = h->id;
    HASH_ADD(hh_id, r->by_id, id, sizeof(b->id), b);
    GPUBUF_HASH_KEEP_LOAD(hh_id, r->by_id);
    if (b->name) {
        HASH_ADD_KEYPTR(hh_name, r->by_name, b->key, b->key_len, b);
        GPUBUF_HASH_KEEP_LOAD(hh_name, r->by_name);
        b->in_name_index = true;
    }
    r->n_buffers++;
    /* Charge what the pool took (alignment included), not what was asked. */
    b->charged = b->blk.size;
    h->n_owned++;
    h->owned_bytes += b->charged;
    u->buffers++;
    u->bytes += b->charged;
    gd_registry_charge_meta(r, b, meta);
    HOOK(r, buf, b);
    if (gd_registry_ref_add(r, h, b) < 0) {
        gd_registry_buf_free(r, b);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    *ret = b;
    return 0;
}
