#include "cuda_driver.h"

#ifdef GPUBUF_HAVE_CUDA
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "gpubuf/gpubuf.h"
#include "procns.h"

static gpubuf_cuda g_cu;
static int g_status = GPUBUF_ENODRIVER;
static char g_error[768] = "CUDA driver not loaded";
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static CUresult g_init_result = CUDA_SUCCESS;
/* The UUIDs of the devices this process sees, read once after cuInit: the set
 * cannot change for the life of a process, and asking the driver for them on
 * every slab import cost more than the rest of the client's cold path. */
#define MAX_DEVICES 64
static int g_ndev;
static uint8_t g_uuid[MAX_DEVICES][16];

/* Entry points are requested with the ABI of CUDA 12.0, whose signatures the
 * function pointer types in cuda_driver.h spell out. Asking for the ABI of the
 * cuda.h at hand instead would silently change some (CUDA 13's
 * cuCtxSynchronize takes a context argument). */
#define GPUBUF_CUDA_ABI 12000

typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);

static int resolve(get_proc_v2_fn gp, const char *sym, void **out) {
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    CUresult r = gp(sym, out, GPUBUF_CUDA_ABI, CU_GET_PROC_ADDRESS_DEFAULT, &q);
    if (r != CUDA_SUCCESS || q != CU_GET_PROC_ADDRESS_SUCCESS || !*out) {
        snprintf(g_error, sizeof(g_error),
                 "libcuda.so.1 has no %s for CUDA %d (driver too old?)", sym, GPUBUF_CUDA_ABI);
        return -1;
    }
    return 0;
}

static void load_once(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_proc_v2_fn gp;
    if (!lib) {
        snprintf(g_error, sizeof(g_error), "cannot load the CUDA driver: %s", dlerror());
        return;
    }
    gp = (get_proc_v2_fn)dlsym(lib, "cuGetProcAddress_v2");
    if (!gp) {
        snprintf(g_error, sizeof(g_error),
                 "the CUDA driver has no cuGetProcAddress_v2 (needs driver >= 12.0)");
        return;
    }
#define R(field, sym)                                                                          \
    if (resolve(gp, sym, (void **)&g_cu.field) < 0)                                            \
        return;
    R(Init, "cuInit");
    R(DriverGetVersion, "cuDriverGetVersion");
    R(GetErrorName, "cuGetErrorName");
    R(GetErrorString, "cuGetErrorString");
    R(DeviceGetCount, "cuDeviceGetCount");
    R(DeviceGet, "cuDeviceGet");
    R(DeviceGetName, "cuDeviceGetName");
    R(DeviceGetUuid, "cuDeviceGetUuid");
    R(DeviceTotalMem, "cuDeviceTotalMem");
    R(DeviceGetAttribute, "cuDeviceGetAttribute");
    R(DeviceCanAccessPeer, "cuDeviceCanAccessPeer");
    R(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    R(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    R(CtxSetCurrent, "cuCtxSetCurrent");
    R(CtxGetCurrent, "cuCtxGetCurrent");
    R(CtxPushCurrent, "cuCtxPushCurrent");
    R(CtxPopCurrent, "cuCtxPopCurrent");
    R(CtxSynchronize, "cuCtxSynchronize");
    R(MemAlloc, "cuMemAlloc");
    R(MemFree, "cuMemFree");
    R(MemGetInfo, "cuMemGetInfo");
    R(IpcGetMemHandle, "cuIpcGetMemHandle");
    R(IpcOpenMemHandle, "cuIpcOpenMemHandle");
    R(IpcCloseMemHandle, "cuIpcCloseMemHandle");
    R(MemcpyHtoD, "cuMemcpyHtoD");
    R(MemcpyDtoH, "cuMemcpyDtoH");
    R(MemcpyDtoD, "cuMemcpyDtoD");
    R(MemcpyDtoDAsync, "cuMemcpyDtoDAsync");
    R(MemsetD8, "cuMemsetD8");
    R(MemsetD32, "cuMemsetD32");
    R(ModuleLoadData, "cuModuleLoadData");
    R(ModuleUnload, "cuModuleUnload");
    R(ModuleGetFunction, "cuModuleGetFunction");
    R(LaunchKernel, "cuLaunchKernel");
    R(StreamSynchronize, "cuStreamSynchronize");
    R(StreamCreate, "cuStreamCreate");
    R(StreamDestroy, "cuStreamDestroy");
    R(StreamQuery, "cuStreamQuery");
    R(EventCreate, "cuEventCreate");
    R(EventRecord, "cuEventRecord");
    R(EventSynchronize, "cuEventSynchronize");
    R(EventElapsedTime, "cuEventElapsedTime");
    R(EventDestroy, "cuEventDestroy");
    R(EventQuery, "cuEventQuery");
    R(StreamWaitEvent, "cuStreamWaitEvent");
    R(IpcGetEventHandle, "cuIpcGetEventHandle");
    R(IpcOpenEventHandle, "cuIpcOpenEventHandle");
    R(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
    R(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
    R(MemcpyPeerAsync, "cuMemcpyPeerAsync");
    R(MemCreate, "cuMemCreate");
    R(MemRelease, "cuMemRelease");
    R(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    R(MemExportToShareableHandle, "cuMemExportToShareableHandle");
    R(MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    R(MemAddressReserve, "cuMemAddressReserve");
    R(MemAddressFree, "cuMemAddressFree");
    R(MemMap, "cuMemMap");
    R(MemUnmap, "cuMemUnmap");
    R(MemSetAccess, "cuMemSetAccess");
#undef R
    CUresult r = g_cu.Init(0);
    g_init_result = r;
    if (r != CUDA_SUCCESS) {
        gpubuf_cuda_describe(r, "cuInit", g_error, sizeof(g_error));
        /* In a new PID namespace with its parent's /proc the driver fails
         * with CUDA_ERROR_OPERATING_SYSTEM: say that, and what to do. */
        char why[400];
        size_t used = strlen(g_error);
        if (r == CUDA_ERROR_OPERATING_SYSTEM && gpubuf_proc_foreign(why, sizeof(why)))
            snprintf(g_error + used, sizeof(g_error) - used, ": %s", why);
        g_status = GPUBUF_ECUDA;
        return;
    }
    g_cu.DriverGetVersion(&g_cu.version);
    int n = 0;
    if (g_cu.DeviceGetCount(&n) != CUDA_SUCCESS)
        n = 0;
    for (int i = 0; i < n && i < MAX_DEVICES; i++) {
        CUdevice d;
        CUuuid u;
        memset(g_uuid[i], 0, 16);
        if (g_cu.DeviceGet(&d, i) == CUDA_SUCCESS && g_cu.DeviceGetUuid(&u, d) == CUDA_SUCCESS)
            memcpy(g_uuid[i], u.bytes, 16);
        g_ndev = i + 1;
    }
    g_status = 0;
    g_error[0] = '\0';
}

int gpubuf_cuda_load(const gpubuf_cuda **ret) {
    pthread_once(&g_once, load_once);
    if (g_status == 0)
        *ret = &g_cu;
    return g_status;
}

int gpubuf_cuda_code(CUresult r) {
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: return -ENOMEM;
    case CUDA_ERROR_NO_DEVICE: return GPUBUF_ENODEVICE;
    default: return GPUBUF_ECUDA;
    }
}

CUresult gpubuf_cuda_init_result(void) {
    return g_init_result;
}

const char *gpubuf_cuda_load_error(void) {
    return g_error;
}

char *gpubuf_cuda_describe(CUresult r, const char *what, char *buf, size_t len) {
    const char *name = NULL, *text = NULL;
    if (g_cu.GetErrorName)
        g_cu.GetErrorName(r, &name);
    if (g_cu.GetErrorString)
        g_cu.GetErrorString(r, &text);
    snprintf(buf, len, "%s: %s (%s)", what, name ? name : "CUDA error",
             text ? text : "no description");
    return buf;
}

int gpubuf_cuda_device_by_uuid(const gpubuf_cuda *cu, const uint8_t uuid[16], int *ret_ordinal) {
    static const uint8_t zero[16];
    (void)cu;
    if (memcmp(uuid, zero, 16) == 0)
        return GPUBUF_ENODEVICE;
    for (int i = 0; i < g_ndev; i++) {
        if (memcmp(g_uuid[i], uuid, 16) == 0) {
            *ret_ordinal = i;
            return 0;
        }
    }
    return GPUBUF_ENODEVICE;
}
#endif
