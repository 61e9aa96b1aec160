/* tool-seed-tok DIR: seed inputs for fuzz-tok (tests/fuzz.sh runs it). Each seed is one of
 * llama.cpp's tokenizer test strings (shared test data) prefixed by a vocabulary byte and a
 * flags byte, plus a few chat-template and broken-UTF-8 strings. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int n_written;

static void seed(const char *dir, unsigned char vocab, unsigned char flags, const char *s, size_t n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/seed-tok-%04d", dir, n_written++);
    FILE *f = fopen(path, "wb");
    if (!f)
        return;
    fputc(vocab, f);
    fputc(flags, f);
    fwrite(s, 1, n, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: tool-seed-tok DIR\n");
        return 2;
    }
    static const char *extra[] = {
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "<s>[INST] hi [/INST]</s>",
        "\xE2\x96\x81\xE2\x96\x81 x", "caf\xC3\xA9 \xFF\xFE \xE2\x82 \xF0\x9F\xA6", "<|endoftext|><unk>",
        "   \t\n\n  123456789 'S 'll y'all", "\xE4\xB8\xAD\xE6\x96\x87\xE3\x80\x80\xEA\xB0\x80"};
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        for (unsigned char v = 0; v < 5; v++)
            seed(argv[1], v, (unsigned char)(i & 15), extra[i], strlen(extra[i]));

    const char *root = getenv("KV_TESTDATA");
    char path[1024];
    snprintf(path, sizeof path, "%s/tokenizer/ggml-vocab-gpt-2.gguf.inp", root ? root : "../shared/testdata");
    FILE *f = fopen(path, "rb");
    if (f) {
        static char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        static const char sep[] = "\n__ggml_vocab_test__\n";
        char *p = buf, *e;
        unsigned k = 0;
        while ((e = strstr(p, sep))) {
            seed(argv[1], (unsigned char)(k % 5), (unsigned char)(k % 16), p, (size_t)(e - p));
            k++;
            p = e + sizeof sep - 1;
        }
    }
    printf("%d seeds\n", n_written);
    return 0;
}
