/* y[N] = x[K] @ W[K, N] (+ bias) for one float32 row: the batch-1 decode step's matmuls
 * (decode_step.c) on kvcli's [in, out] weight buffers.
 *
 * One row is a pure stream of W. gemm.c splits the columns across threads, so each thread
 * reads a slice of every row of W (N / threads floats, then a jump): ~20 GB/s on a Zen 3,
 * where OpenBLAS's gemv reached ~27. Here each thread takes a contiguous slab of W's rows
 * (a range of k) and streams it front to back into partial sums of its own, four rows per
 * pass (one load and store of the partials per four multiply-adds); the caller adds the
 * slabs' partials. Sums run over k in order within a slab; results differ from a one-thread
 * sum in the last bits, as any BLAS's do.
 */
#include <stdint.h>
#include <stdlib.h>

#include "f32_vec.h"
#include "pool.h"

typedef struct {
    const float *x, *w;
    float *partials; /* [threads][N]: slab t's sums */
    int64_t N, K;
} gemv_args;

/* out[0, N) = sum over k in [k0, k1) of x[k] * W[k, :]. */
static void slab(const gemv_args *a, int64_t k0, int64_t k1, float *out) {
    const int64_t N = a->N, nv = N / VW * VW;
    for (int64_t n = 0; n < N; n++) out[n] = 0.0f;
    int64_t k = k0;
    for (; k + 4 <= k1; k += 4) {
        const float *w0 = a->w + k * N, *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
        const float x0 = a->x[k], x1 = a->x[k + 1], x2 = a->x[k + 2], x3 = a->x[k + 3];
        int64_t n = 0;
        for (; n < nv; n += VW) {
            vec s = loadu(out + n);
            s += x0 * loadu(w0 + n);
            s += x1 * loadu(w1 + n);
            s += x2 * loadu(w2 + n);
            s += x3 * loadu(w3 + n);
            storeu(out + n, s);
        }
        for (; n < N; n++) out[n] += x0 * w0[n] + x1 * w1[n] + x2 * w2[n] + x3 * w3[n];
    }
    for (; k < k1; k++)
        for (int64_t n = 0; n < N; n++) out[n] += a->x[k] * a->w[k * N + n];
}

static void gemv_part(const void *args, int64_t t, int64_t n) {
    const gemv_args *a = (const gemv_args *)args;
    slab(a, a->K * t / n, a->K * (t + 1) / n, a->partials + t * a->N);
}

/* Returns 0, or -2 when the partial sums cannot be allocated. */
int kvcli_gemv(const float *x, const float *w, const float *bias, float *y, int64_t N,
               int64_t K, int64_t threads) {
    if (threads > K / 64) threads = K / 64 > 0 ? K / 64 : 1; /* slabs of at least 64 rows */
    float *partials = threads > 1 ? malloc(sizeof(float) * (size_t)(threads * N)) : y;
    if (!partials) return -2;
    const gemv_args a = {x, w, partials, N, K};
    kvcli_parallel(gemv_part, &a, threads, KVCLI_SPIN_NS);
    for (int64_t n = 0; n < N; n++) {
        float s = partials[n];
        for (int64_t t = 1; t < threads; t++) s += partials[t * N + n];
        y[n] = bias ? s + bias[n] : s;
    }
    if (partials != y) free(partials);
    return 0;
}
