/* Helpers shared by the CUDA anchor programs (ipc_bench.c, vmm_bench.c): clock,
 * statistics, whole reads and writes, file descriptors over a Unix socket, a
 * check of CUDA driver results that exits with the error's name, and the two
 * processes of a measurement. */
#ifndef GPUBUF_ANCHOR_UTIL_H
#define GPUBUF_ANCHOR_UTIL_H
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CK(x) do { CUresult r_ = (x); if (r_ != CUDA_SUCCESS) { const char *s_ = 0; cuGetErrorName(r_, &s_); \
  fprintf(stderr, "%s:%d %s -> %s\n", __FILE__, __LINE__, #x, s_ ? s_ : "?"); exit(1); } } while (0)

static inline double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static inline int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return x < y ? -1 : x > y; }
static inline double median(double *v, int n) { qsort(v, n, sizeof *v, cmpd); return v[n / 2]; }
static inline double pct(double *v, int n, double p) { qsort(v, n, sizeof *v, cmpd); return v[(int)(p * (n - 1))]; }

static inline void xwrite(int fd, const void *b, size_t n) { const char *p = b; while (n) { ssize_t k = write(fd, p, n); if (k <= 0) { perror("write"); exit(1); } p += k; n -= k; } }
static inline void xread(int fd, void *b, size_t n) { char *p = b; while (n) { ssize_t k = read(fd, p, n); if (k <= 0) { perror("read"); exit(1); } p += k; n -= k; } }

static inline void send_fd(int sock, int fd) {
  char c = 'f'; struct iovec iov = {&c, 1}; char cbuf[CMSG_SPACE(sizeof(int))]; memset(cbuf, 0, sizeof cbuf);
  struct msghdr m = {0}; m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
  struct cmsghdr *c0 = CMSG_FIRSTHDR(&m); c0->cmsg_level = SOL_SOCKET; c0->cmsg_type = SCM_RIGHTS; c0->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c0), &fd, sizeof fd); if (sendmsg(sock, &m, 0) != 1) { perror("sendmsg"); exit(1); }
}
static inline int recv_fd(int sock) {
  char c; struct iovec iov = {&c, 1}; char cbuf[CMSG_SPACE(sizeof(int))];
  struct msghdr m = {0}; m.msg_iov = &iov; m.msg_iovlen = 1; m.msg_control = cbuf; m.msg_controllen = sizeof cbuf;
  if (recvmsg(sock, &m, 0) != 1) { perror("recvmsg"); exit(1); }
  struct cmsghdr *c0 = CMSG_FIRSTHDR(&m);
  if (!c0 || c0->cmsg_type != SCM_RIGHTS) { fprintf(stderr, "recvmsg: no file descriptor\n"); exit(1); }
  int fd; memcpy(&fd, CMSG_DATA(c0), sizeof fd); return fd;
}

/* The primary context of device 0, current on this thread. */
static inline CUcontext init_ctx(void) {
  CUdevice d; CUcontext c; CK(cuInit(0)); CK(cuDeviceGet(&d, 0)); CK(cuDevicePrimaryCtxRetain(&c, d)); CK(cuCtxSetCurrent(c)); return c;
}

/* The two processes of a measurement, forked before cuInit with stdout line
 * buffered: importer (forked first) and exporter, each on one end of a Unix
 * socketpair; waits for both and gives their wait statuses. 0, or 1 with a
 * message when there is no socketpair. */
static inline int run_pair(void (*exporter)(int), void (*importer)(int), int *st_exporter, int *st_importer) {
  int sv[2]; if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) { perror("socketpair"); return 1; }
  setvbuf(stdout, NULL, _IOLBF, 0);
  pid_t c = fork();
  if (c == 0) { close(sv[0]); importer(sv[1]); _exit(0); }
  pid_t p = fork();
  if (p == 0) { close(sv[1]); exporter(sv[0]); _exit(0); }
  close(sv[0]); close(sv[1]);
  *st_exporter = *st_importer = 0; waitpid(p, st_exporter, 0); waitpid(c, st_importer, 0);
  return 0;
}
#endif
