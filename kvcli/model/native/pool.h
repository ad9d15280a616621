/* The native kernels' shared worker pool (pool.c). */
#ifndef KVCLI_POOL_H
#define KVCLI_POOL_H
#include <stdint.h>

/* Part `t` of `n` of one parallel job. */
typedef void (*task_fn)(const void *args, int64_t t, int64_t n);

/* Runs fn(args, t, n) for t in [0, n) on n threads (the caller is t = 0) and returns when all
 * are done. Runs them one after another on the caller when n <= 1, when another thread is
 * using the pool, or when no worker thread can be started. Afterwards the workers spin for
 * spin_ns waiting for the next job (KVCLI_SPIN_NS when another native call follows soon). */
void kvcli_parallel(task_fn fn, const void *args, int64_t n, int64_t spin_ns);

/* The same for a many-row call between torch ops (a prefill step): on torch's OpenMP team where
 * the process has one (pool.c), else on this pool. */
void kvcli_parallel_wide(task_fn fn, const void *args, int64_t n);

/* Splits items [0, n) into `threads` contiguous ranges of about equal total `lens` (the work,
 * e.g. each sequence's context length): range t is [ends[t - 1], ends[t]), range 0 starts at 0,
 * and the last range ends at n. */
static inline void kvcli_split_by_length(const int64_t *lens, int64_t n, int64_t threads,
                                         int64_t *ends) {
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) total += lens[i];
    int64_t item = 0, done = 0;
    for (int64_t t = 0; t < threads; t++) {
        const int64_t target = total * (t + 1) / threads;
        while (item < n && (done < target || t == threads - 1)) {
            done += lens[item];
            item++;
        }
        ends[t] = item;
    }
}

#define KVCLI_SPIN_NS 300000
/* Less work than this per thread (floats touched) is not worth waking a worker for. */
#define KVCLI_MIN_WORK_PER_THREAD (1 << 15)
/* Calls with at most this many rows are decode-sized: native work follows them. */
#define KVCLI_DECODE_ROWS 64

/* A call over `rows` rows: a decode-sized one on this pool, whose workers then spin for the
 * next native call; a many-row one wide (between torch ops). */
static inline void kvcli_parallel_rows(task_fn fn, const void *args, int64_t n, int64_t rows) {
    if (rows <= KVCLI_DECODE_ROWS) kvcli_parallel(fn, args, n, KVCLI_SPIN_NS);
    else kvcli_parallel_wide(fn, args, n);
}

#endif
