/* config.c — kvd's configuration file: `key = value` lines, one per command-line option of
 * the role (the option's long name without the dashes), `#` comments, blank lines ignored;
 * `role = stage|relay|seeder` picks the role. Validated whole before anything starts, with
 * errors naming file, line and key. The file turns into command-line arguments placed before
 * the real ones, so the command line wins where both set an option; a repeatable option
 * (seeder's serve) is written as one key whose value lists the items, comma-separated
 * entries kept as they are (`serve = a.gguf,a.cat.json`) and several items separated by
 * whitespace. SIGHUP re-reads the file (kvd_config_reload): the log level applies at once,
 * any other change is named as needing a restart. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/kvd.h"
#include "util/util.h"

#define CONFIG_MAX_BYTES (1u << 20)   /* a config file is small; more is a mistake */
#define CONFIG_MAX_ENTRIES 256
#define CONFIG_MAX_ITEMS 64           /* items of one repeatable key */

struct entry {
    char *key, *value;
    unsigned line;
};

struct config {
    struct entry e[CONFIG_MAX_ENTRIES];
    size_t n;
};

/* The file started with (for reloads), its role's options, and the values applied. */
static char loaded_path[4096];
static const struct kvd_optspec *loaded_specs;
static struct config loaded;

static void config_clear(struct config *c)
{
    for (size_t i = 0; i < c->n; i++) {
        free(c->e[i].key);
        free(c->e[i].value);
    }
    c->n = 0;
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
        s[--n] = 0;
    return s;
}

static const struct kvd_optspec *spec_find(const struct kvd_optspec *specs, const char *key)
{
    for (; specs && specs->name; specs++)
        if (!strcmp(specs->name, key))
            return specs;
    return NULL;
}

/* Parse path into c, checking every key against specs ("role" is always allowed; specs NULL
 * accepts any key, for finding the role before its options are known). */
static int config_parse(struct config *c, const char *path, const struct kvd_optspec *specs, char *err,
                        size_t errlen)
{
    char *text;
    size_t len;
    c->n = 0;
    if (util_file_read(path, CONFIG_MAX_BYTES, &text, &len, err, errlen) < 0)
        return -EINVAL;
    if (strlen(text) != len) {
        unsigned at = 1;
        for (const char *q = text; *q; q++)
            at += *q == '\n';
        util_seterr(err, errlen, "%s:%u: a NUL byte: not a text file", path, at);
        free(text);
        return -EINVAL;
    }
    int rc = 0;
    unsigned line = 0;
    for (char *p = text, *nl; p && *p && rc == 0; p = nl) {
        line++;
        nl = strchr(p, '\n');
        if (nl)
            *nl++ = 0;
        char *s = trim(p);
        if (!*s || *s == '#')
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            util_seterr(err, errlen, "%s:%u: expected 'key = value', got '%.60s'", path, line, s);
            rc = -EINVAL;
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        for (const char *k = key; *k; k++)
            if (!(islower((unsigned char)*k) || isdigit((unsigned char)*k) || *k == '-')) {
                util_seterr(err, errlen, "%s:%u: key '%.60s' is not an option name (lower case, digits, '-')",
                         path, line, key);
                rc = -EINVAL;
                break;
            }
        if (rc)
            break;
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {   /* "a value with # or spaces" */
            val[vl - 1] = 0;
            val++;
        }
        const struct kvd_optspec *o = spec_find(specs, key);
        if (!o && specs && strcmp(key, "role") != 0) {
            util_seterr(err, errlen, "%s:%u: unknown key '%s' (kvd ROLE --help lists the options)", path, line, key);
            rc = -EINVAL;
            break;
        }
        if (o && o->arg && !*val) {
            util_seterr(err, errlen, "%s:%u: key '%s' needs a value", path, line, key);
            rc = -EINVAL;
            break;
        }
        if (o && !o->arg && strcmp(val, "true") && strcmp(val, "false") && strcmp(val, "yes") &&
            strcmp(val, "no") && strcmp(val, "1") && strcmp(val, "0")) {
            util_seterr(err, errlen, "%s:%u: key '%s' is a switch: true or false, not '%.40s'", path, line, key, val);
            rc = -EINVAL;
            break;
        }
        for (size_t i = 0; i < c->n; i++)
            if (!strcmp(c->e[i].key, key)) {
                util_seterr(err, errlen, "%s:%u: key '%s' again (first set on line %u)", path, line, key,
                         c->e[i].line);
                rc = -EINVAL;
                break;
            }
        if (rc)
            break;
        if (c->n == CONFIG_MAX_ENTRIES) {
            util_seterr(err, errlen, "%s:%u: more than %d keys", path, line, CONFIG_MAX_ENTRIES);
            rc = -EINVAL;
            break;
        }
        struct entry *e = &c->e[c->n];
        e->key = strdup(key);
        e->value = strdup(val);
        e->line = line;
        if (!e->key || !e->value) {
            free(e->key);
            free(e->value);
            rc = -ENOMEM;
            util_seterr(err, errlen, "out of memory");
            break;
        }
        c->n++;
    }
    free(text);
    if (rc)
        config_clear(c);
    return rc;
}

static const char *config_get(const struct config *c, const char *key)
{
    for (size_t i = 0; i < c->n; i++)
        if (!strcmp(c->e[i].key, key))
            return c->e[i].value;
    return NULL;
}

int kvd_config_role(const char *path, char *role, size_t n, char *err, size_t errlen)
{
    struct config c;
    int rc = config_parse(&c, path, NULL, err, errlen);
    if (rc < 0)
        return rc;
    const char *r = config_get(&c, "role");
    snprintf(role, n, "%s", r ? r : "");
    config_clear(&c);
    return 0;
}

int kvd_config_args(const char *path, const struct kvd_optspec *specs, char ***out, int *n_out, char *err,
                    size_t errlen)
{
    struct config c;
    int rc = config_parse(&c, path, specs, err, errlen);
    if (rc < 0)
        return rc;
    /* each key: --key VALUE, a switch --key when true, a repeatable key once per item */
    size_t cap = 2 * c.n * CONFIG_MAX_ITEMS + 1, n = 0;
    char **argv = calloc(cap, sizeof *argv);
    if (!argv) {
        config_clear(&c);
        util_seterr(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (size_t i = 0; i < c.n && rc == 0; i++) {
        const struct entry *e = &c.e[i];
        const struct kvd_optspec *o = spec_find(specs, e->key);
        if (!o)
            continue;   /* role */
        char opt[80];
        snprintf(opt, sizeof opt, "--%s", e->key);
        if (!o->arg) {
            if (!strcmp(e->value, "true") || !strcmp(e->value, "yes") || !strcmp(e->value, "1"))
                argv[n++] = strdup(opt);
            continue;
        }
        if (!o->repeat) {
            argv[n++] = strdup(opt);
            argv[n++] = strdup(e->value);
            continue;
        }
        char *items = strdup(e->value), *save = NULL;
        int k = 0;
        for (char *it = items ? strtok_r(items, " \t", &save) : NULL; it; it = strtok_r(NULL, " \t", &save)) {
            if (++k > CONFIG_MAX_ITEMS) {
                util_seterr(err, errlen, "%s:%u: key '%s' has more than %d items", path, e->line, e->key,
                         CONFIG_MAX_ITEMS);
                rc = -EINVAL;
                break;
            }
            argv[n++] = strdup(opt);
            argv[n++] = strdup(it);
        }
        free(items);
    }
    for (size_t i = 0; i < n && rc == 0; i++)
        if (!argv[i]) {
            util_seterr(err, errlen, "out of memory");
            rc = -ENOMEM;
        }
    if (rc < 0) {
        for (size_t i = 0; i < n; i++)
            free(argv[i]);
        free(argv);
        config_clear(&c);
        return rc;
    }
    /* kept for SIGHUP: the file, its role's options and what was applied */
    snprintf(loaded_path, sizeof loaded_path, "%s", path);
    loaded_specs = specs;
    config_clear(&loaded);
    loaded = c;
    *out = argv;
    *n_out = (int)n;
    return 0;
}

bool kvd_config_active(void)
{
    return loaded_path[0] != 0;
}

int kvd_config_reload(void)
{
    if (!loaded_path[0])
        return -ENOENT;
    struct config c;
    char err[512];
    if (config_parse(&c, loaded_path, loaded_specs, err, sizeof err) < 0) {
        kvd_log(KVD_LOG_ERROR, "config reload: %s; the running configuration is kept", err);
        return -EINVAL;
    }
    const char *lv = config_get(&c, "log-level");
    int level = -1;
    if (lv && (level = kvd_log_level_parse(lv)) < 0) {
        kvd_log(KVD_LOG_ERROR, "config reload: %s: log-level '%s' is not error|warn|info|debug; the running "
                "configuration is kept", loaded_path, lv);
        config_clear(&c);
        return -EINVAL;
    }
    int changed = 0;
    for (size_t i = 0; i < c.n; i++) {   /* what changed or appeared, other than the log level */
        const char *old = config_get(&loaded, c.e[i].key);
        if (strcmp(c.e[i].key, "log-level") && (!old || strcmp(old, c.e[i].value))) {
            kvd_log(KVD_LOG_WARN, "config reload: %s changed (line %u): takes effect on restart", c.e[i].key,
                    c.e[i].line);
            changed++;
        }
    }
    for (size_t i = 0; i < loaded.n; i++)
        if (strcmp(loaded.e[i].key, "log-level") && !config_get(&c, loaded.e[i].key)) {
            kvd_log(KVD_LOG_WARN, "config reload: %s removed: takes effect on restart", loaded.e[i].key);
            changed++;
        }
    if (level >= 0)
        kvd_log_set_level(level);
    kvd_log(KVD_LOG_INFO, "config reloaded from %s: log level %s%s", loaded_path, lv ? lv : "unchanged",
            changed ? "; other changes wait for a restart" : "");
    config_clear(&loaded);
    loaded = c;
    return 0;
}
