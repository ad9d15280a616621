/* y[M, N] = x[M, K] @ W[K, N] (+ bias) for CPU float32 with few rows M (a decode step's batch).
 *
 * W is the [in, out] weight buffer that kvcli stores every Linear in (layers.py). At 8-64 rows
 * a step's matmuls are limited by how fast the weights stream from memory as much as by the
 * multiply-adds; torch's MKL path (which packs W per call) reached ~110 GFLOP/s in a decode step
 * here. This kernel splits the columns across the worker pool, each thread's into blocks of
 * CB columns, and walks K in panels of KB rows: each panel (KB x CB, 64 KB) is multiplied out
 * of L1/L2 in register tiles of MR rows x NR columns, while the next panel is prefetched in
 * memory order, so the weights stream sequentially under the arithmetic. With AVX2, past two
 * row tiles the panel is first packed tile by tile (pack_panel: W's rows are N floats apart,
 * which for N = 3,072 put a tile's rows in one L1 set); at 32-64 rows that took 0.57-0.73x the
 * time of multiplying W in place (Zen 3; not on Zen 4's AVX-512, see MR). (Panels as wide as the thread's columns put the gate/up
 * matmul's 1,536 columns of partial sums and panel past L2: 10-25% slower at 32-64 rows,
 * Zen 4.) The sums run over k in order, as BLAS does; results differ from torch's in the
 * last bits.
 */
#include <stdint.h>

#include "f32_vec.h"
#include "pool.h"

#if defined(__AVX512F__)
#define MR 8 /* rows per tile: MR x 2 accumulators + 2 weight vectors fit 32 registers */
/* On Zen 4 (AVX-512) W is read in place at every row count and the k loop advances the
 * prefetcher through its pointer: packing took 1.09-1.17x and a local prefetcher 1.13-1.18x
 * the time at 16-64 rows (scripts/bench_gemm_builds.py, 2026-12-03), where on Zen 3 (AVX2)
 * both were gains. Each ISA keeps what was measured faster on it. */
#define PACK_TILES INT64_MAX
#define LOCAL_PREFETCHER 0
#else
#define MR 6 /* 12 accumulators + 2 + 1 fit AVX2's 16 registers */
#define PACK_TILES 2 /* row tiles up to which W is read in place */
#define LOCAL_PREFETCHER 1
#endif
#define NR (2 * VW) /* columns per tile */
#define KB 64       /* rows of W per panel */
#ifndef CB
#define CB 256 /* columns per block: its M x CB sums and KB x CB panel stay in L2 */
#endif

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

static inline __attribute__((always_inline)) void prefetch_line(prefetcher *p) {
    __builtin_prefetch(p->row + p->col, 0, 1); /* into L2: the panel is multiplied out of L2 */
    p->col += 16; /* floats per 64-byte line */
    if (p->col >= p->c1) {
        p->col = p->c0;
        p->row += p->ldw;
        p->rows_left--;
    }
}

/* One line every `step` calls (from the k loops). */
static inline __attribute__((always_inline)) void prefetch_next(prefetcher *p) {
    if (p->rows_left <= 0 || ++p->count < p->step) return;
    p->count = 0;
    prefetch_line(p);
}

/* `n` lines at once (between tiles). */
static void prefetch_lines(prefetcher *p, int64_t n) {
    for (; n > 0 && p->rows_left > 0; n--) prefetch_line(p);
}

/* One tile's kb x NR weights are NR floats a row, contiguous; tiles are PANEL_LD floats apart
 * (a line more than kb x NR, so the tiles' rows do not all fall in one L1 set). */
#define PANEL_LD (KB * NR + 16)

/* Copies W's rows [k0, k0 + kb) x columns [b0, b1) into `panel`, tile by tile. In W the rows
 * of a tile are N floats apart: for N a multiple of 1,024 (the gate/up matmul's 3,072) every
 * one of them falls in one L1 set and the tile loop missed L1 on each k; here they are
 * contiguous, read in order. Reads W row by row (sequential lines, as memory streams best). */
static void pack_panel(const gemm_args *a, float *panel, int64_t b0, int64_t b1, int64_t k0,
                       int64_t kb) {
    for (int64_t k = 0; k < kb; k++) {
        const float *src = a->w + (k0 + k) * a->N + b0;
        float *dst = panel + k * NR;
        for (int64_t j = 0; j < b1 - b0; j += NR, dst += PANEL_LD) {
            storeu(dst, loadu(src + j));
            storeu(dst + VW, loadu(src + j + VW));
        }
    }
}

/* Rows [i, i + mr) x columns [j, j + NR), k in [k0, k0 + kb) of the weights at `w`, whose
 * rows are `ldw` floats apart (NR packed, N in W): starts from the bias (first panel) or the
 * partial sums in y. mr is a constant in every call, so the loops unroll. */
static inline __attribute__((always_inline)) void tile(const gemm_args *a, const float *w,
                                                       int64_t ldw, int64_t i, int64_t j,
                                                       const int mr, int64_t k0, int64_t kb,
                                                       prefetcher *pf) {
    vec acc[MR][2];
    float *y = a->y + i * a->N + j;
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < 2; v++)
            acc[r][v] = k0 ? loadu(y + r * a->N + v * VW)
                           : a->bias ? loadu(a->bias + j + v * VW) : (vec){0};
    const float *x = a->x + i * a->K + k0;
#if LOCAL_PREFETCHER
    prefetcher p = *pf, *pp = &p; /* a local: its counter stays in a register (Zen 3) */
#else
    prefetcher *pp = pf;
#endif
    for (int64_t k = 0; k < kb; k++, w += ldw) {
        prefetch_next(pp);
        const vec b0 = loadu(w), b1 = loadu(w + VW);
        for (int r = 0; r < mr; r++) {
            const float s = x[r * a->K + k];
            acc[r][0] += s * b0;
            acc[r][1] += s * b1;
        }
    }
    for (int r = 0; r < mr; r++)
        for (int v = 0; v < 2; v++) storeu(y + r * a->N + v * VW, acc[r][v]);
#if LOCAL_PREFETCHER
    *pf = p;
#endif
}

/* The next panel is prefetched `burst` lines before each tile, or (burst 0) a line every
 * pf->step iterations of the k loops. With W in place the k loops' own lines stream from
 * memory and the prefetches must be spread among them; over a packed panel bursts were faster
 * (0.5-0.6x the time of spread ones at 32-64 rows, Zen 3). */
static void column_tile(const gemm_args *a, const float *w, int64_t ldw, int64_t j, int64_t k0,
                        int64_t kb, prefetcher *pf, int64_t burst) {
    prefetcher quiet = {0}, *each_k = burst ? &quiet : pf;
    int64_t i = 0;
    for (; i + MR <= a->M; i += MR) {
        prefetch_lines(pf, burst);
        tile(a, w, ldw, i, j, MR, k0, kb, each_k);
    }
    prefetch_lines(pf, burst);
    switch (a->M - i) { /* the last rows */
    case 1: tile(a, w, ldw, i, j, 1, k0, kb, each_k); break;
    case 2: tile(a, w, ldw, i, j, 2, k0, kb, each_k); break;
    case 3: tile(a, w, ldw, i, j, 3, k0, kb, each_k); break;
    case 4: tile(a, w, ldw, i, j, 4, k0, kb, each_k); break;
    case 5: tile(a, w, ldw, i, j, 5, k0, kb, each_k); break;
#if MR > 6
    case 6: tile(a, w, ldw, i, j, 6, k0, kb, each_k); break;
    case 7: tile(a, w, ldw, i, j, 7, k0, kb, each_k); break;
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

/* Columns [b0, b1) of one thread, k panel by k panel (KB x CB, 64 KB): the panel is packed
 * when more than PACK_TILES row tiles read it (at 2 x 6 rows the copy cost more than its
 * misses: 1.13x the time of W in place, at 16 rows 0.77x, Zen 3), then multiplied out of
 * L1/L2 by every row tile while the next panel (the next block's first one after the last)
 * is prefetched under the arithmetic. The block's partial sums (M x CB) stay in L2. Each output
 * still sums over k in order from its bias, so neither the blocking nor the packing changes
 * a bit. */
static void column_block(const gemm_args *a, float *panel, int64_t b0, int64_t b1,
                         int64_t next_b1) {
    const int64_t row_tiles = (a->M + MR - 1) / MR, tiles = (b1 - b0) / NR;
    for (int64_t k0 = 0; k0 < a->K; k0 += KB) {
        const int64_t kb = a->K - k0 < KB ? a->K - k0 : KB;
        int64_t next = k0 + kb, p0 = b0, p1 = b1;
        if (next >= a->K) next = 0, p0 = b1, p1 = next_b1; /* the next block's first panel */
        const int64_t next_rows = p1 > p0 ? (a->K - next < KB ? a->K - next : KB) : 0;
        const int64_t calls = tiles * row_tiles, lines = next_rows * ((p1 - p0 + 15) / 16);
        prefetcher pf = {a->w + next * a->N, p0, p0, p1, next_rows, a->N,
                         lines > 0 && calls * kb > lines ? calls * kb / lines : 1, 0};
        const int packed = row_tiles > PACK_TILES;
        if (packed) pack_panel(a, panel, b0, b1, k0, kb);
        for (int64_t t = 0; t < tiles; t++) {
            const float *w = packed ? panel + t * PANEL_LD : a->w + k0 * a->N + b0 + t * NR;
            column_tile(a, w, packed ? NR : a->N, b0 + t * NR, k0, kb, &pf,
                        packed ? (lines + calls - 1) / calls : 0);
        }
    }
}

static void gemm_part(const void *args, int64_t t, int64_t n) {
    const gemm_args *a = (const gemm_args *)args;
    const int64_t tiles_n = a->N / NR, c0 = tiles_n * t / n * NR, c1 = tiles_n * (t + 1) / n * NR;
    float panel[CB / NR * PANEL_LD] __attribute__((aligned(64)));
    for (int64_t b0 = c0; b0 < c1; b0 += CB) {
        const int64_t b1 = b0 + CB < c1 ? b0 + CB : c1;
        column_block(a, panel, b0, b1, b1 + CB < c1 ? b1 + CB : c1);
    }
    if (t == n - 1 && tiles_n * NR < a->N) column_rest(a, tiles_n * NR);
}

void kvcli_gemm(const float *x, const float *w, const float *bias, float *y, int64_t M, int64_t N,
                int64_t K, int64_t threads) {
    const gemm_args a = {x, w, bias, y, M, N, K};
    const int64_t tiles_n = N / NR;
    if (threads > tiles_n) threads = tiles_n > 0 ? tiles_n : 1;
    kvcli_parallel_rows(gemm_part, &a, threads, M);
}
