/* y[M, N] = x[M, K] @ W[K, N] (+ bias) for CPU float32 with few rows M (a decode step's batch).
 *
 * W is the [in, out] weight buffer that kvcli stores every Linear in (layers.py). At 8-64 rows
 * a step's matmuls are limited by how fast the weights stream from memory as much as by the
 * multiply-adds; torch's MKL path (which packs W per call) reached ~110 GFLOP/s in a decode step
 * here. This kernel splits the columns across the worker pool, each thread's into blocks of
 * CB columns, and walks K in panels of KB rows: each panel (KB x CB, 64 KB) is multiplied out
 * of L2 in register tiles of MR rows x NR columns, while the next panel is prefetched line by
 * line in memory order, so the weights stream sequentially under the arithmetic. (Panels as
 * wide as the thread's columns put the gate/up matmul's 1,536 columns of partial sums and
 * panel past L2: 10-25% slower at 32-64 rows, Zen 4.) The sums run over k in order, as BLAS
 * does; results differ from torch's in the last bits.
 */
#include <stdint.h>
#include <string.h>

#include "pool.h"

#if defined(__AVX512F__)
#define VW 16 /* floats per vector register */
#define MR 8  /* rows per tile: MR x 2 accumulators + 2 weight vectors fit 32 registers */
#else
#define VW 8
#define MR 6  /* 12 accumulators + 2 + 1 fit AVX2's 16 registers */
#endif
#define NR (2 * VW) /* columns per tile */
#define KB 64       /* rows of W per panel */
#ifndef CB
#define CB 256 /* columns per block: its M x CB sums and KB x CB panel stay in L2 */
#endif

typedef float vec __attribute__((vector_size(VW * 4)));

static inline vec loadu(const float *p) {
    vec v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void storeu(float *p, vec v) { memcpy(p, &v, sizeof v); }

typedef struct {
    const float *x, *w, *bias;
    float *y;
    int64_t M, N, K;
} gemm_args;

/* Walks the next panel's cache lines in memory order, one every `step` inner iterations. */
typedef struct {
    const float *row;
    int64_t col, c0, c1, rows_left, ldw, step, count;
} prefetcher;

static inline void prefetch_next(prefetcher *p) {
    if (p->rows_left <= 0 || ++p->count < p->step) return;
    p->count = 0;
    __builtin_prefetch(p->row + p->col, 0, 1); /* into L2: the panel is multiplied out of L2 */
    p->col += 16; /* floats per 64-byte line */
    if (p->col >= p->c1) {
        p->col = p->c0;
        p->row += p->ldw;
        p->rows_left--;
    }
}

/* Rows [i, i + mr) x columns [j, j + NR), k in [k0, k0 + kb): starts from the bias (first
 * panel) or the partial sums in y. mr is a constant in every call, so the loops unroll. */
static inline __attribute__((always_inline)) void tile(const gemm_args *a, int64_t i, int64_t j,
                                                       const int mr, int64_t k0, int64_t kb,
                                                       prefetcher *pf) {
    vec acc[MR][2];
    float *y = a->y + i * a->N + j;
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < 2; v++)
            acc[r][v] = k0 ? loadu(y + r * a->N + v * VW)
                           : a->bias ? loadu(a->bias + j + v * VW) : (vec){0};
    const float *x = a->x + i * a->K + k0, *w = a->w + k0 * a->N + j;
    for (int64_t k = 0; k < kb; k++, w += a->N) {
        prefetch_next(pf);
        const vec b0 = loadu(w), b1 = loadu(w + VW);
        for (int r = 0; r < mr; r++) {
            const float s = x[r * a->K + k];
            acc[r][0] += s * b0;
            acc[r][1] += s * b1;
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < 2; v++) storeu(y + r * a->N + v * VW, acc[r][v]);
}

static void column_tile(const gemm_args *a, int64_t j, int64_t k0, int64_t kb, prefetcher *pf) {
    int64_t i = 0;
    for (; i + MR <= a->M; i += MR) tile(a, i, j, MR, k0, kb, pf);
    switch (a->M - i) { /* the last rows */
    case 1: tile(a, i, j, 1, k0, kb, pf); break;
    case 2: tile(a, i, j, 2, k0, kb, pf); break;
    case 3: tile(a, i, j, 3, k0, kb, pf); break;
    case 4: tile(a, i, j, 4, k0, kb, pf); break;
    case 5: tile(a, i, j, 5, k0, kb, pf); break;
#if MR > 6
    case 6: tile(a, i, j, 6, k0, kb, pf); break;
    case 7: tile(a, i, j, 7, k0, kb, pf); break;
#endif
    default: break;
    }
}

/* Columns past the last whole tile (N not a multiple of NR: small test models). */
static void column_rest(const gemm_args *a, int64_t j0) {
    for (int64_t i = 0; i < a->M; i++)
        for (int64_t j = j0; j < a->N; j++) {
            float s = a->bias ? a->bias[j] : 0.0f;
            for (int64_t k = 0; k < a->K; k++) s += a->x[i * a->K + k] * a->w[k * a->N + j];
            a->y[i * a->N + j] = s;
        }
}

/* Columns [b0, b1) of one thread, k panel by k panel: the block's partial sums (M x CB) and
 * its panel (KB x CB) stay in L2 while the next panel (the next block's first one after the
 * last) is prefetched. Each output still sums over k in order from its bias, so the
 * blocking changes no result bit. */
static void column_block(const gemm_args *a, int64_t b0, int64_t b1, int64_t next_b1) {
    const int64_t row_tiles = (a->M + MR - 1) / MR;
    for (int64_t k0 = 0; k0 < a->K; k0 += KB) {
        const int64_t kb = a->K - k0 < KB ? a->K - k0 : KB;
        int64_t next = k0 + kb, p0 = b0, p1 = b1;
        if (next >= a->K) next = 0, p0 = b1, p1 = next_b1; /* the next block's first panel */
        const int64_t next_rows = p1 > p0 ? (a->K - next < KB ? a->K - next : KB) : 0;
        const int64_t iters = (b1 - b0) / NR * row_tiles * kb;
        const int64_t lines = next_rows * ((p1 - p0 + 15) / 16);
        prefetcher pf = {a->w + next * a->N, p0, p0, p1, next_rows, a->N,
                         lines > 0 && iters > lines ? iters / lines : 1, 0};
        for (int64_t j = b0; j < b1; j += NR) column_tile(a, j, k0, kb, &pf);
    }
}

static void gemm_part(const void *args, int64_t t, int64_t n) {
    const gemm_args *a = (const gemm_args *)args;
    const int64_t tiles_n = a->N / NR, c0 = tiles_n * t / n * NR, c1 = tiles_n * (t + 1) / n * NR;
    for (int64_t b0 = c0; b0 < c1; b0 += CB) {
        const int64_t b1 = b0 + CB < c1 ? b0 + CB : c1;
        column_block(a, b0, b1, b1 + CB < c1 ? b1 + CB : c1);
    }
    if (t == n - 1 && tiles_n * NR < a->N) column_rest(a, tiles_n * NR);
}

void kvcli_gemm(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N,
                int64_t K, int64_t threads) {
    const gemm_args a = {x, w, bias, y, M, N, K};
    const int64_t tiles_n = N / NR;
    if (threads > tiles_n) threads = tiles_n > 0 ? tiles_n : 1;
    kvcli_parallel(gemm_part, &a, threads, M <= KVCLI_DECODE_ROWS ? KVCLI_SPIN_NS : 0);
}
