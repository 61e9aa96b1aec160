/* wtype — the weight types of GGUF files and of the kernels (ggml's type numbers): one table
 * of every type id the format knows, with its names, elements per block and bytes per block,
 * and the f16 / bf16 conversions. Below both gguf/ and kernels/, so neither needs the other
 * for a fact about a type; what the kernels can compute with a type stays in their traits
 * table (kernels/internal.h).
 */
#ifndef KV_WTYPE_H
#define KV_WTYPE_H

#include <stddef.h>
#include <stdint.h>

/* Type ids are ggml's; wtype_info(id) is NULL for an id the table lacks (4, 5, 31 ...). */
#define WTYPE_COUNT 40

struct wtype_info {
    const char *name;       /* lower case, as GGUF listings and catalogs spell it: "q4_k" */
    const char *ggml_name;  /* ggml's spelling: "q4_K" */
    uint32_t block_elems;   /* elements per block (1 for plain types) */
    uint32_t block_bytes;   /* bytes per block */
};

/* The table's entry for type (static storage), or NULL for an unknown id. */
const struct wtype_info *wtype_info(uint32_t type);
/* Bytes of n elements of type (n a multiple of the block size): 0, or -EINVAL/-EOVERFLOW. */
int wtype_bytes(uint32_t type, uint64_t n, uint64_t *out);
/* Bytes of one row of cols elements (cols a multiple of the block size), 0 if invalid. */
size_t wtype_row_bytes(uint32_t type, int64_t cols);
/* Type id by name ("q8_0", "Q4_K"; case-insensitive), or -1. */
int wtype_by_name(const char *name);

/* f16 / bf16 conversions (round to nearest even). */
uint16_t wtype_f32_to_f16(float f);
float wtype_f16_to_f32(uint16_t h);
uint16_t wtype_f32_to_bf16(float f);
float wtype_bf16_to_f32(uint16_t h);

#endif
