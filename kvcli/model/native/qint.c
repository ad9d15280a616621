/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias) in integer arithmetic (--quantization gguf-int): the
 * activations are quantized on the fly to int8, one float scale per 32 values (llama.cpp's
 * q8_0: d = max|x| / 127, q = round(x / d)), and each 32-value block's dot product with the
 * weights' bytes is summed in int32 by the CPU's byte dot-product instructions.
 *
 * Weights (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K; kvcli's per-channel int8, I8) are repacked once
 * at load (qint_pack.c): 16 output channels interleaved per 32-value block (a k-quant's
 * sub-block), each channel's 4 consecutive weights in one 32-bit lane, so a register of weight
 * bytes meets one broadcast 4-byte group of activations per instruction (the idea of
 * llama.cpp's Q4_0 8x8 repacking). Per (group of 16 channels, block) one tile (qint_layout.h):
 *   Q4_0 / Q4_1 / Q4_K: 4 x 64 bytes of nibbles (vector j: k-group j in the low nibbles, j + 4
 *                in the high ones); 16 fp16 scales d, Q4_1 also 16 fp16 minima m; Q4_K 16
 *                float32 d * sc and 16 float32 -(dmin * m)
 *   Q8_0 / Q5_K / Q6_K: 8 x 64 bytes (w + 128, q + 128, q - 32 + 128); Q8_0 16 fp16 scales,
 *                Q5_K float32 scales and minima as Q4_K's, Q6_K 16 float32 d * sc for the
 *                block's first 16 values and 16 for its last 16
 *   I8:          as Q8_0 with 16 float32 scales (each channel's, in every block)
 * Channels past N (the last group) are zero blocks. With the weights' bytes unsigned (u) and
 * w = d * (u - off) + m, a block contributes dx * (d * sum(u * qx) + (m - off * d) * sum(qx)):
 * the activations' per-block sums are kept beside their scales. Q6_K's two scales per block
 * need two integer sums (k-groups 0-3, 4-7), so its offset term needs the sum of each half
 * block's qx: quantize_rows writes both (o, two per block). The alternative, unsigned q 0..63
 * with sums starting at -32 * sum_half(qx), needs the same half sums; bytes q - 32 + 128 keep
 * Q6_K on the byte types' paths (AVX2's signed one needs no offset term at all).
 * Outputs differ from the float product of the de-quantized weights only by the activations'
 * rounding (and float32 sums).
 *
 * The variant (AVX512-VNNI, AVX-VNNI, AVX2) is an argument: every one is compiled with its own
 * target attributes, whatever -march the rest of the library has, and Python picks the one the
 * CPU has (kvcli/model/native/__init__.py, qint_variant), so all three are testable here.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "pool.h"
#include "qint_layout.h"

#define TILE_GROUPS_512 2 /* groups per AVX-512 register tile (qint_kernel.h) */
#define AMX_ROWS 16       /* rows per AMX tile (qint_amx.h) */

/* The weight offset the integer sums carry (w = d * (byte - off) + m): Q4_0's 8, the byte
 * types' 128 (their bytes are w + 128), except on AVX2, whose byte path multiplies the signed
 * weights. */
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
 * not NULL, o = -off * sum of the block's q (the integer sums' starting value); with halves,
 * two per block: -off * the sum of its first 16 q, then of its last 16 (Q6_K's). */
static void quantize_rows(const float *x, int8_t *q, float *d, float *s, int32_t *o, int off,
                          int halves, int64_t r0, int64_t r1, int64_t K) {
    for (int64_t blk = r0 * (K / 32); blk < r1 * (K / 32); blk++) {
        const int sum = quantize_block(x + blk * 32, q + blk * 32, d + blk);
        s[blk] = d[blk] * (float)sum;
        if (!o) continue;
        if (!halves) {
            o[blk] = -off * sum;
            continue;
        }
        int first = 0;
        for (int j = 0; j < 16; j++) first += q[blk * 32 + j];
        o[2 * blk] = -off * first;
        o[2 * blk + 1] = -off * (sum - first);
    }
}

typedef struct {
    const float *x;
    int8_t *q;
    float *d, *s;
    int32_t *o;
    int off, halves;
    int64_t M, K;
} quant_args;

static void quant_part(const void *args, int64_t t, int64_t n) {
    const quant_args *a = (const quant_args *)args;
    quantize_rows(a->x, a->q, a->d, a->s, a->o, a->off, a->halves, a->M * t / n, a->M * (t + 1) / n, a->K);
}

/* The activations' quantization alone (tests compare the kernel against it). */
void kvcli_qint_quantize(const float *x, int8_t *q, float *d, float *s, int64_t M, int64_t K) {
    quantize_rows(x, q, d, s, NULL, 0, 0, 0, M, K);
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

/* Groups per chunk: ~24 KB of packed weights (a whole number of register tiles), which a row
 * tile then meets tile by tile from L1. */
static inline int64_t chunk_groups(const int type, const int64_t K, const int64_t tile) {
    const int64_t groups = 24576 / (K / 32 * tile_bytes(type)) / tile * tile;
    return groups > tile ? groups : tile;
}

/* Rows per panel: a panel's quantized rows (K bytes and 12 bytes of scales per 32) stay in L2
 * (~64 KB) while the thread's weights pass by, a multiple of the register tile's rows. */
static inline int64_t panel_rows(const int64_t K, const int64_t tile) {
    const int64_t rows = 65536 / (K + K / 32 * 12) / tile * tile;
    return rows > tile ? rows : tile;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* AMX intrinsics: GCC 11 and clang 12 on; an older compiler builds the other three variants. */
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)
#define QINT_VARIANTS 4
#else
#define QINT_VARIANTS 3
#endif
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#define QV 0
#include "qint_kernel.h"
#undef QV
#pragma GCC pop_options
#if QINT_VARIANTS > 3
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")
#include "qint_amx.h"
#pragma GCC pop_options
#endif
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

/* The types' order in part_fn's table. */
static int type_index(const int64_t type) {
    static const int64_t order[7] = {Q4_0, Q4_1, Q8_0, I8, Q4_K, Q5_K, Q6_K};
    int i = 0;
    while (order[i] != type) i++;
    return i;
}

#define QINT_PARTS(v)                                                                           \
    {part_q4_0_##v, part_q4_1_##v, part_q8_0_##v, part_i8_##v, part_q4_k_##v, part_q5_k_##v,    \
     part_q6_k_##v}
static task_fn part_fn(int64_t variant, int64_t type) {
    static const task_fn fns[QINT_VARIANTS][7] = {
        QINT_PARTS(vnni512), QINT_PARTS(avxvnni), QINT_PARTS(avx2),
#if QINT_VARIANTS > 3
        {part_q4_0_amx, part_q4_1_amx, part_q8_0_amx, part_i8_amx, part_q4_k_amx, part_q5_k_amx,
         part_q6_k_vnni512},
#endif
    };
    return fns[variant][type_index(type)];
}
#undef QINT_PARTS
#else
#define QINT_VARIANTS 0
static task_fn part_fn(int64_t variant, int64_t type) {
    (void)variant, (void)type;
    return 0;
}
#endif

/* How many variants this build has (0: none, not x86): 0 AVX512-VNNI, 1 AVX-VNNI, 2 AVX2,
 * 3 AMX-INT8. */
int64_t kvcli_qint_variants(void) { return QINT_VARIANTS; }

/* Whether this process may use AMX tiles: Linux hands out their state only on request (else the
 * first tile instruction faults), once per process. 1 granted, 0 not (or not Linux / x86). */
int64_t kvcli_qint_amx_ready(void) {
#if defined(__linux__) && defined(__x86_64__)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#else
    return 0;
#endif
}

/* Rows at least this many quantize their activations on the pool too. */
#define QUANT_PARALLEL_ROWS 16

/* Returns 0; -1 for a type, shape or variant this kernel lacks; -2 out of memory. The caller
 * must pick a variant the CPU runs. */
int kvcli_qint_gemm(int64_t variant, int64_t type, const float *x, const uint8_t *w,
                    const float *bias, float *y, int64_t M, int64_t N, int64_t K,
                    int64_t threads) {
    if (!qint_known(type) || K % 32 || variant < 0 || variant >= QINT_VARIANTS) return -1;
    if (variant == 3 && M < AMX_ROWS) variant = 0; /* no whole AMX tile: the same sums on VNNI */
    const int64_t kb = K / 32;
    const int halves = type == Q6_K; /* two offset terms per block (see the header) */
    /* one allocation: q (M x K bytes, rounded to 64) then d, s and o (M x K/32 of 4 bytes each;
     * o twice that for Q6_K) */
    const size_t qbytes = ((size_t)(M * K) + 63) / 64 * 64;
    uint8_t *scratch = aligned_alloc(64, qbytes + (size_t)((3 + halves) * M * kb) * 4 + 64);
    if (!scratch) return -2;
    int8_t *q = (int8_t *)scratch;
    float *d = (float *)(scratch + qbytes), *s = d + M * kb;
    int32_t *o = (int32_t *)(s + M * kb);
    const quant_args qa = {x, q, d, s, o, weight_offset((int)type, variant), halves, M, K};
    kvcli_parallel_rows(quant_part, &qa, M >= QUANT_PARALLEL_ROWS ? threads : 1, M);
    const qint_args a = {q, d, s, bias, o, w, y, M, N, K};
    /* parts are whole register tiles of channels (AVX-512: two groups) */
    const int64_t per = variant == 0 || variant == 3 ? TILE_GROUPS_512 : 1;
    const int64_t tiles = ((N + GROUP - 1) / GROUP + per - 1) / per;
    if (threads > tiles) threads = tiles;
    kvcli_parallel_rows(part_fn(variant, type), &a, threads, M);
    free(scratch);
    return 0;
}
