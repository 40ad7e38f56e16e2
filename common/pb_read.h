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

/* ---- messages of columns, through their descriptors --------------------
 * The batch requests (daemon/request_fast.c) and the batch reply
 * (client/reply_fast.c) are columns: numbers, bools and strings, single or
 * repeated, and a few small sub-messages, at field numbers 1..n in order.
 * pb_msg() decodes such a message by its descriptor: repeated numbers and
 * bools must come packed, as protobuf-c packs them (a bool a byte of 0 or
 * 1); repeated strings, bytes and messages one field each. A first pass
 * checks every field and counts the elements of each repeated one, the
 * arrays are taken from the arena at their size, a second pass fills
 * them. It declines any other shape: a single field twice, an unpacked
 * repeated number, a type it does not know (a 64-bit signed number, a
 * float), a field number it does not know, a string with a NUL byte. */
enum { PB_MAX_FIELDS = 16 };

static inline const ProtobufCFieldDescriptor *pb_field(const ProtobufCMessageDescriptor *d,
                                                      uint64_t num) {
    if (num < 1 || num > d->n_fields || d->fields[num - 1].id != num)
        return NULL;
    return &d->fields[num - 1];
}

/* The bytes of one element of a repeated field of type t (0: not taken). */
static inline size_t pb_elem_size(const ProtobufCFieldDescriptor *f) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT64: return sizeof(uint64_t);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_SINT32: return sizeof(uint32_t);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    default: return 0;
    }
}

static inline void *pb_msg(rd *r, const ProtobufCMessageDescriptor *d);

/* A single number or bool of type t from v into at. */
static inline bool pb_scalar(const ProtobufCFieldDescriptor *f, uint64_t v, void *at) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_UINT64: *(uint64_t *)at = v; return true;
    case PROTOBUF_C_TYPE_UINT32: *(uint32_t *)at = (uint32_t)v; return true;
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_ENUM: *(int32_t *)at = (int32_t)v; return true;
    case PROTOBUF_C_TYPE_SINT32:
        *(int32_t *)at = (int32_t)((uint32_t)v >> 1) ^ -(int32_t)((uint32_t)v & 1);
        return true;
    case PROTOBUF_C_TYPE_BOOL: *(protobuf_c_boolean *)at = v != 0; return true;
    default: return false;
    }
}

/* One pass over the message's fields in r: checking and counting (fill
 * false: count[num] += elements), or filling the arrays taken since. */
static inline bool pb_fields(rd *r, const ProtobufCMessageDescriptor *d, void *m, bool fill,
                             size_t count[PB_MAX_FIELDS + 1]) {
    uint64_t seen = 0, t, v;
    while (r->p < r->end) {
        const ProtobufCFieldDescriptor *f;
        if (!prefix(r, &t) || !(f = pb_field(d, t >> 3)))
            return false;
        uint32_t num = (uint32_t)(t >> 3), wt = (uint32_t)(t & 7);
        bool rep = f->label == PROTOBUF_C_LABEL_REPEATED;
        bool each = f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_BYTES ||
                    f->type == PROTOBUF_C_TYPE_MESSAGE; /* a field per element */
        char *at = (char *)m + f->offset;
        size_t *n = (size_t *)(void *)((char *)m + f->quantifier_offset);
        if (!(rep && each)) {
            if (seen >> num & 1)
                return false;
            seen |= 1ull << num;
        }
        if (each) {
            if (wt != WT_LEN)
                return false;
            if (!fill) {
                const uint8_t *sp;
                size_t sl;
                /* A message's own fields are checked when it is filled. */
                if (!span(r, &sp, &sl) ||
                    (f->type == PROTOBUF_C_TYPE_STRING && memchr(sp, 0, sl)) ||
                    (f->type == PROTOBUF_C_TYPE_MESSAGE && !rep))
                    return false;
                count[num] += rep;
                continue;
            }
            void *slot = rep ? (char *)*(void **)(void *)at + *n * pb_elem_size(f) : at;
            bool ok = f->type == PROTOBUF_C_TYPE_STRING ? str(r, (char **)slot)
                      : f->type == PROTOBUF_C_TYPE_BYTES
                          ? bytes(r, (ProtobufCBinaryData *)slot)
                          : (*(void **)slot = pb_msg(r, f->descriptor)) != NULL;
            if (!ok)
                return false;
            *n += rep;
        } else if (rep) {
            const uint8_t *pp;
            size_t pl;
            if (wt != WT_LEN || !(f->flags & PROTOBUF_C_FIELD_FLAG_PACKED) || !pb_elem_size(f) ||
                !span(r, &pp, &pl))
                return false;
            if (f->type == PROTOBUF_C_TYPE_BOOL) {
                protobuf_c_boolean *arr = fill ? *(protobuf_c_boolean **)(void *)at : NULL;
                for (size_t i = 0; i < pl; i++) {
                    if (pp[i] > 1)
                        return false;
                    if (fill)
                        arr[i] = pp[i];
                }
                if (fill)
                    *n = pl;
                else
                    count[num] = pl;
                continue;
            }
            if (!fill) {
                size_t c = 0;
                for (size_t i = 0; i < pl; i++)
                    c += pp[i] < 0x80;
                if (pl && pp[pl - 1] >= 0x80)
                    return false;
                count[num] = c;
                continue;
            }
            rd sub = {.p = pp, .end = pp + pl, .a = r->a};
            if (f->type == PROTOBUF_C_TYPE_UINT64) { /* most columns: a loop of its own */
                uint64_t *arr = *(uint64_t **)(void *)at;
                while (sub.p < sub.end)
                    if (!varint(&sub, &arr[(*n)++]))
                        return false;
                continue;
            }
            char *arr = *(char **)(void *)at;
            size_t each_size = pb_elem_size(f);
            while (sub.p < sub.end) {
                if (!varint(&sub, &v) || v > UINT32_MAX || !pb_scalar(f, v, arr + *n * each_size))
                    return false;
                (*n)++;
            }
        } else {
            char scratch[8];
            if (wt != WT_VARINT || !varint(r, &v) || !pb_scalar(f, v, fill ? (void *)at : scratch))
                return false;
        }
    }
    return true;
}

/* The length-delimited message of descriptor d at r: its struct and
 * arrays in the arena; NULL (decline) for any other shape. */
static inline void *pb_msg(rd *r, const ProtobufCMessageDescriptor *d) {
    size_t count[PB_MAX_FIELDS + 1] = {0};
    rd sub;
    void *m = submsg(r, d->sizeof_message, &sub);
    if (!m || d->n_fields > PB_MAX_FIELDS)
        return NULL;
    protobuf_c_message_init(d, m);
    rd scan = sub;
    if (!pb_fields(&scan, d, m, false, count))
        return NULL;
    for (uint32_t num = 1; num <= d->n_fields; num++) {
        if (!count[num])
            continue;
        size_t each = pb_elem_size(&d->fields[num - 1]);
        void *arr = count[num] > SIZE_MAX / each ? NULL : take(&sub, count[num] * each);
        if (!arr)
            return NULL;
        *(void **)(void *)((char *)m + d->fields[num - 1].offset) = arr;
    }
    return pb_fields(&sub, d, m, true, count) ? m : NULL;
}

#endif
