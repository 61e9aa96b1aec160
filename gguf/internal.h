/* gguf/internal.h — cross-file internals of the gguf module. */
#ifndef KV_GGUF_INTERNAL_H
#define KV_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of one element of a fixed-size metadata value type; 0 for STRING, ARRAY, unknown. */
size_t gguf__vtype_size(uint32_t type);

/* Formats an error message into err[errlen] (nothing when err is NULL or errlen is 0). */
void gguf__seterr(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
