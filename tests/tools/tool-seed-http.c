/* tool-seed-http DIR — seed inputs for fuzz-http: valid and near-valid requests (first byte:
 * the mode / piece size, see fuzz-http.c). */
#include <stdio.h>
#include <string.h>

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
            char path[4096];
            snprintf(path, sizeof path, "%s/seed-req-%zu-%d", argv[1], i, m);
            FILE *fp = fopen(path, "wb");
            if (!fp)
                return 1;
            fputc(m ? 32 : 255, fp); /* 16-byte pieces, or all at once */
            fwrite(reqs[i], 1, strlen(reqs[i]), fp);
            fclose(fp);
            n++;
        }
    }
    for (size_t i = 0; i < sizeof helpers / sizeof *helpers; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed-helper-%zu", argv[1], i);
        FILE *fp = fopen(path, "wb");
        if (!fp)
            return 1;
        fputc(7, fp);
        fwrite(helpers[i], 1, strlen(helpers[i]), fp);
        fclose(fp);
        n++;
    }
    printf("%d seeds\n", n);
    return 0;
}
