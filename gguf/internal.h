/* gguf/internal.h — cross-file internals of the gguf module.
 *
 * The files form one dependency order, lowest first; a file uses only those above it:
 *   gguf.c     the reader, and the small helpers every other file shares (below)
 *   write.c    the writer (uses the reader's type table)
 *   window.c   stage windows and the mini-GGUF writer (reader, writer)
 *   catalog.c  per-tensor digests and window verification (reader, windows) */
#ifndef KV_GGUF_INTERNAL_H
#define KV_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

/* ---- defined in gguf.c */

/* Bytes of one element of a fixed-size metadata value type; 0 for STRING, ARRAY, unknown. */
size_t gguf__vtype_size(uint32_t type);


#endif
