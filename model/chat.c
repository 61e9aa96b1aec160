/* chat.c — STAND-IN for the chat-template renderer (model_chat_render): only the ChatML
 * family, recognised from its "<|im_start|>" marker or asked for by name. The full renderer
 * (Llama 3, Llama 2, Mistral, Phi-3, Gemma, each as its Jinja template renders) replaces
 * this file with the same signature. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/util.h"

#define TEMPLATE_MAX (256u << 10)

/* Append s to *buf (length *len, capacity *cap): 0 or -ENOMEM. */
static int put(char **buf, size_t *len, size_t *cap, const char *s)
{
    size_t n = strlen(s);
    if (*len + n + 1 > *cap) {
        size_t nc = (*len + n + 1) * 2;
        char *nb = realloc(*buf, nc);
        if (!nb)
            return -ENOMEM;
        *buf = nb;
        *cap = nc;
    }
    memcpy(*buf + *len, s, n + 1);
    *len += n;
    return 0;
}

int model_chat_render(char **out, const struct gguf_file *g, const char *name,
                      const struct model_chat_msg *msgs, size_t n, bool add_assistant,
                      char *err, size_t errlen)
{
    *out = NULL;
    if (!name) {
        char *t = g ? malloc(TEMPLATE_MAX) : NULL;
        if (g && !t)
            return -ENOMEM;
        int rc = g ? gguf_get_str(g, "tokenizer.chat_template", t, TEMPLATE_MAX) : -ENOENT;
        bool chatml = rc == 0 && strstr(t, "<|im_start|>");
        if (!chatml) {
            if (rc < 0)
                util_seterr(err, errlen, "the model has no tokenizer.chat_template: name a "
                            "family with --chat-template");
            else
                util_seterr(err, errlen, "chat template not recognised (starts \"%.60s\"): "
                            "name a family with --chat-template", t);
            free(t);
            return -ENOTSUP;
        }
        free(t);
    } else if (strcmp(name, "chatml") != 0) {
        util_seterr(err, errlen, "chat template family '%s' unknown (this build knows chatml)",
                    name);
        return -ENOTSUP;
    }
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int rc = put(&buf, &len, &cap, "");
    for (size_t i = 0; i < n && rc == 0; i++) {
        if ((rc = put(&buf, &len, &cap, "<|im_start|>")) == 0 &&
            (rc = put(&buf, &len, &cap, msgs[i].role)) == 0 &&
            (rc = put(&buf, &len, &cap, "\n")) == 0 &&
            (rc = put(&buf, &len, &cap, msgs[i].content)) == 0)
            rc = put(&buf, &len, &cap, "<|im_end|>\n");
    }
    if (rc == 0 && add_assistant)
        rc = put(&buf, &len, &cap, "<|im_start|>assistant\n");
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    return 0;
}
