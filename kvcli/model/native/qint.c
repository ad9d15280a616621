/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias) in integer arithmetic (--quantization gguf-int): the
 * activations are quantized on the fly to int8, one float scale per 32 values (llama.cpp's
 * q8_0: d = max|x| / 127, q = round(x / d)), and each 32-value block's dot product with the
 * weights' bytes is summed in int32 by the CPU's byte dot-product instructions.
 *
 * Weights (Q4_0, Q4_1, Q8_0; kvcli's per-channel int8, I8) are repacked once at load (kvcli_qint_pack): 16 output channels
 * interleaved per 32-value block, each channel's 4 consecutive weights in one 32-bit lane, so a
 * register of weight bytes meets one broadcast 4-byte group of activations per instruction (the
 * idea of llama.cpp's Q4_0 8x8 repacking). Per (group of 16 channels, block) one tile:
 *   Q4_0 / Q4_1: 4 x 64 bytes of nibbles (vector j: k-group j in the low nibbles, j + 4 in the
 *                high ones), 16 fp16 scales d, Q4_1 also 16 fp16 minima m
 *   Q8_0:        8 x 64 bytes of w + 128, 16 fp16 scales
 *   I8:          as Q8_0 with 16 float32 scales (each channel's, in every block)
 * Channels past N (the last group) are zero blocks. With the weights' bytes unsigned (u) and
 * w = d * (u - off) + m, a block contributes dx * (d * sum(u * qx) + (m - off * d) * sum(qx)):
 * the activations' per-block sums are kept beside their scales. Outputs differ from the float
 * product of the de-quantized weights only by the activations' rounding (and float32 sums).
 *
 * The variant (AVX512-VNNI, AVX-VNNI, AVX2) is an argument: every one is compiled with its own
 * target attributes, whatever -march the rest of the library has, and Python picks the one the
 * CPU has (kvcli/model/native/__init__.py, qint_variant), so all three are testable here.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

enum { Q4_0 = 2, Q4_1 = 3, Q8_0 = 8, I8 = 24 }; /* I8: kvcli int8 rows, a float scale per row */
#define GROUP 16 /* output channels per packed tile */
#define TILE_GROUPS_512 2 /* groups per AVX-512 register tile (qint_kernel.h) */

static inline int is_byte(const int type) { return type == Q8_0 || type == I8; }
static inline int64_t qs_bytes(const int type) { return is_byte(type) ? 512 : 256; }
/* I8's scales stay float32 (16 x 4 bytes): its per-channel scale is not an fp16. */
static inline int64_t tile_bytes(const int type) {
    return qs_bytes(type) + (type == Q4_1 || type == I8 ? 64 : 32);
}
static inline int64_t src_block_bytes(const int type) {
    return type == I8 ? 32 : type == Q8_0 ? 34 : type == Q4_1 ? 20 : 18;
}
static int known(const int64_t type) {
    return type == Q4_0 || type == Q4_1 || type == Q8_0 || type == I8;
}

/* Packed bytes of an N x K weight (kvcli_qint_pack's output size). */
int64_t kvcli_qint_packed_bytes(int64_t type, int64_t N, int64_t K) {
    if (!known(type) || K % 32) return -1;
    return (N + GROUP - 1) / GROUP * (K / 32) * tile_bytes((int)type);
}

/* One source block's 32 unsigned weight bytes (Q4: nibbles in element order; Q8_0, I8: w + 128). */
static void source_bytes(const int type, const uint8_t *blk, uint8_t *u) {
    if (is_byte(type)) {
        const int at = type == Q8_0 ? 2 : 0;
        for (int j = 0; j < 32; j++) u[j] = (uint8_t)((int)(int8_t)blk[at + j] + 128);
        return;
    }
    const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
    for (int j = 0; j < 16; j++) {
        u[j] = qs[j] & 15;
        u[j + 16] = qs[j] >> 4;
    }
}

/* scale: I8's float32 per row (NULL for the GGUF types, whose scales are in their blocks). */
int kvcli_qint_pack(int64_t type, const uint8_t *src, const float *scale, uint8_t *dst, int64_t N,
                    int64_t K) {
    if (kvcli_qint_packed_bytes(type, N, K) < 0 || (type == I8 && !scale)) return -1;
    const int t = (int)type;
    const int64_t kb = K / 32, tb = tile_bytes(t), qsb = qs_bytes(t), bb = src_block_bytes(t);
    memset(dst, 0, (size_t)kvcli_qint_packed_bytes(type, N, K));
    for (int64_t n = 0; n < N; n++)
        for (int64_t b = 0; b < kb; b++) {
            const uint8_t *blk = src + (n * kb + b) * bb;
            uint8_t *tile = dst + ((n / GROUP) * kb + b) * tb;
            const int c = (int)(n % GROUP);
            uint8_t u[32];
            source_bytes(t, blk, u);
            for (int k = 0; k < 32; k++) {
                const int kg = k / 4, at = c * 4 + k % 4;
                if (is_byte(t))
                    tile[kg * 64 + at] = u[k];
                else
                    tile[(kg & 3) * 64 + at] |= (uint8_t)(u[k] << (kg < 4 ? 0 : 4));
            }
            if (t == I8)
                memcpy(tile + qsb + c * 4, scale + n, 4);
            else
                memcpy(tile + qsb + c * 2, blk, 2);
            if (t == Q4_1) memcpy(tile + qsb + 32 + c * 2, blk + 2, 2);
        }
    return 0;
}

/* The weight offset the integer sums carry (w = d * (byte - off) + m): Q4_0's 8, the byte
 * types' 128 (their bytes are w + 128), except on AVX2, whose Q8_0 / I8 path multiplies the
 * signed weights. */
static int weight_offset(const int type, const int64_t variant) {
    if (type == Q4_0) return 8;
    return is_byte(type) && variant != 2 ? 128 : 0;
}

/* One 32-value block to int8: q, its scale d (returned through d) and the sum of the q. The
 * library's own -march picks the code (the kernel variants' quantized rows are the same); all
 * round x * (127 / max|x|) to nearest even, as rintf does. */
#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
static inline int quantize_block(const float *v, int8_t *q, float *d) {
    const __m512 a = _mm512_loadu_ps(v), b = _mm512_loadu_ps(v + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b)));
    const __m512 inv = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    const __m512i qa = _mm512_cvtps_epi32(_mm512_mul_ps(a, inv));
    const __m512i qb = _mm512_cvtps_epi32(_mm512_mul_ps(b, inv));
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(qa));
    _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtsepi32_epi8(qb));
    *d = amax / 127.0f;
    return _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
}
#elif defined(__AVX2__)
#include <immintrin.h>
static inline int quantize_block(const float *v, int8_t *q, float *d) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], m = _mm256_setzero_ps();
    for (int j = 0; j < 4; j++) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, x[j] = _mm256_loadu_ps(v + 8 * j)));
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    const float amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
    const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    __m256i qi[4];
    for (int j = 0; j < 4; j++) qi[j] = _mm256_cvtps_epi32(_mm256_mul_ps(x[j], inv));
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(qi[0], qi[1]),
                                             _mm256_packs_epi32(qi[2], qi[3]));
    _mm256_storeu_si256((__m256i *)q, /* packs work per 128-bit lane: put the 4-byte runs back */
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    __m256i t = _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i u = _mm_add_epi32(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
    u = _mm_add_epi32(u, _mm_shuffle_epi32(u, 0x4e));
    *d = amax / 127.0f;
    return _mm_cvtsi128_si32(_mm_add_epi32(u, _mm_shuffle_epi32(u, 0xb1)));
}
#else
static inline int quantize_block(const float *v, int8_t *q, float *d) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(v[j]));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        const int qj = (int)rintf(v[j] * inv);
        q[j] = (int8_t)qj;
        sum += qj;
    }
    *d = amax / 127.0f;
    return sum;
}
#endif

/* Rows [r0, r1) of x to int8 blocks: q, d (scale), s (d * sum of the block's q) and, where o is
 * not NULL, o = -off * sum of the block's q (the integer sums' starting value). */
static void quantize_rows(const float *x, int8_t *q, float *d, float *s, int32_t *o, int off,
                          int64_t r0, int64_t r1, int64_t K) {
    for (int64_t blk = r0 * (K / 32); blk < r1 * (K / 32); blk++) {
        const int sum = quantize_block(x + blk * 32, q + blk * 32, d + blk);
        s[blk] = d[blk] * (float)sum;
        if (o) o[blk] = -off * sum;
    }
}

typedef struct {
    const float *x;
    int8_t *q;
    float *d, *s;
    int32_t *o;
    int off;
    int64_t M, K;
} quant_args;

static void quant_part(const void *args, int64_t t, int64_t n) {
    const quant_args *a = (const quant_args *)args;
    quantize_rows(a->x, a->q, a->d, a->s, a->o, a->off, a->M * t / n, a->M * (t + 1) / n, a->K);
}

/* The activations' quantization alone (tests compare the kernel against it). */
void kvcli_qint_quantize(const float *x, int8_t *q, float *d, float *s, int64_t M, int64_t K) {
    quantize_rows(x, q, d, s, NULL, 0, 0, M, K);
}

typedef struct {
    const int8_t *q;
    const float *d, *s, *bias;
    const int32_t *o;
    const uint8_t *w;
    float *y;
    int64_t M, N, K;
} qint_args;

static inline uint32_t load32(const int8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Rows per panel: a panel's quantized rows (K bytes and 12 bytes of scales per 32) stay in L2
 * (~64 KB) while the thread's weights pass by, a multiple of the register tile's rows. */
static inline int64_t panel_rows(const int64_t K, const int64_t tile) {
    const int64_t rows = 65536 / (K + K / 32 * 12) / tile * tile;
    return rows > tile ? rows : tile;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define QINT_VARIANTS 3
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#define QV 0
#include "qint_kernel.h"
#undef QV
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avxvnni,avx2,fma,f16c")
#define QV 1
#include "qint_kernel.h"
#undef QV
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define QV 2
#include "qint_kernel.h"
#undef QV
#pragma GCC pop_options

static task_fn part_fn(int64_t variant, int64_t type) {
    static const task_fn fns[3][4] = {
        {part_q4_0_vnni512, part_q4_1_vnni512, part_q8_0_vnni512, part_i8_vnni512},
        {part_q4_0_avxvnni, part_q4_1_avxvnni, part_q8_0_avxvnni, part_i8_avxvnni},
        {part_q4_0_avx2, part_q4_1_avx2, part_q8_0_avx2, part_i8_avx2}};
    return fns[variant][type == Q4_0 ? 0 : type == Q4_1 ? 1 : type == Q8_0 ? 2 : 3];
}
#else
#define QINT_VARIANTS 0
static task_fn part_fn(int64_t variant, int64_t type) {
    (void)variant, (void)type;
    return 0;
}
#endif

/* How many variants this build has (0: none, not x86): 0 AVX512-VNNI, 1 AVX-VNNI, 2 AVX2. */
int64_t kvcli_qint_variants(void) { return QINT_VARIANTS; }

/* Rows at least this many quantize their activations on the pool too. */
#define QUANT_PARALLEL_ROWS 16

/* Returns 0; -1 for a type, shape or variant this kernel lacks; -2 out of memory. The caller
 * must pick a variant the CPU runs. */
int kvcli_qint_gemm(int64_t variant, int64_t type, const float *x, const uint8_t *w,
                    const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int64_t threads) {
    if (!known(type) || K % 32 || variant < 0 || variant >= QINT_VARIANTS) return -1;
    const int64_t kb = K / 32;
    /* one allocation: q (M x K bytes, rounded to 64) then d, s and o (M x K/32 of 4 bytes each) */
    const size_t qbytes = ((size_t)(M * K) + 63) / 64 * 64;
    uint8_t *scratch = aligned_alloc(64, qbytes + (size_t)(3 * M * kb) * 4 + 64);
    if (!scratch) return -2;
    int8_t *q = (int8_t *)scratch;
    float *d = (float *)(scratch + qbytes), *s = d + M * kb;
    int32_t *o = (int32_t *)(s + M * kb);
    const quant_args qa = {x, q, d, s, o, weight_offset((int)type, variant), M, K};
    kvcli_parallel(quant_part, &qa, M >= QUANT_PARALLEL_ROWS ? threads : 1, 0);
    const qint_args a = {q, d, s, bias, o, w, y, M, N, K};
    /* parts are whole register tiles of channels (AVX-512: two groups) */
    const int64_t per = variant == 0 ? TILE_GROUPS_512 : 1;
    const int64_t tiles = ((N + GROUP - 1) / GROUP + per - 1) / per;
    if (threads > tiles) threads = tiles;
    kvcli_parallel(part_fn(variant, type), &a, threads,
                   M <= KVCLI_DECODE_ROWS ? KVCLI_SPIN_NS : 0);
    free(scratch);
    return 0;
}
