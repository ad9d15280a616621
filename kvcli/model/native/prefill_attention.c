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
#define QT 16 /* query positions per prefill work item (the vector kernels), decode tokens per
                shared-prefix item */
#define QT_AMX 32 /* query positions per prefill item where prefill_amx.h's tiles run it */

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
    int64_t kind, of, head, first; /* PREFILL: seq `of`, queries first.. first+qt of it;
                                      SHARED: group `of`, its members first.. first+QT */
} item_t;

enum { PREFILL, SHARED };

typedef struct {
    const float *q;         /* [T, H, D], rows q_stride floats apart (the fused projection's) */
    int64_t q_stride;
    const kv_t *k, *v;      /* [num_slots, Hkv, KV_ROW(D)] */
    const int64_t *slots;   /* flat slots of every listed sequence's context, concatenated */
    const int64_t *seqs;    /* [S, 4]: first q row, q_len, context length, first slot index */
    const int64_t *groups;  /* SHARED: [G, 3]: first seq, member count, shared prefix length */
    float *out;             /* [T, H, D], laid out as q */
    int64_t H, Hkv, D, window;
    float scale;
    int64_t qt;             /* query positions per prefill item (QT or QT_AMX), >= QT */
    const item_t *items;
    int64_t num_items;
    _Atomic int64_t next;
    _Atomic int status;
} job_t;

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

/* o[0..D) += sum_t p[t] * vrow[t][0..D). */
static inline void accumulate(float *o, int64_t D, const float *p, const float *const *vrow,
                              int64_t nk) {
    if (D == 64) { /* the row's output stays in 64 / VW registers */
        vf acc[64 / VW];
        for (int c = 0; c < 64 / VW; c++) acc[c] = *(vf *)(o + c * VW);
        for (int64_t t = 0; t < nk; t++)
            for (int c = 0; c < 64 / VW; c++) acc[c] += p[t] * *(const vf *)(vrow[t] + c * VW);
        for (int c = 0; c < 64 / VW; c++) *(vf *)(o + c * VW) = acc[c];
        return;
    }
    for (int64_t t = 0; t < nk; t++)
        for (int64_t d = 0; d < D; d++) o[d] += p[t] * vrow[t][d];
}

/* Two rows' accumulations at once (each V vector loaded serves both): with D = 64 on AVX-512
 * that is 8 independent multiply-add chains instead of 4. */
static inline void accumulate2(float *oa, float *ob, int64_t D, const float *pa, const float *pb,
                               const float *const *vrow, int64_t nk) {
#if defined(__AVX512F__)
    if (D == 64) {
        vf a0 = *(vf *)oa, a1 = *(vf *)(oa + 16), a2 = *(vf *)(oa + 32), a3 = *(vf *)(oa + 48);
        vf b0 = *(vf *)ob, b1 = *(vf *)(ob + 16), b2 = *(vf *)(ob + 32), b3 = *(vf *)(ob + 48);
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
    accumulate(oa, D, pa, vrow, nk);
    accumulate(ob, D, pb, vrow, nk);
}

#include "prefill_panels.h" /* panel_at, load_panel_keys, load_panel_values, prefetch_panel */
#include "prefill_scores.h"  /* qrows_t, panel_keys, panel_scores: float or integer scores */

/* The softmax moves in steps of SP keys (SP / KB panels): a step's scores of every row are kept
 * (sc [m][SP], 48 rows x 1 KB in L2), then each row takes one max, one pass of exponentials and
 * sums, and one rescale of its output for the whole step, then the step's V panels are
 * accumulated. Per 32-key panel, that bookkeeping (masking, max, rescale, two horizontal
 * reductions and a scalar exp per row) was half of the int8 cache's prefill kernel. */
#define SP 256
#define AI __attribute__((always_inline)) static inline

typedef struct { /* one thread's buffers for an item's steps */
    float *kt;     /* the [D][KB] key panel, then a [KB][D] V scratch */
    float *sc;     /* a softmax step's scores, [qt x group][SP] */
    int64_t *span; /* each row's visible offsets in the step */
    void *amx;     /* prefill_amx.h's tile buffers (NULL: the vector kernels) */
} bufs_t;

/* Scores of the m rows against the step's keys [k0, k0 + n) of `slots` (KV head g), scaled,
 * into sc [m][SP]. */
AI void score_step(const job_t *j, int64_t D, int64_t g, const int64_t *slots, int64_t k0,
                   int64_t n, int64_t k_hi, int64_t m, const float *const *q, const qrows_t *qq,
                   float *kt, float *sc) {
    const int64_t stride = j->Hkv * KV_ROW(D), at0 = g * KV_ROW(D);
    const int64_t row_bytes = KV_ROW(D) * (int64_t)sizeof(kv_t);
    for (int64_t p0 = 0; p0 < n; p0 += KB) {
        const int64_t k = k0 + p0, nk = n - p0 < KB ? n - p0 : KB;
        if (k + KB < k_hi) prefetch_panel(j, slots, k + KB, k_hi, at0, stride, row_bytes);
        int64_t at[KB];
        float sk[KB], bk[KB];
        panel_at(slots, k, nk, stride, at0, at);
        panel_keys(j, D, at, kt, kt + D * KB, qq, sk, bk);
        for (int64_t i0 = 0; i0 < m; i0 += RB) {
            vf sv[RB][NV];
            const float *qs[RB];
            for (int64_t r = 0; r < RB; r++) qs[r] = q[i0 + r < m ? i0 + r : i0];
            panel_scores(D, qs, qq, i0, m, kt, sk, bk, sv);
            for (int64_t r = 0; r < RB && i0 + r < m; r++)
                for (int c = 0; c < NV; c++)
                    *(vf *)(sc + (i0 + r) * SP + p0 + c * VW) = sv[r][c] * j->scale;
        }
    }
}

/* Each row's online softmax over the step's keys [k0, k0 + n): it sees offsets [lo, hi) of them
 * (span[2 i], span[2 i + 1]; causal, window). Its max, sum l and output o move once; its scores
 * become the numerators, zero on the keys it does not see in the panels it reads. */
AI void softmax_step(int64_t D, int64_t k0, int64_t n, int64_t m, const int64_t *pos, int64_t w,
                     float *sc, int64_t *span, float *mx, float *l, float *o) {
    for (int64_t i = 0; i < m; i++) {
        const int64_t last = pos[i] - k0 + 1, first = w > 0 ? pos[i] - w + 1 - k0 : 0;
        const int64_t hi = last < n ? last : n, lo = first > 0 ? first : 0;
        span[2 * i] = lo, span[2 * i + 1] = hi;
        if (hi <= lo) continue; /* no key of the step is visible to it */
        float *si = sc + i * SP;
        const float top = max_of(si + lo, hi - lo), now = top > mx[i] ? top : mx[i];
        if (now != mx[i]) {
            const float alpha = expf(mx[i] - now);
            l[i] *= alpha;
            for (int64_t d = 0; d < D; d++) o[i * D + d] *= alpha;
            mx[i] = now;
        }
        exp_shifted(si + lo, now, si + lo, hi - lo);
        l[i] += sum_of(si + lo, hi - lo);
        for (int64_t t = lo / KB * KB; t < lo; t++) si[t] = 0.0f;
        for (int64_t t = hi; t < (hi + KB - 1) / KB * KB; t++) si[t] = 0.0f;
    }
}

/* Whether row i reads the panel at offset p0 (nk keys) of the step. */
static inline int reads(const int64_t *span, int64_t i, int64_t p0, int64_t nk) {
    return span[2 * i] < p0 + nk && span[2 * i + 1] > p0;
}

/* The step's V panels, each loaded once, accumulated into the rows' outputs o [m][D]. */
AI void value_step(const job_t *j, int64_t D, int64_t g, const int64_t *slots, int64_t k0,
                   int64_t n, int64_t m, const int64_t *span, const float *sc, float *vb,
                   float *o) {
    const int64_t stride = j->Hkv * KV_ROW(D), at0 = g * KV_ROW(D);
    for (int64_t p0 = 0; p0 < n; p0 += KB) {
        const int64_t nk = n - p0 < KB ? n - p0 : KB;
        int64_t at[KB];
        const float *vrow[KB];
        panel_at(slots, k0 + p0, nk, stride, at0, at);
        load_panel_values(j, D, at, vb, vrow);
        for (int64_t i = 0; i < m;) {
            const float *pa = sc + i * SP + p0;
            if (!reads(span, i, p0, nk)) {
                i++;
            } else if (i + 1 < m && reads(span, i + 1, p0, nk)) {
                accumulate2(o + i * D, o + (i + 1) * D, D, pa, pa + SP, vrow, nk);
                i += 2;
            } else {
                accumulate(o + i * D, D, pa, vrow, nk);
                i++;
            }
        }
    }
}

/* ATTEND_KEYS(NAME, DIM): m query rows q[i] (at positions pos[i]) continue their online
 * softmax (max mx, sum l, output o [m][D]) over key positions [k_lo, k_hi) of the context
 * `slots`, KV head g; row i sees keys at positions <= pos[i] (and > pos[i] - window). b->kt holds
 * the [D][KB] key panel and a [KB][D] V scratch; b->sc and b->span the step's scores and spans.
 * DIM is a compile-time head size where one is given. */
#define ATTEND_KEYS(NAME, DIM)                                                                 \
    static void NAME(const job_t *j, int64_t g, const int64_t *slots, int64_t k_lo,            \
                     int64_t k_hi, int64_t m, const float *const *q, const qrows_t *qq,        \
                     const int64_t *pos, float *mx, float *l, float *o, const bufs_t *b) {     \
        const int64_t D = (DIM);                                                               \
        float *kt = b->kt, *sc = b->sc;                                                        \
        int64_t *span = b->span;                                                               \
        if (k_lo < k_hi)                                                                       \
            prefetch_panel(j, slots, k_lo, k_hi, g * KV_ROW(D), j->Hkv * KV_ROW(D),            \
                           KV_ROW(D) * (int64_t)sizeof(kv_t));                                 \
        for (int64_t k0 = k_lo; k0 < k_hi; k0 += SP) {                                         \
            const int64_t n = k_hi - k0 < SP ? k_hi - k0 : SP;                                 \
            score_step(j, D, g, slots, k0, n, k_hi, m, q, qq, kt, sc);                         \
            softmax_step(D, k0, n, m, pos, j->window, sc, span, mx, l, o);                     \
            value_step(j, D, g, slots, k0, n, m, span, sc, kt + D * KB, o);                    \
        }                                                                                      \
    }

ATTEND_KEYS(keys_64, 64)
ATTEND_KEYS(keys_128, 128)
ATTEND_KEYS(keys_any, j->D)

typedef void (*keys_fn)(const job_t *, int64_t, const int64_t *, int64_t, int64_t, int64_t,
                        const float *const *, const qrows_t *, const int64_t *, float *, float *,
                        float *, const bufs_t *);

/* The vector kernel for head size D. */
static keys_fn vector_keys(int64_t D) { return D == 64 ? keys_64 : D == 128 ? keys_128 : keys_any; }

#include "prefill_amx.h" /* keys_amx: the int8 cache's steps on AMX tiles */

typedef struct { /* one thread's buffers, for qt x group rows */
    float *mx, *l, *o;
    bufs_t b; /* the panel, a softmax step's scores [qt x group][SP] and spans, AMX's buffers */
    const float **q;
    int64_t *pos, *dst; /* each row's position, and its offset in out */
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

/* Where row `i` of sequence `seq` for query head `hh` lies in q (and out: [T, H, D]). */
static inline int64_t query_at(const job_t *j, const int64_t *info, int64_t i, int64_t hh) {
    return (info[0] + i) * j->q_stride + hh * j->D;
}

static inline int64_t out_at(const job_t *j, const int64_t *info, int64_t i, int64_t hh) {
    return ((info[0] + i) * j->H + hh) * j->D;
}

static void start_rows(const job_t *j, int64_t m, scratch_t *s) {
    for (int64_t i = 0; i < m; i++) {
        s->mx[i] = -INFINITY, s->l[i] = 0.0f;
        for (int64_t d = 0; d < j->D; d++) s->o[i * j->D + d] = 0.0f;
    }
}

static void finish_rows(const job_t *j, int64_t m, const scratch_t *s) {
    for (int64_t i = 0; i < m; i++) {
        float *dst = j->out + s->dst[i];
        const float inv = 1.0f / s->l[i];
        for (int64_t d = 0; d < j->D; d++) dst[d] = s->o[i * j->D + d] * inv;
    }
}

/* A prefill tile: qt query positions x the group's heads, causal over its context. */
static void prefill_item(const job_t *j, const item_t *it, keys_fn keys, scratch_t *s) {
    const int64_t group = j->H / j->Hkv, g = it->head, w = j->window;
    const int64_t *info = j->seqs + 4 * it->of;
    const int64_t q_len = info[1], pos0 = info[2] - q_len, first = it->first;
    const int64_t last = first + j->qt < q_len ? first + j->qt : q_len, m = (last - first) * group;
    for (int64_t i = 0; i < m; i++) {
        s->q[i] = j->q + query_at(j, info, first + i / group, g * group + i % group);
        s->dst[i] = out_at(j, info, first + i / group, g * group + i % group);
        s->pos[i] = pos0 + first + i / group;
    }
    const int64_t lo = w > 0 && pos0 + first - w + 1 > 0 ? pos0 + first - w + 1 : 0;
    const qrows_t qq = quantized_rows(j, m, s);
    start_rows(j, m, s);
    keys(j, g, j->slots + info[3], lo, pos0 + last, m, s->q, &qq, s->pos, s->mx, s->l, s->o,
         &s->b);
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
        s->q[i] = j->q + query_at(j, info, 0, g * group + i % group);
        s->dst[i] = out_at(j, info, 0, g * group + i % group);
        s->pos[i] = info[2] - 1;
    }
    const qrows_t qq = quantized_rows(j, m, s);
    start_rows(j, m, s);
    keys(j, g, j->slots + j->seqs[4 * first + 3], 0, shared, m, s->q, &qq, s->pos, s->mx, s->l,
         s->o, &s->b);
    for (int64_t r = 0; r < m; r += group) {
        const int64_t *info = j->seqs + 4 * (first + r / group);
        const qrows_t own = rows_from(&qq, r, j->D);
        keys(j, g, j->slots + info[3], shared, info[2], group, s->q + r, &own, s->pos + r,
             s->mx + r, s->l + r, s->o + r * j->D, &s->b);
    }
    finish_rows(j, m, s);
}

static void run_part(const void *args, int64_t t, int64_t n) {
    (void)t;
    (void)n;
    job_t *j = (job_t *)args;
    const int64_t rows = j->qt * (j->H / j->Hkv);
    scratch_t s = {malloc(sizeof(float) * rows), malloc(sizeof(float) * rows),
                   malloc(sizeof(float) * rows * j->D),
                   {aligned_alloc(64, sizeof(float) * j->D * KB * 2), /* panel + V scratch */
                    aligned_alloc(64, sizeof(float) * rows * SP),
                    malloc(sizeof(int64_t) * rows * 2), amx_start(j->D, rows)},
                   malloc(sizeof(float *) * rows), malloc(sizeof(int64_t) * rows),
                   malloc(sizeof(int64_t) * rows),
                   aligned_alloc(64, (size_t)(rows * j->D + 63) / 64 * 64),
                   malloc(sizeof(float) * rows), malloc(sizeof(int32_t) * rows)};
    const keys_fn keys = s.b.amx ? keys_amx : vector_keys(j->D);
    if (!s.b.kt || !s.mx || !s.l || !s.o || !s.b.sc || !s.b.span || !s.q || !s.pos || !s.dst ||
        !s.qc || !s.qs || !s.qsum) {
        atomic_store(&j->status, 1);
    } else {
        for (int64_t i; (i = atomic_fetch_add(&j->next, 1)) < j->num_items;) {
            const item_t *it = &j->items[i];
            (it->kind == PREFILL ? prefill_item : shared_item)(j, it, keys, &s);
        }
    }
    amx_end(s.b.amx);
    free(s.b.kt);
    free(s.mx);
    free(s.l);
    free(s.o);
    free(s.b.sc);
    free(s.b.span);
    free(s.q);
    free(s.pos);
    free(s.dst);
    free(s.qc);
    free(s.qs);
    free(s.qsum);
}

/* `rows`: the call's query rows (pool.h's rule: a prefill chunk between torch ops, or a decode
 * step's tokens). */
static int run(job_t *job, item_t *items, int64_t n, int64_t num_threads, int64_t rows) {
    job->items = items;
    job->num_items = n;
    kvcli_parallel_rows(run_part, job, num_threads < n ? num_threads : n, rows);
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
int KV_NAME(kvcli_paged_prefill_attention)(const float *q, int64_t q_stride, const kv_t *k,
                                  const kv_t *v,
                                  const int64_t *slots, const int64_t *seqs, float *out,
                                  int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                  int64_t head_dim, int64_t window, float scale,
                                  int64_t num_threads) {
    const int64_t qt = prefill_positions(head_dim);
    int64_t count = 0, rows = 0;
    for (int64_t s = 0; s < num_seqs; s++) {
        count += (seqs[4 * s + 1] + qt - 1) / qt * num_kv_heads;
        rows += seqs[4 * s + 1];
    }
    item_t *items = malloc(sizeof(item_t) * (count ? count : 1));
    if (!items) return 1;
    /* Longest first: a tile's work grows with its last query's position. */
    int64_t n = 0;
    for (int64_t s = 0; s < num_seqs; s++)
        for (int64_t first = (seqs[4 * s + 1] - 1) / qt * qt; first >= 0; first -= qt)
            for (int64_t g = 0; g < num_kv_heads; g++) items[n++] = (item_t){PREFILL, s, g, first};
    job_t job = {q, q_stride, k, v, slots, seqs, NULL, out, num_heads, num_kv_heads, head_dim,
                 window, scale, qt, NULL, 0, 0, 0};
    return run(&job, items, n, num_threads, rows);
}

/* Decode tokens (q_len 1) of sequences listed group by group in `seqs`; group i's members
 * share their first groups[i][2] context slots (whole cached blocks). No sliding window. */
int KV_NAME(kvcli_shared_decode_attention)(const float *q, int64_t q_stride, const kv_t *k,
                                  const kv_t *v,
                                  const int64_t *slots, const int64_t *seqs,
                                  const int64_t *groups, float *out, int64_t num_groups,
                                  int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                  float scale, int64_t num_threads) {
    int64_t count = 0, rows = 0; /* rows: the decode tokens */
    for (int64_t gi = 0; gi < num_groups; gi++) {
        count += (groups[3 * gi + 1] + QT - 1) / QT;
        rows += groups[3 * gi + 1];
    }
    item_t *items = malloc(sizeof(item_t) * (count ? count : 1) * num_kv_heads);
    if (!items) return 1;
    int64_t n = 0;
    for (int64_t gi = 0; gi < num_groups; gi++)
        for (int64_t first = 0; first < groups[3 * gi + 1]; first += QT)
            for (int64_t g = 0; g < num_kv_heads; g++) items[n++] = (item_t){SHARED, gi, g, first};
    job_t job = {q, q_stride, k, v, slots, seqs, groups, out, num_heads, num_kv_heads, head_dim,
                 0, scale, QT, NULL, 0, 0, 0};
    return run(&job, items, n, num_threads, rows);
}
