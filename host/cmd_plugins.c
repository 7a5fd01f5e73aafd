/* cmd_plugins.c — placeholder. */
#include "errors.h"
