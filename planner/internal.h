/* planner/internal.h — what plan.c (the search) and shape.c (model shapes) share. Not a public
 * interface. */
#ifndef KV_PLANNER_INTERNAL_H
#define KV_PLANNER_INTERNAL_H

#include <stddef.h>

/* Formats an error message into err[n] (nothing when err is NULL or n is 0). */
void plan__errf(char *err, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
