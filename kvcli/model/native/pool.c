/* Persistent worker threads for the native kernels.
 *
 * A decode step calls the kernels ~250 times (four matmuls, attention and three element-wise
 * passes per layer); starting threads per call (pthread_create, ~50-100 us) cost more than
 * small calls take. Workers wait on a generation counter: after a job they spin for as long
 * as its caller asked (decode-sized calls, which the next native call follows within
 * microseconds: 300 us), else ~20 us (a torch matmul follows in prefill steps, and a spinning
 * worker would take a core from it: prefill steps ~3% slower with 300 us), then sleep on a
 * futex, so an idle pool takes no CPU. The parts of a job are claimed, not assigned
 * (run_parts): no thread ever waits for one the scheduler has not run. Linux only (futex);
 * elsewhere the build fails and kvcli uses its torch path.
 */
#define _GNU_SOURCE
#include "pool.h"

#include <dlfcn.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define POOL_MAX 64
#define POOL_SLEEP_NS 20000 /* how long workers spin after a job that asks for no spin */

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static struct {
    _Atomic uint32_t gen;      /* bumped once per job; workers wait for it to change */
    _Atomic uint64_t claim;    /* (job's gen << 32) | next unclaimed part */
    _Atomic int64_t done;      /* parts of the current job finished */
    _Atomic int64_t sleepers;  /* workers in (or entering) futex wait: only then is a wake needed */
    _Atomic(task_fn) fn;
    _Atomic(const void *) args;
    _Atomic int64_t n;
    int64_t started, spin_ns;
    uint32_t start_gen[POOL_MAX]; /* the generation a new worker has already seen */
    pthread_mutex_t busy;
    int atfork_set;
    int team; /* kvcli_parallel_wide: -1 not looked up, 0 off or absent, 1 torch's team */
    int forked; /* in a forked child: never the team */
} pool = {.busy = PTHREAD_MUTEX_INITIALIZER, .team = -1};

/* Take parts of job `gen` until none is left. Any thread may run any part (the split itself is
 * the caller's, so results do not depend on who runs what): a worker the scheduler has not run
 * yet, as on a machine with another busy process, leaves its part to the others instead of
 * holding up the job. With static parts the caller waited for it: decode-1 3x slower there. */
static void run_parts(uint32_t gen) {
    for (;;) {
        uint64_t c = atomic_load_explicit(&pool.claim, memory_order_acquire);
        if ((uint32_t)(c >> 32) != gen) return;
        const int64_t part = (int64_t)(c & 0xffffffffu);
        const int64_t n = atomic_load_explicit(&pool.n, memory_order_relaxed);
        const task_fn fn = atomic_load_explicit(&pool.fn, memory_order_relaxed);
        const void *args = atomic_load_explicit(&pool.args, memory_order_relaxed);
        if (part >= n) return;
        /* Succeeds only while this job is current: the fields read above are its own. */
        if (!atomic_compare_exchange_weak(&pool.claim, &c, c + 1)) continue;
        fn(args, part, n);
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
    }
}

static void *worker(void *arg) {
    const int64_t id = (int64_t)(intptr_t)arg;
    uint32_t seen = pool.start_gen[id];
    for (;;) {
        uint32_t gen;
        int64_t spin_until = 0;
        for (int i = 0; (gen = atomic_load_explicit(&pool.gen, memory_order_acquire)) == seen; i++) {
            if ((i & 255) == 0) {
                const int64_t t = now_ns();
                if (spin_until == 0) spin_until = t + pool.spin_ns;
                else if (t > spin_until) {
                    atomic_fetch_add(&pool.sleepers, 1); /* seq_cst: ordered with gen's bump */
                    syscall(SYS_futex, &pool.gen, FUTEX_WAIT_PRIVATE, seen, NULL, NULL, 0);
                    atomic_fetch_sub(&pool.sleepers, 1);
                    spin_until = 0;
                    continue;
                }
            }
            cpu_relax();
        }
        seen = gen;
        run_parts(gen);
    }
    return NULL;
}

/* A forked child has none of the parent's threads: start over (and unlock the pool, which the
 * parent may have held while forking). */
static void after_fork_in_child(void) {
    pool.started = 0;
    pthread_mutex_init(&pool.busy, NULL);
    pool.team = 0, pool.forked = 1; /* an OpenMP team does not survive a fork */
}

/* Until every part is done. A part a descheduled worker has started cannot be taken over, so
 * after a short spin the caller yields its core (to that worker, if they share it). */
static void wait_done(int64_t n) {
    for (int i = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < n; i++) {
        if (i >= 4096) sched_yield();
        else cpu_relax();
    }
}

static void watch_forks(void) {
    if (!pool.atfork_set) pool.atfork_set = pthread_atfork(NULL, NULL, after_fork_in_child) == 0;
}

void kvcli_parallel(task_fn fn, const void *args, int64_t n, int64_t spin_ns) {
    if (n > POOL_MAX) n = POOL_MAX;
    if (n <= 1 || pthread_mutex_trylock(&pool.busy) != 0) {
        const int64_t parts = n < 1 ? 1 : n;
        for (int64_t t = 0; t < parts; t++) fn(args, t, parts);
        return;
    }
    watch_forks();
    while (pool.started < n - 1) {
        pthread_t id;
        const int64_t next = pool.started + 1;
        pool.start_gen[next] = atomic_load(&pool.gen);
        if (pthread_create(&id, NULL, worker, (void *)(intptr_t)next) != 0) break;
        pthread_detach(id);
        pool.started = next;
    }
    const uint32_t gen = atomic_load(&pool.gen) + 1;
    atomic_store_explicit(&pool.fn, fn, memory_order_relaxed);
    atomic_store_explicit(&pool.args, args, memory_order_relaxed);
    atomic_store_explicit(&pool.n, n, memory_order_relaxed);
    pool.spin_ns = spin_ns > POOL_SLEEP_NS ? spin_ns : POOL_SLEEP_NS;
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    atomic_store_explicit(&pool.claim, (uint64_t)gen << 32, memory_order_release);
    atomic_store(&pool.gen, gen); /* seq_cst: a worker either sees it or is counted asleep */
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.gen, FUTEX_WAKE_PRIVATE, POOL_MAX, NULL, NULL, 0);
    run_parts(gen);
    wait_done(n);
    pthread_mutex_unlock(&pool.busy);
}

/* Many-row calls between torch's ops in a prefill step run on torch's own OpenMP team (libgomp's
 * GOMP_parallel, found in the process where torch loaded it): after a torch op its threads spin
 * (GOMP_SPINCOUNT, kvcli/__init__.py), and a spinning thread took a core from this pool's
 * worker for the first ~0.5 ms of each native call, three times a layer. The parts are claimed
 * as in run_parts. Decode-sized calls keep this pool: native calls follow each other there. */
typedef void (*gomp_parallel_fn)(void (*)(void *), void *, unsigned, unsigned);
static gomp_parallel_fn gomp_parallel;

typedef struct {
    task_fn fn;
    const void *args;
    int64_t n;
    _Atomic int64_t next;
} team_job;

static void team_part(void *arg) {
    team_job *j = (team_job *)arg;
    for (int64_t part; (part = atomic_fetch_add(&j->next, 1)) < j->n;) j->fn(j->args, part, j->n);
}

static int team_ready(void) {
    if (pool.team < 0 && pool.forked) pool.team = 0;
    if (pool.team < 0) {
        gomp_parallel = (gomp_parallel_fn)dlsym(RTLD_DEFAULT, "GOMP_parallel");
        pool.team = gomp_parallel != NULL;
    }
    return pool.team;
}

/* Set by kvcli_pool_wide for the calling thread's forward (native.own_pool): its many-row calls
 * run on this pool too. Its workers then spin ~20 us, as after any many-row call: spinning
 * 300 us (KVCLI_SPIN_NS) was no faster on a quiet host and slower beside a busy core. */
static _Thread_local int wide_on_pool;

void kvcli_parallel_wide(task_fn fn, const void *args, int64_t n) {
    if (wide_on_pool || !team_ready() || n <= 1 || n > POOL_MAX) {
        kvcli_parallel(fn, args, n, 0);
        return;
    }
    watch_forks(); /* a forked child runs its calls on this pool */
    team_job j = {fn, args, n, 0};
    gomp_parallel(team_part, &j, (unsigned)n, 0);
}

/* 1: kvcli_parallel_wide runs on torch's OpenMP team where the process has one; 0: on this
 * pool (tests and measurements compare the two). Returns whether the team is used. */
int64_t kvcli_pool_team(int64_t on) {
    pool.team = on ? -1 : 0;
    return team_ready();
}

/* 1: the calling thread's many-row calls run on this pool, not torch's team: a forward whose
 * torch ops run on one thread (every matmul native; routes.own_pool), so no team thread spins
 * and, on a machine with a busy core, no call waits at the team's barrier for a thread the
 * scheduler has not run (GOMP_parallel's end). Returns the previous setting. */
int64_t kvcli_pool_wide(int64_t on) {
    const int64_t was = wide_on_pool;
    wide_on_pool = on != 0;
    return was;
}

/* Which variant of the kernels this build holds: they are compiled on the machine with
 * -march=native (the cache key includes the CPU's flags), so this is the running CPU's. */
const char *kvcli_isa(void) {
#if defined(__AVX512F__)
    return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
    return "avx2+fma";
#elif defined(__aarch64__)
    return "neon";
#else
    return "generic";
#endif
}
