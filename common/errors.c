#include <errno.h>
#include <string.h>

#include "gpubuf/gpubuf.h"

GPUBUF_EXTERN const char *gpubuf_strerror(int err) {
    switch (err) {
    case 0: return "success";
    case GPUBUF_EPROTOCOL: return "protocol error: malformed or unexpected message";
    case GPUBUF_EVERSION: return "no common protocol version with the daemon";
    case GPUBUF_ECUDA: return "a CUDA driver call failed";
    case GPUBUF_ENODRIVER: return "the CUDA driver (libcuda.so.1) could not be loaded";
    case GPUBUF_ENODEVICE: return "the buffer's GPU is not visible in this process";
    case GPUBUF_ESTATE: return "operation not allowed in the buffer's current state";
    case GPUBUF_ENOPOOL: return "no pool of that name";
    case GPUBUF_EPOOLFULL: return "the pool has no room for the request";
    case GPUBUF_ENOTHELD: return "this client holds no reference to that buffer";
    case GPUBUF_EDISCONNECTED: return "the daemon closed the connection";
    case GPUBUF_ERANGE: return "offset or length outside the buffer";
    case GPUBUF_ENOPEER: return "the chosen GPU cannot access the buffer's GPU (no peer access)";
    default: break;
    }
    if (err < 0 && err > -4096)
        return strerror(-err);
    return "unknown error";
}

GPUBUF_EXTERN const char *gpubuf_err_name(int err) {
    switch (err) {
    case 0: return "OK";
    case GPUBUF_EPROTOCOL: return "GPUBUF_EPROTOCOL";
    case GPUBUF_EVERSION: return "GPUBUF_EVERSION";
    case GPUBUF_ECUDA: return "GPUBUF_ECUDA";
    case GPUBUF_ENODRIVER: return "GPUBUF_ENODRIVER";
    case GPUBUF_ENODEVICE: return "GPUBUF_ENODEVICE";
    case GPUBUF_ESTATE: return "GPUBUF_ESTATE";
    case GPUBUF_ENOPOOL: return "GPUBUF_ENOPOOL";
    case GPUBUF_EPOOLFULL: return "GPUBUF_EPOOLFULL";
    case GPUBUF_ENOTHELD: return "GPUBUF_ENOTHELD";
    case GPUBUF_EDISCONNECTED: return "GPUBUF_EDISCONNECTED";
    case GPUBUF_ERANGE: return "GPUBUF_ERANGE";
    case GPUBUF_ENOPEER: return "GPUBUF_ENOPEER";
    case -ENOENT: return "ENOENT";
    case -EEXIST: return "EEXIST";
    case -EINVAL: return "EINVAL";
    case -ENOMEM: return "ENOMEM";
    case -EPERM: return "EPERM";
    case -EACCES: return "EACCES";
    case -ETIMEDOUT: return "ETIMEDOUT";
    case -EMSGSIZE: return "EMSGSIZE";
    case -ENAMETOOLONG: return "ENAMETOOLONG";
    case -ECONNREFUSED: return "ECONNREFUSED";
    case -EBUSY: return "EBUSY";
    case -ENOTSUP: return "ENOTSUP";
    case -EAGAIN: return "EAGAIN";
    case -ESHUTDOWN: return "ESHUTDOWN";
    case -ENOSPC: return "ENOSPC";
    case -EADDRINUSE: return "EADDRINUSE";
    case -EDQUOT: return "EDQUOT";
    case -EOVERFLOW: return "EOVERFLOW";
    case -EUSERS: return "EUSERS";
    case -ENOTSOCK: return "ENOTSOCK";
    case -EPIPE: return "EPIPE";
    case -ECONNRESET: return "ECONNRESET";
    default: return "EUNKNOWN";
    }
}
