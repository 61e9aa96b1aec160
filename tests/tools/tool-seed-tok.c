/* tool-seed-tok DIR: seed inputs for fuzz-tok (tests/fuzz.sh runs it). Each seed is one of
 * llama.cpp's tokenizer test strings (shared test data) prefixed by a vocabulary byte and a
 * flags byte, plus a few chat-template and broken-UTF-8 strings; and two small vocabulary-only
 * GGUF headers (SPM, BPE) behind a 0xF0 byte for the metadata mode. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "tests/lib/fuzz_seed.h"

static int n_written;

static void seed(const char *dir, unsigned char vocab, unsigned char flags, const char *s, size_t n)
{
    char name[32];
    unsigned char head[2] = {vocab, flags};
    snprintf(name, sizeof name, "tok-%04d", n_written++);
    fuzz_seed_put(dir, name, head, 2, s, n);
}

/* A small vocabulary GGUF written with the project's writer, then stored behind 0xF0. */
static void seed_vocab(const char *dir, bool bpe)
{
    static char toks[300][16];
    const char *tp[300];
    float scores[300];
    int32_t types[300];
    int n = 0;
    tp[n] = "<unk>"; types[n] = 2; scores[n++] = 0;
    tp[n] = "<s>"; types[n] = 3; scores[n++] = 0;
    tp[n] = "</s>"; types[n] = 3; scores[n++] = 0;
    for (int b = 0; b < 256; b++, n++) {
        if (bpe) {
            /* GPT-2 byte alphabet: printable Latin-1 as itself, the rest from U+0100 */
            static int k;
            unsigned cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? (unsigned)b : 256u + (unsigned)k++;
            if (cp < 0x80) { toks[n][0] = (char)cp; toks[n][1] = 0; }
            else { toks[n][0] = (char)(0xC0 | (cp >> 6)); toks[n][1] = (char)(0x80 | (cp & 0x3F)); toks[n][2] = 0; }
            types[n] = 1;
        } else {
            snprintf(toks[n], sizeof toks[n], "<0x%02X>", b);
            types[n] = 6;
        }
        tp[n] = toks[n];
        scores[n] = 0;
    }
    static const char *words[] = {"he", "ll", "hell", "hello", "\xE2\x96\x81h", "\xC4\xA0w", "or", "ld", "wor"};
    for (size_t i = 0; i < sizeof words / sizeof words[0] && n < 300; i++, n++) {
        tp[n] = words[i];
        types[n] = 1;
        scores[n] = -(float)i;
    }
    struct gguf_writer *w = NULL;
    if (gguf_writer_new(&w))
        return;
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "general.name", bpe ? "seed-bpe" : "seed-spm");
    gguf_writer_set_str(w, "tokenizer.ggml.model", bpe ? "gpt2" : "llama");
    if (bpe) {
        gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
        const char *merges[] = {"h e", "l l", "he ll", "hell o", "w o", "wo r", "o r", "l d"};
        gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", 8, merges);
    }
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (uint64_t)n, tp);
    gguf_writer_set_arr(w, "tokenizer.ggml.scores", GGUF_V_F32, (uint64_t)n, scores);
    gguf_writer_set_arr(w, "tokenizer.ggml.token_type", GGUF_V_I32, (uint64_t)n, types);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    char tmp[1024], err[256];
    snprintf(tmp, sizeof tmp, "%s/.seed-vocab.gguf", dir);
    int rc = gguf_writer_write(w, tmp, err, sizeof err);
    gguf_writer_free(w);
    if (rc)
        return;
    FILE *f = fopen(tmp, "rb");
    static char buf[1 << 16];
    size_t len = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f)
        fclose(f);
    remove(tmp);
    if (len)
        seed(dir, 0xF0, 0, buf, len);
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
    seed_vocab(argv[1], false);
    seed_vocab(argv[1], true);
    printf("%d seeds\n", n_written);
    return 0;
}
