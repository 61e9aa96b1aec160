/* kvd: the Kvasir daemon (stage, relay, seeder roles). Placeholder until the ring issue. */
#include <stdio.h>

int main(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "kvd: not built yet\n");
    return 1;
}
