/* Writing protobuf's wire format by straight-line code, the counterpart of
 * pb_read.h: each field's size (f_*) and the field itself (p_*), left out
 * where protobuf-c leaves a proto3 field out (0, false, an empty string or
 * bytes); the writer's caller sizes the message first and writes it into
 * room of that size. For the hand packers that must write protobuf-c's very
 * bytes: gpubufd's replies (daemon/reply_pack.c) and the client's requests
 * (client/request_pack.c), each held to protobuf-c by its test. */
#ifndef GPUBUF_PB_WRITE_H
#define GPUBUF_PB_WRITE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <protobuf-c/protobuf-c.h>

/* A varint's length: 1 + floor(log2(v)) / 7, without a loop. */
static inline size_t vlen(uint64_t v) {
    return ((size_t)(63 - __builtin_clzll(v | 1)) * 9 + 73) / 64;
}

static inline uint8_t *vput(uint8_t *p, uint64_t v) {
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

/* Tags of fields 1..15 take one byte, 16 and up two. */
#define PB_TAG(num, wt) (((uint64_t)(num) << 3) | (wt))
#define PB_VARINT 0u
#define PB_LEN 2u

/* Sizes of one field, tag included; 0 when protobuf-c leaves it out. */
static inline size_t f_u64(unsigned num, uint64_t v) {
    return v ? vlen(PB_TAG(num, PB_VARINT)) + vlen(v) : 0;
}
/* int32 and enum: a negative value is sign-extended to ten bytes. */
static inline size_t f_i32(unsigned num, int32_t v) {
    return f_u64(num, (uint64_t)(int64_t)v);
}
static inline size_t f_bool(unsigned num, protobuf_c_boolean v) {
    return v ? vlen(PB_TAG(num, PB_VARINT)) + 1 : 0;
}
static inline size_t f_len(unsigned num, size_t len) {
    return vlen(PB_TAG(num, PB_LEN)) + vlen(len) + len;
}
static inline size_t f_str(unsigned num, const char *s) {
    return s && *s ? f_len(num, strlen(s)) : 0;
}
static inline size_t f_bytes(unsigned num, ProtobufCBinaryData b) {
    return b.len ? f_len(num, b.len) : 0;
}

static inline uint8_t *p_u64(uint8_t *p, unsigned num, uint64_t v) {
    if (!v)
        return p;
    p = vput(p, PB_TAG(num, PB_VARINT));
    return vput(p, v);
}
static inline uint8_t *p_i32(uint8_t *p, unsigned num, int32_t v) {
    return p_u64(p, num, (uint64_t)(int64_t)v);
}
static inline uint8_t *p_bool(uint8_t *p, unsigned num, protobuf_c_boolean v) {
    if (!v)
        return p;
    p = vput(p, PB_TAG(num, PB_VARINT));
    *p++ = 1;
    return p;
}
static inline uint8_t *p_data(uint8_t *p, unsigned num, const void *data, size_t len) {
    p = vput(p, PB_TAG(num, PB_LEN));
    p = vput(p, len);
    if (len) /* an empty element of repeated bytes may have no data */
        memcpy(p, data, len);
    return p + len;
}
static inline uint8_t *p_str(uint8_t *p, unsigned num, const char *s) {
    return s && *s ? p_data(p, num, s, strlen(s)) : p;
}
static inline uint8_t *p_bytes(uint8_t *p, unsigned num, ProtobufCBinaryData b) {
    return b.len ? p_data(p, num, b.data, b.len) : p;
}

/* A oneof's member: on the wire whenever its case is set, even at 0. */
static inline size_t f_u64_set(unsigned num, uint64_t v) {
    return vlen(PB_TAG(num, PB_VARINT)) + vlen(v);
}
static inline uint8_t *p_u64_set(uint8_t *p, unsigned num, uint64_t v) {
    return vput(vput(p, PB_TAG(num, PB_VARINT)), v);
}

#endif
