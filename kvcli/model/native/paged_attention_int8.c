/* The int8 KV cache's write (kvcli_quantize_kv) and paged decode kernel
 * (kvcli_paged_decode_attention_int8: paged_attention.c built for kv_int8.h's rows).
 *
 * kvcli_quantize_kv writes new K or V rows into their slots, per token and KV head: min and
 * max of the row give scale = (max - min) / 255 and zero = -min / scale.
 */
#define KV_INT8 1
#include "paged_attention.c"

typedef struct {
    const float *x;
    const int64_t *slots;
    uint8_t *cache;
    int64_t tokens, heads, D, stride;
} quantize_job;

/* A row's min and max. */
static inline void row_range(const float *src, int64_t D, float *lo, float *hi) {
#if defined(__AVX512F__)
    if (D % 16 == 0) {
        __m512 mn = _mm512_loadu_ps(src), mx = mn;
        for (int64_t d = 16; d < D; d += 16)
            mn = _mm512_min_ps(mn, _mm512_loadu_ps(src + d)),
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(src + d));
        *lo = _mm512_reduce_min_ps(mn), *hi = _mm512_reduce_max_ps(mx);
        return;
    }
#endif
    *lo = *hi = src[0];
    for (int64_t d = 1; d < D; d++) {
        *lo = src[d] < *lo ? src[d] : *lo;
        *hi = src[d] > *hi ? src[d] : *hi;
    }
}

/* u = rint((x - lo) * inv) clamped to [0, 255]: the same operations on 16 lanes or one. */
static inline void row_codes(const float *src, int64_t D, float lo, float inv, uint8_t *dst) {
#if defined(__AVX512F__)
    if (D % 16 == 0) {
        const __m512 vlo = _mm512_set1_ps(lo), vinv = _mm512_set1_ps(inv);
        for (int64_t d = 0; d < D; d += 16) {
            const __m512 c = _mm512_roundscale_ps(
                _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(src + d), vlo), vinv),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m512 u = _mm512_min_ps(_mm512_max_ps(c, _mm512_setzero_ps()),
                                           _mm512_set1_ps(255.0f));
            _mm_storeu_si128((__m128i *)(dst + d), _mm512_cvtusepi32_epi8(_mm512_cvtps_epu32(u)));
        }
        return;
    }
#endif
    for (int64_t d = 0; d < D; d++) {
        const float c = rintf((src[d] - lo) * inv);
        dst[d] = (uint8_t)(c < 0.0f ? 0.0f : c > 255.0f ? 255.0f : c);
    }
}

/* One row's codes and parameters: x ~ (u - zero) * scale. */
static inline void quantize_row(const float *src, int64_t D, uint8_t *dst) {
    float lo, hi;
    row_range(src, D, &lo, &hi);
    /* A constant row keeps scale 1: its codes are all 0 and stand for lo exactly. */
    const float scale = hi > lo ? (hi - lo) / 255.0f : 1.0f, inv = 1.0f / scale;
    row_codes(src, D, lo, inv, dst);
    const float params[2] = {scale, -lo * inv};
    memcpy(dst + D, params, sizeof params);
}

static void quantize_part(const void *args, int64_t t, int64_t n) {
    const quantize_job *j = (const quantize_job *)args;
    for (int64_t i = j->tokens * t / n; i < j->tokens * (t + 1) / n; i++)
        for (int64_t h = 0; h < j->heads; h++) /* rows: the fused projection's */
            quantize_row(j->x + i * j->stride + h * j->D, j->D,
                         j->cache + (j->slots[i] * j->heads + h) * kv8_row(j->D));
}

/* Split over threads by tokens where a prefill chunk's rows make it worth a worker: one core
 * took 0.15 ms for 1,024 tokens' K (Xeon with AMX), the other waiting. */
void kvcli_quantize_kv(const float *x, const int64_t *slots, uint8_t *cache, int64_t num_tokens,
                       int64_t num_kv_heads, int64_t head_dim, int64_t row_stride,
                       int64_t threads) {
    const quantize_job j = {x, slots, cache, num_tokens, num_kv_heads, head_dim, row_stride};
    const int64_t most = num_tokens * num_kv_heads * head_dim / KVCLI_MIN_WORK_PER_THREAD;
    kvcli_parallel_rows(quantize_part, &j, threads < most ? threads : most < 1 ? 1 : most,
                        num_tokens);
}
