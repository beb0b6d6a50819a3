/* error.c - the one error sink (dsv4.h): a thread-local last message and the code names.
 * Every module reports through dsv4_error() so the CLI can print one clear line naming file and problem. */
#include <stdarg.h>
#include <stdio.h>

#include "dsv4/dsv4.h"

static _Thread_local char dsv4_error_message[2048];

int dsv4_error(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dsv4_error_message, sizeof dsv4_error_message, fmt, ap);
    va_end(ap);
    return code;
}

const char *dsv4_last_error(void)
{
    return dsv4_error_message;
}

const char *dsv4_err_name(int code)
{
    switch (code) {
    case DSV4_OK: return "ok";
    case DSV4_ERR_IO: return "I/O error";
    case DSV4_ERR_FORMAT: return "format error";
    case DSV4_ERR_CONFIG: return "config error";
    case DSV4_ERR_MISSING: return "missing";
    case DSV4_ERR_SHAPE: return "shape error";
    case DSV4_ERR_NOMEM: return "out of memory";
    case DSV4_ERR_CUDA: return "CUDA error";
    case DSV4_ERR_USAGE: return "usage error";
    case DSV4_ERR_UNSUPPORTED: return "unsupported";
    case DSV4_ERR_MISMATCH: return "cannot compare";
    default: return "error";
    }
}
