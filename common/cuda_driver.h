/* The CUDA driver API, loaded at run time.
 *
 * Neither gpubufd nor libgpubuf-client link against libcuda: they dlopen
 * "libcuda.so.1" on first use and resolve every entry point with
 * cuGetProcAddress, asking for the CUDA 12.0 ABI of each entry point (the
 * signatures below), so a newer cuda.h or driver cannot change them.
 * Binaries therefore start on machines without a driver and report
 * GPUBUF_ENODRIVER only when a CUDA pool or buffer is actually used.
 */
#ifndef GPUBUF_CUDA_DRIVER_H
#define GPUBUF_CUDA_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#ifdef GPUBUF_HAVE_CUDA
#include <cuda.h>

typedef struct gpubuf_cuda {
    CUresult (*Init)(unsigned int);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*GetErrorString)(CUresult, const char **);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DeviceCanAccessPeer)(int *, CUdevice, CUdevice);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxGetCurrent)(CUcontext *);
    CUresult (*CtxPushCurrent)(CUcontext);
    CUresult (*CtxPopCurrent)(CUcontext *);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
    CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned int);
    CUresult (*IpcCloseMemHandle)(CUdeviceptr);
    CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
    CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
    CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
    CUresult (*MemsetD32)(CUdeviceptr, unsigned int, size_t);
    CUresult (*ModuleLoadData)(CUmodule *, const void *);
    CUresult (*ModuleUnload)(CUmodule);
    CUresult (*ModuleGetFunction)(CUfunction *, CUmodule, const char *);
    CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, unsigned, CUstream, void **, void **);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*StreamCreate)(CUstream *, unsigned int);
    CUresult (*StreamDestroy)(CUstream);
    CUresult (*StreamQuery)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned int);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventSynchronize)(CUevent);
    CUresult (*EventElapsedTime)(float *, CUevent, CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*EventQuery)(CUevent);
    CUresult (*StreamWaitEvent)(CUstream, CUevent, unsigned int);
    CUresult (*IpcGetEventHandle)(CUipcEventHandle *, CUevent);
    CUresult (*IpcOpenEventHandle)(CUevent *, CUipcEventHandle);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*MemcpyPeerAsync)(CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream);
    /* Virtual memory management (cuda-vmm pools). */
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                          unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *,
                                            CUmemAllocationGranularity_flags);
    CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle,
                                           CUmemAllocationHandleType, unsigned long long);
    CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *,
                                             CUmemAllocationHandleType);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                       unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    int version; /* driver version, e.g. 13000 */
} gpubuf_cuda;

/* Load the driver and call cuInit(0) once per process (thread-safe).
 * Returns 0 and *ret, or GPUBUF_ENODRIVER / GPUBUF_ECUDA with a message in
 * gpubuf_cuda_load_error(). */
int gpubuf_cuda_load(const gpubuf_cuda **ret);
const char *gpubuf_cuda_load_error(void);

/* The error code for a failed driver call, chosen by its CUresult:
 * CUDA_ERROR_OUT_OF_MEMORY -ENOMEM, CUDA_ERROR_NO_DEVICE GPUBUF_ENODEVICE,
 * anything else GPUBUF_ECUDA. */
int gpubuf_cuda_code(CUresult r);
/* What cuInit returned when gpubuf_cuda_load() failed with GPUBUF_ECUDA. */
CUresult gpubuf_cuda_init_result(void);

/* Write "what: CUDA_ERROR_X (text)" into buf. Returns buf. */
char *gpubuf_cuda_describe(CUresult r, const char *what, char *buf, size_t len);

/* Find the device whose UUID is uuid (in a table read once after cuInit);
 * returns 0 and its ordinal, or
 * GPUBUF_ENODEVICE. */
int gpubuf_cuda_device_by_uuid(const gpubuf_cuda *cu, const uint8_t uuid[16], int *ret_ordinal);
#endif

#endif
