/* tool-seed-audit DIR — seed inputs for fuzz-audit: for each of its pending audits
 * (tests/lib/audit_fixture.h), the honest answer whole and in 3 parts (NUL between the
 * parts), behind the byte that picks the audit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "tests/lib/audit_fixture.h"
#include "tests/lib/fuzz_seed.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-audit DIR\n");
        return 2;
    }
    static struct af a;
    for (int k = 0; k < AF_KINDS; k++) {
        af_build(&a, (enum af_kind)k);
        uint8_t head = (uint8_t)k;
        char name[32], *whole = NULL, *parts = NULL;
        cJSON *w = af_answer(&a);
        whole = cJSON_PrintUnformatted(w);
        cJSON_Delete(w);
        size_t pl = 0;
        for (int i = 0; i < 3; i++) {
            cJSON *p = af_part(&a, i, 3);
            char *t = cJSON_PrintUnformatted(p);
            cJSON_Delete(p);
            size_t tl = t ? strlen(t) : 0;
            char *np = realloc(parts, pl + tl + 1);
            if (!t || !np) {
                fprintf(stderr, "tool-seed-audit: out of memory\n");
                return 1;
            }
            parts = np;
            if (i)
                parts[pl++] = 0;
            memcpy(parts + pl, t, tl);
            pl += tl;
            free(t);
        }
        if (!whole) {
            fprintf(stderr, "tool-seed-audit: out of memory\n");
            return 1;
        }
        snprintf(name, sizeof name, "%d-whole", k);
        fuzz_seed_put(argv[1], name, &head, 1, whole, strlen(whole));
        snprintf(name, sizeof name, "%d-parts", k);
        fuzz_seed_put(argv[1], name, &head, 1, parts, pl);
        free(whole);
        free(parts);
    }
    return 0;
}
