/* ident.c — the node identity (Ed25519 via OpenSSL), hex helpers and file hashing. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <openssl/pem.h>

#include "net/net.h"

struct net_identity {
    EVP_PKEY *key;
    uint8_t pub[32];
};

static int mkdir_p(const char *dir)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", dir) >= (int)sizeof tmp)
        return -ENAMETOOLONG;
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int net_identity_load(struct net_identity **out, const char *dir, char *err, size_t errlen)
{
    char path[4096];
    int rc = mkdir_p(dir);
    if (rc < 0) {
        snprintf(err, errlen, "state dir %s: %s", dir, strerror(-rc));
        return rc;
    }
    if (snprintf(path, sizeof path, "%s/node.key", dir) >= (int)sizeof path) {
        snprintf(err, errlen, "state dir path too long");
        return -ENAMETOOLONG;
    }
    EVP_PKEY *key = NULL;
    FILE *f = fopen(path, "r");
    if (f) {
        key = PEM_read_PrivateKey(f, NULL, NULL, NULL);
        fclose(f);
        if (!key || EVP_PKEY_get_base_id(key) != EVP_PKEY_ED25519) {
            EVP_PKEY_free(key);
            snprintf(err, errlen, "%s: not an Ed25519 private key (PEM)", path);
            return -EINVAL;
        }
    } else if (errno == ENOENT) {
        key = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
        if (!key) {
            snprintf(err, errlen, "Ed25519 key generation failed");
            return -EIO;
        }
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
        int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        FILE *w = fd >= 0 ? fdopen(fd, "w") : NULL;
        if (!w || PEM_write_PrivateKey(w, key, NULL, NULL, 0, NULL, NULL) != 1 ||
            fflush(w) != 0 || fsync(fileno(w)) != 0) {
            int e = errno ? errno : EIO;
            if (w) fclose(w); else if (fd >= 0) close(fd);
            unlink(tmp);
            EVP_PKEY_free(key);
            snprintf(err, errlen, "writing %s: %s", tmp, strerror(e));
            return -e;
        }
        fclose(w);
        /* link() fails if another process created the key first: then use theirs. */
        if (link(tmp, path) < 0) {
            int e = errno;
            unlink(tmp);
            EVP_PKEY_free(key);
            if (e == EEXIST)
                return net_identity_load(out, dir, err, errlen);
            snprintf(err, errlen, "creating %s: %s", path, strerror(e));
            return -e;
        }
        unlink(tmp);
    } else {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    struct net_identity *id = calloc(1, sizeof *id);
    size_t n = 32;
    if (!id || EVP_PKEY_get_raw_public_key(key, id->pub, &n) != 1 || n != 32) {
        free(id);
        EVP_PKEY_free(key);
        snprintf(err, errlen, "%s: cannot read the public key", path);
        return -EINVAL;
    }
    id->key = key;
    *out = id;
    return 0;
}

void net_identity_free(struct net_identity *id)
{
    if (!id)
        return;
    EVP_PKEY_free(id->key);
    free(id);
}

const uint8_t *net_identity_pub(const struct net_identity *id)
{
    return id->pub;
}

int net_identity_sign(const struct net_identity *id, const void *msg, size_t len, uint8_t sig[64])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t slen = 64;
    int ok = ctx && EVP_DigestSignInit(ctx, NULL, NULL, NULL, id->key) == 1 &&
             EVP_DigestSign(ctx, sig, &slen, msg, len) == 1 && slen == 64;
    EVP_MD_CTX_free(ctx);
    return ok ? 0 : -EIO;
}

bool net_sig_verify(const uint8_t pub[32], const void *msg, size_t len, const uint8_t sig[64])
{
    EVP_PKEY *k = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, 32);
    if (!k)
        return false;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, k) == 1 &&
              EVP_DigestVerify(ctx, sig, 64, msg, len) == 1;
    EVP_MD_CTX_free(ctx);
    EVP_PKEY_free(k);
    return ok;
}
