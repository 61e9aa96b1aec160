/* util/json.c — numbers out of cJSON objects, with a default or with bounds. */
#include <errno.h>

#include <cjson/cJSON.h>

#include "util/util.h"

double util_json_number(const struct cJSON *o, const char *key, double def)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : def;
}

const char *util_json_string(const struct cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

int util_json_number_in(const struct cJSON *o, const char *key, double lo, double hi, bool required,
                        double *out, const char *ctx, char *err, size_t errlen)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v) {
        if (!required)
            return 1;
        if (err && errlen)
            snprintf(err, errlen, "%s: '%s' is required", ctx, key);
        return -EINVAL;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi)) {
        if (err && errlen)
            snprintf(err, errlen, "%s: '%s' must be a number in [%g, %g]", ctx, key, lo, hi);
        return -EINVAL;
    }
    *out = v->valuedouble;
    return 0;
}

void util_json_set(cJSON *o, const char *key, cJSON *v)
{
    if (!v)
        return;
    if (!o || (!cJSON_ReplaceItemInObjectCaseSensitive(o, key, v) && !cJSON_AddItemToObject(o, key, v)))
        cJSON_Delete(v);
}
