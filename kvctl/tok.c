/* kvctl/tok.c — kvctl tokenize / detokenize: the model's own vocabulary (model.h
 * [tokenizer]) on text from the command line, a file or standard input. */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "kvctl/kvctl.h"
#include "model/model.h"
#include "util/err.h"

#define KVCTL_TOK_MAX_INPUT (256u << 20)   /* bytes of text; the tokenizer's own cap */
#define MAX_IDS   (1u << 24)

static int open_vocab(const char *cmd, const char *path, struct gguf_file **f,
                      struct model_vocab **v)
{
    char err[KV_ERR_MAX] = "";
    int rc = gguf_file_open(f, path, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvctl %s: %s\n", cmd, err);   /* err names the file */
        return rc;
    }
    rc = model_vocab_load(v, *f, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvctl %s: %s: %s\n", cmd, path, err);
        gguf_file_free(*f);
        *f = NULL;
    }
    return rc;
}

/* A piece as a quoted, readable string: printable ASCII and whole UTF-8 characters as they
 * are, quotes and backslashes escaped, everything else as \n \t \r or \xNN. */
static void put_piece(FILE *out, const char *p, size_t n)
{
    fputc('\'', out);
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
        bool whole = k > 1 && i + k <= n;
        for (size_t j = 1; whole && j < k; j++)
            whole = ((unsigned char)p[i + j] & 0xC0) == 0x80;
        if (whole) {
            fwrite(p + i, 1, k, out);
            i += k;
            continue;
        }
        if (c == '\n') fputs("\\n", out);
        else if (c == '\t') fputs("\\t", out);
        else if (c == '\r') fputs("\\r", out);
        else if (c == '\'' || c == '\\') fprintf(out, "\\%c", c);
        else if (c >= 0x20 && c < 0x7F) fputc(c, out);
        else fprintf(out, "\\x%02x", c);
        i++;
    }
    fputc('\'', out);
}

static void tokenize_usage(FILE *out)
{
    fprintf(out,
        "usage: kvctl tokenize -m FILE [--ids] [--special] [--no-bos] (TEXT | -f FILE | -f -)\n"
        "  -m, --model FILE   a GGUF with tokenizer metadata (a full model or a vocab-only file)\n"
        "  -f, --file FILE    read the text from FILE, '-' for standard input (byte for byte)\n"
        "  --ids              print only the ids, space-separated, on one line\n"
        "  --special          turn special-token text such as <|im_start|> into those tokens\n"
        "  --no-bos           do not add the BOS/EOS tokens the vocabulary asks for\n"
        "Without --ids, one line per token: the id and its piece in quotes.\n");
}

int kvctl_cmd_tokenize(int argc, char **argv)
{
    enum { OPT_IDS = 256, OPT_SPECIAL, OPT_NOBOS };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"file", required_argument, 0, 'f'},
        {"ids", no_argument, 0, OPT_IDS}, {"special", no_argument, 0, OPT_SPECIAL},
        {"no-bos", no_argument, 0, OPT_NOBOS}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *path = NULL, *file = NULL;
    bool ids_only = false, special = false, add_special = true;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:f:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case 'f': file = optarg; break;
        case OPT_IDS: ids_only = true; break;
        case OPT_SPECIAL: special = true; break;
        case OPT_NOBOS: add_special = false; break;
        case 'h': tokenize_usage(stdout); return 0;
        default: tokenize_usage(stderr); return 2;
        }
    }
    if (!path || (file ? optind != argc : optind != argc - 1)) {
        tokenize_usage(stderr);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    if (file) { /* the whole file, or stdin for "-", byte for byte */
        char err[600];
        int rc = strcmp(file, "-")
                     ? util_file_read(file, KVCTL_TOK_MAX_INPUT, &text, &len, err, sizeof err)
                     : util_file_read_stream(stdin, file, KVCTL_TOK_MAX_INPUT, &text, &len, err, sizeof err);
        if (rc == -EFBIG)
            fprintf(stderr, "kvctl tokenize: %s: more than %u bytes\n", file, KVCTL_TOK_MAX_INPUT);
        else if (rc)
            fprintf(stderr, "kvctl tokenize: %s\n", err);
        if (rc)
            return 1;
    } else {
        len = strlen(argv[optind]);
        if (len > KVCTL_TOK_MAX_INPUT) {
            fprintf(stderr, "kvctl tokenize: text longer than %u bytes\n", KVCTL_TOK_MAX_INPUT);
            return 1;
        }
        text = malloc(len + 1);
        if (!text)
            return 1;
        memcpy(text, argv[optind], len);
    }
    struct gguf_file *f = NULL;
    struct model_vocab *v = NULL;
    int ret = 1;
    int32_t *ids = NULL;
    if (open_vocab("tokenize", path, &f, &v))
        goto done;
    size_t n = 0, cap = len + 4;
    ids = malloc(cap * sizeof *ids);
    int rc = ids ? model_tokenize(v, text, len, add_special, special, ids, cap, &n) : -ENOMEM;
    if (rc == -ENOSPC) {
        free(ids);
        cap = n;
        ids = malloc(cap * sizeof *ids);
        rc = ids ? model_tokenize(v, text, len, add_special, special, ids, cap, &n) : -ENOMEM;
    }
    if (rc) {
        fprintf(stderr, "kvctl tokenize: %s\n", strerror(-rc));
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids[i]);
            continue;
        }
        size_t pl;
        const char *p = model_token_piece(v, ids[i], true, &pl);
        printf("%6d ", ids[i]);
        put_piece(stdout, p, pl);
        putchar('\n');
    }
    if (ids_only)
        putchar('\n');
    ret = fflush(stdout) ? 1 : 0;
done:
    free(ids);
    free(text);
    model_vocab_free(v);
    gguf_file_free(f);
    return ret;
}

static void detokenize_usage(FILE *out)
{
    fprintf(out,
        "usage: kvctl detokenize -m FILE [--special] [--clean-spaces] IDS...\n"
        "  -m, --model FILE   a GGUF with tokenizer metadata\n"
        "  --special          print control tokens (<s>, <|im_end|>, ...) instead of dropping them\n"
        "  --clean-spaces     drop spaces before punctuation where the vocabulary asks for it, as\n"
        "                     llama.cpp's llama_detokenize does (the text may then differ from the input)\n"
        "IDS: token ids as separate arguments or one argument separated by spaces or commas.\n"
        "A leading BOS / trailing EOS that the vocabulary adds is dropped and the SPM leading space\n"
        "stripped, so the ids of a tokenised text print that text; a newline follows.\n");
}

int kvctl_cmd_detokenize(int argc, char **argv)
{
    enum { OPT_SPECIAL = 256, OPT_CLEAN };
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'}, {"special", no_argument, 0, OPT_SPECIAL},
        {"clean-spaces", no_argument, 0, OPT_CLEAN}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    const char *path = NULL;
    unsigned flags = 0;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:h", opts, NULL)) != -1) {
        switch (c) {
        case 'm': path = optarg; break;
        case OPT_SPECIAL: flags |= MODEL_DETOK_SPECIAL; break;
        case OPT_CLEAN: flags |= MODEL_DETOK_CLEAN_SPACES; break;
        case 'h': detokenize_usage(stdout); return 0;
        default: detokenize_usage(stderr); return 2;
        }
    }
    if (!path || optind >= argc) {
        detokenize_usage(stderr);
        return 2;
    }
    size_t cap = 0;
    for (int i = optind; i < argc; i++)
        for (const char *p = argv[i]; *p; p++)
            cap += 1;
    if (cap > MAX_IDS) {
        fprintf(stderr, "kvctl detokenize: more than %u ids\n", MAX_IDS);
        return 2;
    }
    int32_t *ids = malloc((cap + 1) * sizeof *ids);
    size_t n = 0;
    if (!ids)
        return 1;
    for (int i = optind; i < argc; i++) {
        const char *p = argv[i];
        while (*p) {
            while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n')
                p++;
            if (!*p)
                break;
            char *end;
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno || x < 0 || x > INT32_MAX ||
                (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n')) {
                fprintf(stderr, "kvctl detokenize: '%s' is not a list of token ids\n", argv[i]);
                free(ids);
                return 2;
            }
            ids[n++] = (int32_t)x;
            p = end;
        }
    }
    struct gguf_file *f = NULL;
    struct model_vocab *v = NULL;
    char *buf = NULL;
    int ret = 1;
    if (open_vocab("detokenize", path, &f, &v))
        goto done;
    const int32_t *s = ids;
    size_t m = n;
    if (m && model_vocab_add_bos(v) && s[0] == model_vocab_bos(v)) {
        s++;
        m--;
    }
    if (m && model_vocab_add_eos(v) && s[m - 1] == model_vocab_eos(v))
        m--;
    size_t len = 0, bcap = 256;
    buf = malloc(bcap);
    int rc = buf ? model_detokenize(v, s, m, flags, buf, bcap, &len) : -ENOMEM;
    if (rc == -ENOSPC) {
        free(buf);
        bcap = len;
        buf = malloc(bcap ? bcap : 1);
        rc = buf ? model_detokenize(v, s, m, flags, buf, bcap, &len) : -ENOMEM;
    }
    if (rc == -ERANGE) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= (int32_t)model_vocab_n_tokens(v)) {
                fprintf(stderr, "kvctl detokenize: id %d out of range (vocabulary has %u tokens)\n",
                        ids[i], model_vocab_n_tokens(v));
                break;
            }
        goto done;
    }
    if (rc) {
        fprintf(stderr, "kvctl detokenize: %s\n", strerror(-rc));
        goto done;
    }
    fwrite(buf, 1, len, stdout);
    putchar('\n');
    ret = fflush(stdout) ? 1 : 0;
done:
    free(buf);
    free(ids);
    model_vocab_free(v);
    gguf_file_free(f);
    return ret;
}
