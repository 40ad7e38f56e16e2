/* Array layouts and their wire form, shared by the daemon and the client
 * library: one set of rules, one set of sentences. */
#ifndef GPUBUF_COMMON_LAYOUT_H
#define GPUBUF_COMMON_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "gpubuf/gpubuf.h"

/* The wire form (gpubuf.pb-c.h), for the daemon and the library. */
struct Gpubuf__ArrayLayout;

/* The highest DLDataTypeCode accepted (DLPack 1.1: kDLFloat4_e2m1fn). */
#define GPUBUF_DTYPE_CODE_MAX 17

/* Bytes per element: bits * lanes / 8, rounded up. */
uint64_t gpubuf_layout_item_size(gpubuf_dtype d);

/* 0, or -EINVAL with the rule l breaks in msg: a known dtype code, bits and
 * lanes of whole bytes, ndim <= GPUBUF_LAYOUT_MAX_NDIM, shapes >= 0, and every
 * element inside a buffer of size bytes. */
int gpubuf_layout_validate(const gpubuf_layout *l, uint64_t size, char *msg, size_t msg_len);

/* The wire layout m as a gpubuf_layout (strides filled in when absent);
 * -EINVAL with a sentence when it has too many dimensions, strides that do
 * not match its shape, or fields out of their range. Does not check the
 * extent: gpubuf_layout_validate() does. */
int gpubuf_layout_from_wire(const struct Gpubuf__ArrayLayout *m, gpubuf_layout *ret, char *msg,
                            size_t msg_len);

/* A wire layout (ret, initialised here) of ndim dimensions, pointing into
 * shape and strides (NULL: none, C-contiguous). */
void gpubuf_layout_wire(gpubuf_dtype dtype, size_t ndim, const int64_t *shape,
                        const int64_t *strides, uint64_t byte_offset,
                        struct Gpubuf__ArrayLayout *ret);
/* A wire layout pointing into l (shape and, when given, strides). */
void gpubuf_layout_to_wire(const gpubuf_layout *l, struct Gpubuf__ArrayLayout *ret);

/* C-contiguous strides (in elements) for l's shape into strides. */
void gpubuf_layout_compact_strides(const gpubuf_layout *l, int64_t *strides);

/* dtype's name into out: "float32", "int8", "bfloat16", "bool", "complex64",
 * "float8_e4m3fn"..., with "x<lanes>" when lanes > 1; "dtype<code>.<bits>"
 * for codes without a name. */
void gpubuf_dtype_name(gpubuf_dtype dtype, char *out, size_t len);

/* "float32[16,16]" (a scalar: "float32[]") into out, cut with "..." when it
 * does not fit. */
void gpubuf_layout_format(gpubuf_dtype dtype, uint32_t ndim, const int64_t *shape, char *out,
                          size_t len);

#endif
