/* tool-seed-http DIR — seed inputs for fuzz-http: valid and near-valid requests (first byte:
 * the mode / piece size, see fuzz-http.c). */
#include <stdio.h>
#include <string.h>

#include "tests/lib/fuzz_seed.h"

static const char *reqs[] = {
    "GET /hello HTTP/1.1\r\nHost: x\r\n\r\nGET /hello HTTP/1.1\r\n\r\n",
    "GET /body HTTP/1.1\r\nRange: bytes=10-99\r\nIf-Range: \"b\"\r\n\r\n",
    "GET /body HTTP/1.1\r\nRange: bytes=-5\r\n\r\nHEAD /body HTTP/1.1\r\n\r\n",
    "GET /body HTTP/1.1\r\nAccept-Encoding: zstd\r\n\r\n",
    "GET /body HTTP/1.1\r\nIf-None-Match: \"b\"\r\n\r\n",
    "POST /push/a%20b HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    "POST /push/c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    "GET /up HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: x\r\n\r\nraw bytes",
    "GET /hello/../x HTTP/1.1\r\n\r\n",
    "GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
};
static const char *helpers[] = {"/a/%2e%2e/b", "bytes=0-", "bytes=-1", "gzip, zstd;q=0.5", "/x//y"};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-http DIR\n");
        return 2;
    }
    int n = 0;
    for (size_t i = 0; i < sizeof reqs / sizeof *reqs; i++) {
        for (int m = 0; m < 2; m++) {
            char name[64];
            unsigned char mode = m ? 32 : 255; /* 16-byte pieces, or all at once */
            snprintf(name, sizeof name, "req-%zu-%d", i, m);
            fuzz_seed_put(argv[1], name, &mode, 1, reqs[i], strlen(reqs[i]));
            n++;
        }
    }
    for (size_t i = 0; i < sizeof helpers / sizeof *helpers; i++) {
        char name[64];
        unsigned char mode = 7;
        snprintf(name, sizeof name, "helper-%zu", i);
        fuzz_seed_put(argv[1], name, &mode, 1, helpers[i], strlen(helpers[i]));
        n++;
    }
    printf("%d seeds\n", n);
    return 0;
}
