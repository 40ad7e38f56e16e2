/* uthash with XXH3 as its hash function (and a cheaper mix for 8-byte
 * keys, below): every file includes uthash.h
 * through this header, so that every table is hashed the same way
 * wherever it is used (a table found with one function and added to with
 * another would lose its entries). XXH3 is inline (XXH_INLINE_ALL: no
 * library to link) and reads the keys of these tables (8-byte ids, names
 * of a few dozen bytes) in a few wide loads where uthash's default
 * (Jenkins) reads them a byte at a time;
 * docs/performance.md, "Batches in a pipeline". */
#ifndef GPUBUF_HASH_H
#define GPUBUF_HASH_H

#ifdef UTHASH_H
#error "uthash.h was included before common/hash.h: include hash.h instead"
#endif

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <stdint.h>
#include <string.h>

/* An 8-byte key (the ids of buffers, sessions, slabs: most lookups of the
 * hot path) or a 4-byte one (uids) is mixed by the first round of murmur3's
 * 64-bit finaliser (xor-shift, multiply, xor-shift: a bijection that spreads
 * sequential ids over the low bits uthash's buckets use; for ids 1 to 10^6
 * in 2^20 buckets the longest chain is 10, as with a random hash), in five
 * instructions; XXH3 took about 44 for one (callgrind). Other lengths
 * (names) go to XXH3. The length is a constant at almost every call, so
 * the tests fold away. */
static inline unsigned gpubuf_hash_key(const void *key, size_t len) {
    if (len == 8 || len == 4) {
        uint64_t x;
        if (len == 8) {
            memcpy(&x, key, 8);
        } else {
            uint32_t y;
            memcpy(&y, key, 4);
            x = y;
        }
        x ^= x >> 33;
        x *= 0xff51afd7ed558ccdULL;
        x ^= x >> 33;
        return (unsigned)x;
    }
    return (unsigned)XXH3_64bits(key, len);
}

#define HASH_FUNCTION(keyptr, keylen, hashv)                                                       \
    ((hashv) = gpubuf_hash_key((keyptr), (size_t)(keylen)))
#include <uthash.h>

#endif
