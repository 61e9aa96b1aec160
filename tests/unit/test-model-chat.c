/* test-model-chat — chat templates (model/chat.c) at the C level: a GGUF carrying a template
 * is recognised and rendered with its own BOS/EOS texts, the BOS rule, unknown templates and
 * names refused with what was wrong named, recognition robust to how a template spells its
 * literals, refused conversations. Byte-for-byte agreement with Jinja for every family is
 * tests/integration/test-model-chat.sh (tests/lib/chat_render.py). */
#include "tests/lib/t.h"
#include "tests/lib/gguf_build.h"

#include "gguf/gguf.h"
#include "model/model.h"
#include "util/err.h"

#define QWEN_TMPL "{% for message in messages %}{% if loop.first and messages[0]['role'] != " \
    "'system' %}{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"     \
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "          \
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>"       \
    "assistant\\n' }}{% endif %}"

#define LLAMA2_TMPL "{% if messages[0]['role'] == 'system' %}{% set loop_messages = " \
    "messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set "  \
    "loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message " \
    "in loop_messages %}{% if loop.index0 == 0 and system_message != false %}{% set "   \
    "content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}" \
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == " \
    "'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "       \
    "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"    \
    "{% endif %}{% endfor %}"

/* A GGUF with a three-token vocabulary (<unk>, BOS_TEXT, EOS_TEXT; BOS id 1, EOS id 2) and,
 * when tmpl != NULL, tokenizer.chat_template. */
static struct gguf_file *chat_gguf(const char *tmpl, const char *bos, const char *eos)
{
    struct util_buf b = {0};
    gb_put(&b, "GGUF", 4);
    gb_u32(&b, 3);
    gb_u64(&b, 0);               /* tensors */
    gb_u64(&b, tmpl ? 4 : 3);    /* key/values */
    gb_str(&b, "tokenizer.ggml.tokens");
    gb_u32(&b, GGUF_V_ARRAY);
    gb_u32(&b, GGUF_V_STRING);
    gb_u64(&b, 3);
    gb_str(&b, "<unk>");
    gb_str(&b, bos);
    gb_str(&b, eos);
    gb_str(&b, "tokenizer.ggml.bos_token_id");
    gb_u32(&b, GGUF_V_U32);
    gb_u32(&b, 1);
    gb_str(&b, "tokenizer.ggml.eos_token_id");
    gb_u32(&b, GGUF_V_U32);
    gb_u32(&b, 2);
    if (tmpl) {
        gb_str(&b, "tokenizer.chat_template");
        gb_u32(&b, GGUF_V_STRING);
        gb_str(&b, tmpl);
    }
    struct gguf_file *g = NULL;
    char err[KV_ERR_MAX];
    size_t need = 0;
    int rc = gguf_file_parse(&g, b.p, b.len, b.len, &need, err, sizeof err);
    free(b.p);
    if (rc < 0) {
        fprintf(stderr, "synthetic GGUF: %s\n", err);
        exit(1);
    }
    return g;
}

static const struct model_chat_msg conv[] = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"},
};

T_CASE(gguf_template_recognised)
{
    struct gguf_file *g = chat_gguf(QWEN_TMPL, "<|endoftext|>", "<|im_end|>");
    char *out = NULL, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, g, NULL, conv + 1, 1, true, err, sizeof err);
    T_ASSERT(rc == 0, "render: %d %s", rc, err);
    /* Qwen2's default system prompt, taken from the template itself */
    T_CHECK(strcmp(out, "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
                        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n") == 0,
            "got %s", out);
    T_CHECK(!model_chat_has_bos(g, out), "Qwen's template emits no BOS");
    free(out);
    gguf_file_free(g);
}

T_CASE(gguf_bos_eos_from_vocab)
{
    /* Llama 2's template emits bos_token and eos_token: the model's own texts, and the BOS
     * rule says not to add another one. */
    struct gguf_file *g = chat_gguf(LLAMA2_TMPL, "<BOS>", "<EOS>");
    char *out = NULL, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, g, NULL, conv, 4, true, err, sizeof err);
    T_ASSERT(rc == 0, "render: %d %s", rc, err);
    T_CHECK(strcmp(out, "<BOS>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello <EOS>"
                        "<BOS>[INST] Bye [/INST]") == 0, "got %s", out);
    T_CHECK(model_chat_has_bos(g, out), "text starting with <BOS> has BOS");
    T_CHECK(!model_chat_has_bos(g, "[INST] x"), "text without it has none");
    free(out);
    /* a named family takes the model's texts too */
    rc = model_chat_render(&out, g, "gemma", conv, 2, true, err, sizeof err);
    T_ASSERT(rc == 0, "render gemma: %d %s", rc, err);
    T_CHECK(strcmp(out, "<BOS><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                        "<start_of_turn>model\n") == 0, "got %s", out);
    free(out);
    gguf_file_free(g);
}

T_CASE(gguf_unknown_template)
{
    const char *tmpl = "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n"
                       "{% endfor %}### assistant:";
    struct gguf_file *g = chat_gguf(tmpl, "<s>", "</s>");
    char *out = (char *)1, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, g, NULL, conv, 2, true, err, sizeof err);
    T_CHECK(rc == -ENOTSUP, "rc %d", rc);
    T_CHECK(out == NULL, "*out NULL on failure");
    /* the first 40 characters, newline shown as a space */
    T_CHECK(strstr(err, "\"{% for m in messages %}### {{ m['role'] \"...") != NULL, "err: %s", err);
    T_CHECK(strstr(err, "--chat-template") != NULL, "err says what to do: %s", err);
    const char *fam = NULL;
    T_CHECK(model_chat_family(tmpl, &fam) == -ENOTSUP, "model_chat_family refuses it");
    /* a named family still works on that model */
    rc = model_chat_render(&out, g, "chatml", conv + 1, 1, false, err, sizeof err);
    T_ASSERT(rc == 0, "named: %d %s", rc, err);
    T_CHECK(strcmp(out, "<|im_start|>user\nHi<|im_end|>\n") == 0, "got %s", out);
    free(out);
    gguf_file_free(g);
}

T_CASE(gguf_no_template)
{
    struct gguf_file *g = chat_gguf(NULL, "<s>", "</s>");
    char *out = NULL, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, g, NULL, conv, 2, true, err, sizeof err);
    T_CHECK(rc == -ENOTSUP, "rc %d", rc);
    T_CHECK(strstr(err, "no tokenizer.chat_template") != NULL, "err: %s", err);
    rc = model_chat_render(&out, g, "llama3", conv + 1, 1, true, err, sizeof err);
    T_ASSERT(rc == 0, "named: %d %s", rc, err);
    T_CHECK(strcmp(out, "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n") == 0, "got %s", out);
    free(out);
    gguf_file_free(g);
}

T_CASE(unknown_name)
{
    char *out = NULL, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, NULL, "vicuna", conv, 2, true, err, sizeof err);
    T_CHECK(rc == -ENOTSUP, "rc %d", rc);
    T_CHECK(strstr(err, "'vicuna'") && strstr(err, "chatml") && strstr(err, "gemma"),
            "err names it and the known ones: %s", err);
    char names[256];
    model_chat_names(names, sizeof names);
    const char *want[] = {"chatml", "llama3", "llama2", "mistral", "phi3", "gemma"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        T_CHECK(strstr(names, want[i]) != NULL, "%s missing from '%s'", want[i], names);
}

T_CASE(defaults_without_gguf)
{
    /* no GGUF: the family's usual BOS/EOS texts */
    char *out = NULL, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, NULL, "mistral", conv, 3, false, err, sizeof err);
    T_ASSERT(rc == 0, "render: %d %s", rc, err);
    T_CHECK(strcmp(out, "<s>[INST] Hi[/INST] Hello</s>") == 0, "got %s", out);
    free(out);
    rc = model_chat_render(&out, NULL, "phi3", conv + 1, 1, false, err, sizeof err);
    T_ASSERT(rc == 0, "render: %d %s", rc, err);
    T_CHECK(strcmp(out, "<|user|>\nHi<|end|>\n<|endoftext|>") == 0, "got %s", out);
    free(out);
}

/* Recognition goes by distinctive markers, however the literals are spelled. */
T_CASE(family_markers)
{
    static const struct { const char *tmpl, *fam; } cases[] = {
        {"{{'<|im_start|>' + message.role + \"\\n\" }}", "chatml"},
        {"{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n", "chatml"},
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", "llama3"},
        {"{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}Cutting Knowledge Date", "llama3"},
        {"{{ bos_token + '[INST] <<SYS>>\\n' }}", "llama2"},
        {"{{ bos_token }}{{ '[INST] ' + message['content'] + ' [/INST]' }}", "mistral"},
        {"{%- if loop.last and system_message is defined %}{{- \"[INST] \" }}", "mistral"},
        {"{{'<|user|>' + '\\n' + message['content'] + '<|end|>'}}", "phi3"},
        {"{{ '<start_of_turn>' + role + '\\n' }}", "gemma"},
        {"{%- set first_user_prefix = '' -%}{{ '<start_of_turn>' }}", "gemma"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *fam = NULL;
        int rc = model_chat_family(cases[i].tmpl, &fam);
        T_CHECK(rc == 0 && strcmp(fam, cases[i].fam) == 0, "%s: rc %d family %s, want %s",
                cases[i].tmpl, rc, fam ? fam : "-", cases[i].fam);
    }
    /* relatives laid out otherwise are refused rather than misrendered */
    static const char *const others[] = {
        "{{'<|im_start|>' + message['role'] + '<|im_sep|>' + message['content'] + '<|im_end|>'}}",
        "{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}{{- '[INST]' }}",
    };
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        const char *fam = NULL;
        T_CHECK(model_chat_family(others[i], &fam) == -ENOTSUP, "%s: recognised as %s",
                others[i], fam ? fam : "-");
    }
}

T_CASE(refused_conversations)
{
    char *out = NULL, err[KV_ERR_MAX] = "";
    const struct model_chat_msg tool[] = {{"user", "x"}, {"tool", "y"}};
    int rc = model_chat_render(&out, NULL, "chatml", tool, 2, true, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "'tool'"), "unknown role: %d %s", rc, err);
    const struct model_chat_msg null_role[] = {{NULL, "x"}};
    rc = model_chat_render(&out, NULL, "chatml", null_role, 1, true, err, sizeof err);
    T_CHECK(rc == -EINVAL, "NULL role: %d %s", rc, err);
    rc = model_chat_render(&out, NULL, "chatml", conv, 0, true, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "no messages"), "empty: %d %s", rc, err);
    const struct model_chat_msg uu[] = {{"user", "a"}, {"user", "b"}};
    rc = model_chat_render(&out, NULL, "llama2", uu, 2, true, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "alternate") && strstr(err, "message 1"),
            "not alternating: %d %s", rc, err);
    rc = model_chat_render(&out, NULL, "gemma2", conv, 2, true, err, sizeof err);
    T_CHECK(rc == -EINVAL && strstr(err, "system"), "gemma2 system: %d %s", rc, err);
    rc = model_chat_render(&out, NULL, "mistral-v1", conv, 2, true, err, sizeof err);
    T_CHECK(rc == -EINVAL, "mistral-v1 system: %d %s", rc, err);
    T_CHECK(out == NULL, "nothing rendered");
    /* NULL content is empty */
    const struct model_chat_msg nc[] = {{"user", NULL}};
    rc = model_chat_render(&out, NULL, "chatml", nc, 1, false, err, sizeof err);
    T_ASSERT(rc == 0, "NULL content: %d %s", rc, err);
    T_CHECK(strcmp(out, "<|im_start|>user\n<|im_end|>\n") == 0, "got %s", out);
    free(out);
}

/* Trimming is Python's str.strip(): Unicode whitespace goes, other bytes (and invalid UTF-8)
 * stay. */
T_CASE(trim_unicode)
{
    const struct model_chat_msg m[] = {{"user", "\xe3\x80\x80\xc2\xa0 x\xe2\x80\x83\x1f\n"},
                                       {"assistant", "\xe3\x80 y \xc2"}};
    char *out = NULL, err[KV_ERR_MAX] = "";
    int rc = model_chat_render(&out, NULL, "llama3", m, 2, false, err, sizeof err);
    T_ASSERT(rc == 0, "render: %d %s", rc, err);
    T_CHECK(strcmp(out, "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx"
                        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
                        "\xe3\x80 y \xc2<|eot_id|>") == 0, "got %s", out);
    free(out);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(gguf_template_recognised);
    T_RUN(gguf_bos_eos_from_vocab);
    T_RUN(gguf_unknown_template);
    T_RUN(gguf_no_template);
    T_RUN(unknown_name);
    T_RUN(defaults_without_gguf);
    T_RUN(family_markers);
    T_RUN(refused_conversations);
    T_RUN(trim_unicode);
    return T_DONE();
}
