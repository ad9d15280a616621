/* How the kernels of a converted KV cache read its rows, one build per format: int8 (the
 * default: kv_int8.h's codes with their scale and zero point) or, with KV_BF16, bfloat16
 * (scale 1, bias 0). A row holds kv_row(D) elements of kv_t; kv_f32 widens one element, and
 * x = kv_f32(u) * scale + bias. */
#ifndef KVCLI_KV_ROWS_H
#define KVCLI_KV_ROWS_H
#include <stdint.h>
#include <string.h>

#if defined(KV_BF16)
typedef uint16_t kv_t;
static inline int64_t kv_row(int64_t D) { return D; }
static inline float kv_f32(kv_t x) {
    const uint32_t bits = (uint32_t)x << 16; /* bfloat16 is float32's upper half */
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}
static inline void kv_params(const kv_t *row, int64_t D, float *scale, float *bias) {
    (void)row, (void)D;
    *scale = 1.0f, *bias = 0.0f;
}
#define KV_NAME(name) name##_bf16
#else
#include "kv_int8.h"
typedef uint8_t kv_t;
static inline int64_t kv_row(int64_t D) { return kv8_row(D); }
static inline float kv_f32(kv_t x) { return (float)x; }
static inline void kv_params(const kv_t *row, int64_t D, float *scale, float *bias) {
    kv8_params(row, D, scale, bias);
}
#define KV_NAME(name) name##_int8
#endif
#endif
