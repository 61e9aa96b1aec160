/* dev_host.c — the ops every host-memory device shares: embedding rows, row copies, zeroing.
 * They move bytes and look rows up; the dequantisation is the reference one (the embedding
 * is one row per token, never the bottleneck). */
#include <errno.h>
#include <string.h>

#include "kernels/internal.h"

bool kern__host_idx_ok(const uint32_t *idx, int64_t n, int64_t rows)
{
    for (int64_t i = 0; i < n; i++)
        if ((int64_t)idx[i] >= rows)
            return false;
    return true;
}

int kern__host_get_rows(struct kern_dev *d, uint32_t type, struct kern_at table, int64_t rows,
                        int64_t cols, struct kern_at ids, int64_t n, struct kern_at out)
{
    (void)d;
    const int32_t *id = kern__at_host(ids);
    const uint8_t *t = kern__at_host(table);
    float *y = KERN__F(out);
    size_t rb = kern_row_bytes(type, cols);
    for (int64_t i = 0; i < n; i++) {
        if (id[i] < 0 || id[i] >= rows)
            return -EINVAL;
        int rc = kern_ref_dequant_row(type, t + (size_t)id[i] * rb, y + i * cols, cols);
        if (rc < 0)
            return rc;
    }
    return 0;
}

int kern__host_copy_rows(struct kern_dev *d, struct kern_at dst, size_t dst_stride,
                         struct kern_at src, size_t src_stride, int64_t src_rows,
                         struct kern_at idx, int64_t n, size_t row_bytes)
{
    (void)d;
    const uint32_t *ix = kern__at_host(idx);
    if (ix && !kern__host_idx_ok(ix, n, src_rows))
        return -EINVAL;
    uint8_t *o = kern__at_host(dst);
    const uint8_t *s = kern__at_host(src);
    for (int64_t i = 0; i < n; i++)
        memcpy(o + (size_t)i * dst_stride, s + (size_t)(ix ? ix[i] : i) * src_stride, row_bytes);
    return 0;
}

int kern__host_zero(struct kern_dev *d, struct kern_at dst, size_t bytes)
{
    (void)d;
    memset(kern__at_host(dst), 0, bytes);
    return 0;
}
