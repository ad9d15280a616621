/* How prefill_attention.c's many-row kernels load and score a panel of keys: the float path
 * (load_panel_keys, scores) or, in the KV_INT8 build where the CPU has AVX512-VNNI (kv_int8.h: the
 * rule, the query rounding), integer scores. The float path widens each key's codes and
 * transposes them into a float panel, then spends a 16-lane FMA per 16 keys and dimension; the
 * integer one transposes the panel's codes by 4-byte groups (16 keys per register) and one
 * vpdpbusd gives 64 products of a query row's int8 codes with 16 keys' codes. Included once
 * prefill_attention.c has defined job_t, kv_t, vf, KB, NV, RB and scores, and prefill_panels.h
 * load_panel_keys and (integer scores) transpose16. */
#ifndef KVCLI_PREFILL_SCORES_H
#define KVCLI_PREFILL_SCORES_H

#if defined(KV_VNNI)
#include <immintrin.h>
#include <string.h>

#include "kv_int8.h"

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

/* Query rows rounded to int8 for the integer scores (c NULL: the float path): row i's codes at
 * c + i * D, its scale s[i] and code sum sum[i]. */
typedef struct {
    const int8_t *c;
    const float *s;
    const int32_t *sum;
} qrows_t;

/* The panel's keys in the form their scores take: float K transposed (load_panel_keys), or with
 * quantized rows the codes transposed as bytes into kt and each key's scale and bias. */
static inline void panel_keys(const job_t *j, int64_t D, const int64_t *at, float *kt, float *vb,
                              const qrows_t *qq, float *sk, float *bk) {
#if defined(KV_VNNI)
    if (qq->c) {
        load_codes(j->k, D, at, (__m512i *)kt, sk, bk);
        return;
    }
#endif
    (void)qq, (void)sk, (void)bk;
    load_panel_keys(j, D, at, kt, vb);
}

/* Raw scores of rows i0 .. i0 + RB (of m; past m: row i0 again) against the panel. */
static inline void panel_scores(int64_t D, const float *const *qs, const qrows_t *qq, int64_t i0,
                                int64_t m, const float *kt, const float *sk, const float *bk,
                                vf (*sv)[NV]) {
#if defined(KV_VNNI)
    if (qq->c) {
        const int8_t *qc[RB];
        float sq[RB];
        int32_t su[RB];
        for (int64_t r = 0; r < RB; r++) {
            const int64_t i = i0 + r < m ? i0 + r : i0;
            qc[r] = qq->c + i * D, sq[r] = qq->s[i], su[r] = qq->sum[i];
        }
        scores_vnni(D, qc, sq, su, (const __m512i *)kt, sk, bk, sv);
        return;
    }
#endif
    (void)qq, (void)i0, (void)m, (void)sk, (void)bk;
    scores(D, qs, kt, sv);
}
#endif
