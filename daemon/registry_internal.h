/* Registry room, private: what registry.c shares with the files built on
 * it: allocation (registry_alloc.c), a request's target found, opened,
 * described or deleted (registry_target.c), the restore of the saved state
 * and the resume (registry_restore.c). Nothing outside the registry room
 * includes it. */
#ifndef GPUBUFD_REGISTRY_INTERNAL_H
#define GPUBUFD_REGISTRY_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "registry.h"

/* Tell the saved state (if it listens) what changed. */
#define HOOK(r, fn, ...)                                                                           \
    do {                                                                                           \
        if ((r)->hooks && (r)->hooks->fn)                                                          \
            (r)->hooks->fn((r)->hooks_arg, __VA_ARGS__);                                           \
    } while (0)

/* Only b's state changed: buf_state, or buf where there is none. */
#define HOOK_STATE(r, b)                                                                           \
    do {                                                                                           \
        if ((r)->hooks && (r)->hooks->buf_state)                                                   \
            (r)->hooks->buf_state((r)->hooks_arg, (b));                                            \
        else                                                                                       \
            HOOK(r, buf, (b));                                                                     \
    } while (0)

/* uid's usage record, or NULL: the one looked up last (gd_registry.uid_last)
 * if it is uid's, else from the table. Inline: an alloc asks twice. */
static inline gd_uid_usage *gd_registry_uid_find(const gd_registry *r, uid_t uid) {
    gd_uid_usage *u = r->uid_last;
    if (u && u->uid == uid)
        return u;
    HASH_FIND(hh, r->uids, &uid, sizeof(uid), u);
    return u;
}
/* uid's usage record, kept as the one looked up last; with create, made when
 * missing (NULL: none, or out of memory). */
gd_uid_usage *gd_registry_uid_usage(gd_registry *r, uid_t uid, bool create);
/* Forget uid usage u (its last buffer went) and free it. */
void gd_registry_uid_drop(gd_registry *r, gd_uid_usage *u);
/* A zeroed buffer record: a spare or new (NULL without memory). */
gd_buf *gd_registry_buf_new(gd_registry *r);
/* Free b: uncharge it, take it out of the lease heap, the indexes and its
 * pool. */
void gd_registry_buf_free(gd_registry *r, gd_buf *b);
/* Free b when nothing can reach it any more. */
void gd_registry_buf_maybe_free(gd_registry *r, gd_buf *b);
/* A new holder with this id (NULL: out of memory). */
gd_holder *gd_registry_holder_add(gd_registry *r, uint64_t id, pid_t pid, uid_t uid, gid_t gid);
/* b's name in pool: its index key "POOL\0NAME", name pointing into it. */
int gd_registry_buf_name(gd_buf *b, const gd_pool *pool, const char *name);
/* h's reference record of buffer id, or NULL. */
gd_ref *gd_registry_ref_find(gd_holder *h, uint64_t id);
/* Add n references of h to b, ro of them read-only (registry.c says more). */
int gd_registry_ref_add_n(gd_registry *r, gd_holder *h, gd_buf *b, uint32_t n, uint32_t ro);
/* One more reference of h to b (gd_registry_ref_add_n() of one). */
int gd_registry_ref_add(gd_registry *r, gd_holder *h, gd_buf *b);
/* Set the read-only part of ref to ro (at most its count). */
void gd_registry_ref_ro_set(gd_holder *h, gd_ref *ref, uint32_t ro);
/* Tell the saved state h's count of ref as it is now (after
 * gd_registry_ref_ro_set, which tells it nothing). */
void gd_registry_ref_saved(gd_registry *r, const gd_holder *h, const gd_ref *ref);
/* Drop n of h's references ref to b in one step (registry.c says more). */
void gd_registry_ref_drop_n(gd_registry *r, gd_holder *h, gd_ref *ref, gd_buf *b, uint32_t n);

/* The target names an owner and b has another: -EPERM, why in err. */
int gd_registry_check_owner(bool has_owner, uint32_t owner_uid, const gd_buf *b, gd_err *err);
/* A read-only open of memory that cannot be mapped read-only is refused. */
int gd_registry_check_read_only(const gd_pool *pool, gd_err *err);

#endif
