#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

int gd_log_level = GPUBUF_LOG_INFO;
static int journal;

void gd_log_init(void) {
    journal = getenv("JOURNAL_STREAM") != NULL;
}

int gd_log_parse_level(const char *s) {
    static const char *names[] = {"emerg", "alert", "crit", "err", "warning", "notice", "info",
                                  "debug"};
    for (int i = 0; i < 8; i++)
        if (strcasecmp(s, names[i]) == 0)
            return i;
    if (strcasecmp(s, "error") == 0)
        return GPUBUF_LOG_ERR;
    if (strcasecmp(s, "warn") == 0)
        return GPUBUF_LOG_WARNING;
    return -1;
}

void gd_log(int prio, const char *fmt, ...) {
    static const char *words[] = {"emerg", "alert", "crit", "error", "warning", "notice", "info",
                                  "debug"};
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (journal)
        fprintf(stderr, "<%d>%s\n", prio, line);
    else
        fprintf(stderr, "gpubufd: %s: %s\n", words[prio & 7], line);
}

bool gd_log_allow(gd_log_limit *l, uint32_t *suppressed) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
    if (l->lines == 0 || now - l->window_start_ms >= GD_LOG_WINDOW_MS) {
        l->window_start_ms = now;
        l->lines = 0;
    }
    if (l->lines >= GD_LOG_BURST) {
        l->suppressed++;
        *suppressed = 0;
        return false;
    }
    l->lines++;
    *suppressed = l->suppressed;
    l->suppressed = 0;
    return true;
}
