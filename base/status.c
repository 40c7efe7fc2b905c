/* Status strings and the library version: the only text a caller needs to explain a code. */
#include "include/dear_types.h"

const char *dear_status_string(int status)
{
    switch (status) {
    case DEAR_OK: return "success";
    case DEAR_ERR_ARG: return "invalid argument";
    case DEAR_ERR_STATE: return "call out of order";
    case DEAR_ERR_MISMATCH: return "mismatch: ranks registered differently, or a plan file does not fit the tensors";
    case DEAR_ERR_MPI: return "MPI error";
    case DEAR_ERR_NOMEM: return "out of memory";
    case DEAR_ERR_UNSUPPORTED: return "not supported in this build or setting";
    case DEAR_ERR_TIMEOUT: return "operation stalled past DEAR_STALL_ABORT_S";
    case DEAR_ERR_PARAM: return "bad DEAR_* parameter value";
    case DEAR_ERR_IO: return "I/O error";
    case DEAR_ERR_FORMAT: return "malformed file";
    case DEAR_ERR_CALLBACK: return "update callback failed";
    case DEAR_ERR_CUDA: return "CUDA or NCCL error";
    case DEAR_ERR_INTERNAL: return "internal error";
    case DEAR_ERR_NET: return "socket transport error (connection failed, refused, closed, reset or dead, or a peer broke its limits)";
    default: return "unknown status code";
    }
}

#define DEAR_STR2(x) #x
#define DEAR_STR(x) DEAR_STR2(x)

const char *dear_version(void)
{
    return DEAR_STR(DEAR_VERSION_MAJOR) "." DEAR_STR(DEAR_VERSION_MINOR) "." DEAR_STR(DEAR_VERSION_PATCH);
}
