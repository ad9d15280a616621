/* expf over arrays (softmax numerators, SiLU), and a row's max and sum, shared by the attention
 * and element-wise kernels.
 *
 * With AVX-512, in registers: Cephes' expf (x = n ln 2 + r with ln 2 in two parts, |r| <= ln 2 / 2,
 * a degree-7 polynomial for e^r, then 2^n by vscalefps, which also gives inf past 88.7 and 0
 * below -103.9; ~1 ulp as glibc's). glibc's vector expf, which the loop vectorizer calls
 * otherwise, re-does any lane out of its fast range with the scalar expf (SiLU's large |g| take
 * that path) and costs a call per 16 values: SiLU-and-mul ran at 1.8 G values/s on two Zen 4
 * cores. Without AVX-512 the plain loops stay, and glibc's vector expf with them. NaN stays NaN
 * (max and min return their second operand when either is NaN).
 */
#ifndef KVCLI_VEXP_H
#define KVCLI_VEXP_H
#include <math.h>
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>

static inline __m512 vexp16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* dst[t] = expf(src[t] - shift), t < n (dst may be src). */
static inline void exp_shifted(const float *src, float shift, float *dst, int64_t n) {
    const __m512 s = _mm512_set1_ps(shift);
    for (int64_t t = 0; t < n; t += 16) {
        const __mmask16 m = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);
        _mm512_mask_storeu_ps(dst + t, m, vexp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, src + t), s)));
    }
}

/* A row's max and sum (the attention kernels' softmax rows) in two chains of 16 lanes: the
 * compiler's loops kept one 8-lane chain, bound by the latency of each max or add (one layer's
 * int8 prefill, two 448-token prompts: 2.72 -> 2.56 ms). */
#define ROW_REDUCE(NAME, OP, START, REDUCE, MASK_OP)                                               \
    static inline float NAME(const float *x, int64_t n) {                                          \
        __m512 a = START, b = a;                                                                   \
        int64_t t = 0;                                                                             \
        for (; t + 32 <= n; t += 32)                                                               \
            a = OP(a, _mm512_loadu_ps(x + t)), b = OP(b, _mm512_loadu_ps(x + t + 16));             \
        for (; t < n; t += 16) {                                                                   \
            const __mmask16 m = n - t >= 16 ? 0xFFFF : (__mmask16)((1u << (n - t)) - 1);           \
            a = MASK_OP(a, m, a, _mm512_maskz_loadu_ps(m, x + t));                                 \
        }                                                                                          \
        return REDUCE(OP(a, b));                                                                   \
    }
ROW_REDUCE(max_of, _mm512_max_ps, _mm512_set1_ps(-INFINITY), _mm512_reduce_max_ps,
           _mm512_mask_max_ps)
ROW_REDUCE(sum_of, _mm512_add_ps, _mm512_setzero_ps(), _mm512_reduce_add_ps, _mm512_mask_add_ps)
#undef ROW_REDUCE

/* silu(g) * u = g / (1 + e^-g) * u, 16 lanes: SiLU-and-mul's one rule (silu_mul below and
 * swiglu_amx.c's fold). e^-g is capped at e^88 (finite): -ffast-math turns the division into a
 * reciprocal estimate and a Newton step, which gives NaN for an infinite divisor. */
static inline __m512 silu_mul16(__m512 g, __m512 u) {
    const __m512 e = vexp16(_mm512_min_ps(_mm512_set1_ps(88.0f),
                                          _mm512_sub_ps(_mm512_setzero_ps(), g)));
    return _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), u);
}

/* out[i] = silu(g[i]) * u[i], i < d. */
static inline void silu_mul(const float *g, const float *u, float *out, int64_t d) {
    for (int64_t i = 0; i < d; i += 16) {
        const __mmask16 m = d - i >= 16 ? 0xFFFF : (__mmask16)((1u << (d - i)) - 1);
        _mm512_mask_storeu_ps(out + i, m, silu_mul16(_mm512_maskz_loadu_ps(m, g + i),
                                                     _mm512_maskz_loadu_ps(m, u + i)));
    }
}
#else
/* Out of line with a runtime count, so the loop vectorizer calls glibc's vector expf (a fixed
 * 16 is unrolled into 16 scalar calls instead). */
__attribute__((noinline, unused)) static void exp_shifted(const float *src, float shift,
                                                          float *dst, int64_t n) {
    for (int64_t t = 0; t < n; t++) dst[t] = expf(src[t] - shift);
}

__attribute__((unused)) static inline float max_of(const float *x, int64_t n) {
    float top = x[0];
    for (int64_t t = 1; t < n; t++) top = x[t] > top ? x[t] : top;
    return top;
}

__attribute__((unused)) static inline float sum_of(const float *x, int64_t n) {
    float sum = 0.0f;
    for (int64_t t = 0; t < n; t++) sum += x[t];
    return sum;
}

__attribute__((unused)) static void silu_mul(const float *g, const float *u, float *out,
                                             int64_t d) {
    for (int64_t i = 0; i < d; i++) out[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}
#endif
#endif
