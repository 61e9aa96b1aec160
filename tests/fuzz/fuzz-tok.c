/* fuzz-tok: libFuzzer target for the tokenizers. The first input byte picks a vocabulary
 * (SPM with and without byte tokens, byte-level BPE with the qwen2, default and deepseek-llm
 * pre-tokenizers), the second the flags; the rest is the text. A first byte of 0xF0 or more
 * makes what follows the flags byte a GGUF header instead: its metadata must load as a vocabulary or be refused,
 * and a loaded one must tokenise and decode. Tokenising must succeed with
 * every id in range, whole-sequence and streaming decoding must succeed, every streamed chunk
 * must be whole UTF-8, and for the byte-level BPE vocabulary without clean-up valid UTF-8 text
 * must decode back to itself.
 * fuzz-modules: util wtype gguf model/tok */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/err.h"

static const char *const files[] = {
    "models/stories260K.gguf",              /* SPM with byte tokens */
    "models/TinyStories-656K-Q8_0.gguf",    /* SPM without byte tokens, multi-word pieces */
    "models/synth-qwen2-bpe1024-q8_0.gguf", /* BPE qwen2, every byte a token */
    "tokenizer/ggml-vocab-gpt-neox.gguf",   /* BPE default pre-tokenizer, user-defined tokens */
    "tokenizer/ggml-vocab-deepseek-llm.gguf",
};
#define NV (sizeof files / sizeof files[0])
static struct model_vocab *vocab[NV];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc; (void)argv;
    const char *root = getenv("KV_TESTDATA");
    for (size_t i = 0; i < NV; i++) {
        char path[1024], err[256];
        snprintf(path, sizeof path, "%s/%s", root ? root : "../shared/testdata", files[i]);
        struct gguf_file *f = NULL;
        if (gguf_file_open(&f, path, err, sizeof err) || model_vocab_load(&vocab[i], f, err, sizeof err)) {
            fprintf(stderr, "fuzz-tok: %s: %s\n", path, err);
            abort();
        }
        gguf_file_free(f);
    }
    return 0;
}

static int utf8_whole(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        size_t k = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 :
                   c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!k || i + k > n)
            return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80)
                return 0;
        if (k == 3 && ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F)))
            return 0;
        if (k == 4 && ((c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F)))
            return 0;
        i += k;
    }
    return 1;
}

/* Hostile metadata: load, then exercise what loaded. */
static void fuzz_metadata(const uint8_t *data, size_t size)
{
    struct gguf_file *f = NULL;
    struct model_vocab *v = NULL;
    size_t need = 0;
    char err[KV_ERR_MAX];
    if (gguf_file_parse(&f, data, size, size, &need, err, sizeof err))
        return;
    if (model_vocab_load(&v, f, err, sizeof err) == 0) {
        static const char text[] = "Hello world, <s> 123 \xe4\xbd\xa0\xe5\xa5\xbd \xff!";
        int32_t ids[256];
        size_t n;
        if (model_tokenize(v, text, sizeof text - 1, true, true, ids, 256, &n) != 0)
            abort();
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || (uint32_t)ids[i] >= model_vocab_n_tokens(v))
                abort();
        char buf[4096];
        size_t dl;
        int rc = model_detokenize(v, ids, n, MODEL_DETOK_SPECIAL, buf, sizeof buf, &dl);
        if (rc && rc != -ENOSPC)
            abort();
        for (int32_t id = 0; id < (int32_t)model_vocab_n_tokens(v) && id < 4096; id++) {
            size_t pl;
            if (!model_token_piece(v, id, true, &pl))
                abort();
        }
        model_vocab_free(v);
    } else if (!err[0]) {
        abort(); /* a refusal must say why */
    }
    gguf_file_free(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    if (data[0] >= 0xF0) {
        fuzz_metadata(data + 2, size - 2);
        return 0;
    }
    const struct model_vocab *v = vocab[data[0] % NV];
    bool add_special = data[1] & 1, parse_special = data[1] & 2, special = data[1] & 4;
    unsigned dflags = (special ? MODEL_DETOK_SPECIAL : 0) | (data[1] & 8 ? MODEL_DETOK_CLEAN_SPACES : 0);
    const char *text = (const char *)data + 2;
    size_t len = size - 2;

    size_t cap = len + 4, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    int rc = model_tokenize(v, text, len, add_special, parse_special, ids, cap, &n);
    if (rc == -ENOSPC) {
        free(ids);
        cap = n;
        ids = malloc((cap ? cap : 1) * sizeof *ids);
        rc = model_tokenize(v, text, len, add_special, parse_special, ids, cap, &n);
    }
    if (rc)
        abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= model_vocab_n_tokens(v))
            abort();

    size_t dl = 0, dcap = 4 * len + 64;
    char *dec = malloc(dcap);
    rc = model_detokenize(v, ids, n, dflags, dec, dcap, &dl);
    if (rc == -ENOSPC) {
        free(dec);
        dcap = dl;
        dec = malloc(dcap ? dcap : 1);
        rc = model_detokenize(v, ids, n, dflags, dec, dcap, &dl);
    }
    if (rc)
        abort();
    if (data[0] % NV == 2 && !add_special && !parse_special && !(data[1] & 8) && utf8_whole(data + 2, len) &&
        (dl != len || memcmp(dec, text, len)))
        abort(); /* byte-level BPE without clean-up must round-trip valid UTF-8 */

    struct model_detok *d = NULL;
    if (model_detok_new(&d, v, special, true))
        abort();
    for (size_t i = 0; i <= n; i++) {
        const char *t;
        size_t tl;
        rc = i < n ? model_detok_push(d, ids[i], &t, &tl) : model_detok_flush(d, &t, &tl);
        if (rc || !utf8_whole((const unsigned char *)t, tl))
            abort();
    }
    model_detok_free(d);
    free(dec);
    free(ids);
    return 0;
}
