/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W quantized in blocks of 32 along K, for few rows M
 * (a decode step's batch), and the de-quantization of W's rows to float32 (larger row counts,
 * embedding look-ups).
 *
 * W keeps its storage format: GGUF's Q8_0, Q4_0, Q4_1 blocks straight from the memory-mapped
 * file, or kvcli's int8 (one int8 per weight, a float32 scale per output channel). At 1-64 rows
 * decode is limited by the bytes streamed, so each block is de-quantized in registers right
 * after it is loaded (nibbles / int8 -> float32, times the block's fp16 scale) and multiplied
 * by MR activation rows at once; nothing de-quantized is ever written to memory. Output
 * channels are split across the worker pool. Activations stay float32, so the only error
 * against the de-quantized float64 product is float32 rounding (summed in blocks of 32).
 *
 * One source for every x86 kind: 16-float vectors are one AVX-512 register on the Xeon and two
 * AVX2 registers on Zen 3 (fewer rows per tile there so the accumulators fit 16 registers);
 * the build is keyed by the CPU's flags (native/__init__.py), so each machine compiles its own.
 */
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "pool.h"

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, I8 = 24 }; /* GGML's type ids; I8: kvcli's int8 rows */

#if defined(__AVX512F__)
#define MR 8 /* rows x NR channels of 16-float accumulators + 4 weight vectors fit 32 registers */
#define NR 2
#else
#define MR 4 /* 8 accumulators (2 registers each) + weights + x within AVX2's 16 */
#define NR 1
#endif

typedef float v16 __attribute__((vector_size(64)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));

static inline v16 loadu(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline float half_to_float(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
#if defined(__FLT16_MAX__)
    _Float16 f;
    memcpy(&f, &h, 2);
    return (float)f;
#else
    const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 31, man = h & 1023;
    float v = exp == 0 ? man * (1.0f / 16777216.0f)
                       : (exp == 31 ? __builtin_inff() : (float)(1024 + man) * (1 << exp) /
                                                             (float)(1 << 25));
    uint32_t bits;
    memcpy(&bits, &v, 4);
    bits |= sign;
    memcpy(&v, &bits, 4);
    return v;
#endif
}

static inline int64_t block_bytes(int type) {
    return type == Q4_0 ? 18 : type == Q4_1 ? 20 : type == Q8_0 ? 34 : 32;
}

/* 16 bytes as 16 floats, signed (int8) or unsigned (nibbles). GCC's generic conversion of
 * byte vectors went through 128-bit shuffles and spilled accumulators (1-row int8 matmuls
 * 13.3 ms over a model's shapes vs 16.1 float32); the widening instructions do it in two. */
static inline v16 bytes_to_float(const uint8_t *p, const int is_signed, const int nibble) {
#if defined(__AVX512F__) || defined(__AVX2__)
    __m128i b = _mm_loadu_si128((const __m128i *)p);
    if (nibble == 1) b = _mm_and_si128(b, _mm_set1_epi8(15));
    if (nibble == 2) b = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
#if defined(__AVX512F__)
    const __m512 f = _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b));
    v16 v;
    memcpy(&v, &f, sizeof v);
    return v;
#else
    const __m128i b_hi = _mm_unpackhi_epi64(b, b);
    const __m256 f[2] = {
        _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)),
        _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b_hi) : _mm256_cvtepu8_epi32(b_hi))};
    v16 v;
    memcpy(&v, f, sizeof v);
    return v;
#endif
#else
    u8x16 q;
    memcpy(&q, p, 16);
    if (nibble == 1) q &= 15;
    if (nibble == 2) q >>= 4;
    if (is_signed) return __builtin_convertvector((i8x16)q, v16);
    return __builtin_convertvector(q, v16);
#endif
}

/* v, opaque to the optimiser: -ffast-math would fuse a product with the following add. */
static inline v16 unfused(v16 v) {
#if defined(__AVX512F__)
    __asm__("" : "+v"(v));
#elif defined(__AVX2__)
    __m256 h[2];
    memcpy(h, &v, sizeof v);
    __asm__("" : "+x"(h[0]), "+x"(h[1]));
    memcpy(&v, h, sizeof v);
#else
    __asm__("" : "+m"(v));
#endif
    return v;
}

/* The 32 weights of one block as floats: elements 0-15 in lo, 16-31 in hi. */
static inline __attribute__((always_inline)) void block(const int type, const uint8_t *p,
                                                        v16 *lo, v16 *hi) {
    if (type == I8 || type == Q8_0) {
        const uint8_t *q = type == Q8_0 ? p + 2 : p;
        *lo = bytes_to_float(q, 1, 0);
        *hi = bytes_to_float(q + 16, 1, 0);
        if (type == Q8_0) { /* I8: the row's scale is applied to the sum instead */
            const float d = half_to_float(p);
            *lo *= d;
            *hi *= d;
        }
        return;
    }
    /* Q4_0 / Q4_1: byte j holds element j (low nibble) and element j + 16 (high nibble).
     * Rounded as gguf's reference does ((q - 8) * d; q * d + m without a fused multiply-add),
     * so de-quantized weights equal gguf.quants.dequantize bit for bit. */
    const float d = half_to_float(p);
    const uint8_t *q = p + (type == Q4_1 ? 4 : 2);
    if (type == Q4_0) {
        *lo = (bytes_to_float(q, 0, 1) - 8.0f) * d;
        *hi = (bytes_to_float(q, 0, 2) - 8.0f) * d;
        return;
    }
    const float m = half_to_float(p + 2);
    *lo = unfused(bytes_to_float(q, 0, 1) * d) + m;
    *hi = unfused(bytes_to_float(q, 0, 2) * d) + m;
}

typedef struct {
    const float *x, *scale, *bias;
    const uint8_t *w;
    float *y;
    int64_t M, N, K, type;
} qgemm_args;

/* Rows [i, i + mr) x channels [n, n + nr): the whole K, accumulated in registers. */
static inline __attribute__((always_inline)) void tile(const qgemm_args *a, const int type,
                                                       int64_t i, const int mr, int64_t n,
                                                       const int nr) {
    const int64_t bb = block_bytes(type), row_bytes = a->K / 32 * bb;
    v16 acc[MR][NR];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) acc[r][c] = (v16){0};
    const uint8_t *w = a->w + n * row_bytes;
    const float *x = a->x + i * a->K;
    for (int64_t k = 0; k < a->K; k += 32, w += bb) {
        v16 lo[NR], hi[NR];
        for (int c = 0; c < nr; c++) block(type, w + c * row_bytes, &lo[c], &hi[c]);
        for (int r = 0; r < mr; r++) {
            const v16 x0 = loadu(x + r * a->K + k), x1 = loadu(x + r * a->K + k + 16);
            for (int c = 0; c < nr; c++) acc[r][c] += x0 * lo[c] + x1 * hi[c];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            float s = 0.0f;
            for (int e = 0; e < 16; e++) s += acc[r][c][e];
            if (type == I8) s *= a->scale[n + c];
            if (a->bias) s += a->bias[n + c];
            a->y[(i + r) * a->N + n + c] = s;
        }
}

/* Every row tile for channels [n, n + nr); mr is a constant in each call, so loops unroll. */
static inline __attribute__((always_inline)) void channels(const qgemm_args *a, const int type,
                                                           int64_t n, const int nr) {
    int64_t i = 0;
    for (; i + MR <= a->M; i += MR) tile(a, type, i, MR, n, nr);
    switch (a->M - i) {
    case 1: tile(a, type, i, 1, n, nr); break;
    case 2: tile(a, type, i, 2, n, nr); break;
    case 3: tile(a, type, i, 3, n, nr); break;
#if MR > 4
    case 4: tile(a, type, i, 4, n, nr); break;
    case 5: tile(a, type, i, 5, n, nr); break;
    case 6: tile(a, type, i, 6, n, nr); break;
    case 7: tile(a, type, i, 7, n, nr); break;
#endif
    default: break;
    }
}

static inline __attribute__((always_inline)) void qgemm_part(const qgemm_args *a, const int type,
                                                             int64_t t, int64_t n_threads) {
    const int64_t groups = a->N / NR, g0 = groups * t / n_threads, g1 = groups * (t + 1) / n_threads;
    for (int64_t g = g0; g < g1; g++) channels(a, type, g * NR, NR);
    if (t == n_threads - 1)
        for (int64_t n = groups * NR; n < a->N; n++) channels(a, type, n, 1);
}

#define PART(name, type)                                                                          \
    static void name(const void *args, int64_t t, int64_t n) {                                    \
        qgemm_part((const qgemm_args *)args, type, t, n);                                          \
    }
PART(part_q4_0, Q4_0)
PART(part_q4_1, Q4_1)
PART(part_q8_0, Q8_0)
PART(part_i8, I8)

/* Returns 0, or -1 for a type this kernel does not know (the caller falls back). */
int kvcli_qgemm(int64_t type, const float *x, const uint8_t *w, const float *scale,
                const float *bias, float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    task_fn fn = type == Q4_0 ? part_q4_0 : type == Q4_1 ? part_q4_1 : type == Q8_0 ? part_q8_0
               : type == I8   ? part_i8 : 0;
    if (!fn || K % 32) return -1;
    const qgemm_args a = {x, scale, bias, w, y, M, N, K, type};
    if (threads > N / NR) threads = N / NR > 0 ? N / NR : 1;
    kvcli_parallel(fn, &a, threads, M <= KVCLI_DECODE_ROWS ? KVCLI_SPIN_NS : 0);
    return 0;
}

typedef struct {
    const uint8_t *w;
    const float *scale;
    const int64_t *rows;
    float *out;
    int64_t count, K, type;
} dequant_args;

static void dequant_part(const void *args, int64_t t, int64_t n) {
    const dequant_args *a = (const dequant_args *)args;
    const int type = (int)a->type;
    const int64_t bb = block_bytes(type), row_bytes = a->K / 32 * bb;
    for (int64_t i = a->count * t / n; i < a->count * (t + 1) / n; i++) {
        const int64_t row = a->rows ? a->rows[i] : i;
        const uint8_t *w = a->w + row * row_bytes;
        const float s = type == I8 ? a->scale[row] : 1.0f;
        float *out = a->out + i * a->K;
        for (int64_t k = 0; k < a->K; k += 32, w += bb) {
            v16 lo, hi;
            switch (type) { /* constant per case: block() folds to one format */
            case Q4_0: block(Q4_0, w, &lo, &hi); break;
            case Q4_1: block(Q4_1, w, &lo, &hi); break;
            case Q8_0: block(Q8_0, w, &lo, &hi); break;
            default: block(I8, w, &lo, &hi); lo *= s; hi *= s; break;
            }
            memcpy(out + k, &lo, sizeof lo);
            memcpy(out + k + 16, &hi, sizeof hi);
        }
    }
}

/* out[i, :] = de-quantized row rows[i] (row i when rows is NULL), for i < count. */
int kvcli_qdequant(int64_t type, const uint8_t *w, const float *scale, const int64_t *rows,
                   float *out, int64_t count, int64_t K, int64_t threads) {
    if ((type != Q4_0 && type != Q4_1 && type != Q8_0 && type != I8) || K % 32) return -1;
    const dequant_args a = {w, scale, rows, out, count, K, type};
    if (threads > count) threads = count > 0 ? count : 1;
    kvcli_parallel(dequant_part, &a, threads, 0);
    return 0;
}
