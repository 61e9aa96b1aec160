/* Reference matmul with ggml's CPU semantics: each activation row is first converted to the
 * weight type's vec_dot_type, then every weight row is dotted with it (the type-traits
 * table's reference dot). */
#include <errno.h>
#include <stdlib.h>

#include "kernels/internal.h"

int kern_ref_matmul(uint32_t type, const void *w, int64_t rows, int64_t cols,
                    const float *x, int64_t n, float *y)
{
    const struct kern__type_traits *tt = kern__type_traits(type);
    if (!tt || !tt->vec_dot || rows < 0 || n < 0 || cols <= 0)
        return -EINVAL;
    uint32_t vt = tt->vec_dot_type;
    size_t wrow = kern_row_bytes(type, cols), xrow = kern_row_bytes(vt, cols);
    if (wrow == 0 || xrow == 0)
        return -EINVAL;
    void *xq = malloc(xrow);
    if (!xq)
        return -ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        kern_ref_quant_row(vt, x + i * cols, xq, cols);
        for (int64_t r = 0; r < rows; r++)
            y[i * rows + r] = tt->vec_dot((const char *)w + (size_t)r * wrow, xq, cols);
    }
    free(xq);
    return 0;
}
