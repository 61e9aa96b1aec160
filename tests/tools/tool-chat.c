/* tool-chat — renders conversations with model_chat_render(_text) for tests/lib/chat_render.py,
 * which compares the output with python3-jinja2 rendering the template text itself.
 *
 * stdin, one JSON object:
 *   {"template": TEXT | "gguf": PATH, "name": NAME?, "bos": TEXT?, "eos": TEXT?,
 *    "cases": [{"messages": [{"role": R, "content": C}, ...], "add_generation_prompt": B}]}
 * stdout, one JSON object:
 *   {"family": NAME | null, "template": TEXT | null, "bos": TEXT | null, "eos": TEXT | null,
 *    "results": [{"text": TEXT} | {"error": MESSAGE, "rc": N}, ...]}
 * With "gguf", template/bos/eos are read from the file (and given back for Jinja); rendering
 * goes through model_chat_render. Exit 0, or 1 when the input is unusable. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/err.h"
#include "util/util.h"

static const char *str_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The text of the token whose id is at key, or NULL (malloc'd). */
static char *token_text(const struct gguf_file *g, const char *key)
{
    uint32_t id;
    const struct gguf_value *arr;
    if (gguf_get_u32(g, key, &id) < 0 || gguf_get_arr(g, "tokenizer.ggml.tokens", &arr) < 0 ||
        arr->v.arr.type != GGUF_V_STRING || id >= arr->v.arr.n)
        return NULL;
    const struct gguf_value *s = &arr->v.arr.items[id];
    char *t = malloc(s->v.str.len + 1);
    if (t) {
        memcpy(t, s->v.str.p, s->v.str.len);
        t[s->v.str.len] = 0;
    }
    return t;
}

static void add_str(cJSON *o, const char *key, const char *s)
{
    cJSON_AddItemToObject(o, key, s ? cJSON_CreateString(s) : cJSON_CreateNull());
}

int main(void)
{
    char *in = NULL, err[KV_ERR_MAX];
    size_t len;
    if (util_file_read_stream(stdin, "stdin", 64u << 20, &in, &len, err, sizeof err) < 0) {
        fprintf(stderr, "tool-chat: %s\n", err);
        return 1;
    }
    cJSON *req = cJSON_ParseWithLength(in, len);
    free(in);
    if (!req) {
        fprintf(stderr, "tool-chat: stdin is not JSON\n");
        return 1;
    }
    const char *path = str_of(req, "gguf"), *name = str_of(req, "name");
    const char *tmpl = str_of(req, "template");
    char *bos = NULL, *eos = NULL, *gtmpl = NULL;
    struct gguf_file *g = NULL;
    if (path) {
        if (gguf_file_open(&g, path, err, sizeof err) < 0) {
            fprintf(stderr, "tool-chat: %s: %s\n", path, err);
            cJSON_Delete(req);
            return 1;
        }
        bos = token_text(g, "tokenizer.ggml.bos_token_id");
        eos = token_text(g, "tokenizer.ggml.eos_token_id");
        const struct gguf_kv *kv = gguf_kv_find(g, "tokenizer.chat_template");
        if (kv && kv->val.type == GGUF_V_STRING && (gtmpl = malloc(kv->val.v.str.len + 1))) {
            memcpy(gtmpl, kv->val.v.str.p, kv->val.v.str.len);
            gtmpl[kv->val.v.str.len] = 0;
        }
        tmpl = gtmpl;
    } else {
        bos = str_of(req, "bos") ? strdup(str_of(req, "bos")) : NULL;
        eos = str_of(req, "eos") ? strdup(str_of(req, "eos")) : NULL;
    }
    cJSON *res = cJSON_CreateObject(), *results = cJSON_CreateArray();
    const char *fam = NULL;
    if (tmpl && model_chat_family(tmpl, &fam) < 0)
        fam = NULL;
    add_str(res, "family", fam);
    add_str(res, "template", tmpl);
    add_str(res, "bos", bos);
    add_str(res, "eos", eos);
    cJSON_AddItemToObject(res, "results", results);

    const cJSON *c;
    cJSON_ArrayForEach(c, cJSON_GetObjectItemCaseSensitive(req, "cases")) {
        const cJSON *ms = cJSON_GetObjectItemCaseSensitive(c, "messages"), *m;
        size_t n = (size_t)cJSON_GetArraySize(ms), i = 0;
        struct model_chat_msg *msgs = calloc(n ? n : 1, sizeof *msgs);
        if (!msgs)
            return 1;
        cJSON_ArrayForEach(m, ms) {
            msgs[i].role = str_of(m, "role");
            msgs[i].content = str_of(m, "content");
            i++;
        }
        bool gen = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(c, "add_generation_prompt"));
        char *out = NULL;
        err[0] = 0;
        int rc = path ? model_chat_render(&out, g, name, msgs, n, gen, err, sizeof err)
                      : model_chat_render_text(&out, tmpl, name, bos, eos, msgs, n, gen, err,
                                               sizeof err);
        cJSON *r = cJSON_CreateObject();
        if (rc == 0) {
            add_str(r, "text", out);
            cJSON_AddBoolToObject(r, "has_bos", g ? model_chat_has_bos(g, out) : false);
        } else {
            add_str(r, "error", err);
            cJSON_AddNumberToObject(r, "rc", rc);
        }
        cJSON_AddItemToArray(results, r);
        free(out);
        free(msgs);
    }
    char *s = cJSON_PrintUnformatted(res);
    if (s)
        puts(s);
    free(s);
    cJSON_Delete(res);
    cJSON_Delete(req);
    free(bos);
    free(eos);
    free(gtmpl);
    gguf_file_free(g);
    return s ? 0 : 1;
}
