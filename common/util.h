/* Small helpers shared by the daemon, the client library and the tools. */
#ifndef GPUBUF_UTIL_H
#define GPUBUF_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpubuf/gpubuf.h"

/* After an add to the uthash table at head (handle hh): double its buckets
 * while it holds more entries than buckets. uthash alone doubles them only
 * when one chain reaches 10 entries, so that a lookup in a table of 1,000
 * walks about 3 entries, and each is a cache miss; at a load of 1 or less,
 * about 1.5 (docs/performance.md, "Hash tables"). The caller includes
 * uthash.h. */
#define GPUBUF_HASH_KEEP_LOAD(hh, head)                                                            \
    do {                                                                                           \
        UT_hash_table *tbl_ = (head) ? (head)->hh.tbl : NULL;                                      \
        if (tbl_ && tbl_->num_items > tbl_->num_buckets && !tbl_->noexpand) {                      \
            int oomed_ = 0;                                                                        \
            HASH_EXPAND_BUCKETS(hh, tbl_, oomed_);                                                 \
            (void)oomed_;                                                                          \
        }                                                                                          \
    } while (0)

/* A uthash table (handle hh) keyed by a fixed-size field: out = the entry
 * of head whose field equals key (an lvalue), or a new zeroed one added
 * with that key; NULL when out of memory. The key is hashed once, and the
 * entry zeroed inline (glibc's calloc costs three times malloc for these
 * sizes). The caller includes uthash.h, stdlib.h and string.h. */
#define GPUBUF_HASH_GET(head, field, key, out)                                                     \
    do {                                                                                           \
        unsigned hv_;                                                                              \
        HASH_VALUE(&(key), sizeof(key), hv_);                                                      \
        HASH_FIND_BYHASHVALUE(hh, (head), &(key), sizeof(key), hv_, (out));                        \
        if (!(out) && ((out) = malloc(sizeof(*(out))))) {                                          \
            memset((out), 0, sizeof(*(out)));                                                      \
            (out)->field = (key);                                                                  \
            HASH_ADD_BYHASHVALUE(hh, (head), field, sizeof((out)->field), hv_, (out));             \
            GPUBUF_HASH_KEEP_LOAD(hh, (head));                                                     \
        }                                                                                          \
    } while (0)

/* Parse "123", "64K", "256M", "8G", "1T" (binary units). Returns 0, or -EINVAL
 * when s does not start with a digit, has anything else after the unit, or
 * names more than 2^64 - 1 bytes. */
int gpubuf_parse_size(const char *s, uint64_t *ret);

/* What gpubuf_parse_size() accepts, for the messages that refuse a size. */
#define GPUBUF_SIZE_FORMS                                                                          \
    "a whole number of bytes with an optional unit K, M, G or T (powers of 1024, any case; "       \
    "64K, 64KiB and 64KB are all 65536), e.g. 4096, 64K, 256M, 8G"

/* Format bytes as "256.0 MiB" into buf. Returns buf. */
char *gpubuf_format_size(uint64_t bytes, char *buf, size_t len);

/* "allocated", "sealed", "deleted" or "unknown". */
const char *gpubuf_state_name(gpubuf_state s);

/* "host", "cuda-ipc", "cuda-vmm" or "unknown". */
const char *gpubuf_pool_kind_name(gpubuf_pool_kind kind);

/* Format a 16-byte CUDA UUID as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx". */
void gpubuf_format_uuid(const uint8_t uuid[16], char out[41]);

/* Monotonic clock in nanoseconds. */
uint64_t gpubuf_now_ns(void);

/* True when name is a valid buffer or pool name: 1..GPUBUF_NAME_MAX bytes of
 * [A-Za-z0-9._:/@+-], not starting with '/'. */
bool gpubuf_name_valid(const char *name, size_t len);

/* 0 when name is valid; otherwise -EINVAL or -ENAMETOOLONG with a sentence
 * in msg that says which rule the name breaks and how to fix it. */
int gpubuf_name_check(const char *name, size_t len, char *msg, size_t msg_len);

/* A buffer name as clients write it: NAME (a buffer of the default pool, or
 * of the pool given apart) or the qualified form /POOL/NAME (no plain name
 * starts with '/', no pool name holds one). Returns 0 with *ret_name the
 * plain name and pool filled ("" for a plain name); -EINVAL or -ENAMETOOLONG
 * with a sentence in msg for a qualified name without a pool or a name. */
int gpubuf_name_split(const char *in, char pool[GPUBUF_NAME_MAX + 1], const char **ret_name,
                      char *msg, size_t msg_len);

/* Copy in_len bytes of untrusted text into out as printable, valid UTF-8:
 * each byte of an invalid sequence, of a control character (C0, DEL, C1, NUL
 * included) or of a bidirectional formatting mark becomes "\xNN". Cut to
 * out_size - 1 bytes before the first character or escape that does not fit,
 * so never inside one; always NUL-terminated (out_size > 0). Returns the
 * bytes written. */
size_t gpubuf_text_clean(char *out, size_t out_size, const char *in, size_t in_len);

/* Polling before sleeping (the client waiting for its reply, the daemon for
 * the next request): a score of whether what was awaited mostly came within
 * the polling time. One point up for a wait that did (at most 8), two down
 * for one that did not (at least -8); poll while the score is >= 0. */
static inline void gpubuf_poll_score(int *score, bool soon) {
    if (soon)
        *score = *score < 8 ? *score + 1 : 8;
    else
        *score = *score > -6 ? *score - 2 : -8;
}

static inline uint64_t gpubuf_align_up(uint64_t v, uint64_t a) {
    return (v + a - 1) & ~(a - 1);
}

#endif
