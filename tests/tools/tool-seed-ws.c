/* tool-seed-ws DIR: seed inputs for fuzz-ws (first byte: piece size and echo flag, then a
 * client frame stream): valid masked frames of each kind, fragments, and a closing frame. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/lib/fuzz_seed.h"

static size_t frame(unsigned char *o, int fin, int op, const char *p, size_t n)
{
    static const unsigned char key[4] = {1, 2, 3, 4};
    size_t h = 0;
    o[h++] = (unsigned char)((fin ? 0x80 : 0) | op);
    if (n < 126) {
        o[h++] = (unsigned char)(0x80 | n);
    } else {
        o[h++] = 0x80 | 126;
        o[h++] = (unsigned char)(n >> 8);
        o[h++] = (unsigned char)n;
    }
    memcpy(o + h, key, 4);
    h += 4;
    for (size_t i = 0; i < n; i++)
        o[h + i] = (unsigned char)(p[i] ^ key[i & 3]);
    return h + n;
}

static void put(const char *dir, const char *name, const unsigned char *b, size_t n)
{
    fuzz_seed_put(dir, name, NULL, 0, b, n);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-ws DIR\n");
        return 2;
    }
    static unsigned char b[70000];
    char big[300];
    memset(big, 'z', sizeof big);
    size_t n = 0;
    b[n++] = 0x45;
    n += frame(b + n, 1, 2, "\x01", 1);
    n += frame(b + n, 1, 1, "hello", 5);
    n += frame(b + n, 1, 9, "ping", 4);
    n += frame(b + n, 0, 2, "frag", 4);
    n += frame(b + n, 1, 10, "pong", 4);
    n += frame(b + n, 1, 0, "ment", 4);
    n += frame(b + n, 1, 2, big, sizeof big);
    n += frame(b + n, 1, 8, "\x03\xe8" "bye", 5);
    put(argv[1], "mixed", b, n);
    n = 0;
    b[n++] = 0x00;
    n += frame(b + n, 1, 1, "bye", 3);
    put(argv[1], "bye", b, n);
    return 0;
}
