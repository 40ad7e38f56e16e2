#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpubuf/gpubuf.h"

int gpubuf_parse_size(const char *s, uint64_t *ret) {
    char *end;
    unsigned long long v;
    uint64_t mul = 1;
    /* Digits first: strtoull alone would take leading spaces and a sign,
     * and " -1" would wrap to 2^64 - 1. */
    if (!s || *s < '0' || *s > '9')
        return -EINVAL;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -EINVAL;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    case 't': case 'T': mul = 1ull << 40; end++; break;
    default: return -EINVAL;
    }
    if (*end == 'i' && mul > 1)
        end++;
    if ((*end == 'B' || *end == 'b') && end[1] == '\0')
        end++;
    if (*end != '\0')
        return -EINVAL;
    if (v > UINT64_MAX / mul)
        return -EINVAL;
    *ret = v * mul;
    return 0;
}

char *gpubuf_format_size(uint64_t bytes, char *buf, size_t len) {
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, len, "%.1f %s", v, units[u]);
    return buf;
}

void gpubuf_format_uuid(const uint8_t u[16], char out[41]) {
    snprintf(out, 41,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
             u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

uint64_t gpubuf_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

bool gpubuf_name_valid(const char *name, size_t len) {
    if (len == 0 || len > GPUBUF_NAME_MAX || name[0] == '/')
        return false;
    for (size_t i = 0; i < len; i++) {
        char ch = name[i];
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
            continue;
        if (!strchr("._:/@+-", ch) || ch == '\0')
            return false;
    }
    return true;
}

const char *gpubuf_pool_kind_name(gpubuf_pool_kind kind) {
    switch (kind) {
    case GPUBUF_POOL_HOST: return "host";
    case GPUBUF_POOL_CUDA_IPC: return "cuda-ipc";
    case GPUBUF_POOL_CUDA_VMM: return "cuda-vmm";
    }
    return "unknown";
}

const char *gpubuf_state_name(gpubuf_state s) {
    switch (s) {
    case GPUBUF_STATE_ALLOCATED: return "allocated";
    case GPUBUF_STATE_SEALED: return "sealed";
    case GPUBUF_STATE_DELETED: return "deleted";
    }
    return "unknown";
}

/* Up to 64 bytes of an untrusted name for a message, as printable UTF-8
 * (gpubuf_text_clean: "\x1b" for an escape), cut short of out's 100 bytes. */
static const char *name_shown(const char *name, size_t len, char out[100]) {
    gpubuf_text_clean(out, 100, name, len < 64 ? len : 64);
    return out;
}

int gpubuf_name_check(const char *name, size_t len, char *msg, size_t msg_len) {
    char a[100], b[100];
    if (gpubuf_name_valid(name, len))
        return 0;
    if (len == 0) {
        snprintf(msg, msg_len, "the name is empty: a name is 1 to %d bytes", GPUBUF_NAME_MAX);
        return -EINVAL;
    }
    if (len > GPUBUF_NAME_MAX) {
        snprintf(msg, msg_len, "a name of %zu bytes is too long: at most %d bytes", len,
                 GPUBUF_NAME_MAX);
        return -ENAMETOOLONG;
    }
    if (name[0] == '/') {
        snprintf(msg, msg_len, "invalid name '%s': a name may not start with '/' (use '%s')",
                 name_shown(name, len, a), len > 1 ? name_shown(name + 1, len - 1, b) : "x");
        return -EINVAL;
    }
    size_t i = 0;
    while (i < len && name[i] &&
           (strchr("._:/@+-", name[i]) || (name[i] >= 'a' && name[i] <= 'z') ||
            (name[i] >= 'A' && name[i] <= 'Z') || (name[i] >= '0' && name[i] <= '9')))
        i++;
    unsigned char bad = i < len ? (unsigned char)name[i] : 0;
    char shown[8];
    if (bad > 0x20 && bad < 0x7f)
        snprintf(shown, sizeof(shown), "'%c'", bad);
    else
        snprintf(shown, sizeof(shown), "0x%02x", bad);
    snprintf(msg, msg_len,
             "invalid name '%s': %s at byte %zu is not allowed; a name uses only "
             "A-Z a-z 0-9 . _ : / @ + - and does not start with '/'",
             name_shown(name, len, a), shown, i);
    return -EINVAL;
}

int gpubuf_name_split(const char *in, char pool[GPUBUF_NAME_MAX + 1], const char **ret_name,
                      char *msg, size_t msg_len) {
    pool[0] = '\0';
    if (in[0] != '/') {
        *ret_name = in;
        return 0;
    }
    const char *slash = strchr(in + 1, '/');
    size_t pl = slash ? (size_t)(slash - in - 1) : 0;
    if (!slash || pl == 0 || !slash[1]) {
        /* "/x", "//x", "/x/": the rule for plain names, then the form. */
        size_t n = 0;
        if (gpubuf_name_check(in, strlen(in), msg, msg_len) < 0)
            n = strlen(msg);
        snprintf(msg + n, msg_len - n, "%s'/POOL/NAME' names buffer NAME of pool POOL",
                 n ? "; " : "");
        return -EINVAL;
    }
    if (pl > GPUBUF_NAME_MAX) {
        char a[100];
        snprintf(msg, msg_len, "the pool name of '%s...' is longer than %d bytes",
                 name_shown(in, strlen(in), a), GPUBUF_NAME_MAX);
        return -ENAMETOOLONG;
    }
    memcpy(pool, in + 1, pl);
    pool[pl] = '\0';
    *ret_name = slash + 1;
    return 0;
}

/* Length of the UTF-8 character at s (at most n bytes), or 0 when s does not
 * start a valid one: no overlong forms, no surrogates, nothing above U+10FFFF. */
static size_t utf8_char_len(const unsigned char *s, size_t n, uint32_t *cp) {
    size_t len;
    uint32_t c, min;
    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf)
        len = 2, c = s[0] & 0x1f, min = 0x80;
    else if (s[0] >= 0xe0 && s[0] <= 0xef)
        len = 3, c = s[0] & 0x0f, min = 0x800;
    else if (s[0] >= 0xf0 && s[0] <= 0xf4)
        len = 4, c = s[0] & 0x07, min = 0x10000;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3f);
    }
    if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return len;
}

/* Characters that act on a terminal or reorder text instead of showing:
 * C0 controls, DEL, C1 controls and the bidirectional formatting marks. */
static bool char_unsafe(uint32_t c) {
    return c < 0x20 || (c >= 0x7f && c <= 0x9f) || c == 0x061c || c == 0x200e || c == 0x200f ||
           (c >= 0x202a && c <= 0x202e) || (c >= 0x2066 && c <= 0x2069);
}

size_t gpubuf_text_clean(char *out, size_t out_size, const char *in, size_t in_len) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0, i = 0;
    if (out_size == 0)
        return 0;
    while (i < in_len) {
        uint32_t cp = 0;
        size_t len = utf8_char_len(s + i, in_len - i, &cp);
        bool keep = len > 0 && !char_unsafe(cp);
        if (len == 0)
            len = 1; /* one byte that starts no valid character */
        size_t need = keep ? len : 4 * len;
        if (o + need > out_size - 1)
            break; /* cut before the character, never inside it */
        for (size_t k = 0; k < len; k++) {
            if (keep) {
                out[o++] = (char)s[i + k];
            } else {
                out[o++] = '\\';
                out[o++] = 'x';
                out[o++] = hex[s[i + k] >> 4];
                out[o++] = hex[s[i + k] & 15];
            }
        }
        i += len;
    }
    out[o] = '\0';
    return o;
}
