/* Anchor for the cold open of a cuda-vmm slab: raw CUDA VMM sharing between two
 * processes, driver API only, no gpubuf. The exporter (forked before cuInit
 * like the importer) creates allocations with cuMemCreate (POSIX file
 * descriptor handles), exports each with cuMemExportToShareableHandle and sends
 * the fd over a Unix socketpair; the importer receives it and times
 * cuMemImportFromShareableHandle + cuMemAddressReserve + cuMemMap +
 * cuMemSetAccess of the whole allocation, which is what gpubuf's client does
 * when it maps a cuda-vmm slab. Half of the allocations are mapped read-write,
 * half read-only (CU_MEM_ACCESS_FLAGS_PROT_READ), alternating, so the two are
 * measured side by side. Sizes: 2 MiB and 64 MiB (the slab sizes of
 * bench/run.sh's vmmcold and vmmcold64 pools). Mappings are kept until the end
 * of each size, as gpubuf's cold-open phase keeps its views.
 *
 * Prints "name value" lines (medians and p99s in microseconds, warm-up
 * excluded). Build: nvcc -O2 vmm_bench.c -lcuda */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "anchor_util.h"

enum { NPING = 20000, NSIZES = 2 };
static const size_t SIZES[NSIZES] = {(size_t)2 << 20, (size_t)64 << 20};
/* Allocations per size: warm-up (dropped) and measured, each read-write and
 * read-only. */
static const int WARM[NSIZES] = {20, 4};
static const int MEASURED[NSIZES] = {200, 40};

static CUmemAllocationProp vmm_prop(void) {
  CUmemAllocationProp p; memset(&p, 0, sizeof p);
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED; p.location.type = CU_MEM_LOCATION_TYPE_DEVICE; p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

/* Allocation i of a size is mapped read-only when this is 1: pairs (2k, 2k+1)
 * take turns at going first. */
static int is_ro(int i) { return (i & 1) ^ ((i >> 1) & 1); }

static void report(const char *name, double *v, int n) {
  qsort(v, n, sizeof *v, cmpd);
  printf("%s_median_us %.2f\n%s_p99_us %.2f\n", name, v[n / 2], name, v[(int)(0.99 * (n - 1))]);
}

static void exporter(int s) {
  init_ctx();
  CUmemAllocationProp prop = vmm_prop();
  int posix = 0; CUdevice d; CK(cuDeviceGet(&d, 0));
  CK(cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, d));
  if (!posix) { fprintf(stderr, "vmm_bench: device 0 has no POSIX fd handles for VMM memory\n"); exit(1); }
  size_t gran = 0; CK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  printf("vmm_anchor_granularity_bytes %zu\n", gran);
  /* 64-byte ping-pong: the socket round trip between these two processes. */
  char msg[64] = {0};
  for (int i = 0; i < NPING; i++) { xread(s, msg, 64); xwrite(s, msg, 64); }
  for (int z = 0; z < NSIZES; z++) {
    int n = 2 * (WARM[z] + MEASURED[z]);
    CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
    double *tc = calloc(n, sizeof *tc);
    if (!h || !tc) { perror("calloc"); exit(1); }
    /* All allocations first, as the daemon created its slabs before the cold
     * opens; then one fd at a time, each sent after the previous import. */
    for (int i = 0; i < n; i++) { double a = now_us(); CK(cuMemCreate(&h[i], SIZES[z], &prop, 0)); tc[i] = now_us() - a; }
    char label[64]; snprintf(label, sizeof label, "vmm_anchor_create_%zuMiB", SIZES[z] >> 20);
    report(label, tc, n);
    for (int i = 0; i < n; i++) {
      int fd = -1; char ack;
      CK(cuMemExportToShareableHandle(&fd, h[i], CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
      send_fd(s, fd); close(fd);
      xread(s, &ack, 1);
    }
    char done; xread(s, &done, 1); /* the importer has unmapped everything */
    for (int i = 0; i < n; i++) CK(cuMemRelease(h[i]));
    free(h); free(tc);
  }
}

static void importer(int s) {
  init_ctx();
  char msg[64] = {0};
  double *tp = calloc(NPING, sizeof *tp);
  if (!tp) { perror("calloc"); exit(1); }
  for (int i = 0; i < NPING; i++) { double a = now_us(); xwrite(s, msg, 64); xread(s, msg, 64); tp[i] = now_us() - a; }
  report("vmm_anchor_socket_roundtrip_64B", tp, NPING);
  free(tp);
  for (int z = 0; z < NSIZES; z++) {
    size_t sz = SIZES[z];
    int n = 2 * (WARM[z] + MEASURED[z]), m = MEASURED[z], nrw = 0, nro = 0;
    CUdeviceptr *va = calloc(n, sizeof *va);
    CUmemGenericAllocationHandle *h = calloc(n, sizeof *h);
    double *rw = calloc(m, sizeof *rw), *ro = calloc(m, sizeof *ro), *imp = calloc(m, sizeof *imp),
           *map = calloc(m, sizeof *map), *un = calloc(n, sizeof *un);
    if (!va || !h || !rw || !ro || !imp || !map || !un) { perror("calloc"); exit(1); }
    for (int i = 0; i < n; i++) {
      int fd = recv_fd(s), r_o = is_ro(i);
      CUmemAccessDesc acc; memset(&acc, 0, sizeof acc);
      acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE; acc.location.id = 0;
      acc.flags = r_o ? CU_MEM_ACCESS_FLAGS_PROT_READ : CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      double a = now_us();
      CK(cuMemImportFromShareableHandle(&h[i], (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
      double b = now_us();
      CK(cuMemAddressReserve(&va[i], sz, 0, 0, 0));
      CK(cuMemMap(va[i], sz, 0, h[i], 0));
      CK(cuMemSetAccess(va[i], sz, &acc, 1));
      double e = now_us();
      close(fd);
      xwrite(s, "a", 1);
      if (i < 2 * WARM[z]) continue;
      if (r_o) { ro[nro++] = e - a; } else { imp[nrw] = b - a; map[nrw] = e - b; rw[nrw++] = e - a; }
    }
    /* The memory works: write through the last read-write mapping, read back. */
    int last_rw = is_ro(n - 1) ? n - 2 : n - 1;
    unsigned v = 0;
    CK(cuMemsetD32(va[last_rw], 0x5a5a5a5au, sz / 4));
    CK(cuMemcpyDtoH(&v, va[last_rw] + sz - 4, 4));
    char key[96];
    snprintf(key, sizeof key, "vmm_anchor_data_check_%zuMiB", sz >> 20);
    printf("%s %d\n", key, v == 0x5a5a5a5au);
    snprintf(key, sizeof key, "vmm_import_map_%zuMiB", sz >> 20); report(key, rw, nrw);
    snprintf(key, sizeof key, "vmm_import_map_ro_%zuMiB", sz >> 20); report(key, ro, nro);
    snprintf(key, sizeof key, "vmm_import_only_%zuMiB", sz >> 20); report(key, imp, nrw);
    snprintf(key, sizeof key, "vmm_reserve_map_access_%zuMiB", sz >> 20); report(key, map, nrw);
    for (int i = 0; i < n; i++) {
      double a = now_us();
      CK(cuMemUnmap(va[i], sz)); CK(cuMemAddressFree(va[i], sz)); CK(cuMemRelease(h[i]));
      un[i] = now_us() - a;
    }
    snprintf(key, sizeof key, "vmm_unmap_release_%zuMiB", sz >> 20); report(key, un, n);
    xwrite(s, "d", 1);
    free(va); free(h); free(rw); free(ro); free(imp); free(map); free(un);
  }
}

int main(void) {
  int st1, st2;
  if (run_pair(exporter, importer, &st1, &st2)) return 1;
  int ok = WIFEXITED(st1) && WEXITSTATUS(st1) == 0 && WIFEXITED(st2) && WEXITSTATUS(st2) == 0;
  if (!ok) fprintf(stderr, "vmm_bench: exporter status %d, importer status %d\n", st1, st2);
  return ok ? 0 : 1;
}
