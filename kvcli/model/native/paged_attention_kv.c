/* The int8 KV cache's write and the paged decode attention over a converted cache: int8
 * (kv_int8.h has the row layout) and, built with KV_BF16 (paged_attention_bf16.c), bfloat16,
 * whose scale is 1 and bias 0 (kv_rows.h).
 *
 * kvcli_quantize_kv writes new K or V rows into their slots, per token and KV head: min and
 * max of the row give scale = (max - min) / 255 and zero = -min / scale.
 *
 * kvcli_paged_decode_attention_int8 is paged_attention.c's decode kernel reading the codes in
 * place: a decode step is memory-bound on K/V (~480 MB a step at batch 32 in float32), and a
 * code is one byte. The codes are widened to float in registers and the affine parameters are
 * applied per token, not per element:
 *   q.k = scale * (q.u) + bias * sum(q)
 *   sum_t p_t v_t = sum_t (p_t scale_t) u_t + sum_t p_t bias_t      (one scalar per head)
 * The scores dot four tokens at once and each V row is widened once for its query heads, with
 * AVX-512 (16 lanes) or AVX2 (8 lanes) intrinsics per the build (KVCLI_NATIVE_ISA); plain C
 * elsewhere and for head sizes the vectors do not divide.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kv_rows.h"
#include "pool.h"

#if !defined(KV_BF16)
void kvcli_quantize_kv(const float *x, const int64_t *slots, uint8_t *cache, int64_t num_tokens,
                       int64_t num_kv_heads, int64_t head_dim) {
    const int64_t D = head_dim, R = kv8_row(D);
    for (int64_t t = 0; t < num_tokens; t++)
        for (int64_t h = 0; h < num_kv_heads; h++) {
            const float *src = x + (t * num_kv_heads + h) * D;
            uint8_t *dst = cache + (slots[t] * num_kv_heads + h) * R;
            float lo = src[0], hi = src[0];
            for (int64_t d = 1; d < D; d++) {
                lo = src[d] < lo ? src[d] : lo;
                hi = src[d] > hi ? src[d] : hi;
            }
            /* A constant row keeps scale 1: its codes are all 0 and stand for lo exactly. */
            const float scale = hi > lo ? (hi - lo) / 255.0f : 1.0f, inv = 1.0f / scale;
            for (int64_t d = 0; d < D; d++) {
                const float c = rintf((src[d] - lo) * inv);
                dst[d] = (uint8_t)(c < 0.0f ? 0.0f : c > 255.0f ? 255.0f : c);
            }
            const float params[2] = {scale, -lo * inv};
            memcpy(dst + D, params, sizeof params);
        }
}
#endif

typedef struct {
    const float *q;              /* [S, H, D] */
    const kv_t *k, *v;           /* [num_slots, Hkv, kv_row(D)] */
    const int64_t *block_tables; /* [S, max_blocks] */
    const int64_t *seq_lens;     /* [S]: context length including the new token */
    float *out;                  /* [S, H, D] */
    int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks, window;
    float scale;
    int64_t begin, end; /* sequences [begin, end) */
    int status;
} job_t;

typedef struct {
    int64_t *rows;             /* [n]: each context token's offset in the cache (elements) */
    float *scores, *acc, *sum; /* [H, n], [H, D], [H]: sum(q) for the scores, then sum p*bias */
} scratch_t;

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* [sum a, sum b, sum c, sum d] in one vector (paged_attention.c's). */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

#if defined(__AVX512F__)
#define QW 16 /* codes widened per step: 16 into a 512-bit register */
typedef __m512 acc_t;
static inline acc_t widen(const kv_t *u) {
#if defined(KV_BF16)
    const __m256i h = _mm256_loadu_si256((const void *)u);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
#else
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)u)));
#endif
}
#define ACC_LOAD _mm512_loadu_ps
#define ACC_STORE _mm512_storeu_ps
#define ACC_FMA _mm512_fmadd_ps
#define ACC_SET1 _mm512_set1_ps
static inline __m256 fold(acc_t a) { /* 16 lanes to 8, for hsum4 */
    return _mm256_add_ps(_mm512_castps512_ps256(a),
                         _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#define ACC_ZERO _mm512_setzero_ps()
#else
#define QW 8
typedef __m256 acc_t;
static inline acc_t widen(const kv_t *u) {
#if defined(KV_BF16)
    const __m128i h = _mm_loadu_si128((const void *)u);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#else
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const void *)u)));
#endif
}
#define ACC_LOAD _mm256_loadu_ps
#define ACC_STORE _mm256_storeu_ps
#define ACC_FMA _mm256_fmadd_ps
#define ACC_SET1 _mm256_set1_ps
static inline __m256 fold(acc_t a) { return a; }
#define ACC_ZERO _mm256_setzero_ps()
#endif
static inline acc_t widen_fma(const float *q, const kv_t *u, acc_t a) {
    return ACC_FMA(ACC_LOAD(q), widen(u), a);
}
#endif

/* acc[hh] += p[hh] * scale * codes for the `group` query heads hh of one KV head's V row u
 * (sum[hh] += p[hh] * bias): the codes are widened once for all of them. */
static inline void pv8_accumulate(const kv_t *u, int64_t D, const float *p, int64_t group,
                                  float *acc, float *sum) {
    float sc, bias;
    kv_params(u, D, &sc, &bias);
#if defined(__AVX2__) && defined(__FMA__)
    if (D % QW == 0 && D <= 128) {
        acc_t x[128 / QW];
        for (int64_t c = 0; c < D / QW; c++) x[c] = widen(u + c * QW);
        for (int64_t i = 0; i < group; i++) {
            const acc_t ps = ACC_SET1(p[i] * sc);
            float *a = acc + i * D;
            sum[i] += p[i] * bias;
            for (int64_t c = 0; c < D / QW; c++)
                ACC_STORE(a + c * QW, ACC_FMA(ps, x[c], ACC_LOAD(a + c * QW)));
        }
        return;
    }
#endif
    for (int64_t i = 0; i < group; i++) {
        const float ps = p[i] * sc;
        float *a = acc + i * D;
        sum[i] += p[i] * bias;
        for (int64_t d = 0; d < D; d++) a[d] += ps * kv_f32(u[d]);
    }
}

/* scores[hh * n + t] = scale * q[hh].k[t] over the int8 rows, for all H = Hkv * group query
 * heads; rows[t] is token t's byte offset in the cache. With AVX2 (and wider with AVX-512)
 * four tokens are dotted at once and their four horizontal sums share one reduction, as in
 * paged_attention.c: a dot's reduction otherwise costs about as much as its multiply-adds. */
static void qk8_scores(const float *q, const float *qsum, int64_t Hkv, int64_t group, int64_t D,
                       const kv_t *k, const int64_t *rows, int64_t n, float scale,
                       float *scores) {
    const int64_t R = kv_row(D);
    int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (D % QW == 0) {
        for (; t + 4 <= n; t += 4)
            for (int64_t g = 0; g < Hkv; g++) {
                const kv_t *u[4];
                float sc[4], bias[4];
                for (int i = 0; i < 4; i++) {
                    u[i] = k + rows[t + i] + g * R;
                    kv_params(u[i], D, &sc[i], &bias[i]);
                }
                const __m128 vsc = _mm_loadu_ps(sc), vbias = _mm_loadu_ps(bias);
                for (int64_t hh = g * group; hh < (g + 1) * group; hh++) {
                    const float *qh = q + hh * D;
                    acc_t a0 = ACC_ZERO, a1 = a0, a2 = a0, a3 = a0;
                    for (int64_t d = 0; d < D; d += QW) {
                        a0 = widen_fma(qh + d, u[0] + d, a0);
                        a1 = widen_fma(qh + d, u[1] + d, a1);
                        a2 = widen_fma(qh + d, u[2] + d, a2);
                        a3 = widen_fma(qh + d, u[3] + d, a3);
                    }
                    const __m128 dots = hsum4(fold(a0), fold(a1), fold(a2), fold(a3));
                    const __m128 x = _mm_fmadd_ps(vsc, dots, _mm_mul_ps(vbias, _mm_set1_ps(qsum[hh])));
                    _mm_storeu_ps(scores + hh * n + t, _mm_mul_ps(x, _mm_set1_ps(scale)));
                }
            }
    }
#endif
    for (; t < n; t++)
        for (int64_t g = 0; g < Hkv; g++) {
            const kv_t *u = k + rows[t] + g * R;
            float sc, bias;
            kv_params(u, D, &sc, &bias);
            for (int64_t hh = g * group; hh < (g + 1) * group; hh++) {
                const float *qh = q + hh * D;
                float dot = 0.0f;
                for (int64_t d = 0; d < D; d++) dot += qh[d] * kv_f32(u[d]);
                scores[hh * n + t] = (sc * dot + bias * qsum[hh]) * scale;
            }
        }
}

/* ATTEND8(NAME, DIM): all query heads of sequence s; DIM a compile-time head size where one
 * is given (the inner loops then unroll into vector registers), else j->head_dim. */
#define ATTEND8(NAME, DIM)                                                                     \
    static void NAME(const job_t *j, int64_t s, scratch_t *w) {                                \
        const int64_t D = (DIM), R = kv_row(D), Hkv = j->num_kv_heads, bs = j->block_size;    \
        const int64_t H = j->num_heads, group = H / Hkv, len = j->seq_lens[s];                 \
        const int64_t first = (j->window > 0 && len > j->window) ? len - j->window : 0;        \
        const int64_t n = len - first, *table = j->block_tables + s * j->max_blocks;           \
        const float *q = j->q + s * H * D;                                                     \
        for (int64_t t = 0; t < n; t++) {                                                      \
            const int64_t pos = first + t;                                                     \
            w->rows[t] = (table[pos / bs] * bs + pos % bs) * Hkv * R;                          \
        }                                                                                      \
        for (int64_t hh = 0; hh < H; hh++) {                                                   \
            float total = 0.0f;                                                                \
            for (int64_t d = 0; d < D; d++) total += q[hh * D + d];                            \
            w->sum[hh] = total;                                                                \
        }                                                                                      \
        qk8_scores(q, w->sum, Hkv, group, D, j->k, w->rows, n, j->scale, w->scores);          \
        for (int64_t hh = 0; hh < H; hh++) {                                                   \
            float *row = w->scores + hh * n, top = row[0];                                     \
            for (int64_t t = 1; t < n; t++) top = row[t] > top ? row[t] : top;                 \
            for (int64_t t = 0; t < n; t++) row[t] = expf(row[t] - top);                       \
            w->sum[hh] = 0.0f;                                                                 \
        }                                                                                      \
        for (int64_t i = 0; i < H * D; i++) w->acc[i] = 0.0f;                                  \
        for (int64_t t = 0; t < n; t++)                                                        \
            for (int64_t g = 0; g < Hkv; g++) {                                                \
                float p[group];                                                                \
                for (int64_t i = 0; i < group; i++) p[i] = w->scores[(g * group + i) * n + t]; \
                pv8_accumulate(j->v + w->rows[t] + g * R, D, p, group,                         \
                               w->acc + g * group * D, w->sum + g * group);                    \
            }                                                                                  \
        for (int64_t hh = 0; hh < H; hh++) {                                                   \
            const float *row = w->scores + hh * n;                                             \
            float total = 0.0f;                                                                \
            for (int64_t t = 0; t < n; t++) total += row[t];                                   \
            const float inv = 1.0f / total, shift = w->sum[hh];                                \
            float *o = j->out + (s * H + hh) * D;                                              \
            for (int64_t d = 0; d < D; d++) o[d] = (w->acc[hh * D + d] + shift) * inv;         \
        }                                                                                      \
    }

ATTEND8(attend8_64, 64)
ATTEND8(attend8_128, 128)
ATTEND8(attend8_any, j->head_dim)

static void run_job(const void *jobs, int64_t t, int64_t n) {
    (void)n;
    job_t *j = (job_t *)jobs + t;
    int64_t longest = 1;
    for (int64_t s = j->begin; s < j->end; s++)
        longest = j->seq_lens[s] > longest ? j->seq_lens[s] : longest;
    scratch_t w = {malloc(sizeof(int64_t) * longest),
                   malloc(sizeof(float) * j->num_heads * longest),
                   malloc(sizeof(float) * j->num_heads * j->head_dim),
                   malloc(sizeof(float) * j->num_heads)};
    if (!w.rows || !w.scores || !w.acc || !w.sum) {
        j->status = 1;
    } else {
        void (*attend)(const job_t *, int64_t, scratch_t *) =
            j->head_dim == 64 ? attend8_64 : j->head_dim == 128 ? attend8_128 : attend8_any;
        for (int64_t s = j->begin; s < j->end; s++) attend(j, s, &w);
    }
    free(w.rows);
    free(w.scores);
    free(w.acc);
    free(w.sum);
}

/* Returns 0 on success, 1 when memory ran out. The arguments are paged_attention.c's. */
int KV_NAME(kvcli_paged_decode_attention)(const float *q, const kv_t *k, const kv_t *v,
                                      const int64_t *block_tables, const int64_t *seq_lens,
                                      float *out, int64_t num_seqs, int64_t num_heads,
                                      int64_t num_kv_heads, int64_t head_dim, int64_t block_size,
                                      int64_t max_blocks, int64_t window, float scale,
                                      int64_t num_threads) {
    enum { MAX_THREADS = 64 };
    job_t jobs[MAX_THREADS];
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    if (num_threads > num_seqs) num_threads = num_seqs;
    if (num_threads < 1) num_threads = 1;
    int64_t ends[MAX_THREADS]; /* ranges of sequences of about equal context length */
    kvcli_split_by_length(seq_lens, num_seqs, num_threads, ends);
    for (int64_t t = 0; t < num_threads; t++) {
        const int64_t begin = t ? ends[t - 1] : 0;
        jobs[t] = (job_t){q, k, v, block_tables, seq_lens, out, num_heads, num_kv_heads,
                          head_dim, block_size, max_blocks, window, scale, begin, ends[t], 0};
    }
    kvcli_parallel(run_job, jobs, num_threads, KVCLI_SPIN_NS);
    int status = 0;
    for (int64_t t = 0; t < num_threads; t++) status |= jobs[t].status;
    return status;
}
