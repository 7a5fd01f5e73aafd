/* host_services.c — placeholder until its implementation lands. */
#include "errors.h"
