/* Quantized weight formats, decoded in registers (qgemm.c): GGUF's Q8_0, Q4_0, Q4_1, Q4_K,
 * Q5_K, Q6_K blocks as they lie in the file, and kvcli's per-channel int8. */
#ifndef KVCLI_QBLOCKS_H
#define KVCLI_QBLOCKS_H
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* GGML's type ids; I8: kvcli's int8 rows (a float32 scale per row beside them). */
enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14, I8 = 24 };


/* VW floats per vector, one machine register: GCC lowers wider generic vectors to memory
 * round trips (a 16-float vector on AVX2 broadcast each scale with 16 scalar stores and kept the
 * accumulators on the stack: Q4_1 matmuls ran 15x slower than the AVX-512 build on one CPU). */
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX2__)
#define VW 8
#else
#define VW 4
#endif
#define NV (32 / VW) /* vectors per sub-block of 32 weights */
#define HV (16 / VW) /* vectors per 16 widened bytes */

typedef float vf __attribute__((vector_size(VW * 4)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef uint8_t u8v __attribute__((vector_size(VW)));
typedef int8_t i8v __attribute__((vector_size(VW)));

static inline vf loadu(const float *p) {
    vf v;
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

/* 16 bytes as 16 floats (HV vectors), signed (int8) or unsigned. GCC's generic conversion of
 * byte vectors went through 128-bit shuffles and spilled accumulators (1-row int8 matmuls
 * 13.3 ms over a model's shapes vs 16.1 float32); the widening instructions do it in two. */
static inline void widen(u8x16 q, const int is_signed, vf *out) {
#if defined(__AVX512F__) || defined(__AVX2__)
    __m128i b;
    memcpy(&b, &q, 16);
#if defined(__AVX512F__)
    const __m512 f[1] = {
        _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(b) : _mm512_cvtepu8_epi32(b))};
#else
    const __m128i b_hi = _mm_unpackhi_epi64(b, b);
    const __m256 f[2] = {
        _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b) : _mm256_cvtepu8_epi32(b)),
        _mm256_cvtepi32_ps(is_signed ? _mm256_cvtepi8_epi32(b_hi) : _mm256_cvtepu8_epi32(b_hi))};
#endif
    memcpy(out, f, sizeof f);
#else
    for (int j = 0; j < HV; j++) {
        u8v c;
        memcpy(&c, (const uint8_t *)&q + j * VW, VW);
        out[j] = is_signed ? __builtin_convertvector((i8v)c, vf) : __builtin_convertvector(c, vf);
    }
#endif
}

static inline u8x16 load16(const uint8_t *p) {
    u8x16 q;
    memcpy(&q, p, 16);
    return q;
}

/* v, opaque to the optimiser: -ffast-math would fuse a product with the following add. */
static inline vf unfused(vf v) {
#if defined(__AVX512F__)
    __asm__("" : "+v"(v));
#elif defined(__AVX2__)
    __asm__("" : "+x"(v));
#else
    __asm__("" : "+m"(v));
#endif
    return v;
}

/* Elements and bytes per (super-)block: 32 for the legacy formats, 256 for the k-quants. */
static inline int64_t block_elems(int type) { return type >= Q4_K && type <= Q6_K ? 256 : 32; }
static inline int64_t block_bytes(int type) {
    switch (type) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
    case Q6_K: return 210;
    default: return 32; /* I8 */
    }
}

/* Q4_K / Q5_K: 6-bit scale and min of sub-block s, packed in 12 bytes (gguf's get_scale_min). */
static inline void k_scale_min(const uint8_t *sc, int s, float *scale, float *min) {
    if (s < 4) {
        *scale = (float)(sc[s] & 63);
        *min = (float)(sc[s + 4] & 63);
    } else {
        *scale = (float)((sc[s + 4] & 15) | ((sc[s - 4] >> 6) << 4));
        *min = (float)((sc[s + 4] >> 4) | ((sc[s] >> 6) << 4));
    }
}

/* Sub-block `sub` (32 weights) of the block at p as NV float vectors, in element order.
 * Rounded as gguf's reference does (products of scales first; d * q then - m without a fused
 * multiply-add), so de-quantized weights equal gguf.quants.dequantize bit for bit. */
static inline __attribute__((always_inline)) void block(const int type, const uint8_t *p,
                                                        const int sub, vf *w) {
    if (type == I8 || type == Q8_0) { /* I8: the row's scale is applied to the sum instead */
        const uint8_t *q = type == Q8_0 ? p + 2 : p;
        const float d = type == Q8_0 ? half_to_float(p) : 1.0f;
        widen(load16(q), 1, w);
        widen(load16(q + 16), 1, w + HV);
        for (int j = 0; j < NV; j++) w[j] *= d;
    } else if (type == Q4_0 || type == Q4_1) { /* byte j: element j (low), j + 16 (high) */
        const u8x16 q = load16(p + (type == Q4_1 ? 4 : 2));
        const float d = half_to_float(p);
        widen(q & 15, 0, w);
        widen(q >> 4, 0, w + HV);
        if (type == Q4_0) {
            for (int j = 0; j < NV; j++) w[j] = (w[j] - 8.0f) * d;
        } else {
            const float m = half_to_float(p + 2);
            for (int j = 0; j < NV; j++) w[j] = unfused(w[j] * d) + m;
        }
    } else if (type == Q4_K || type == Q5_K) { /* 32 bytes per sub-block pair, nibble = sub % 2 */
        float sc, mn;
        k_scale_min(p + 4, sub, &sc, &mn);
        const float d = half_to_float(p) * sc, m = half_to_float(p + 2) * mn;
        const uint8_t *qs = p + (type == Q4_K ? 16 : 48) + (sub / 2) * 32;
        const int shift = (sub % 2) * 4;
        u8x16 a = (load16(qs) >> shift) & 15, b = (load16(qs + 16) >> shift) & 15;
        if (type == Q5_K) { /* fifth bit: bit `sub` of qh[i] */
            a |= ((load16(p + 16) >> sub) & 1) << 4;
            b |= ((load16(p + 32) >> sub) & 1) << 4;
        }
        widen(a, 0, w);
        widen(b, 0, w + HV);
        for (int j = 0; j < NV; j++) w[j] = unfused(w[j] * d) - m;
    } else { /* Q6_K: ql[128], qh[64], int8 scales[16] (one per 16 weights), d */
        const int half = sub / 4, u = sub % 4;
        const uint8_t *ql = p + half * 64 + (u % 2) * 32, *qh = p + 128 + half * 32;
        const int8_t *scales = (const int8_t *)(p + 192);
        const float d = half_to_float(p + 208);
        const float s0 = d * (float)scales[2 * sub], s1 = d * (float)scales[2 * sub + 1];
        const int shift = (u / 2) * 4;
        widen(((load16(ql) >> shift) & 15) | (((load16(qh) >> (2 * u)) & 3) << 4), 0, w);
        widen(((load16(ql + 16) >> shift) & 15) | (((load16(qh + 16) >> (2 * u)) & 3) << 4), 0,
              w + HV);
        for (int j = 0; j < HV; j++) {
            w[j] = (w[j] - 32.0f) * s0;
            w[HV + j] = (w[HV + j] - 32.0f) * s1;
        }
    }
}

#endif
