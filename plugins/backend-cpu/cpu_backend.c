/* cpu_backend.c — placeholder; the CPU backend lands with its issue. */
#include <berth/backend.h>
BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor);
const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor) { (void)major; (void)minor; return NULL; }
