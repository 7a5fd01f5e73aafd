/*
 * errors.h — the host's error reporting: one thread-local "last error" line.
 *
 * Every host function that fails returns a berth_status and leaves a one-line message here, naming the file,
 * field or value at fault. Plugin messages (host->set_error) land in the same slot. Whoever handles the error
 * prints it once.
 */
#ifndef BERTH_HOST_ERRORS_H
#define BERTH_HOST_ERRORS_H

#include <berth/plugin.h>

/* Set the last error (printf-style) and return code, so callers can write `return berth_fail(E, "...")`. */
berth_status berth_fail(berth_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The last error message of this thread ("" if none). Valid until the next berth_fail on this thread. */
const char *berth_last_error(void);
/* Clear the last error. */
void berth_clear_error(void);
/* "invalid argument", "unsupported", ... for a status code; never NULL. */
const char *berth_status_str(berth_status code);

#endif
