/* The int8 KV cache's row layout (kvcli/model/attention/native_int8.py): each (slot, KV head)
 * row is D uint8 codes followed by its float32 scale and zero point (OpenVINO's asymmetric u8
 * layout), so that one row, codes and parameters together, is one contiguous read and a block
 * of the pool moves to and from the disk cache as plain bytes. A code u stands for
 * (u - zero) * scale. */
#ifndef KVCLI_KV_INT8_H
#define KVCLI_KV_INT8_H
#include <stdint.h>
#include <string.h>

#define KV8_EXTRA 8 /* bytes after a row's D codes: float scale, float zero point */

/* Row bytes for head size D. */
static inline int64_t kv8_row(int64_t D) { return D + KV8_EXTRA; }

/* A row's scale and the bias (-zero * scale) its codes are offset by: x = u * scale + bias. */
static inline void kv8_params(const uint8_t *row, int64_t D, float *scale, float *bias) {
    float p[2];
    memcpy(p, row + D, sizeof p); /* rows are 4-byte aligned only when D is a multiple of 4 */
    *scale = p[0];
    *bias = -p[1] * p[0];
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* Where the CPU has AVX512-VNNI the int8 cache's kernels score in integers (decode:
 * paged_attention.c; prefill and shared-prefix decode: prefill_scores.h): each query row rounded
 * to int8 codes qc with one scale sq (max|q| / 127, to nearest even as the integer matmuls round
 * activations) meets the keys' uint8 codes in vpdpbusd, 64 products per instruction, and
 *     q . k = sk * sum_d(q_d * u_d) + bk * sum_d(q_d)  with  q_d ~ sq * qc_d.
 * Head sizes that are a multiple of 64 (one register of a key's codes); the values' side stays
 * float32. */
#include <immintrin.h>
#define KV8_INT_SCORES 1
static inline int kv8_int_scores(int64_t D) { return D % 64 == 0; }

/* Query row x [D] to int8 codes qc; returns its scale and stores the codes' sum in *sum. */
static inline float quantize_query(const float *x, int64_t D, int8_t *qc, int32_t *sum) {
    __m512 mx = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_loadu_ps(x + d)));
    const float amax = _mm512_reduce_max_ps(mx);
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m512i s = _mm512_setzero_si512();
    for (int64_t d = 0; d < D; d += 16) { /* round to nearest even, as the matmuls' quantizer */
        const __m512i c = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + d), inv));
        _mm_storeu_si128((__m128i *)(qc + d), _mm512_cvtsepi32_epi8(c));
        s = _mm512_add_epi32(s, c);
    }
    *sum = _mm512_reduce_add_epi32(s);
    return amax / 127.0f;
}
#endif
#endif
