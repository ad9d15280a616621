/* fast's prefill MLP front on AMX-BF16 tiles: act[M, F] = silu(x @ Wg^T) * (x @ Wu^T) rounded
 * to bfloat16 for the down projection, from bfloat16 rows x and bfloat16 gate and up matrices laid
 * out once as B tiles (kvcli_swiglu_pack). The numbers are oneDNN's bfloat16 matmuls': the same
 * bfloat16 products summed in float32 (in another order), SiLU and the product in float32, one
 * rounding to bfloat16 at the end.
 *
 * Why not oneDNN's two calls (gate with a swish post-op, up with a binary multiply by it): they
 * write the gate's activations to memory and read them back. As a plain matmul this blocking is
 * no faster than oneDNN's at 1,024 rows; the gain is the fusion (1,024 rows x 576 -> 2 x 1,536
 * on a Xeon with AMX, 2 threads: 1.63 ms against 1.77; docs/BENCHMARKS.md).
 *
 * Blocking (as w8a8.c's tiles): 2 row tiles x (gate group g, up group g) a block (tiles 4-7), their
 * A tiles (0-1) and B tiles (2-3) loaded once a 32-value step and each used twice; a thread takes
 * a run of channel groups and walks every row pair for each (a group's B tiles, 2 x K x 64 bytes,
 * stay in L1). A block's float32 sums are folded while the next block's products run.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define GROUP 16 /* channels per B tile */
#define PAIRS 16 /* k pairs per B tile: 32 values */
#define TILE 16  /* rows per A tile */

static inline int64_t groups(int64_t F) { return (F + GROUP - 1) / GROUP; }

/* Elements (uint16) of the packed copy of an [F, K] matrix (K a multiple of 32). */
int64_t kvcli_swiglu_packed_size(int64_t F, int64_t K) { return groups(F) * K * GROUP; }

/* w [F, K] bfloat16 (row-major) to B tiles: group g, step s (values 32 s .. 32 s + 31) is one
 * 1 KB tile whose row kk holds each channel's values 2 kk, 2 kk + 1 of the step (tdpbf16ps's
 * pairs); channels past F are zero. K must be a multiple of 32. */
void kvcli_swiglu_pack(const uint16_t *w, uint16_t *packed, int64_t F, int64_t K) {
    const int64_t S = K / (2 * PAIRS);
    memset(packed, 0, sizeof(uint16_t) * (size_t)kvcli_swiglu_packed_size(F, K));
    for (int64_t n = 0; n < F; n++)
        for (int64_t k = 0; k < K; k++) {
            const int64_t g = n / GROUP, s = k / (2 * PAIRS), kk = (k % (2 * PAIRS)) / 2;
            packed[((g * S + s) * PAIRS + kk) * 2 * GROUP + (n % GROUP) * 2 + k % 2] = w[n * K + k];
        }
}

#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")
#include "amx_tiles.h"
#include "vexp.h"

typedef struct {
    const uint16_t *x;         /* [M, K] bfloat16 */
    const uint16_t *tail;      /* the last row tile's rows, zero-padded to 16 (NULL: M % 16 == 0) */
    const uint16_t *wg, *wu;   /* packed [F, K] each */
    uint16_t *out;             /* [M, F] bfloat16 */
    int64_t M, Mp, F, K;
} swiglu_args;

/* Row tile i's first row (its rows K values apart). */
static inline const uint16_t *rows_at(const swiglu_args *a, int64_t i) {
    return i + TILE <= a->M ? a->x + i * a->K : a->tail;
}

/* Rows [r0, r1) of the 32 of the block at row i: the gate and up sums c[0], c[1] (first row
 * tile) and c[2], c[3] (second) into out as silu(gate) * up, rounded to bfloat16. */
static inline void fold_rows(const swiglu_args *a, float (*c)[256], int64_t i, int64_t g, int r0,
                             int r1) {
    const int64_t n0 = g * GROUP, cols = a->F - n0 < GROUP ? a->F - n0 : GROUP;
    const __mmask16 keep = cols == GROUP ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    for (int r = r0; r < r1 && i + r < a->M; r++) {
        const float *cg = c[2 * (r / TILE)] + (r % TILE) * 16, *cu = cg + 256;
        const __m512 y = silu_mul16(_mm512_load_ps(cg), _mm512_load_ps(cu));
        _mm256_mask_storeu_epi16(a->out + (i + r) * a->F + n0, keep,
                                 (__m256i)_mm512_cvtneps_pbh(y));
    }
}

/* Gate group g and up group g over every pair of row tiles; a block's sums alternate between
 * the halves of c, folded a few rows a step while the next block's products run. */
static inline void group(const swiglu_args *a, int64_t g, float (*c)[4][256]) {
    const int64_t S = a->K / (2 * PAIRS), tile = PAIRS * 2 * GROUP, stride = a->K * 2;
    const uint16_t *b0 = a->wg + g * S * tile, *b1 = a->wu + g * S * tile;
    int64_t pending = -1; /* the row of the block whose sums wait in c[1 - cur] */
    int cur = 0;
    for (int64_t i = 0; i < a->Mp; i += 2 * TILE) {
        const uint16_t *x0 = rows_at(a, i);
        const uint16_t *x1 = i + TILE < a->Mp ? rows_at(a, i + TILE) : x0; /* else unused */
        _tile_zero(4);
        _tile_zero(5);
        _tile_zero(6);
        _tile_zero(7);
        for (int64_t s = 0; s < S; s++) {
            _tile_loadd(0, x0 + s * 2 * PAIRS, stride);
            _tile_loadd(2, b0 + s * tile, 64);
            _tile_dpbf16ps(4, 0, 2);
            _tile_loadd(3, b1 + s * tile, 64);
            _tile_dpbf16ps(5, 0, 3);
            _tile_loadd(1, x1 + s * 2 * PAIRS, stride);
            _tile_dpbf16ps(6, 1, 2);
            _tile_dpbf16ps(7, 1, 3);
            if (pending >= 0)
                fold_rows(a, c[1 - cur], pending, g, (int)(2 * TILE * s / S),
                          (int)(2 * TILE * (s + 1) / S));
        }
        _tile_stored(4, c[cur][0], 64);
        _tile_stored(5, c[cur][1], 64);
        _tile_stored(6, c[cur][2], 64);
        _tile_stored(7, c[cur][3], 64);
        pending = i, cur = 1 - cur;
    }
    if (pending >= 0) fold_rows(a, c[1 - cur], pending, g, 0, 2 * TILE);
}

/* The thread's run of channel groups. */
static void swiglu_part(const void *args, int64_t t, int64_t n) {
    const swiglu_args *a = args;
    const int64_t G = groups(a->F);
    float c[2][4][256] __attribute__((aligned(64)));
    amx_tiles_16x64();
    for (int64_t g = G * t / n; g < G * (t + 1) / n; g++) group(a, g, c);
    _tile_release();
}
#pragma GCC pop_options

/* 1: this build has the kernel (native.swiglu_amx_available asks it beside the CPU's flags). */
int64_t kvcli_swiglu_built(void) { return 1; }

/* x [M, K] bfloat16; wg, wu: kvcli_swiglu_pack's copies of the [F, K] gate and up matrices; out
 * [M, F] bfloat16. Returns 0; -1 where this build has no kernel; -2 out of memory. The caller
 * must have checked native.swiglu_amx_available (AMX-BF16, tiles granted) and K % 32 == 0. */
int kvcli_swiglu_bf16(const uint16_t *x, const uint16_t *wg, const uint16_t *wu, uint16_t *out,
                      int64_t M, int64_t F, int64_t K, int64_t threads) {
    const int64_t Mp = (M + TILE - 1) / TILE * TILE, left = M % TILE;
    uint16_t *tail = NULL;
    if (left) { /* a tile load reads 16 rows: the last ones from a padded copy, not past x */
        tail = calloc((size_t)(TILE * K), sizeof(uint16_t));
        if (!tail) return -2;
        memcpy(tail, x + (M - left) * K, sizeof(uint16_t) * (size_t)(left * K));
    }
    const swiglu_args a = {x, tail, wg, wu, out, M, Mp, F, K};
    const int64_t G = groups(F);
    kvcli_parallel_rows(swiglu_part, &a, threads < G ? threads : G, M);
    free(tail);
    return 0;
}
#else
int64_t kvcli_swiglu_built(void) { return 0; }

int kvcli_swiglu_bf16(const uint16_t *x, const uint16_t *wg, const uint16_t *wu, uint16_t *out,
                      int64_t M, int64_t F, int64_t K, int64_t threads) {
    (void)x, (void)wg, (void)wu, (void)out, (void)M, (void)F, (void)K, (void)threads;
    return -1;
}
#endif
