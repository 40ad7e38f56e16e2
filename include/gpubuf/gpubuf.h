/*
 * libgpubuf-client: share GPU (and host) memory between processes through gpubufd.
 *
 * Conventions (see docs/client-api.md):
 *  - Every function that can fail returns 0 or a negative error code: -errno
 *    (for example -ENOENT, -EEXIST, -ENOMEM, -ETIMEDOUT) or one of GPUBUF_E*.
 *    gpubuf_strerror() turns any of them into a sentence.
 *  - Out-parameters are named ret and come last; they are written only on success.
 *  - Destructors and accessors accept NULL. Every other entry checks its
 *    arguments: a NULL it needs, or a value out of range, fails with -EINVAL
 *    (and a sentence in gpubuf_last_error_message()).
 *  - Names: no suffix = by name, with default options; _id = by id; _with =
 *    takes an options struct (gpubuf_lookup, gpubuf_meta); _sync = waits for
 *    the daemon's answer where the plain call does not; _many = a batch;
 *    _async = enqueued on a CUDA stream; _meta = also returns the buffer's
 *    metadata; _at = one entry of a status snapshot. Older names that broke
 *    these rules stay as deprecated aliases (docs/client-api.md, "Names").
 *  - Device addresses are uint64_t, never void *: they are not CPU pointers.
 *  - A gpubuf_client is thread-safe: calls from several threads are serialised on
 *    its connection. A gpubuf_buffer may be used from any thread; its reference
 *    count is atomic.
 */
#ifndef GPUBUF_GPUBUF_H
#define GPUBUF_GPUBUF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every public function carries GPUBUF_EXTERN: the library builds with
 * hidden visibility and exports these alone. GPUBUF_DEPRECATED marks an old
 * name that still links; its message names the function to use instead. */
#if defined(__GNUC__) || defined(__clang__)
#define GPUBUF_EXTERN __attribute__((visibility("default")))
#define GPUBUF_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define GPUBUF_EXTERN
#define GPUBUF_DEPRECATED(msg)
#endif

/** Protocol version spoken by this library. */
#define GPUBUF_PROTOCOL_VERSION 1

/** Default socket path when neither an argument nor $GPUBUF_SOCKET names one. */
#define GPUBUF_DEFAULT_SOCKET "/run/gpubuf/gpubufd.sock"

/** Longest buffer or pool name, in bytes, without the terminating NUL. */
#define GPUBUF_NAME_MAX 255

/** gpubuf-specific error codes; all other errors are -errno. */
enum gpubuf_error {
    GPUBUF_EPROTOCOL = -1001,     /**< malformed or unexpected message */
    GPUBUF_EVERSION = -1002,      /**< no common protocol version */
    GPUBUF_ECUDA = -1003,         /**< a CUDA driver call failed */
    GPUBUF_ENODRIVER = -1004,     /**< the CUDA driver (libcuda.so.1) could not be loaded */
    GPUBUF_ENODEVICE = -1005,     /**< the buffer's GPU is not visible in this process */
    GPUBUF_ESTATE = -1006,        /**< operation not allowed in the buffer's state */
    GPUBUF_ENOPOOL = -1007,       /**< no pool of that name */
    GPUBUF_EPOOLFULL = -1008,     /**< the pool is full, or the request is larger than the pool */
    GPUBUF_ENOTHELD = -1009,      /**< this client holds no reference to that buffer */
    GPUBUF_EDISCONNECTED = -1010, /**< the daemon closed the connection */
    GPUBUF_ERANGE = -1011,        /**< offset or length outside the buffer */
    GPUBUF_ENOPEER = -1012,       /**< the chosen GPU cannot access the buffer's GPU */
};

/** Kind of memory behind a pool. */
typedef enum gpubuf_pool_kind {
    GPUBUF_POOL_HOST = 1,      /**< memfd shared memory (no GPU) */
    GPUBUF_POOL_CUDA_IPC = 2,  /**< CUDA device memory shared with cuIpcGetMemHandle */
    GPUBUF_POOL_CUDA_VMM = 3,  /**< CUDA VMM memory (cuMemCreate), shared as a file descriptor */
} gpubuf_pool_kind;

/** Life-cycle state of a buffer in the daemon. */
typedef enum gpubuf_state {
    GPUBUF_STATE_ALLOCATED = 1, /**< writable by its creator, not yet visible */
    GPUBUF_STATE_SEALED = 2,    /**< published: others may open it */
    GPUBUF_STATE_DELETED = 3,   /**< unpublished; freed when the last reference goes */
} gpubuf_state;

/** Flags of gpubuf_lookup (gpubuf_open_with() and the calls that look up as it does). */
enum gpubuf_open_flag {
    /** Map the buffer read-only. Enforced by the kernel on host pools (the
     * daemon sends a read-only file description, mapped PROT_READ) and by the
     * GPU on cuda-vmm pools (cuMemSetAccess with CU_MEM_ACCESS_FLAGS_PROT_READ:
     * a kernel that writes faults in this process alone). cuda-ipc memory
     * cannot be mapped read-only: such opens fail with -EOPNOTSUPP. */
    GPUBUF_OPEN_READONLY = 1u << 0,
    /** gpubuf_lookup.owner_uid is set: the buffer must belong to that uid
     * (gpubuf_open_with(), gpubuf_stat_with(), gpubuf_delete_with()). */
    GPUBUF_OPEN_OWNER = 1u << 1,
};

/**
 * Where a name is looked up, and whose buffer it must be: the options of
 * gpubuf_open_with(), gpubuf_stat_with() and gpubuf_delete_with().
 * Zero-initialise it, then set what you need; NULL means all zero.
 *
 * Names are per pool. A name is looked up in ONE pool: pool when set, else
 * the pool of a qualified name "/POOL/NAME", else the daemon's default pool
 * (its first). Only the uids a pool allows (and, when the pool restricts
 * them, its publishers) can give a buffer a name there, so a consumer that
 * names the pool, or the owner, of the buffer it expects cannot be handed
 * another user's buffer (see docs/security.md, "Names").
 */
typedef struct gpubuf_lookup {
    const char *pool;   /**< NULL: from the name, else the default pool. With a
                             qualified name, both must agree (-EINVAL). */
    unsigned flags;     /**< GPUBUF_OPEN_READONLY (opens), GPUBUF_OPEN_OWNER */
    uint32_t owner_uid; /**< with GPUBUF_OPEN_OWNER: the expected owner (-EPERM
                             when the buffer belongs to another uid) */
    int timeout_ms;     /**< opens: as in gpubuf_open() */
} gpubuf_lookup;

/** A CUDA stream (CUstream, cudaStream_t), declared without cuda.h. */
typedef struct CUstream_st *gpubuf_stream;
/** The legacy default stream (CU_STREAM_LEGACY); NULL means the same. */
#define GPUBUF_STREAM_LEGACY ((gpubuf_stream)0x1)
/** The calling thread's default stream (CU_STREAM_PER_THREAD). */
#define GPUBUF_STREAM_PER_THREAD ((gpubuf_stream)0x2)

/** A connection to gpubufd (opaque). */
typedef struct gpubuf_client gpubuf_client;

/** A local view of a buffer, or of a slice of one (opaque, reference counted). */
typedef struct gpubuf_buffer gpubuf_buffer;

/** What the daemon knows about one buffer (gpubuf_stat, gpubuf_status). */
typedef struct gpubuf_buffer_info {
    uint64_t id;
    char name[GPUBUF_NAME_MAX + 1];
    char pool[GPUBUF_NAME_MAX + 1];
    uint64_t size;
    gpubuf_state state;
    uint32_t refs;        /**< references held by all clients */
    uint32_t owner_uid;
    uint64_t slab_id;
    uint64_t offset;      /**< offset inside the slab */
} gpubuf_buffer_info;

/** One buffer in a status snapshot. Strings live as long as the snapshot. */
typedef struct gpubuf_status_buffer {
    uint64_t id;
    const char *name;     /**< "" for anonymous buffers */
    const char *pool;
    uint64_t size;
    gpubuf_state state;
    uint32_t refs;
    uint32_t owner_uid;
    uint64_t slab_id;
    uint64_t offset;
} gpubuf_status_buffer;

/** One pool in a status snapshot. */
typedef struct gpubuf_pool_info {
    char name[GPUBUF_NAME_MAX + 1];
    gpubuf_pool_kind kind;
    int device;           /**< device ordinal in the daemon, -1 for host pools */
    char device_uuid[41]; /**< "GPU-xxxxxxxx-..." or "" */
    uint64_t capacity;
    uint64_t used;        /**< bytes in live buffers */
    uint64_t reserved;    /**< bytes held in slabs */
    uint64_t slab_size;
    uint32_t slabs;
    uint32_t buffers;
} gpubuf_pool_info;

/** One connected client in a status snapshot. */
typedef struct gpubuf_client_info {
    uint64_t session_id;
    int pid;
    uint32_t uid;
    uint32_t gid;
    uint32_t references;   /**< references held, summed over buffers */
    uint32_t buffers_held; /**< distinct buffers referenced */
    char name[64];
    uint32_t kept_slabs;   /**< slabs it keeps mapped after their last view went */
    uint32_t read_only_references; /**< of references, those opened read-only */
} gpubuf_client_info;

/** Requests of one type since the daemon started (gpubuf_counters). */
typedef struct gpubuf_request_counters {
    const char *type; /**< "hello", "alloc", "seal", "open", "release", ... */
    uint64_t requests;
    uint64_t errors;         /**< replies with an error code */
    uint64_t duration_ns;    /**< summed handling time */
    size_t n_buckets;        /**< gpubuf_counters.n_bounds + 1 */
    const uint64_t *buckets; /**< requests per latency bucket, not cumulative; the
                                  last one counts those above the last bound */
} gpubuf_request_counters;

/** Error replies with one code (gpubuf_counters). */
typedef struct gpubuf_error_counter {
    int code; /**< -errno or GPUBUF_E* */
    uint64_t count;
} gpubuf_error_counter;

/** A count with a name: a reason for a refused connection or a disconnect. */
typedef struct gpubuf_named_counter {
    const char *name;
    uint64_t count;
} gpubuf_named_counter;

/** Items of batch requests of one type (gpubuf_counters.batches). */
typedef struct gpubuf_batch_counters {
    const char *type; /**< "batch_open", "batch_release", "batch_alloc", "batch_seal", "batch_delete" */
    uint64_t items;       /**< items handled (Counters.requests counts the requests) */
    uint64_t item_errors; /**< of them, items that failed */
} gpubuf_batch_counters;

/** What one pool did since the daemon started (gpubuf_counters). */
typedef struct gpubuf_pool_counters {
    const char *pool;
    uint64_t bytes_allocated; /**< buffer sizes carved, after alignment */
    uint64_t bytes_freed;     /**< buffer sizes given back */
    uint64_t slabs_created;
    uint64_t slabs_destroyed; /**< empty slabs given back to the backend */
    uint64_t alloc_failures;  /**< allocations the pool refused */
} gpubuf_pool_counters;

/** Counters of a status snapshot: they only grow while the daemon runs.
 * Strings and arrays live as long as the snapshot. */
typedef struct gpubuf_counters {
    int present; /**< 0 when the daemon sent none (an older daemon) */
    size_t n_requests;
    const gpubuf_request_counters *requests;
    size_t n_bounds;
    const double *bucket_bounds; /**< upper bounds of the latency buckets, seconds */
    size_t n_errors;
    const gpubuf_error_counter *errors;
    size_t n_pools;
    const gpubuf_pool_counters *pools;
    size_t n_refused;
    const gpubuf_named_counter *refused; /**< refused connections by reason */
    size_t n_disconnects;
    const gpubuf_named_counter *disconnects; /**< ended sessions by reason */
    uint64_t slab_imports;                   /**< slabs handed to a client that did not map them */
    uint64_t connections;                    /**< connections accepted */
    uint64_t open_timeouts;                  /**< waiting opens that expired */
    size_t n_batches;                        /**< 0 from a daemon without batches */
    const gpubuf_batch_counters *batches;    /**< items of batch requests, by type */
} gpubuf_counters;

/** A snapshot of the daemon (gpubuf_status). Free with gpubuf_status_free(). */
typedef struct gpubuf_status {
    size_t n_pools;
    gpubuf_pool_info *pools;
    size_t n_buffers;
    gpubuf_status_buffer *buffers;
    size_t n_clients;
    gpubuf_client_info *clients;
    uint64_t uptime_ms;
    char version[32];
    void *reserved_; /**< the decoded reply the strings point into */
    /** Counters (added after 0.1.0 at the end: the library allocates this
     * struct, so programs built against the older header keep working). */
    gpubuf_counters counters;
    /** Names: the pool names without a pool are looked up in ("" from
     * daemons before per-pool names), and per pool (n_pools entries, in the
     * order of pools) who may give buffers names there: "" for everyone the
     * pool allows, else "uid 1000, gid 27" (uid 0 always may). Added at the
     * end like counters. */
    const char *default_pool;
    const char *const *pool_publishers;
    /** Restart survival (added after 0.2: at the end, as above). */
    uint32_t restarts;         /**< times gpubufd restarted over its kept state */
    uint32_t restored_buffers; /**< buffers its last start restored */
    /** Per buffer (n_buffers entries): it survived a restart; NULL when none did. */
    const uint8_t *buffer_restored;
    /** Per client (n_clients entries): a session restored at a restart whose
     * client has not resumed it yet (it holds its references until
     * resume_timeout_ms); NULL when there are none. */
    const uint8_t *client_detached;
    /** Metadata of buffers[i] in buffer_meta[i] (added at the end, like counters). */
    struct gpubuf_status_meta *buffer_meta;
    uint32_t leases_active;   /**< buffers with a lease */
    uint64_t leases_expired;  /**< leases that expired since the daemon started */
    uint64_t leases_renewed;  /**< renewals since the daemon started */
    uint64_t max_lease_ms;    /**< the daemon's max_lease_ms (0: an older daemon) */
} gpubuf_status;

/** \return a static sentence describing err (0, -errno or GPUBUF_E*). */
GPUBUF_EXTERN const char *gpubuf_strerror(int err);

/** \return a short name for err ("ENOENT", "GPUBUF_ECUDA", ...). */
GPUBUF_EXTERN const char *gpubuf_err_name(int err);

/**
 * Connect to gpubufd and perform the version handshake.
 * \param socket_path  NULL: $GPUBUF_SOCKET if set, else GPUBUF_DEFAULT_SOCKET.
 * \param ret          the new connection; free with gpubuf_disconnect().
 * \retval 0 on success, -ENOENT when no socket exists at the path,
 *         -ECONNREFUSED when nobody listens on it (a stale socket), -EACCES
 *         when this user may not use the socket, -EUSERS when the daemon
 *         refused the connection (too many clients: its reason is in
 *         gpubuf_last_error_message()), -ESHUTDOWN when it is stopping,
 *         GPUBUF_EVERSION when the daemon speaks no common version.
 * A thread waiting for a synchronous call's reply polls the socket for up to
 * 50 µs ($GPUBUF_SPIN_US at connect, 0 to 1000; 0: never) before it sleeps,
 * while the connection's replies mostly come within that time.
 */
GPUBUF_EXTERN int gpubuf_connect(const char *socket_path, gpubuf_client **ret);

/**
 * Close the connection. The daemon drops every reference this connection
 * held, so its buffers may be freed and their memory reused at once. Views
 * still alive keep their local mapping (no crash on access) but their
 * contents are no longer guaranteed: release views first. Accepts NULL.
 * A thread blocked in a waiting open on c returns GPUBUF_EDISCONNECTED.
 * \return NULL.
 */
GPUBUF_EXTERN gpubuf_client *gpubuf_disconnect(gpubuf_client *c);

/**
 * \return the message of the last call on this thread that returns an error
 * code: "" when it succeeded, else a sentence that says what happened and,
 * where the caller can act, what to do. Valid until the thread's next call.
 */
GPUBUF_EXTERN const char *gpubuf_last_error_message(void);

/**
 * Allocate size bytes from a pool. The caller holds one reference and may
 * write the buffer; others can open it only after gpubuf_seal().
 * \param pool  pool name, or NULL for the daemon's default pool.
 * \param name  name to publish under when sealed, or NULL for an anonymous
 *              buffer (opened by id; freed when its last reference goes).
 *              Names are per pool: the name is taken in the pool allocated
 *              from. A qualified name "/POOL/NAME" names the pool too (pool
 *              then NULL or the same).
 * \retval -EEXIST the name is taken in that pool; -EPERM this uid may not
 *         name buffers in the pool (its publish_uids/publish_gids);
 *         GPUBUF_EPOOLFULL; GPUBUF_ENOPOOL; -EINVAL.
 */
GPUBUF_EXTERN int gpubuf_alloc(gpubuf_client *c, const char *pool, uint64_t size,
                               const char *name, gpubuf_buffer **ret);

/**
 * Publish a buffer allocated by this connection: it becomes read-only by
 * convention and visible to gpubuf_open(); clients waiting for its name wake.
 * Asynchronous: returns once the request is on its way. The daemon applies it
 * before any later request of this connection; another process sees it as
 * soon as the daemon has read it (a waiting open always does). Use
 * gpubuf_seal_sync() when another process must be able to open it the moment
 * this call returns.
 * \retval GPUBUF_ESTATE already sealed; -EPERM not allocated by this connection.
 */
GPUBUF_EXTERN int gpubuf_seal(gpubuf_buffer *b);

/** Like gpubuf_seal(), as one synchronous request: returns once the daemon
 * has applied the seal, with its own result (errors of earlier asynchronous
 * requests are left for gpubuf_flush()). */
GPUBUF_EXTERN int gpubuf_seal_sync(gpubuf_buffer *b);

/**
 * Wait until the daemon has answered every asynchronous request (seal,
 * release) of this connection.
 * \retval 0, or the first error one of them got since the last flush.
 */
GPUBUF_EXTERN int gpubuf_flush(gpubuf_client *c);

/**
 * Open a sealed buffer by name and take one reference. The name is looked
 * up in the daemon's default pool, or in POOL for a qualified name
 * "/POOL/NAME" (see gpubuf_open_with()).
 * \param timeout_ms  0: fail at once with -ENOENT if the name is not published;
 *                    > 0: wait up to that long (-ETIMEDOUT); < 0: wait forever.
 * A waiting open occupies its connection until it returns: other threads'
 * calls on the same gpubuf_client wait behind it. Wait on a connection of
 * its own when the same process also seals.
 */
GPUBUF_EXTERN int gpubuf_open(gpubuf_client *c, const char *name, int timeout_ms,
                              gpubuf_buffer **ret);

/**
 * Choose the GPU whose context CUDA buffers opened or allocated from now on
 * are mapped into. By default (-1) each buffer is mapped on the GPU that holds
 * it. With device d, a buffer living on another GPU is mapped into d's primary
 * context with peer access (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS): kernels on d
 * read and write it over NVLink or PCIe. Host pools are not affected.
 * \param device  a CUDA ordinal in this process, or -1.
 * \retval -EINVAL c is NULL or device is below -1 or not below 64;
 *         -EBUSY views of CUDA buffers are alive on this connection (a slab is
 *         mapped once per connection: use another connection);
 *         GPUBUF_ENODEVICE no such device; GPUBUF_ENODRIVER / GPUBUF_ECUDA the
 *         driver could not be loaded or initialised.
 * A later open or alloc of a buffer that device cannot reach fails with
 * GPUBUF_ENOPEER.
 */
GPUBUF_EXTERN int gpubuf_set_device(gpubuf_client *c, int device);

/**
 * Deprecated: gpubuf_open_with() with a gpubuf_lookup of flags and
 * timeout_ms does the same. Opens a sealed buffer by name or, when name is
 * NULL, by id, with flags (GPUBUF_OPEN_READONLY only).
 * \retval -EOPNOTSUPP GPUBUF_OPEN_READONLY on a cuda-ipc pool; -EINVAL
 *         unknown flags.
 */
GPUBUF_DEPRECATED("use gpubuf_open_with()")
GPUBUF_EXTERN int gpubuf_open_ex(gpubuf_client *c, const char *name, uint64_t id,
                                 int timeout_ms, unsigned flags, gpubuf_buffer **ret);

/**
 * Seal in stream order: record an interprocess CUDA event on stream after
 * the work that writes the buffer, and seal with it, without waiting for the
 * GPU (cuda-ipc and cuda-vmm pools). Openers make their own streams wait for
 * the event with gpubuf_buffer_wait() (copies out of their views wait for it
 * by themselves). Asynchronous like gpubuf_seal().
 * Releasing this view while the work still runs keeps the reference until
 * the event has completed (the release is sent by a later call on the
 * connection: a stream seal, a release, gpubuf_flush()); the daemon hands the
 * event out until that release, and the library destroys it only after the
 * daemon has answered it. gpubuf_disconnect() waits for the events of the
 * connection. If the producer dies before its work ends, streams already
 * waiting on the event may never resume: CUDA gives no way out of that.
 * \param stream  a stream of the buffer's GPU, NULL or GPUBUF_STREAM_LEGACY for
 *                the legacy default stream, GPUBUF_STREAM_PER_THREAD.
 * \retval -EINVAL a host-pool buffer (no GPU work to order); GPUBUF_ECUDA.
 */
GPUBUF_EXTERN int gpubuf_seal_stream(gpubuf_buffer *b, gpubuf_stream stream);

/**
 * Make stream wait (cuStreamWaitEvent in the view's context, no host
 * synchronisation) for the work the producer recorded with
 * gpubuf_seal_stream(). The event was imported when the buffer was opened.
 * Returns at once when the buffer was sealed without an event, or opened
 * after the producer's work had ended. Works on slices (their buffer's
 * event).
 * \retval 0; -EINVAL b is NULL; GPUBUF_ECUDA; GPUBUF_ENODRIVER.
 */
GPUBUF_EXTERN int gpubuf_buffer_wait(gpubuf_buffer *b, gpubuf_stream stream);

/** \return 1 when the view was opened read-only (GPUBUF_OPEN_READONLY), else 0. */
GPUBUF_EXTERN int gpubuf_buffer_read_only(const gpubuf_buffer *b);

/** Open a sealed buffer by id (see gpubuf_open). */
GPUBUF_EXTERN int gpubuf_open_id(gpubuf_client *c, uint64_t id, int timeout_ms,
                                 gpubuf_buffer **ret);

/**
 * Drop this view. When the last view of an opened buffer goes (slices keep
 * their parent alive), the daemon reference is released; if no other view of
 * this connection uses the slab, it stays mapped as one of a few kept slabs
 * (see docs/client-api.md) or is unmapped. The release request is asynchronous like
 * gpubuf_seal(): the daemon applies it before any later request of this
 * connection; gpubuf_flush() waits for it. Accepts NULL.
 * \retval 0, or an error sending the release (the view is gone anyway).
 */
GPUBUF_EXTERN int gpubuf_release(gpubuf_buffer *b);

/** Take one more local reference to the same view. \return b. */
GPUBUF_EXTERN gpubuf_buffer *gpubuf_buffer_ref(gpubuf_buffer *b);

/** Unpublish a buffer by name (NAME in the default pool, or "/POOL/NAME").
 * Its memory returns to the pool when the last reference goes. Only the owner
 * or root may delete (-EPERM). */
GPUBUF_EXTERN int gpubuf_delete(gpubuf_client *c, const char *name);

/** Unpublish a buffer by id (see gpubuf_delete). */
GPUBUF_EXTERN int gpubuf_delete_id(gpubuf_client *c, uint64_t id);

/** Describe a buffer by name (NAME in the default pool, or "/POOL/NAME")
 * without taking a reference. */
GPUBUF_EXTERN int gpubuf_stat(gpubuf_client *c, const char *name, gpubuf_buffer_info *ret);

/**
 * Open a sealed buffer by name (in one pool, see gpubuf_lookup) or, when
 * name is NULL, by id (in o->pool when set). o may be NULL. A waiting open
 * (timeout_ms != 0) waits in that pool alone, and fails with -EPERM when a
 * buffer of another owner than the expected one is sealed under the name.
 * \retval -EPERM the buffer belongs to another uid than o->owner_uid;
 *         -EACCES this uid may not use the pool; GPUBUF_ENOPOOL no such pool;
 *         -ENOENT / -ETIMEDOUT as gpubuf_open(); -EINVAL unknown flags, a
 *         malformed qualified name, or a pool that differs from the name's;
 *         -EOPNOTSUPP GPUBUF_OPEN_READONLY on a cuda-ipc pool.
 * A read-only open of a slab this connection also maps writable maps it a
 * second time (read-only mappings are never kept after their last view).
 */
GPUBUF_EXTERN int gpubuf_open_with(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer **ret);

/** Describe a buffer by name or (name NULL) id, looked up as
 * gpubuf_open_with() does (flags: GPUBUF_OPEN_OWNER only). */
GPUBUF_EXTERN int gpubuf_stat_with(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer_info *ret);

/** Unpublish a buffer by name or (name NULL) id, looked up as
 * gpubuf_open_with() does (flags: GPUBUF_OPEN_OWNER only). Only the owner or
 * root may delete (-EPERM). */
GPUBUF_EXTERN int gpubuf_delete_with(gpubuf_client *c, const char *name, uint64_t id,
                                     const gpubuf_lookup *o);

/**
 * How long this connection keeps trying to reconnect after gpubufd went away
 * (restart, upgrade, crash), in milliseconds; 0 turns reconnecting off. The
 * default is 10000, or $GPUBUF_RECONNECT_MS when set at gpubuf_connect().
 * A reconnect resumes the session: the references of live views are claimed
 * back and their mappings stay valid. A request that was not sent yet, and a
 * stat or status in flight, are sent after the reconnect; another request in
 * flight when the connection went fails with -ECONNRESET, and so does the
 * call that finds the daemon restarted without the session its views held
 * references in (docs/client-api.md, "Restart").
 * \return 0, or -EINVAL for a negative ms.
 */
GPUBUF_EXTERN int gpubuf_set_reconnect(gpubuf_client *c, int ms);

/** Take a snapshot of pools, buffers and clients. */
GPUBUF_EXTERN int gpubuf_status_get(gpubuf_client *c, gpubuf_status **ret);

/** Free a snapshot. Accepts NULL. \return NULL. */
GPUBUF_EXTERN gpubuf_status *gpubuf_status_free(gpubuf_status *s);

/* ---- views ---------------------------------------------------------------- */

/** \return the device address of the view's first byte (for host pools, the
 * host address as an integer). */
GPUBUF_EXTERN uint64_t gpubuf_buffer_device_ptr(const gpubuf_buffer *b);

/** \return the host pointer of a host-pool view, NULL for device memory. */
GPUBUF_EXTERN void *gpubuf_buffer_host_ptr(const gpubuf_buffer *b);

/** \return the view's size in bytes. */
GPUBUF_EXTERN uint64_t gpubuf_buffer_size(const gpubuf_buffer *b);

/** \return the CUDA device ordinal (in this process) whose context the view's
 * address belongs to: launch kernels that use it there. -1 for host pools. */
GPUBUF_EXTERN int gpubuf_buffer_device(const gpubuf_buffer *b);

/** \return the CUDA device ordinal (in this process) of the GPU that holds the
 * memory; differs from gpubuf_buffer_device() after gpubuf_set_device().
 * -1 for host pools. */
GPUBUF_EXTERN int gpubuf_buffer_memory_device(const gpubuf_buffer *b);

/** \return the kind of pool the buffer comes from. */
GPUBUF_EXTERN gpubuf_pool_kind gpubuf_buffer_pool_kind(const gpubuf_buffer *b);

/** \return the daemon's id of the buffer this view belongs to. */
GPUBUF_EXTERN uint64_t gpubuf_buffer_id(const gpubuf_buffer *b);

/** \return the buffer's name, "" for anonymous buffers. Valid while b lives. */
GPUBUF_EXTERN const char *gpubuf_buffer_name(const gpubuf_buffer *b);

/**
 * Make a zero-copy view of length bytes starting at offset. The slice keeps
 * its parent (and the daemon reference) alive until it is released.
 * \retval GPUBUF_ERANGE when [offset, offset + length) leaves the view.
 */
GPUBUF_EXTERN int gpubuf_buffer_slice(gpubuf_buffer *b, uint64_t offset, uint64_t length,
                                      gpubuf_buffer **ret);

/** Copy length bytes at offset of the view into dst (synchronous). */
GPUBUF_EXTERN int gpubuf_buffer_copy_to_host(const gpubuf_buffer *b, uint64_t offset,
                                             void *dst, uint64_t length);

/** Copy length bytes from src into the view at offset (synchronous). */
GPUBUF_EXTERN int gpubuf_buffer_copy_from_host(gpubuf_buffer *b, uint64_t offset,
                                               const void *src, uint64_t length);

/**
 * Copy length bytes at offset of the view into dst, enqueued on stream
 * (cuMemcpyDtoHAsync). dst should be page-locked memory for the copy to
 * overlap with other work. Host-pool views are copied at once.
 */
GPUBUF_EXTERN int gpubuf_buffer_copy_to_host_async(const gpubuf_buffer *b, uint64_t offset,
                                                   void *dst, uint64_t length,
                                                   gpubuf_stream stream);

/** Copy length bytes from src into the view at offset, enqueued on stream
 * (cuMemcpyHtoDAsync). -EPERM on a read-only view. */
GPUBUF_EXTERN int gpubuf_buffer_copy_from_host_async(gpubuf_buffer *b, uint64_t offset,
                                                     const void *src, uint64_t length,
                                                     gpubuf_stream stream);

/**
 * Copy length bytes from src (at src_offset) to dst (at dst_offset), enqueued
 * on stream: device to device within one GPU or between GPUs
 * (cuMemcpyPeerAsync), or host memory when either view is of a host pool
 * (then done at once). Synchronise the stream before using the result.
 * \retval GPUBUF_ERANGE a range leaves its view; -EPERM dst is read-only.
 */
GPUBUF_EXTERN int gpubuf_buffer_copy(gpubuf_buffer *dst, uint64_t dst_offset,
                                     const gpubuf_buffer *src, uint64_t src_offset,
                                     uint64_t length, gpubuf_stream stream);

/* ---- batches --------------------------------------------------------------
 * Many items in one round trip (docs/client-api.md, "Batches"). Each item
 * succeeds or fails on its own, as the single call would; ret_status[i]
 * (optional, may be NULL) receives item i's result, 0 or a negative code.
 * The calls return the number of items that failed (0: all succeeded; the
 * thread's error message then describes the first of them), or a negative
 * code when the batch as a whole was refused (nothing was done). Longer
 * batches than the daemon takes in one request are split by the library. */

/** Flags of gpubuf_alloc_many(). */
enum gpubuf_alloc_flag {
    /** Seal each buffer in the same request (it can no longer be written by
     * a producer that needs a seal event: use gpubuf_seal_stream then). */
    GPUBUF_ALLOC_SEAL = 1u << 0,
};

/** Open n sealed buffers, by names[i] (when names is not NULL) or else by
 * ids[i]. No waiting: an item not sealed yet fails with -ENOENT. ret[i]
 * becomes a root view (NULL for a failed item). flags: GPUBUF_OPEN_READONLY. */
GPUBUF_EXTERN int gpubuf_open_many(gpubuf_client *c, size_t n, const char *const *names,
                                   const uint64_t *ids, unsigned flags, gpubuf_buffer **ret,
                                   int *ret_status);

/** gpubuf_open_many() with options: o->flags GPUBUF_OPEN_READONLY;
 * o->timeout_ms as gpubuf_open_with(): items not sealed yet (-ENOENT from the
 * batch) are waited for, each with a waiting open, until one deadline for
 * all (0: no waiting; < 0: forever); such items fail with -ETIMEDOUT when it
 * passes. o->pool must be NULL (items name their pool: "/POOL/NAME"). Views
 * from batch opens carry their buffer's layout and user bytes
 * (gpubuf_buffer_layout(), gpubuf_buffer_user_data()) as single opens do. */
GPUBUF_EXTERN int gpubuf_open_many_with(gpubuf_client *c, size_t n, const char *const *names,
                                        const uint64_t *ids, const gpubuf_lookup *o,
                                        gpubuf_buffer **ret, int *ret_status);

/** Allocate n buffers of sizes[i] bytes from pool (NULL: the default), named
 * names[i] (names NULL, or an entry NULL or "": anonymous). flags:
 * GPUBUF_ALLOC_SEAL. */
GPUBUF_EXTERN int gpubuf_alloc_many(gpubuf_client *c, const char *pool, size_t n,
                                    const uint64_t *sizes, const char *const *names,
                                    unsigned flags, gpubuf_buffer **ret, int *ret_status);

/** Seal n buffers this connection allocated (as gpubuf_seal_sync). */
GPUBUF_EXTERN int gpubuf_seal_many(gpubuf_buffer *const *bufs, size_t n, int *ret_status);

/** Release n views (as gpubuf_release; NULL entries are skipped): the
 * daemon references of those that were the last view of their buffer go in
 * one request, answered before the call returns. All views go, whatever
 * the result. All must be of one connection. */
GPUBUF_EXTERN int gpubuf_release_many(gpubuf_buffer *const *bufs, size_t n, int *ret_status);

/** Unpublish n buffers, by names[i] (when names is not NULL) or else ids[i]. */
GPUBUF_EXTERN int gpubuf_delete_many(gpubuf_client *c, size_t n, const char *const *names,
                                     const uint64_t *ids, int *ret_status);

/* ---- array metadata and leases ---------------------------------------------- */

/** Most dimensions of a gpubuf_layout. */
#define GPUBUF_LAYOUT_MAX_NDIM 32
/** Most opaque user bytes a buffer carries. */
#define GPUBUF_USER_DATA_MAX 4096

/** An element type, as DLPack's DLDataType: code (kDLInt 0, kDLUInt 1,
 * kDLFloat 2, kDLOpaqueHandle 3, kDLBfloat 4, kDLComplex 5, kDLBool 6, and
 * the DLPack 1.1 float8/float6/float4 codes 7..17), bits per lane and lanes.
 * bits * lanes must be a whole number of bytes. */
typedef struct gpubuf_dtype {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} gpubuf_dtype;

/**
 * A buffer's array layout, as DLPack's DLTensor describes one. Element
 * (i0, i1, ...) lies at byte byte_offset + (i0 * strides[0] + ...) * itemsize
 * of the buffer, itemsize = bits * lanes / 8. Every element must lie inside
 * the buffer; the daemon refuses the layout with -EINVAL otherwise.
 */
typedef struct gpubuf_layout {
    gpubuf_dtype dtype;
    uint32_t ndim;                           /**< 0..GPUBUF_LAYOUT_MAX_NDIM (0: a scalar) */
    uint64_t byte_offset;                    /**< of element 0 from the buffer's first byte */
    int64_t shape[GPUBUF_LAYOUT_MAX_NDIM];   /**< each >= 0 */
    int64_t strides[GPUBUF_LAYOUT_MAX_NDIM]; /**< in elements; read only when has_strides */
    int has_strides; /**< 0: C-contiguous (as DLPack's NULL strides). Layouts the library
                          returns always fill strides, and say here whether they were given. */
} gpubuf_layout;

/** What a buffer may carry besides its bytes, at alloc or seal. Zeroed: nothing. */
typedef struct gpubuf_meta {
    const gpubuf_layout *layout; /**< NULL: none (at seal: keep the alloc's) */
    const void *user_data;       /**< opaque bytes, NULL: none (at seal: keep the alloc's) */
    size_t user_size;            /**< at most GPUBUF_USER_DATA_MAX */
    /** Lease: the daemon deletes the buffer (unpublishes its name) this many
     * milliseconds after the alloc or seal, and frees it once nobody holds it,
     * unless its owner renews it (gpubuf_renew). 0: no lease (at seal: keep
     * the alloc's). At most the daemon's max_lease_ms. */
    uint64_t ttl_ms;
} gpubuf_meta;

/** A buffer's metadata as the daemon reports it (gpubuf_stat_meta). */
typedef struct gpubuf_buffer_meta {
    int has_layout;
    gpubuf_layout layout;
    size_t user_size;
    uint8_t user_data[GPUBUF_USER_DATA_MAX];
    uint64_t lease_left_ms; /**< 0: no lease, else at least 1 */
    uint64_t lease_ttl_ms;  /**< the time to live gpubuf_renew() with 0 restarts */
} gpubuf_buffer_meta;

/** Metadata of the buffers of a status snapshot (gpubuf_status.buffer_meta). */
typedef struct gpubuf_status_meta {
    int has_layout;
    gpubuf_dtype dtype;
    uint32_t ndim;
    const int64_t *shape;   /**< ndim entries, in the snapshot */
    uint64_t lease_left_ms; /**< 0: no lease */
    uint32_t user_size;
} gpubuf_status_meta;

/**
 * gpubuf_alloc() with metadata: an array layout (checked against size),
 * user bytes and a lease, all optional (meta NULL: plain gpubuf_alloc).
 * \retval -EINVAL a layout that is malformed or does not fit in size, user
 *         bytes beyond GPUBUF_USER_DATA_MAX, a ttl above the daemon's
 *         max_lease_ms (gpubuf_last_error_message() says which and why).
 */
GPUBUF_EXTERN int gpubuf_alloc_with(gpubuf_client *c, const char *pool, uint64_t size,
                                    const char *name, const gpubuf_meta *meta, gpubuf_buffer **ret);

/**
 * Seal synchronously, like gpubuf_seal_sync(), and set metadata at the same
 * time: a layout or user bytes given replace those of the alloc, a ttl starts
 * a lease from now (meta NULL: gpubuf_seal_sync()). Metadata cannot change
 * after the seal.
 * \retval GPUBUF_ESTATE already sealed; -EINVAL as gpubuf_alloc_with().
 */
GPUBUF_EXTERN int gpubuf_seal_sync_with(gpubuf_buffer *b, const gpubuf_meta *meta);

/** Deprecated name of gpubuf_alloc_with(). */
GPUBUF_DEPRECATED("use gpubuf_alloc_with()")
GPUBUF_EXTERN int gpubuf_alloc_ex(gpubuf_client *c, const char *pool, uint64_t size,
                                  const char *name, const gpubuf_meta *meta, gpubuf_buffer **ret);

/** Deprecated name of gpubuf_seal_sync_with(). */
GPUBUF_DEPRECATED("use gpubuf_seal_sync_with()")
GPUBUF_EXTERN int gpubuf_seal_ex(gpubuf_buffer *b, const gpubuf_meta *meta);

/** \return the array layout the buffer carried when this view was made
 * (alloc, open; gpubuf_seal_sync_with() updates the sealing view), or NULL when it
 * has none (slices have none: a layout describes the whole buffer). Valid
 * while b lives. */
GPUBUF_EXTERN const gpubuf_layout *gpubuf_buffer_layout(const gpubuf_buffer *b);

/** \return the buffer's user bytes (NULL when none) and their size in
 * *ret_size (may be NULL). Valid while b lives. */
GPUBUF_EXTERN const void *gpubuf_buffer_user_data(const gpubuf_buffer *b, size_t *ret_size);

/**
 * Renew a buffer's lease: it expires ttl_ms from now (0: its current time to
 * live again; a buffer without a lease gets one). By name ("NAME" in the
 * default pool, or "/POOL/NAME"), or by id when name is NULL. Only its
 * owner's uid or root may renew (-EPERM).
 * \retval -ENOENT no such buffer (or it expired already); -EINVAL ttl_ms 0 on
 *         a buffer without a lease, or above max_lease_ms.
 */
GPUBUF_EXTERN int gpubuf_renew(gpubuf_client *c, const char *name, uint64_t id, uint64_t ttl_ms);

/** gpubuf_stat_with() (o may be NULL), with the buffer's metadata into
 * ret_meta (may be NULL). */
GPUBUF_EXTERN int gpubuf_stat_meta(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer_info *ret,
                                   gpubuf_buffer_meta *ret_meta);

/** Deprecated name of gpubuf_stat_meta(). */
GPUBUF_DEPRECATED("use gpubuf_stat_meta()")
GPUBUF_EXTERN int gpubuf_stat_ex(gpubuf_client *c, const char *name, uint64_t id,
                                 const gpubuf_lookup *o, gpubuf_buffer_info *ret,
                                 gpubuf_buffer_meta *ret_meta);

/** Check a layout against a buffer of size bytes, as the daemon does: 0, or
 * -EINVAL with the reason in gpubuf_last_error_message(). */
GPUBUF_EXTERN int gpubuf_layout_check(const gpubuf_layout *layout, uint64_t size);

/** \return the bytes one element of dtype takes (bits * lanes / 8). */
GPUBUF_EXTERN uint64_t gpubuf_dtype_size(gpubuf_dtype dtype);

/* ---- status snapshot entries ------------------------------------------------ */

/** Pool i of a snapshot with what the snapshot says of it besides pools[i]. */
typedef struct gpubuf_status_pool_item {
    gpubuf_pool_info pool;  /**< pools[i] */
    const char *publishers; /**< pool_publishers[i]: "" for everyone the pool allows */
    int is_default;         /**< names without a pool are looked up in it */
} gpubuf_status_pool_item;

/** Buffer i of a snapshot with what the snapshot says of it besides buffers[i]. */
typedef struct gpubuf_status_buffer_item {
    gpubuf_status_buffer buffer; /**< buffers[i] */
    int restored;                /**< buffer_restored[i]: it survived a restart */
    gpubuf_status_meta meta;     /**< buffer_meta[i] (zeroed when it has none) */
} gpubuf_status_buffer_item;

/** Client i of a snapshot with what the snapshot says of it besides clients[i]. */
typedef struct gpubuf_status_client_item {
    gpubuf_client_info client; /**< clients[i] */
    int detached;              /**< client_detached[i]: restored, not resumed yet */
} gpubuf_status_client_item;

/**
 * Entry i of a snapshot, gathered from its parallel arrays into one struct
 * (strings stay in the snapshot: valid until gpubuf_status_free()).
 * \retval 0; -EINVAL s or ret is NULL; GPUBUF_ERANGE i is not below n_pools,
 *         n_buffers or n_clients.
 */
GPUBUF_EXTERN int gpubuf_status_pool_at(const gpubuf_status *s, size_t i,
                                        gpubuf_status_pool_item *ret);
GPUBUF_EXTERN int gpubuf_status_buffer_at(const gpubuf_status *s, size_t i,
                                          gpubuf_status_buffer_item *ret);
GPUBUF_EXTERN int gpubuf_status_client_at(const gpubuf_status *s, size_t i,
                                          gpubuf_status_client_item *ret);

/* ---- Event loops (docs/client-api.md, "Event loops") ------------------------
 * The _start calls send their request and return at once with a handle; the
 * completion is delivered by gpubuf_dispatch(), called when gpubuf_client_fd()
 * is readable, through the callback given (exactly once per started request,
 * including cancelled ones and those the connection's loss ends). */
typedef struct gpubuf_completion {
    uint64_t handle;          /* what the _start call returned */
    int result;               /* 0, or a negative code (-ECANCELED once cancelled) */
    gpubuf_buffer *view;      /* open, alloc: the new root view, yours to release; else NULL */
    gpubuf_buffer_info info;  /* stat: the buffer; zero otherwise */
    void *user;               /* as given to the _start call */
    const char *message;      /* "" on success, else the sentence (also the thread's message) */
    /* gpubuf_open_many_start: result is the number of items that failed (0:
     * all opened), or -ECANCELED; views[i] is item i's root view (NULL for a
     * failed item; the views are yours to release, the arrays live for the
     * callback), statuses[i] its result. 0 and NULL for other requests. */
    size_t n;
    gpubuf_buffer *const *views;
    const int *statuses;
} gpubuf_completion;

/* Called by gpubuf_dispatch() on its thread, without the connection's lock:
 * it may start, cancel and make synchronous calls. done lives for the call. */
typedef void (*gpubuf_done_fn)(gpubuf_client *c, const gpubuf_completion *done);

/* A file descriptor that is readable while completions wait to be dispatched
 * (for epoll, poll, select, uv_poll_t, asyncio add_reader): level-triggered.
 * Owned by c; the same for the connection's life, across reconnects. */
GPUBUF_EXTERN int gpubuf_client_fd(gpubuf_client *c);
/* Deliver the completions that wait, without blocking: the number delivered
 * (0 when none), or a negative code (-EINVAL). */
GPUBUF_EXTERN int gpubuf_dispatch(gpubuf_client *c);
/* Cancel a started request: its callback comes with -ECANCELED (at the next
 * gpubuf_dispatch()), and what it would have taken is given back; a waiting
 * open stops waiting in the daemon. -ENOENT when handle names no request
 * that is still to be delivered. */
GPUBUF_EXTERN int gpubuf_cancel(gpubuf_client *c, uint64_t handle);
/* Open by name (name not NULL) or id, as gpubuf_open_with() (o: flags
 * GPUBUF_OPEN_READONLY and GPUBUF_OPEN_OWNER, timeout_ms, pool; NULL: no
 * wait). */
GPUBUF_EXTERN int gpubuf_open_start(gpubuf_client *c, const char *name, uint64_t id,
                                    const gpubuf_lookup *o, gpubuf_done_fn cb, void *user,
                                    uint64_t *ret);
/* Allocate, as gpubuf_alloc(). */
GPUBUF_EXTERN int gpubuf_alloc_start(gpubuf_client *c, const char *pool, uint64_t size,
                                     const char *name, gpubuf_done_fn cb, void *user,
                                     uint64_t *ret);
/* Seal, as gpubuf_seal_sync(): the completion says whether the daemon sealed it. */
GPUBUF_EXTERN int gpubuf_seal_start(gpubuf_buffer *b, gpubuf_done_fn cb, void *user,
                                    uint64_t *ret);
/* Delete by name or id, as gpubuf_delete_with(). */
GPUBUF_EXTERN int gpubuf_delete_start(gpubuf_client *c, const char *name, uint64_t id,
                                      const gpubuf_lookup *o, gpubuf_done_fn cb, void *user,
                                      uint64_t *ret);
/* Stat by name or id, as gpubuf_stat_with(): the completion's info. */
GPUBUF_EXTERN int gpubuf_stat_start(gpubuf_client *c, const char *name, uint64_t id,
                                    const gpubuf_lookup *o, gpubuf_done_fn cb, void *user,
                                    uint64_t *ret);
/* Open n buffers by names[i] (names not NULL; plain or "/POOL/NAME") or
 * else by ids[i], in batch requests as gpubuf_open_many(), with one
 * completion for them all (its n, views, statuses). o: flags
 * GPUBUF_OPEN_READONLY; timeout_ms as gpubuf_open_with(): 0 (or o NULL) no
 * waiting (an item not sealed yet fails with -ENOENT), else items not sealed
 * yet wait, each with a waiting open, until one deadline for all (< 0:
 * forever), then fail with -ETIMEDOUT; o->pool must be NULL. Cancelling the
 * handle ends the waits and gives every view back. */
GPUBUF_EXTERN int gpubuf_open_many_start(gpubuf_client *c, size_t n, const char *const *names,
                                         const uint64_t *ids, const gpubuf_lookup *o,
                                         gpubuf_done_fn cb, void *user, uint64_t *ret);

#ifdef __cplusplus
}
#endif
#endif
