/* Scores of the many-row attention kernels (prefill_attention.c's KV_INT8 build) over the int8
 * KV cache as integer dot products, where the compiler targets AVX512-VNNI. The float path
 * widens each key's codes and transposes them into a float panel, then spends a 16-lane FMA per
 * 16 keys and dimension; here each query row is rounded to int8 once per work item (one scale
 * per row and head, max|q| / 127, as the integer matmuls round activations), the panel's codes
 * are transposed as 4-byte groups (16 keys per register), and one vpdpbusd gives 64 products.
 * With a key's codes u, scale sk and bias bk (k = sk * u + bk, kv_int8.h) and the row's codes
 * qc with scale sq:
 *     q . k = sq * (sk * sum_d(qc_d * u_d) + bk * sum_d(qc_d))
 * Values (the softmax-weighted sum) stay float32. Head sizes that are a multiple of 64 (each
 * 64-byte piece of a key's codes is one register of the transposition). */
#ifndef KVCLI_PREFILL_VNNI_H
#define KVCLI_PREFILL_VNNI_H
#include <immintrin.h>
#include <string.h>

#include "kv_int8.h"

/* Whether rows of head size D take the integer scores. */
static inline int vnni_scores(int64_t D) { return D % 64 == 0; }

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

/* The panel's keys (rows at k + at[t], t < KB = 32) as codes transposed by 4-byte group:
 * kq[2 g + h] holds codes 4g .. 4g + 3 of keys 16h .. 16h + 15, one key per 32-bit lane; and
 * each key's scale and bias. */
static inline void load_codes(const uint8_t *k, int64_t D, const int64_t *at, __m512i *kq,
                              float *sk, float *bk) {
    for (int h = 0; h < 2; h++)
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            __m512 r[16];
            for (int i = 0; i < 16; i++)
                r[i] = _mm512_castsi512_ps(_mm512_loadu_si512(k + at[16 * h + i] + d0));
            transpose16(r); /* 32-bit lanes: moves, the bytes unchanged */
            for (int i = 0; i < 16; i++) kq[2 * (d0 / 4 + i) + h] = _mm512_castps_si512(r[i]);
        }
    for (int t = 0; t < 32; t++) kv8_params(k + at[t], D, &sk[t], &bk[t]);
}

/* The raw dot products of RB query rows (codes qc[r], scale sq[r], code sum qs[r]) with the
 * panel's 32 keys, as scores() gives them from float rows. */
static inline void scores_vnni(int64_t D, const int8_t *const *qc, const float *sq,
                               const int32_t *qs, const __m512i *kq, const float *sk,
                               const float *bk, vf (*out)[NV]) {
    __m512i a[RB][2];
    for (int r = 0; r < RB; r++) a[r][0] = a[r][1] = _mm512_setzero_si512();
    for (int64_t g = 0; g < D / 4; g++) {
        const __m512i k0 = kq[2 * g], k1 = kq[2 * g + 1];
        for (int r = 0; r < RB; r++) {
            int32_t four;
            memcpy(&four, qc[r] + 4 * g, 4);
            const __m512i x = _mm512_set1_epi32(four);
            a[r][0] = _mm512_dpbusd_epi32(a[r][0], k0, x);
            a[r][1] = _mm512_dpbusd_epi32(a[r][1], k1, x);
        }
    }
    for (int c = 0; c < 2; c++) {
        const __m512 skv = _mm512_loadu_ps(sk + 16 * c), bkv = _mm512_loadu_ps(bk + 16 * c);
        for (int r = 0; r < RB; r++) {
            const __m512 off = _mm512_mul_ps(bkv, _mm512_set1_ps((float)qs[r]));
            const __m512 dot = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[r][c]), skv, off);
            out[r][c] = (vf)_mm512_mul_ps(dot, _mm512_set1_ps(sq[r]));
        }
    }
}
#endif
