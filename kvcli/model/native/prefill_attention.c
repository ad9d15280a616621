/* Paged attention over many query rows for CPU float32: prefill chunks, whose new queries
 * attend causally to their whole context, and decode tokens of sequences that share a cached
 * prefix, which is then read once for all of them. Keys and values are read where they lie
 * in the paged KV cache.
 *
 * The torch route gathers a sequence's cached context (index_select), calls SDPA per sequence
 * (per shared-prefix group with the cascade), and ran at about a third of the matmul rate (13%
 * of a distinct prefill on AVX-512, more once the matmuls use oneDNN). Here the work items are
 * (sequence, KV head, tile of QT query positions): one tile's queries of all the heads of one KV
 * group share each block of 16 keys, which is transposed once into a [D][16] panel so that a
 * query's 16 scores are D fused multiply-adds on a 16-float vector; the softmax is online
 * (flash attention), so no score matrix is ever stored. Items are claimed from a counter by
 * the pool's threads, longest first, so a descheduled thread holds up nothing.
 *
 * Decode tokens sharing a prefix (one system prompt) are items of (group, KV head, up to QT
 * sequences): their rows attend the prefix panels together, then each sequence's own tail
 * continues its online softmax. Per sequence, a decode step reads the whole context from
 * memory (the cache does not hold 32 x 470 tokens x 30 layers): the group reads it once.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

#include "pool.h"
#include "vexp.h"

/* KV_INT8 or KV_BF16 (prefill_attention_int8.c, _bf16.c): the cache holds int8 or bfloat16
 * rows (kv_rows.h). Each 32-key panel is widened to float as it is transposed, and its V rows
 * into a [KB][D] float scratch beside it: converted once per panel for every query row of the
 * work item (up to QT x group rows), in L1, never as a copy of the cache. */
#if defined(KV_INT8) || defined(KV_BF16)
#define KV_CONVERTED 1
#include "kv_rows.h"
#define KV_ROW(D) kv_row(D)
#else
typedef float kv_t;
#define KV_ROW(D) (D)
#define KV_NAME(name) name
#endif

#define KB 32 /* keys per panel: two 16-float vectors of scores per query */
#define QT 16 /* query positions per work item */

/* One vector register of floats: 16 with AVX-512, else 8 (a wider GCC vector type is split
 * by the compiler, and on AVX2 it kept such vectors in memory: 10x slower). */
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
#define NV (KB / VW) /* vectors per row of panel scores */
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));

typedef struct {
    int64_t kind, of, head, first; /* PREFILL: seq `of`, queries first.. first+QT of it;
                                      SHARED: group `of`, its members first.. first+QT */
} item_t;

enum { PREFILL, SHARED };

typedef struct {
    const float *q;         /* [T, H, D] */
    const kv_t *k, *v;      /* [num_slots, Hkv, KV_ROW(D)] */
    const int64_t *slots;   /* flat slots of every listed sequence's context, concatenated */
    const int64_t *seqs;    /* [S, 4]: first q row, q_len, context length, first slot index */
    const int64_t *groups;  /* SHARED: [G, 3]: first seq, member count, shared prefix length */
    float *out;             /* [T, H, D], laid out as q */
    int64_t H, Hkv, D, window;
    float scale;
    const item_t *items;
    int64_t num_items;
    _Atomic int64_t next;
    _Atomic int status;
} job_t;

/* max and sum of 32 floats as vector trees (a scalar loop is a 31-step dependency chain). */
#if defined(__AVX512F__)
#include <immintrin.h>
static inline float max32(const float *x) {
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)));
}
static inline float sum32(const float *x) {
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)));
}
#elif defined(__AVX2__)
#include <immintrin.h>
static inline float hmax8(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
static inline float hsum8(__m256 v) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}
static inline float max32(const float *x) {
    const __m256 a = _mm256_max_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
    const __m256 b = _mm256_max_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24));
    return hmax8(_mm256_max_ps(a, b));
}
static inline float sum32(const float *x) {
    const __m256 a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
    const __m256 b = _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24));
    return hsum8(_mm256_add_ps(a, b));
}
#else
static inline float max32(const float *x) {
    float m = x[0];
    for (int t = 1; t < 32; t++) m = x[t] > m ? x[t] : m;
    return m;
}
static inline float sum32(const float *x) {
    float s = 0.0f;
    for (int t = 0; t < 32; t++) s += x[t];
    return s;
}
#endif

#if defined(__AVX512F__)
#define RB 4 /* query rows scored together: 8 multiply-add chains of one register each */
#else
#define RB 2 /* a 16-float vector is two AVX2 registers: 2 rows already make 8 chains */
#endif

/* Scores of RB query rows q[r] against the [D][KB] key panel, as two 16-key halves: each panel
 * vector loaded serves RB independent multiply-add chains. */
static inline void scores(int64_t D, const float *const *q, const float *kt, vf (*out)[NV]) {
    vf a[RB][NV] = {{{0}}};
    for (int64_t d = 0; d < D; d++) {
        vf k[NV];
        for (int c = 0; c < NV; c++) k[c] = *(const vf *)(kt + d * KB + c * VW);
        for (int r = 0; r < RB; r++)
            for (int c = 0; c < NV; c++) a[r][c] += q[r][d] * k[c];
    }
    for (int r = 0; r < RB; r++)
        for (int c = 0; c < NV; c++) out[r][c] = a[r][c];
}

/* o[0..D) = alpha * o + sum_t p[t] * vrow[t][0..D). */
static inline void accumulate(float *o, int64_t D, float alpha, const float *p,
                              const float *const *vrow, int64_t nk) {
    if (D == 64) { /* the row's output stays in 64 / VW registers */
        vf acc[64 / VW];
        for (int c = 0; c < 64 / VW; c++) acc[c] = *(vf *)(o + c * VW) * alpha;
        for (int64_t t = 0; t < nk; t++)
            for (int c = 0; c < 64 / VW; c++) acc[c] += p[t] * *(const vf *)(vrow[t] + c * VW);
        for (int c = 0; c < 64 / VW; c++) *(vf *)(o + c * VW) = acc[c];
        return;
    }
    for (int64_t d = 0; d < D; d++) o[d] *= alpha;
    for (int64_t t = 0; t < nk; t++)
        for (int64_t d = 0; d < D; d++) o[d] += p[t] * vrow[t][d];
}

/* Two rows' accumulations at once (each V vector loaded serves both): with D = 64 on AVX-512
 * that is 8 independent multiply-add chains instead of 4. */
static inline void accumulate2(float *oa, float *ob, int64_t D, float alpha_a, float alpha_b,
                               const float *pa, const float *pb, const float *const *vrow,
                               int64_t nk) {
#if defined(__AVX512F__)
    if (D == 64) {
        vf a0 = *(vf *)oa * alpha_a, a1 = *(vf *)(oa + 16) * alpha_a;
        vf a2 = *(vf *)(oa + 32) * alpha_a, a3 = *(vf *)(oa + 48) * alpha_a;
        vf b0 = *(vf *)ob * alpha_b, b1 = *(vf *)(ob + 16) * alpha_b;
        vf b2 = *(vf *)(ob + 32) * alpha_b, b3 = *(vf *)(ob + 48) * alpha_b;
        for (int64_t t = 0; t < nk; t++) {
            const float *vt = vrow[t];
            const vf v0 = *(const vf *)vt, v1 = *(const vf *)(vt + 16);
            const vf v2 = *(const vf *)(vt + 32), v3 = *(const vf *)(vt + 48);
            a0 += pa[t] * v0, a1 += pa[t] * v1, a2 += pa[t] * v2, a3 += pa[t] * v3;
            b0 += pb[t] * v0, b1 += pb[t] * v1, b2 += pb[t] * v2, b3 += pb[t] * v3;
        }
        *(vf *)oa = a0, *(vf *)(oa + 16) = a1, *(vf *)(oa + 32) = a2, *(vf *)(oa + 48) = a3;
        *(vf *)ob = b0, *(vf *)(ob + 16) = b1, *(vf *)(ob + 32) = b2, *(vf *)(ob + 48) = b3;
        return;
    }
#endif
    accumulate(oa, D, alpha_a, pa, vrow, nk);
    accumulate(ob, D, alpha_b, pb, vrow, nk);
}

/* Token t of a panel: its K row transposed into kt [D][KB], its V row's address (float: in
 * the cache; int8, bfloat16: widened into vb [KB][D]). `at` is the row's offset in the cache. */
#if defined(KV_CONVERTED)
/* The row at `at` of a converted cache widened into dst [D]: x = u * scale + bias. */
static inline void widen_row(const kv_t *row, int64_t D, float *dst) {
    float sc, bias;
    kv_params(row, D, &sc, &bias);
    for (int64_t d = 0; d < D; d++) dst[d] = kv_f32(row[d]) * sc + bias;
}
#endif

static inline void load_key(const job_t *j, int64_t D, int64_t at, int64_t t, float *kt,
                            float *vb, const float **vrow) {
#if defined(KV_CONVERTED)
    float *dst = vb + t * D; /* K widened first (a vector loop), then transposed from L1 */
    widen_row(j->k + at, D, dst);
    for (int64_t d = 0; d < D; d++) kt[d * KB + t] = dst[d];
    widen_row(j->v + at, D, dst); /* then V into the same row */
    *vrow = dst;
#else
    (void)vb;
    *vrow = j->v + at;
    for (int64_t d = 0; d < D; d++) kt[d * KB + t] = j->k[at + d];
#endif
}

#if defined(KV_INT8) && defined(KV8_INT_SCORES)
#define KV_VNNI 1 /* integer scores over the codes (kv_int8.h, prefill_scores.h) */
#endif

#if defined(__AVX512F__) && (!defined(KV_CONVERTED) || defined(KV_VNNI))
/* r[i] = column i of the 16 x 16 block whose rows r[] held: four rounds of shuffles. */
static inline void transpose16(__m512 r[16]) {
    __m512 t[16];
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
    }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD);
    }
}
#endif

/* The panel's KB tokens (row offsets at[t] in the cache): K transposed into kt [D][KB], V rows'
 * addresses (or widened rows) in vrow. A float cache with AVX-512 moves 16 x 16 blocks through
 * registers: scalar stores of one float each were most of a panel's cost for a decode
 * sequence's own tail (3 query rows per panel). The same floats land in kt either way. */
static inline void load_panel(const job_t *j, int64_t D, const int64_t *at, float *kt,
                              float *vb, const float **vrow) {
#if defined(__AVX512F__) && !defined(KV_CONVERTED)
    if (D % 16 == 0) {
        for (int64_t t = 0; t < KB; t++) vrow[t] = j->v + at[t];
        for (int64_t h = 0; h < KB; h += 16)
            for (int64_t d0 = 0; d0 < D; d0 += 16) {
                __m512 r[16];
                for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(j->k + at[h + i] + d0);
                transpose16(r);
                for (int i = 0; i < 16; i++) _mm512_storeu_ps(kt + (d0 + i) * KB + h, r[i]);
            }
        return;
    }
#endif
    for (int64_t t = 0; t < KB; t++) load_key(j, D, at[t], t, kt, vb, &vrow[t]);
}

#include "prefill_scores.h" /* qrows_t, panel_in, panel_scores: float or integer scores */

/* Fetches the K and V rows of the panel at key positions [k0, k0 + KB) of `slots` into the
 * cache while the current panel is worked on. The rows lie where the block table put them, so
 * no hardware prefetcher sees the pattern: without this, every row's first line missed the
 * cache one after another (the transposing loads took ~half of the shared-prefix decode). */
static inline void prefetch_panel(const job_t *j, const int64_t *slots, int64_t k0,
                                  int64_t k_hi, int64_t at0, int64_t stride, int64_t bytes) {
    const int64_t nk = k_hi - k0 < KB ? k_hi - k0 : KB;
    for (int64_t t = 0; t < nk; t++) {
        const char *kr = (const char *)(j->k + slots[k0 + t] * stride + at0);
        const char *vr = (const char *)(j->v + slots[k0 + t] * stride + at0);
        for (int64_t b = 0; b < bytes; b += 64) {
            __builtin_prefetch(kr + b, 0, 3);
            __builtin_prefetch(vr + b, 0, 3);
        }
    }
}

/* ATTEND_KEYS(NAME, DIM): m query rows q[i] (at positions pos[i]) continue their online
 * softmax (max mx, sum l, output o [m][D]) over key positions [k_lo, k_hi) of the context
 * `slots`, KV head g; row i sees keys at positions <= pos[i] (and > pos[i] - window). kt is the
 * [D][KB] key panel (followed by the int8 build's [KB][D] V scratch). DIM is a compile-time head size where one is given. */
#define ATTEND_KEYS(NAME, DIM)                                                                 \
    static void NAME(const job_t *j, int64_t g, const int64_t *slots, int64_t k_lo,            \
                     int64_t k_hi, int64_t m, const float *const *q, const qrows_t *qq,        \
                     const int64_t *pos, float *mx, float *l, float *o, float *kt) {           \
        const int64_t D = (DIM), stride = j->Hkv * KV_ROW(D), w = j->window;                   \
        const float *vrow[KB];                                                                 \
        float *vb = kt + D * KB;                                                               \
        const int64_t row_bytes = KV_ROW(D) * (int64_t)sizeof(kv_t);                           \
        if (k_lo < k_hi) prefetch_panel(j, slots, k_lo, k_hi, g * KV_ROW(D), stride, row_bytes); \
        for (int64_t k0 = k_lo; k0 < k_hi; k0 += KB) {                                         \
            const int64_t nk = k_hi - k0 < KB ? k_hi - k0 : KB;                                \
            if (k0 + KB < k_hi)                                                                \
                prefetch_panel(j, slots, k0 + KB, k_hi, g * KV_ROW(D), stride, row_bytes);     \
            int64_t at[KB];                                                                    \
            for (int64_t t = 0; t < KB; t++)                                                   \
                at[t] = slots[k0 + (t < nk ? t : 0)] * stride + g * KV_ROW(D);                 \
            float sk[KB], bk[KB];                                                              \
            panel_in(j, D, at, kt, vb, vrow, qq, sk, bk);                                      \
            for (int64_t i0 = 0; i0 < m; i0 += RB) {                                           \
                vf sv[RB][NV];                                                                 \
                const float *qs[RB];                                                           \
                for (int64_t r = 0; r < RB; r++) qs[r] = q[i0 + r < m ? i0 + r : i0];          \
                panel_scores(D, qs, qq, i0, m, kt, sk, bk, sv);                                \
                float p[RB][KB], alpha[RB];                                                    \
                int live[RB];                                                                  \
                for (int64_t r = 0; r < RB; r++) {                                             \
                    const int64_t i = i0 + r, at = i < m ? pos[i] : 0;                         \
                    live[r] = i < m && k0 <= at && (w == 0 || k0 + nk - 1 > at - w);           \
                    if (!live[r]) continue; /* no key of the panel is visible to it */         \
                    float sc[KB];                                                              \
                    for (int c = 0; c < NV; c++) *(vf *)(sc + c * VW) = sv[r][c] * j->scale;   \
                    if (nk < KB || at < k0 + KB - 1 || (w > 0 && k0 <= at - w))                \
                        for (int64_t t = 0; t < KB; t++) {                                     \
                            const int64_t kp = k0 + t;                                         \
                            if (t >= nk || kp > at || (w > 0 && kp <= at - w)) sc[t] = -INFINITY; \
                        }                                                                      \
                    const float top = max32(sc), now = top > mx[i] ? top : mx[i];              \
                    alpha[r] = now == mx[i] ? 1.0f : expf(mx[i] - now);                        \
                    exp_shifted(sc, now, p[r], KB);                                            \
                    mx[i] = now, l[i] = l[i] * alpha[r] + sum32(p[r]);                         \
                }                                                                              \
                for (int64_t r = 0; r < RB; r += 2) {                                          \
                    float *oa = o + (i0 + r) * D, *ob = oa + D;                                \
                    if (live[r] && r + 1 < RB && live[r + 1])                                  \
                        accumulate2(oa, ob, D, alpha[r], alpha[r + 1], p[r], p[r + 1], vrow, nk); \
                    else {                                                                     \
                        if (live[r]) accumulate(oa, D, alpha[r], p[r], vrow, nk);              \
                        if (r + 1 < RB && live[r + 1])                                         \
                            accumulate(ob, D, alpha[r + 1], p[r + 1], vrow, nk);               \
                    }                                                                          \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }

ATTEND_KEYS(keys_64, 64)
ATTEND_KEYS(keys_128, 128)
ATTEND_KEYS(keys_any, j->D)

typedef void (*keys_fn)(const job_t *, int64_t, const int64_t *, int64_t, int64_t, int64_t,
                        const float *const *, const qrows_t *, const int64_t *, float *, float *,
                        float *, float *);

typedef struct { /* one thread's buffers, for QT x group rows */
    float *kt, *mx, *l, *o;
    const float **q;
    int64_t *pos;
    int8_t *qc; /* the rows rounded to int8 (KV_VNNI), with their scales and code sums */
    float *qs;
    int32_t *qsum;
} scratch_t;

/* The item's m query rows (s->q) rounded to int8 where the integer scores serve them. */
static qrows_t quantized_rows(const job_t *j, int64_t m, const scratch_t *s) {
#if defined(KV_VNNI)
    if (kv8_int_scores(j->D)) {
        for (int64_t i = 0; i < m; i++)
            s->qs[i] = quantize_query(s->q[i], j->D, s->qc + i * j->D, &s->qsum[i]);
        return (qrows_t){s->qc, s->qs, s->qsum};
    }
#endif
    (void)j, (void)m, (void)s;
    return (qrows_t){NULL, NULL, NULL};
}

/* Rows r.. of qq (a sequence's own rows in a shared item). */
static inline qrows_t rows_from(const qrows_t *qq, int64_t r, int64_t D) {
    if (!qq->c) return *qq;
    return (qrows_t){qq->c + r * D, qq->s + r, qq->sum + r};
}

/* Row r of sequence `seq`'s query `i` for query head `hh`. */
static inline const float *query(const job_t *j, const int64_t *info, int64_t i, int64_t hh) {
    return j->q + ((info[0] + i) * j->H + hh) * j->D;
}

static void start_rows(const job_t *j, int64_t m, scratch_t *s) {
    for (int64_t i = 0; i < m; i++) {
        s->mx[i] = -INFINITY, s->l[i] = 0.0f;
        for (int64_t d = 0; d < j->D; d++) s->o[i * j->D + d] = 0.0f;
    }
}

static void finish_rows(const job_t *j, int64_t m, const scratch_t *s) {
    for (int64_t i = 0; i < m; i++) {
        float *dst = j->out + (s->q[i] - j->q); /* out is laid out as q */
        const float inv = 1.0f / s->l[i];
        for (int64_t d = 0; d < j->D; d++) dst[d] = s->o[i * j->D + d] * inv;
    }
}

/* A prefill tile: QT query positions x the group's heads, causal over its context. */
static void prefill_item(const job_t *j, const item_t *it, keys_fn keys, scratch_t *s) {
    const int64_t group = j->H / j->Hkv, g = it->head, w = j->window;
    const int64_t *info = j->seqs + 4 * it->of;
    const int64_t q_len = info[1], pos0 = info[2] - q_len, first = it->first;
    const int64_t last = first + QT < q_len ? first + QT : q_len, m = (last - first) * group;
    for (int64_t i = 0; i < m; i++) {
        s->q[i] = query(j, info, first + i / group, g * group + i % group);
        s->pos[i] = pos0 + first + i / group;
    }
    const int64_t lo = w > 0 && pos0 + first - w + 1 > 0 ? pos0 + first - w + 1 : 0;
    const qrows_t qq = quantized_rows(j, m, s);
    start_rows(j, m, s);
    keys(j, g, j->slots + info[3], lo, pos0 + last, m, s->q, &qq, s->pos, s->mx, s->l, s->o,
         s->kt);
    finish_rows(j, m, s);
}

/* Up to QT decode tokens of a group: the shared prefix once for all, then each own tail. */
static void shared_item(const job_t *j, const item_t *it, keys_fn keys, scratch_t *s) {
    const int64_t group = j->H / j->Hkv, g = it->head;
    const int64_t *grp = j->groups + 3 * it->of;
    const int64_t first = grp[0] + it->first, end = grp[0] + grp[1], shared = grp[2];
    const int64_t last = first + QT < end ? first + QT : end, m = (last - first) * group;
    for (int64_t i = 0; i < m; i++) {
        const int64_t *info = j->seqs + 4 * (first + i / group);
        s->q[i] = query(j, info, 0, g * group + i % group);
        s->pos[i] = info[2] - 1;
    }
    const qrows_t qq = quantized_rows(j, m, s);
    start_rows(j, m, s);
    keys(j, g, j->slots + j->seqs[4 * first + 3], 0, shared, m, s->q, &qq, s->pos, s->mx, s->l,
         s->o, s->kt);
    for (int64_t r = 0; r < m; r += group) {
        const int64_t *info = j->seqs + 4 * (first + r / group);
        const qrows_t own = rows_from(&qq, r, j->D);
        keys(j, g, j->slots + info[3], shared, info[2], group, s->q + r, &own, s->pos + r,
             s->mx + r, s->l + r, s->o + r * j->D, s->kt);
    }
    finish_rows(j, m, s);
}

static void run_part(const void *args, int64_t t, int64_t n) {
    (void)t;
    (void)n;
    job_t *j = (job_t *)args;
    const int64_t rows = QT * (j->H / j->Hkv);
    scratch_t s = {aligned_alloc(64, sizeof(float) * j->D * KB * 2), /* panel + V scratch */
                   malloc(sizeof(float) * rows), malloc(sizeof(float) * rows),
                   malloc(sizeof(float) * rows * j->D),
                   malloc(sizeof(float *) * rows), malloc(sizeof(int64_t) * rows),
                   malloc((size_t)(rows * j->D)), malloc(sizeof(float) * rows),
                   malloc(sizeof(int32_t) * rows)};
    const keys_fn keys = j->D == 64 ? keys_64 : j->D == 128 ? keys_128 : keys_any;
    if (!s.kt || !s.mx || !s.l || !s.o || !s.q || !s.pos || !s.qc || !s.qs || !s.qsum) {
        atomic_store(&j->status, 1);
    } else {
        for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->num_items;) {
            const item_t *it = &j->items[i];
            (it->kind == PREFILL ? prefill_item : shared_item)(j, it, keys, &s);
        }
    }
    free(s.kt);
    free(s.mx);
    free(s.l);
    free(s.o);
    free(s.q);
    free(s.pos);
    free(s.qc);
    free(s.qs);
    free(s.qsum);
}

static int run(job_t *job, item_t *items, int64_t n, int64_t num_threads) {
    job->items = items;
    job->num_items = n;
    kvcli_parallel(run_part, job, num_threads < n ? num_threads : n, 0);
    free(items);
    return atomic_load(&job->status);
}

/* 1 where this build's attention kernels (these and paged_attention.c's) round query rows of
 * head size D to int8 for integer scores (kv_int8.h). */
int64_t KV_NAME(kvcli_attention_int_scores)(int64_t head_dim) {
#if defined(KV_VNNI)
    return kv8_int_scores(head_dim);
#else
    (void)head_dim;
    return 0;
#endif
}

/* Returns 0 on success, 1 when memory ran out. Every listed sequence's K/V, the new tokens'
 * included, must already be in the cache. */
int KV_NAME(kvcli_paged_prefill_attention)(const float *q, const kv_t *k, const kv_t *v,
                                  const int64_t *slots, const int64_t *seqs, float *out,
                                  int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                  int64_t head_dim, int64_t window, float scale,
                                  int64_t num_threads) {
    int64_t count = 0;
    for (int64_t s = 0; s < num_seqs; s++) count += (seqs[4 * s + 1] + QT - 1) / QT * num_kv_heads;
    item_t *items = malloc(sizeof(item_t) * (count ? count : 1));
    if (!items) return 1;
    /* Longest first: a tile's work grows with its last query's position. */
    int64_t n = 0;
    for (int64_t s = 0; s < num_seqs; s++)
        for (int64_t first = (seqs[4 * s + 1] - 1) / QT * QT; first >= 0; first -= QT)
            for (int64_t g = 0; g < num_kv_heads; g++) items[n++] = (item_t){PREFILL, s, g, first};
    job_t job = {q, k, v, slots, seqs, NULL, out, num_heads, num_kv_heads, head_dim, window,
                 scale, NULL, 0, 0, 0};
    return run(&job, items, n, num_threads);
}

/* Decode tokens (q_len 1) of sequences listed group by group in `seqs`; group i's members
 * share their first groups[i][2] context slots (whole cached blocks). No sliding window. */
int KV_NAME(kvcli_shared_decode_attention)(const float *q, const kv_t *k, const kv_t *v,
                                  const int64_t *slots, const int64_t *seqs,
                                  const int64_t *groups, float *out, int64_t num_groups,
                                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                  float scale, int64_t num_threads) {
    int64_t count = 0;
    for (int64_t gi = 0; gi < num_groups; gi++) count += (groups[3 * gi + 1] + QT - 1) / QT;
    item_t *items = malloc(sizeof(item_t) * (count ? count : 1) * num_kv_heads);
    if (!items) return 1;
    int64_t n = 0;
    for (int64_t gi = 0; gi < num_groups; gi++)
        for (int64_t first = 0; first < groups[3 * gi + 1]; first += QT)
            for (int64_t g = 0; g < num_kv_heads; g++) items[n++] = (item_t){SHARED, gi, g, first};
    job_t job = {q, k, v, slots, seqs, groups, out, num_heads, num_kv_heads, head_dim, 0, scale,
                 NULL, 0, 0, 0};
    return run(&job, items, n, num_threads);
}
