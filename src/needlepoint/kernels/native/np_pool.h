/* The library's one worker pool: every split of a call's work between
 * threads (the rows of a product, the attention rows and MLP rows of the Needle 3 step, the
 * int8 products' output groups) runs here instead of on threads created per call.
 *
 * np_pool_run(fn, ctx, n, shares) runs fn(ctx, lo, hi, share) over [0, n) cut into `shares`
 * contiguous ranges, share 0 on the calling thread, the others on parked workers, and
 * returns when every range is done. The ranges are the same as the former per-call threads'
 * (n * i / shares .. n * (i + 1) / shares) and every item is computed whole by one thread, so
 * the bits depend neither on the share count nor on which thread ran a range.
 *
 * State: one pool per process, started lazily by the first call that asks for more than one
 * share, grown to the largest share count asked for (at most NP_POOL_MAX); its workers park
 * on a condition variable between jobs (no spinning) and live until the process exits. This
 * is the library's only shared mutable state besides the variant pick: a pool per model
 * handle would need a create/destroy pair in the ABI and would not bound the process's
 * threads when several models are loaded. One job runs at a time: a call that finds the pool
 * busy (another Python thread's call in flight, or a call from inside a job) runs all its
 * ranges on its own thread, with the same bits. A forked child starts its own pool on first
 * use (the parent's workers do not exist there). */
#include <unistd.h>

#define NP_POOL_MAX 16
/* The least work (multiply-adds) a weight product splits between threads. Waking a parked
 * worker and waiting for it costs tens of microseconds on a VM (an idle vCPU must be woken
 * by the host), so a split pays only on a product that takes a thread a few hundred:
 * measured on the shipped geometry (docs/benchmarks_pool.md), with 1 << 20 a 2-thread
 * decode step took 7.2 ms against 5.1 ms at 1 thread (each block's 1.2 M-weight q|k|v|gate
 * product split at one row); with 1 << 22 only the LM head's one-row product splits. Prefill
 * chunks and many sessions' steps are far above it. (Attention and MLP rows keep their own
 * thresholds, np_v3_block.h / np_v3_rows.h.) The count never changes the bits: every output
 * is computed whole by one thread. */
#define NP_POOL_MIN_WORK (1 << 22)

typedef void (*np_pool_fn)(void *ctx, int64_t lo, int64_t hi, int64_t share);

typedef struct {
    pthread_mutex_t lock; /* guards every field below */
    pthread_cond_t wake, done;
    int workers;          /* started workers: shares 1 .. workers */
    uint64_t generation;  /* bumped for every job: a parked worker wakes on a new value */
    uint64_t born[NP_POOL_MAX]; /* the generation when each worker was started */
    int pending;          /* ranges of the current job not finished yet */
    np_pool_fn fn;        /* the current job */
    void *ctx;
    int64_t n;
    int shares;
    pid_t pid;            /* the process the workers belong to */
} np_pool_state;

static np_pool_state np_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                                 PTHREAD_COND_INITIALIZER, 0, 0, {0}, 0, NULL, NULL, 0, 0, 0};
static pthread_mutex_t np_pool_busy = PTHREAD_MUTEX_INITIALIZER; /* one job at a time */

static void *np_pool_worker(void *arg) {
    const int share = (int)(intptr_t)arg;
    pthread_mutex_lock(&np_pool.lock);
    uint64_t seen = np_pool.born[share]; /* a job posted before this thread ran is its own */
    for (;;) {
        while (np_pool.generation == seen) pthread_cond_wait(&np_pool.wake, &np_pool.lock);
        seen = np_pool.generation;
        if (share >= np_pool.shares) continue; /* not part of this job */
        np_pool_fn fn = np_pool.fn;
        void *ctx = np_pool.ctx;
        int64_t n = np_pool.n, shares = np_pool.shares;
        pthread_mutex_unlock(&np_pool.lock);
        fn(ctx, n * share / shares, n * (share + 1) / shares, share);
        pthread_mutex_lock(&np_pool.lock);
        if (--np_pool.pending == 0) pthread_cond_signal(&np_pool.done);
    }
    return NULL;
}

/* fork(): wait for the job in flight to end and hold the pool across the fork; the child
 * gets fresh locks and condition variables (the parent's workers and any waiter state they
 * left do not exist there) and starts its own workers on first use. */
static void np_pool_prepare(void) {
    pthread_mutex_lock(&np_pool_busy);
    pthread_mutex_lock(&np_pool.lock);
}

static void np_pool_parent(void) {
    pthread_mutex_unlock(&np_pool.lock);
    pthread_mutex_unlock(&np_pool_busy);
}

static void np_pool_child(void) {
    pthread_mutex_init(&np_pool.lock, NULL);
    pthread_mutex_init(&np_pool_busy, NULL);
    pthread_cond_init(&np_pool.wake, NULL);
    pthread_cond_init(&np_pool.done, NULL);
    np_pool.workers = 0;
    np_pool.pid = getpid();
}

/* Workers up to `want` (called with np_pool.lock held); returns how many run. */
static int np_pool_grow(int want) {
    if (np_pool.pid != getpid()) { /* first use (a child resets pid in np_pool_child) */
        if (np_pool.pid == 0) pthread_atfork(np_pool_prepare, np_pool_parent, np_pool_child);
        np_pool.workers = 0;
        np_pool.pid = getpid();
    }
    while (np_pool.workers < want) {
        np_pool.born[np_pool.workers + 1] = np_pool.generation;
        pthread_t id;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&id, &attr, np_pool_worker,
                                    (void *)(intptr_t)(np_pool.workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        np_pool.workers++;
    }
    return np_pool.workers;
}

static void np_pool_run(np_pool_fn fn, void *ctx, int64_t n, int shares) {
    if (shares > NP_POOL_MAX) shares = NP_POOL_MAX;
    if (shares > n) shares = (int)n;
    if (shares <= 1 || pthread_mutex_trylock(&np_pool_busy) != 0) {
        if (n > 0) fn(ctx, 0, n, 0); /* alone, or the pool is busy: every range here */
        return;
    }
    pthread_mutex_lock(&np_pool.lock);
    int workers = np_pool_grow(shares - 1);
    if (workers < shares - 1) { /* could not start enough threads: fewer, larger ranges */
        shares = workers + 1;
        if (shares <= 1) {
            pthread_mutex_unlock(&np_pool.lock);
            pthread_mutex_unlock(&np_pool_busy);
            fn(ctx, 0, n, 0);
            return;
        }
    }
    np_pool.fn = fn, np_pool.ctx = ctx, np_pool.n = n, np_pool.shares = shares;
    np_pool.pending = shares - 1;
    np_pool.generation++;
    pthread_cond_broadcast(&np_pool.wake);
    pthread_mutex_unlock(&np_pool.lock);
    fn(ctx, 0, n / shares, 0);
    pthread_mutex_lock(&np_pool.lock);
    while (np_pool.pending > 0) pthread_cond_wait(&np_pool.done, &np_pool.lock);
    pthread_mutex_unlock(&np_pool.lock);
    pthread_mutex_unlock(&np_pool_busy);
}
