/* Layouts for the metadata tests (test_meta.c, test_meta_registry.c). */
#ifndef GPUBUF_TEST_LAYOUT_HELPERS_H
#define GPUBUF_TEST_LAYOUT_HELPERS_H

#include <string.h>

#include "gpubuf/gpubuf.h"

/* float32 of the given shape, C order (set has_strides and strides for others). */
static inline gpubuf_layout f32(uint32_t ndim, const int64_t *shape) {
    gpubuf_layout l;
    memset(&l, 0, sizeof(l));
    l.dtype = (gpubuf_dtype){.code = 2, .bits = 32, .lanes = 1};
    l.ndim = ndim;
    memcpy(l.shape, shape, ndim * sizeof(int64_t));
    return l;
}

#endif
