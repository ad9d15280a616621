/* GGUF blocks (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K) against 1-64 activation rows on AVX2
 * (qgemm.c: decode steps and the exact GGUF mode's short prefills). AVX-512 builds take it up to
 * qgemm.c's FACTORED_MAX_ROWS rows (measured on Zen 4), their 2-channel tile path above.
 *
 * The tile path de-quantizes each weight (d * q + m) before its multiply-add: ~44 instructions
 * per 32 weights at one row, and its 16 registers hold only 4 rows. Here each group of 32
 * weights' scale and minimum are factored out of the sum, d * sum(x * q) + m * sum(x): the
 * codes are widened to 32-bit lanes once per group for up to 8 rows (Q4_0/Q4_1's nibbles by two
 * byte shuffles of one broadcast load), and m * sum(x) of 8 rows is one multiply-add on the
 * rows' group sums (computed once per call). Still float32 arithmetic on the blocks' exact
 * values (x is not rounded); the sums differ from the tile path's in the last bits (the tests'
 * float64 tolerance). */
#ifndef KVCLI_QGEMM_FACTORED_H
#define KVCLI_QGEMM_FACTORED_H
#include <immintrin.h>
#include <stdint.h>

#define FACTORED 1 /* qgemm.c: this path exists in this build */
#define FR 8       /* rows per tile: 8 accumulators + 4 weight vectors + d, m, sum in 16 */
/* Bytes ahead of the group read that it asks the cache for. A decode step reads every weight once;
 * on a Xeon with AMX (2 vCPUs, 2026-12-06) the hardware prefetcher alone kept one thread at
 * ~3 GB/s, 56% of its samples on the weights' load. 2,048 bytes ahead ran the default model's
 * 211 matrices in 0.49-0.60x the time at 1-4 rows, 0.82x at 8 (1,024: ~1.1x 2,048's; 4,096: even;
 * scripts/bench_qgemm_builds.py). */
#ifndef QGEMM_PREFETCH
#define QGEMM_PREFETCH 2048
#endif

/* [d, m] of the block at p (m: the next fp16; for Q4_0 / Q8_0 it is not read). */
static inline __m128 halves(const uint8_t *p) {
    int32_t two;
    memcpy(&two, p, 4);
    return _mm_cvtph_ps(_mm_cvtsi32_si128(two));
}

/* 8 bytes at p widened to 32-bit lanes. */
static inline __m256i bytes8(const uint8_t *p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

/* Q4_0 / Q4_1: the 16 nibble bytes at q (byte j: element j low, j + 16 high) in element order. */
static inline void nibbles(const uint8_t *q, __m256 w[4]) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q));
    const __m256i a = _mm256_shuffle_epi8(v, _mm256_setr_epi8(
        0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3, -1, -1, -1,
        4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7, -1, -1, -1));
    const __m256i b = _mm256_shuffle_epi8(v, _mm256_setr_epi8(
        8, -1, -1, -1, 9, -1, -1, -1, 10, -1, -1, -1, 11, -1, -1, -1,
        12, -1, -1, -1, 13, -1, -1, -1, 14, -1, -1, -1, 15, -1, -1, -1));
    const __m256i low = _mm256_set1_epi32(15);
    w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, low));
    w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, low));
    w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
    w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

/* Group g (weights 32g .. 32g + 31) of the row of blocks at row: its integer codes as 4 float
 * vectors in element order, and sc = {scale of elements 0-15, of 16-31, minimum}, so that
 * weight e = sc[e / 16] * code[e] + sc[2] (gguf's de-quantization, factored). */
static inline __attribute__((always_inline)) void group(const int type, const uint8_t *row,
                                                        int64_t g, __m256 w[4], float sc[3]) {
    if (type == Q8_0 || type == Q4_0 || type == Q4_1) {
        const uint8_t *p = row + g * block_bytes(type);
        const __m128 dm = halves(p);
        sc[0] = sc[1] = _mm_cvtss_f32(dm);
        sc[2] = type == Q4_1 ? _mm_cvtss_f32(_mm_movehdup_ps(dm)) : -8.0f * sc[0];
        if (type != Q8_0) {
            nibbles(p + (type == Q4_1 ? 4 : 2), w);
            return;
        }
        sc[2] = 0.0f;
        for (int j = 0; j < 4; j++)
            w[j] = _mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p + 2 + 8 * j))));
        return;
    }
    const uint8_t *p = row + g / 8 * block_bytes(type);
    const int sub = (int)(g % 8);
    if (type == Q6_K) { /* ql[128], qh[64], int8 scales[16] (one per 16 weights), d */
        const int half = sub / 4, u = sub % 4, shift = (u / 2) * 4;
        const uint8_t *ql = p + half * 64 + (u % 2) * 32, *qh = p + 128 + half * 32;
        const float d = half_to_float(p + 208);
        sc[0] = d * (float)((const int8_t *)(p + 192))[2 * sub];
        sc[1] = d * (float)((const int8_t *)(p + 192))[2 * sub + 1];
        sc[2] = 0.0f;
        for (int j = 0; j < 4; j++) {
            const __m256i lo = _mm256_and_si256(_mm256_srli_epi32(bytes8(ql + 8 * j), shift),
                                                _mm256_set1_epi32(15));
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(bytes8(qh + 8 * j), 2 * u),
                                                _mm256_set1_epi32(3));
            w[j] = _mm256_cvtepi32_ps(_mm256_sub_epi32(
                _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32)));
        }
        return;
    }
    /* Q4_K / Q5_K: 32 bytes per sub-block pair, nibble = sub % 2; Q5_K's fifth bit: bit `sub`
     * of qh[e] */
    float scale, min;
    k_scale_min(p + 4, sub, &scale, &min);
    sc[0] = sc[1] = half_to_float(p) * scale;
    sc[2] = -(half_to_float(p + 2) * min);
    const uint8_t *qs = p + (type == Q4_K ? 16 : 48) + (sub / 2) * 32;
    for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_and_si256(_mm256_srli_epi32(bytes8(qs + 8 * j), (sub % 2) * 4),
                                     _mm256_set1_epi32(15));
        if (type == Q5_K)
            v = _mm256_or_si256(v, _mm256_slli_epi32(_mm256_and_si256(
                _mm256_srli_epi32(bytes8(p + 16 + 8 * j), sub), _mm256_set1_epi32(1)), 4));
        w[j] = _mm256_cvtepi32_ps(v);
    }
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* y[i + r, n] = dots[r] + lane r of macc (the m * sum(x) terms) + bias, r < mr. */
static inline __attribute__((always_inline)) void store_channel(const qgemm_args *a, int64_t i,
                                                                const int mr, int64_t n,
                                                                const float *dots, __m256 macc) {
    float mterm[FR];
    _mm256_storeu_ps(mterm, macc);
    for (int r = 0; r < mr; r++)
        a->y[(i + r) * a->N + n] = dots[r] + mterm[r] + (a->bias ? a->bias[n] : 0.0f);
}

#if defined(__AVX512F__)
/* Q4_0, Q4_1, Q8_0 on AVX-512: a group's 32 codes in two 16-float vectors (the nibbles: one
 * widening load, then the low and high halves; 5 instructions where group() takes 11), its
 * scale and minimum in d, m. Rows' sums are 2 products per lane (group()'s path: 4). */
static inline __attribute__((always_inline)) void group16(const int type, const uint8_t *row,
                                                          int64_t g, __m512 w[2], float *d,
                                                          float *m) {
    const uint8_t *p = row + g * block_bytes(type);
    __builtin_prefetch(p + QGEMM_PREFETCH);
    const __m128 dm = halves(p);
    *d = _mm_cvtss_f32(dm);
    *m = type == Q4_1 ? _mm_cvtss_f32(_mm_movehdup_ps(dm)) : type == Q4_0 ? -8.0f * *d : 0.0f;
    if (type == Q8_0) {
        for (int j = 0; j < 2; j++)
            w[j] = _mm512_cvtepi32_ps(
                _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p + 2 + 16 * j))));
        return;
    }
    const __m512i v = _mm512_cvtepu8_epi32(
        _mm_loadu_si128((const __m128i *)(p + (type == Q4_1 ? 4 : 2))));
    w[0] = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
    w[1] = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
}

/* factored_tile for those three types, 16 floats a register. */
static inline __attribute__((always_inline)) void factored_tile16(const qgemm_args *a,
                                                                  const int type, int64_t i,
                                                                  const int mr, int64_t n,
                                                                  const float *xs) {
    const uint8_t *w = a->w + n * (a->K / 32 * block_bytes(type));
    const float *x = a->x + i * a->K;
    __m512 acc[FR];
    __m256 macc = _mm256_setzero_ps();
    for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < a->K / 32; g++) {
        __m512 wv[2];
        float d, m;
        group16(type, w, g, wv, &d, &m);
        const __m512 dv = _mm512_set1_ps(d);
        for (int r = 0; r < mr; r++) {
            const float *xr = x + r * a->K + 32 * g;
            const __m512 s = _mm512_fmadd_ps(_mm512_loadu_ps(xr + 16), wv[1],
                                             _mm512_mul_ps(_mm512_loadu_ps(xr), wv[0]));
            acc[r] = _mm512_fmadd_ps(dv, s, acc[r]);
        }
        if (type != Q8_0)
            macc = _mm256_fmadd_ps(_mm256_set1_ps(m), _mm256_loadu_ps(xs + g * FR), macc);
    }
    float dots[FR];
    for (int r = 0; r < mr; r++) dots[r] = _mm512_reduce_add_ps(acc[r]);
    store_channel(a, i, mr, n, dots, macc);
}
#endif

/* Rows [i, i + mr) x channel n; xs[g * FR + r]: the sum of row i + r's group g. */
static inline __attribute__((always_inline)) void factored_tile(const qgemm_args *a,
                                                                const int type, int64_t i,
                                                                const int mr, int64_t n,
                                                                const float *xs) {
#if defined(__AVX512F__)
    if (type == Q4_0 || type == Q4_1 || type == Q8_0) {
        factored_tile16(a, type, i, mr, n, xs);
        return;
    }
#endif
    const int64_t groups = a->K / 32;
    const uint8_t *w = a->w + n * (a->K / block_elems(type) * block_bytes(type));
    const float *x = a->x + i * a->K;
    __m256 acc[FR], macc = _mm256_setzero_ps(); /* macc lane r: row r's sum of m * sum(x) */
    for (int r = 0; r < mr; r++) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; g++) {
        __m256 wv[4];
        float sc[3];
        group(type, w, g, wv, sc);
        const __m256 d0 = _mm256_set1_ps(sc[0]), d1 = _mm256_set1_ps(sc[1]);
        for (int r = 0; r < mr; r++) {
            const float *xr = x + r * a->K + 32 * g;
            __m256 lo = _mm256_mul_ps(_mm256_loadu_ps(xr), wv[0]);
            lo = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 8), wv[1], lo);
            __m256 hi = _mm256_mul_ps(_mm256_loadu_ps(xr + 16), wv[2]);
            hi = _mm256_fmadd_ps(_mm256_loadu_ps(xr + 24), wv[3], hi);
            if (type == Q6_K) { /* a scale per 16 weights */
                acc[r] = _mm256_fmadd_ps(d1, hi, _mm256_fmadd_ps(d0, lo, acc[r]));
            } else {
                acc[r] = _mm256_fmadd_ps(d0, _mm256_add_ps(lo, hi), acc[r]);
            }
        }
        if (type != Q8_0 && type != Q6_K)
            macc = _mm256_fmadd_ps(_mm256_set1_ps(sc[2]), _mm256_loadu_ps(xs + g * FR), macc);
    }
    float dots[FR];
    for (int r = 0; r < mr; r++) dots[r] = hsum8(acc[r]);
    store_channel(a, i, mr, n, dots, macc);
}

/* xs [tiles][groups][FR]: each row's sums of 32 values, rows past M zero. */
static void block_sums(const qgemm_args *a, float *xs) {
    const int64_t blocks = a->K / 32, tiles = (a->M + FR - 1) / FR;
    memset(xs, 0, sizeof(float) * tiles * blocks * FR);
    for (int64_t row = 0; row < a->M; row++)
        for (int64_t b = 0; b < blocks; b++) {
            const float *x = a->x + row * a->K + 32 * b;
            const __m256 s = _mm256_add_ps(
                _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8)),
                _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24)));
            xs[(row / FR * blocks + b) * FR + row % FR] = hsum8(s);
        }
}

#define FACTORED_TILES(MRC)                                                                    \
    for (int64_t n = c0; n < c1; n++) factored_tile(a, type, i, MRC, n, sums)

/* Channels [n0, n1) for every row: a chunk of CHUNK channels' blocks stays in L1 while each
 * row tile of FR rows meets it (qgemm.c's block_rows order). */
static inline __attribute__((always_inline)) void factored_part(const qgemm_args *a,
                                                                const int type, int64_t n0,
                                                                int64_t n1) {
    const int64_t blocks = a->K / 32, tiles = (a->M + FR - 1) / FR;
    float xs[tiles * blocks * FR];
    block_sums(a, xs);
    for (int64_t c0 = n0; c0 < n1; c0 += CHUNK) {
        const int64_t c1 = c0 + CHUNK < n1 ? c0 + CHUNK : n1;
        for (int64_t i = 0; i < a->M; i += FR) {
            const float *sums = xs + i / FR * blocks * FR;
            switch (a->M - i < FR ? a->M - i : FR) {
            case 1: FACTORED_TILES(1); break;
            case 2: FACTORED_TILES(2); break;
            case 3: FACTORED_TILES(3); break;
            case 4: FACTORED_TILES(4); break;
            case 5: FACTORED_TILES(5); break;
            case 6: FACTORED_TILES(6); break;
            case 7: FACTORED_TILES(7); break;
            default: FACTORED_TILES(8); break;
            }
        }
    }
}

#endif
