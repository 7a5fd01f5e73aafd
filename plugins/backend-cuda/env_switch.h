/*
 * env_switch.h — how the CUDA backend reads its environment switches (BERTH_CUDA_*, docs/config.md): the value
 * rules as pure functions, so that tests/test_cuda_env_switch.c checks them without a GPU. cuda_backend.cu reads the
 * variables, treats unset and empty as the default, and logs "cuda: NAME='v' ignored: ... is expected" when a
 * parser says no. C and C++.
 */
#ifndef BERTH_CUDA_ENV_SWITCH_H
#define BERTH_CUDA_ENV_SWITCH_H

#include <stddef.h>
#include <string.h>

/* 1 and *out = the value when v is plain decimal digits (no sign, no spaces; leading zeros allowed) giving a value in
 * [lo, hi] that is a multiple of step; 0 otherwise (also for step < 1 or lo > hi), *out untouched. */
static inline int cu_env_parse_int(const char *v, int lo, int hi, int step, int *out)
{
    int n = 0;
    const char *p = v;
    if (!p || *p < '0' || *p > '9' || step < 1 || lo > hi || hi < 0)
        return 0;
    for (; *p >= '0' && *p <= '9'; p++) {
        const int d = *p - '0';
        if (n > hi / 10 || n * 10 > hi - d) /* n * 10 + d would pass hi (checked without overflowing) */
            return 0;
        n = n * 10 + d;
    }
    if (*p != '\0' || n < lo || n % step != 0)
        return 0;
    *out = n;
    return 1;
}

/* A switch's accepted names and the values they stand for. */
struct cu_env_name {
    const char *name;
    int value;
};

/* 1 and *out = names[i].value when v equals names[i].name exactly (case-sensitive); 0 otherwise. */
static inline int cu_env_parse_choice(const char *v, const struct cu_env_name *names, size_t n, int *out)
{
    for (size_t i = 0; v && i < n; i++)
        if (strcmp(v, names[i].name) == 0) {
            *out = names[i].value;
            return 1;
        }
    return 0;
}

#endif
