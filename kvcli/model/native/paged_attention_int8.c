/* The int8 KV cache's write (kvcli_quantize_kv) and paged decode kernel
 * (kvcli_paged_decode_attention_int8: paged_attention.c built for kv_int8.h's rows).
 *
 * kvcli_quantize_kv writes new K or V rows into their slots, per token and KV head: min and
 * max of the row give scale = (max - min) / 255 and zero = -min / scale.
 */
#define KV_INT8 1
#include "paged_attention.c"

void kvcli_quantize_kv(const float *x, const int64_t *slots, uint8_t *cache, int64_t num_tokens,
                       int64_t num_kv_heads, int64_t head_dim, int64_t row_stride) {
    const int64_t D = head_dim, R = kv8_row(D);
    for (int64_t t = 0; t < num_tokens; t++)
        for (int64_t h = 0; h < num_kv_heads; h++) {
            const float *src = x + t * row_stride + h * D; /* rows: the fused projection's */
            uint8_t *dst = cache + (slots[t] * num_kv_heads + h) * R;
            float lo = src[0], hi = src[0];
            for (int64_t d = 1; d < D; d++) {
                lo = src[d] < lo ? src[d] : lo;
                hi = src[d] > hi ? src[d] : hi;
            }
            /* A constant row keeps scale 1: its codes are all 0 and stand for lo exactly. */
            const float scale = hi > lo ? (hi - lo) / 255.0f : 1.0f, inv = 1.0f / scale;
            for (int64_t d = 0; d < D; d++) {
                const float c = rintf((src[d] - lo) * inv);
                dst[d] = (uint8_t)(c < 0.0f ? 0.0f : c > 255.0f ? 255.0f : c);
            }
            const float params[2] = {scale, -lo * inv};
            memcpy(dst + D, params, sizeof params);
        }
}
