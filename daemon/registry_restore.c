/* Registry room, continued: what the saved state gives back at a restart
 * (holders, buffers and references restored through the checks of
 * gd_registry_restore_*), and the resume that cuts a restored session's
 * references down to what its client's views hold. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "registry_internal.h"
#include "util.h"

gd_holder *gd_registry_restore_holder(gd_registry *r, uint64_t id, pid_t pid, uid_t uid,
                                      gid_t gid) {
    gd_holder *h;
    HASH_FIND(hh, r->holders, &id, sizeof(id), h);
    if (h || id == 0 || id > GD_ID_MAX || !(h = gd_registry_holder_add(r, id, pid, uid, gid)))
        return NULL;
    h->detached = true;
    h->detached_ns = gpubuf_now_ns();
    r->n_detached++;
    if (id > r->next_holder_id)
        r->next_holder_id = id;
    return h;
}

int gd_registry_restore_buf(gd_registry *r, const gd_buf *t, gd_buf **ret, gd_err *err) {
    gd_holder *h;
    if (t->id == 0 || t->id > GD_ID_MAX)
        return gd_err_set(err, -ERANGE, "its id is outside 1..%llu, the ids gpubufd gives",
                          (unsigned long long)GD_ID_MAX);
    if (gd_registry_find_id(r, t->id))
        return gd_err_set(err, -EEXIST, "buffer id %llu twice", (unsigned long long)t->id);
    if (t->name && (gd_registry_check_name(t->name, err) < 0))
        return -EINVAL;
    bool named = t->name && t->state != GPUBUF_STATE_DELETED;
    if (named && gd_registry_find_pool_name(r, t->pool, t->name))
        return gd_err_set(err, -EEXIST, "name '%s' twice in pool '%s'", t->name, t->pool->name);
    gd_uid_usage *u = gd_registry_uid_usage(r, (uid_t)t->owner_uid, true);
    gd_buf *b = calloc(1, sizeof(*b));
    if (!u || !b) {
        free(b);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    *b = *t;
    b->key = NULL;
    b->name = NULL;
    if (t->name && gd_registry_buf_name(b, t->pool, t->name) < 0) {
        free(b);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    b->refs = 0;
    b->meta_charged = 0; /* charged below, as an alloc's */
    b->in_name_index = false;
    b->id_waiters = NULL;
    memset(&b->hh_id, 0, sizeof(b->hh_id));
    memset(&b->hh_name, 0, sizeof(b->hh_name));
    HASH_ADD(hh_id, r->by_id, id, sizeof(b->id), b);
    GPUBUF_HASH_KEEP_LOAD(hh_id, r->by_id);
    if (named) {
        HASH_ADD_KEYPTR(hh_name, r->by_name, b->key, b->key_len, b);
        GPUBUF_HASH_KEEP_LOAD(hh_name, r->by_name);
        b->in_name_index = true;
    }
    r->n_buffers++;
    u->buffers++;
    u->bytes += b->charged;
    HASH_FIND(hh, r->holders, &b->owner_holder, sizeof(b->owner_holder), h);
    if (h) {
        h->n_owned++;
        h->owned_bytes += b->charged;
    }
    /* Charged, never refused: what was promised before the restart stays. */
    gd_registry_charge_meta(r, b, gd_meta_charge(b->name, NULL));
    if (b->id > r->next_buffer_id)
        r->next_buffer_id = b->id;
    HOOK(r, buf, b);
    *ret = b;
    return 0;
}

int gd_registry_restore_ref(gd_registry *r, gd_holder *h, gd_buf *b, uint32_t count,
                            uint32_t ro, gd_err *err) {
    if (count == 0)
        return 0;
    if (ro > count)
        ro = count;
    if (count > UINT32_MAX - h->n_refs)
        return gd_err_set(err, -EOVERFLOW,
                          "%u more references would take session %llu past %u, the most it "
                          "can hold (it has %u)",
                          count, (unsigned long long)h->id, UINT32_MAX, h->n_refs);
    if (count > UINT32_MAX - b->refs)
        return gd_err_set(err, -EOVERFLOW,
                          "%u more references would take buffer %llu past %u, the most it "
                          "can have (it has %u)",
                          count, (unsigned long long)b->id, UINT32_MAX, b->refs);
    if (gd_registry_ref_add_n(r, h, b, count, ro) < 0)
        return gd_err_set(err, -ENOMEM, "out of memory");
    return 0;
}

void gd_registry_restore_done(gd_registry *r) {
    gd_buf *b, *tmp;
    HASH_ITER(hh_id, r->by_id, b, tmp) {
        gd_registry_buf_maybe_free(r, b);
    }
}

int gd_held_cmp(const void *a, const void *b) {
    uint64_t x = ((const gd_held *)a)->buffer_id, y = ((const gd_held *)b)->buffer_id;
    return x < y ? -1 : x > y;
}

size_t gd_registry_resume(gd_registry *r, gd_holder *h, const gd_held *held, size_t n,
                          uint64_t *lost) {
    size_t n_lost = 0;
    gd_ref *ref, *tmp;
    assert(h->detached && r->n_detached > 0);
    h->detached = false;
    r->n_detached--;
    for (size_t i = 0; i < n; i++)
        if (!gd_registry_ref_find(h, held[i].buffer_id) && held[i].count)
            lost[n_lost++] = held[i].buffer_id;
    /* Cut each reference down to what the client's views hold. */
    HASH_ITER(hh, h->refs, ref, tmp) {
        uint64_t id = ref->buffer_id;
        uint32_t want = 0, want_ro = 0;
        gd_held key = {.buffer_id = id};
        const gd_held *x = bsearch(&key, held, n, sizeof(*held), gd_held_cmp);
        if (x) {
            want = x->count;
            want_ro = x->ro < want ? x->ro : want;
        }
        /* In one step, whatever the counts (a saved count may be large). */
        uint32_t have = ref->count, have_ro = ref->ro;
        if (ref->ro > want_ro)
            gd_registry_ref_ro_set(h, ref, want_ro);
        if (want < have) /* may free ref */
            gd_registry_ref_drop_n(r, h, ref, gd_registry_find_id(r, id), have - want);
        if (want && want <= have && (ref = gd_registry_ref_find(h, id)) && ref->ro < want_ro)
            gd_registry_ref_ro_set(h, ref, want_ro);
        /* A read-only count changed alone is saved too (a drop saved its
         * own count, perhaps before the read-only count went up again). */
        if ((ref = gd_registry_ref_find(h, id)) && ref->ro != have_ro)
            gd_registry_ref_saved(r, h, ref);
    }
    return n_lost;
}
