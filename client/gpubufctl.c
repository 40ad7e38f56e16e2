/* gpubufctl: look at a running gpubufd. */
#include <errno.h>
#include <getopt.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    return k == GPUBUF_POOL_HOST ? "host" : k == GPUBUF_POOL_CUDA_IPC ? "cuda-ipc" : "unknown";
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

/* A JSON string, escaped by json-c. */
static void put_json_string(const char *str) {
    json_object *o = json_object_new_string(str);
    fputs(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE),
          stdout);
    json_object_put(o);
}

/* Buffers can number 100k: their numbers are printed directly and only the
 * two strings go through json-c (for escaping), one small object each
 * instead of an object with ten members. */
static void put_buffer_json(const gpubuf_status_buffer *b) {
    printf("{\"id\":%llu,\"name\":", (unsigned long long)b->id);
    put_json_string(b->name);
    printf(",\"pool\":");
    put_json_string(b->pool);
    printf(",\"size\":%llu,\"state\":\"%s\",\"refs\":%u,\"owner_uid\":%u,\"slab\":%llu,"
           "\"offset\":%llu}",
           (unsigned long long)b->size, state_name(b->state), b->refs, b->owner_uid,
           (unsigned long long)b->slab_id, (unsigned long long)b->offset);
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
    printf("%-8s %-8s %-6s %-16s %10s %8s\n", "SESSION", "PID", "UID", "NAME", "REFERENCES",
           "BUFFERS");
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        printf("%-8llu %-8d %-6u %-16s %10u %8u\n", (unsigned long long)c->session_id, c->pid,
               c->uid, c->name, c->references, c->buffers_held);
    }
}

static void usage(FILE *f) {
    fprintf(f, "Usage: gpubufctl [--socket PATH] [--json | --pretty] COMMAND\n\n"
               "Commands:\n"
               "  status    pools, buffers and clients\n"
               "  pools     pools only\n"
               "  buffers   buffers only\n"
               "  clients   connected clients only\n\n"
               "--json writes one line of JSON; --pretty indents it.\n"
               "Exit status: 0 ok, 2 usage, 3 daemon unreachable, 4 request failed.\n");
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"pretty", no_argument, NULL, 'P'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *sock = NULL, *cmd = "status";
    bool json = false, pretty = false;
    int opt, r;
    gpubuf_client *c;
    gpubuf_status *s;
    while ((opt = getopt_long(argc, argv, "s:jh", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'j': json = true; break;
        case 'P': json = pretty = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    if (optind < argc)
        cmd = argv[optind++];
    if (optind < argc || (strcmp(cmd, "status") && strcmp(cmd, "pools") &&
                          strcmp(cmd, "buffers") && strcmp(cmd, "clients"))) {
        usage(stderr);
        return EXIT_USAGE;
    }
    if ((r = gpubuf_connect(sock, &c)) < 0) {
        fprintf(stderr, "gpubufctl: %s\n", gpubuf_last_error_message()[0]
                                               ? gpubuf_last_error_message()
                                               : gpubuf_strerror(r));
        return EXIT_NO_DAEMON;
    }
    r = gpubuf_status_get(c, &s);
    gpubuf_disconnect(c);
    if (r < 0) {
        fprintf(stderr, "gpubufctl: status: %s\n", gpubuf_strerror(r));
        return EXIT_REQUEST;
    }
    bool all = strcmp(cmd, "status") == 0;
    if (json) {
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
    gpubuf_status_free(s);
    return 0;
}
