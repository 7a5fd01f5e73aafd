/* The plugin-api headers compile as strict C99 with every warning an error. */
#include <berth/model.h>
int main(void)
{
    berth_plugin_desc d = {0};
    d.struct_size = (uint32_t)BERTH_SIZE_TO(berth_plugin_desc, vtable);
    return BERTH_HAS(&d, berth_plugin_desc, vtable) ? 0 : 1;
}
