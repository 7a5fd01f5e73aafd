/* kv_cache.c — placeholder until its implementation lands. */
#include "errors.h"
