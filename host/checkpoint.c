/* checkpoint.c — placeholder until its implementation lands. */
#include "errors.h"
