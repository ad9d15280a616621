/* The integer kernels' weights, repacked once at load from their source blocks (qint_layout.h's
 * tiles; qint.c's header describes them and what the kernel computes from them). Every source
 * 32-value block (a k-quant's sub-block) becomes 32 unsigned bytes u in element order and one
 * or two scales per channel:
 *   Q4_0, Q4_1: nibbles; fp16 d (Q4_1: and fp16 m)           w = d * (u - 8) | d * u + m
 *   Q8_0, I8:   u = w + 128; fp16 d (I8: the row's float32)   w = d * (u - 128)
 *   Q4_K:       nibbles; float32 d1 = d * sc, -m1 = -(dmin * m)       w = d1 * u - m1
 *   Q5_K:       u = q + 128 (q 0..31); float32 d1, -m1                w = d1 * q - m1
 *   Q6_K:       u = q - 32 + 128 (q 0..63); float32 d * sc of each 16  w = (d * sc) * (q - 32)
 * The k-quants' float32 scales are the products gguf's de-quantization forms (float32 d * sc),
 * so they are bit for bit the ones the float path's weights are made of.
 */
#include <stdint.h>
#include <string.h>

#include "qint_layout.h"

/* Packed bytes of an N x K weight (kvcli_qint_pack's output size); -1: a type or K it lacks. */
int64_t kvcli_qint_packed_bytes(int64_t type, int64_t N, int64_t K) {
    if (!qint_known(type) || K % block_elems((int)type)) return -1;
    return (N + GROUP - 1) / GROUP * (K / 32) * tile_bytes((int)type);
}

/* Block `sub` (0..7) of a k-quant superblock p: its 32 bytes u and its two float32 scales. */
static void k_quant_source(const int type, const uint8_t *p, const int sub, uint8_t *u,
                           float *f) {
    if (type == Q6_K) { /* as qblocks.h's block(): ql, qh of each half of the superblock */
        const int half = sub / 4, v = sub % 4, shift = (v / 2) * 4;
        const uint8_t *ql = p + half * 64 + (v % 2) * 32, *qh = p + 128 + half * 32;
        const int8_t *scales = (const int8_t *)(p + 192);
        const float d = half_to_float(p + 208);
        for (int j = 0; j < 32; j++)
            u[j] = (uint8_t)((((ql[j] >> shift) & 15) | (((qh[j] >> (2 * v)) & 3) << 4)) + 96);
        f[0] = d * (float)scales[2 * sub];
        f[1] = d * (float)scales[2 * sub + 1];
        return;
    }
    float sc, mn;
    k_scale_min(p + 4, sub, &sc, &mn);
    f[0] = half_to_float(p) * sc;
    f[1] = -(half_to_float(p + 2) * mn);
    const uint8_t *qs = p + (type == Q4_K ? 16 : 48) + (sub / 2) * 32;
    for (int j = 0; j < 32; j++) {
        u[j] = (uint8_t)((qs[j] >> ((sub % 2) * 4)) & 15);
        if (type == Q5_K) u[j] = (uint8_t)(u[j] + (((p[16 + j] >> sub) & 1) << 4) + 128);
    }
}

/* Block b of channel n's source row: its bytes u and scales (as raw fp16 / float32 bytes). */
static void source_block(const int type, const uint8_t *row, const float *scale, const int64_t n,
                         const int64_t b, uint8_t *u, uint8_t *scales) {
    if (block_elems(type) == 256) {
        float f[2];
        k_quant_source(type, row + b / 8 * block_bytes(type), (int)(b % 8), u, f);
        memcpy(scales, f, 8);
        return;
    }
    const uint8_t *blk = row + b * block_bytes(type);
    if (is_byte(type)) { /* Q8_0, I8 */
        const int at = type == Q8_0 ? 2 : 0;
        for (int j = 0; j < 32; j++) u[j] = (uint8_t)((int)(int8_t)blk[at + j] + 128);
        memcpy(scales, type == I8 ? (const uint8_t *)(scale + n) : blk, type == I8 ? 4 : 2);
        return;
    }
    const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
    for (int j = 0; j < 16; j++) {
        u[j] = qs[j] & 15;
        u[j + 16] = qs[j] >> 4;
    }
    memcpy(scales, blk, type == Q4_1 ? 4 : 2); /* d (and Q4_1's m) */
}

/* One channel's block into its tile: byte types' k-group kg in vector kg; nibbles' k-group kg
 * in the low nibbles of vector kg % 4 for kg < 4, in the high ones for the rest. */
static void place(const int type, const uint8_t *u, const uint8_t *scales, const int c,
                  uint8_t *tile) {
    for (int k = 0; k < 32; k++) {
        const int kg = k / 4, at = c * 4 + k % 4;
        if (is_byte(type))
            tile[kg * 64 + at] = u[k];
        else
            tile[(kg & 3) * 64 + at] |= (uint8_t)(u[k] << (kg < 4 ? 0 : 4));
    }
    const int64_t size = float_scales(type) ? 4 : 2; /* each scale's bytes */
    uint8_t *sc = tile + qs_bytes(type);
    memcpy(sc + c * size, scales, (size_t)size);
    if (two_scales(type)) memcpy(sc + GROUP * size + c * size, scales + size, (size_t)size);
}

/* scale: I8's float32 per row (NULL for the GGUF types, whose scales are in their blocks). */
int kvcli_qint_pack(int64_t type, const uint8_t *src, const float *scale, uint8_t *dst, int64_t N,
                    int64_t K) {
    if (kvcli_qint_packed_bytes(type, N, K) < 0 || (type == I8 && !scale)) return -1;
    const int t = (int)type;
    const int64_t kb = K / 32, tb = tile_bytes(t), row_bytes = K / block_elems(t) * block_bytes(t);
    memset(dst, 0, (size_t)kvcli_qint_packed_bytes(type, N, K));
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < kb; b++) {
            uint8_t u[32], scales[8];
            source_block(t, src + n * row_bytes, scale, n, b, u, scales);
            place(t, u, scales, (int)(n % GROUP), dst + ((n / GROUP) * kb + b) * tb);
        }
    return 0;
}
