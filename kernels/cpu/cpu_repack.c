/* cpu_repack.c — weights repacked at load for the interleaved kernels (simd_repack.inc), and
 * the matmul over them. A matrix is cut into groups of the SIMD level's rp_rows rows (the
 * last one zero-padded); a group holds, per block, each 4-byte chunk of its rows' quants side
 * by side (Q8_0 stored +128 when the level's kernels take unsigned bytes; Q5_0/Q5_1's fifth
 * bits rearranged into one chunk before the nibbles), then the rows' scales block by block
 * (f16 d for Q4_0/Q5_0/Q8_0, d then m for Q4_1/Q5_1; Q4_K's and Q5_K's d, dmin and their sub-blocks'
 * 6-bit scales and mins unpacked to bytes; Q6_K's d and int8 scales by pairs of sub-blocks;
 * Q6_K's quants rearranged within their bytes, pack_q6_K). docs/kernels.md, "Repacked
 * layouts", has the picture. */
#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>

#include "kernels/internal.h"
#include "util/util.h"

struct kern_packed {
    const struct kern__simd *level; /* the kernels the layout was made for */
    uint32_t type;
    int R;                          /* rows per group */
    int64_t rows, cols, n_mat, nb;  /* nb: blocks per row */
    int64_t groups;                 /* per matrix */
    size_t grp_bytes;               /* bytes per group, a multiple of 64 */
    size_t mat_bytes;               /* bytes of one matrix in the file layout */
    uint8_t *data;                  /* n_mat * groups * grp_bytes, 64-byte aligned */
};

/* Per type with kernels: elements per block, and per row and block the bytes of quants and
 * of scales in the repacked layout. */
struct rp_type {
    int qk, qb, sb;
};

static struct rp_type rp_type(uint32_t type)
{
    switch (type) {
    case KERN_T_Q4_0: return (struct rp_type){KERN_QK, 16, 2};
    case KERN_T_Q4_1: return (struct rp_type){KERN_QK, 16, 4};
    case KERN_T_Q5_0: return (struct rp_type){KERN_QK, 20, 2};
    case KERN_T_Q5_1: return (struct rp_type){KERN_QK, 20, 4};
    case KERN_T_Q8_0: return (struct rp_type){KERN_QK, 32, 2};
    case KERN_T_Q4_K: return (struct rp_type){KERN_QK_K, KERN_QK_K / 2, 20};
    case KERN_T_Q5_K: return (struct rp_type){KERN_QK_K, KERN_QK_K / 2 + KERN_QK_K / 8, 20};
    case KERN_T_Q6_K: return (struct rp_type){KERN_QK_K, KERN_QK_K / 2 + KERN_QK_K / 4, 18};
    default: return (struct rp_type){0, 0, 0};
    }
}

bool kern_pack_supported(uint32_t type, int64_t cols)
{
    const struct kern__simd *s = kern__simd_get();
    struct rp_type rt = rp_type(type);
    return type < KERN_T_COUNT && s->rp_rows > 0 && s->rp_gemm[type] && s->rp_quant[type] &&
           rt.qk && cols > 0 && cols % rt.qk == 0;
}

/* Row r's scales of one block into the group's scale area sd of that block (R rows). */
static void pack_scales(uint32_t type, const uint8_t *blk, int R, int r, uint8_t *sd)
{
    if (type == KERN_T_Q6_K) { /* d[R] (f16), then the int8 scales by pairs: sc[8][R][2] */
        const struct kern_block_q6_K *k = (const void *)blk;
        memcpy(sd + 2 * r, &k->d, 2);
        for (int j = 0; j < 16; j++)
            sd[2 * R + (j / 2) * 2 * R + 2 * r + j % 2] = (uint8_t)k->scales[j];
        return;
    }
    if (type != KERN_T_Q4_K && type != KERN_T_Q5_K) {
        memcpy(sd + 2 * r, blk, 2); /* the f16 d */
        if (type == KERN_T_Q4_1 || type == KERN_T_Q5_1)
            memcpy(sd + 2 * R + 2 * r, blk + 2, 2); /* then m[R] */
        return;
    }
    /* Q4_K / Q5_K (the same first 16 bytes): d[R], dmin[R] (f16), then sc[8][R], m[8][R] */
    static_assert(offsetof(struct kern_block_q5_K, scales) ==
                      offsetof(struct kern_block_q4_K, scales), "K block heads");
    const struct kern_block_q4_K *k = (const void *)blk;
    memcpy(sd + 2 * r, &k->d, 2);
    memcpy(sd + 2 * R + 2 * r, &k->dmin, 2);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        kern__scale_min_k4(j, k->scales, &sc, &m);
        sd[4 * R + j * R + r] = sc;
        sd[12 * R + j * R + r] = m;
    }
}

/* A Q5_0/Q5_1 block's 32 fifth bits (qh: bit e for element e) as the kernels read them:
 * byte k, bit 2i + h = element 4i + k + 16h, the fifth bit of nibble k of quant chunk i
 * (low nibbles h = 0, high h = 1). */
static void pack_fifth(const uint8_t qh[4], uint8_t out[4])
{
    uint32_t v = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 |
                 (uint32_t)qh[3] << 24;
    for (int k = 0; k < 4; k++) {
        out[k] = 0;
        for (int i = 0; i < 4; i++)
            for (int h = 0; h < 2; h++)
                out[k] |= (uint8_t)(((v >> (4 * i + k + 16 * h)) & 1) << (2 * i + h));
    }
}

/* A Q6_K block's quants (ql then qh, 192 bytes) rearranged within the same bytes so the
 * kernels build each 6-bit level with fewer operations. Chunk t (0..7) of half h gives, per
 * byte e, the levels L0..L3 of elements 4t + e + 32k of the half (k = 0..3); the file holds
 * their low nibbles in ql (L0, L2 in chunk t, L1, L3 in chunk t + 8) and their high 2-bit
 * fields in qh (bits 2k). The packed chunks at the same places hold
 *     X = L0 | (L2 >> 4) << 6,   Y = L1 | (L3 >> 4) << 6,   Z = (L2 & 15) | (L3 & 15) << 4
 * so L0 and L1 are one mask each and L2, L3 one shift of X or Y joined to a nibble of Z. */
static void pack_q6_K(const uint8_t in[192], uint8_t out[192])
{
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 32; i++) {
            const uint8_t a = in[64 * h + i], b = in[64 * h + 32 + i], hb = in[128 + 32 * h + i];
            const uint8_t l0 = (uint8_t)((a & 15) | (hb & 3) << 4);
            const uint8_t l1 = (uint8_t)((b & 15) | (hb >> 2 & 3) << 4);
            const uint8_t l2 = (uint8_t)((a >> 4) | (hb >> 4 & 3) << 4);
            const uint8_t l3 = (uint8_t)((b >> 4) | (hb >> 6) << 4);
            out[64 * h + i] = (uint8_t)(l0 | (l2 >> 4) << 6);
            out[64 * h + 32 + i] = (uint8_t)(l1 | (l3 >> 4) << 6);
            out[128 + 32 * h + i] = (uint8_t)((l2 & 15) | (l3 & 15) << 4);
        }
}

/* Group g of matrix src (rows in the file layout, rb bytes each) into dst. */
static void pack_group(const struct kern_packed *pk, const uint8_t *src, size_t rb, int64_t g,
                       uint8_t *dst)
{
    const int R = pk->R;
    const struct rp_type rt = rp_type(pk->type);
    const size_t bb = wtype_row_bytes(pk->type, rt.qk); /* one file block */
    /* the quants in file order: Q5_K's qh (8 chunks) then its nibbles, Q6_K's ql (32) then
     * qh (16) with their bits rearranged (pack_q6_K), as the kernels read them; Q5_0/Q5_1's
     * fifth bits rearranged (pack_fifth) in one chunk before their nibbles */
    const uint32_t t = pk->type;
    const size_t qoff = t == KERN_T_Q4_K   ? offsetof(struct kern_block_q4_K, qs)
                        : t == KERN_T_Q5_K ? offsetof(struct kern_block_q5_K, qh)
                        : t == KERN_T_Q6_K ? offsetof(struct kern_block_q6_K, ql)
                        : t == KERN_T_Q4_1 ? offsetof(struct kern_block_q4_1, qs)
                        : t == KERN_T_Q5_0 ? offsetof(struct kern_block_q5_0, qh)
                        : t == KERN_T_Q5_1 ? offsetof(struct kern_block_q5_1, qh)
                                           : 2;
    const bool q5 = t == KERN_T_Q5_0 || t == KERN_T_Q5_1;
    const bool flip = pk->type == KERN_T_Q8_0 && pk->level->rp_q8_u8;
    uint8_t *qd = dst, *sd = dst + (size_t)pk->nb * rt.qb * R;
    memset(dst, 0, pk->grp_bytes);
    for (int r = 0; r < R; r++) {
        int64_t row = g * R + r;
        if (row >= pk->rows)
            break; /* padding rows: zero scales, so they add nothing */
        const uint8_t *blk = src + (size_t)row * rb;
        for (int64_t b = 0; b < pk->nb; b++, blk += bb) {
            pack_scales(pk->type, blk, R, r, sd + (size_t)b * rt.sb * R);
            uint8_t *q = qd + (size_t)b * rt.qb * R;
            uint8_t rq[192]; /* Q5_0/Q5_1: fifth-bit chunk, then qs (which follows qh);
                                Q6_K: pack_q6_K's chunks */
            const uint8_t *qsrc = blk + qoff;
            if (q5) {
                pack_fifth(blk + qoff, rq);
                memcpy(rq + 4, blk + qoff + 4, 16);
                qsrc = rq;
            } else if (t == KERN_T_Q6_K) {
                pack_q6_K(blk + qoff, rq);
                qsrc = rq;
            }
            const uint32_t fx = flip ? 0x80808080u : 0; /* +128 in every byte */
            for (int i = 0; i < rt.qb / 4; i++) {
                uint32_t v;
                memcpy(&v, qsrc + 4 * i, 4);
                v ^= fx;
                memcpy(q + ((size_t)i * R + r) * 4, &v, 4);
            }
        }
    }
}

/* The groups of every matrix handed out to the pool's threads (each group is written by one
 * thread, from its own rows: no two threads touch the same bytes). */
struct pack_job {
    const struct kern_packed *pk;
    const uint8_t *w;
    size_t rb;
    _Atomic int64_t next; /* the next of n_mat x groups not yet handed out */
};

static void pack_task(void *ctx, int ith, int nth)
{
    struct pack_job *j = ctx;
    const struct kern_packed *pk = j->pk;
    const int64_t total = pk->n_mat * pk->groups;
    int64_t i0, c;
    (void)ith;
    while ((c = kern__claim(&j->next, total, nth, 1, 64, &i0)) > 0)
        for (int64_t i = i0; i < i0 + c; i++) {
            int64_t m = i / pk->groups, g = i % pk->groups;
            pack_group(pk, j->w + (size_t)m * pk->mat_bytes, j->rb, g,
                       pk->data + (size_t)i * pk->grp_bytes);
        }
}

int kern_pack_new(struct kern_pool *p, struct kern_packed **out, uint32_t type, const void *w,
                  int64_t rows, int64_t cols, int64_t n_mat)
{
    *out = NULL;
    if (!kern_pack_supported(type, cols))
        return -ENOTSUP;
    size_t rb = wtype_row_bytes(type, cols);
    if (rows <= 0 || n_mat <= 0 || rb == 0 || (uint64_t)rows > SIZE_MAX / rb ||
        (uint64_t)n_mat > SIZE_MAX / ((size_t)rows * rb))
        return -EINVAL;
    struct kern_packed *pk = calloc(1, sizeof *pk);
    if (!pk)
        return -ENOMEM;
    pk->level = kern__simd_get();
    pk->type = type;
    pk->R = pk->level->rp_rows;
    pk->rows = rows;
    pk->cols = cols;
    pk->n_mat = n_mat;
    const struct rp_type rt = rp_type(type);
    pk->nb = cols / rt.qk;
    pk->groups = (rows + pk->R - 1) / pk->R;
    pk->grp_bytes = ((size_t)pk->nb * (rt.qb + rt.sb) * pk->R + 63) / 64 * 64;
    pk->mat_bytes = (size_t)rows * rb;
    size_t total;
    if (__builtin_mul_overflow(pk->grp_bytes, (size_t)pk->groups, &total) ||
        __builtin_mul_overflow(total, (size_t)n_mat, &total) ||
        !(pk->data = util_alloc_huge(total))) {
        free(pk);
        return -ENOMEM;
    }
    struct pack_job j = {.pk = pk, .w = w, .rb = rb};
    atomic_store(&j.next, 0);
    kern__pool_run_dyn(p, pack_task, &j);
    *out = pk;
    return 0;
}

void kern_pack_free(struct kern_packed *pk)
{
    if (!pk)
        return;
    free(pk->data);
    free(pk);
}

size_t kern_pack_bytes(const struct kern_packed *pk)
{
    return pk ? pk->grp_bytes * (size_t)pk->groups * (size_t)pk->n_mat : 0;
}

int64_t kern_pack_find(const struct kern_packed *pk, uint32_t type, int64_t rows, int64_t cols,
                       size_t off)
{
    if (!pk || pk->type != type || pk->rows != rows || pk->cols != cols ||
        pk->level != kern__simd_get() || off % pk->mat_bytes != 0 ||
        off / pk->mat_bytes >= (uint64_t)pk->n_mat)
        return -1;
    return (int64_t)(off / pk->mat_bytes);
}

/* ---- matmul over a packed matrix ---- */

/* Activation rows a work item takes per pass over its groups (their quants stay in L2). */
#define COL_BLOCK 64

struct pk_job {
    const struct kern_packed *pk;
    const uint8_t *mat;   /* the matrix's first group */
    float *y;
    int64_t n;
    uint8_t *xq;
    size_t xs;
    kern__rp_fn gemm;
    int64_t max_chunk;    /* most groups per work item */
    _Atomic int64_t next; /* first group not yet handed out */
};

/* Groups g0..g1 against every activation row, COL_BLOCK rows at a time. */
static void pk_groups(struct pk_job *j, int64_t g0, int64_t g1)
{
    const struct kern_packed *pk = j->pk;
    const int R = pk->R;
    float tmp[KERN_RP_MAXCOL * 16];
    for (int64_t c0 = 0; c0 < j->n; c0 += COL_BLOCK) {
        int64_t c1 = c0 + COL_BLOCK < j->n ? c0 + COL_BLOCK : j->n;
        for (int64_t g = g0; g < g1; g++) {
            const uint8_t *grp = j->mat + (size_t)g * pk->grp_bytes;
            int valid = pk->rows - g * R < R ? (int)(pk->rows - g * R) : R;
            for (int64_t c = c0; c < c1; c += KERN_RP_MAXCOL) {
                int nc = c1 - c < KERN_RP_MAXCOL ? (int)(c1 - c) : KERN_RP_MAXCOL;
                j->gemm(grp, pk->nb, j->xq + c * j->xs, j->xs, nc, tmp);
                for (int k = 0; k < nc; k++)
                    memcpy(j->y + (c + k) * pk->rows + g * R, tmp + k * R,
                           (size_t)valid * sizeof(float));
            }
        }
    }
}

/* Guided self-scheduling over groups (kern__claim), as kern_matmul does over rows. */
static void pk_task(void *ctx, int ith, int nth)
{
    struct pk_job *j = ctx;
    (void)ith;
    int64_t g0, c;
    while ((c = kern__claim(&j->next, j->pk->groups, nth, 1, j->max_chunk, &g0)) > 0)
        pk_groups(j, g0, g0 + c);
}

size_t kern_pack_scratch(uint32_t type, int64_t cols, int64_t n)
{
    if (!kern_pack_supported(type, cols) || n <= 0)
        return 0;
    size_t xs = kern__rp_act_bytes(type, cols);
    return (uint64_t)n > SIZE_MAX / xs ? SIZE_MAX : (size_t)n * xs;
}

int kern_matmul_packed(struct kern_pool *p, const struct kern_packed *pk, int64_t mat,
                       const float *x, int64_t n, float *y)
{
    if (!pk || mat < 0 || mat >= pk->n_mat || n < 0 || pk->level != kern__simd_get())
        return -EINVAL;
    if (n == 0)
        return 0;
    struct pk_job j = {
        .pk = pk, .mat = pk->data + (size_t)mat * pk->groups * pk->grp_bytes, .y = y,
        .n = n, .xs = kern__rp_act_bytes(pk->type, pk->cols),
        .gemm = pk->level->rp_gemm[pk->type],
    };
    if ((uint64_t)n > SIZE_MAX / j.xs)
        return -EINVAL;
    j.xq = p ? kern__pool_scratch(p, (size_t)n * j.xs) : malloc((size_t)n * j.xs);
    if (!j.xq)
        return p ? -ENOSPC : -ENOMEM;
    kern__act_quant(p, pk->level->rp_quant[pk->type], KERN_T_COUNT, x, pk->cols, n, j.xq, j.xs);
    /* A work item's groups re-read per COL_BLOCK activation rows: keep them within ~256 KB. */
    int64_t mc = (int64_t)((256 << 10) / pk->grp_bytes);
    j.max_chunk = mc < 1 ? 1 : mc;
    atomic_store(&j.next, 0);
    kern__pool_run_dyn(p, pk_task, &j);
    if (!p)
        free(j.xq);
    return 0;
}
