/* gpubufd: the daemon's entry point: options, configuration, pools, signals. */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <ini.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#ifdef GPUBUF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "backend.h"
#include "log.h"
#include "pool.h"
#include "server.h"
#include "util.h"
#include "wire.h"

#define DEFAULT_SLAB (64ull << 20)
#define DEFAULT_HOST_CAPACITY (4ull << 30)

typedef struct pool_spec {
    char name[GPUBUF_NAME_MAX + 1];
    gpubuf_pool_kind kind;
    int device;
    uint64_t capacity; /* 0: default */
    uint64_t slab_size;
    uint32_t allow_uids[32], allow_gids[32];
    int n_allow_uids, n_allow_gids;
} pool_spec;

typedef struct config {
    char socket_path[PATH_MAX];
    char socket_group[64];
    mode_t socket_mode;
    gpubuf_limits limits;
    pool_spec pools[GPUBUF_MAX_POOLS];
    int n_pools;
    int log_level;
    const char *file; /* for error messages */
} config;

/* "1000, alice" -> ids; names through getpwnam/getgrnam. */
static int parse_ids(const char *val, bool groups, uint32_t *out, int *n, char *err,
                     size_t errlen) {
    char buf[1024], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", val);
    *n = 0;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        char *end;
        unsigned long v = strtoul(tok, &end, 10);
        if (*end) {
            if (groups) {
                struct group *g = getgrnam(tok);
                if (!g)
                    goto bad;
                v = g->gr_gid;
            } else {
                struct passwd *pw = getpwnam(tok);
                if (!pw)
                    goto bad;
                v = pw->pw_uid;
            }
        }
        if (*n >= 32) {
            snprintf(err, errlen, "more than 32 entries in an allow list");
            return -EINVAL;
        }
        out[(*n)++] = (uint32_t)v;
        continue;
    bad:
        snprintf(err, errlen, "unknown %s '%s'", groups ? "group" : "user", tok);
        return -EINVAL;
    }
    return 0;
}

static int spec_set(pool_spec *p, const char *key, const char *val, char *err, size_t errlen) {
    if (strcmp(key, "allow_uids") == 0 || strcmp(key, "allow_users") == 0)
        return parse_ids(val, false, p->allow_uids, &p->n_allow_uids, err, errlen);
    if (strcmp(key, "allow_gids") == 0 || strcmp(key, "allow_groups") == 0)
        return parse_ids(val, true, p->allow_gids, &p->n_allow_gids, err, errlen);
    if (strcmp(key, "kind") == 0) {
        if (gpubuf_pool_kind_parse(val, &p->kind) < 0) {
            snprintf(err, errlen, "unknown pool kind '%s' (host, cuda-ipc, cuda-vmm)", val);
            return -EINVAL;
        }
    } else if (strcmp(key, "device") == 0) {
        char *end;
        long d = strtol(val, &end, 10);
        if (*end || d < 0 || d > 1024) {
            snprintf(err, errlen, "bad device '%s'", val);
            return -EINVAL;
        }
        p->device = (int)d;
    } else if (strcmp(key, "capacity") == 0) {
        if (gpubuf_parse_size(val, &p->capacity) < 0 || p->capacity == 0) {
            snprintf(err, errlen, "bad capacity '%s' (e.g. 8G)", val);
            return -EINVAL;
        }
    } else if (strcmp(key, "slab_size") == 0 || strcmp(key, "slab") == 0) {
        if (gpubuf_parse_size(val, &p->slab_size) < 0 || p->slab_size == 0) {
            snprintf(err, errlen, "bad slab size '%s' (e.g. 64M)", val);
            return -EINVAL;
        }
    } else {
        snprintf(err, errlen, "unknown pool key '%s'", key);
        return -EINVAL;
    }
    return 0;
}

static pool_spec *spec_new(config *c, const char *name, char *err, size_t errlen) {
    if (!gpubuf_name_valid(name, strlen(name))) {
        snprintf(err, errlen, "invalid pool name '%s'", name);
        return NULL;
    }
    for (int i = 0; i < c->n_pools; i++)
        if (strcmp(c->pools[i].name, name) == 0)
            return &c->pools[i];
    if (c->n_pools >= GPUBUF_MAX_POOLS) {
        snprintf(err, errlen, "more than %d pools", GPUBUF_MAX_POOLS);
        return NULL;
    }
    pool_spec *p = &c->pools[c->n_pools++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->kind = 0; /* must be given */
    return p;
}

static int parse_u64(const char *val, uint64_t *ret) {
    return gpubuf_parse_size(val, ret);
}

static int parse_u32(const char *val, uint32_t min, uint32_t max, uint32_t *ret) {
    uint64_t v;
    if (gpubuf_parse_size(val, &v) < 0 || v < min || v > max)
        return -EINVAL;
    *ret = (uint32_t)v;
    return 0;
}

static char ini_err[512];

static int conf_handler(void *user, const char *section, const char *key, const char *val) {
    config *c = user;
    char err[256] = "";
    if (strcmp(section, "daemon") == 0) {
        if (strcmp(key, "socket") == 0) {
            snprintf(c->socket_path, sizeof(c->socket_path), "%s", val);
        } else if (strcmp(key, "socket_mode") == 0) {
            char *end;
            long m = strtol(val, &end, 8);
            if (*end || m < 0 || m > 0777)
                snprintf(err, sizeof(err), "bad socket_mode '%s' (octal, e.g. 0660)", val);
            else
                c->socket_mode = (mode_t)m;
        } else if (strcmp(key, "log_level") == 0) {
            if ((c->log_level = gpubuf_log_parse_level(val)) < 0)
                snprintf(err, sizeof(err), "bad log_level '%s'", val);
        } else if (strcmp(key, "max_clients") == 0) {
            if (parse_u32(val, 1, 1u << 20, &c->limits.max_clients) < 0)
                snprintf(err, sizeof(err), "bad max_clients '%s'", val);
        } else if (strcmp(key, "socket_group") == 0) {
            if (!getgrnam(val))
                snprintf(err, sizeof(err), "unknown group '%s'", val);
            else
                snprintf(c->socket_group, sizeof(c->socket_group), "%s", val);
        } else if (strcmp(key, "max_clients_per_uid") == 0) {
            if (parse_u32(val, 0, 1u << 20, &c->limits.max_clients_per_uid) < 0)
                snprintf(err, sizeof(err), "bad max_clients_per_uid '%s'", val);
        } else if (strcmp(key, "handshake_timeout_ms") == 0) {
            if (parse_u32(val, 0, 3600000, &c->limits.handshake_timeout_ms) < 0)
                snprintf(err, sizeof(err), "bad handshake_timeout_ms '%s'", val);
        } else if (strcmp(key, "frame_timeout_ms") == 0) {
            if (parse_u32(val, 0, 3600000, &c->limits.frame_timeout_ms) < 0)
                snprintf(err, sizeof(err), "bad frame_timeout_ms '%s'", val);
        } else if (strcmp(key, "max_buffers_per_client") == 0) {
            if (parse_u32(val, 0, UINT32_MAX, &c->limits.quota.buffers_per_client) < 0)
                snprintf(err, sizeof(err), "bad max_buffers_per_client '%s'", val);
        } else if (strcmp(key, "max_buffers_per_uid") == 0) {
            if (parse_u32(val, 0, UINT32_MAX, &c->limits.quota.buffers_per_uid) < 0)
                snprintf(err, sizeof(err), "bad max_buffers_per_uid '%s'", val);
        } else if (strcmp(key, "max_refs_per_client") == 0) {
            if (parse_u32(val, 0, UINT32_MAX, &c->limits.quota.refs_per_client) < 0)
                snprintf(err, sizeof(err), "bad max_refs_per_client '%s'", val);
        } else if (strcmp(key, "max_kept_slabs_per_client") == 0) {
            if (parse_u32(val, 0, 4096, &c->limits.quota.kept_slabs_per_client) < 0)
                snprintf(err, sizeof(err), "bad max_kept_slabs_per_client '%s'", val);
        } else if (strcmp(key, "max_bytes_per_client") == 0) {
            if (parse_u64(val, &c->limits.quota.bytes_per_client) < 0)
                snprintf(err, sizeof(err), "bad max_bytes_per_client '%s'", val);
        } else if (strcmp(key, "max_bytes_per_uid") == 0) {
            if (parse_u64(val, &c->limits.quota.bytes_per_uid) < 0)
                snprintf(err, sizeof(err), "bad max_bytes_per_uid '%s'", val);
        } else if (strcmp(key, "max_request") == 0) {
            if (parse_u32(val, 256, GPUBUF_WIRE_MAX_REQUEST_HARD, &c->limits.max_request) < 0)
                snprintf(err, sizeof(err), "bad max_request '%s' (256..%u)", val,
                         GPUBUF_WIRE_MAX_REQUEST_HARD);
        } else {
            snprintf(err, sizeof(err), "unknown key '%s' in [daemon]", key);
        }
    } else if (strncmp(section, "pool:", 5) == 0) {
        pool_spec *p = spec_new(c, section + 5, err, sizeof(err));
        if (p)
            spec_set(p, key, val, err, sizeof(err));
    } else {
        snprintf(err, sizeof(err), "unknown section [%s]", section);
    }
    if (err[0]) {
        /* inih goes on parsing and reports the first failing line: keep
         * the message of that line. */
        if (!ini_err[0])
            snprintf(ini_err, sizeof(ini_err), "%s", err);
        return 0;
    }
    return 1;
}

static int load_config_file(config *c, const char *path) {
    ini_err[0] = '\0';
    int before = c->n_pools;
    int r = ini_parse(path, conf_handler, c);
    if (r < 0) {
        fprintf(stderr, "gpubufd: %s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    if (r > 0) {
        fprintf(stderr, "gpubufd: %s:%d: %s\n", path, r, ini_err[0] ? ini_err : "syntax error");
        return -1;
    }
    for (int i = before; i < c->n_pools; i++)
        if (c->pools[i].kind == 0) {
            fprintf(stderr, "gpubufd: %s: [pool:%s] has no kind (host, cuda-ipc or cuda-vmm)\n",
                    path, c->pools[i].name);
            return -1;
        }
    return 0;
}

/* --pool NAME=KIND[,device=N][,capacity=SIZE][,slab=SIZE] */
static int parse_pool_flag(config *c, const char *arg) {
    char buf[1024], err[256] = "";
    char *eq, *save = NULL, *tok;
    snprintf(buf, sizeof(buf), "%s", arg);
    eq = strchr(buf, '=');
    if (!eq) {
        fprintf(stderr, "gpubufd: --pool %s: expected NAME=KIND[,key=value...]\n", arg);
        return -1;
    }
    *eq = '\0';
    pool_spec *p = spec_new(c, buf, err, sizeof(err));
    if (!p)
        goto bad;
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%.255s", buf);
    tok = strtok_r(eq + 1, ",", &save);
    if (!tok || spec_set(p, "kind", tok, err, sizeof(err)) < 0)
        goto bad;
    while ((tok = strtok_r(NULL, ",", &save))) {
        char *kv = strchr(tok, '=');
        if (!kv) {
            snprintf(err, sizeof(err), "expected key=value, got '%s'", tok);
            goto bad;
        }
        *kv = '\0';
        if (spec_set(p, tok, kv + 1, err, sizeof(err)) < 0)
            goto bad;
    }
    return 0;
bad:
    fprintf(stderr, "gpubufd: --pool %s: %s\n", arg, err);
    return -1;
}

static int create_pools(gpubuf_server *srv, config *c) {
    char err[256] = "";
    if (c->n_pools == 0) {
        int n = gpubuf_backend_cuda_device_count(err, sizeof(err));
        if (n > 0) {
            for (int d = 0; d < n && c->n_pools < GPUBUF_MAX_POOLS; d++) {
                pool_spec *p = &c->pools[c->n_pools++];
                memset(p, 0, sizeof(*p));
                snprintf(p->name, sizeof(p->name), "gpu%d", d);
                p->kind = GPUBUF_POOL_CUDA_IPC;
                p->device = d;
            }
        } else {
            LOG_INFO("no CUDA device (%s); using one host pool", err[0] ? err : "none visible");
            pool_spec *p = &c->pools[c->n_pools++];
            memset(p, 0, sizeof(*p));
            snprintf(p->name, sizeof(p->name), "host");
            p->kind = GPUBUF_POOL_HOST;
        }
    }
    for (int i = 0; i < c->n_pools; i++) {
        pool_spec *ps = &c->pools[i];
        gpubuf_backend *be = NULL;
        gpubuf_pool *pool = NULL;
        int r;
        err[0] = '\0';
        if (ps->kind == GPUBUF_POOL_HOST)
            r = gpubuf_backend_host_new(&be, err, sizeof(err));
        else if (ps->kind == GPUBUF_POOL_CUDA_VMM)
            r = gpubuf_backend_cuda_vmm_new(ps->device, &be, err, sizeof(err));
        else
            r = gpubuf_backend_cuda_ipc_new(ps->device, &be, err, sizeof(err));
        if (r < 0) {
            LOG_ERR("pool '%s' (%s): %s", ps->name, gpubuf_pool_kind_name(ps->kind),
                    err[0] ? err : gpubuf_strerror(r));
            return -1;
        }
        uint64_t cap = ps->capacity;
        if (!cap)
            cap = be->device_total ? be->device_total / 10 * 9 : DEFAULT_HOST_CAPACITY;
        if (ps->slab_size > cap)
            LOG_WARN("pool '%s': slab size above the capacity; slabs of the capacity (rounded "
                     "down to the allocation granularity) instead",
                     ps->name);
        r = gpubuf_pool_new(ps->name, be, cap, ps->slab_size ? ps->slab_size : DEFAULT_SLAB,
                            &srv->slab_ids, &pool);
        if (r < 0) {
            LOG_ERR("pool '%s': %s", ps->name,
                    r == -EINVAL && cap < be->granularity
                        ? "capacity below the backend's allocation granularity"
                        : gpubuf_strerror(r));
            gpubuf_backend_free(be);
            return -1;
        }
        memcpy(pool->allow_uids, ps->allow_uids, sizeof(pool->allow_uids));
        memcpy(pool->allow_gids, ps->allow_gids, sizeof(pool->allow_gids));
        pool->n_allow_uids = ps->n_allow_uids;
        pool->n_allow_gids = ps->n_allow_gids;
        if (gpubuf_server_add_pool(srv, pool) < 0) {
            gpubuf_pool_free(pool);
            LOG_ERR("pool '%s' defined twice", ps->name);
            return -1;
        }
        char cs[32], ss[32], uu[41] = "";
        if (be->has_uuid)
            gpubuf_format_uuid(be->uuid, uu);
        LOG_INFO("pool '%s': %s on %s%s%s, capacity %s, slabs of %s", pool->name,
                 gpubuf_pool_kind_name(be->kind), be->device_name, uu[0] ? " " : "", uu,
                 gpubuf_format_size(pool->capacity, cs, sizeof(cs)),
                 gpubuf_format_size(pool->slab_size, ss, sizeof(ss)));
    }
    return 0;
}

static gpubuf_server g_srv;
static uv_signal_t g_sig[3];
static const char *g_config_file;
static int g_log_flag = -1;
#ifdef GPUBUF_HAVE_SYSTEMD
static uv_timer_t g_watchdog;
static bool g_watchdog_on;

static void on_watchdog(uv_timer_t *t) {
    (void)t;
    sd_notify(0, "WATCHDOG=1");
}
#endif

/* SIGHUP: read the configuration file again and apply what can change
 * without disturbing clients: the log level and the limits. Pools and the
 * socket stay as they are (a restart changes them). */
static void reload(void) {
    static config fresh;
    memset(&fresh, 0, sizeof(fresh));
    fresh.socket_mode = 0660;
    fresh.log_level = -1;
    gpubuf_limits_default(&fresh.limits);
    if (!g_config_file) {
        LOG_NOTICE("SIGHUP: no configuration file to reload");
        return;
    }
#ifdef GPUBUF_HAVE_SYSTEMD
    sd_notify(0, "RELOADING=1");
#endif
    if (load_config_file(&fresh, g_config_file) < 0) {
        LOG_ERR("SIGHUP: %s has errors; keeping the running configuration", g_config_file);
    } else {
        if (g_log_flag < 0)
            gpubuf_log_level = fresh.log_level >= 0 ? fresh.log_level : GPUBUF_LOG_INFO;
        g_srv.limits = fresh.limits;
        g_srv.reg.quota = fresh.limits.quota;
        bool pools_differ = fresh.n_pools != g_srv.n_pools;
        for (int i = 0; !pools_differ && i < fresh.n_pools; i++)
            pools_differ = !gpubuf_server_find_pool(&g_srv, fresh.pools[i].name);
        LOG_NOTICE("SIGHUP: reloaded %s (log level, limits)%s", g_config_file,
                   pools_differ ? "; pool changes take effect at the next start" : "");
    }
#ifdef GPUBUF_HAVE_SYSTEMD
    sd_notifyf(0, "READY=1\nSTATUS=serving %d pool(s)", g_srv.n_pools);
#endif
}

static void on_signal(uv_signal_t *h, int signum) {
    if (signum == SIGHUP) {
        reload();
        return;
    }
    LOG_NOTICE("signal %d: shutting down (%u clients connected)", signum, g_srv.n_sessions);
#ifdef GPUBUF_HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    gpubuf_server_stop(&g_srv);
#ifdef GPUBUF_HAVE_SYSTEMD
    if (g_watchdog_on)
        uv_close((uv_handle_t *)&g_watchdog, NULL);
#endif
    (void)h;
    for (int i = 0; i < 3; i++)
        if (!uv_is_closing((uv_handle_t *)&g_sig[i]))
            uv_close((uv_handle_t *)&g_sig[i], NULL);
}

static void usage(FILE *f) {
    fprintf(f,
            "Usage: gpubufd [OPTIONS]\n"
            "Share GPU and host memory between processes.\n\n"
            "  -s, --socket PATH      listen on PATH (default $GPUBUF_SOCKET or %s)\n"
            "  -c, --config FILE      read configuration from FILE (gpubuf.conf(5))\n"
            "  -p, --pool SPEC        add a pool: NAME=KIND[,device=N][,capacity=SIZE][,slab=SIZE]\n"
            "                         KIND is host or cuda-ipc; may be repeated\n"
            "  -l, --log-level LEVEL  err, warning, notice, info (default) or debug\n"
            "      --check-config     parse the configuration and exit\n"
            "  -V, --version          print the version and exit\n"
            "  -h, --help             show this help\n\n"
            "Without pools: one cuda-ipc pool per visible GPU, else one host pool.\n",
            GPUBUF_DEFAULT_SOCKET);
}

static int ensure_dir_of(const char *path) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = '\0';
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int main(int argc, char **argv) {
    static config cfg;
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},   {"config", required_argument, NULL, 'c'},
        {"pool", required_argument, NULL, 'p'},     {"log-level", required_argument, NULL, 'l'},
        {"check-config", no_argument, NULL, 'C'},   {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},           {NULL, 0, NULL, 0}};
    const char *socket_flag = NULL, *config_file = NULL;
    const char *pool_flags[GPUBUF_MAX_POOLS];
    int n_pool_flags = 0;
    bool check_only = false;
    int opt, rc = 1, log_flag = -1;
    uv_loop_t *loop = uv_default_loop();

    gpubuf_log_init();
    memset(&cfg, 0, sizeof(cfg));
    cfg.socket_mode = 0660;
    cfg.log_level = -1;
    gpubuf_limits_default(&cfg.limits);
    while ((opt = getopt_long(argc, argv, "s:c:p:l:Vh", opts, NULL)) != -1) {
        switch (opt) {
        case 's': socket_flag = optarg; break;
        case 'c': config_file = g_config_file = optarg; break;
        case 'p':
            if (n_pool_flags >= GPUBUF_MAX_POOLS) {
                fprintf(stderr, "gpubufd: more than %d --pool flags\n", GPUBUF_MAX_POOLS);
                return 2;
            }
            pool_flags[n_pool_flags++] = optarg;
            break;
        case 'l':
            if ((log_flag = g_log_flag = gpubuf_log_parse_level(optarg)) < 0) {
                fprintf(stderr, "gpubufd: bad log level '%s'\n", optarg);
                return 2;
            }
            break;
        case 'C': check_only = true; break;
        case 'V': printf("gpubufd %s (protocol %d)\n", GPUBUF_VERSION_STRING,
                         GPUBUF_PROTOCOL_VERSION);
            return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "gpubufd: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (config_file && load_config_file(&cfg, config_file) < 0)
        return 2;
    /* Flags win over the file: a --pool of a name the file defines
     * replaces the file's settings for it. */
    for (int i = 0; i < n_pool_flags; i++)
        if (parse_pool_flag(&cfg, pool_flags[i]) < 0)
            return 2;
    if (check_only) {
        printf("configuration OK: %d pool(s) defined\n", cfg.n_pools);
        return 0;
    }
    if (log_flag >= 0)
        gpubuf_log_level = log_flag;
    else if (cfg.log_level >= 0)
        gpubuf_log_level = cfg.log_level;
    if (socket_flag)
        snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s", socket_flag);
    else if (!cfg.socket_path[0])
        snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s",
                 getenv("GPUBUF_SOCKET") && *getenv("GPUBUF_SOCKET") ? getenv("GPUBUF_SOCKET")
                                                                    : GPUBUF_DEFAULT_SOCKET);

    signal(SIGPIPE, SIG_IGN);
    gpubuf_server_init(&g_srv, loop);
    g_srv.limits = cfg.limits;
    g_srv.reg.quota = cfg.limits.quota;
    if (create_pools(&g_srv, &cfg) < 0)
        goto out;

    int listen_fd = -1;
#ifdef GPUBUF_HAVE_SYSTEMD
    int n = sd_listen_fds(1);
    if (n > 1) {
        LOG_ERR("expected one socket from systemd, got %d", n);
        goto out;
    }
    if (n == 1)
        listen_fd = SD_LISTEN_FDS_START;
#endif
    int r;
    if (listen_fd >= 0) {
        r = gpubuf_server_listen_fd(&g_srv, listen_fd);
        LOG_INFO("listening on the socket passed by systemd");
    } else {
        if ((r = ensure_dir_of(cfg.socket_path)) < 0)
            LOG_WARN("cannot create the directory of %s: %s", cfg.socket_path, strerror(-r));
        r = gpubuf_server_listen_path(&g_srv, cfg.socket_path, cfg.socket_mode);
        if (r == 0 && cfg.socket_group[0]) {
            struct group *g = getgrnam(cfg.socket_group);
            if (!g || chown(cfg.socket_path, (uid_t)-1, g->gr_gid) < 0) {
                LOG_ERR("cannot give %s to group %s: %s", cfg.socket_path, cfg.socket_group,
                        g ? strerror(errno) : "no such group");
                goto out;
            }
        }
        if (r == 0)
            LOG_INFO("listening on %s", cfg.socket_path);
    }
    if (r < 0) {
        LOG_ERR("cannot listen on %s: %s", cfg.socket_path,
                r == -EADDRINUSE ? "another gpubufd is running there"
                : r == -EEXIST   ? "a file that is not a socket is in the way"
                                 : strerror(-r));
        goto out;
    }
    static const int signums[3] = {SIGTERM, SIGINT, SIGHUP};
    for (int i = 0; i < 3; i++) {
        uv_signal_init(loop, &g_sig[i]);
        uv_signal_start(&g_sig[i], on_signal, signums[i]);
    }
#ifdef GPUBUF_HAVE_SYSTEMD
    uint64_t wd_usec = 0;
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
        /* Ping at half the interval systemd expects. */
        uv_timer_init(loop, &g_watchdog);
        uv_timer_start(&g_watchdog, on_watchdog, 0, wd_usec / 2000 ? wd_usec / 2000 : 1);
        g_watchdog_on = true;
        LOG_INFO("watchdog: pinging every %llu ms", (unsigned long long)(wd_usec / 2000));
    }
    sd_notifyf(0, "READY=1\nSTATUS=serving %d pool(s)", g_srv.n_pools);
#endif
    /* Runs until SIGTERM/SIGINT closed every handle. */
    uv_run(loop, UV_RUN_DEFAULT);
    LOG_INFO("stopped");
    rc = 0;
out:
    gpubuf_server_destroy(&g_srv);
    if (rc != 0) {
        if (!uv_is_closing((uv_handle_t *)&g_srv.reaper))
            uv_close((uv_handle_t *)&g_srv.reaper, NULL);
        if (!uv_is_closing((uv_handle_t *)&g_srv.kick))
            uv_close((uv_handle_t *)&g_srv.kick, NULL);
        uv_run(loop, UV_RUN_DEFAULT);
    }
    uv_loop_close(loop);
    return rc;
}
