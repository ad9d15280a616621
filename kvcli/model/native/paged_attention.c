/* Paged decode attention for CPU: one query token per sequence, keys and values read where
 * they lie in the paged KV cache through each sequence's block table. One source for every
 * cache format: float32 rows (this build), int8 and bfloat16 rows (paged_attention_int8.c and
 * paged_attention_bf16.c build it with KV_INT8 / KV_BF16; kv_rows.h has their layout).
 *
 * The torch fallback gathers every sequence's blocks into a padded copy per layer and runs
 * SDPA over it. Here a sequence's context is walked twice (work items are sequences, split
 * across threads by context length):
 *   1. scores: tokens in order, all KV heads of a token together (its K rows are one
 *      contiguous run), K prefetched ahead and V into L2; each K vector is loaded (a converted
 *      cache: widened) once for all the query heads of its group, and four tokens' dot products
 *      share one horizontal reduction. A converted row's affine parameters are applied per
 *      token: q.k = scale * (q.u) + bias * sum(q).
 *   2. values: per KV head and chunk of D, the output of up to HC query heads stays in
 *      registers while the V rows stream from L2; a converted row's bias term is one scalar
 *      per head: sum_t p_t bias_t.
 * The earlier kernel kept the outputs in memory (a load and a store per multiply-add) and, for
 * a converted cache, widened each K row once per query head: at batch 32 it read float32 K/V at
 * 11 GB/s and int8 codes at 4.7 GB/s where two Zen 4 cores stream 36 GB/s.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "pool.h"
#include "vexp.h"

#if defined(KV_INT8) || defined(KV_BF16)
#include "kv_rows.h"
#else
typedef float kv_t;
static inline int64_t kv_row(int64_t D) { return D; }
static inline float kv_f32(kv_t x) { return x; }
static inline void kv_params(const kv_t *row, int64_t D, float *scale, float *bias) {
    (void)row, (void)D;
    *scale = 1.0f, *bias = 0.0f; /* constants: the compiler drops the affine terms */
}
#define KV_NAME(name) name
#endif

#define AI inline __attribute__((always_inline))

#include "decode_vec.h"

typedef struct {
    const float *q;              /* [S, H, D] */
    const kv_t *k, *v;           /* [num_slots, Hkv, kv_row(D)]: slot = block * bs + offset */
    const int64_t *block_tables; /* [S, max_blocks] */
    const int64_t *seq_lens;     /* [S]: context length including the new token */
    float *out;                  /* [S, H, D] */
    int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks, window;
    float scale;
    int64_t begin, end; /* sequences [begin, end) */
    int status;
} job_t;

typedef struct {
    int64_t *rows; /* [n]: each context token's offset in the cache (elements, all KV heads) */
    int64_t *next; /* the same for the thread's next sequence, n_next tokens (0: none) */
    int64_t n, n_next;
    float *p;      /* [H, n]: scores, then exp(score - max) */
    float *qsum;   /* [3H]: sum(q) (a converted cache's bias term), 1 / softmax sum, and */
    float *inv, *bsum; /* sum_t p_t bias_t, per query head */
    int8_t *qc;        /* [H, D]: the query heads rounded to int8 (integer scores), */
    float *qs;         /* [H]: their scales */
} scratch_t;

#if defined(KV_INT8) && defined(KV8_INT_SCORES) && defined(__AVX512F__)
#define INT_SCORES 1 /* kv_int8.h: the keys' codes meet int8 query rows in vpdpbusd */
#endif

/* Tokens between a K row's prefetch into L1 and its use, and between its prefetch into L2 and
 * its use. The L2 prefetch lets more misses be in flight than the L1's miss buffers hold: one
 * decode step's attention (bench_decode_attention.py: 32 sequences of distinct's lengths, blocks
 * scattered, 2 threads, Zen 4) float32 27.3 -> 21.2-21.6 ms, int8 9.3 -> 7.9-8.0 ms with it 16
 * or 32 tokens ahead (64: 22.0 / 8.1, 128: 23.0 / 8.4); moving the L1 prefetch alone (16, 32
 * tokens) changed nothing. Measured on Zen 4 only; both prefetches are hints every x86 CPU
 * takes, and the Xeon's and Zen 3's numbers are for the next session there. */
#define AHEAD 8
#define FAR 32

/* Token t + FAR's K rows into L2, t + AHEAD's into L1 and token t's V rows into L2 (`bytes`
 * each: all KV heads). */
static AI void prefetch_token(const kv_t *k, const kv_t *v, const int64_t *rows, int64_t t,
                              int64_t n, int64_t bytes) {
    const char *kr = (const char *)(k + rows[t + AHEAD < n ? t + AHEAD : t]);
    const char *kf = (const char *)(k + rows[t + FAR < n ? t + FAR : t]);
    const char *vr = (const char *)(v + rows[t]);
    for (int64_t b = 0; b < bytes; b += 64) {
        if (t + FAR < n) __builtin_prefetch(kf + b, 0, 2);
        if (t + AHEAD < n) __builtin_prefetch(kr + b, 0, 3);
        __builtin_prefetch(vr + b, 0, 2); /* V is read in the second pass, from L2 */
    }
}

/* K rows the values pass prefetches into L2 (the thread's next sequence), one per token. */
typedef struct {
    const kv_t *k;
    const int64_t *rows;
    int64_t n;
} ahead_t;

/* One cache row of head size D into L2. */
static AI void prefetch_row(const kv_t *row, int64_t D) {
    for (int64_t b = 0; b < kv_row(D) * (int64_t)sizeof(kv_t); b += 64)
        __builtin_prefetch((const char *)row + b, 0, 2);
}

#if defined(VECTORS)
/* Scores of query heads [h0, h0 + nh) (rows of q, D apart) against tokens t .. t + cnt - 1's
 * rows of KV head g (cnt <= 4; the missing tokens repeat the first and are not stored). */
static AI void qk_block(const float *q, int64_t h0, const int nh, const int64_t D, const kv_t *k,
                        const int64_t *rows, int64_t t, int64_t cnt, int64_t g,
                        const float *qsum, float scale, float *p, int64_t n) {
    const kv_t *u[4];
    for (int j = 0; j < 4; j++) u[j] = k + rows[t + (j < cnt ? j : 0)] + g * kv_row(D);
    vf acc[HC][4];
    for (int i = 0; i < nh; i++)
        for (int j = 0; j < 4; j++) acc[i][j] = VZERO();
    for (int64_t c = 0; c < D; c += VW)
        for (int j = 0; j < 4; j++) {
            const vf x = widen(u[j] + c);
            for (int i = 0; i < nh; i++) acc[i][j] = VFMA(VLOAD(q + (h0 + i) * D + c), x, acc[i][j]);
        }
    float sc[4], bias[4];
    for (int j = 0; j < 4; j++) kv_params(u[j], D, &sc[j], &bias[j]);
    const __m128 vsc = _mm_loadu_ps(sc), vbias = _mm_loadu_ps(bias), vs = _mm_set1_ps(scale);
    for (int i = 0; i < nh; i++) {
        const __m128 dots = hsum4(fold(acc[i][0]), fold(acc[i][1]), fold(acc[i][2]),
                                  fold(acc[i][3]));
        const __m128 s = _mm_mul_ps(
            _mm_fmadd_ps(vsc, dots, _mm_mul_ps(vbias, _mm_set1_ps(qsum[h0 + i]))), vs);
        float out[4];
        _mm_storeu_ps(out, s);
        for (int j = 0; j < cnt; j++) p[(h0 + i) * n + t + j] = out[j];
    }
}

#if defined(INT_SCORES)
#include "decode_vnni.h" /* qk_block_i8 */
#endif

/* Output chunk [c0, c0 + nv * VW) of query heads [h0, h0 + nh) (KV head g): sum_t p_t * sc_t *
 * u_t over the whole context, in registers; *bsum gets sum_t p_t bias_t per head. `ahead`
 * holds the K rows (of KV head g) to prefetch into L2 meanwhile, one per token. */
static AI void pv_chunk(const float *p, int64_t n, int64_t h0, const int nh, const int64_t D,
                        const kv_t *v, const int64_t *rows, int64_t g, int64_t c0, const int nv,
                        float inv[], float bsum[], float *o, const ahead_t *ahead) {
    vf acc[HC][4];
    float bs[HC] = {0};
    for (int i = 0; i < nh; i++)
        for (int c = 0; c < nv; c++) acc[i][c] = VZERO();
    for (int64_t t = 0; t < n; t++) {
        if (t < ahead->n) prefetch_row(ahead->k + ahead->rows[t] + g * kv_row(D), D);
        const kv_t *u = v + rows[t] + g * kv_row(D);
        float sc, bias;
        kv_params(u, D, &sc, &bias);
        vf w[HC];
        for (int i = 0; i < nh; i++) {
            const float pt = p[(h0 + i) * n + t];
            w[i] = VSET1(pt * sc);
            bs[i] += pt * bias;
        }
        for (int c = 0; c < nv; c++) {
            const vf x = widen(u + c0 + c * VW);
            for (int i = 0; i < nh; i++) acc[i][c] = VFMA(w[i], x, acc[i][c]);
        }
    }
    for (int i = 0; i < nh; i++) {
        if (c0 == 0) bsum[h0 + i] = bs[i];
        const vf scale = VSET1(inv[h0 + i]), shift = VSET1(bsum[h0 + i] * inv[h0 + i]);
        for (int c = 0; c < nv; c++) VSTORE(o + (h0 + i) * D + c0 + c * VW, VFMA(acc[i][c], scale, shift));
    }
}
#endif

/* Plain C for CPUs without AVX2 and head sizes the vectors do not divide. */
static void qk_scalar(const float *q, int64_t H, int64_t group, int64_t D, const kv_t *k,
                      const int64_t *rows, int64_t t, const float *qsum, float scale, float *p,
                      int64_t n) {
    for (int64_t hh = 0; hh < H; hh++) {
        const kv_t *u = k + rows[t] + hh / group * kv_row(D);
        float sc, bias, dot = 0.0f;
        kv_params(u, D, &sc, &bias);
        for (int64_t d = 0; d < D; d++) dot += q[hh * D + d] * kv_f32(u[d]);
        p[hh * n + t] = (sc * dot + bias * qsum[hh]) * scale;
    }
}

static void pv_scalar(const float *p, int64_t n, int64_t H, int64_t group, int64_t D,
                      const kv_t *v, const int64_t *rows, const float *inv, float *o) {
    for (int64_t hh = 0; hh < H; hh++) {
        float *out = o + hh * D, shift = 0.0f;
        for (int64_t d = 0; d < D; d++) out[d] = 0.0f;
        for (int64_t t = 0; t < n; t++) {
            const kv_t *u = v + rows[t] + hh / group * kv_row(D);
            float sc, bias;
            kv_params(u, D, &sc, &bias);
            const float w = p[hh * n + t] * sc;
            shift += p[hh * n + t] * bias;
            for (int64_t d = 0; d < D; d++) out[d] += w * kv_f32(u[d]);
        }
        for (int64_t d = 0; d < D; d++) out[d] = (out[d] + shift) * inv[hh];
    }
}

/* Each head's softmax numerators in place; inv[hh] = 1 / their sum. */
static void softmax_rows(float *p, int64_t H, int64_t n, float *inv) {
    for (int64_t hh = 0; hh < H; hh++) {
        float *row = p + hh * n;
        exp_shifted(row, max_of(row, n), row, n);
        inv[hh] = 1.0f / sum_of(row, n);
    }
}

#if defined(VECTORS)
#define CASES(CALL) /* nh (1..HC) as a constant, so the head loops unroll */                  \
    switch (nh) {                                                                              \
    case 1: CALL(1); break;                                                                    \
    case 2: CALL(2); break;                                                                    \
    case 3: CALL(3); break;                                                                    \
    default: CALL(HC); break;                                                                  \
    }

/* Pass 1 over the context: every query head's scores, four tokens at a time. */
static AI void scores_vec(const float *q, int64_t H, int64_t Hkv, const int64_t D, const kv_t *k,
                          const kv_t *v, const int64_t *rows, int64_t n, const float *qsum,
                          float scale, float *p, const int8_t *qc, const float *qs) {
    const int64_t group = H / Hkv, bytes = Hkv * kv_row(D) * (int64_t)sizeof(kv_t);
    for (int64_t t = 0; t < n; t += 4) {
        const int64_t cnt = n - t < 4 ? n - t : 4;
        for (int64_t j = 0; j < cnt; j++) prefetch_token(k, v, rows, t + j, n, bytes);
        for (int64_t g = 0; g < Hkv; g++)
            for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += HC) {
                const int64_t nh = (g + 1) * group - h0 < HC ? (g + 1) * group - h0 : HC;
#if defined(INT_SCORES)
#define QK(NH)                                                                                 \
    if (qc) qk_block_i8(qc, qs, h0, NH, D, k, rows, t, cnt, g, qsum, scale, p, n);             \
    else qk_block(q, h0, NH, D, k, rows, t, cnt, g, qsum, scale, p, n)
#else
#define QK(NH) qk_block(q, h0, NH, D, k, rows, t, cnt, g, qsum, scale, p, n)
    (void)qc, (void)qs;
#endif
                CASES(QK)
#undef QK
            }
    }
}

/* Pass 2: the outputs, per KV head, chunk of 4 vectors of D (or 1) and HC query heads. Its V
 * rows come from L2 and the memory would idle: the next sequence's K rows are fetched meanwhile
 * (`ahead`, by the first chunk of each KV head), so its scores pass starts on them in L2. */
static AI void values_vec(const float *p, int64_t n, int64_t H, int64_t Hkv, const int64_t D,
                          const kv_t *v, const int64_t *rows, float *inv, float *bsum, float *o,
                          const ahead_t *ahead) {
    const ahead_t none = {ahead->k, ahead->rows, 0};
    const int64_t group = H / Hkv, wide = D % (4 * VW) == 0 ? 4 : 1;
    for (int64_t g = 0; g < Hkv; g++)
        for (int64_t h0 = g * group; h0 < (g + 1) * group; h0 += HC) {
            const int64_t nh = (g + 1) * group - h0 < HC ? (g + 1) * group - h0 : HC;
            for (int64_t c0 = 0; c0 < D; c0 += wide * VW) {
                const ahead_t *pf = c0 == 0 && h0 == g * group ? ahead : &none;
#define PV(NH)                                                                                 \
    if (wide == 4) pv_chunk(p, n, h0, NH, D, v, rows, g, c0, 4, inv, bsum, o, pf);             \
    else pv_chunk(p, n, h0, NH, D, v, rows, g, c0, 1, inv, bsum, o, pf)
                CASES(PV)
#undef PV
            }
        }
}
#endif

/* Sequence s's context tokens' offsets in the cache into rows; returns their count. */
static int64_t context_rows(const job_t *j, int64_t s, int64_t *rows) {
    const int64_t bs = j->block_size, len = j->seq_lens[s];
    const int64_t first = (j->window > 0 && len > j->window) ? len - j->window : 0;
    const int64_t *table = j->block_tables + s * j->max_blocks;
    const int64_t row = j->num_kv_heads * kv_row(j->head_dim);
    for (int64_t t = 0, blk = first / bs, off = first % bs; t < len - first; t++) {
        rows[t] = (table[blk] * bs + off) * row; /* no division a token */
        if (++off == bs) off = 0, blk++;
    }
    return len - first;
}

/* All query heads of sequence s, whose w->n rows w->rows already holds; w->next gets the next
 * sequence's (the thread's range ends at j->end). DIM is a compile-time head size where one
 * is given (64, 128: the inner loops unroll), else j->head_dim. */
static AI void attend(const job_t *j, int64_t s, scratch_t *w, const int64_t DIM) {
    const int64_t D = DIM, Hkv = j->num_kv_heads, H = j->num_heads, group = H / Hkv, n = w->n;
    const float *q = j->q + s * H * D;
    float *o = j->out + s * H * D, *inv = w->inv, *bsum = w->bsum;
    w->n_next = s + 1 < j->end ? context_rows(j, s + 1, w->next) : 0;
    const int8_t *qc = NULL; /* the heads rounded to int8, where the scores are integer */
#if defined(INT_SCORES)
    if (kv8_int_scores(D)) {
        for (int64_t hh = 0; hh < H; hh++) { /* sum(q) of the rounded row, as prefill_scores.h */
            int32_t codes;
            w->qs[hh] = quantize_query(q + hh * D, D, w->qc + hh * D, &codes);
            w->qsum[hh] = w->qs[hh] * (float)codes;
        }
        qc = w->qc;
    }
#endif
    for (int64_t hh = 0; hh < H && !qc; hh++) { /* sum(q): a converted row's bias term */
        float total = 0.0f;
        for (int64_t d = 0; d < D; d++) total += q[hh * D + d];
        w->qsum[hh] = total;
    }
#if defined(VECTORS)
    if (D % VW == 0) {
        scores_vec(q, H, Hkv, D, j->k, j->v, w->rows, n, w->qsum, j->scale, w->p, qc, w->qs);
        softmax_rows(w->p, H, n, inv);
        const ahead_t ahead = {j->k, w->next, w->n_next};
        values_vec(w->p, n, H, Hkv, D, j->v, w->rows, inv, bsum, o, &ahead);
        return;
    }
#endif
    (void)bsum, (void)qc;
    for (int64_t t = 0; t < n; t++) qk_scalar(q, H, group, D, j->k, w->rows, t, w->qsum, j->scale, w->p, n);
    softmax_rows(w->p, H, n, inv);
    pv_scalar(w->p, n, H, group, D, j->v, w->rows, inv, o);
}

static void attend_64(const job_t *j, int64_t s, scratch_t *w) { attend(j, s, w, 64); }
static void attend_128(const job_t *j, int64_t s, scratch_t *w) { attend(j, s, w, 128); }
static void attend_any(const job_t *j, int64_t s, scratch_t *w) { attend(j, s, w, j->head_dim); }

static void run_job(const void *jobs, int64_t t, int64_t n) {
    (void)n;
    job_t *j = (job_t *)jobs + t;
    int64_t longest = 1;
    for (int64_t s = j->begin; s < j->end; s++)
        longest = j->seq_lens[s] > longest ? j->seq_lens[s] : longest;
    scratch_t w = {malloc(sizeof(int64_t) * longest), malloc(sizeof(int64_t) * longest), 0, 0,
                   malloc(sizeof(float) * j->num_heads * longest),
                   malloc(sizeof(float) * j->num_heads * 4), NULL, NULL,
                   malloc((size_t)(j->num_heads * j->head_dim)), NULL};
    if (!w.rows || !w.next || !w.p || !w.qsum || !w.qc) {
        j->status = 1;
    } else {
        w.inv = w.qsum + j->num_heads, w.bsum = w.inv + j->num_heads, w.qs = w.bsum + j->num_heads;
        void (*fn)(const job_t *, int64_t, scratch_t *) =
            j->head_dim == 64 ? attend_64 : j->head_dim == 128 ? attend_128 : attend_any;
        if (j->begin < j->end) w.n = context_rows(j, j->begin, w.rows);
        for (int64_t s = j->begin; s < j->end; s++) {
            fn(j, s, &w);
            int64_t *done = w.rows; /* the next sequence's rows become the current ones */
            w.rows = w.next, w.next = done, w.n = w.n_next;
        }
    }
    free(w.rows);
    free(w.next);
    free(w.p);
    free(w.qsum);
    free(w.qc);
}

/* Returns 0 on success, 1 when memory ran out. */
int KV_NAME(kvcli_paged_decode_attention)(const float *q, const kv_t *k, const kv_t *v,
                                          const int64_t *block_tables, const int64_t *seq_lens,
                                          float *out, int64_t num_seqs, int64_t num_heads,
                                          int64_t num_kv_heads, int64_t head_dim,
                                          int64_t block_size, int64_t max_blocks, int64_t window,
                                          float scale, int64_t num_threads) {
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
