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
#endif
