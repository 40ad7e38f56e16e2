/* gpubufctl: look at a running gpubufd. */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpubuf/gpubuf.h"
#include "util.h"

enum { EXIT_USAGE = 2, EXIT_NO_DAEMON = 3, EXIT_REQUEST = 4 };

static const char *state_name(gpubuf_state s) {
    switch (s) {
    case GPUBUF_STATE_ALLOCATED: return "allocated";
    case GPUBUF_STATE_SEALED: return "sealed";
    case GPUBUF_STATE_DELETED: return "deleted";
    }
    return "unknown";
}

static const char *kind_name(gpubuf_pool_kind k) {
    return gpubuf_pool_kind_name(k);
}

static json_object *pool_json(const gpubuf_pool_info *p) {
    {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "name", json_object_new_string(p->name));
        json_object_object_add(o, "kind", json_object_new_string(kind_name(p->kind)));
        json_object_object_add(o, "device", json_object_new_int(p->device));
        json_object_object_add(o, "device_uuid", json_object_new_string(p->device_uuid));
        json_object_object_add(o, "capacity", json_object_new_uint64(p->capacity));
        json_object_object_add(o, "used", json_object_new_uint64(p->used));
        json_object_object_add(o, "reserved", json_object_new_uint64(p->reserved));
        json_object_object_add(o, "free", json_object_new_uint64(p->capacity - p->used));
        json_object_object_add(o, "slabs", json_object_new_int64(p->slabs));
        json_object_object_add(o, "slab_size", json_object_new_uint64(p->slab_size));
        json_object_object_add(o, "buffers", json_object_new_int64(p->buffers));
        return o;
    }
}

/* A JSON string. Buffer and pool names are printable ASCII without quotes
 * or backslashes (the daemon allows A-Z a-z 0-9 . _ : / @ + -), which need no
 * escaping; anything else is escaped by json-c. */
static char *put_json_string(char *out, const char *str) {
    const char *p = str;
    while (*p && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f)
        p++;
    if (*p) {
        json_object *o = json_object_new_string(str);
        const char *e = json_object_to_json_string_ext(
            o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        size_t n = strlen(e);
        memcpy(out, e, n);
        json_object_put(o);
        return out + n;
    }
    *out++ = '"';
    memcpy(out, str, (size_t)(p - str));
    out += p - str;
    *out++ = '"';
    return out;
}

static char *put_text(char *out, const char *s) {
    size_t n = strlen(s);
    memcpy(out, s, n);
    return out + n;
}

static char *put_u64(char *out, uint64_t v) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *out++ = tmp[--n];
    return out;
}

/* Buffers can number 100k: each is formatted by hand into one line buffer
 * (printf took a third of gpubufctl's time at 100k buffers). Names are at
 * most 255 bytes and escaping at most sextuples them. */
static void put_buffer_json(const gpubuf_status_buffer *b) {
    char line[4096], *o = line;
    o = put_u64(put_text(o, "{\"id\":"), b->id);
    o = put_json_string(put_text(o, ",\"name\":"), b->name);
    o = put_json_string(put_text(o, ",\"pool\":"), b->pool);
    o = put_u64(put_text(o, ",\"size\":"), b->size);
    o = put_text(put_text(put_text(o, ",\"state\":\""), state_name(b->state)), "\"");
    o = put_u64(put_text(o, ",\"refs\":"), b->refs);
    o = put_u64(put_text(o, ",\"owner_uid\":"), b->owner_uid);
    o = put_u64(put_text(o, ",\"slab\":"), b->slab_id);
    o = put_u64(put_text(o, ",\"offset\":"), b->offset);
    *o++ = '}';
    fwrite(line, 1, (size_t)(o - line), stdout);
}

static json_object *buffer_json(const gpubuf_status_buffer *b) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_uint64(b->id));
    json_object_object_add(o, "name", json_object_new_string(b->name));
    json_object_object_add(o, "pool", json_object_new_string(b->pool));
    json_object_object_add(o, "size", json_object_new_uint64(b->size));
    json_object_object_add(o, "state", json_object_new_string(state_name(b->state)));
    json_object_object_add(o, "refs", json_object_new_int64(b->refs));
    json_object_object_add(o, "owner_uid", json_object_new_int64(b->owner_uid));
    json_object_object_add(o, "slab", json_object_new_uint64(b->slab_id));
    json_object_object_add(o, "offset", json_object_new_uint64(b->offset));
    return o;
}

static json_object *client_json(const gpubuf_client_info *c) {
    {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "session", json_object_new_uint64(c->session_id));
        json_object_object_add(o, "pid", json_object_new_int(c->pid));
        json_object_object_add(o, "uid", json_object_new_int64(c->uid));
        json_object_object_add(o, "gid", json_object_new_int64(c->gid));
        json_object_object_add(o, "name", json_object_new_string(c->name));
        json_object_object_add(o, "references", json_object_new_int64(c->references));
        json_object_object_add(o, "buffers_held", json_object_new_int64(c->buffers_held));
        json_object_object_add(o, "kept_slabs", json_object_new_int64(c->kept_slabs));
        json_object_object_add(o, "read_only_references",
                               json_object_new_int64(c->read_only_references));
        return o;
    }
}

/* JSON goes out one element at a time, each serialised by json-c: a
 * snapshot of 100k buffers never becomes one tree in memory. */
static void emit(json_object *o, int flags) {
    fputs(json_object_to_json_string_ext(o, flags), stdout);
    json_object_put(o);
}

#define EMIT_ARRAY(key, n, make)                                                               \
    do {                                                                                       \
        printf("%s\"" key "\":[", first ? "" : ",");                                          \
        first = false;                                                                         \
        for (size_t i_ = 0; i_ < (n); i_++) {                                                  \
            if (i_)                                                                            \
                putchar(',');                                                                  \
            emit(make, flags);                                                                 \
        }                                                                                      \
        putchar(']');                                                                          \
    } while (0)

static void print_json(const gpubuf_status *s, const char *cmd, bool pretty) {
    int flags = JSON_C_TO_STRING_NOSLASHESCAPE |
                (pretty ? JSON_C_TO_STRING_PRETTY : JSON_C_TO_STRING_PLAIN);
    bool all = strcmp(cmd, "status") == 0, first = true;
    putchar('{');
    if (all) {
        printf("\"version\":");
        emit(json_object_new_string(s->version), flags);
        printf(",\"uptime_ms\":%llu", (unsigned long long)s->uptime_ms);
        first = false;
    }
    if (all || !strcmp(cmd, "pools"))
        EMIT_ARRAY("pools", s->n_pools, pool_json(&s->pools[i_]));
    if (all || !strcmp(cmd, "buffers")) {
        if (pretty) {
            EMIT_ARRAY("buffers", s->n_buffers, buffer_json(&s->buffers[i_]));
        } else {
            printf("%s\"buffers\":[", first ? "" : ",");
            first = false;
            for (size_t i = 0; i < s->n_buffers; i++) {
                if (i)
                    putchar(',');
                put_buffer_json(&s->buffers[i]);
            }
            putchar(']');
        }
    }
    if (all || !strcmp(cmd, "clients"))
        EMIT_ARRAY("clients", s->n_clients, client_json(&s->clients[i_]));
    puts("}");
}

static void print_pools(const gpubuf_status *s) {
    char a[32], b[32], c[32], d[32];
    printf("%-12s %-9s %-6s %11s %11s %11s %6s %8s  %s\n", "POOL", "KIND", "DEVICE", "CAPACITY",
           "USED", "FREE", "SLABS", "BUFFERS", "UUID");
    for (size_t i = 0; i < s->n_pools; i++) {
        const gpubuf_pool_info *p = &s->pools[i];
        char dev[16];
        if (p->device < 0)
            snprintf(dev, sizeof(dev), "-");
        else
            snprintf(dev, sizeof(dev), "%d", p->device);
        printf("%-12s %-9s %-6s %11s %11s %11s %6u %8u  %s\n", p->name, kind_name(p->kind), dev,
               gpubuf_format_size(p->capacity, a, sizeof(a)),
               gpubuf_format_size(p->used, b, sizeof(b)),
               gpubuf_format_size(p->capacity - p->used, c, sizeof(c)), p->slabs, p->buffers,
               p->device_uuid[0] ? p->device_uuid : "-");
        (void)d;
    }
}

static void print_buffers(const gpubuf_status *s) {
    char a[32];
    printf("%-8s %-24s %-10s %11s %-10s %5s %6s\n", "ID", "NAME", "POOL", "SIZE", "STATE", "REFS",
           "SLAB");
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        printf("%-8llu %-24s %-10s %11s %-10s %5u %6llu\n", (unsigned long long)b->id,
               b->name[0] ? b->name : "(anonymous)", b->pool,
               gpubuf_format_size(b->size, a, sizeof(a)), state_name(b->state), b->refs,
               (unsigned long long)b->slab_id);
    }
}

static void print_clients(const gpubuf_status *s) {
    printf("%-8s %-8s %-6s %-16s %10s %9s %8s\n", "SESSION", "PID", "UID", "NAME", "REFERENCES",
           "READ-ONLY", "BUFFERS");
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        printf("%-8llu %-8d %-6u %-16s %10u %9u %8u\n", (unsigned long long)c->session_id, c->pid,
               c->uid, c->name, c->references, c->read_only_references, c->buffers_held);
    }
}

/* Prometheus text format: one family per figure, HELP and TYPE first;
 * label values escaped as the format asks (backslash, quote, newline). */
static void put_label(const char *key, const char *val, bool first) {
    printf("%s%s=\"", first ? "" : ",", key);
    for (const char *p = val; *p; p++) {
        if (*p == '\\' || *p == '"')
            printf("\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", stdout);
        else
            putchar(*p);
    }
    putchar('"');
}

static void family(const char *name, const char *type, const char *help) {
    printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

typedef uint64_t (*pool_field)(const gpubuf_pool_info *p);
static uint64_t f_capacity(const gpubuf_pool_info *p) { return p->capacity; }
static uint64_t f_used(const gpubuf_pool_info *p) { return p->used; }
static uint64_t f_reserved(const gpubuf_pool_info *p) { return p->reserved; }
static uint64_t f_slabs(const gpubuf_pool_info *p) { return p->slabs; }
static uint64_t f_buffers(const gpubuf_pool_info *p) { return p->buffers; }

static void print_metrics(const gpubuf_status *s) {
    static const struct {
        const char *name, *help;
        pool_field get;
    } pf[] = {
        {"gpubuf_pool_capacity_bytes", "Most bytes the pool may hold in slabs.", f_capacity},
        {"gpubuf_pool_used_bytes", "Bytes in live buffers.", f_used},
        {"gpubuf_pool_reserved_bytes", "Bytes held in slabs.", f_reserved},
        {"gpubuf_pool_slabs", "Slabs allocated from the backend.", f_slabs},
        {"gpubuf_pool_buffers", "Live buffers in the pool.", f_buffers},
    };
    for (size_t k = 0; k < sizeof(pf) / sizeof(pf[0]); k++) {
        family(pf[k].name, "gauge", pf[k].help);
        for (size_t i = 0; i < s->n_pools; i++) {
            const gpubuf_pool_info *p = &s->pools[i];
            char dev[16];
            snprintf(dev, sizeof(dev), "%d", p->device);
            printf("%s{", pf[k].name);
            put_label("pool", p->name, true);
            put_label("kind", kind_name(p->kind), false);
            put_label("device", dev, false);
            put_label("uuid", p->device_uuid, false);
            printf("} %llu\n", (unsigned long long)pf[k].get(p));
        }
    }
    uint64_t by_state[4] = {0}, refs = 0, ro_refs = 0;
    for (size_t i = 0; i < s->n_clients; i++)
        ro_refs += s->clients[i].read_only_references;
    for (size_t i = 0; i < s->n_buffers; i++) {
        if (s->buffers[i].state >= 1 && s->buffers[i].state <= 3)
            by_state[s->buffers[i].state]++;
        refs += s->buffers[i].refs;
    }
    family("gpubuf_buffers", "gauge", "Buffers by state.");
    for (int st = 1; st <= 3; st++)
        printf("gpubuf_buffers{state=\"%s\"} %llu\n", state_name((gpubuf_state)st),
               (unsigned long long)by_state[st]);
    family("gpubuf_references", "gauge", "References held by all clients.");
    printf("gpubuf_references %llu\n", (unsigned long long)refs);
    family("gpubuf_read_only_references", "gauge", "References opened read-only.");
    printf("gpubuf_read_only_references %llu\n", (unsigned long long)ro_refs);
    family("gpubuf_clients", "gauge", "Connected clients (this query included).");
    printf("gpubuf_clients %zu\n", s->n_clients);
    family("gpubuf_uptime_seconds", "gauge", "Seconds since gpubufd started.");
    printf("gpubuf_uptime_seconds %.3f\n", (double)s->uptime_ms / 1000.0);
}

typedef struct filters {
    const char *pool, *name_prefix, *state;
    long pid, uid;
} filters;

/* Keep the entries that match, in place. */
static void apply_filters(gpubuf_status *s, const filters *f) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_pools; i++)
        if (!f->pool || !strcmp(s->pools[i].name, f->pool))
            s->pools[n++] = s->pools[i];
    s->n_pools = n;
    n = 0;
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        if ((f->pool && strcmp(b->pool, f->pool)) ||
            (f->name_prefix && strncmp(b->name, f->name_prefix, strlen(f->name_prefix))) ||
            (f->state && strcmp(state_name(b->state), f->state)))
            continue;
        s->buffers[n++] = *b;
    }
    s->n_buffers = n;
    n = 0;
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        if ((f->pid >= 0 && c->pid != f->pid) || (f->uid >= 0 && (long)c->uid != f->uid))
            continue;
        s->clients[n++] = *c;
    }
    s->n_clients = n;
}

static void usage(FILE *f) {
    fprintf(f, "Usage: gpubufctl [OPTIONS] [COMMAND]\n\n"
               "Commands:\n"
               "  status    pools, buffers and clients (the default)\n"
               "  pools     pools only\n"
               "  buffers   buffers only\n"
               "  clients   connected clients only\n"
               "  metrics   Prometheus text format (for node-exporter's textfile collector)\n\n"
               "Options:\n"
               "  -s, --socket PATH   daemon socket (default $GPUBUF_SOCKET or %s)\n"
               "  -j, --json          one line of JSON\n"
               "      --pretty        indented JSON\n"
               "  -w, --watch[=SEC]   refresh every SEC seconds (default 2) until interrupted\n"
               "      --pool NAME     only this pool and its buffers\n"
               "      --name PREFIX   only buffers whose name starts with PREFIX\n"
               "      --state STATE   only buffers in STATE (allocated, sealed, deleted)\n"
               "      --pid PID       only this client process\n"
               "      --uid UID       only clients of this user\n\n"
               "Exit status: 0 ok, 2 usage, 3 daemon unreachable, 4 request failed.\n",
            GPUBUF_DEFAULT_SOCKET);
}

static int show(gpubuf_client *c, const char *cmd, const filters *f, bool json, bool pretty) {
    gpubuf_status *s;
    int r = gpubuf_status_get(c, &s);
    if (r < 0) {
        fprintf(stderr, "gpubufctl: status: %s\n", gpubuf_strerror(r));
        return EXIT_REQUEST;
    }
    apply_filters(s, f);
    bool all = strcmp(cmd, "status") == 0;
    if (!strcmp(cmd, "metrics")) {
        print_metrics(s);
    } else if (json) {
        print_json(s, cmd, pretty);
    } else {
        if (all)
            printf("gpubufd %s, up %llu s\n\n", s->version,
                   (unsigned long long)(s->uptime_ms / 1000));
        if (all || !strcmp(cmd, "pools"))
            print_pools(s);
        if (all)
            putchar('\n');
        if (all || !strcmp(cmd, "buffers"))
            print_buffers(s);
        if (all)
            putchar('\n');
        if (all || !strcmp(cmd, "clients"))
            print_clients(s);
    }
    fflush(stdout);
    gpubuf_status_free(s);
    return 0;
}

static long parse_long(const char *s, const char *what) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < 0) {
        fprintf(stderr, "gpubufctl: bad %s '%s'\n", what, s);
        exit(EXIT_USAGE);
    }
    return v;
}

int main(int argc, char **argv) {
    enum { OPT_PRETTY = 256, OPT_POOL, OPT_NAME, OPT_STATE, OPT_PID, OPT_UID };
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"pretty", no_argument, NULL, OPT_PRETTY},
                                         {"watch", optional_argument, NULL, 'w'},
                                         {"pool", required_argument, NULL, OPT_POOL},
                                         {"name", required_argument, NULL, OPT_NAME},
                                         {"state", required_argument, NULL, OPT_STATE},
                                         {"pid", required_argument, NULL, OPT_PID},
                                         {"uid", required_argument, NULL, OPT_UID},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *sock = NULL, *cmd = "status";
    bool json = false, pretty = false;
    double watch = 0;
    filters f = {NULL, NULL, NULL, -1, -1};
    int opt, r;
    gpubuf_client *c;
    while ((opt = getopt_long(argc, argv, "s:jw::h", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'j': json = true; break;
        case OPT_PRETTY: json = pretty = true; break;
        case 'w':
            watch = optarg ? strtod(optarg, NULL) : 2.0;
            if (watch <= 0) {
                fprintf(stderr, "gpubufctl: bad --watch interval\n");
                return EXIT_USAGE;
            }
            break;
        case OPT_POOL: f.pool = optarg; break;
        case OPT_NAME: f.name_prefix = optarg; break;
        case OPT_STATE:
            if (strcmp(optarg, "allocated") && strcmp(optarg, "sealed") &&
                strcmp(optarg, "deleted")) {
                fprintf(stderr, "gpubufctl: bad state '%s'\n", optarg);
                return EXIT_USAGE;
            }
            f.state = optarg;
            break;
        case OPT_PID: f.pid = parse_long(optarg, "pid"); break;
        case OPT_UID: f.uid = parse_long(optarg, "uid"); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc)
        cmd = argv[optind++];
    if (optind < argc || (strcmp(cmd, "status") && strcmp(cmd, "pools") &&
                          strcmp(cmd, "buffers") && strcmp(cmd, "clients") &&
                          strcmp(cmd, "metrics"))) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if ((r = gpubuf_connect(sock, &c)) < 0) {
        fprintf(stderr, "gpubufctl: %s\n", gpubuf_last_error_message()[0]
                                               ? gpubuf_last_error_message()
                                               : gpubuf_strerror(r));
        return EXIT_NO_DAEMON;
    }
    for (;;) {
        /* A table refreshes in place; JSON and metrics append one snapshot
         * after the other. */
        if (watch > 0 && !json && strcmp(cmd, "metrics"))
            fputs("\033[H\033[2J", stdout);
        r = show(c, cmd, &f, json, pretty);
        if (r != 0 || watch <= 0)
            break;
        struct timespec ts = {(time_t)watch, (long)((watch - (double)(time_t)watch) * 1e9)};
        nanosleep(&ts, NULL);
    }
    gpubuf_disconnect(c);
    return r;
}
