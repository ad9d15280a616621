/* The integer kernels' packed weight layout (qint.c computes on it, qint_pack.c writes it).
 * Per (group of 16 output channels, 32-value block) one tile: the weights' bytes (qs), then the
 * channels' scales. The types and their source blocks are qblocks.h's. */
#ifndef KVCLI_QINT_LAYOUT_H
#define KVCLI_QINT_LAYOUT_H
#include <stdint.h>

#include "qblocks.h"

#define GROUP 16 /* output channels per packed tile */

static inline int qint_known(const int64_t type) {
    return type == Q4_0 || type == Q4_1 || type == Q8_0 || type == I8 || type == Q4_K ||
           type == Q5_K || type == Q6_K;
}
/* Weights as bytes (u = w + 128: Q8_0, I8; q + 128: Q5_K; q - 32 + 128: Q6_K), else nibbles. */
static inline int is_byte(const int type) { return type != Q4_0 && type != Q4_1 && type != Q4_K; }
/* Nibbles with a min term (w = d * u + m): their integer sums need no offset. */
static inline int nibble_min(const int type) { return type == Q4_1 || type == Q4_K; }
/* A second scale per channel and block: Q4_1's, Q4_K's and Q5_K's minimum (w = d * q + m),
 * Q6_K's scale of the block's second 16 values (w = d_lo * q or d_hi * q). */
static inline int two_scales(const int type) {
    return nibble_min(type) || type == Q5_K || type == Q6_K;
}
/* float32 scales: I8's per-channel one, and the k-quants' d * sc, whose product of an fp16 and
 * a 6-bit (Q6_K: int8) integer an fp16 cannot hold. */
static inline int float_scales(const int type) { return type == I8 || block_elems(type) == 256; }
static inline int64_t qs_bytes(const int type) { return is_byte(type) ? 512 : 256; }
static inline int64_t tile_bytes(const int type) {
    return qs_bytes(type) + GROUP * (float_scales(type) ? 4 : 2) * (two_scales(type) ? 2 : 1);
}

#endif
