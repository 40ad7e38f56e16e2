/* Registry room: buffers by id and by name, their states, the references each
 * client holds, and the clients waiting for a name or id to be sealed.
 * Knows pools, not sessions or sockets: a client is a gpubuf_holder. */
#ifndef GPUBUFD_REGISTRY_H
#define GPUBUFD_REGISTRY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uthash.h>

#include "pool.h"

#define GPUBUF_EVENT_HANDLE_SIZE 64 /* sizeof(CUipcEventHandle) */

typedef struct gpubuf_buf gpubuf_buf;
typedef struct gpubuf_holder gpubuf_holder;
typedef struct gpubuf_waiter gpubuf_waiter;

struct gpubuf_buf {
    uint64_t id;
    char *name; /* NULL when anonymous */
    gpubuf_pool *pool;
    gpubuf_block blk;
    uint64_t size; /* as requested */
    gpubuf_state state;
    uint32_t refs;
    uint32_t owner_uid;
    uint64_t owner_holder; /* holder id of the creator */
    uint64_t charged;      /* bytes charged to the owner's quotas */
    bool in_name_index;
    bool has_event;        /* sealed on a stream: openers wait for event */
    uint64_t event_holder; /* the holder that recorded it (the event dies with it) */
    uint8_t event[GPUBUF_EVENT_HANDLE_SIZE];
    UT_hash_handle hh_id;
    UT_hash_handle hh_name;
};

/* One (holder, buffer) reference count. */
typedef struct gpubuf_ref {
    uint64_t buffer_id;
    uint32_t count;
    uint32_t ro;       /* of count, references opened read-only */
    UT_hash_handle hh;
} gpubuf_ref;

/* A slab in which a holder references buffers, or which it keeps mapped:
 * its process has the slab mapped, so the holder's next allocations are
 * placed there first. */
typedef struct gpubuf_holder_slab {
    uint64_t slab_id;
    gpubuf_slab *slab;
    uint32_t buffers; /* distinct buffers referenced in it */
    bool kept;        /* pinned: the client keeps it mapped (KEEP_MAPPED) */
    UT_hash_handle hh;
} gpubuf_holder_slab;

/* Slabs offered to the pool per allocation, at most. */
#define GPUBUF_PREFER_SLABS 16

struct gpubuf_holder {
    uint64_t id;
    pid_t pid;
    uid_t uid;
    gid_t gid;
    gpubuf_ref *refs;     /* by buffer id */
    gpubuf_holder_slab *slabs; /* by slab id: slabs of the buffers in refs */
    uint32_t n_kept;      /* entries of slabs with kept set */
    uint32_t kept_cap;    /* slabs it may keep: quota.kept_slabs_per_client at hello */
    uint32_t n_refs;      /* sum of counts */
    uint32_t n_ro_refs;   /* sum of ro */
    uint32_t n_owned;     /* live buffers this client allocated */
    uint64_t owned_bytes;
    gpubuf_waiter *waiters; /* this holder's pending waits */
    UT_hash_handle hh;
};

/* A pending open(). The caller embeds it and fills target and callbacks.
 * wake(): the buffer was sealed and a reference was taken for the holder.
 * The registry unlinks a waiter before calling wake(); the waiter is not
 * touched after either callback returns. */
struct gpubuf_waiter {
    gpubuf_holder *holder;
    char *name;           /* target name, or NULL for by-id */
    uint64_t buffer_id;
    void (*wake)(gpubuf_waiter *w, gpubuf_buf *b);
    void (*cancel)(gpubuf_waiter *w); /* holder dropped */
    /* The awaited buffer (by id) went away before it was sealed. */
    void (*fail)(gpubuf_waiter *w, int err);
    gpubuf_waiter *next, *prev;       /* registry list */
    gpubuf_waiter *hnext, *hprev;     /* holder list */
};

/* What one uid owns (buffers outlive the client that made them). */
typedef struct gpubuf_uid_usage {
    uid_t uid;
    uint32_t buffers;
    uint64_t bytes;
    UT_hash_handle hh;
} gpubuf_uid_usage;

/* Quotas; 0 means no limit. */
typedef struct gpubuf_quota {
    uint32_t buffers_per_client;
    uint64_t bytes_per_client;
    uint32_t buffers_per_uid;
    uint64_t bytes_per_uid;
    uint32_t refs_per_client;
    /* Slabs a client may keep mapped, fixed for a session at its hello (a
     * reload must not strand slabs a client already maps); 0: none. */
    uint32_t kept_slabs_per_client;
} gpubuf_quota;

typedef struct gpubuf_registry {
    gpubuf_quota quota;
    gpubuf_uid_usage *uids;
    gpubuf_buf *by_id;
    gpubuf_buf *by_name;
    gpubuf_holder *holders;
    gpubuf_waiter *waiters;
    uint64_t next_buffer_id;
    uint64_t next_holder_id;
    uint32_t n_buffers;
    uint32_t n_waiters;
    uint64_t freed_buffers; /* counters for status/metrics */
    char last_error[256];
} gpubuf_registry;

void gpubuf_registry_init(gpubuf_registry *r);
/* Frees every buffer (returning blocks to pools) and holder. */
void gpubuf_registry_destroy(gpubuf_registry *r);

gpubuf_holder *gpubuf_registry_holder_new(gpubuf_registry *r, pid_t pid, uid_t uid, gid_t gid);
/* The client went away: cancel its waits, drop all its references, delete
 * buffers it allocated and never sealed. */
void gpubuf_registry_holder_drop(gpubuf_registry *r, gpubuf_holder *h);

gpubuf_buf *gpubuf_registry_find_id(gpubuf_registry *r, uint64_t id);
gpubuf_buf *gpubuf_registry_find_name(gpubuf_registry *r, const char *name);
uint32_t gpubuf_registry_holder_count(gpubuf_holder *h, uint64_t buffer_id);

/* All return 0 or a negative code, with a sentence in r->last_error. */
int gpubuf_registry_alloc(gpubuf_registry *r, gpubuf_holder *h, gpubuf_pool *pool, uint64_t size,
                          uint64_t align, const char *name, gpubuf_buf **ret);
int gpubuf_registry_seal(gpubuf_registry *r, gpubuf_holder *h, uint64_t id, gpubuf_buf **ret);
/* Seal with the CUDA IPC event the sealer recorded after writing (NULL: none;
 * -EINVAL for a host pool), so that waiters woken by the seal get it. */
int gpubuf_registry_seal_event(gpubuf_registry *r, gpubuf_holder *h, uint64_t id,
                               const uint8_t *event, gpubuf_buf **ret);
/* The buffer's seal event while its sealer is connected, else NULL: a
 * producer's CUDA events die with its process. */
const uint8_t *gpubuf_registry_event(gpubuf_registry *r, const gpubuf_buf *b);
/* Mark one of the holder's references to id as read-only (after an open), or
 * unmark one (before releasing a read-only reference). */
void gpubuf_registry_ref_ro(gpubuf_holder *h, uint64_t id, bool add);
/* Take a reference to a sealed buffer. -ENOENT when the name/id is unknown
 * or not sealed yet (the caller may then wait). */
int gpubuf_registry_open(gpubuf_registry *r, gpubuf_holder *h, const char *name, uint64_t id,
                         gpubuf_buf **ret);
int gpubuf_registry_release(gpubuf_registry *r, gpubuf_holder *h, uint64_t id);
/* Release; with keep, the holder also keeps the buffer's slab mapped: the
 * slab stays (pinned) until gpubuf_registry_unmap() or the holder goes.
 * -EINVAL for a dedicated slab, -EDQUOT beyond kept_slabs_per_client (the
 * reference is released either way). */
int gpubuf_registry_release_keep(gpubuf_registry *r, gpubuf_holder *h, uint64_t id, bool keep);
/* The holder no longer maps slab_id. GPUBUF_ENOTHELD when it kept no such
 * slab. */
int gpubuf_registry_unmap(gpubuf_registry *r, gpubuf_holder *h, uint64_t slab_id);
int gpubuf_registry_delete(gpubuf_registry *r, gpubuf_holder *h, const char *name, uint64_t id);

void gpubuf_registry_wait(gpubuf_registry *r, gpubuf_waiter *w);
/* Remove a waiter without calling back (timeout, reply already sent). */
void gpubuf_registry_unwait(gpubuf_registry *r, gpubuf_waiter *w);

#endif
