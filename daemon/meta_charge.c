/* Registry room, continued: the metadata charge. What a buffer's name,
 * layout and user bytes count, checked against the three limits (per
 * client, per uid, for everyone: docs/security.md) before they are taken,
 * and charged to the buffer's creator and its owner's uid. registry.c frees
 * a buffer's metadata; the files that give buffers metadata (registry_alloc.c,
 * registry_restore.c, meta.c) charge it here. */
#include "registry_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* docs/security.md gives the metadata charge with this header size. */
_Static_assert(sizeof(gd_meta) == 24, "update the metadata charge in docs/security.md");

uint64_t gd_meta_bytes(const gd_meta *m) {
    if (!m)
        return 0;
    size_t dims = m->has_layout ? m->ndim * (m->has_strides ? 2u : 1u) : 0;
    return sizeof(*m) + dims * sizeof(int64_t) + m->user_len;
}

uint64_t gd_meta_charge(const char *name, const gd_meta *m) {
    return (name ? strlen(name) : 0) + gd_meta_bytes(m);
}

/* -EDQUOT when used + more passes limit (0: none), with the sentence. */
static int meta_over(uint64_t used, uint64_t more, uint64_t limit, const char *whose,
                     const char *key, gd_err *err) {
    if (!limit || (more <= limit && used <= limit - more))
        return 0;
    return gd_err_set(err, -EDQUOT,
                      "quota: %s buffers would carry %llu bytes of metadata (names, layouts, "
                      "user bytes), over %s = %llu; delete or release buffers no longer "
                      "needed, give them fewer user bytes, or raise %s in the daemon's "
                      "configuration",
                      whose, (unsigned long long)(used + more), key,
                      (unsigned long long)limit, key);
}

int gd_registry_check_meta(const gd_registry *r, const gd_holder *h, uint64_t more,
                           gd_err *err) {
    const gd_quota *q = &r->quota;
    char whose[48];
    gd_uid_usage *u;
    int rc;
    uid_t uid = h->uid;
    if (!more)
        return 0;
    if ((rc = meta_over(h->owned_meta, more, q->meta_bytes_per_client, "this client's",
                        "max_meta_bytes_per_client", err)) < 0)
        return rc;
    u = gd_registry_uid_find(r, uid);
    /* The uid's words only for the error: formatted on every named alloc,
     * they took about 700 instructions of it (callgrind, mixed throughput:
     * some 120 of the 3,335 an operation). */
    if (meta_over(u ? u->meta : 0, more, q->meta_bytes_per_uid, "", "", NULL) < 0) {
        snprintf(whose, sizeof(whose), "uid %u's", (unsigned)uid);
        return meta_over(u ? u->meta : 0, more, q->meta_bytes_per_uid, whose,
                         "max_meta_bytes_per_uid", err);
    }
    return meta_over(r->meta_bytes, more, q->meta_bytes, "all users'", "max_meta_bytes", err);
}

/* Add (or, with sub, take back) delta bytes of metadata charge of b. */
static void meta_account(gd_registry *r, const gd_buf *b, uint64_t delta, bool sub) {
    gd_holder *h;
    uid_t uid = (uid_t)b->owner_uid;
    gd_uid_usage *u = gd_registry_uid_usage(r, uid, false);
    HASH_FIND(hh, r->holders, &b->owner_holder, sizeof(b->owner_holder), h);
    if (sub) {
        if (h)
            h->owned_meta -= delta;
        if (u)
            u->meta -= delta;
        r->meta_bytes -= delta;
    } else {
        if (h)
            h->owned_meta += delta;
        if (u)
            u->meta += delta;
        r->meta_bytes += delta;
    }
}

void gd_registry_charge_meta(gd_registry *r, gd_buf *b, uint64_t charge) {
    if (charge == b->meta_charged)
        return; /* (a buffer without metadata: two lookups for nothing) */
    if (charge >= b->meta_charged)
        meta_account(r, b, charge - b->meta_charged, false);
    else
        meta_account(r, b, b->meta_charged - charge, true);
    b->meta_charged = charge;
}
