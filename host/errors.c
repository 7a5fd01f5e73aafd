/* errors.c — thread-local last-error storage (see errors.h). */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[1024];

/* The message is one line by contract (errors.h), but it may quote untrusted text — a config.json value, an INI
 * line, a tokenizer string, a plugin's own message: control characters are stored as C escapes (\n, \t, \r,
 * \xNN), so the line stays one line and still shows what was there (found by tests/fuzz/fuzz_gemma4_config). */
static void store_one_line(const char *src)
{
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p && o + 5 < sizeof last_error; p++) {
        if (*p >= 0x20 && *p != 0x7f) {
            last_error[o++] = (char)*p;
            continue;
        }
        const char e = *p == '\n' ? 'n' : *p == '\t' ? 't' : *p == '\r' ? 'r' : 0;
        if (e) {
            last_error[o++] = '\\';
            last_error[o++] = e;
        } else {
            o += (size_t)snprintf(last_error + o, sizeof last_error - o, "\\x%02x", *p);
        }
    }
    last_error[o] = '\0';
}

berth_status berth_fail(berth_status code, const char *fmt, ...)
{
    /* Format into a temporary first: arguments may point into last_error itself (re-wrapping a message). */
    char tmp[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    store_one_line(tmp);
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
