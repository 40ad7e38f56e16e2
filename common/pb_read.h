/* Reading protobuf's wire format by hand, for the decoders of the common
 * messages (client/reply_fast.c: replies; daemon/request_fast.c:
 * requests). Each builds the very structs protobuf-c's unpack builds, in an
 * arena (arena.h), and declines (false) whatever it is not sure protobuf-c
 * reads the same way: a field twice, a wire type that does not match, a
 * varint or prefix protobuf-c refuses, a block too small. The caller then
 * hands the bytes to protobuf-c, so a decline costs only time. */
#ifndef GPUBUF_PB_READ_H
#define GPUBUF_PB_READ_H

#include <limits.h>
#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"

typedef struct rd {
    const uint8_t *p, *end;
    gpubuf_arena *a;
} rd;

/* Room in the arena; NULL when the block is full (no spill: decline). */
static inline void *take(rd *r, size_t size) {
    return gpubuf_arena_take(r->a, size);
}

static inline bool varint_long(rd *r, uint64_t *v);

/* Most varints of a reply are one byte (tags, small numbers, flags). */
static inline bool varint(rd *r, uint64_t *v) {
    if (r->p < r->end && *r->p < 0x80) {
        *v = *r->p++;
        return true;
    }
    return varint_long(r, v);
}

static inline bool varint_long(rd *r, uint64_t *v) {
    uint64_t x = 0;
    for (unsigned shift = 0; shift < 64 && r->p < r->end; shift += 7) {
        uint8_t b = *r->p++;
        if (shift == 63 && (b & 0x7e))
            return false; /* bits past 64: left to protobuf-c */
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false; /* truncated, or longer than 10 bytes */
}

/* protobuf-c reads a tag or a length prefix of at most 5 bytes (a longer,
 * padded one is an error there) and no length over INT_MAX: the same bounds
 * here, or this would accept what protobuf-c refuses. */
enum { PREFIX_MAX = 5 };

static inline bool prefix(rd *r, uint64_t *v) {
    const uint8_t *start = r->p;
    return varint(r, v) && r->p - start <= PREFIX_MAX;
}

/* A length-delimited field: its bytes [*ret, *ret + *len). */
static inline bool span(rd *r, const uint8_t **ret, size_t *len) {
    uint64_t n;
    if (!prefix(r, &n) || n > INT_MAX || n > (uint64_t)(r->end - r->p))
        return false;
    *ret = r->p;
    *len = (size_t)n;
    r->p += n;
    return true;
}

/* A sub-message: room for its struct (size bytes) in the arena, and *sub
 * over its bytes; NULL (decline) when either is missing. */
static inline void *submsg(rd *r, size_t size, rd *sub) {
    size_t n;
    void *m = take(r, size);
    if (!m || !span(r, &sub->p, &n))
        return NULL;
    sub->end = sub->p + n;
    sub->a = r->a;
    return m;
}

/* A string, NUL-terminated in the arena; no_nul: decline one holding a NUL
 * byte (protobuf-c keeps such a string up to it). */
static inline bool str_field(rd *r, char **out, bool no_nul) {
    const uint8_t *s;
    size_t n;
    char *c;
    if (!span(r, &s, &n) || (no_nul && memchr(s, 0, n)) || !(c = take(r, n + 1)))
        return false;
    memcpy(c, s, n);
    c[n] = 0;
    *out = c;
    return true;
}

static inline bool str(rd *r, char **out) {
    return str_field(r, out, false);
}

static inline bool bytes(rd *r, ProtobufCBinaryData *out) {
    const uint8_t *s;
    size_t n;
    if (!span(r, &s, &n))
        return false;
    out->len = n;
    out->data = NULL;
    if (n > 0) {
        if (!(out->data = take(r, n)))
            return false;
        memcpy(out->data, s, n);
    }
    return true;
}

/* The next field's number and wire type; false at the end. Each number
 * once (seen: a bit per field number below 64; above: declined). */
static inline bool tag(rd *r, uint32_t *field, uint32_t *wt, uint64_t *seen, bool *bad) {
    uint64_t t;
    if (r->p == r->end)
        return false;
    if (!prefix(r, &t) || (t >> 3) == 0 || (t >> 3) >= 64 || (*seen >> (t >> 3) & 1)) {
        *bad = true;
        return false;
    }
    *seen |= 1ull << (t >> 3);
    *field = (uint32_t)(t >> 3);
    *wt = (uint32_t)(t & 7);
    return true;
}

enum { WT_VARINT = 0, WT_LEN = 2 };

#endif
