/* libgpubuf-client internals: connection, mapping cache, views. */
#ifndef GPUBUF_CLIENT_INTERNAL_H
#define GPUBUF_CLIENT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include "hash.h"
#include <utlist.h>

#include "arena.h"
#include "cuda_driver.h"
#include "gpubuf.pb-c.h"
#include "gpubuf/gpubuf.h"
#include "wire.h"

#define GPUBUF_MAX_DEVICES 64
/* Slabs a connection keeps mapped after their last view goes (fewer if the
 * daemon allows fewer): reusing one costs no import (cuIpcOpenMemHandle or
 * mmap) and no unmap. */
#define GPUBUF_KEEP_SLABS 4

/* One slab mapped into this process, shared by all views in it. */
typedef struct gpubuf_mapping {
    uint64_t key;       /* slab_id * 2 + read_only: the cache's key */
    uint64_t slab_id;
    gpubuf_pool_kind kind;
    uint64_t size;
    uint64_t base;      /* device address (cuda) or host address (host) */
    void *host;         /* host pools: the mmap'ed slab */
    int device;         /* local ordinal of the context it is mapped in, -1 for host */
    int home;           /* local ordinal of the GPU holding the memory, -1 for host */
    uint32_t views;     /* root views using it (under the client's lock) */
    bool keepable;      /* the daemon lets this connection keep it mapped */
    bool kept;          /* the daemon pinned it for us: Unmap when we unmap it */
    bool read_only;     /* mapped PROT_READ (host) or CU_MEM_ACCESS_FLAGS_PROT_READ (cuda-vmm) */
    bool orphan;        /* of a session gpubufd restarted without: out of the cache, its
                         * slab id means nothing to the daemon; unmapped with its last view */
    struct gpubuf_mapping *idle_prev, *idle_next; /* views == 0 and kept: LRU list (utlist DL) */
#ifdef GPUBUF_HAVE_CUDA
    CUcontext ctx;
    CUmemGenericAllocationHandle vmm; /* cuda-vmm: the imported allocation */
#endif
    UT_hash_handle hh;
} gpubuf_mapping;

/* References this connection's live root views hold to one buffer: what a
 * resume after a daemon restart claims back (Hello.held). */
typedef struct gpubuf_held {
    uint64_t id;
    uint32_t count, ro;
    uint32_t gen;       /* gpubuf_client.gen when the first of these views was made */
    UT_hash_handle hh;
} gpubuf_held;

/* reply_fast.c: where a reply read by gpubuf_dispatch(), or a blocking
 * call's reply of the common shape, is unpacked (one at a time; what does
 * not fit comes from malloc). */
typedef struct gpubuf__arena {
    gpubuf_arena a;         /* over block (common/arena.h) */
    Gpubuf__Response *live; /* the reply unpacked here and not yet freed */
    _Alignas(16) unsigned char block[4096];
    /* The replies a blocking call reads (a batch's, mostly), one at a time,
     * into a heap block grown to their size (reply_fast.c). */
    gpubuf_arena big;
    Gpubuf__Response *big_live;
    unsigned char *big_block;
    size_t big_cap;
} gpubuf__arena;

/* Reconnecting after the daemon went away (docs/client-api.md, "Restart"). */
#define GPUBUF_RECONNECT_MS_DEFAULT 10000 /* keep trying that long */
/* How long a thread waiting for a reply polls before it sleeps, in µs, at
 * most (GPUBUF_SPIN_US at gpubuf_connect(): 0 to 1000; see conn.c). */
#define GPUBUF_SPIN_US_DEFAULT 50
#define GPUBUF_SPIN_US_MAX 1000
#define GPUBUF_RECONNECT_FIRST_MS 10      /* first pause, doubling ... */
#define GPUBUF_RECONNECT_MAX_PAUSE_MS 500 /* ... up to this */

struct gpubuf_client {
    int fd;
    char path[108];      /* the daemon's socket (reconnects) */
    int reconnect_ms;    /* how long a reconnect keeps trying; 0: never reconnect */
    /* Called (lock held) when the connection went, before the session is
     * resumed: the mapping layer forgets the slabs it kept (set at connect;
     * the connection layer does not call up into it). */
    void (*on_reconnect)(struct gpubuf_client *c);
    /* Called (lock held) when the daemon restarted without the session that
     * held references: the mapping layer takes the slabs of the old session
     * out of its cache (their ids may name other slabs now). */
    void (*on_session_lost)(struct gpubuf_client *c);
    bool closing;        /* gpubuf_disconnect() runs: no reconnect */
    bool in_hello;       /* the handshake runs: a failure is not reconnected */
    uint32_t reconnects; /* reconnects that resumed the session */
    /* Bumped when a reconnect closes the socket: a request sent ahead
     * (gpubuf__rpc_start_locked) belongs to the connection of its number. */
    uint32_t conn_no;
    /* Requests sent ahead whose reply is not read yet: while there are any,
     * asynchronous requests do not drain their replies (the next reply on
     * the stream may be one of those). */
    unsigned ahead;
    /* The connection (conn_no) whose daemon said, in its shutdown notice,
     * that it handled no request after the one that read the notice. */
    uint32_t shut_conn;
    bool shut_known;
    gpubuf_held *held;   /* by buffer id */
    /* Root views released, kept for the next ones (linked by parent; at
     * most GPUBUF_SPARE_VIEWS): a batch of 1,000 opens and its release
     * no longer make glibc give the heap's top back and grow it again. */
    struct gpubuf_buffer *spare;
    unsigned n_spare;
    /* Held entries whose count fell to 0, kept for the next ones (linked
     * by hh.next; at most GPUBUF_SPARE_VIEWS). */
    gpubuf_held *spare_held;
    unsigned n_spare_held;
    /* Bumped when references of views are lost at a reconnect (the session
     * was not resumed, or some of its buffers were gone): a root view is
     * live while its buffer's held entry exists and is no newer than it. */
    uint32_t gen;
    uint32_t resume_refs; /* references the last resume kept */
    /* The last reconnect found the daemon without the session that held
     * references: the next call reports it (resume_why says why). */
    bool session_lost;
    char resume_why[192];
    atomic_int refs;     /* the connection itself + every live root view */
    pthread_mutex_t lock; /* serialises requests and the mapping cache */
    uint64_t next_id;
    uint64_t acked_id;   /* id of the last reply read: the daemon applied every request up to it */
    uint64_t session_id;
    uint32_t max_request;
    uint32_t max_batch_items; /* HelloReply: 0 when the daemon has no batches */
    bool broken;         /* the stream is out of sync or closed */
    uint32_t pending;    /* asynchronous requests (seal, release) not yet answered */
    /* Reply bytes read ahead: one recvmsg often brings several replies. */
    uint8_t *rbuf;
    size_t rpos, rlen, rcap;
    /* fds received but not yet claimed by their frame, in stream order: one
     * recvmsg brings those of one frame at most, and a frame's are claimed
     * before those of the second frame after it arrive. */
    int rfds[2 * GPUBUF_WIRE_MAX_FDS];
    int n_rfds;
    int async_error;     /* first error an asynchronous request got, 0 if none */
    /* async.c: requests started for an event loop (docs/client-api.md,
     * "Event loops"). ops (uthash by request id, lock held): sent, not yet
     * answered; ready (utlist LL, qlock held): answered, not yet delivered. */
    struct gpubuf_op *ops;
    struct gpubuf_op *ready;
    struct gpubuf_many *manys; /* async_many.c: batches started, not complete (utlist DL; lock) */
    /* The event-loop layer's hooks: set (lock held) by async.c when a
     * connection first uses it (gpubuf_client_fd(), a _start call); NULL
     * until then, when nothing of it exists to tell. The connection layer
     * (conn.c) and gpubuf_disconnect() reach the layer above them only
     * through these, never by name. */
    const struct gpubuf__async_hooks *async_hooks;
    /* async_many.c's, set (lock held) when the first batch starts: what
     * async.c calls for a batch's requests (async_internal.h). */
    const struct gpubuf__many_hooks *many_hooks;
    pthread_mutex_t qlock; /* the ready list and the eventfd; taken inside lock */
    int ep, efd;         /* gpubuf_client_fd(): epoll over fd and efd; -1 until asked */
    bool nonblock;       /* read_reply() returns -EAGAIN instead of blocking */
    bool batch_wait;     /* rpc_wait() waits for a batch's reply (reply_fast.c) */
    bool rshort;         /* the last read without blocking was short (conn.c) */
    bool dispatching;    /* gpubuf_dispatch() settles replies: no eventfd kick (async.c) */
    bool kicked;         /* the eventfd was written since it was last read (qlock) */
    /* Waiting for a reply, the thread polls the socket without sleeping
     * until spin_max_ns after the send (0: never), while spin_score >= 0:
     * replies mostly came within that time (conn.c). A thread that sleeps
     * pays the wake-up's latency and comes back to cold caches. sent_ns:
     * the last send. */
    uint64_t spin_max_ns, sent_ns;
    int spin_score;
    gpubuf__arena arena; /* replies unpacked without malloc (reply_fast.c; lock held) */
    gpubuf_mapping *maps;
    uint32_t n_maps;
    int device;          /* gpubuf_set_device(): context to map into, -1: the memory's GPU */
    uint32_t keep_cap;   /* slabs it may keep mapped (0: not granted by the daemon) */
    uint32_t n_kept;     /* mappings with kept set */
    uint32_t n_idle;     /* kept mappings without views, on the idle list */
    gpubuf_mapping *idle; /* utlist DL, most recently idle first (head->idle_prev: the tail) */
#ifdef GPUBUF_HAVE_CUDA
    /* Interprocess events recorded by gpubuf_seal_stream(). One lives until
     * the sealing view is released, the daemon has answered that release (it
     * hands the event out no more: released_at <= acked_id) and it has
     * completed; swept at each stream seal and flush. All are waited for
     * before the daemon learns of a disconnect, so a consumer never waits on
     * work that was cut off. */
    struct gpubuf_event_rec {
        CUevent ev;
        uint64_t released_at; /* request id of the sealing view's release, 0 while it lives */
        /* The sealing view went while the event ran: its release waits here. */
        gpubuf_mapping *deferred_map;
        uint64_t deferred_id;
        bool deferred_ro;
    } *events;
    uint32_t n_events, cap_events;
    /* Primary contexts retained by this connection, by local ordinal: held
     * until the connection goes, so that unmapping the last slab of a
     * device does not destroy its context (creating one took ~170 ms on the H200). */
    CUcontext ctx[GPUBUF_MAX_DEVICES];
#endif
};

struct gpubuf_buffer {
    atomic_int refs;
    gpubuf_client *c;
    gpubuf_buffer *parent; /* slices: the view they keep alive */
    gpubuf_mapping *map;   /* shared mapping (root views own one view count) */
    uint64_t id;
    uint64_t offset;       /* of the view's first byte inside the slab */
    uint64_t size;
    bool owns_ref;         /* root view: holds one daemon reference */
    bool allocated;        /* root view returned by gpubuf_alloc */
    bool sealable;         /* allocated by this connection and not sealed yet */
    bool read_only;        /* opened with GPUBUF_OPEN_READONLY */
    bool has_event;        /* root views: the sealer recorded event_handle */
    uint32_t gen;          /* root views: gpubuf_client.gen when made */
    uint8_t event_handle[64];
#ifdef GPUBUF_HAVE_CUDA
    CUevent event;         /* event_handle, imported when the view was made */
    CUevent own_event;     /* the event this connection sealed it with (in c->events) */
#endif
    char name[GPUBUF_NAME_MAX + 1];
    gpubuf_layout *layout; /* root views: the buffer's layout, NULL if none (meta.c) */
    uint8_t *user;         /* root views: its user bytes, NULL if none */
    size_t user_len;
};

/* ---- client.c: connections; the public entry points of the verbs --------- */
/* Sanitizer builds keep no spare views, so a use after release is caught. */
#if defined(__SANITIZE_ADDRESS__)
#define GPUBUF_SPARE_VIEWS 0u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPUBUF_SPARE_VIEWS 0u
#endif
#endif
#ifndef GPUBUF_SPARE_VIEWS
#define GPUBUF_SPARE_VIEWS 4096u
#endif
/* A root view's memory, released (lock held): kept as a spare or freed. */
void gpubuf__view_recycle(gpubuf_client *c, gpubuf_buffer *b);

/* ---- lifecycle.c: the buffer life cycle's requests (the arguments are
 * checked by the public entry points of client.c). 0 or an error, with its
 * message set. */
/* A request answered with a Buffer that becomes a root view (alloc,
 * open, and meta.c's alloc with metadata). */
int gpubuf__buffer_request(gpubuf_client *c, Gpubuf__Request *req, gpubuf_buffer **ret);
/* The alloc request a, answered with the new root view (allocated, sealable). */
int gpubuf__alloc_request(gpubuf_client *c, Gpubuf__AllocRequest *a, gpubuf_buffer **ret);
int gpubuf__alloc(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                  gpubuf_buffer **ret);
/* flags: GPUBUF_OPEN_READONLY or 0. */
int gpubuf__open(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms, unsigned flags,
                 gpubuf_buffer **ret);
int gpubuf__open_with(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *opts,
                      gpubuf_buffer **ret);
/* wait: the seal's own reply (gpubuf_seal_sync); on_stream: behind the work
 * queued on stream (gpubuf_seal_stream). */
int gpubuf__seal(gpubuf_buffer *b, bool wait, gpubuf_stream stream, bool on_stream);
int gpubuf__delete(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *opts);
/* One reference of b gone; the last one of a root view releases it at the
 * daemon (b NULL: nothing to do). */
int gpubuf__release(gpubuf_buffer *b);
/* The last reference to c went (a view or gpubuf_disconnect). */
void gpubuf__client_unref(gpubuf_client *c);

/* ---- verbs_common.c: what the verbs (lifecycle.c, meta.c, batch.c) and the
 * event-loop layer (async.c) share: names and lookups, buffer info, the seal
 * check; over view.c ------------------------------------------------------- */
/* What open, stat, delete and renew name: the plain name and the pool it is
 * looked up in, the expected owner. */
typedef struct lookup {
    const char *name; /* NULL: by id */
    uint64_t id;
    char pool[GPUBUF_NAME_MAX + 1]; /* "" : the default pool (any pool by id) */
    bool has_owner;
    Gpubuf__ExpectedOwner owner;
} lookup;
/* Split a name ("NAME" or "/POOL/NAME") and merge o into l; fill a
 * request's target from it. */
int gpubuf__lookup_make(const char *what, const char *name, uint64_t id, const gpubuf_lookup *o,
                        unsigned allowed, lookup *l);
bool gpubuf__lookup_fill(lookup *l, char **name, uint64_t *id, char **pool,
                         Gpubuf__ExpectedOwner **owner);
/* An open request's target, wait and access from name or id and o; l holds
 * the split name. 0 or a negative code with the thread's message set. */
int gpubuf__open_fill(Gpubuf__OpenRequest *q, lookup *l, const char *name, uint64_t id,
                      const gpubuf_lookup *o);
/* An alloc request's pool, size and name ("NAME" or "/POOL/NAME", NULL or
 * "": anonymous) in a; l holds the split name. 0 or a negative code with
 * the thread's message set. */
int gpubuf__alloc_fill(Gpubuf__AllocRequest *a, const char *pool, uint64_t size,
                       const char *name, lookup *l);
/* The fields of the Buffer message m that the public gpubuf_buffer_info and
 * gpubuf_status_buffer o share by name. */
#define GPUBUF_COPY_BUFFER_FIELDS(o, m)                                                            \
    do {                                                                                           \
        (o)->size = (m)->size;                                                                     \
        (o)->state = (gpubuf_state)(m)->state;                                                     \
        (o)->refs = (m)->refs;                                                                     \
        (o)->owner_uid = (m)->owner_uid;                                                           \
        (o)->offset = (m)->offset;                                                                 \
        (o)->slab_id = (m)->slab_id;                                                               \
    } while (0)
/* The fields of a Buffer message as the public gpubuf_buffer_info. */
void gpubuf__copy_info(gpubuf_buffer_info *o, const Gpubuf__Buffer *m);
/* What the daemon could refuse a seal of b for, checked here: 0, GPUBUF_ESTATE
 * or -EPERM with a message. *pb becomes the root view (a slice seals the
 * buffer it belongs to). */
int gpubuf__seal_check(gpubuf_buffer **pb);

/* ---- meta.c: metadata requests --------------------------------------------- */
/* A stat request (by name or id, looked up as o says) into ret, and the
 * buffer's metadata into ret_meta when it is not NULL. */
int gpubuf__stat_meta(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *o,
                      gpubuf_buffer_info *ret, gpubuf_buffer_meta *ret_meta);

/* ---- stream.c: seal events and stream waits (CUDA) ------------------------- */
/* Destroy those of c->events that completed; with wait, wait for all of
 * them first (lock held). */
void gpubuf__events_sweep(gpubuf_client *c, bool wait);
/* The sealing view b goes while its event runs: keep its reference and
 * mapping in the event's record, released by a later sweep. Returns false
 * (nothing deferred) when the event has completed (lock held). */
bool gpubuf__event_defer(gpubuf_client *c, gpubuf_buffer *b);
/* The sealing view b goes; release_id is its release request (lock held). */
void gpubuf__event_released(gpubuf_client *c, gpubuf_buffer *b, uint64_t release_id);
/* Record an interprocess event on stream for the root view b, keep it in
 * c->events and write its IPC handle into ret_handle (lock held). -EINVAL
 * for host pools. */
int gpubuf__record_event(gpubuf_client *c, gpubuf_buffer *b, gpubuf_stream stream,
                         uint8_t ret_handle[64]);

/* ---- view.c: root views, the held set, the release request ----------------- */
/* The root view the Buffer reply m describes (lock held; consumes fd). When
 * it cannot be made, the reference the reply gave is handed back. */
int gpubuf__view_from_reply(gpubuf_client *c, const Gpubuf__Buffer *m, int fd,
                            gpubuf_buffer **ret);
/* A new root view of buffer id at offset (size bytes) of map, which gives
 * it one view count (lock held). */
int gpubuf__view_new(gpubuf_client *c, gpubuf_mapping *map, uint64_t id, uint64_t offset,
                     uint64_t size, const char *name, bool read_only, const uint8_t *event,
                     gpubuf_buffer **ret);
/* A root view took (add) or gave back (!add) one reference to id (lock held). */
void gpubuf__held(gpubuf_client *c, uint64_t id, bool read_only, bool add);
/* The root view of b still holds its daemon reference: gpubufd did not
 * restart without its session or its buffer (lock held). */
bool gpubuf__view_live(const gpubuf_buffer *b);
/* 0 when b's root view is live; else GPUBUF_ENOTHELD with a message that
 * says what happened and what to do (lock held). */
int gpubuf__view_check(const gpubuf_buffer *b);
/* Tell the daemon to drop one reference of buffer id (lock held; asynchronous). */
int gpubuf__send_release(gpubuf_client *c, uint64_t id, bool keep_mapped, bool read_only);
/* Drop one daemon reference of buffer id whose view maps map: unmap or keep
 * the slab, then send the release (lock held). */
int gpubuf__release_locked(gpubuf_client *c, uint64_t id, gpubuf_mapping *map, bool read_only);

/* ---- meta_view.c: what views and status snapshots carry of metadata -------- */
/* The layout and user bytes of the Buffer reply m on the new root view b:
 * -ENOMEM, or GPUBUF_EPROTOCOL for a malformed layout. */
int gpubuf__view_meta(gpubuf_buffer *b, const Gpubuf__Buffer *m);
/* Free what gpubuf__view_meta() attached. */
void gpubuf__view_meta_free(gpubuf_buffer *b);
/* The metadata columns of a status reply are consistent with its n buffers. */
bool gpubuf__meta_columns_ok(const Gpubuf__BufferColumns *c, size_t n);
/* Fill s->buffer_meta and the lease counters from st (columns col, or the
 * buffers of st when col is NULL). -ENOMEM. */
int gpubuf__status_meta(gpubuf_status *s, const Gpubuf__StatusReply *st,
                        const Gpubuf__BufferColumns *col);

/* ---- mapping.c: the mapping cache ------------------------------------------ */
/* Map (or find) the slab described by msg; takes one view count. Consumes fd. */
int gpubuf__mapping_get(gpubuf_client *c, const Gpubuf__Slab *msg, int fd,
                        gpubuf_mapping **ret);
/* One more view count of a mapping of the cache (lock held). */
void gpubuf__mapping_hold(gpubuf_client *c, gpubuf_mapping *m);
/* Drop one view count (lock held). At zero the slab is kept mapped (idle)
 * when the daemon allows it, else unmapped. Returns true when the release
 * that follows must ask the daemon to keep the slab (first keep). */
bool gpubuf__mapping_put(gpubuf_client *c, gpubuf_mapping *m);
/* The same; without evict no kept slab is unmapped to make room (its unmap
 * would reach the daemon before the releases of a batch that pin the
 * slabs kept meanwhile): the slab is unmapped instead. */
bool gpubuf__mapping_put_ex(gpubuf_client *c, gpubuf_mapping *m, bool evict);
/* Unmap the idle slabs (of CUDA pools only, if cuda_only), telling the daemon
 * when tell is set (lock held). */
void gpubuf__mapping_drop_idle(gpubuf_client *c, bool cuda_only, bool tell);
/* The daemon pins no slab for a resumed session: unmap the idle slabs kept
 * without a view, and keep none (gpubuf_client.on_reconnect). */
void gpubuf__mapping_forget_kept(gpubuf_client *c);
/* The daemon restarted without the session: take every mapping out of the
 * cache; each is unmapped when its last view goes (gpubuf_client.on_session_lost). */
void gpubuf__mapping_orphan_all(gpubuf_client *c);
/* Unmap everything and release retained contexts (last reference gone). */
void gpubuf__mapping_clear(gpubuf_client *c);

/* ---- async.c: requests for event loops ------------------------------------ */
typedef struct gpubuf_op gpubuf_op;
/* What the connection layer (conn.c) and gpubuf_disconnect() tell the
 * event-loop layer, through c->async_hooks (each lock held unless said). */
struct gpubuf__async_hooks {
    /* resp answers a started request: consume it (and its fds) into a
     * completion and return true. */
    bool (*reply)(gpubuf_client *c, Gpubuf__Response *resp, int *fds, int n_fds);
    /* The connection went: every started request ends with r, once. */
    void (*fail_all)(gpubuf_client *c, int r);
    /* After a synchronous call: bytes read ahead wait for dispatch. */
    void (*kick)(gpubuf_client *c);
    /* The socket is new (reconnect): watch it in the epoll fd. */
    void (*watch)(gpubuf_client *c);
    /* gpubuf_disconnect(): complete and deliver what is started (lock not held). */
    void (*close)(gpubuf_client *c);
    /* Close the epoll fd and the eventfd (last reference; lock not held). */
    void (*free)(gpubuf_client *c);
};

/* ---- batch_call.c: what every batch call shares ------------------------------ */
/* One batch call's bookkeeping: item results and the first failure. */
typedef struct gpubuf_batch_call {
    gpubuf_client *c;
    size_t n;
    int *status; /* the caller's array, or ours */
    int failed;
    char first[384]; /* the message of the first failed item */
} gpubuf_batch_call;

/* Set up bc for n items (status: the caller's array, or one of ours). */
int gpubuf__batch_init(gpubuf_batch_call *bc, gpubuf_client *c, size_t n, int *ret_status);
/* gpubuf__batch_init on c, whose daemon must take batches (0, or an error). */
int gpubuf__batch_start(gpubuf_batch_call *bc, gpubuf_client *c, size_t n, int *ret_status);
/* Item i failed with r (msg: the daemon's sentence, or NULL). */
void gpubuf__batch_fail(gpubuf_batch_call *bc, size_t i, int r, const char *msg);
/* The end of the batch call: the number of failed items, or err. */
int gpubuf__batch_end(gpubuf_batch_call *bc, int *ret_status, int err);
/* The daemon's sentence for item i of br, or NULL. */
const char *gpubuf__batch_message(const Gpubuf__BatchReply *br, size_t i);
/* How many of the items idx[0..n) (or 0..n without idx) fit one request;
 * reserve: bytes taken by other fields. At least one. */
size_t gpubuf__batch_chunk_len(const gpubuf_client *c, const size_t *idx, size_t n,
                               const char *const *names, size_t reserve);
/* A batch request of n items and its reply, checked to carry n results
 * (lock held). */
int gpubuf__batch_rpc(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret, int *fds,
                      int *n_fds, size_t n);
/* The reply of a batch request sent ahead (gpubuf__rpc_start_locked on
 * connection conn), checked the same way (lock held). */
int gpubuf__batch_finish(gpubuf_client *c, Gpubuf__Request *req, uint32_t conn,
                         Gpubuf__Response **ret, int *fds, int *n_fds, size_t n);

/* ---- batch.c ------------------------------------------------------------------ */
/* Views for the items of an open batch reply br (item k of the reply is item
 * idx[k] of a call of n_all items): ret[i] and status[i] set (0, or the
 * item's error), fds consumed; retry[0..*ret_n_retry) the items to send
 * again (EAGAIN: their slab did not fit). 0, or a protocol error (lock held). */
int gpubuf__batch_views(gpubuf_client *c, const Gpubuf__BatchReply *br, const int *fds,
                        int n_fds, const size_t *idx, size_t n, size_t n_all, bool read_only,
                        gpubuf_buffer **ret, int *status, size_t *retry, size_t *ret_n_retry);

/* ---- request_pack.c: packing a request by hand ------------------------------ */
/* req (an open, release, seal, alloc, stat or delete without an array
 * layout) packed as protobuf-c packs it into out (cap bytes): its length,
 * or 0 when it declines (another request, or no room): pack it with
 * protobuf-c. */
size_t gpubuf__request_pack_fast(const Gpubuf__Request *req, uint8_t *out, size_t cap);

/* ---- reply_fast.c: decoding a reply ----------------------------------------- */
/* The reply in body (len bytes), unpacked into the arena when no other
 * reply lives there and either in_arena (a reply read without blocking) or
 * it has the shape gpubuf__reply_fast decodes (a blocking call's open,
 * alloc, seal, stat, release: every reader of such a reply frees it with
 * gpubuf__resp_free, lock held); else, when batch (a blocking call waits
 * for a batch's reply) and it is a batch's reply gpubuf__reply_fast can
 * decode, into the arena's heap block; else with malloc. NULL when it is
 * malformed. */
Gpubuf__Response *gpubuf__reply_decode(gpubuf__arena *a, bool in_arena, bool batch,
                                       const uint8_t *body, size_t len);
/* A reply of the common shape (id, status, message, fds, a Buffer with its
 * Slab) decoded into the arena as protobuf-c would; NULL: not that shape
 * (the arena as it was), unpack it with protobuf-c. */
Gpubuf__Response *gpubuf__reply_fast(gpubuf__arena *a, const uint8_t *data, size_t len);
/* Free a reply, unpacked into the arena or with malloc (lock held). */
void gpubuf__resp_free(gpubuf_client *c, Gpubuf__Response *resp);
/* The arena's heap block goes (the connection is freed). */
void gpubuf__arena_free(gpubuf__arena *a);

/* ---- conn.c: the stream to the daemon -------------------------------------- */
/* Send a request whose reply gpubuf__async_reply() takes (lock held): like a
 * synchronous request's send, with the same reconnects. */
int gpubuf__send_op_locked(gpubuf_client *c, Gpubuf__Request *req);
/* Read one reply without blocking: -EAGAIN when no whole frame is there. */
int gpubuf__read_reply_nb(gpubuf_client *c, Gpubuf__Response **ret, int *fds, int *n_fds);
/* Account for a reply that no call waits for (dispatch; lock held). */
void gpubuf__settle_reply(gpubuf_client *c, Gpubuf__Response *resp, int *fds, int n_fds);
/* Send req and wait for its response (lock held by the caller).
 * *ret_fd receives an fd that came with the response, or -1. */
int gpubuf__rpc_locked(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                       int *ret_fd);
/* The same for a reply that carries no fd we need (one that came is closed),
 * of body body_case (GPUBUF__RESPONSE__BODY__NOT_SET: any); another body is
 * GPUBUF_EPROTOCOL. */
int gpubuf__rpc_reply_locked(gpubuf_client *c, Gpubuf__Request *req, int body_case,
                             Gpubuf__Response **ret);
/* The same for a reply that may carry several fds (a batch reply):
 * ret_fds[0..*ret_n_fds), at most GPUBUF_WIRE_MAX_FDS. */
int gpubuf__rpc_fds_locked(gpubuf_client *c, Gpubuf__Request *req, Gpubuf__Response **ret,
                           int *ret_fds, int *ret_n_fds);
/* The two halves of gpubuf__rpc_fds_locked(), for a batch whose next
 * request goes out before the client works on the reply before it (lock
 * held). start sends req and gives the connection's number in *ret_conn; an
 * error means nothing was sent (make the call with gpubuf__rpc_fds_locked).
 * finish reads its reply, in the order the requests were sent, with the
 * recovery of gpubuf__rpc_fds_locked; a request whose connection is gone
 * fails as one lost in flight. */
int gpubuf__rpc_start_locked(gpubuf_client *c, Gpubuf__Request *req, uint32_t *ret_conn);
int gpubuf__rpc_finish_locked(gpubuf_client *c, Gpubuf__Request *req, uint32_t conn,
                              Gpubuf__Response **ret, int *ret_fds, int *ret_n_fds);
/* Send req without waiting for its reply (lock held). Replies to such
 * requests are read, in order, before the reply of the next synchronous
 * request, or by gpubuf_flush(). */
int gpubuf__send_async_locked(gpubuf_client *c, Gpubuf__Request *req);
/* Read the replies of all asynchronous requests (lock held). */
int gpubuf__drain_locked(gpubuf_client *c);
/* The handshake (lock held): hello, and with resume the session before a
 * restart and the references in c->held; references the daemon no longer
 * has are dropped from c->held. */
int gpubuf__hello_locked(gpubuf_client *c, bool resume);

/* An old public name of the same function as new (a deprecated name keeps
 * linking, in the shared and the static library): the symbol is an alias. */
#define GPUBUF_ALIAS(new) __attribute__((alias(#new)))

/* ---- error.c: the per-thread error message --------------------------------- */
/* The argument check of a public entry, as systemd's assert_return(): when
 * cond does not hold, the call fails with err and the sentence (a printf
 * format and its arguments) as the thread's message. Every public entry that
 * takes pointers or enums checks them with it, before anything else. */
#define GPUBUF_CHECK(cond, err, ...)                                                               \
    do {                                                                                           \
        if (!(cond))                                                                               \
            return gpubuf__fail((err), __VA_ARGS__);                                               \
    } while (0)
void gpubuf__set_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Set the message and return err. */
int gpubuf__fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Start of a public call: its message starts empty. */
void gpubuf__clear_error(void);
/* End of a public call: "" on success; on failure keep the message a step
 * set, or describe r. Returns r. */
int gpubuf__result(int r);

#endif
