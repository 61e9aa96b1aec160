/* tool-seed-api DIR — seed inputs for fuzz-api: valid and near-valid request bodies, each
 * behind a mode byte (fuzz-api.c: route in the low 3 bits, the stand-in generator's answer in
 * the next 2, an immediate half-close in bit 5). */
#include <stdio.h>
#include <string.h>

#include "tests/lib/fuzz_seed.h"

struct seed {
    unsigned char mode;
    const char *body;
};

static const struct seed seeds[] = {
    {0, "{\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}"},
    {0, "{\"prompt\":[1,2,3,4],\"max_tokens\":5,\"stop\":[\"</stop>\",\"\\n\"],\"logprobs\":3}"},
    {0, "{\"prompt\":\"Hi\",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"},
    {0, "{\"prompt\":\"Hi\",\"top_k\":40,\"top_p\":0.9,\"min_p\":0.05,\"seed\":7,\"temperature\":0.8,"
        "\"frequency_penalty\":0.5,\"presence_penalty\":0.2,\"repeat_penalty\":1.1}"},
    {0, "{\"prompt\":\"Hi\",\"draft\":\"lookup\",\"draft_max\":4,\"ignore_eos\":true,\"max_tokens\":6}"},
    {1, "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"}],"
        "\"max_tokens\":4}"},
    {1, "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"}],\"stream\":true,\"logprobs\":true,"
        "\"top_logprobs\":2}"},
    {1, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"}]}],\"stop\":\"top>\"}"},
    {2 | 1 << 3, "{\"prompt\":\"busy\"}"},
    {3 | 2 << 3, "{\"messages\":[{\"role\":\"user\",\"content\":\"fails\"}],\"stream\":true}"},
    {0 | 1 << 5, "{\"prompt\":\"gone\",\"stream\":true,\"max_tokens\":100}"},
    {4, ""},
    {5, ""},
    {6, ""},
    {0, "{\"prompt\":\"\",\"max_tokens\":-1,\"temperature\":1e999}"},
};

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-api DIR\n");
        return 2;
    }
    int n = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof *seeds; i++) {
        char name[32];
        snprintf(name, sizeof name, "%zu", i);
        fuzz_seed_put(argv[1], name, &seeds[i].mode, 1, seeds[i].body, strlen(seeds[i].body));
        n++;
    }
    printf("%d seeds\n", n);
    return 0;
}
