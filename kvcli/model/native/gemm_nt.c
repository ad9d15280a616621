/* y[M, N] = x[M, K] @ W[N, K]^T for CPU float32 with few rows M: W stored [out, in].
 *
 * The language-model head of a tied model multiplies by the token embedding, a [vocab, hidden]
 * buffer (49,152 x 576 for SmolLM2, 113 MB): gemm.c wants [in, out] and a second copy would
 * add a fifth to the model's memory. torch's MKL and NumPy's OpenBLAS take 30-95 ms for its
 * 2-64 sampled rows on two Zen 3 cores (5-40 GFLOP/s), beside ~8 ms to stream the matrix. Here
 * each output is a dot product of two contiguous rows: a register tile of MR rows of x by NT
 * rows of W keeps MR x NT vector partial sums over k (summed across lanes at the end), the NT
 * rows of W (9 KB) stay in L1 while every row tile of x passes over them from L2, and each
 * thread streams its own range of W's rows once, in memory order. The sums run over k in
 * lanes of VW, so results differ from BLAS's in the last bits.
 */
#include <stdint.h>

#include "f32_vec.h"
#include "pool.h"

#if defined(__AVX512F__)
/* 25 accumulators + 5 + 1 of AVX-512's 32 registers: at 16-64 rows 0.54-0.71x the time of the
 * 3 x 4 tile on Zen 4 (2 rows 0.90x; scripts-style A/B of the builds, 2026-12-03) */
#define MR 5
#define NT 5
#else
#define MR 3 /* rows of x per tile */
#define NT 4 /* rows of W per tile: MR x NT accumulators + NT + 1 fit AVX2's 16 registers */
#endif

static inline float lanes(vec v) {
    float s = 0.0f;
    for (int l = 0; l < VW; l++) s += v[l];
    return s;
}

typedef struct {
    const float *x, *w;
    float *y;
    int64_t M, N, K;
} nt_args;

/* y[i .. i + mr) x [n .. n + nt): mr and nt are constants in every call, so the loops
 * unroll into registers. The k tail past the last whole vector is summed in scalars. */
static inline __attribute__((always_inline)) void tile(const nt_args *a, int64_t i, int64_t n,
                                                       const int mr, const int nt) {
    vec acc[MR][NT];
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nt; c++) acc[r][c] = (vec){0};
    const float *x = a->x + i * a->K, *w = a->w + n * a->K;
    const int64_t kv = a->K / VW * VW;
    for (int64_t k = 0; k < kv; k += VW) {
        vec wv[NT];
        for (int c = 0; c < nt; c++) wv[c] = loadu(w + c * a->K + k);
        for (int r = 0; r < mr; r++) {
            const vec xv = loadu(x + r * a->K + k);
            for (int c = 0; c < nt; c++) acc[r][c] += xv * wv[c];
        }
    }
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nt; c++) {
            float s = lanes(acc[r][c]);
            for (int64_t k = kv; k < a->K; k++) s += x[r * a->K + k] * w[c * a->K + k];
            a->y[(i + r) * a->N + n + c] = s;
        }
}

/* Rows [n, n + nt) of W against every row of x. */
static inline __attribute__((always_inline)) void w_rows(const nt_args *a, int64_t n,
                                                         const int nt) {
    int64_t i = 0;
    for (; i + MR <= a->M; i += MR) tile(a, i, n, MR, nt);
    switch (a->M - i) { /* the last rows */
    case 1: tile(a, i, n, 1, nt); break;
    case 2: tile(a, i, n, 2, nt); break;
#if MR > 3
    case 3: tile(a, i, n, 3, nt); break;
    case 4: tile(a, i, n, 4, nt); break;
#endif
    default: break;
    }
}

static void nt_part(const void *args, int64_t t, int64_t threads) {
    const nt_args *a = (const nt_args *)args;
    const int64_t blocks = (a->N + NT - 1) / NT;
    const int64_t n0 = blocks * t / threads * NT;
    int64_t n1 = blocks * (t + 1) / threads * NT;
    if (n1 > a->N) n1 = a->N;
    int64_t n = n0;
    for (; n + NT <= n1; n += NT) w_rows(a, n, NT);
    for (; n < n1; n++) w_rows(a, n, 1); /* the last rows of W (N not a multiple of NT) */
}

void kvcli_gemm_nt(const float *x, const float *w, float *y, int64_t M, int64_t N, int64_t K,
                   int64_t threads) {
    const nt_args a = {x, w, y, M, N, K};
    const int64_t blocks = (N + NT - 1) / NT;
    if (threads > blocks) threads = blocks > 0 ? blocks : 1;
    kvcli_parallel_rows(nt_part, &a, threads, M);
}
