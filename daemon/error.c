#include "error.h"

#include <stdarg.h>
#include <stdio.h>

#include "gpubuf/gpubuf.h"

int gd_err_set(gd_err *err, int code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

const char *gd_err_msg(const gd_err *err, int code) {
    return err && err->msg[0] ? err->msg : gpubuf_strerror(code);
}
