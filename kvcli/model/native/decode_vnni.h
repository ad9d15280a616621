/* Integer scores of the decode kernel (paged_attention.c's KV_INT8 build) where the CPU has
 * AVX512-VNNI (kv_int8.h: the rule, the query rounding): a token's 64 codes in one register meet
 * the query head's 64 int8 codes in one vpdpbusd, where the float path widens them into four
 * registers and spends four FMAs per head. Included once paged_attention.c has defined kv_t,
 * AI and HC. */
#ifndef KVCLI_DECODE_VNNI_H
#define KVCLI_DECODE_VNNI_H
/* [sum a, sum b, sum c, sum d] of four registers of int32 sums, added as integers (exact, so
 * the same as the float lanes' sums it replaces, which stay below 2^24): two unpack-and-add
 * levels put each register's partial sums in one lane of every 128 bits, two more add the
 * 128-bit quarters. 15 instructions where widening each register, folding it to 8 floats and
 * hsum4's horizontal adds took ~25. */
static AI __m128i hsum4_epi32(__m512i a, __m512i b, __m512i c, __m512i d) {
    const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
    const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
    const __m512i x = _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
    const __m512i y = _mm512_add_epi32(x, _mm512_shuffle_i32x4(x, x, _MM_SHUFFLE(1, 0, 3, 2)));
    return _mm_add_epi32(_mm512_castsi512_si128(y), _mm512_extracti32x4_epi32(y, 1));
}

/* qk_block with integer dot products: query head i's codes qc + i * D (scale qs[i]) against
 * each token's codes, 64 at a time; qsum holds the rounded rows' sums. */
static AI void qk_block_i8(const int8_t *qc, const float *qs, int64_t h0, const int nh,
                           const int64_t D, const kv_t *k, const int64_t *rows, int64_t t,
                           int64_t cnt, int64_t g, const float *qsum, float scale, float *p,
                           int64_t n) {
    const kv_t *u[4];
    for (int j = 0; j < 4; j++) u[j] = k + rows[t + (j < cnt ? j : 0)] + g * kv_row(D);
    __m512i acc[HC][4];
    for (int i = 0; i < nh; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = _mm512_setzero_si512();
    for (int64_t c = 0; c < D; c += 64)
        for (int j = 0; j < 4; j++) {
            const __m512i x = _mm512_loadu_si512(u[j] + c);
            for (int i = 0; i < nh; i++)
                acc[i][j] = _mm512_dpbusd_epi32(acc[i][j], x,
                                                _mm512_loadu_si512(qc + (h0 + i) * D + c));
        }
    float sc[4], bias[4];
    for (int j = 0; j < 4; j++) kv_params(u[j], D, &sc[j], &bias[j]);
    const __m128 vsc = _mm_loadu_ps(sc), vbias = _mm_loadu_ps(bias), vs = _mm_set1_ps(scale);
    for (int i = 0; i < nh; i++) {
        const __m128 dots = _mm_mul_ps(
            _mm_cvtepi32_ps(hsum4_epi32(acc[i][0], acc[i][1], acc[i][2], acc[i][3])),
            _mm_set1_ps(qs[h0 + i]));
        const __m128 s = _mm_mul_ps(
            _mm_fmadd_ps(vsc, dots, _mm_mul_ps(vbias, _mm_set1_ps(qsum[h0 + i]))), vs);
        if (cnt == 4) {
            _mm_storeu_ps(p + (h0 + i) * n + t, s);
            continue;
        }
        float out[4];
        _mm_storeu_ps(out, s);
        for (int j = 0; j < cnt; j++) p[(h0 + i) * n + t + j] = out[j];
    }
}
#endif
