#include "layout.h"

#include "gpubuf.pb-c.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define FAIL(...) (snprintf(msg, msg_len, __VA_ARGS__), -EINVAL)

uint64_t gpubuf_layout_item_size(gpubuf_dtype d) {
    return ((uint64_t)d.bits * d.lanes + 7) / 8;
}

void gpubuf_layout_compact_strides(const gpubuf_layout *l, int64_t *strides) {
    int64_t s = 1;
    for (uint32_t i = l->ndim; i-- > 0;) {
        strides[i] = s;
        /* Saturates instead of overflowing: such a shape fails the extent check. */
        if (l->shape[i] > 1 && __builtin_mul_overflow(s, l->shape[i], &s))
            s = INT64_MAX;
    }
}

int gpubuf_layout_validate(const gpubuf_layout *l, uint64_t size, char *msg, size_t msg_len) {
    const gpubuf_dtype d = l->dtype;
    if (d.code > GPUBUF_DTYPE_CODE_MAX)
        return FAIL("dtype code %u is not a DLPack type code (0 int, 1 uint, 2 float, 3 opaque "
                    "handle, 4 bfloat, 5 complex, 6 bool, 7..%d DLPack 1.1 float8/6/4)",
                    d.code, GPUBUF_DTYPE_CODE_MAX);
    if (d.bits == 0 || d.lanes == 0)
        return FAIL("dtype bits (%u) and lanes (%u) must be at least 1", d.bits, d.lanes);
    if (((uint32_t)d.bits * d.lanes) % 8)
        return FAIL("dtype of %u bits x %u lanes is not a whole number of bytes (describe "
                    "sub-byte types with lanes, e.g. 4 bits x 2 lanes)",
                    d.bits, d.lanes);
    if (l->ndim > GPUBUF_LAYOUT_MAX_NDIM)
        return FAIL("layout has %u dimensions, at most %d", l->ndim, GPUBUF_LAYOUT_MAX_NDIM);
    int64_t compact[GPUBUF_LAYOUT_MAX_NDIM];
    const int64_t *st = l->strides;
    if (!l->has_strides) {
        gpubuf_layout_compact_strides(l, compact);
        st = compact;
    }
    /* Lowest and highest element index reached from element 0, then bytes;
     * in 128 bits with overflow checks: no layout wraps into a small one. */
    __int128 lo = 0, hi = 0, reach, first, end;
    bool empty = false, over = false;
    for (uint32_t i = 0; i < l->ndim; i++) {
        if (l->shape[i] < 0)
            return FAIL("shape[%u] is %lld: sizes are >= 0", i, (long long)l->shape[i]);
        if (l->shape[i] == 0)
            empty = true;
        over |= __builtin_mul_overflow((__int128)(l->shape[i] > 0 ? l->shape[i] - 1 : 0),
                                       (__int128)st[i], &reach);
        over |= __builtin_add_overflow(reach < 0 ? lo : hi, reach, reach < 0 ? &lo : &hi);
    }
    uint64_t item = gpubuf_layout_item_size(d);
    if (empty) {
        if (l->byte_offset > size)
            return FAIL("byte_offset %llu lies beyond the buffer's %llu bytes",
                        (unsigned long long)l->byte_offset, (unsigned long long)size);
        return 0;
    }
    over |= __builtin_mul_overflow(lo, (__int128)item, &first);
    over |= __builtin_add_overflow(first, (__int128)l->byte_offset, &first);
    over |= __builtin_add_overflow(hi, (__int128)1, &end);
    over |= __builtin_mul_overflow(end, (__int128)item, &end);
    over |= __builtin_add_overflow(end, (__int128)l->byte_offset, &end);
    if (over || end > (__int128)UINT64_MAX)
        return FAIL("the layout spans more than 2^64 bytes; the buffer has %llu",
                    (unsigned long long)size);
    if (first < 0)
        return FAIL("negative strides reach %lld bytes before the buffer's start",
                    (long long)(first < INT64_MIN ? INT64_MIN : (int64_t)first));
    if (end > (__int128)size)
        return FAIL("the layout needs %llu bytes (byte_offset + extent of the shape and strides "
                    "x %llu-byte items), the buffer has %llu",
                    (unsigned long long)end, (unsigned long long)item, (unsigned long long)size);
    return 0;
}

int gpubuf_layout_from_wire(const Gpubuf__ArrayLayout *m, gpubuf_layout *ret, char *msg,
                            size_t msg_len) {
    if (m->n_shape > GPUBUF_LAYOUT_MAX_NDIM)
        return FAIL("layout has %zu dimensions, at most %d", m->n_shape, GPUBUF_LAYOUT_MAX_NDIM);
    if (m->n_strides && m->n_strides != m->n_shape)
        return FAIL("layout has %zu strides for %zu dimensions: give one per dimension, or "
                    "none for C order",
                    m->n_strides, m->n_shape);
    if (m->dtype_bits > UINT8_MAX || m->dtype_lanes > UINT16_MAX || m->dtype_code > UINT8_MAX)
        return FAIL("dtype code %u, bits %u, lanes %u: code and bits are at most 255, lanes at "
                    "most 65535",
                    m->dtype_code, m->dtype_bits, m->dtype_lanes);
    memset(ret, 0, sizeof(*ret));
    ret->dtype.code = (uint8_t)m->dtype_code;
    ret->dtype.bits = (uint8_t)m->dtype_bits;
    ret->dtype.lanes = (uint16_t)m->dtype_lanes;
    ret->ndim = (uint32_t)m->n_shape;
    ret->byte_offset = m->byte_offset;
    if (m->n_shape)
        memcpy(ret->shape, m->shape, m->n_shape * sizeof(int64_t));
    ret->has_strides = m->n_strides != 0;
    if (ret->has_strides)
        memcpy(ret->strides, m->strides, m->n_strides * sizeof(int64_t));
    else
        gpubuf_layout_compact_strides(ret, ret->strides);
    return 0;
}

void gpubuf_layout_wire(gpubuf_dtype dtype, size_t ndim, const int64_t *shape,
                        const int64_t *strides, uint64_t byte_offset, Gpubuf__ArrayLayout *ret) {
    gpubuf__array_layout__init(ret);
    ret->dtype_code = dtype.code;
    ret->dtype_bits = dtype.bits;
    ret->dtype_lanes = dtype.lanes;
    ret->n_shape = ndim;
    ret->shape = (int64_t *)shape;
    if (strides) {
        ret->n_strides = ndim;
        ret->strides = (int64_t *)strides;
    }
    ret->byte_offset = byte_offset;
}

void gpubuf_layout_to_wire(const gpubuf_layout *l, Gpubuf__ArrayLayout *ret) {
    gpubuf_layout_wire(l->dtype, (size_t)l->ndim, l->shape, l->has_strides ? l->strides : NULL,
                       l->byte_offset, ret);
}

void gpubuf_dtype_name(gpubuf_dtype d, char *out, size_t len) {
    /* DLPack 1.1's float8/6/4 codes, from kDLFloat8_e3m4 (7). */
    static const char *const small[] = {"float8_e3m4",   "float8_e4m3",     "float8_e4m3b11fnuz",
                                        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2",
                                        "float8_e5m2fnuz", "float8_e8m0fnu", "float6_e2m3fn",
                                        "float6_e3m2fn", "float4_e2m1fn"};
    static const char *const base[] = {"int", "uint", "float", "handle", "bfloat", "complex"};
    int n;
    if (d.code < 6)
        n = snprintf(out, len, "%s%u", base[d.code], d.bits);
    else if (d.code == 6)
        n = snprintf(out, len, d.bits == 8 ? "bool" : "bool%u", d.bits);
    else if (d.code <= GPUBUF_DTYPE_CODE_MAX)
        n = snprintf(out, len, "%s", small[d.code - 7]);
    else
        n = snprintf(out, len, "dtype%u.%u", d.code, d.bits);
    if (d.lanes > 1 && n >= 0 && (size_t)n < len)
        snprintf(out + n, len - (size_t)n, "x%u", d.lanes);
}

void gpubuf_layout_format(gpubuf_dtype dtype, uint32_t ndim, const int64_t *shape, char *out,
                          size_t len) {
    size_t n;
    if (len < 8) {
        if (len)
            out[0] = 0;
        return;
    }
    gpubuf_dtype_name(dtype, out, len);
    n = strlen(out);
    for (uint32_t i = 0; i <= ndim && n < len; i++) {
        int w = i == ndim ? snprintf(out + n, len - n, ndim ? "]" : "[]")
                          : snprintf(out + n, len - n, "%c%lld", i ? ',' : '[', (long long)shape[i]);
        n += w > 0 ? (size_t)w : 0;
    }
    if (n >= len) /* cut: end with an ellipsis */
        memcpy(out + len - 4, "...", 4);
}
