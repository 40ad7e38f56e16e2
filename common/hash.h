/* uthash with XXH3 as its hash function: every file includes uthash.h
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

#define HASH_FUNCTION(keyptr, keylen, hashv)                                                       \
    ((hashv) = (unsigned)XXH3_64bits((keyptr), (size_t)(keylen)))
#include <uthash.h>

#endif
