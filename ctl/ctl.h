/* What gpubufctl's files share: the text helpers (text.c), and the
 * printers of a status snapshot (tables in gpubufctl.c, JSON in json.c,
 * metrics in metrics.c). */
#ifndef GPUBUFCTL_CTL_H
#define GPUBUFCTL_CTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpubuf/gpubuf.h"

/* str as printable, valid UTF-8 (see gpubufctl.c); eight results usable at
 * once. */
const char *shown(const char *str);
/* A lease's time left, short ("12.3s", "4m05s", "2h10m", "3d04h"), into out. */
const char *format_left(uint64_t ms, char *out, size_t len);
/* ", restarted N times" or "" for the status header. */
const char *restarted(const gpubuf_status *s);

void print_pools(const gpubuf_status *s);
void print_buffers(const gpubuf_status *s);
void print_clients(const gpubuf_status *s);
/* cmd: the command whose part is printed ("status": all of it). */
void print_json(const gpubuf_status *s, const char *cmd, bool pretty);
void print_metrics(const gpubuf_status *s);
void print_batches(const gpubuf_counters *k);

/* One of a pool's byte counters, summed for rates by the caller. */
typedef uint64_t (*pool_counter)(const gpubuf_pool_counters *p);
uint64_t c_alloc(const gpubuf_pool_counters *p);
uint64_t c_freed(const gpubuf_pool_counters *p);

#endif
