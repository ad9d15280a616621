/* Row-wise element-wise kernels for CPU float32: RMSNorm, SiLU-and-mul, rotary embedding.
 *
 * torch runs each of these as several passes with temporaries (RoPE: two products, a
 * rotate-half copy, a concatenation and a sum); here each is one pass over its rows, split
 * over threads by rows. The formulas and their order of operations follow transformers'
 * Llama modules, so results differ from torch's only in the last bits (summation order).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "pool.h"
#include "vexp.h"

typedef void (*rows_fn)(const void *args, int64_t begin, int64_t end);
typedef struct {
    rows_fn fn;
    const void *args;
    int64_t rows;
} rows_job;

static void rows_part(const void *job, int64_t t, int64_t n) {
    const rows_job *j = (const rows_job *)job;
    j->fn(j->args, j->rows * t / n, j->rows * (t + 1) / n);
}

static void parallel_rows(rows_fn fn, const void *args, int64_t rows, int64_t row_work,
                          int64_t threads) {
    if (threads > rows * row_work / KVCLI_MIN_WORK_PER_THREAD)
        threads = rows * row_work / KVCLI_MIN_WORK_PER_THREAD;
    const rows_job job = {fn, args, rows};
    kvcli_parallel_rows(rows_part, &job, threads < 1 ? 1 : threads, rows);
}

/* out[r] = weight * (x[r] * 1/sqrt(mean(x[r]^2) + eps)), as transformers' LlamaRMSNorm; or,
 * with `narrow`, those values rounded to bfloat16 as torch rounds them (to nearest even; a NaN
 * keeps its top bits, quieted), for a bfloat16 matmul that follows (fast's prefill copy): no
 * float32 row and no separate conversion pass. */
typedef struct {
    const float *x, *weight;
    float *out;
    uint16_t *narrow;
    int64_t dim;
    float eps;
    const uint16_t *delta; /* kvcli_add_rms_norm_bf16: bfloat16 rows added into x first (to out) */
    const float *delta32;  /* kvcli_add_rms_norm: float32 rows added into x first (to out) */
    float *normed;         /* kvcli_add_rms_norm: the sum's norm */
} rms_args;

/* One row's norm, float32. Out of line so that the float32 path and the bfloat16 one run the
 * very same code: with -ffast-math an inlined copy may associate weight * (x * scale)
 * differently, and a last-bit difference changes a bf16 rounding now and then. */
__attribute__((noinline)) static void rms_row(const float *x, const float *weight, float eps,
                                              int64_t n, float *o) {
    float sum = 0.0f;
    for (int64_t i = 0; i < n; i++) sum += x[i] * x[i];
    const float scale = 1.0f / sqrtf(sum / (float)n + eps);
    for (int64_t i = 0; i < n; i++) o[i] = weight[i] * (x[i] * scale);
}

/* o[i] = y[i] rounded to bfloat16: integer operations on the bits, in a loop the compiler
 * vectorises (a per-value function with an early return for NaN stayed scalar: the norm took
 * 1.3x as long). */
static void bf16_rounded(const float *y, uint16_t *o, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, y + i, sizeof u);
        const uint32_t nan = (u & 0x7fffffffu) > 0x7f800000u; /* a NaN: quieted, kept */
        o[i] = (uint16_t)(nan ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
}

static void rms_rows(const void *a, int64_t begin, int64_t end) {
    const rms_args *p = (const rms_args *)a;
    const int64_t n = p->dim;
    float row[p->narrow ? n : 1]; /* a hidden size: a few KB of the thread's stack */
    for (int64_t r = begin; r < end; r++) {
        if (p->delta) { /* out = x + delta (as torch adds a widened bf16 tensor), normed from out */
            for (int64_t i = 0; i < n; i++) {
                const uint32_t bits = (uint32_t)p->delta[r * n + i] << 16;
                float d;
                memcpy(&d, &bits, sizeof d);
                p->out[r * n + i] = p->x[r * n + i] + d;
            }
            rms_row(p->out + r * n, p->weight, p->eps, n, row);
            bf16_rounded(row, p->narrow + r * n, n);
            continue;
        }
        if (p->delta32) {
            for (int64_t i = 0; i < n; i++)
                p->out[r * n + i] = p->x[r * n + i] + p->delta32[r * n + i];
            rms_row(p->out + r * n, p->weight, p->eps, n, p->normed + r * n);
            continue;
        }
        if (!p->narrow) {
            rms_row(p->x + r * n, p->weight, p->eps, n, p->out + r * n);
            continue;
        }
        rms_row(p->x + r * n, p->weight, p->eps, n, row);
        bf16_rounded(row, p->narrow + r * n, n);
    }
}

void kvcli_rms_norm(const float *x, const float *weight, float *out, int64_t rows, int64_t dim,
                    float eps, int64_t threads) {
    const rms_args a = {x, weight, out, NULL, dim, eps, NULL, NULL, NULL};
    parallel_rows(rms_rows, &a, rows, dim, threads);
}

void kvcli_rms_norm_bf16(const float *x, const float *weight, uint16_t *out, int64_t rows,
                         int64_t dim, float eps, int64_t threads) {
    const rms_args a = {x, weight, NULL, out, dim, eps, NULL, NULL, NULL};
    parallel_rows(rms_rows, &a, rows, dim, threads);
}

/* sum = x + delta (delta bfloat16 rows: a matmul's product as fast's bf16 copy leaves it) and
 * out = that sum's norm rounded to bfloat16, in one pass: a pre-norm layer's residual add and
 * the next norm, where the norm's reader runs the bf16 copy. Equal to the separate steps. */
void kvcli_add_rms_norm_bf16(const float *x, const uint16_t *delta, float *sum,
                             const float *weight, uint16_t *out, int64_t rows, int64_t dim,
                             float eps, int64_t threads) {
    const rms_args a = {x, weight, sum, out, dim, eps, delta, NULL, NULL};
    parallel_rows(rms_rows, &a, rows, 2 * dim, threads);
}

/* The same with float32 rows: sum = x + delta (sum may be x itself) and out = its norm, in one
 * pass where a pre-norm layer's residual add and the next norm took two (decoder.carry). */
void kvcli_add_rms_norm(const float *x, const float *delta, float *sum, const float *weight,
                        float *out, int64_t rows, int64_t dim, float eps, int64_t threads) {
    const rms_args a = {x, weight, sum, NULL, dim, eps, NULL, delta, out};
    parallel_rows(rms_rows, &a, rows, 2 * dim, threads);
}

/* out[r] = silu(gate_up[r, :d]) * gate_up[r, d:], silu(g) = g / (1 + exp(-g)). */
typedef struct {
    const float *gate_up;
    float *out;
    int64_t dim;
} silu_args;

static void silu_rows(const void *a, int64_t begin, int64_t end) {
    const silu_args *p = (const silu_args *)a;
    const int64_t d = p->dim;
    for (int64_t r = begin; r < end; r++) {
        const float *g = p->gate_up + r * 2 * d;
        silu_mul(g, g + d, p->out + r * d, d);
    }
}

void kvcli_silu_and_mul(const float *gate_up, float *out, int64_t rows, int64_t dim,
                        int64_t threads) {
    const silu_args a = {gate_up, out, dim};
    parallel_rows(silu_rows, &a, rows, 3 * dim, threads);
}

/* In place on the first `heads` heads of each row (row stride `stride` floats):
 * x = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1), cos/sin [rows, head_dim]. */
typedef struct {
    float *x;
    const float *cos, *sin;
    int64_t stride, heads, head_dim;
} rope_args;

/* One row's first `heads` heads rotated in place. Out of line so that kvcli_rope and
 * kvcli_rope_widen run the very same code (as rms_row for the norms). */
__attribute__((noinline)) static void rope_row(float *row, const float *c, const float *s,
                                               int64_t heads, int64_t head_dim) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *x = row + h * head_dim;
        for (int64_t i = 0; i < half; i++) {
            const float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * c[i] + -x2 * s[i];
            x[i + half] = x2 * c[i + half] + x1 * s[i + half];
        }
    }
}

static void rope_rows(const void *a, int64_t begin, int64_t end) {
    const rope_args *p = (const rope_args *)a;
    for (int64_t r = begin; r < end; r++)
        rope_row(p->x + r * p->stride, p->cos + r * p->head_dim, p->sin + r * p->head_dim,
                 p->heads, p->head_dim);
}

void kvcli_rope(float *x, const float *cos, const float *sin, int64_t rows, int64_t stride,
                int64_t heads, int64_t head_dim, int64_t threads) {
    const rope_args a = {x, cos, sin, stride, heads, head_dim};
    parallel_rows(rope_rows, &a, rows, heads * head_dim, threads);
}

/* dst [rows, width] float32 = src [rows, width] bfloat16 widened, then RoPE on the first `heads`
 * heads of each row: what widening and kvcli_rope give, in one pass over the rows (fast's q/k/v
 * product as oneDNN leaves it; widening is exact, and the rotation is rope_row's). */
typedef struct {
    const uint16_t *src;
    float *dst;
    const float *cos, *sin;
    int64_t width, heads, head_dim;
} widen_rope_args;

static void widen_rope_rows(const void *a, int64_t begin, int64_t end) {
    const widen_rope_args *p = (const widen_rope_args *)a;
    const int64_t width = p->width; /* a local: the loop below vectorises */
    for (int64_t r = begin; r < end; r++) {
        const uint16_t *in = p->src + r * width;
        float *out = p->dst + r * width;
        for (int64_t i = 0; i < width; i++) { /* bfloat16 is float32's upper half */
            const uint32_t bits = (uint32_t)in[i] << 16;
            memcpy(out + i, &bits, sizeof bits);
        }
        rope_row(out, p->cos + r * p->head_dim, p->sin + r * p->head_dim, p->heads, p->head_dim);
    }
}

void kvcli_rope_widen(const uint16_t *src, float *dst, const float *cos, const float *sin,
                      int64_t rows, int64_t width, int64_t heads, int64_t head_dim,
                      int64_t threads) {
    const widen_rope_args a = {src, dst, cos, sin, width, heads, head_dim};
    parallel_rows(widen_rope_rows, &a, rows, width, threads);
}
