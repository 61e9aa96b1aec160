/* gguf — the GGUF file format: read (validate everything, map only a byte range), write, slice.
 *
 * Byte layout (all little-endian), versions 2 and 3 (1 is refused):
 *   u32 magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv x { string key | u32 value_type | value }
 *   n_tensors x { string name | u32 n_dims | u64 ne[n_dims] | u32 ggml_type | u64 offset }
 *   padding to `general.alignment` (u32, default 32, power of two)
 *   tensor data: each tensor at data_offset + offset, offset a multiple of the alignment
 * string = u64 len | len bytes (no NUL); array = u32 elem_type | u64 n | n elements
 * (arrays of arrays and of strings allowed).
 *
 * The parser works on a prefix of the file held in memory and says how many bytes it needs
 * when the prefix is short, so the same code reads a local file (pread) and a remote one
 * (HTTP ranges that grow). Every count and length is checked and capped before it sizes an
 * allocation; every failure leaves a message naming the field, the value and the limit.
 *
 * Tensor data is never read by the parser. gguf_file_map_tensors() maps only the pages that
 * hold the chosen tensors (page-aligned ranges, adjacent ranges merged), never the whole file.
 */
#ifndef KV_GGUF_H
#define KV_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" */
#define GGUF_MAX_DIMS 4
#define GGUF_DEFAULT_ALIGNMENT 32

/* Caps on what a file may declare (a file that needs more is refused, naming the cap). */
#define GGUF_MAX_TENSORS   (1u << 20)
#define GGUF_MAX_KV        (1u << 20)
#define GGUF_MAX_STRING    (1u << 24)       /* one string, bytes */
#define GGUF_MAX_ARRAY     (1u << 26)       /* elements of one array */
#define GGUF_MAX_HEADER    (1ull << 30)     /* whole header, bytes */
#define GGUF_MAX_NEST      4                /* array of array depth */
#define GGUF_MAX_KEY       65535            /* one metadata key, bytes */
#define GGUF_MAX_NAME      255              /* one tensor name, bytes (llama.cpp: 63) */
#define GGUF_MAX_ALIGNMENT (1u << 16)       /* general.alignment */
#define GGUF_MAX_MEMORY    (512ull << 20)   /* index memory one header parse may allocate */

/* Metadata value types. */
enum gguf_vtype {
    GGUF_V_U8 = 0, GGUF_V_I8 = 1, GGUF_V_U16 = 2, GGUF_V_I16 = 3, GGUF_V_U32 = 4,
    GGUF_V_I32 = 5, GGUF_V_F32 = 6, GGUF_V_BOOL = 7, GGUF_V_STRING = 8, GGUF_V_ARRAY = 9,
    GGUF_V_U64 = 10, GGUF_V_I64 = 11, GGUF_V_F64 = 12,
    GGUF_V_COUNT
};

/* Tensor (ggml) types; the numbers are ggml's, their names and block sizes wtype_info's
 * (wtype/wtype.h). */
enum gguf_ttype {
    GGUF_T_F32 = 0, GGUF_T_F16 = 1, GGUF_T_Q4_0 = 2, GGUF_T_Q4_1 = 3,
    GGUF_T_Q5_0 = 6, GGUF_T_Q5_1 = 7, GGUF_T_Q8_0 = 8, GGUF_T_Q8_1 = 9,
    GGUF_T_Q2_K = 10, GGUF_T_Q3_K = 11, GGUF_T_Q4_K = 12, GGUF_T_Q5_K = 13,
    GGUF_T_Q6_K = 14, GGUF_T_Q8_K = 15,
    GGUF_T_I8 = 24, GGUF_T_I16 = 25, GGUF_T_I32 = 26, GGUF_T_I64 = 27, GGUF_T_F64 = 28,
    GGUF_T_BF16 = 30,
    GGUF_T_COUNT = 40
};

/* Name of a metadata value type ("u32", "string", ...), "?" if unknown. */
const char *gguf_vtype_name(uint32_t type);

/* One metadata value. Strings are NOT NUL-terminated unless said; arrays keep the raw
 * little-endian element bytes (fixed-size types) or an index of strings / sub-arrays. */
struct gguf_value {
    uint32_t type;                 /* enum gguf_vtype */
    union {
        uint64_t u;                /* U8..U64, BOOL */
        int64_t i;                 /* I8..I64 */
        double f;                  /* F32, F64 */
        struct { const char *p; uint64_t len; } str;
        struct {
            uint32_t type;         /* element type */
            uint64_t n;            /* elements */
            const void *data;      /* fixed-size elements, packed little-endian */
            const struct gguf_value *items; /* STRING and ARRAY elements, n of them */
        } arr;
    } v;
};

struct gguf_kv {
    const char *key;               /* NUL-terminated */
    struct gguf_value val;
};

struct gguf_tensor {
    const char *name;              /* NUL-terminated */
    uint32_t type;                 /* enum gguf_ttype */
    uint32_t n_dims;
    uint64_t ne[GGUF_MAX_DIMS];    /* ne[0] is the row length (contiguous); unused dims are 1 */
    uint64_t offset;               /* relative to the data section */
    uint64_t size;                 /* bytes */
    const void *data;              /* NULL until mapped (gguf_file_map_tensors) */
};

struct gguf_file; /* opaque: parsed header (+ fd and mappings when opened from a path) */

/* Parse a GGUF header from the first len bytes of a file of file_size bytes (UINT64_MAX if
 * unknown). Returns 0 and *out; -EAGAIN with *need = bytes required when the prefix is too
 * short; another negative code with err filled. The buffer is copied; the caller keeps it. */
int gguf_file_parse(struct gguf_file **out, const void *buf, size_t len, uint64_t file_size,
                    size_t *need, char *err, size_t errlen);
/* Open and parse a file (reads only the header). */
int gguf_file_open(struct gguf_file **out, const char *path, char *err, size_t errlen);
void gguf_file_free(struct gguf_file *f);

uint32_t gguf_file_version(const struct gguf_file *f);
uint64_t gguf_file_alignment(const struct gguf_file *f);
uint64_t gguf_file_data_offset(const struct gguf_file *f); /* start of the data section */
uint64_t gguf_file_size(const struct gguf_file *f);
const char *gguf_file_path(const struct gguf_file *f);     /* NULL when parsed from memory */
uint64_t gguf_file_header_len(const struct gguf_file *f); /* header bytes before the padding */

/* Metadata (borrowed pointers, valid until gguf_file_free). */
uint64_t gguf_kv_count(const struct gguf_file *f);
const struct gguf_kv *gguf_kv_at(const struct gguf_file *f, uint64_t i);
const struct gguf_kv *gguf_kv_find(const struct gguf_file *f, const char *key);
/* Typed getters: 0, -ENOENT (absent) or -EINVAL (wrong type / out of range for the target).
 * Integer getters accept any integer type whose value fits; float getters accept F32/F64. */
int gguf_get_u32(const struct gguf_file *f, const char *key, uint32_t *out);
int gguf_get_u64(const struct gguf_file *f, const char *key, uint64_t *out);
int gguf_get_i64(const struct gguf_file *f, const char *key, int64_t *out);
int gguf_get_f32(const struct gguf_file *f, const char *key, float *out);
int gguf_get_bool(const struct gguf_file *f, const char *key, bool *out);
/* String value copied NUL-terminated into buf (truncation is -ENAMETOOLONG). */
int gguf_get_str(const struct gguf_file *f, const char *key, char *buf, size_t n);
/* Array value (any element type): borrowed. */
int gguf_get_arr(const struct gguf_file *f, const char *key, const struct gguf_value **out);
/* Any integer value as u64 (negative: -EINVAL) / as i64 (above INT64_MAX: -EINVAL). */
int gguf_value_u64(const struct gguf_value *v, uint64_t *out);
int gguf_value_i64(const struct gguf_value *v, int64_t *out);

/* Tensors. */
uint64_t gguf_tensor_count(const struct gguf_file *f);
const struct gguf_tensor *gguf_tensor_at(const struct gguf_file *f, uint64_t i);
const struct gguf_tensor *gguf_tensor_find(const struct gguf_file *f, const char *name);
/* Layer index of a "blk.N.*" name, or -1 for tensors outside the blocks. */
int gguf_tensor_layer(const char *name);

/* Map the data of every tensor for which want() is true (all when want is NULL); sets their
 * data pointers. Only page-aligned ranges covering those tensors are mapped (read-only,
 * private). Needs a file opened with gguf_file_open. */
typedef bool (*gguf_want_cb)(const struct gguf_tensor *t, void *ud);
int gguf_file_map_tensors(struct gguf_file *f, gguf_want_cb want, void *ud,
                          char *err, size_t errlen);
/* Bytes currently mapped by this file object. A new map call replaces earlier mappings. */
uint64_t gguf_file_mapped_bytes(const struct gguf_file *f);
/* Read one tensor's bytes (t->size of them) into buf with pread (file from gguf_file_open). */
int gguf_tensor_read(const struct gguf_file *f, const struct gguf_tensor *t, void *buf,
                     char *err, size_t errlen);

/* Writer: metadata and tensors in order; tensor data is borrowed until gguf_writer_write. */
struct gguf_writer;
int gguf_writer_new(struct gguf_writer **out);
void gguf_writer_free(struct gguf_writer *w);
int gguf_writer_set_alignment(struct gguf_writer *w, uint32_t alignment);
/* Set (or replace) a key with a copy of value v (deep copy, arrays included). */
int gguf_writer_set(struct gguf_writer *w, const char *key, const struct gguf_value *v);
int gguf_writer_set_u32(struct gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_set_f32(struct gguf_writer *w, const char *key, float v);
int gguf_writer_set_bool(struct gguf_writer *w, const char *key, bool v);
int gguf_writer_set_str(struct gguf_writer *w, const char *key, const char *s);
/* Array of fixed-size elements (raw little-endian bytes) or of n NUL-terminated strings. */
int gguf_writer_set_arr(struct gguf_writer *w, const char *key, uint32_t elem_type,
                        uint64_t n, const void *data);
int gguf_writer_set_arr_str(struct gguf_writer *w, const char *key, uint64_t n,
                            const char *const *strs);
int gguf_writer_add_tensor(struct gguf_writer *w, const char *name, uint32_t type,
                           uint32_t n_dims, const uint64_t *ne, const void *data);
/* A tensor whose bytes are produced at write time: fill(ud, name, buf, size) must fill buf
 * (size bytes) and return 0 or a negative code. The writer reuses one buffer as large as
 * the biggest such tensor, so a model is streamed with one tensor in memory at a time. */
typedef int (*gguf_fill_cb)(void *ud, const char *name, void *buf, uint64_t size);
int gguf_writer_add_tensor_fill(struct gguf_writer *w, const char *name, uint32_t type,
                                uint32_t n_dims, const uint64_t *ne, gguf_fill_cb fill, void *ud);
/* Copy every metadata key of src (value types as they are, arrays of strings included) into
 * w, in src's order, except the keys skip(key, ud) is true for (skip may be NULL). Set keys
 * afterwards to change a value in place. 0, or a negative code with err naming the key. */
typedef bool (*gguf_key_cb)(const char *key, void *ud);
int gguf_writer_copy_kv(struct gguf_writer *w, const struct gguf_file *src, gguf_key_cb skip,
                        void *ud, char *err, size_t errlen);
/* Add tensor t of src under its own name, type and shape; its bytes are copied from src at
 * write time (from the mapping when mapped, else read with pread). src must outlive the write.
 * 0 or gguf_writer_add_tensor_fill's code. */
int gguf_writer_add_tensor_copy(struct gguf_writer *w, const struct gguf_file *src,
                                const struct gguf_tensor *t);
/* Bytes the file will have when written now (header, padding, tensors). */
uint64_t gguf_writer_file_size(const struct gguf_writer *w);
/* Write the file (to path.tmp, fsync, rename) : 0 or negative code with err filled. */
int gguf_writer_write(struct gguf_writer *w, const char *path, char *err, size_t errlen);

/* Stage windows (docs/design.md, "Windows and mini-GGUFs"). */
struct gguf_window_opts {
    uint32_t first, last;          /* layer range [first, last) */
    const char *source_sha256_hex; /* kvasir.source.sha256 (NULL: computed from the file) */
};
/* Write the stage mini-GGUF of [first, last) of src to path. */
int gguf_window_write(struct gguf_file *src, const struct gguf_window_opts *o,
                      const char *path, char *err, size_t errlen);
/* The writer of that mini-GGUF, not yet written (tensors are filled from src at write time);
 * the caller frees it. Used by seeders to stream a window without writing it. */
int gguf_window_writer(struct gguf_writer **out, struct gguf_file *src,
                       const struct gguf_window_opts *o, char *err, size_t errlen);
/* The header (with its padding) that gguf_writer_write would put first, in memory
 * (malloc'd, caller frees); tensor i then starts at *len + its offset. */
int gguf_writer_header(struct gguf_writer *w, void **buf, size_t *len);
/* Number of blocks (layers) of a model file: from <arch>.block_count. */
int gguf_block_count(const struct gguf_file *f, uint32_t *out);
/* Layers of the main pass: block_count minus <arch>.nextn_predict_layers (multi-token
 * prediction blocks appended after the main layers), as the model module counts them. */
int gguf_main_layers(const struct gguf_file *f, uint32_t *out);
/* Whether tensor t belongs in the window [first, last) of a model of n_block blocks
 * (gguf_block_count) whose main pass has n_layers of them (gguf_main_layers), with
 * (has_output) or without a separate output.weight: blk.N.* for first <= N < last,
 * token_embd.* when first == 0; the last window (last >= n_layers) holds output_norm.* /
 * output.*, the multi-token-prediction blocks past the main pass (blk.N.* for N >= n_layers,
 * which the last rank runs as its drafter) and token_embd.* too when the model ties its head
 * to the embedding or has such blocks (the drafter embeds the token it sampled); other
 * non-block tensors (for example rope_freqs) are in every window. The one rule for what a
 * window holds: slicing, catalogs' window bounds and verification, seeders and pulls. */
bool gguf_window_wants(const char *name, uint32_t first, uint32_t last, uint32_t n_layers,
                       uint32_t n_block, bool has_output);
/* The window a stage mini-GGUF declares (kvasir.window.first/last): 0 or -ENOENT. */
int gguf_window_get(const struct gguf_file *f, uint32_t *first, uint32_t *last);

/* Catalogs (docs/design.md, "Windows and mini-GGUFs"): per tensor name, type, shape, absolute
 * byte offset in the source file, byte size and SHA-256; plus the source file's SHA-256 and
 * size. The catalog's JSON text (gguf_catalog_save) is canonical, and the SHA-256 of those
 * bytes is the model id.
 * Version 2 also covers the header: one SHA-256 per metadata key and a digest over them
 * (docs/gguf.md, "The metadata digest"); the window keys below are left out, since a window
 * adds them and a full model has none. Version 1 catalogs are refused ("re-run kvctl catalog").
 * JSON: {"version":2,"source_sha256":HEX,"source_size":N,"arch":S,"n_layers":N,
 *        "n_main_layers":N,"metadata_sha256":HEX,"metadata":[{"key":S,"sha256":HEX}],
 *        "tensors":[{"name":S,"type":"q8_0","shape":[ne0,...],"offset":N,"size":N,"sha256":HEX}]} */
#define GGUF_CATALOG_MAX_JSON (256u << 20)
#define GGUF_CATALOG_VERSION 2
struct gguf_catalog_meta {
    char *key;                     /* NUL-terminated, owned by the catalog */
    char sha256[65];               /* SHA-256 of the value: u32 type | value, as GGUF encodes it */
};
struct gguf_catalog_tensor {
    char name[GGUF_MAX_NAME + 1];
    uint32_t type, n_dims;
    uint64_t ne[GGUF_MAX_DIMS];
    uint64_t offset;               /* absolute, in the source file */
    uint64_t size;
    char sha256[65];
};
struct gguf_catalog {
    char source_sha256[65];
    uint64_t source_size;
    char arch[64];
    uint32_t n_layers;             /* <arch>.block_count */
    uint32_t n_main;               /* layers of the main pass (gguf_main_layers) */
    uint64_t n_tensors;
    struct gguf_catalog_tensor *tensors;
    char metadata_sha256[65];      /* over meta[] (sorted by key): key, NUL, the 32 digest bytes */
    uint64_t n_meta;
    struct gguf_catalog_meta *meta; /* sorted by key (bytewise), window keys left out */
};
/* Whether a metadata key is one a window writer sets (kvasir.window.first/last,
 * kvasir.source.sha256): those are not in the metadata digest. */
bool gguf_catalog_window_key(const char *key);
/* Hash a whole model file (opened with gguf_file_open) in one sequential pass. */
int gguf_catalog_build(struct gguf_catalog **out, const struct gguf_file *f, char *err, size_t errlen);
void gguf_catalog_free(struct gguf_catalog *c);
/* Canonical JSON text (malloc'ed, caller frees) and its SHA-256 (the model id). */
int gguf_catalog_to_json(const struct gguf_catalog *c, char **json, size_t *len, char id_hex[65]);
/* Parse and validate catalog JSON (capped at GGUF_CATALOG_MAX_JSON); id_hex may be NULL. */
int gguf_catalog_from_json(struct gguf_catalog **out, const char *json, size_t len, char id_hex[65],
                           char *err, size_t errlen);
int gguf_catalog_save(const struct gguf_catalog *c, const char *path, char id_hex[65], char *err, size_t errlen);
int gguf_catalog_load(struct gguf_catalog **out, const char *path, char id_hex[65], char *err, size_t errlen);
const struct gguf_catalog_tensor *gguf_catalog_find(const struct gguf_catalog *c, const char *name);
/* The most bytes a well-formed window [first, last) of the catalog's model can have: its
 * tensors' sizes, each plus the most alignment padding the catalog's offsets allow, plus the
 * source's own header and padding and room for the window keys. 0, or -EINVAL for a range
 * outside the model. Pulls bound every announced size by it. */
int gguf_catalog_window_bound(const struct gguf_catalog *c, uint32_t first, uint32_t last,
                              uint64_t *min_bytes, uint64_t *max_bytes);
/* Check a file's header metadata against the catalog: every key but the window keys, by
 * SHA-256 of its value. -EBADMSG with the first differing, missing or extra key named. */
int gguf_catalog_verify_metadata(const struct gguf_catalog *c, const struct gguf_file *f,
                                 char *err, size_t errlen);
/* Check a window (or a whole model) opened with gguf_file_open against the catalog: its
 * metadata (gguf_catalog_verify_metadata), then tensor by tensor: every tensor it holds must
 * match (type, shape, size, SHA-256) and every tensor its window needs must be there.
 * -EBADMSG with the differing key or tensor named in err. */
int gguf_catalog_verify(const struct gguf_catalog *c, const struct gguf_file *w, char *err, size_t errlen);
/* SHA-256 of a buffer as hex. */
void gguf_sha256_hex(const void *p, size_t n, char hex[65]);

#endif
