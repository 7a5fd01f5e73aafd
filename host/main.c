/* main.c — placeholder CLI until the foundation's CLI lands. */
#include <stdio.h>
int main(void) { puts("berth " BERTH_VERSION); return 0; }
