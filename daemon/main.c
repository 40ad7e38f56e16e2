/* gpubufd: the daemon's entry point: options, configuration, pools, signals. */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#ifdef GPUBUF_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

#include "backend.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "trace.h"
#include "pool.h"
#include "state.h"
#include "takeover.h"
#include "util.h"

#define DEFAULT_SLAB (64ull << 20)
#define DEFAULT_HOST_CAPACITY (4ull << 30)

/* Without pools: one cuda-ipc pool per visible GPU, else one host pool. */
static void default_pools(gd_config *c) {
    gd_err err = {0};
    int n = gd_backend_cuda_device_count(&err);
    if (n > 0) {
        for (int d = 0; d < n && c->n_pools < GD_CONFIG_MAX_POOLS; d++) {
            gd_pool_spec *p = &c->pools[c->n_pools++];
            memset(p, 0, sizeof(*p));
            snprintf(p->name, sizeof(p->name), "gpu%d", d);
            p->kind = GPUBUF_POOL_CUDA_IPC;
            p->device = (uint32_t)d;
        }
        return;
    }
    LOG_INFO("no CUDA device (%s); using one host pool", err.msg[0] ? err.msg : "none visible");
    gd_pool_spec *p = &c->pools[c->n_pools++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "host");
    p->kind = GPUBUF_POOL_HOST;
}

static int create_pool(gd_context *ctx, const gd_pool_spec *ps, gd_err *err) {
    gd_backend *be = NULL;
    gd_pool *pool = NULL;
    int r;
    if (ps->kind == GPUBUF_POOL_HOST)
        r = gd_backend_host_new(&be, err);
    else
        r = ps->kind == GPUBUF_POOL_CUDA_VMM ? gd_backend_cuda_vmm_new((int)ps->device, &be, err)
                                              : gd_backend_cuda_ipc_new((int)ps->device, &be, err);
    if (r < 0)
        return r;
    uint64_t cap = ps->capacity;
    if (!cap)
        cap = be->device_total ? be->device_total / 10 * 9 : DEFAULT_HOST_CAPACITY;
    if (ps->slab_size > cap)
        LOG_WARN("pool '%s': slab size above the capacity; slabs of the capacity (rounded "
                 "down to the allocation granularity) instead",
                 ps->name);
    r = gd_pool_new(ps->name, be, cap, ps->slab_size ? ps->slab_size : DEFAULT_SLAB,
                    &ctx->slab_ids, &pool, err);
    if (r < 0) {
        gd_backend_free(be);
        return r;
    }
    memcpy(pool->allow_uids, ps->allow_uids, sizeof(pool->allow_uids));
    memcpy(pool->allow_gids, ps->allow_gids, sizeof(pool->allow_gids));
    pool->n_allow_uids = ps->n_allow_uids;
    pool->n_allow_gids = ps->n_allow_gids;
    memcpy(pool->publish_uids, ps->publish_uids, sizeof(pool->publish_uids));
    memcpy(pool->publish_gids, ps->publish_gids, sizeof(pool->publish_gids));
    pool->n_publish_uids = ps->n_publish_uids;
    pool->n_publish_gids = ps->n_publish_gids;
    if ((r = gd_context_add_pool(ctx, pool)) < 0) {
        gd_pool_free(pool);
        return gd_err_set(err, r, "defined twice");
    }
    char cs[32], ss[32], uu[41] = "";
    if (be->has_uuid)
        gpubuf_format_uuid(be->uuid, uu);
    LOG_INFO("pool '%s': %s on %s%s%s, capacity %s, slabs of %s", pool->name,
             gpubuf_pool_kind_name(be->kind), be->device_name, uu[0] ? " " : "", uu,
             gpubuf_format_size(pool->capacity, cs, sizeof(cs)),
             gpubuf_format_size(pool->slab_size, ss, sizeof(ss)));
    return 0;
}

static int create_pools(gd_context *ctx, gd_config *c) {
    if (c->n_pools == 0)
        default_pools(c);
    for (int i = 0; i < c->n_pools; i++) {
        gd_err err = {0};
        int r = create_pool(ctx, &c->pools[i], &err);
        if (r < 0) {
            LOG_ERR("pool '%s' (%s): %s", c->pools[i].name, gpubuf_pool_kind_name(c->pools[i].kind),
                    gd_err_msg(&err, r));
            return r;
        }
    }
    return 0;
}

/* The fds a pool makes the daemon hold at most (see GD_FD_RESERVE_BASE). */
static uint64_t pool_fds(gpubuf_pool_kind kind, uint64_t capacity, uint64_t slab) {
    if (kind == GPUBUF_POOL_CUDA_IPC)
        return GD_FD_RESERVE_PER_CUDA;
    if (kind == GPUBUF_POOL_HOST && !capacity)
        capacity = DEFAULT_HOST_CAPACITY;
    slab = slab ? slab : DEFAULT_SLAB;
    uint64_t slabs = capacity / slab + (capacity % slab != 0);
    return kind == GPUBUF_POOL_HOST ? 2 * slabs : GD_FD_RESERVE_PER_CUDA + slabs;
}

/* The daemon's own fds: the created pools' when there are, else the
 * configured ones' (for --check-config; without pools, the default host pool,
 * and a cuda-vmm pool of unknown capacity counts its driver fds only). */
static uint64_t fd_reserve(const gd_context *ctx, const gd_config *c) {
    uint64_t r = GD_FD_RESERVE_BASE;
    if (ctx && ctx->n_pools) {
        for (int i = 0; i < ctx->n_pools; i++)
            r += pool_fds(ctx->pools[i]->be->kind, ctx->pools[i]->capacity,
                          ctx->pools[i]->slab_size);
        return r;
    }
    if (c->n_pools == 0)
        return r + pool_fds(GPUBUF_POOL_HOST, 0, 0);
    for (int i = 0; i < c->n_pools; i++)
        r += pool_fds(c->pools[i].kind, c->pools[i].capacity, c->pools[i].slab_size);
    return r;
}

/* Raise the soft fd limit to the hard one (a systemd service starts at a
 * soft 1024 whatever LimitNOFILE= allows). Returns the limit in force and
 * the soft limit found in *before. */
static uint64_t raise_nofile(uint64_t *before) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0) {
        *before = 1024;
        return 1024;
    }
    *before = rl.rlim_cur;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit up = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            rl.rlim_cur = rl.rlim_max;
        else
            LOG_WARN("cannot raise the fd limit from %llu to %llu: %s",
                     (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
                     strerror(errno));
    }
    return rl.rlim_cur;
}

static uint64_t g_nofile, g_fd_reserved; /* the budget found at start */

/* Fit the limits into the fd budget: a warning when a limit the user set
 * was lowered, an info line when only defaults were. -EMFILE when not even
 * one client fits. */
static int fit_fds(gd_limits *l, unsigned set, gd_err *err) {
    char msg[640];
    int r = gd_limits_fit_fds(l, g_nofile, g_fd_reserved, set, msg, sizeof(msg), err);
    if (r == GD_FIT_LOWERED_SET)
        LOG_WARN("%s", msg);
    else if (r == GD_FIT_LOWERED_DEFAULTS)
        LOG_INFO("%s", msg);
    return r < 0 ? r : 0;
}

static void log_fd_budget(const gd_limits *l, uint64_t before) {
    char raised[64] = "";
    if (before != g_nofile)
        snprintf(raised, sizeof(raised), ", raised from %llu", (unsigned long long)before);
    LOG_INFO("fd budget: RLIMIT_NOFILE %llu%s; %llu reserved, %d per client (its socket and up "
             "to %d queued reply fds): room for %llu clients; max_clients %u, "
             "max_clients_per_uid %u",
             (unsigned long long)g_nofile, raised, (unsigned long long)g_fd_reserved,
             GD_FDS_PER_CLIENT, GD_FDS_PER_CLIENT - 1,
             (unsigned long long)((g_nofile - g_fd_reserved) / GD_FDS_PER_CLIENT), l->max_clients,
             l->max_clients_per_uid);
}

static gd_daemon g_d;
static uv_signal_t g_sig[4]; /* SIGTERM, SIGINT, SIGHUP, SIGUSR2 */
static const char *g_config_file;
static const char *g_log_flag; /* --log-level wins over the file, also at SIGHUP */
#ifdef GPUBUF_HAVE_SYSTEMD
static uv_timer_t g_watchdog;
static bool g_watchdog_on;

static void on_watchdog(uv_timer_t *t) {
    (void)t;
    sd_notify(0, "WATCHDOG=1");
}
#endif

/* The file given with --config, then the flags (which win over it): the
 * same steps at start-up, for --check-config and at SIGHUP (without pools
 * and socket flags there). */
static int read_config(gd_config *c, const char *socket_flag, const char *const *pool_flags,
                       int n_pool_flags, gd_err *err) {
    int r;
    gd_config_init(c);
    if (g_config_file && (r = gd_config_load(c, g_config_file, err)) < 0)
        return r;
    /* A --pool of a name the file defines replaces the file's settings for it. */
    for (int i = 0; i < n_pool_flags; i++)
        if ((r = gd_config_pool_flag(c, pool_flags[i], err)) < 0)
            return r;
    if (g_log_flag && (r = gd_config_set(c, "log_level", g_log_flag, err)) < 0)
        return r;
    if (socket_flag && !*socket_flag)
        return gd_err_set(err, -EINVAL,
                          "--socket '': an empty socket path; name the socket to listen on "
                          "(--socket PATH), or leave --socket out for $GPUBUF_SOCKET or %s",
                          GPUBUF_DEFAULT_SOCKET);
    if (socket_flag && (r = gd_config_set(c, "socket", socket_flag, err)) < 0)
        return r;
    if (!c->socket_path[0]) {
        const char *env = getenv("GPUBUF_SOCKET");
        if ((r = gd_config_set(c, "socket", env && *env ? env : GPUBUF_DEFAULT_SOCKET, err)) < 0)
            return r;
    }
    return gd_config_check(c, err);
}

/* SIGHUP: read the configuration file again and apply what can change
 * without disturbing clients: the log level and the limits. Pools and the
 * socket stay as they are (a restart changes them). */
static void reload(void) {
    static gd_config fresh;
    gd_err err = {0};
    if (!g_config_file) {
        LOG_NOTICE("SIGHUP: no configuration file to reload");
        return;
    }
#ifdef GPUBUF_HAVE_SYSTEMD
    sd_notify(0, "RELOADING=1");
#endif
    if (read_config(&fresh, NULL, NULL, 0, &err) < 0 ||
        fit_fds(&fresh.limits, fresh.set, &err) < 0) {
        LOG_ERR("SIGHUP: %s has errors (%s); keeping the running configuration", g_config_file,
                err.msg);
    } else {
        gd_log_level = fresh.log_level >= 0 ? fresh.log_level : GPUBUF_LOG_INFO;
        g_d.ctx.limits = fresh.limits;
        g_d.ctx.reg.quota = fresh.quota;
        bool pools_differ = fresh.n_pools != g_d.ctx.n_pools;
        for (int i = 0; !pools_differ && i < fresh.n_pools; i++)
            pools_differ = !gd_context_find_pool(&g_d.ctx, fresh.pools[i].name);
        LOG_NOTICE("SIGHUP: reloaded %s (log level, limits)%s", g_config_file,
                   pools_differ ? "; pool changes take effect at the next start" : "");
    }
#ifdef GPUBUF_HAVE_SYSTEMD
    sd_notifyf(0, "READY=1\nSTATUS=serving %d pool(s)", g_d.ctx.n_pools);
#endif
}

static bool g_listen_stored; /* our listening socket is in the fd store */
static void shutdown_daemon(void);

/* The journal's counts when it last went on (state_journal = switchable),
 * and when: a SIGUSR2 that turns it off logs what it did since (the
 * benchmark's journal pairs read it, bench/pairs.c). */
static gd_state_stats g_on_since;
static uint64_t g_on_since_ns;

static void journal_went_on(void) {
    gd_state_stats_get(g_d.ctx.state, &g_on_since);
    g_on_since_ns = gpubuf_now_ns();
}

/* SIGUSR2 turned the journal off: what it did while on. */
static void journal_went_off(void) {
    gd_state_stats now, *a = &g_on_since;
    gd_state_stats_get(g_d.ctx.state, &now);
    LOG_WARN("SIGUSR2: the journal is off: a restart loses the changes from now on; while it was "
             "on (%.3f s): %llu groups, %llu bytes; %llu of %u bytes or more, %llu bytes, in "
             "%llu ns; %llu snapshot(s) in %llu ns",
             (double)(gpubuf_now_ns() - g_on_since_ns) / 1e9,
             (unsigned long long)(now.groups - a->groups),
             (unsigned long long)(now.bytes - a->bytes),
             (unsigned long long)(now.big_groups - a->big_groups), GD_STATE_BIG_GROUP,
             (unsigned long long)(now.big_bytes - a->big_bytes),
             (unsigned long long)(now.big_ns - a->big_ns),
             (unsigned long long)(now.snapshots - a->snapshots),
             (unsigned long long)(now.snapshot_ns - a->snapshot_ns));
}

static void on_signal(uv_signal_t *h, int signum) {
    (void)h;
    if (signum == SIGHUP) {
        reload();
        return;
    }
    if (signum == SIGUSR2) {
        int r = gd_state_switch(g_d.ctx.state);
        if (r == -EPERM)
            LOG_WARN("SIGUSR2 ignored: it switches the journal only with state_journal = "
                     "switchable (a key for measurement only)");
        else if (r < 0 && r != -EIO)
            LOG_WARN("SIGUSR2 ignored: no journal to switch");
        else if (r < 0)
            LOG_ERR("SIGUSR2: the journal stays off: its snapshot could not be written");
        else {
            if (r) {
                journal_went_on();
                LOG_WARN("SIGUSR2: the journal is on again, after a whole snapshot");
            } else {
                journal_went_off();
            }
#ifdef GPUBUF_HAVE_SYSTEMD
            sd_notifyf(0, "STATUS=serving %d pool(s), journal %s (state_journal = switchable)",
                       g_d.ctx.n_pools, r ? "on" : "off");
#endif
        }
        return;
    }
    LOG_NOTICE("signal %d: shutting down (%u clients connected)", signum, g_d.ctx.n_sessions);
    shutdown_daemon();
}

/* Stop serving: what the sessions' ends and the teardown free is not a
 * change of the kept state (the successor, or the next start, restores it). */
static void shutdown_daemon(void) {
    gd_state_freeze(g_d.ctx.state);
    if (g_listen_stored)
        g_d.srv.listen_owned = false; /* the fd store keeps it for the next start */
#ifdef GPUBUF_HAVE_SYSTEMD
    sd_notify(0, "STOPPING=1");
#endif
    gd_daemon_stop(&g_d);
#ifdef GPUBUF_HAVE_SYSTEMD
    if (g_watchdog_on)
        uv_close((uv_handle_t *)&g_watchdog, NULL);
#endif
    for (int i = 0; i < 4; i++)
        if (!uv_is_closing((uv_handle_t *)&g_sig[i]))
            uv_close((uv_handle_t *)&g_sig[i], NULL);
}

/* ---- restart: the fds a previous daemon kept ---------------------------- */

#define KEPT_MAX 65536 /* fds taken at start, at most */

static gd_kept_fd *g_kept;
static size_t g_n_kept;
static int g_listen_fd = -1;         /* passed to us: systemd's socket, or a kept one */
static const char *g_listen_from;

/* Sort what a previous daemon or systemd passed: the listening socket, and
 * the named fds the state room takes. */
static int kept_add(const char *name, int fd) {
    struct stat sb;
    int type = 0, acc = 0;
    socklen_t len = sizeof(type);
    if (fstat(fd, &sb) == 0 && S_ISSOCK(sb.st_mode) &&
        getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM &&
        (len = sizeof(acc), getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len)) == 0 && acc) {
        if (g_listen_fd >= 0) {
            LOG_ERR("more than one listening socket passed (%s)", name);
            close(fd);
            return -EINVAL;
        }
        g_listen_fd = fd;
        g_listen_stored = strcmp(name, "listen") == 0;
        return 0;
    }
    if (strncmp(name, "slab-", 5) != 0 && strncmp(name, "state-", 6) != 0) {
        LOG_WARN("ignoring passed fd %d named '%s'", fd, name);
        close(fd);
        return 0;
    }
    if (g_n_kept == KEPT_MAX) {
        LOG_WARN("more than %d fds passed: dropped %s", KEPT_MAX, name);
        close(fd);
        return 0;
    }
    if (!g_kept && !(g_kept = calloc(KEPT_MAX, sizeof(*g_kept)))) {
        close(fd);
        return -ENOMEM;
    }
    snprintf(g_kept[g_n_kept].name, sizeof(g_kept[0].name), "%s", name);
    g_kept[g_n_kept++].fd = fd;
    return 0;
}

#ifdef GPUBUF_HAVE_SYSTEMD
/* LISTEN_FDS/LISTEN_FDNAMES: the socket unit's socket, or what the fd store
 * kept for us (FDSTORE=1 with FDNAME=...). */
static int systemd_fds(void) {
    char **names = NULL;
    int n = sd_listen_fds_with_names(1, &names), r = 0;
    if (n < 0) {
        LOG_ERR("cannot read the fds systemd passed: %s", strerror(-n));
        return n;
    }
    for (int i = 0; i < n; i++) {
        int fd = SD_LISTEN_FDS_START + i;
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        if (r == 0)
            r = kept_add(names && names[i] ? names[i] : "unknown", fd);
        else
            close(fd);
    }
    if (names)
        for (int i = 0; i < n; i++)
            free(names[i]);
    free(names);
    if (n > 0)
        g_listen_from = g_listen_stored ? "the fd store" : "systemd";
    return r;
}
#endif

static void kept_close(void) {
    for (size_t i = 0; i < g_n_kept; i++)
        if (g_kept[i].fd >= 0)
            close(g_kept[i].fd);
    free(g_kept);
    g_kept = NULL;
    g_n_kept = 0;
}

/* ---- takeover (takeover.c) --------------------------------------------- */

/* The successor serves: stop, leaving the socket file where it is. */
static void commit_takeover(gd_daemon *d) {
    d->srv.listen_owned = false;
    shutdown_daemon();
}

/* gpubufd --takeover, phase 1: receive the running daemon's fds and sort
 * them as the ones systemd passes. */
static int take_over(gd_takeover *t, const char *socket_path) {
    gd_err err = {0};
    int r = gd_takeover_receive(t, socket_path, &err);
    if (r < 0) {
        LOG_ERR("takeover: %s", err.msg);
        gd_takeover_abort(t, r, err.msg);
        return r;
    }
    for (size_t i = 0; i < t->rx.n && r == 0; i++) {
        r = kept_add(t->rx.fds[i].name, t->rx.fds[i].fd);
        t->rx.fds[i].fd = -1; /* kept_add took it */
    }
    if (r < 0) {
        LOG_ERR("takeover: the fds passed do not check out");
        gd_takeover_abort(t, r, "the fds passed do not check out");
        return r;
    }
    LOG_NOTICE("takeover: took %zu fd(s)%s from gpubufd pid %d", g_n_kept,
               g_listen_fd >= 0 ? " and its listening socket" : "", (int)t->from);
    g_listen_from = "the previous gpubufd";
    return 0;
}

static void usage(FILE *f) {
    fprintf(
        f,
        "Usage: gpubufd [OPTIONS]\n"
        "Share GPU and host memory between processes.\n\n"
        "  -s, --socket PATH      listen on PATH (default $GPUBUF_SOCKET or %s)\n"
        "  -c, --config FILE      read configuration from FILE (gpubuf.conf(5))\n"
        "  -p, --pool SPEC        add a pool: NAME=KIND[,device=N][,capacity=SIZE][,slab=SIZE]\n"
        "                         KIND is host, cuda-ipc or cuda-vmm; may be repeated\n"
        "  -l, --log-level LEVEL  emerg, alert, crit, err, warning, notice, info (default)\n"
        "                         or debug\n"
        "      --check-config     parse the configuration and exit\n"
        "      --takeover         take the socket, buffers and clients over from the gpubufd\n"
        "                         running on the socket (an upgrade without a service\n"
        "                         manager); it exits once this one serves, and serves on\n"
        "                         if this one cannot start\n"
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

/* Listen on the socket passed (listen_fd >= 0: by systemd, or kept by the
 * previous daemon, from where), or on the configured path. */
static int listen_socket(const gd_config *cfg, int listen_fd, const char *from) {
    int r;
    if (listen_fd >= 0) {
        if ((r = gd_server_listen_fd(&g_d.srv, listen_fd)) < 0) {
            LOG_ERR("cannot listen on the socket passed by %s: %s", from, uv_strerror(r));
            return r;
        }
        LOG_INFO("listening on the socket passed by %s", from);
        return 0;
    }
    if ((r = ensure_dir_of(cfg->socket_path)) < 0)
        LOG_WARN("cannot create the directory of %s: %s", cfg->socket_path, strerror(-r));
    gid_t gid = (gid_t)-1;
    if (cfg->socket_group[0]) {
        struct group *g = getgrnam(cfg->socket_group);
        if (!g) {
            LOG_ERR("cannot give %s to group %s: no such group", cfg->socket_path,
                    cfg->socket_group);
            return -EPERM;
        }
        gid = g->gr_gid;
    }
    r = gd_server_listen_path(&g_d.srv, cfg->socket_path, (mode_t)cfg->socket_mode, gid);
    if (r < 0) {
        LOG_ERR("cannot listen on %s: %s", cfg->socket_path,
                r == -EADDRINUSE ? "another gpubufd is running there"
                : r == -EEXIST   ? "a file that is not a socket is in the way"
                : r == -EPERM && gid != (gid_t)-1
                    ? "cannot give the socket to its group (socket_group)"
                    : strerror(-r));
        return r;
    }
    LOG_INFO("listening on %s", cfg->socket_path);
    return 0;
}

/* Signals, the watchdog, READY=1. */
static int start_services(uv_loop_t *loop) {
    static const int signums[4] = {SIGTERM, SIGINT, SIGHUP, SIGUSR2};
    int r;
    for (int i = 0; i < 4; i++) {
        if ((r = uv_signal_init(loop, &g_sig[i])) < 0 ||
            (r = uv_signal_start(&g_sig[i], on_signal, signums[i])) < 0) {
            LOG_ERR("cannot watch signal %d: %s", signums[i], uv_strerror(r));
            return r;
        }
    }
#ifdef GPUBUF_HAVE_SYSTEMD
    uint64_t wd_usec = 0;
    if (sd_watchdog_enabled(0, &wd_usec) > 0 && wd_usec > 0) {
        /* Ping at half the interval systemd expects. */
        uint64_t ms = wd_usec / 2000 ? wd_usec / 2000 : 1;
        if ((r = uv_timer_init(loop, &g_watchdog)) < 0)
            return r;
        g_watchdog_on = true;
        if ((r = uv_timer_start(&g_watchdog, on_watchdog, 0, ms)) < 0)
            return r;
        LOG_INFO("watchdog: pinging every %llu ms", (unsigned long long)ms);
    }
    sd_notifyf(0, "READY=1\nSTATUS=serving %d pool(s)", g_d.ctx.n_pools);
#endif
    return 0;
}

/* glibc gives the top of the heap back to the kernel once more than
 * 128 KiB is free there, and the next large request grows it again, a page
 * fault per page: a batch of 1,000 opens built and freed its replies that
 * way on every call (docs/performance.md, "The heap's top"). gpubufd keeps
 * up to 8 MiB free at the top, grows it 4 MiB at a time, and leaves
 * allocations above 4 MiB (large statuses) to mmap, which the kernel takes
 * back at free. */
static void heap_settings(void) {
#if defined(M_TRIM_THRESHOLD) && defined(M_TOP_PAD) && defined(M_MMAP_THRESHOLD)
    mallopt(M_TRIM_THRESHOLD, 8 << 20);
    mallopt(M_TOP_PAD, 4 << 20);
    mallopt(M_MMAP_THRESHOLD, 4 << 20);
#endif
}

int main(int argc, char **argv) {
    static gd_config cfg;
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},   {"config", required_argument, NULL, 'c'},
        {"pool", required_argument, NULL, 'p'},     {"log-level", required_argument, NULL, 'l'},
        {"check-config", no_argument, NULL, 'C'},   {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},           {"takeover", no_argument, NULL, 'T'},
        {NULL, 0, NULL, 0}};
    const char *socket_flag = NULL;
    const char *pool_flags[GD_CONFIG_MAX_POOLS];
    int n_pool_flags = 0;
    bool check_only = false, take = false;
    int opt, rc = 1;
    gd_err err = {0};
    char why[300] = "see its log"; /* a successor's reason to give up */
    uv_loop_t *loop = uv_default_loop();

    heap_settings();
    gd_log_init();
    if (!loop) {
        fprintf(stderr, "gpubufd: cannot create the event loop\n");
        return 1;
    }
    while ((opt = getopt_long(argc, argv, "s:c:p:l:Vh", opts, NULL)) != -1) {
        switch (opt) {
        case 's': socket_flag = optarg; break;
        case 'c': g_config_file = optarg; break;
        case 'p':
            if (n_pool_flags >= GD_CONFIG_MAX_POOLS) {
                fprintf(stderr, "gpubufd: more than %d --pool flags\n", GD_CONFIG_MAX_POOLS);
                return 2;
            }
            pool_flags[n_pool_flags++] = optarg;
            break;
        case 'l': g_log_flag = optarg; break;
        case 'C': check_only = true; break;
        case 'T': take = true; break;
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
    if (read_config(&cfg, socket_flag, pool_flags, n_pool_flags, &err) < 0) {
        fprintf(stderr, "gpubufd: %s\n", err.msg);
        return 2;
    }
    if (cfg.log_level >= 0)
        gd_log_level = cfg.log_level;
    uint64_t nofile_before;
    g_nofile = raise_nofile(&nofile_before);
    if (check_only) {
        /* The budget the daemon would start with (pools not created). */
        g_fd_reserved = fd_reserve(NULL, &cfg);
        if (fit_fds(&cfg.limits, cfg.set, &err) < 0) {
            fprintf(stderr, "gpubufd: %s\n", err.msg);
            return 2;
        }
        printf("configuration OK: %d pool(s) defined\n", cfg.n_pools);
        printf("fd budget: RLIMIT_NOFILE %llu, %llu reserved, %d per client: max_clients %u, "
               "max_clients_per_uid %u\n",
               (unsigned long long)g_nofile, (unsigned long long)g_fd_reserved,
               GD_FDS_PER_CLIENT, cfg.limits.max_clients, cfg.limits.max_clients_per_uid);
        return 0;
    }

    signal(SIGPIPE, SIG_IGN);
    int r = gd_daemon_init(&g_d, loop);
    if (r < 0) {
        LOG_ERR("cannot set up the event loop: %s", uv_strerror(r));
        return 1;
    }
    g_d.ctx.reg.quota = cfg.quota;
    gd_takeover_serve(&g_d, commit_takeover);
    g_d.ctx.limits = cfg.limits; /* resume_timeout_ms, for the restore */
#ifdef GPUBUF_HAVE_SYSTEMD
    if (!take && systemd_fds() < 0)
        r = -EINVAL;
#endif
    /* A successor does what can fail before it asks for the fds: the
     * running daemon serves on meanwhile. */
    gd_takeover tk;
    gd_takeover_init(&tk);
    if (r == 0 && take && (r = gd_takeover_lock(&tk, cfg.socket_path, &err)) < 0)
        LOG_ERR("takeover: %s", err.msg);
    if (r == 0)
        r = create_pools(&g_d.ctx, &cfg);
    if (r == 0) {
        /* The pools are known now: fit the limits before the first client. */
        g_fd_reserved = fd_reserve(&g_d.ctx, &cfg);
        if ((r = fit_fds(&cfg.limits, cfg.set, &err)) < 0)
            LOG_ERR("%s", err.msg);
        else
            log_fd_budget(&cfg.limits, nofile_before);
    }
    g_d.ctx.limits = cfg.limits;
    bool asked = r == 0 && take;
    if (asked && (r = take_over(&tk, cfg.socket_path)) < 0)
        take = false; /* told already */
    if (r == 0) {
        /* Under a service manager with an fd store, it keeps what the
         * daemon keeps; else only a successor (--takeover) gets it. */
        const char *ns = getenv("NOTIFY_SOCKET");
        if ((r = gd_state_open(&g_d.ctx, g_kept, g_n_kept, ns && *ns, &err)) < 0) {
            LOG_ERR("cannot keep the daemon's state: %s", err.msg);
            snprintf(why, sizeof(why), "cannot keep the daemon's state: %s", err.msg);
        }
    }
    kept_close();
    journal_went_on(); /* (read only where state_journal = switchable) */
    if (r == 0 && listen_socket(&cfg, g_listen_fd, g_listen_from) < 0) {
        r = -EINVAL;
        snprintf(why, sizeof(why), "cannot listen on the socket passed");
    } else if (r == 0 && (g_listen_fd < 0 || g_listen_stored)) {
        /* A socket of our own: the fd store keeps it across a restart, so
         * that clients connecting meanwhile wait in its backlog. */
        gd_state_store_fd(g_d.ctx.state, "listen", g_d.srv.listen_fd);
        g_listen_stored = g_d.ctx.state && getenv("NOTIFY_SOCKET");
    }
    if (r == 0 && (r = start_services(loop)) < 0)
        snprintf(why, sizeof(why), "cannot watch signals: %s", uv_strerror(r));
    if (r == 0 && take) {
        gd_takeover_test_hook("restored");
        if ((r = gd_takeover_ready(&tk, &err)) < 0) {
            LOG_ERR("takeover: %s; exiting", err.msg);
            take = false; /* it knows */
        } else {
            LOG_NOTICE("takeover: serving; gpubufd pid %d let go", (int)tk.from);
        }
    }
    if (r < 0) {
        /* Close what was opened; the loop runs out. What was restored stays
         * kept as it was: frozen before the running daemon hears of it. */
        gd_state_freeze(g_d.ctx.state);
        if (take && !asked)
            LOG_ERR("takeover: giving up before asking for the fds; the running gpubufd "
                    "serves on");
        else if (take) {
            LOG_ERR("takeover: giving up (%s); gpubufd pid %d serves on", why, (int)tk.from);
            gd_takeover_abort(&tk, r, why);
        }
        for (int i = 0; i < 4; i++)
            if (g_sig[i].type && !uv_is_closing((uv_handle_t *)&g_sig[i]))
                uv_close((uv_handle_t *)&g_sig[i], NULL);
#ifdef GPUBUF_HAVE_SYSTEMD
        if (g_watchdog_on)
            uv_close((uv_handle_t *)&g_watchdog, NULL);
#endif
        gd_daemon_stop(&g_d);
    } else {
        rc = 0;
    }
    gd_takeover_end(&tk); /* the lock goes: the next successor may come */
    /* Runs until SIGTERM/SIGINT closed every handle. */
    uv_run(loop, UV_RUN_DEFAULT);
    if (rc == 0)
        LOG_INFO("stopped");
    gd_daemon_destroy(&g_d);
    gd_state_free(g_d.ctx.state);
    gpubuf_trace_dump(); /* GPUBUF_TRACE_TIMING */
    /* Every handle is closed by now; one left open is a bug. */
    if ((r = uv_loop_close(loop)) < 0)
        LOG_WARN("event loop closed with handles left: %s", uv_strerror(r));
    return rc;
}
