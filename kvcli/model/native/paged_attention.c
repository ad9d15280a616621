/* Paged decode attention for CPU float32: one query token per sequence, keys and values read
 * straight from the paged KV cache through each sequence's block table.
 *
 * The torch fallback has to gather every sequence's blocks into a padded copy per layer
 * (index_select), then run SDPA over it: three passes over the context, padded to the longest
 * sequence. This kernel reads each K and V row once, where it lies, and uses it for all the
 * query heads of its group (grouped-query attention without copies). Work items are
 * sequences, split across threads by context length; a sequence's tokens are walked in
 * order with all KV heads of a token together, so each block's K (and V) is read as one
 * contiguous run (block_size * Hkv * D floats) instead of one strided head at a time.
 *
 * Built by kvcli/model/native/__init__.py with the system C compiler on first use and cached.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pool.h"

typedef struct {
    const float *q;              /* [S, H, D] */
    const float *k;              /* [num_slots, Hkv, D]: slot = block * block_size + offset */
    const float *v;              /* same layout as k */
    const int64_t *block_tables; /* [S, max_blocks] */
    const int64_t *seq_lens;     /* [S]: context length including the new token */
    float *out;                  /* [S, H, D] */
    int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks, window;
    float scale;
    int64_t begin, end; /* sequences [begin, end) */
    int status;
} job_t;

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* The four horizontal sums of a, b, c, d in one vector: [sum a, sum b, sum c, sum d]. */
static inline __m128 hsum4(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}
#endif

/* Token t + AHEAD's K row and token t's V row (all KV heads: `row_floats`) into the cache
 * while token t is scored. A block's rows are contiguous but the next block lies anywhere,
 * and a decode step at batch 32 streams more K/V from memory than weights: without this the
 * kernel waited on each block's first lines, and its V pass re-read V from memory. */
#define AHEAD 8
static inline void prefetch_token(const float *k, const float *v, const int64_t *rows, int64_t t,
                                  int64_t n, int64_t row_floats) {
    for (int64_t b = 0; b < row_floats; b += 16) {
        if (t + AHEAD < n) __builtin_prefetch(k + rows[t + AHEAD] + b, 0, 3);
        __builtin_prefetch(v + rows[t] + b, 0, 2);
    }
}

/* scores[hh * n + t] = scale * dot(q[hh], K[token t, head hh / group]) for all H query heads
 * hh; rows[t] is token t's offset in the cache (all its KV heads follow). With AVX2 four
 * tokens are dotted at once and their horizontal sums share one reduction (a dot product's
 * reduction otherwise costs about as much as its multiply-adds). */
static void qk_scores(const float *q, int64_t heads, int64_t group, int64_t D, const float *k,
                      const float *v, const int64_t *rows, int64_t n, float scale,
                      float *scores) {
    const int64_t row_floats = heads / group * D;
    int64_t t = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 == 0) {
        const __m128 vscale = _mm_set1_ps(scale);
        for (; t + 4 <= n; t += 4) {
            for (int64_t i = 0; i < 4; i++) prefetch_token(k, v, rows, t + i, n, row_floats);
            const float *k0 = k + rows[t], *k1 = k + rows[t + 1];
            const float *k2 = k + rows[t + 2], *k3 = k + rows[t + 3];
            for (int64_t hh = 0; hh < heads; hh++) {
                const int64_t off = (hh / group) * D;
                const float *qh = q + hh * D;
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t d = 0; d < D; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qh + d);
                    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + off + d), a0);
                    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + off + d), a1);
                    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + off + d), a2);
                    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + off + d), a3);
                }
                _mm_storeu_ps(scores + hh * n + t, _mm_mul_ps(hsum4(a0, a1, a2, a3), vscale));
            }
        }
    }
#endif
    for (; t < n; t++) {
        prefetch_token(k, v, rows, t, n, row_floats);
        for (int64_t hh = 0; hh < heads; hh++) {
            const float *key = k + rows[t] + (hh / group) * D, *qh = q + hh * D;
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += qh[d] * key[d];
            scores[hh * n + t] = dot * scale;
        }
    }
}

/* ATTEND(NAME, DIM) defines the attention of all query heads of sequence s. DIM is a
 * compile-time head size where one is given (64, 128: the inner loops unroll into vector
 * registers) and the runtime j->head_dim otherwise. `rows` holds each context token's offset
 * in the cache (one block-table lookup per token), `scores` [H, n], `acc` [H, D]; the
 * softmax's 1/sum is applied once to the output. */
#define ATTEND(NAME, DIM)                                                                      \
    static void NAME(const job_t *j, int64_t s, int64_t *rows, float *scores, float *acc) {    \
        const int64_t D = (DIM), Hkv = j->num_kv_heads, bs = j->block_size;                    \
        const int64_t H = j->num_heads, group = H / Hkv, len = j->seq_lens[s];                 \
        const int64_t first = (j->window > 0 && len > j->window) ? len - j->window : 0;        \
        const int64_t n = len - first;                                                         \
        const int64_t *table = j->block_tables + s * j->max_blocks;                            \
        for (int64_t t = 0; t < n; t++) {                                                      \
            const int64_t pos = first + t;                                                     \
            rows[t] = (table[pos / bs] * bs + pos % bs) * Hkv * D;                             \
        }                                                                                      \
        qk_scores(j->q + s * H * D, H, group, D, j->k, j->v, rows, n, j->scale, scores);           \
        for (int64_t hh = 0; hh < H; hh++) {                                                   \
            float *row = scores + hh * n, top = row[0];                                        \
            for (int64_t t = 1; t < n; t++) top = row[t] > top ? row[t] : top;                 \
            for (int64_t t = 0; t < n; t++) row[t] = expf(row[t] - top);                       \
        }                                                                                      \
        for (int64_t i = 0; i < H * D; i++) acc[i] = 0.0f;                                     \
        for (int64_t t = 0; t < n; t++) {                                                      \
            const float *vrow = j->v + rows[t];                                                \
            for (int64_t hh = 0; hh < H; hh++) {                                               \
                const float p = scores[hh * n + t], *value = vrow + (hh / group) * D;          \
                float *a = acc + hh * D;                                                       \
                for (int64_t d = 0; d < D; d++) a[d] += p * value[d];                          \
            }                                                                                  \
        }                                                                                      \
        for (int64_t hh = 0; hh < H; hh++) {                                                   \
            const float *row = scores + hh * n;                                                \
            float sum = 0.0f;                                                                  \
            for (int64_t t = 0; t < n; t++) sum += row[t];                                     \
            const float inv = 1.0f / sum;                                                      \
            float *o = j->out + (s * H + hh) * D;                                              \
            for (int64_t d = 0; d < D; d++) o[d] = acc[hh * D + d] * inv;                      \
        }                                                                                      \
    }

ATTEND(attend_64, 64)
ATTEND(attend_128, 128)
ATTEND(attend_any, j->head_dim)

static void run_job(const void *jobs, int64_t t, int64_t n) {
    (void)n;
    job_t *j = (job_t *)jobs + t;
    int64_t longest = 1;
    for (int64_t s = j->begin; s < j->end; s++)
        longest = j->seq_lens[s] > longest ? j->seq_lens[s] : longest;
    int64_t *rows = malloc(sizeof(int64_t) * longest);
    float *scores = malloc(sizeof(float) * j->num_heads * longest);
    float *acc = malloc(sizeof(float) * j->num_heads * j->head_dim);
    if (!rows || !scores || !acc) {
        j->status = 1;
    } else {
        void (*attend)(const job_t *, int64_t, int64_t *, float *, float *) =
            j->head_dim == 64 ? attend_64 : j->head_dim == 128 ? attend_128 : attend_any;
        for (int64_t s = j->begin; s < j->end; s++) attend(j, s, rows, scores, acc);
    }
    free(rows);
    free(scores);
    free(acc);
}

/* Returns 0 on success, 1 when memory ran out. */
int kvcli_paged_decode_attention(const float *q, const float *k, const float *v,
                                 const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                 int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                 int64_t head_dim, int64_t block_size, int64_t max_blocks,
                                 int64_t window, float scale, int64_t num_threads) {
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
