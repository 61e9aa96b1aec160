/* tool-seed-market DIR — seed inputs for fuzz-market: the calls of a market's life, in the
 * order a run of them builds state (a model registered by the operator, two nodes, claims,
 * heartbeats, a client and its credit, receipts, a release, a delete), each behind its mode
 * byte and path line (fuzz-market.c: route in the low 5 bits, key in the next 2). The model is
 * the shared test data's stories260K, its catalog made here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "tests/lib/fuzz_seed.h"
#include "util/err.h"

/* fuzz-market.c's routes, by index */
enum { R_PAGE, R_MODELS, R_MODELS_POST, R_MODEL, R_NODES_POST, R_NODE, R_CLAIMS, R_HEARTBEAT,
       R_RELEASE, R_PROBE, R_AUDIT, R_STANDBYS, R_RECEIPTS, R_MODEL_DELETE, R_CLIENTS_POST,
       R_CLIENTS, R_CLIENT, R_CLIENT_CREDIT };
enum { K_OP, K_A, K_B, K_NONE };

static int n_seeds;

static int put(const char *dir, int route, int key, const char *path, const char *body)
{
    char name[16], head[256];
    int hn = snprintf(head, sizeof head, "%c%s\n", route | key << 5, path);
    snprintf(name, sizeof name, "%02d", n_seeds++);
    fuzz_seed_put(dir, name, head, (size_t)hn, body, strlen(body));
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-market DIR\n");
        return 2;
    }
    const char *root = getenv("KV_TESTDATA"), *d = argv[1];
    char path[1024], err[KV_ERR_MAX], id[65];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", root ? root : "../shared/testdata");
    struct gguf_file *gf = NULL;
    struct gguf_catalog *c = NULL;
    char *cat = NULL;
    size_t cat_len = 0;
    if (gguf_file_open(&gf, path, err, sizeof err) || gguf_catalog_build(&c, gf, err, sizeof err) ||
        gguf_catalog_to_json(c, &cat, &cat_len, id)) {
        fprintf(stderr, "tool-seed-market: %s: %s\n", path, err);
        return 1;
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "catalog", cat);
    cJSON_AddStringToObject(m, "name", "stories");
    cJSON *src = cJSON_AddArrayToObject(m, "sources");
    cJSON_AddItemToArray(src, cJSON_CreateString("http://127.0.0.1:9/"));
    char *reg = cJSON_PrintUnformatted(m);
    char b[2048];
    int rc = put(d, R_MODELS_POST, K_OP, "", reg);
    snprintf(b, sizeof b, "{\"mem_bytes\":100000000,\"backend\":\"cpu\",\"model\":\"%s\",\"inbound\":true}", id);
    rc |= put(d, R_NODES_POST, K_A, "", b);
    rc |= put(d, R_NODES_POST, K_B, "", b);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"window\":0}", id);
    rc |= put(d, R_CLAIMS, K_A, "", b);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"window\":1,\"relay\":true}", id);
    rc |= put(d, R_CLAIMS, K_B, "", b);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"window\":0,\"progress\":1000,\"endpoint\":\"tcp://127.0.0.1:9\"}", id);
    rc |= put(d, R_HEARTBEAT, K_A, "", b);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"window\":0,\"id\":\"00\",\"outputs\":[]}", id);
    rc |= put(d, R_PROBE, K_A, "", b);
    rc |= put(d, R_AUDIT, K_A, "", b);
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"endpoint\":\"tcp://127.0.0.1:9\",\"serving\":[0,1],\"manifest\":\"%s\"}", id, id);
    rc |= put(d, R_STANDBYS, K_B, "", b);
    rc |= put(d, R_CLIENTS_POST, K_OP, "",
              "{\"client\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\","
              "\"verifier\":\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\",\"name\":\"c\",\"credit\":1000}");
    rc |= put(d, R_CLIENT_CREDIT, K_OP, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
              "{\"credit\":1000}");
    rc |= put(d, R_CLIENTS, K_OP, "", "");
    rc |= put(d, R_CLIENT, K_NONE, "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", "");
    snprintf(b, sizeof b,
             "{\"model\":\"%s\",\"session\":\"0000000000000001\",\"digest\":\"%s\",\"side\":\"out\","
             "\"manifest\":\"%s\",\"rank\":0,\"tokens\":12,\"client\":"
             "\"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\",\"proof\":\"00\"}",
             id, id, id);
    rc |= put(d, R_RECEIPTS, K_A, "", b);
    rc |= put(d, R_MODELS, K_NONE, "", "");
    rc |= put(d, R_MODEL, K_NONE, id, "");
    rc |= put(d, R_NODE, K_NONE, "0123456789abcdef", "");
    snprintf(b, sizeof b, "{\"model\":\"%s\",\"window\":0}", id);
    rc |= put(d, R_RELEASE, K_A, "", b);
    rc |= put(d, R_MODEL_DELETE, K_OP, id, "");
    rc |= put(d, R_PAGE, K_NONE, "", "");
    free(reg);
    cJSON_Delete(m);
    free(cat);
    gguf_catalog_free(c);
    gguf_file_free(gf);
    if (rc)
        return 1;
    printf("%d seeds\n", n_seeds);
    return 0;
}
