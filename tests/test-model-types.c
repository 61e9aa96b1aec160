/* The type tables of the file format and the kernels agree: the enum values are pinned at
 * build time in model/model.c; here every type both know has the same block size, bytes per
 * block and name in gguf's validation table and the kernels' type-traits table, and every
 * type the kernels know is one the file format knows. */
#include <strings.h>

#include "gguf/gguf.h"
#include "kernels/kern.h"
#include "tests/t.h"

T_CASE(gguf_and_kern_type_tables_agree)
{
    int both = 0;
    for (uint32_t t = 0; t < KERN_T_COUNT; t++) {
        const char *kn = kern_type_name(t);
        const struct gguf_type_info *gi = gguf_type_info(t);
        if (!kn)
            continue;
        T_CHECK(gi != NULL, "kern type %u (%s) unknown to gguf", t, kn);
        if (!gi)
            continue;
        both++;
        T_CHECK(kern_block_elems(t) == gi->block_elems, "%s: %u elements per block in kern, %u in gguf",
                kn, kern_block_elems(t), gi->block_elems);
        T_CHECK(kern_block_bytes(t) == gi->block_bytes, "%s: %u bytes per block in kern, %u in gguf",
                kn, kern_block_bytes(t), gi->block_bytes);
        T_CHECK(!strcasecmp(kn, gi->name), "type %u: '%s' in kern, '%s' in gguf", t, kn, gi->name);
    }
    T_CHECK(both == 15, "%d types known to both, want 15", both);
    T_CHECK(kern_type_name(KERN_T_COUNT) == NULL && kern_type_name(4) == NULL, "unknown types");
}

int main(void)
{
    T_RUN(gguf_and_kern_type_tables_agree);
    return T_DONE();
}
