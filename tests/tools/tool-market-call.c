/* tool-market-call — one call to a market's API, signed the way ring signs, with every part
 * of the signature under the test's control (for the hostile-input tests):
 *   tool-market-call [options] METHOD URL PATH [BODY|@FILE]
 *   --key DIR        sign with the node key in DIR (created when missing); none: unsigned
 *   --as DIR         put the key of DIR in X-Kv-Node (signing with --key: a wrong-key call)
 *   --ts N           X-Kv-Time (default now)       --nonce HEX   (default random)
 *   --sign-body B    sign B instead of the body sent (a forged call)
 *   --save FILE      write the headers sent there; --replay FILE sends those headers again
 *   --from ADDR      connect from this local address (another loopback address: another host)
 * Prints "STATUS BODY" on one line (the body's newline removed); exit 0 when a reply came. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/rand.h>

#include "net/net.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    fwrite(p, sz, n, ud);
    return sz * n;
}

int main(int argc, char **argv)
{
    const char *key = NULL, *as = NULL, *nonce = NULL, *sign_body = NULL, *save = NULL, *replay = NULL;
    const char *from = NULL;
    int64_t ts = (int64_t)time(NULL);
    int i = 1;
    for (; i + 1 < argc && argv[i][0] == '-' && argv[i][1] == '-'; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        if (!strcmp(o, "--key")) key = v;
        else if (!strcmp(o, "--as")) as = v;
        else if (!strcmp(o, "--ts")) ts = strtoll(v, NULL, 10);
        else if (!strcmp(o, "--nonce")) nonce = v;
        else if (!strcmp(o, "--sign-body")) sign_body = v;
        else if (!strcmp(o, "--save")) save = v;
        else if (!strcmp(o, "--replay")) replay = v;
        else if (!strcmp(o, "--from")) from = v;
        else { fprintf(stderr, "unknown option %s\n", o); return 2; }
    }
    if (argc - i < 3) {
        fprintf(stderr, "usage: tool-market-call [options] METHOD URL PATH [BODY|@FILE]\n");
        return 2;
    }
    const char *method = argv[i], *base = argv[i + 1], *path = argv[i + 2];
    char *body = NULL, err[KV_ERR_MAX];
    size_t blen = 0;
    if (argc - i > 3) {
        if (argv[i + 3][0] == '@') {
            if (util_file_read(argv[i + 3] + 1, 64u << 20, &body, &blen, err, sizeof err) < 0) {
                fprintf(stderr, "%s\n", err);
                return 1;
            }
        } else {
            body = strdup(argv[i + 3]);
            blen = strlen(body);
        }
    }
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    hd = curl_slist_append(hd, "Expect:");
    if (replay) {
        FILE *f = fopen(replay, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            hd = curl_slist_append(hd, line);
        }
        if (f)
            fclose(f);
    } else if (key) {
        struct net_identity *id, *who = NULL;
        if (net_identity_load(&id, key, err, sizeof err) < 0 ||
            (as && net_identity_load(&who, as, err, sizeof err) < 0)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        char nb[33], lines[4][RING_MARKET_HDR_MAX];
        uint8_t r[16];
        if (!nonce) {
            RAND_bytes(r, sizeof r);
            util_hex_encode(r, sizeof r, nb);
            nonce = nb;
        }
        const char *sb = sign_body ? sign_body : body;
        if (ring_market_sign(id, who, method, path, sb, sb ? strlen(sb) : 0, ts, nonce, lines) < 0)
            return 1;
        FILE *sf = save ? fopen(save, "w") : NULL;
        for (int k = 0; k < 4; k++) {
            hd = curl_slist_append(hd, lines[k]);
            if (sf)
                fprintf(sf, "%s\n", lines[k]);
        }
        if (sf)
            fclose(sf);
        net_identity_free(id);
        net_identity_free(who);
    }
    char url[4096];
    snprintf(url, sizeof url, "%s%s", base, path);
    CURL *c = curl_easy_init();
    char *out = NULL;
    size_t olen = 0;
    FILE *mem = open_memstream(&out, &olen);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
    if (from)
        curl_easy_setopt(c, CURLOPT_INTERFACE, from);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, mem);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)blen);
    }
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    fclose(mem);
    if (rc != CURLE_OK) {
        printf("0 %s\n", curl_easy_strerror(rc));
    } else {
        for (size_t k = 0; k < olen; k++)
            if (out[k] == '\n')
                out[k] = ' ';
        printf("%ld %s\n", status, out ? out : "");
    }
    free(out);
    free(body);
    curl_slist_free_all(hd);
    curl_easy_cleanup(c);
    return rc == CURLE_OK ? 0 : 1;
}
