/* The integer matmul on AMX-INT8 tiles (qint.c's variant 3, included after the AVX512-VNNI
 * variant under a target that adds amx-tile and amx-int8). One `tdpbsud` multiplies a 16-row
 * tile of int8 activations (one 32-value block) by a 32 x 16 block of the weights' unsigned
 * bytes: the packed layout's 8 x 64 bytes per block and group (qint_layout.h) are already the
 * B tile's VNNI layout, so byte types load as they are and nibbles are unpacked once per group
 * and row panel. The 16 x 16 int32 sums go through memory into the same float work per block as
 * the VNNI tile's, in the same order, so every output equals the AVX512-VNNI variant's bit for
 * bit. Rows past the last whole 16 take the VNNI tiles, and so do calls of fewer than 16 rows
 * and Q6_K (two scales a block).
 * That float work, ~4 vector instructions per 16 sums and block, is what bounds this kernel: it
 * ran 1.1-1.2x the VNNI kernel on the default model's Q4_1 layers at 16-512 rows and ~1.0x on
 * I8 (a Xeon with AMX, 2026-12-06, docs/BENCHMARKS.md); the tiles alone (loads, tdpbsud and
 * the 1 KB store of each block's sums) ran at ~775 GMAC/s a core there, 16 rows x one group
 * in turn, as here.
 */

#define AMX_AI inline __attribute__((always_inline))

#include "amx_tiles.h"

/* Tiles: 0, 1 activations (16 rows x 32 bytes), 2, 3 weights (8 k-groups x 64 bytes), 4-7
 * sums (16 x 16 int32), in turn (amx_tile). Tile state is per thread. */
static AMX_AI void amx_configure(void) {
    static const uint8_t rows[8] = {AMX_ROWS, AMX_ROWS, 8,        8,
                                    AMX_ROWS, AMX_ROWS, AMX_ROWS, AMX_ROWS};
    static const uint16_t colsb[8] = {32, 32, 64, 64, 64, 64, 64, 64};
    amx_load_config(rows, colsb);
}

/* Group g's nibbles to bytes, 512 per block: vector kg's low nibbles are k-group kg, its high
 * ones kg + 4. */
static AMX_AI void amx_unpack(const qint_args *a, const int type, const int64_t g, uint8_t *out) {
    const int64_t kb = a->K / 32, tb = tile_bytes(type);
    const uint8_t *w = a->w + g * kb * tb;
    const __m512i low = _mm512_set1_epi8(15);
    for (int64_t b = 0; b < kb; b++, w += tb, out += 512)
        for (int v = 0; v < 4; v++) {
            const __m512i q = _mm512_loadu_si512((const void *)(w + v * 64));
            _mm512_store_si512((void *)(out + v * 64), _mm512_and_si512(q, low));
            _mm512_store_si512((void *)(out + (v + 4) * 64),
                               _mm512_and_si512(_mm512_srli_epi16(q, 4), low));
        }
}

/* Block b's int32 sums c of rows [i, i + 16) x group g into acc: the VNNI tile's float work
 * (qint_kernel.h QN(tile)), in its order, with the sums' starting value -off * sum(qx) added
 * here. */
static AMX_AI void amx_fold(const qint_args *a, const int type, const int64_t i, const int64_t g,
                            const int64_t b, const int32_t *c, __m512 acc[AMX_ROWS]) {
    const int64_t kb = a->K / 32, tb = tile_bytes(type);
    const uint8_t *sc = a->w + g * kb * tb + b * tb + qs_bytes(type);
    const __m512 dw = type == I8 ? _mm512_set1_ps(1.0f) : scale_vnni512(type, sc, 0, 0);
    const __m512 mw = two_scales(type) ? scale_vnni512(type, sc, 0, 1) : _mm512_setzero_ps();
    const float *dx = a->d + i * kb + b, *sx = a->s + i * kb + b;
    const int32_t *o = a->o + i * kb + b;
#pragma GCC unroll 16 /* acc stays in registers */
    for (int r = 0; r < AMX_ROWS; r++) {
        __m512i isum = _mm512_load_si512((const void *)(c + r * GROUP));
        if (!nibble_min(type)) isum = _mm512_add_epi32(isum, _mm512_set1_epi32(o[r * kb]));
        const __m512 sum = _mm512_cvtepi32_ps(isum), x = _mm512_set1_ps(dx[r * kb]);
        if (type == I8) {
            acc[r] = _mm512_fmadd_ps(sum, x, acc[r]);
            continue;
        }
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(sum, x), dw, acc[r]);
        if (two_scales(type)) acc[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(sx[r * kb]), acc[r]);
    }
}

/* acc (rows [i, i + 16) of group g) to y, with I8's channel scales and the bias. */
static AMX_AI void amx_store(const qint_args *a, const int type, const int64_t i, const int64_t g,
                             const __m512 acc[AMX_ROWS]) {
    const int64_t n0 = g * GROUP, gs = a->K / 32 * tile_bytes(type);
    const int full = n0 + GROUP <= a->N;
    const __m512 dw = type == I8 ? _mm512_loadu_ps((const float *)(a->w + g * gs + qs_bytes(type)))
                                 : _mm512_set1_ps(1.0f);
    const __m512 bias = a->bias && full ? _mm512_loadu_ps(a->bias + n0) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int r = 0; r < AMX_ROWS; r++) store_row_vnni512(a, i + r, n0, _mm512_fmadd_ps(acc[r], dw, bias));
}

/* Block b's product into sum tile T from activation tile A and weight tile B, stored to c. */
#define AMX_BLOCK(T, A, B)                                                                      \
    do {                                                                                        \
        _tile_loadd(A, x + b * 32, a->K);                                                       \
        _tile_loadd(B, wb + b * wstride, 64);                                                   \
        _tile_zero(T);                                                                          \
        _tile_dpbsud(T, A, B);                                                                  \
        _tile_stored(T, c[b & 3], 64);                                                          \
    } while (0)

/* Blocks in flight: block b's sums are folded after block b + AMX_LAG's product is issued, so
 * the tiles' latencies (load, tdpbsud, store) hide behind the float work. Tiles rotate so no
 * block waits on the previous one's registers: activations 0, 1; weights 2, 3; sums 4-7. */
#define AMX_LAG 2

/* Rows [i, i + 16) x group g over the whole K; the B tile of block b at wb + b * wstride. */
static AMX_AI void amx_tile(const qint_args *a, const int type, const int64_t i, const int64_t g,
                            const uint8_t *wb, const int64_t wstride, int32_t (*c)[256]) {
    const int64_t kb = a->K / 32;
    const int8_t *x = a->q + i * a->K;
    __m512 acc[AMX_ROWS];
#pragma GCC unroll 16
    for (int r = 0; r < AMX_ROWS; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; b++) {
        switch (b & 3) {
        case 0: AMX_BLOCK(4, 0, 2); break;
        case 1: AMX_BLOCK(5, 1, 3); break;
        case 2: AMX_BLOCK(6, 0, 2); break;
        default: AMX_BLOCK(7, 1, 3); break;
        }
        if (b >= AMX_LAG) amx_fold(a, type, i, g, b - AMX_LAG, c[(b - AMX_LAG) & 3], acc);
    }
    for (int64_t b = kb > AMX_LAG ? kb - AMX_LAG : 0; b < kb; b++) amx_fold(a, type, i, g, b, c[b & 3], acc);
    amx_store(a, type, i, g, acc);
}
#undef AMX_BLOCK

/* Rows per AMX panel: the panel's quantized rows (~256 KB) stay in L2 while the thread's groups
 * pass by, each group's weights (unpacked) in L1 while every row tile of the panel meets them. */
static AMX_AI int64_t amx_panel_rows(const int64_t K) {
    const int64_t rows = 262144 / K / AMX_ROWS * AMX_ROWS;
    return rows > AMX_ROWS ? rows : AMX_ROWS;
}

/* The thread's share of groups (as the AVX-512 variant splits them): whole 16-row tiles on AMX,
 * the rest of the rows on the VNNI tiles. */
static AMX_AI void amx_part(const qint_args *a, const int type, const int64_t t, const int64_t n) {
    const int64_t tiles = ((a->N + GROUP - 1) / GROUP + TILE_GROUPS_512 - 1) / TILE_GROUPS_512;
    const int64_t g0 = tiles * t / n * TILE_GROUPS_512, g1 = tiles * (t + 1) / n * TILE_GROUPS_512;
    const int64_t groups = (a->N + GROUP - 1) / GROUP, end = g1 < groups ? g1 : groups;
    const int64_t kb = a->K / 32, tb = tile_bytes(type), panel = amx_panel_rows(a->K);
    uint8_t *unpacked = is_byte(type) ? NULL : aligned_alloc(64, (size_t)kb * 512);
    int32_t c[4][256] __attribute__((aligned(64)));
    const int64_t done = !is_byte(type) && !unpacked ? 0 : a->M / AMX_ROWS * AMX_ROWS; /* no memory: VNNI */
    if (done) amx_configure();
    for (int64_t r0 = 0; r0 < done; r0 += panel) {
        const int64_t r1 = r0 + panel < done ? r0 + panel : done;
        for (int64_t g = g0; g < end; g++) {
            if (unpacked) amx_unpack(a, type, g, unpacked);
            const uint8_t *wb = unpacked ? unpacked : a->w + g * kb * tb;
            for (int64_t i = r0; i < r1; i += AMX_ROWS) amx_tile(a, type, i, g, wb, unpacked ? 512 : tb, c);
        }
    }
    if (done) _tile_release();
    free(unpacked);
    if (done < a->M) rows_vnni512(a, type, done, a->M, g0, end);
}

#define AMX_PART(name, TYPE)                                                                    \
    static void name##_amx(const void *a, int64_t t, int64_t n) {                               \
        amx_part((const qint_args *)a, TYPE, t, n);                                             \
    }
AMX_PART(part_q4_0, Q4_0)
AMX_PART(part_q4_1, Q4_1)
AMX_PART(part_q8_0, Q8_0)
AMX_PART(part_i8, I8)
AMX_PART(part_q4_k, Q4_K)
AMX_PART(part_q5_k, Q5_K)
#undef AMX_PART
