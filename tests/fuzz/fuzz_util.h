/*
 * fuzz_util.h — what the libFuzzer targets of tests/fuzz share: putting the input where the parser under test reads
 * it, and the checks a refusal or an acceptance must pass. A failed check aborts, so libFuzzer records the input as
 * a finding (tests/fuzz/build.sh).
 */
#ifndef BERTH_FUZZ_UTIL_H
#define BERTH_FUZZ_UTIL_H

#include <errno.h> /* program_invocation_short_name (_GNU_SOURCE) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "errors.h"

/* data as the whole file at path; 0 when it cannot be written (the caller skips the input). */
static inline int fuzz_write_file(const char *path, const void *data, size_t size)
{
    FILE *f = fopen(path, "wb");
    if (!f) return 0;
    fwrite(data, 1, size, f);
    fclose(f);
    return 1;
}

/* Aborts with "<target>: <what>" unless ok. */
static inline void fuzz_require(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s: %s\n", program_invocation_short_name, what);
        abort();
    }
}

/* A refusal leaves a non-empty one-line message (errors.h). */
static inline void fuzz_require_one_line_error(void)
{
    const char *msg = berth_last_error();
    fuzz_require(msg && msg[0] && !strchr(msg, '\n'), "a refusal without a one-line message");
}

#endif
