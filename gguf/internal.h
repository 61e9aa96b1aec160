/* gguf/internal.h — cross-file internals of the gguf module. */
#ifndef KV_GGUF_INTERNAL_H
#define KV_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* Bytes of one element of a fixed-size metadata value type; 0 for STRING, ARRAY, unknown. */
size_t gguf__vtype_size(uint32_t type);

#endif
