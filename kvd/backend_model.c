/* backend_model.c — the model backend (model/model.h); filled in when the model lands. */
#include <errno.h>
#include <stdio.h>

#include "kvd/internal.h"

int kvd_backend_open_model(struct kvd_backend *b, const char *path, int first, int last,
                           int n_threads, uint32_t n_ctx, uint32_t max_batch, char *err,
                           size_t errlen)
{
    (void)b; (void)path; (void)first; (void)last; (void)n_threads; (void)n_ctx; (void)max_batch;
    snprintf(err, errlen, "this build has no model support yet (use --stub)");
    return -ENOSYS;
}
