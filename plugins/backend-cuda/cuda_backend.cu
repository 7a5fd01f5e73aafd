/* cuda_backend.cu — placeholder; the CUDA skeleton lands with the foundation. */
#include <berth/backend.h>
extern "C" BERTH_EXPORT const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor);
extern "C" const berth_plugin_desc *berth_plugin_entry(uint32_t major, uint32_t minor) { (void)major; (void)minor; return nullptr; }
