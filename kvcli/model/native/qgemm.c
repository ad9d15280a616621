/* y[M, N] = x[M, K] @ W[N, K]^T (+ bias) with W quantized in blocks along K, for few rows M
 * (a decode step's batch), and the de-quantization of W's rows to float32 (larger row counts,
 * embedding look-ups).
 *
 * W keeps its storage format (qblocks.h): GGUF's blocks straight from the memory-mapped file, or kvcli's int8 (one int8 per weight, a float32 scale per output channel). At 1-64 rows
 * decode is limited by the bytes streamed, so each block is de-quantized in registers right
 * after it is loaded (nibbles / int8 -> float32, times the block's fp16 scale) and multiplied
 * by MR activation rows at once; nothing de-quantized is ever written to memory. Output
 * channels are split across the worker pool. Activations stay float32, so the only error
 * against the de-quantized float64 product is float32 rounding (summed in blocks of 32).
 *
 * One source for every x86 kind: vectors are one register wide (qblocks.h: 16 floats with
 * AVX-512, 8 with AVX2, which has 16 registers, so fewer rows per tile there); the build is
 * keyed by the CPU's flags (native/__init__.py), so each machine compiles its own
 * (KVCLI_NATIVE_ISA=avx2 builds the AVX2 one on an AVX-512 machine).
 */
#include <stdint.h>
#include <string.h>

#include "pool.h"
#include "qblocks.h"

#if defined(__AVX512F__)
#define MR 8 /* rows x NR channels of 16-float accumulators + 4 weight vectors fit 32 registers */
#define NR 2
#else
#define MR 4 /* 4 accumulators + 4 weight vectors + x within AVX2's 16 registers */
#define NR 1
#endif

typedef struct {
    const float *x, *scale, *bias;
    const uint8_t *w;
    float *y;
    int64_t M, N, K, type;
} qgemm_args;

/* Rows [i, i + mr) x channels [n, n + nr): the whole K, accumulated in registers. */
static inline __attribute__((always_inline)) void tile(const qgemm_args *a, const int type,
                                                       int64_t i, const int mr, int64_t n,
                                                       const int nr) {
    const int64_t bb = block_bytes(type), be = block_elems(type), row_bytes = a->K / be * bb;
    vf acc[MR][NR];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) acc[r][c] = (vf){0};
    const uint8_t *w = a->w + n * row_bytes;
    const float *x = a->x + i * a->K;
    for (int64_t k0 = 0; k0 < a->K; k0 += be, w += bb)
        for (int sub = 0; sub < be / 32; sub++) { /* one sub-block of 32 weights per channel */
            const int64_t k = k0 + sub * 32;
            vf wv[NR][NV];
            for (int c = 0; c < nr; c++) block(type, w + c * row_bytes, sub, wv[c]);
            for (int r = 0; r < mr; r++) {
                vf xv[NV];
                for (int j = 0; j < NV; j++) xv[j] = loadu(x + r * a->K + k + j * VW);
                for (int c = 0; c < nr; c++) {
                    vf sum = xv[0] * wv[c][0];
                    for (int j = 1; j < NV; j++) sum += xv[j] * wv[c][j];
                    acc[r][c] += sum;
                }
            }
        }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) {
            float s = 0.0f;
            for (int e = 0; e < VW; e++) s += acc[r][c][e];
            if (type == I8) s *= a->scale[n + c];
            if (a->bias) s += a->bias[n + c];
            a->y[(i + r) * a->N + n + c] = s;
        }
}

/* Every row tile for channels [n, n + nr); mr is a constant in each call, so loops unroll. */
static inline __attribute__((always_inline)) void channels(const qgemm_args *a, const int type,
                                                           int64_t n, const int nr) {
    int64_t i = 0;
    for (; i + MR <= a->M; i += MR) tile(a, type, i, MR, n, nr);
    switch (a->M - i) {
    case 1: tile(a, type, i, 1, n, nr); break;
    case 2: tile(a, type, i, 2, n, nr); break;
    case 3: tile(a, type, i, 3, n, nr); break;
#if MR > 4
    case 4: tile(a, type, i, 4, n, nr); break;
    case 5: tile(a, type, i, 5, n, nr); break;
    case 6: tile(a, type, i, 6, n, nr); break;
    case 7: tile(a, type, i, 7, n, nr); break;
#endif
    default: break;
    }
}

/* Channels [n0, n1) (whole NR groups) row tile by row tile: a tile's activations (MR x K) stay
 * in L1 while it meets every channel of the chunk, whose packed weights (CHUNK x NR rows) stay
 * in L1 too. Channel by channel (channels()), each pair re-read every row of x from L2: at 32
 * rows (74 KB of activations for a 576-wide input) that made batch-32 decode steps 2x the
 * float32 gemm. */
#define CHUNK 32 /* NR-channel groups per chunk: 64 channels of packed rows, ~23 KB of Q4_1 */
#define TILES(MRC)                                                                             \
    for (int64_t n = n0; n < n1; n += NR) tile(a, type, i, MRC, n, NR)
static inline __attribute__((always_inline)) void block_rows(const qgemm_args *a, const int type,
                                                             int64_t n0, int64_t n1) {
    int64_t i = 0;
    for (; i + MR <= a->M; i += MR) TILES(MR);
    switch (a->M - i) {
    case 1: TILES(1); break;
    case 2: TILES(2); break;
    case 3: TILES(3); break;
#if MR > 4
    case 4: TILES(4); break;
    case 5: TILES(5); break;
    case 6: TILES(6); break;
    case 7: TILES(7); break;
#endif
    default: break;
    }
}

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "qgemm_factored.h"
#endif
/* AVX-512 builds take the factored path (Q4_0, Q4_1, Q8_0 16 floats a register, Q5_K and Q6_K 8)
 * up to 16 rows: on Zen 4 it ran the default model's 210 GGUF matrices in 0.56-0.80x the tile
 * path's time at 1-2 rows, ~0.9x at 4-12, 0.83x at 16 (where the tile path goes channel by
 * channel), but 1.15-1.18x at 32-64, where the tile path's 2-channel tiles share activation
 * loads (scripts/bench_qgemm_builds.py, alternated). */
#if defined(__AVX512F__)
#define FACTORED_MAX_ROWS 16
#else
#define FACTORED_MAX_ROWS INT64_MAX
#endif

/* The types the factored path serves: not kvcli's int8 (its scale is per channel already), and
 * on AVX-512 not Q4_K, whose tile path ran 4 Llama-3.2-1B-shaped layers 1.11-1.15x faster at
 * 1 row (Q5_K 0.90x, Q6_K 0.79-0.84x factored). */
static inline int factored_type(const int type) {
#if defined(__AVX512F__)
    return type != I8 && type != Q4_K;
#else
    return type != I8;
#endif
}

/* Part t of n: whole groups of NR channels, the last part the channels left over. At most
 * ONE_CHANNEL_ROWS rows (decode steps) the channels go one at a time: NR channels per tile save
 * activation loads, which pays at 64 rows (1.6x), but at 1-16 rows made int8 1.15-2.3x slower
 * and Q4_1 no faster (paired, AVX-512 on Zen 5). Each channel's sum is the same either way. */
#define ONE_CHANNEL_ROWS 16
static inline __attribute__((always_inline)) void qgemm_part(const qgemm_args *a, const int type,
                                                             int64_t t, int64_t n_threads) {
    const int64_t groups = a->N / NR, g0 = groups * t / n_threads, g1 = groups * (t + 1) / n_threads;
    const int64_t end = t == n_threads - 1 ? a->N : g1 * NR;
#if defined(FACTORED)
    if (factored_type(type) && a->M <= FACTORED_MAX_ROWS) {
        factored_part(a, type, g0 * NR, end);
        return;
    }
#endif
    if (NR > 1 && a->M <= ONE_CHANNEL_ROWS) {
        for (int64_t n = g0 * NR; n < end; n++) channels(a, type, n, 1);
        return;
    }
    for (int64_t g = g0; g < g1; g += CHUNK)
        block_rows(a, type, g * NR, (g + CHUNK < g1 ? g + CHUNK : g1) * NR);
    for (int64_t n = groups * NR; n < end; n++) channels(a, type, n, 1);
}

#define PART(name, type)                                                                          \
    static void name(const void *args, int64_t t, int64_t n) {                                    \
        qgemm_part((const qgemm_args *)args, type, t, n);                                          \
    }
PART(part_q4_0, Q4_0)
PART(part_q4_1, Q4_1)
PART(part_q8_0, Q8_0)
PART(part_i8, I8)
PART(part_q4_k, Q4_K)
PART(part_q5_k, Q5_K)
PART(part_q6_k, Q6_K)

static int known(int64_t type) {
    return type == Q4_0 || type == Q4_1 || type == Q8_0 || type == I8 || type == Q4_K ||
           type == Q5_K || type == Q6_K;
}

/* Returns 0, or -1 for a type this kernel does not know (the caller falls back). */
int kvcli_qgemm(int64_t type, const float *x, const uint8_t *w, const float *scale,
                const float *bias, float *y, int64_t M, int64_t N, int64_t K, int64_t threads) {
    if (!known(type) || K % block_elems((int)type)) return -1;
    task_fn fn = type == Q4_0 ? part_q4_0 : type == Q4_1 ? part_q4_1 : type == Q8_0 ? part_q8_0
               : type == Q4_K ? part_q4_k : type == Q5_K ? part_q5_k : type == Q6_K ? part_q6_k
               : part_i8;
    const qgemm_args a = {x, scale, bias, w, y, M, N, K, type};
    if (threads > N / NR) threads = N / NR > 0 ? N / NR : 1;
    kvcli_parallel_rows(fn, &a, threads, M);
    return 0;
}

typedef struct {
    const uint8_t *w;
    const float *scale;
    const int64_t *rows;
    float *out;
    int64_t count, K, type;
} dequant_args;

static void dequant_part(const void *args, int64_t t, int64_t n) {
    const dequant_args *a = (const dequant_args *)args;
    const int type = (int)a->type;
    const int64_t bb = block_bytes(type), be = block_elems(type), row_bytes = a->K / be * bb;
    for (int64_t i = a->count * t / n; i < a->count * (t + 1) / n; i++) {
        const int64_t row = a->rows ? a->rows[i] : i;
        const uint8_t *w = a->w + row * row_bytes;
        const float s = type == I8 ? a->scale[row] : 1.0f;
        float *out = a->out + i * a->K;
        for (int64_t k = 0; k < a->K; k += 32) {
            const uint8_t *blk = w + k / be * bb;
            const int sub = (int)(k % be / 32);
            vf v[NV];
            switch (type) { /* a constant type per case: block() folds to one format */
            case Q4_0: block(Q4_0, blk, sub, v); break;
            case Q4_1: block(Q4_1, blk, sub, v); break;
            case Q8_0: block(Q8_0, blk, sub, v); break;
            case Q4_K: block(Q4_K, blk, sub, v); break;
            case Q5_K: block(Q5_K, blk, sub, v); break;
            case Q6_K: block(Q6_K, blk, sub, v); break;
            default:
                block(I8, blk, sub, v);
                for (int j = 0; j < NV; j++) v[j] *= s;
                break;
            }
            memcpy(out + k, v, sizeof v);
        }
    }
}

/* out[i, :] = de-quantized row rows[i] (row i when rows is NULL), for i < count. */
int kvcli_qdequant(int64_t type, const uint8_t *w, const float *scale, const int64_t *rows,
                   float *out, int64_t count, int64_t K, int64_t threads) {
    if (!known(type) || K % block_elems((int)type)) return -1;
    const dequant_args a = {w, scale, rows, out, count, K, type};
    if (threads > count) threads = count > 0 ? count : 1;
    kvcli_parallel(dequant_part, &a, threads, 0);
    return 0;
}
