/* Registry room: buffers by id and by name, their states, the references each
 * client holds, and the clients waiting for a name or id to be sealed.
 * Knows pools, not sessions or sockets: a client is a gd_holder. */
#ifndef GPUBUFD_REGISTRY_H
#define GPUBUFD_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include "hash.h"

#include "error.h"
#include "gpubuf/gpubuf.h"
#include "pool.h"

#define GD_EVENT_HANDLE_SIZE 64 /* sizeof(CUipcEventHandle) */

typedef struct gd_buf gd_buf;

/* What a buffer carries besides its bytes (lease aside): its array layout
 * and user bytes, in one allocation made only for buffers that have any. */
typedef struct gd_meta {
    gpubuf_dtype dtype;
    uint8_t ndim;
    bool has_layout;
    bool has_strides;
    uint32_t user_len;
    uint64_t byte_offset;
    /* shape[ndim], then strides[ndim] when has_strides, then user bytes */
    int64_t dims[];
} gd_meta;
typedef struct gd_holder gd_holder;
typedef struct gd_waiter gd_waiter;

struct gd_buf {
    uint64_t id;
    char *name; /* NULL when anonymous; points into key */
    char *key;  /* by-name index key "POOL\0NAME" (names are per pool) */
    size_t key_len;
    gd_pool *pool;
    gd_block blk;
    uint64_t size; /* as requested */
    gpubuf_state state;
    uint32_t refs;
    uint32_t owner_uid;
    uint64_t owner_holder; /* holder id of the creator */
    uint64_t charged;      /* bytes charged to the owner's quotas */
    uint64_t meta_charged; /* metadata bytes charged to them (gd_meta_charge) */
    bool in_name_index;
    bool restored;         /* came back from the saved state at a restart */
    bool has_event;        /* sealed on a stream: openers wait for event */
    uint64_t event_holder; /* the holder that recorded it (the event dies with it) */
    uint8_t event[GD_EVENT_HANDLE_SIZE];
    gd_waiter *id_waiters; /* waits for this id (utlist DL on kprev/knext) */
    gd_meta *meta;             /* NULL: no layout and no user bytes */
    uint64_t lease_expires_ns; /* gpubuf_now_ns() clock; 0: no lease */
    uint32_t lease_ttl_ms;
    uint32_t lease_slot;       /* index + 1 in the registry's lease heap, 0: not in it */
    UT_hash_handle hh_id;
    UT_hash_handle hh_name;
};

/* A slab in which a holder references buffers, or which it keeps mapped:
 * its process has the slab mapped, so the holder's next allocations are
 * placed there first. */
typedef struct gd_holder_slab {
    uint64_t slab_id;
    gd_slab *slab;
    uint32_t buffers; /* distinct buffers referenced in it */
    uint32_t refs;    /* references to those buffers */
    uint32_t ro;      /* of refs, those opened read-only */
    bool kept;        /* pinned: the client keeps it mapped (KEEP_MAPPED) */
    UT_hash_handle hh;
} gd_holder_slab;

/* One (holder, buffer) reference count. */
typedef struct gd_ref {
    uint64_t buffer_id;
    uint32_t count;
    uint32_t ro; /* of count, references opened read-only */
    gd_holder_slab *hs; /* the buffer's slab in the holder's slabs */
    UT_hash_handle hh;
} gd_ref;

/* Slabs offered to the pool per allocation, at most. */
#define GPUBUF_PREFER_SLABS 16

struct gd_holder {
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gd_ref *refs;     /* by buffer id */
    gd_holder_slab *slabs; /* by slab id: slabs of the buffers in refs */
    uint32_t n_kept;      /* entries of slabs with kept set */
    uint32_t kept_cap;    /* slabs it may keep: quota.kept_slabs_per_client at hello */
    uint32_t n_refs;      /* sum of counts */
    uint32_t n_ro_refs;   /* sum of ro */
    uint32_t n_owned;     /* live buffers this client allocated */
    uint64_t owned_bytes;
    uint64_t owned_meta;  /* their metadata charge (gd_meta_charge) */
    gd_waiter *waiters; /* this holder's pending waits */
    /* Restored from the saved state: its client has not come back (resumed)
     * since the restart; dropped when it does not within resume_timeout. */
    bool detached;
    uint64_t detached_ns; /* when the restart made it so (gpubuf_now_ns) */
    UT_hash_handle hh;
    gd_holder *leave_prev, *leave_next; /* registry's leaving list (utlist DL) */
};

/* What the registry reports as it changes, so that the daemon's saved state
 * (state.c) follows every change as it happens. Each is optional. */
typedef struct gd_registry_hooks {
    void (*buf)(void *arg, const gd_buf *b); /* created, or its state, event changed */
    /* After the buffer left the registry's tables, before it is freed: a
     * walk of by_id that stopped at it may still step to its next.
     * last_ref: the holder whose last reference to it went with it (its
     * ref hook, to count 0, is not called), or 0. */
    void (*buf_gone)(void *arg, uint64_t id, uint64_t last_ref);
    void (*ref)(void *arg, const gd_holder *h, uint64_t buffer_id, uint32_t count, uint32_t ro);
    void (*holder)(void *arg, const gd_holder *h);
    void (*holder_gone)(void *arg, uint64_t id);
    /* Only its state changed (deleted: its lease and name index went too);
     * NULL: buf is called instead. */
    void (*buf_state)(void *arg, const gd_buf *b);
} gd_registry_hooks;

/* What an open hands out, in one answer: the buffer it took a reference to
 * (read-only when read_only), whether the holder maps the buffer's slab in
 * that mode already apart from this reference (gd_registry_slab_mapped()),
 * and the seal event that goes with it (gd_registry_event(); NULL: none). */
typedef struct gd_opened {
    gd_buf *buf;
    bool read_only;
    bool slab_mapped;
    const uint8_t *event;
} gd_opened;

/* A pending open(). The caller embeds it and fills target and callbacks.
 * wake(): the buffer was sealed and a reference was taken for the holder;
 * opened says what the open hands out (set before wake() is called).
 * fail(): it never will be (deleted, or refused with -EACCES or -EDQUOT),
 * with the reason in err; without fail, cancel() is called instead.
 * The registry unlinks a waiter before calling back; the waiter is not
 * touched after a callback returns. */
struct gd_waiter {
    gd_holder *holder;
    char *name;           /* target name, or NULL for by-id */
    gd_pool *pool;        /* the pool of name (NULL: the registry's default pool) */
    uint64_t buffer_id;
    bool has_owner;       /* the buffer must belong to owner_uid */
    uint32_t owner_uid;
    bool read_only;       /* a read-only open: its reference is marked so */
    void (*wake)(gd_waiter *w, gd_buf *b);
    gd_opened opened; /* set by the registry before wake() */
    void (*cancel)(gd_waiter *w); /* holder dropped */
    void (*fail)(gd_waiter *w, const gd_err *err);
    gd_waiter *next, *prev;       /* registry list (utlist DL) */
    gd_waiter *hnext, *hprev;     /* holder list (utlist DL) */
    /* The index a seal or a delete looks in, so that it visits the
     * waiters of its name or id only: by name, the first waiter of a name
     * is the entry of the registry's name_waiters hash and the others
     * follow it on knext; by id, the buffer's id_waiters list. */
    gd_waiter *knext, *kprev;
    UT_hash_handle hh;
    bool indexed;
};

/* What one uid owns (buffers outlive the client that made them). */
typedef struct gd_uid_usage {
    uid_t uid;
    uint32_t buffers;
    uint64_t bytes;
    uint64_t meta; /* metadata charge (gd_meta_charge) */
    UT_hash_handle hh;
} gd_uid_usage;

/* Quotas; 0 means no limit. */
typedef struct gd_quota {
    uint32_t buffers_per_client;
    uint64_t bytes_per_client;
    uint32_t buffers_per_uid;
    uint64_t bytes_per_uid;
    uint32_t refs_per_client;
    /* Slabs a client may keep mapped, fixed for a session at its hello (a
     * reload must not strand slabs a client already maps); 0: none. */
    uint32_t kept_slabs_per_client;
    /* Longest lease time to live, ms; 0: up to UINT32_MAX. */
    uint32_t max_lease_ms;
    /* Metadata bytes (gd_meta_charge) of live buffers: one client's, one
     * uid's, the daemon's (which bounds its saved state). */
    uint64_t meta_bytes_per_client;
    uint64_t meta_bytes_per_uid;
    uint64_t meta_bytes;
} gd_quota;

typedef struct gd_registry {
    gd_quota quota;
    /* Names are per pool: a name given without a pool is looked up here
     * (the daemon's first pool). */
    gd_pool *default_pool;
    gd_uid_usage *uids;
    /* The uid looked up last (or NULL): an alloc and its buffer's free ask
     * for the same uid several times (callgrind, batched allocs: the
     * lookups were about 4 % of the daemon's instructions). */
    gd_uid_usage *uid_last;
    gd_buf *by_id;
    gd_buf *by_name;
    gd_holder *holders;
    gd_waiter *waiters;
    gd_waiter *name_waiters; /* by name: see gd_waiter.knext */
    /* Holders whose client went, not in holders any more: their references
     * go a bounded number per call of gd_registry_reap(). */
    gd_holder *leaving;
    uint64_t next_buffer_id;
    uint64_t next_holder_id;
    uint32_t n_buffers;
    uint32_t n_waiters;
    uint64_t freed_buffers; /* counters for status/metrics */
    const gd_registry_hooks *hooks; /* NULL: none */
    void *hooks_arg;
    uint64_t freeing_ref; /* gd_registry_ref_drop_n: whose last reference frees a buffer */
    /* While a request runs with the journal on (state.c, gd_state_begin):
     * the group its reference counts go into, appended here directly (no
     * ref hook: a batch of 1,000 makes 1,000); NULL: through the hook.
     * ref_sink_n counts them for the journal's log. */
    struct gd_obuf *ref_sink;
    uint64_t ref_sink_n;
    uint32_t n_detached; /* holders with detached set */
    /* Leases: a binary min-heap of the buffers with one, by expiry. */
    gd_buf **leases;
    uint32_t n_leases, cap_leases;
    uint64_t leases_expired, leases_renewed;
    /* Buffers with a layout, their dimensions, buffers with user bytes: the
     * sizes of the status's metadata columns. */
    uint32_t n_layouts, n_user_meta;
    uint64_t layout_dims;
    uint64_t meta_bytes; /* metadata charge of all live buffers */
    /* References dropped, kept for the next ones (linked by hh.next; at
     * most GD_SPARE_REFS): a batch of 1,000 opens and its release make no
     * calloc and free per item. */
    gd_ref *spare_refs;
    uint32_t n_spare_refs;
    /* Buffers freed, kept the same way (linked by hh_id.next). */
    gd_buf *spare_bufs;
    uint32_t n_spare_bufs;
} gd_registry;

void gd_registry_init(gd_registry *r);
/* Frees every buffer (returning blocks to pools) and holder. */
void gd_registry_destroy(gd_registry *r);

/* NULL when out of memory, or (errno EOVERFLOW) when every holder id up to
 * GD_ID_MAX was given out: ids never wrap. */
gd_holder *gd_registry_holder_new(gd_registry *r, pid_t pid, uid_t uid, gid_t gid);
/* The client went away: cancel its waits, drop all its references, delete
 * buffers it allocated and never sealed. */
void gd_registry_holder_drop(gd_registry *r, gd_holder *h);
/* The same, spread over time: the waits are cancelled and the holder is
 * gone (its id finds nothing, its seal events die) at once; its references
 * are dropped by gd_registry_reap(), so that a client holding a million of
 * them does not stall the loop when it leaves. Until then its references
 * still count on their buffers, and buffers it allocated and never sealed
 * keep their names. */
void gd_registry_holder_leave(gd_registry *r, gd_holder *h);
/* Carry on dropping the references (and kept slabs) of leaving holders, at
 * most budget of them. True while some are left. */
bool gd_registry_reap(gd_registry *r, uint32_t budget);

gd_buf *gd_registry_find_id(gd_registry *r, uint64_t id);
/* By name in the default pool. */
gd_buf *gd_registry_find_name(gd_registry *r, const char *name);
/* By name in pool (NULL: the default pool). */
gd_buf *gd_registry_find_pool_name(gd_registry *r, const gd_pool *pool, const char *name);
uint32_t gd_registry_holder_count(gd_holder *h, uint64_t buffer_id);

/* The registry is the one place that decides names and access. Every call
 * below returns 0 or a negative code and then fills err (which may be NULL)
 * with the code and a sentence for the client. */

/* Name rules: -ENAMETOOLONG, or -EINVAL for a character outside
 * A-Z a-z 0-9 . _ : / @ + - (or a leading '/'). */
int gd_registry_check_name(const char *name, gd_err *err);
/* May holder h allocate from and open buffers of pool? -EACCES if not. */
int gd_registry_check_pool(const gd_holder *h, const gd_pool *pool, gd_err *err);

/* name NULL or "" for an anonymous buffer. Checks the name, the pool's
 * access list and the quotas; -EOVERFLOW once every buffer id up to
 * GD_ID_MAX was given out (ids never wrap, nor go back). */
int gd_registry_alloc(gd_registry *r, gd_holder *h, gd_pool *pool, uint64_t size,
                      uint64_t align, const char *name, gd_buf **ret, gd_err *err);
int gd_registry_seal(gd_registry *r, gd_holder *h, uint64_t id, gd_buf **ret, gd_err *err);
/* Seal with the CUDA IPC event the sealer recorded after writing (NULL: none;
 * -EINVAL for a host pool), so that waiters woken by the seal get it. */
int gd_registry_seal_event(gd_registry *r, gd_holder *h, uint64_t id, const uint8_t *event,
                           gd_buf **ret, gd_err *err);
/* The buffer's seal event while its sealer is connected and holds a
 * reference to it, else NULL: a producer's CUDA events die with its process,
 * and its library destroys one (once completed) after its last view went. */
const uint8_t *gd_registry_event(gd_registry *r, const gd_buf *b);
/* Does the holder's client map b's slab read-only (ro) or read-write,
 * apart from the reference to b it just took: does it hold another
 * reference of that mode to a buffer of the slab, or (read-write) keep the
 * slab mapped? A client maps a slab while it holds a reference in it and
 * unmaps it before it sends the release of the last one (its requests
 * reach the daemon in order), so the answer is true only while it maps it
 * (docs/protocol.md, "Slabs sent once"). */
bool gd_registry_slab_mapped(gd_holder *h, const gd_buf *b, bool ro);
/* What the reference h just took to b (read-only when read_only) hands out:
 * gd_registry_slab_mapped() and gd_registry_event() in one answer. */
void gd_registry_opened(gd_registry *r, gd_holder *h, gd_buf *b, bool read_only, gd_opened *ret);
/* Unmark one of the holder's read-only references to id (before releasing
 * it; none marked: nothing). Not saved by itself: the release saves the
 * counts it leaves. An open marks its reference as it takes it
 * (gd_registry_ref_add_n). */
void gd_registry_ref_unmark_ro(gd_holder *h, uint64_t id);
/* What an open, stat or delete names: a buffer by name (name not NULL) in
 * one pool, or by id. pool NULL: the default pool for a name, any pool for an
 * id (else the buffer must be in pool). With has_owner, the buffer must
 * belong to owner_uid (-EPERM otherwise, whatever its state). */
typedef struct gd_target {
    gd_pool *pool;
    const char *name;
    uint64_t id;
    bool has_owner;
    uint32_t owner_uid;
} gd_target;

/* Take a reference to a sealed buffer, by name (when name is not NULL) or
 * id, in one lookup. -EACCES for a buffer of a pool h may not use, whatever
 * its state. -ENOENT when the name/id is unknown or not sealed yet; then
 * *ret_waitable (if given) says whether it may still be sealed: any name, or
 * an id in state ALLOCATED. */
int gd_registry_open(gd_registry *r, gd_holder *h, const char *name, uint64_t id, gd_buf **ret,
                     bool *ret_waitable, gd_err *err);
/* The same, read-only when read_only: -EOPNOTSUPP for memory that cannot
 * be mapped read-only (cuda-ipc), before any reference is taken; the
 * reference is marked read-only (gd_holder.n_ro_refs). */
int gd_registry_open_mode(gd_registry *r, gd_holder *h, const char *name, uint64_t id,
                          bool read_only, gd_buf **ret, bool *ret_waitable, gd_err *err);
/* The same for a target: -EACCES first when h may not use the pool of a name
 * (whether or not the name exists there), -EPERM for another owner. */
int gd_registry_open_target(gd_registry *r, gd_holder *h, const gd_target *t, bool read_only,
                            gd_buf **ret, bool *ret_waitable, gd_err *err);
/* The same, and in the same call what the open hands out (ret, as
 * gd_registry_opened() tells it): the single open request's one question. */
int gd_registry_open_one(gd_registry *r, gd_holder *h, const gd_target *t, bool read_only,
                         gd_opened *ret, bool *ret_waitable, gd_err *err);
/* Describe a target without a reference: -ENOENT, -EPERM (owner). */
int gd_registry_stat(gd_registry *r, const gd_target *t, gd_buf **ret, gd_err *err);
int gd_registry_release(gd_registry *r, gd_holder *h, uint64_t id, gd_err *err);
/* Release; with keep, the holder also keeps the buffer's slab mapped: the
 * slab stays (pinned) until gd_registry_unmap() or the holder goes.
 * -EINVAL for a dedicated slab, -EDQUOT beyond kept_slabs_per_client (the
 * reference is released either way). */
int gd_registry_release_keep(gd_registry *r, gd_holder *h, uint64_t id, bool keep,
                             gd_err *err);
/* The holder no longer maps slab_id. GPUBUF_ENOTHELD when it kept no such
 * slab. */
int gd_registry_unmap(gd_registry *r, gd_holder *h, uint64_t slab_id, gd_err *err);
/* Unpublish by name or id: the owner's uid or root only (-EPERM). */
int gd_registry_delete(gd_registry *r, gd_holder *h, const char *name, uint64_t id,
                       gd_err *err);
int gd_registry_delete_target(gd_registry *r, gd_holder *h, const gd_target *t, gd_err *err);
/* After -ENOENT for name in pool searched: when another of the n pools that
 * h may use has a live buffer of that name, append where to err's sentence
 * (a consumer that forgot to name the pool learns which one to name). */
void gd_registry_hint_pools(gd_registry *r, const gd_holder *h, gd_pool *const *pools, int n,
                            const gd_pool *searched, const char *name, gd_err *err);

/* The uid SO_PEERCRED gives a peer whose uid has no mapping in gpubufd's
 * user namespace (/proc/sys/kernel/overflowuid, read once; 65534). */
uint32_t gd_overflow_uid(void);

/* Restore (state.c): a detached holder of a previous run, with its id; NULL
 * for an id of 0, beyond GD_ID_MAX or taken. */
gd_holder *gd_registry_restore_holder(gd_registry *r, uint64_t id, pid_t pid, uid_t uid,
                                      gid_t gid);
/* Restore a buffer in block blk of pool (taken from the pool already), with
 * its id, name, state and owner; charged to the owner (holder owner_holder
 * when restored before it, and its uid). -ERANGE for an id of 0 or beyond
 * GD_ID_MAX, -EEXIST for a taken id or name. */
int gd_registry_restore_buf(gd_registry *r, const gd_buf *tmpl, gd_buf **ret, gd_err *err);
/* Restore count references (ro of them read-only, at most count) of holder
 * h to b, in one step whatever count: -EOVERFLOW (nothing restored) when
 * the holder's or the buffer's count would pass UINT32_MAX. The quota
 * refs_per_client is not applied: a SIGHUP may have lowered it below what a
 * client held, and dropping references its views hold would free memory it
 * maps; such a session's opens are refused until it is below. */
int gd_registry_restore_ref(gd_registry *r, gd_holder *h, gd_buf *b, uint32_t count,
                            uint32_t ro, gd_err *err);
/* The restore is complete: free the buffers nothing can reach (no
 * reference and not named and sealed). */
void gd_registry_restore_done(gd_registry *r);
/* A client takes up detached holder h again, holding the references in
 * held (n entries: buffer id, count, read-only count): h's references are
 * cut down to those; the ids of held buffers h has no reference to are
 * written to lost (at most n), their number returned. held is sorted by
 * gd_held_cmp. */
typedef struct gd_held {
    uint64_t buffer_id;
    uint32_t count, ro;
} gd_held;
size_t gd_registry_resume(gd_registry *r, gd_holder *h, const gd_held *held, size_t n,
                          uint64_t *lost);
/* Order of held entries (by buffer id, no id twice): gd_registry_resume()
 * wants them sorted so. */
int gd_held_cmp(const void *a, const void *b);
/* The live (allocated or sealed) buffer t names that h may manage: its
 * owner's uid or root. -ENOENT, or -EPERM saying that only they may `what`
 * ("delete it"). */
int gd_registry_find_owned(gd_registry *r, gd_holder *h, const gd_target *t, const char *what,
                           gd_buf **ret, gd_err *err);
/* Unpublish b (delete or lease expiry): its name goes, waiters for an unsealed
 * one fail, its lease ends; freed now if nobody holds it. */
void gd_registry_unpublish(gd_registry *r, gd_buf *b);
/* Free b's metadata (when it has any) and uncount it. */
void gd_meta_free(gd_registry *r, gd_buf *b);
/* Take b out of the lease heap (no-op without a lease). */
void gd_lease_remove(gd_registry *r, gd_buf *b);
/* Give b a lease of ttl_ms that expires at expires_ns (replacing one it has);
 * -ENOMEM. */
int gd_lease_set_at(gd_registry *r, gd_buf *b, uint64_t ttl_ms, uint64_t expires_ns);
/* Room in the lease heap for one more lease: gd_lease_set_at then cannot
 * fail. -ENOMEM. */
int gd_lease_reserve(gd_registry *r);

/* Metadata given with an alloc or a seal; NULL or 0 for what is not given. */
typedef struct gd_meta_args {
    const gpubuf_layout *layout;
    const uint8_t *user;
    size_t user_len;
    uint64_t ttl_ms;
} gd_meta_args;

/* What a buffer is charged against the metadata quotas besides its memory:
 * its name and, when it has a layout or user bytes, the block that holds
 * them (header, dimensions, user bytes), so the bytes the daemon keeps for
 * it and writes into its saved state for it. The rest of a buffer's
 * bookkeeping is the same for every buffer and bounded by the buffer
 * quotas (docs/security.md, "Daemon memory and saved state"). */
uint64_t gd_meta_charge(const char *name, const gd_meta *m);
/* Bytes of a metadata block (0 for NULL). */
uint64_t gd_meta_bytes(const gd_meta *m);
/* May h's client, its uid and the daemon take more bytes of metadata
 * charge? -EDQUOT naming the limit, its value and what to do. */
int gd_registry_check_meta(const gd_registry *r, const gd_holder *h, uint64_t more, gd_err *err);
/* b's metadata charge becomes charge: its creator (while connected), its
 * owner's uid and the daemon's total follow. */
void gd_registry_charge_meta(gd_registry *r, gd_buf *b, uint64_t charge);
/* gd_registry_alloc() charging extra metadata bytes beyond the name (the
 * metadata block the caller attaches). */
int gd_registry_alloc_charged(gd_registry *r, gd_holder *h, gd_pool *pool, uint64_t size,
                              uint64_t align, const char *name, uint64_t meta_extra,
                              gd_buf **ret, gd_err *err);

/* gd_registry_alloc() with metadata (meta may be NULL): -EINVAL for a layout
 * that does not fit size, user bytes beyond GPUBUF_USER_DATA_MAX or a ttl
 * beyond quota.max_lease_ms, before anything is allocated; -EDQUOT beyond a
 * metadata quota. */
int gd_registry_alloc_meta(gd_registry *r, gd_holder *h, gd_pool *pool, uint64_t size,
                           uint64_t align, const char *name, const gd_meta_args *meta,
                           gd_buf **ret, gd_err *err);
/* gd_registry_seal_event() that first sets what meta gives: a layout or
 * user bytes replace the alloc's, a ttl starts a lease from now. Waiters
 * woken by the seal see the new metadata. */
int gd_registry_seal_meta(gd_registry *r, gd_holder *h, uint64_t id, const uint8_t *event,
                          const gd_meta_args *meta, gd_buf **ret, gd_err *err);
/* Renew the lease of the buffer t names: it expires ttl_ms from now (0: its
 * ttl again). Owner's uid or root only (-EPERM); -EINVAL for ttl 0 without a
 * lease or beyond max_lease_ms. */
int gd_registry_renew(gd_registry *r, gd_holder *h, const gd_target *t, uint64_t ttl_ms,
                      gd_buf **ret, gd_err *err);
/* Expire the leases due at now_ns, at most max of them (the earliest): each
 * buffer is deleted (its name goes) and freed once nobody holds it. Returns
 * how many expired. */
uint32_t gd_registry_expire(gd_registry *r, uint64_t now_ns, uint32_t max);
/* When the earliest lease expires (gpubuf_now_ns() clock); 0: no lease. */
uint64_t gd_registry_next_expiry(const gd_registry *r);
/* Milliseconds left of b's lease at now_ns, at least 1; 0: no lease. */
uint64_t gd_registry_lease_left_ms(const gd_buf *b, uint64_t now_ns);
/* b's layout into ret (strides filled in): false when it has none. */
bool gd_meta_layout(const gd_buf *b, gpubuf_layout *ret);
/* b's user bytes (NULL when none), their count in *ret_len. */
const uint8_t *gd_meta_user(const gd_buf *b, size_t *ret_len);
/* Restore b's metadata (state.c; b restored without any): what a gives,
 * checked as an alloc's (-EINVAL: the saved state is input), and with
 * a->ttl_ms a lease that expires at expires_ns (gpubuf_now_ns() clock; one
 * already past is due at once: the lease timer expires it). */
int gd_registry_restore_meta(gd_registry *r, gd_buf *b, const gd_meta_args *a,
                             uint64_t expires_ns, gd_err *err);
/* b changed outside registry.c (meta.c): journal it. */
void gd_registry_changed(gd_registry *r, const gd_buf *b);

void gd_registry_wait(gd_registry *r, gd_waiter *w);
/* Remove a waiter without calling back (timeout, reply already sent). */
void gd_registry_unwait(gd_registry *r, gd_waiter *w);

#endif
