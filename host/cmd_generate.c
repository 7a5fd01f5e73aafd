/* cmd_generate.c — placeholder. */
#include "errors.h"
