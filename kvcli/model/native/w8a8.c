/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias) on AMX-INT8 tiles with int8 weights per output channel
 * and int8 activations per 64 values (W8A8): `--precision fast`'s matmuls of a few rows (batched
 * decode steps) on CPUs with AMX, beside the GGUF weights' integer kernels (qint.c) and the
 * bfloat16 copy that many-row calls run (quant/int_weights.py).
 *
 * Why a second int8 form: qint.c multiplies the GGUF's own blocks, and every 32-value block has
 * its own weight scale (and Q4_1 a minimum), so each block's 16 x 16 int32 sums go through memory
 * into ~5 float instructions per 16 sums (qint_amx.h). Here a channel has one scale, so a tile's
 * sums over 64 values are folded with one convert and one multiply-add per 16 (the activations'
 * scale of that 64-value group), a quarter of the float work per product; at 32 rows a SmolLM2-
 * 135M step's 120 matmuls ran 13.9-14.2 ms against 18.7-19.9 ms (Xeon with AMX, 2 threads,
 * weights cold; quant/w8a8.py has the row counts where the blocks' fewer bytes win).
 * The price is a second rounding of the weights (the GGUF's values to 8 bits per channel) and
 * coarser activation groups: measured in docs/BENCHMARKS.md.
 *
 * Layout (kvcli_w8a8_pack): per group of 16 channels and step of 64 values one 1 KB B tile, row
 * kk holding each channel's 4 values k = 4 kk .. 4 kk + 3 (tdpbssd's VNNI layout); channels past
 * N and values past K are zero. One float32 scale per channel: w ~ scale * code, code in
 * [-127, 127], rounded to nearest even. Activations are rounded the same way per 64 values into
 * rows padded to whole tiles of 16 (zero codes), so every call runs whole tiles.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#define STEP 64  /* values per tile product and per activation scale */
#define GROUP 16 /* channels per B tile */
#define TILE 16  /* rows per A tile */

static inline int64_t steps(int64_t K) { return (K + STEP - 1) / STEP; }
static inline int64_t groups(int64_t N) { return (N + GROUP - 1) / GROUP; }

/* Bytes of the packed weights of an [N, K] matrix. */
int64_t kvcli_w8a8_bytes(int64_t N, int64_t K) { return groups(N) * steps(K) * GROUP * STEP; }

/* One row of n values to int8 codes (to nearest even) with scale max|v| / 127 (0: all zero). */
static float round_row(const float *v, int64_t n, int8_t *codes) {
    float amax = 0.0f;
    for (int64_t k = 0; k < n; k++) amax = fmaxf(amax, fabsf(v[k]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    for (int64_t k = 0; k < n; k++) codes[k] = (int8_t)rintf(v[k] * inv);
    return amax / 127.0f;
}

/* w [N, K] float32 (row-major) to the packed tiles and N channel scales. */
void kvcli_w8a8_pack(const float *w, int8_t *packed, float *scales, int64_t N, int64_t K) {
    const int64_t S = steps(K);
    int8_t *codes = calloc((size_t)(S * STEP), 1);
    memset(packed, 0, (size_t)kvcli_w8a8_bytes(N, K));
    for (int64_t n = 0; n < N && codes; n++) {
        scales[n] = round_row(w + n * K, K, codes);
        int8_t *tile = packed + (n / GROUP) * S * GROUP * STEP + (n % GROUP) * 4;
        for (int64_t k = 0; k < K; k++) /* tile s, row kk = (k % 64) / 4, byte k % 4 */
            tile[(k / STEP) * GROUP * STEP + (k % STEP) / 4 * 64 + k % 4] = codes[k];
    }
    free(codes);
}

/* Built where qint.c builds its AMX variant (the same compilers): native.w8a8_available asks
 * kvcli_qint_variants and kvcli_qint_amx_ready, qint.c's request for the tiles. */
#if defined(__linux__) && defined(__x86_64__) && defined(__GNUC__) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl")
#include "amx_tiles.h"

typedef struct {
    const float *x, *scales, *bias;
    const int8_t *w;
    int8_t *q;  /* [Mp, S * 64] activation codes */
    float *sx;  /* [Mp, S] their scales */
    float *y;
    int64_t M, Mp, N, K;
} w8_args;

/* Rows [r0, r1) of x to codes and scales per 64 values; rows past M are zero. */
static void quantize_part(const void *args, int64_t t, int64_t n) {
    const w8_args *a = args;
    const int64_t S = steps(a->K), r0 = a->Mp * t / n, r1 = a->Mp * (t + 1) / n;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t s = 0; s < S; s++) {
            int8_t *q = a->q + (r * S + s) * STEP;
            const int64_t len = a->K - s * STEP < STEP ? a->K - s * STEP : STEP;
            if (r >= a->M) {
                memset(q, 0, STEP);
                a->sx[r * S + s] = 0.0f;
                continue;
            }
            const float *v = a->x + r * a->K + s * STEP;
            __m512 x[4], m = _mm512_setzero_ps();
            for (int j = 0; j < 4; j++) {
                const int64_t left = len - 16 * j;
                const __mmask16 k = left >= 16 ? 0xFFFF : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
                x[j] = _mm512_maskz_loadu_ps(k, v + 16 * j);
                m = _mm512_max_ps(m, _mm512_abs_ps(x[j]));
            }
            const float amax = _mm512_reduce_max_ps(m);
            const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            for (int j = 0; j < 4; j++) /* to nearest even, as qint.c rounds activations */
                _mm_storeu_si128((__m128i *)(q + 16 * j),
                                 _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(x[j], inv))));
            a->sx[r * S + s] = amax / 127.0f;
        }
}

/* Steps in flight: step s's sums are folded after step s + LAG's product is issued, so the
 * tiles' latencies hide behind the float work; the sums rotate through tiles 4-7. */
#define LAG 2
#define PRODUCT(T)                                                                               \
    do {                                                                                         \
        _tile_zero(T);                                                                           \
        _tile_dpbssd(T, 0, 2);                                                                   \
        _tile_stored(T, c[T - 4], 64);                                                           \
    } while (0)

/* Rows [i, i + 16) x group g over the whole K, into y (with the channel scales and the bias). */
static inline __attribute__((always_inline)) void tile_rows(const w8_args *a, int64_t i, int64_t g,
                                                            const int8_t *next, int32_t (*c)[256]) {
    const int64_t S = steps(a->K), ks = S * STEP;
    const int8_t *wb = a->w + g * S * GROUP * STEP, *xq = a->q + i * ks;
    const float *sx = a->sx + i * S;
    __m512 acc[TILE];
#pragma GCC unroll 16
    for (int r = 0; r < TILE; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t s = 0; s < S + LAG; s++) {
        if (s < S) {
            if (next) /* the next group's tile for this step, from memory into L2 meanwhile */
                for (int line = 0; line < GROUP * STEP; line += 64)
                    _mm_prefetch((const char *)next + s * GROUP * STEP + line, _MM_HINT_T1);
            _tile_loadd(0, xq + s * STEP, ks);
            _tile_loadd(2, wb + s * GROUP * STEP, 64);
            switch (s & 3) {
            case 0: PRODUCT(4); break;
            case 1: PRODUCT(5); break;
            case 2: PRODUCT(6); break;
            default: PRODUCT(7); break;
            }
        }
        if (s < LAG) continue;
        const int64_t f = s - LAG;
        const int32_t *sums = c[f & 3];
#pragma GCC unroll 16
        for (int r = 0; r < TILE; r++)
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(sums + r * 16)),
                                     _mm512_set1_ps(sx[r * S + f]), acc[r]);
    }
    const int64_t n0 = g * GROUP, cols = a->N - n0 < GROUP ? a->N - n0 : GROUP;
    const __mmask16 keep = cols == GROUP ? 0xFFFF : (__mmask16)((1u << cols) - 1);
    const __m512 d = _mm512_maskz_loadu_ps(keep, a->scales + n0);
    const __m512 b = a->bias ? _mm512_maskz_loadu_ps(keep, a->bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < TILE && i + r < a->M; r++)
        _mm512_mask_storeu_ps(a->y + (i + r) * a->N + n0, keep, _mm512_fmadd_ps(acc[r], d, b));
}
#undef PRODUCT

/* The thread's share of the channel groups, every row tile. */
static void gemm_part(const void *args, int64_t t, int64_t n) {
    const w8_args *a = args;
    const int64_t G = groups(a->N), g0 = G * t / n, g1 = G * (t + 1) / n;
    amx_tiles_16x64();
    int32_t c[4][256] __attribute__((aligned(64)));
    const int64_t bytes = steps(a->K) * GROUP * STEP;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t i = 0; i < a->Mp; i += TILE)
            tile_rows(a, i, g, i == 0 && g + 1 < g1 ? a->w + (g + 1) * bytes : NULL, c);
    _tile_release();
}
#pragma GCC pop_options

/* Returns 0; -1 where this build has no kernel; -2 out of memory. The caller must have checked
 * native.w8a8_available (the CPU has AMX-INT8 and the tiles are granted). */
int kvcli_w8a8_gemm(const float *x, const int8_t *w, const float *scales, const float *bias,
                    float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    const int64_t Mp = (M + TILE - 1) / TILE * TILE, S = steps(K);
    int8_t *q = aligned_alloc(64, (size_t)(Mp * S * STEP));
    float *sx = malloc(sizeof(float) * (size_t)(Mp * S));
    if (!q || !sx) {
        free(q), free(sx);
        return -2;
    }
    const w8_args a = {x, scales, bias, w, q, sx, y, M, Mp, N, K};
    kvcli_parallel_rows(quantize_part, &a, Mp >= 4 * TILE ? threads : 1, M);
    const int64_t G = groups(N);
    kvcli_parallel_rows(gemm_part, &a, threads < G ? threads : G, M);
    free(q), free(sx);
    return 0;
}
#else
int kvcli_w8a8_gemm(const float *x, const int8_t *w, const float *scales, const float *bias,
                    float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    (void)x, (void)w, (void)scales, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)threads;
    return -1;
}
#endif
