/* y[M, N] = x[M, K] @ W^T (+ bias) with bfloat16 weights on AVX512_BF16 (`vdpbf16ps`).
 *
 * --dtype bfloat16 on a CPU without AMX: oneDNN's bf16 GEMM costs ~100 us of fixed overhead per
 * call (a decode step makes 121), more than the 576 x 576 weights take to stream. Here the
 * weights are laid out once (kvcli_bf16_pack) as [N / 16][K / 2][16][2] bfloat16: one 64-byte
 * vector holds a pair of k for 16 outputs, what `vdpbf16ps` multiplies with a broadcast pair of
 * x (x rounded to bfloat16 per call, round-to-nearest-even as torch's .to(bfloat16)), summed in
 * float32. Each 16-column block is one contiguous stream. Threads split the column blocks; each
 * walks its columns in groups of NB blocks (NB x K x 32 bytes, ~74 KB at K = 576, held in L2)
 * and multiplies every row tile of a row panel against a group before the next, so the weights
 * come from memory once per panel.
 *
 * Built with a target attribute whatever -march the library has; kvcli_bf16_gemm_available says
 * whether this build has the kernel (x86 GCC/Clang), the CPU's flags whether it may run (Python).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define KVCLI_HAS_BF16 1
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
#include <immintrin.h>

#define NB 4   /* column blocks of 16 per group */
#define MR 6   /* rows per tile: MR x NB accumulators + NB weights fit 32 registers */
#define MB 96  /* rows per panel */

typedef struct {
    const uint32_t *xp; /* [M][K2] bf16 pairs */
    const uint16_t *w;  /* packed weights */
    const float *bias;
    float *y;
    int64_t M, N, K2, blocks;
} bf16_args;

/* Rows [i, i + R) x column blocks [b0, b0 + nb) (nb <= NB) over all K. */
static inline __attribute__((always_inline)) void tile(const bf16_args *a, int64_t i, int R,
                                                       int64_t b0, const int nb) {
    __m512 acc[MR][NB];
    for (int b = 0; b < NB; b++) {
        const int64_t col = (b0 + b) * 16;
        __m512 init = _mm512_setzero_ps();
        if (a->bias != NULL && b < nb) {
            const int64_t left = a->N - col;
            init = _mm512_maskz_loadu_ps(left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1),
                                         a->bias + col);
        }
        for (int r = 0; r < MR; r++) acc[r][b] = init;
    }
    const int64_t K2 = a->K2;
    const uint32_t *x = a->xp + i * K2;
    const uint16_t *w = a->w + b0 * K2 * 32;
    for (int64_t p = 0; p < K2; p++) {
        __m512i wv[NB];
        for (int b = 0; b < NB; b++)
            if (b < nb) wv[b] = _mm512_loadu_si512((const void *)(w + (b * K2 + p) * 32));
        for (int r = 0; r < MR; r++) {
            if (r >= R) break;
            const __m512bh xb = (__m512bh)_mm512_set1_epi32((int)x[r * K2 + p]);
            for (int b = 0; b < NB; b++)
                if (b < nb) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xb, (__m512bh)wv[b]);
        }
    }
    for (int r = 0; r < R; r++) {
        float *yr = a->y + (i + r) * a->N;
        for (int b = 0; b < nb; b++) {
            const int64_t col = (b0 + b) * 16, left = a->N - col;
            _mm512_mask_storeu_ps(yr + col, left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1),
                                  acc[r][b]);
        }
    }
}

/* Tiles of every height up to MR and width up to NB, each shape a constant for the compiler
 * to unroll (no branch left in the k loop). */
#define WIDTHS(R)                                                                              \
    switch (nb) {                                                                              \
    case 1: tile(a, i, R, b0, 1); break;                                                       \
    case 2: tile(a, i, R, b0, 2); break;                                                       \
    case 3: tile(a, i, R, b0, 3); break;                                                       \
    default: tile(a, i, R, b0, 4); break;                                                      \
    }
static void tile_rows(const bf16_args *a, int64_t i, int64_t rows, int64_t b0, int nb) {
    switch (rows) {
    case 1: WIDTHS(1) break;
    case 2: WIDTHS(2) break;
    case 3: WIDTHS(3) break;
    case 4: WIDTHS(4) break;
    case 5: WIDTHS(5) break;
    default: WIDTHS(6) break;
    }
}

static void gemm_task(const void *args, int64_t t, int64_t n) {
    const bf16_args *a = args;
    const int64_t first = a->blocks * t / n, last = a->blocks * (t + 1) / n;
    for (int64_t i0 = 0; i0 < a->M; i0 += MB) {
        const int64_t i1 = i0 + MB < a->M ? i0 + MB : a->M;
        for (int64_t b0 = first; b0 < last; b0 += NB) {
            const int nb = (int)(last - b0 < NB ? last - b0 : NB);
            for (int64_t i = i0; i < i1; i += MR)
                tile_rows(a, i, i1 - i < MR ? i1 - i : MR, b0, nb);
        }
    }
}

typedef struct {
    const float *x;
    uint32_t *xp;
    int64_t M, K, K2;
} convert_args;

/* x rows [M][K] float32 -> [M][K2] bf16 pairs (an odd K's last pair padded with zero). */
static void convert_task(const void *args, int64_t t, int64_t n) {
    const convert_args *a = args;
    const int64_t K = a->K, K2 = a->K2;
    for (int64_t r = a->M * t / n; r < a->M * (t + 1) / n; r++) {
        const float *xr = a->x + r * K;
        uint16_t *out = (uint16_t *)(a->xp + r * K2);
        for (int64_t k = 0; k < 2 * K2; k += 32) {
            const int64_t left = K - k;
            const __mmask16 lo = left >= 16 ? 0xFFFF : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
            const __mmask16 hi = left >= 32 ? 0xFFFF : left <= 16 ? 0
                                                                  : (__mmask16)((1u << (left - 16)) - 1);
            const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, xr + k + 16),
                                                   _mm512_maskz_loadu_ps(lo, xr + k));
            const int64_t pairs = 2 * K2 - k >= 32 ? 32 : 2 * K2 - k;
            _mm512_mask_storeu_epi16(out + k, (__mmask32)(pairs >= 32 ? 0xFFFFFFFFu
                                                                      : (1u << pairs) - 1),
                                     (__m512i)v);
        }
    }
}

/* Returns 0, or -1 when the row buffer cannot be allocated. */
int kvcli_bf16_gemm(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M,
                    int64_t N, int64_t K, int64_t threads) {
    const int64_t K2 = (K + 1) / 2, blocks = (N + 15) / 16;
    uint32_t *xp = malloc((size_t)(M * K2) * sizeof *xp + 64);
    if (xp == NULL) return -1;
    const convert_args c = {x, xp, M, K, K2};
    /* Converting is ~1/N of the multiply: split over rows only where there are many. */
    kvcli_parallel_rows(convert_task, &c, M >= 64 ? threads : 1, M);
    const bf16_args a = {xp, w, bias, y, M, N, K2, blocks};
    /* At least one group of NB blocks per thread. */
    const int64_t most = (blocks + NB - 1) / NB;
    kvcli_parallel_rows(gemm_task, &a, threads < most ? threads : most, M);
    free(xp);
    return 0;
}

/* W [N][K] bfloat16 (row-major, as torch stores a Linear's weight) -> the packed layout,
 * (N + 15) / 16 * ((K + 1) / 2) * 32 values, padding zero. */
void kvcli_bf16_pack(const uint16_t *w, uint16_t *out, int64_t N, int64_t K) {
    const int64_t K2 = (K + 1) / 2, blocks = (N + 15) / 16;
    memset(out, 0, (size_t)(blocks * K2 * 32) * sizeof *out);
    for (int64_t n = 0; n < N; n++) {
        uint16_t *block = out + (n / 16) * K2 * 32 + (n % 16) * 2;
        for (int64_t k = 0; k < K; k++) block[(k / 2) * 32 + (k % 2)] = w[n * K + k];
    }
}
#pragma GCC pop_options
#else
#define KVCLI_HAS_BF16 0
int kvcli_bf16_gemm(const float *x, const uint16_t *w, const float *bias, float *y, int64_t M,
                    int64_t N, int64_t K, int64_t threads) {
    (void)x, (void)w, (void)bias, (void)y, (void)M, (void)N, (void)K, (void)threads;
    return -2;
}
void kvcli_bf16_pack(const uint16_t *w, uint16_t *out, int64_t N, int64_t K) {
    (void)w, (void)out, (void)N, (void)K;
}
#endif

/* 1: this build has the AVX512_BF16 kernel (the CPU must also have avx512_bf16 to run it). */
int64_t kvcli_bf16_gemm_available(void) { return KVCLI_HAS_BF16; }
