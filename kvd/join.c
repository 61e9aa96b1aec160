/* placeholder */
#include "kvd/kvd.h"
int kvd_join_main(int argc, char **argv) { (void)argc; (void)argv; return 2; }
