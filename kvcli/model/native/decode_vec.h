/* The decode kernel's vectors (paged_attention.c): VW floats per register, HC query heads per
 * pass, and widen(), which loads VW elements of a cache row as floats (float32 as they are;
 * int8 codes and bfloat16 widened in registers), per ISA and cache format (KV_INT8, KV_BF16).
 * VECTORS is defined where the CPU has AVX2 and FMA; without it the kernel is plain C. Included
 * by paged_attention.c once kv_t (its cache element) and AI are defined. */
#ifndef KVCLI_DECODE_VEC_H
#define KVCLI_DECODE_VEC_H
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define VECTORS 1
/* [sum a, sum b, sum c, sum d] in one vector. */
static AI __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
#if defined(__AVX512F__)
#define VW 16 /* floats per vector */
#define HC 4  /* query heads per pass: 16 accumulators of 32 registers */
typedef __m512 vf;
static AI vf widen(const kv_t *u) {
#if defined(KV_INT8)
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)u)));
#elif defined(KV_BF16)
    const __m256i h = _mm256_loadu_si256((const void *)u);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
    return _mm512_loadu_ps(u);
#endif
}
#define VLOAD _mm512_loadu_ps
#define VSTORE _mm512_storeu_ps
#define VFMA _mm512_fmadd_ps
#define VSET1 _mm512_set1_ps
#define VZERO _mm512_setzero_ps
static AI __m256 fold(vf a) { /* 16 lanes to 8, for hsum4 */
    return _mm256_add_ps(_mm512_castps512_ps256(a),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#else
#define VW 8
#define HC 3 /* 12 accumulators + the K or V vector and the weights fit AVX2's 16 registers */
typedef __m256 vf;
static AI vf widen(const kv_t *u) {
#if defined(KV_INT8)
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)u)));
#elif defined(KV_BF16)
    const __m128i h = _mm_loadu_si128((const void *)u);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    return _mm256_loadu_ps(u);
#endif
}
#define VLOAD _mm256_loadu_ps
#define VSTORE _mm256_storeu_ps
#define VFMA _mm256_fmadd_ps
#define VSET1 _mm256_set1_ps
#define VZERO _mm256_setzero_ps
static AI __m256 fold(vf a) { return a; }
#endif
#endif

#endif
