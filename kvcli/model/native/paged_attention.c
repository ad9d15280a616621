/* Paged decode attention for CPU float32: one query token per sequence, keys and values read
 * straight from the paged KV cache through each sequence's block table.
 *
 * The torch fallback has to gather every sequence's blocks into a padded copy per layer
 * (index_select), then run SDPA over it: three passes over the context, padded to the longest
 * sequence. This kernel reads each K and V row once, where it lies, and uses it for all the
 * query heads of its group (grouped-query attention without copies). Work items are
 * (sequence, KV head) pairs split across threads by context length.
 *
 * Built by kvcli/model/native/__init__.py with the system C compiler on first use and cached.
 */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const float *q;              /* [S, H, D] */
    const float *k;              /* [num_slots, Hkv, D]: slot = block * block_size + offset */
    const float *v;              /* same layout as k */
    const int64_t *block_tables; /* [S, max_blocks] */
    const int64_t *seq_lens;     /* [S]: context length including the new token */
    float *out;                  /* [S, H, D] */
    int64_t num_heads, num_kv_heads, head_dim, block_size, max_blocks, window;
    float scale;
    int64_t begin, end; /* work items [begin, end) of S * Hkv */
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

/* scores[g * n + t] = scale * dot(q[g], k[rows[t]]) for the group's query heads. With AVX2
 * four keys are dotted at once and their four horizontal sums share one reduction (a dot
 * product's reduction otherwise costs about as much as its multiply-adds). */
static void qk_scores(const float *q, int64_t group, int64_t D, const float *k,
                      const int64_t *rows, int64_t n, float scale, float *scores) {
    int64_t start = 0;
#if defined(__AVX2__) && defined(__FMA__)
    if (D % 8 == 0) {
        const __m128 vscale = _mm_set1_ps(scale);
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q + g * D;
            int64_t t = 0;
            for (; t + 4 <= n; t += 4) {
                const float *k0 = k + rows[t], *k1 = k + rows[t + 1];
                const float *k2 = k + rows[t + 2], *k3 = k + rows[t + 3];
                if (g == 0 && t + 8 < n) /* the first head's pass brings the rows in */
                    for (int64_t i = 4; i < 8; i++)
                        for (int64_t d = 0; d < D; d += 16)
                            _mm_prefetch((const char *)(k + rows[t + i] + d), _MM_HINT_T0);
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
                for (int64_t d = 0; d < D; d += 8) {
                    const __m256 qv = _mm256_loadu_ps(qg + d);
                    a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
                    a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
                    a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
                    a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
                }
                _mm_storeu_ps(scores + g * n + t, _mm_mul_ps(hsum4(a0, a1, a2, a3), vscale));
            }
            for (; t < n; t++) {
                float dot = 0.0f;
                for (int64_t d = 0; d < D; d++) dot += qg[d] * k[rows[t] + d];
                scores[g * n + t] = dot * scale;
            }
        }
        return;
    }
#endif
    for (int64_t t = start; t < n; t++) {
        const float *key = k + rows[t];
        for (int64_t g = 0; g < group; g++) {
            const float *qg = q + g * D;
            float dot = 0.0f;
            for (int64_t d = 0; d < D; d++) dot += qg[d] * key[d];
            scores[g * n + t] = dot * scale;
        }
    }
}

/* ATTEND(NAME, DIM) defines the attention of the `group` query heads sharing KV head h of
 * sequence s. DIM is a compile-time head size where one is given (64, 128: the inner loops
 * unroll into vector registers) and the runtime j->head_dim otherwise. Each K and V row is
 * loaded once and used by all the group's query heads. `rows` holds each context token's
 * offset in the cache (one block-table lookup per token), `scores` [group, n], `acc`
 * [group, D]; the softmax's 1/sum is applied once to the output. */
#define ATTEND(NAME, DIM)                                                                      \
    static void NAME(const job_t *j, int64_t s, int64_t h, int64_t *rows, float *scores,      \
                     float *acc) {                                                             \
        const int64_t D = (DIM), Hkv = j->num_kv_heads, bs = j->block_size;                    \
        const int64_t group = j->num_heads / Hkv, len = j->seq_lens[s];                        \
        const int64_t first = (j->window > 0 && len > j->window) ? len - j->window : 0;        \
        const int64_t n = len - first;                                                         \
        const int64_t *table = j->block_tables + s * j->max_blocks;                            \
        const float *q = j->q + (s * j->num_heads + h * group) * D;                            \
        for (int64_t t = 0; t < n; t++) {                                                      \
            const int64_t pos = first + t;                                                     \
            rows[t] = ((table[pos / bs] * bs + pos % bs) * Hkv + h) * D;                       \
        }                                                                                      \
        qk_scores(q, group, D, j->k, rows, n, j->scale, scores);                               \
        for (int64_t g = 0; g < group; g++) {                                                  \
            float *row = scores + g * n, top = row[0];                                         \
            for (int64_t t = 1; t < n; t++) top = row[t] > top ? row[t] : top;                 \
            for (int64_t t = 0; t < n; t++) row[t] = expf(row[t] - top);                       \
        }                                                                                      \
        for (int64_t i = 0; i < group * D; i++) acc[i] = 0.0f;                                 \
        for (int64_t t = 0; t < n; t++) {                                                      \
            const float *value = j->v + rows[t];                                               \
            for (int64_t g = 0; g < group; g++) {                                              \
                const float p = scores[g * n + t];                                             \
                float *a = acc + g * D;                                                        \
                for (int64_t d = 0; d < D; d++) a[d] += p * value[d];                          \
            }                                                                                  \
        }                                                                                      \
        for (int64_t g = 0; g < group; g++) {                                                  \
            const float *row = scores + g * n;                                                 \
            float sum = 0.0f;                                                                  \
            for (int64_t t = 0; t < n; t++) sum += row[t];                                     \
            const float inv = 1.0f / sum;                                                      \
            float *o = j->out + (s * j->num_heads + h * group + g) * D;                        \
            for (int64_t d = 0; d < D; d++) o[d] = acc[g * D + d] * inv;                       \
        }                                                                                      \
    }

ATTEND(attend_64, 64)
ATTEND(attend_128, 128)
ATTEND(attend_any, j->head_dim)

static void *run_job(void *arg) {
    job_t *j = (job_t *)arg;
    const int64_t Hkv = j->num_kv_heads, group = j->num_heads / Hkv;
    int64_t longest = 1;
    for (int64_t i = j->begin; i < j->end; i++)
        longest = j->seq_lens[i / Hkv] > longest ? j->seq_lens[i / Hkv] : longest;
    int64_t *rows = malloc(sizeof(int64_t) * longest);
    float *scores = malloc(sizeof(float) * group * longest);
    float *acc = malloc(sizeof(float) * group * j->head_dim);
    if (!rows || !scores || !acc) {
        j->status = 1;
    } else {
        void (*attend)(const job_t *, int64_t, int64_t, int64_t *, float *, float *) =
            j->head_dim == 64 ? attend_64 : j->head_dim == 128 ? attend_128 : attend_any;
        for (int64_t i = j->begin; i < j->end; i++) attend(j, i / Hkv, i % Hkv, rows, scores, acc);
    }
    free(rows);
    free(scores);
    free(acc);
    return NULL;
}

/* Returns 0 on success, 1 when memory ran out. */
int kvcli_paged_decode_attention(const float *q, const float *k, const float *v,
                                 const int64_t *block_tables, const int64_t *seq_lens, float *out,
                                 int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                 int64_t head_dim, int64_t block_size, int64_t max_blocks,
                                 int64_t window, float scale, int64_t num_threads) {
    enum { MAX_THREADS = 64 };
    job_t jobs[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    const int64_t items = num_seqs * num_kv_heads;
    if (num_threads > MAX_THREADS) num_threads = MAX_THREADS;
    if (num_threads > items) num_threads = items;
    if (num_threads < 1) num_threads = 1;
    /* Split items into contiguous ranges of about equal context length (the work). */
    int64_t total = 0;
    for (int64_t s = 0; s < num_seqs; s++) total += seq_lens[s] * num_kv_heads;
    int64_t item = 0, done = 0;
    for (int64_t t = 0; t < num_threads; t++) {
        job_t *j = &jobs[t];
        *j = (job_t){q, k, v, block_tables, seq_lens, out, num_heads, num_kv_heads, head_dim,
                     block_size, max_blocks, window, scale, item, item, 0};
        const int64_t target = total * (t + 1) / num_threads;
        while (item < items && (done < target || t == num_threads - 1)) {
            done += seq_lens[item / num_kv_heads];
            item++;
        }
        j->end = item;
    }
    int64_t started = 0;
    for (int64_t t = 1; t < num_threads; t++) {
        if (pthread_create(&threads[t], NULL, run_job, &jobs[t]) != 0) break;
        started = t;
    }
    for (int64_t t = started + 1; t < num_threads; t++) run_job(&jobs[t]); /* no thread: inline */
    run_job(&jobs[0]);
    int status = jobs[0].status;
    for (int64_t t = 1; t < num_threads; t++) {
        if (t <= started) pthread_join(threads[t], NULL);
        status |= jobs[t].status;
    }
    return status;
}
