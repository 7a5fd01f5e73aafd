/* errors.c — thread-local last-error storage (see errors.h). */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

berth_status berth_fail(berth_status code, const char *fmt, ...)
{
    /* Format into a temporary first: arguments may point into last_error itself (re-wrapping a message). */
    char tmp[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    memcpy(last_error, tmp, sizeof last_error);
    return code;
}

const char *berth_last_error(void) { return last_error; }

void berth_clear_error(void) { last_error[0] = '\0'; }

const char *berth_status_str(berth_status code)
{
    switch (code) {
    case BERTH_OK: return "ok";
    case BERTH_E_INVALID: return "invalid input";
    case BERTH_E_NOMEM: return "out of memory";
    case BERTH_E_DEVICE_OOM: return "out of device memory";
    case BERTH_E_UNSUPPORTED: return "unsupported";
    case BERTH_E_ABI: return "ABI mismatch";
    case BERTH_E_NOT_FOUND: return "not found";
    case BERTH_E_IO: return "I/O error";
    case BERTH_E_BACKEND: return "backend error";
    case BERTH_E_DEVICE_LOST: return "device lost";
    case BERTH_E_CANCELLED: return "cancelled";
    case BERTH_E_INTERNAL: return "internal error";
    case BERTH_E_NO_DEVICE: return "no device";
    default: return "failed";
    }
}
