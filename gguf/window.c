/* window.c — stage windows (docs/design.md, "Windows and mini-GGUFs"): which tensors a layer
 * window holds, and the stage mini-GGUF writer (all source metadata, the window's tensors with
 * their original names and identical bytes, kvasir.window.first/last, kvasir.source.sha256). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "gguf/gguf.h"
#include "gguf/internal.h"
#include "util/util.h"

int gguf_block_count(const struct gguf_file *f, uint32_t *out)
{
    char arch[64], key[96];
    int rc = gguf_get_str(f, "general.architecture", arch, sizeof arch);
    if (rc)
        return rc;
    snprintf(key, sizeof key, "%s.block_count", arch);
    return gguf_get_u32(f, key, out);
}

int gguf_window_get(const struct gguf_file *f, uint32_t *first, uint32_t *last)
{
    uint32_t a, b;
    if (gguf_get_u32(f, "kvasir.window.first", &a) || gguf_get_u32(f, "kvasir.window.last", &b))
        return -ENOENT;
    *first = a;
    *last = b;
    return 0;
}

static bool has_prefix(const char *s, const char *p)
{
    return !strncmp(s, p, strlen(p));
}

int gguf_main_layers(const struct gguf_file *f, uint32_t *out)
{
    uint32_t n, nextn = 0;
    int rc = gguf_block_count(f, &n);
    if (rc)
        return rc;
    char arch[64], key[96];
    if (gguf_get_str(f, "general.architecture", arch, sizeof arch) == 0) {
        snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
        if (gguf_get_u32(f, key, &nextn) == 0 && nextn < n)
            n -= nextn;
    }
    *out = n;
    return 0;
}

bool gguf_window_wants(const char *name, uint32_t first, uint32_t last, uint32_t n_layers,
                       uint32_t n_block, bool has_output)
{
    bool tail = last >= n_layers;   /* the last window: the head and the MTP blocks */
    int l = gguf_tensor_layer(name);
    if (l >= 0) /* blocks past the main pass (multi-token prediction) go with the head */
        return (uint32_t)l < n_layers ? (uint32_t)l >= first && (uint32_t)l < last : tail;
    /* Rank 0 embeds the prompt; the last rank reads token_embd as its head when the model
     * ties them, and its MTP drafter embeds each token it samples. */
    if (has_prefix(name, "token_embd."))
        return first == 0 || (tail && (!has_output || n_block > n_layers));
    if (has_prefix(name, "output_norm.") || has_prefix(name, "output."))
        return tail;
    return true; /* shared tensors such as rope_freqs.weight: every stage needs them */
}

/* SHA-256 of a whole file as 64 lowercase hex digits + NUL (OpenSSL EVP). */
static int sha256_file(const char *path, char hex[65], char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        util_seterr(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t bufsz = 1 << 20;
    unsigned char *buf = malloc(bufsz);
    int rc = 0;
    if (!ctx || !buf || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        rc = -ENOMEM;
        util_seterr(err, errlen, "sha256: cannot set up a digest");
        goto out;
    }
    for (;;) {
        ssize_t n = read(fd, buf, bufsz);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            util_seterr(err, errlen, "%s: read: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0)
            break;
        EVP_DigestUpdate(ctx, buf, (size_t)n);
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    util_hex_encode(md, 32, hex);
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    close(fd);
    return rc;
}

/* The keys a window writer sets itself: left out when the source is a window too. */
static bool is_window_key(const char *key, void *ud)
{
    (void)ud;
    return !strcmp(key, "kvasir.window.first") || !strcmp(key, "kvasir.window.last") ||
           !strcmp(key, "kvasir.source.sha256");
}

int gguf_window_write(struct gguf_file *src, const struct gguf_window_opts *o, const char *path,
                      char *err, size_t errlen)
{
    struct gguf_writer *w;
    int rc = gguf_window_writer(&w, src, o, err, errlen);
    if (rc)
        return rc;
    rc = gguf_writer_write(w, path, err, errlen);
    gguf_writer_free(w);
    return rc;
}

int gguf_window_writer(struct gguf_writer **out, struct gguf_file *src,
                       const struct gguf_window_opts *o, char *err, size_t errlen)
{
    uint32_t n_block, n_layers;
    int rc = gguf_block_count(src, &n_block);
    if (rc || (rc = gguf_main_layers(src, &n_layers))) {
        util_seterr(err, errlen, "window: the model has no <general.architecture>.block_count");
        return rc;
    }
    if (o->first >= o->last || o->last > n_block || o->first >= n_layers) {
        util_seterr(err, errlen, "window: layers [%u, %u) not a non-empty range within [0, %u) starting below %u",
                     o->first, o->last, n_block, n_layers);
        return -EINVAL;
    }
    /* A window of a window: only layers it holds can be taken. */
    uint32_t sf, sl;
    if (gguf_window_get(src, &sf, &sl) == 0 && (o->first < sf || o->last > sl)) {
        util_seterr(err, errlen, "window: layers [%u, %u) not inside the source window [%u, %u)",
                     o->first, o->last, sf, sl);
        return -EINVAL;
    }
    if (o->source_sha256_hex && strlen(o->source_sha256_hex) != 64) {
        util_seterr(err, errlen, "window: source sha256 '%s' is not 64 hex digits", o->source_sha256_hex);
        return -EINVAL;
    }
    char hex[65];
    const char *sha = o->source_sha256_hex;
    if (!sha && gguf_get_str(src, "kvasir.source.sha256", hex, sizeof hex) == 0 && strlen(hex) == 64)
        sha = hex; /* slicing a window again: keep pointing at the original model */
    if (!sha) {
        if (gguf_file_path(src) == NULL) {
            util_seterr(err, errlen, "window: source parsed from memory; give its sha256");
            return -EINVAL;
        }
        if ((rc = sha256_file(gguf_file_path(src), hex, err, errlen)))
            return rc;
        sha = hex;
    }
    bool has_output = gguf_tensor_find(src, "output.weight") != NULL;

    struct gguf_writer *w;
    if ((rc = gguf_writer_new(&w)))
        return rc;
    rc = gguf_writer_copy_kv(w, src, is_window_key, NULL, err, errlen);
    if (!rc)
        rc = gguf_writer_set_u32(w, "kvasir.window.first", o->first);
    if (!rc)
        rc = gguf_writer_set_u32(w, "kvasir.window.last", o->last);
    if (!rc)
        rc = gguf_writer_set_str(w, "kvasir.source.sha256", sha);
    if (rc && err && !err[0])
        util_seterr(err, errlen, "window: setting metadata: %s", strerror(-rc));
    for (uint64_t i = 0; i < gguf_tensor_count(src) && !rc; i++) {
        const struct gguf_tensor *t = gguf_tensor_at(src, i);
        if (!gguf_window_wants(t->name, o->first, o->last, n_layers, n_block, has_output))
            continue;
        rc = gguf_writer_add_tensor_copy(w, src, t);
        if (rc)
            util_seterr(err, errlen, "window: adding tensor '%s': %s", t->name, strerror(-rc));
    }
    if (rc) {
        gguf_writer_free(w);
        return rc;
    }
    *out = w;
    return 0;
}
