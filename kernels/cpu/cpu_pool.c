/* The thread pool shared by all ops: n-1 persistent workers plus the calling thread.
 *
 * A per-token matvec is ~50 us of work, so dispatch must cost well under a microsecond:
 * the caller publishes a job by bumping a generation counter; workers spin on it for a short
 * while (the next op of a forward pass follows within microseconds) and then sleep on a
 * futex. The spell is bounded in time, not in polls: a pool with no work parks within
 * SPIN_NS, so an idle stage of a ring costs no CPU and leaves the cores to the stage that has
 * the work (a count of sched_yield calls lasted milliseconds on a busy machine). The
 * caller runs its share and spins until every worker has checked in. One job at a time per
 * pool: ops on one pool must not be called concurrently.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#elif defined(__aarch64__)
/* the spin-wait hint: lets an SMT sibling (or qemu's translated loop) run */
#define CPU_RELAX() __asm__ __volatile__("yield" ::: "memory")
#else
#define CPU_RELAX() ((void)0)
#endif

#include "kernels/internal.h"

/* A waiting worker pauses briefly, then yields between polls (so on a busy machine the
 * thread that will publish the next job gets the core) until SPIN_NS have passed since its
 * last job, then sleeps on the futex. The gap between two ops of one forward pass is a few
 * microseconds; the gap between two tokens of a ring stage is the other stages' time. */
#define SPIN_PAUSES 300
#define SPIN_NS 200000

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Job state bits. A static job (kern__pool_run) is run by every thread and the caller waits
 * for all of them. A dynamic one (kern__pool_run_dyn) hands out its work itself, so the
 * caller alone can finish it: a worker joins only while the job is open and the caller, its
 * share done, waits for the workers inside and then closes it; a worker that was not running
 * (a busy machine) is not waited for. */
#define JOB_DYN ((uint64_t)1 << 31)
#define JOB_CLOSED ((uint64_t)1 << 30)
#define JOB_ACTIVE ((uint64_t)0xFFFF)

struct kern_pool {
    int n_threads;
    pthread_t *threads;
    _Atomic uint32_t gen;     /* bumped once per job; futex word */
    /* The current job: id << 32 | JOB_DYN | JOB_CLOSED | workers inside (dynamic jobs). */
    _Atomic uint64_t state;
    _Atomic int done;         /* workers finished with the current (static) job */
    _Atomic int sleepers;     /* workers blocked in futex_wait */
    _Atomic bool quit;
    kern__task_fn fn;
    void *ctx;
    void *scratch;            /* reserved buffer the ops share (kern_pool_reserve) */
    size_t scratch_size;
};

struct worker_arg {
    struct kern_pool *p;
    int ith;
};

static void futex_wait(_Atomic uint32_t *addr, uint32_t val)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT_PRIVATE, val, NULL, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *addr)
{
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
}

static void *worker_main(void *arg)
{
    struct worker_arg wa = *(struct worker_arg *)arg;
    free(arg);
    struct kern_pool *p = wa.p;
    /* Job 0 is "no job yet": a worker that starts late still sees the first job. The job id
     * is read from the state word (published before gen, the futex word). */
    uint32_t seen = 0;
    for (;;) {
        uint64_t st, t_idle = 0;
        int spins = 0;
        while ((uint32_t)((st = atomic_load_explicit(&p->state, memory_order_acquire)) >> 32) ==
               seen) {
            if (++spins < SPIN_PAUSES) {
                CPU_RELAX();
                continue;
            }
            if (!t_idle)
                t_idle = mono_ns();
            if (mono_ns() - t_idle < SPIN_NS) {
                sched_yield();
                continue;
            }
            atomic_fetch_add(&p->sleepers, 1);
            if ((uint32_t)(atomic_load(&p->state) >> 32) == seen)
                futex_wait(&p->gen, seen);
            atomic_fetch_sub(&p->sleepers, 1);
            spins = 0;
            t_idle = 0;
        }
        seen = (uint32_t)(st >> 32);
        if (atomic_load_explicit(&p->quit, memory_order_acquire))
            return NULL;
        if (!(st & JOB_DYN)) {
            /* static: the caller waits for every worker, so the job cannot have moved on */
            p->fn(p->ctx, wa.ith, p->n_threads);
            atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel);
            continue;
        }
        /* dynamic: join while the job is open; fn and ctx stay put while anyone is inside */
        while ((st & JOB_DYN) && !(st & JOB_CLOSED) && (uint32_t)(st >> 32) == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &st, st + 1,
                                                      memory_order_acq_rel,
                                                      memory_order_acquire)) {
                p->fn(p->ctx, wa.ith, p->n_threads);
                atomic_fetch_sub_explicit(&p->state, 1, memory_order_acq_rel);
                break;
            }
        }
    }
}

/* Publish job g: the state word first (what workers read), then the futex word. The release
 * store of state orders the plain writes of fn, ctx and the job's counters before it; a
 * worker's acquire load (or acq_rel CAS) of state that sees job g sees them. The sleeper
 * count and gen are seq_cst: a worker that counted itself a sleeper before we read the count
 * is woken; one that counts itself after it finds the new job, in state or at the latest in
 * futex_wait, whose check of gen (stored before we read the count) then fails. */
static void publish(struct kern_pool *p, uint64_t flags)
{
    uint32_t g = atomic_load_explicit(&p->gen, memory_order_relaxed) + 1;
    if (g == 0)
        g = 1; /* 0 is "no job yet" */
    atomic_store_explicit(&p->state, (uint64_t)g << 32 | flags, memory_order_release);
    atomic_store(&p->gen, g);
    if (atomic_load(&p->sleepers) > 0)
        futex_wake_all(&p->gen);
}

void kern__pool_run(struct kern_pool *p, kern__task_fn fn, void *ctx)
{
    if (!p || p->n_threads <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    publish(p, 0);
    fn(ctx, 0, p->n_threads);
    int want = p->n_threads - 1, spins = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < want) {
        CPU_RELAX();
        if (++spins > 200) /* a descheduled worker: let it have the core */
            sched_yield();
    }
}

void kern__pool_run_dyn(struct kern_pool *p, kern__task_fn fn, void *ctx)
{
    if (!p || p->n_threads <= 1) {
        fn(ctx, 0, 1);
        return;
    }
    /* the previous job is closed (or static and finished): nobody reads fn/ctx now */
    p->fn = fn;
    p->ctx = ctx;
    publish(p, JOB_DYN);
    fn(ctx, 0, p->n_threads);
    /* all work is handed out; wait for the workers still inside, then shut the door */
    int spins = 0;
    uint64_t st = atomic_load_explicit(&p->state, memory_order_acquire);
    for (;;) {
        if (!(st & JOB_ACTIVE)) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &st, st | JOB_CLOSED,
                                                      memory_order_acq_rel,
                                                      memory_order_acquire))
                break;
            continue;
        }
        CPU_RELAX();
        if (++spins > 200) /* a descheduled worker: let it have the core */
            sched_yield();
        st = atomic_load_explicit(&p->state, memory_order_acquire);
    }
}

void *kern__pool_scratch(struct kern_pool *p, size_t size)
{
    return size <= p->scratch_size ? p->scratch : NULL;
}

int kern_pool_reserve(struct kern_pool *p, size_t bytes)
{
    if (bytes <= p->scratch_size)
        return 0;
    if (bytes > SIZE_MAX - 4095)
        return -ENOMEM;
    bytes = (bytes + 4095) & ~(size_t)4095;
    void *n = NULL;
    if (posix_memalign(&n, 64, bytes) != 0)
        return -ENOMEM;
    free(p->scratch);
    p->scratch = n;
    p->scratch_size = bytes;
    return 0;
}

/* CPUs this process may run on (its affinity mask, so a cpuset is respected), else online. */
static int usable_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int kern_pool_new(struct kern_pool **out, int n_threads)
{
    if (n_threads <= 0)
        n_threads = usable_cpus();
    if (n_threads > 512)
        n_threads = 512;
    struct kern_pool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->n_threads = n_threads;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads)
            goto fail_free;
        for (int i = 1; i < n_threads; i++) {
            struct worker_arg *wa = malloc(sizeof *wa);
            if (wa) {
                wa->p = p;
                wa->ith = i;
            }
            int rc = wa ? pthread_create(&p->threads[i - 1], NULL, worker_main, wa) : ENOMEM;
            if (rc != 0) {
                free(wa);
                p->n_threads = i; /* stop the ones started */
                kern_pool_free(p);
                return -rc;
            }
        }
    }
    *out = p;
    return 0;
fail_free:
    free(p);
    return -ENOMEM;
}

void kern_pool_free(struct kern_pool *p)
{
    if (!p)
        return;
    if (p->threads) {
        atomic_store(&p->quit, true);
        publish(p, 0);
        futex_wake_all(&p->gen);
        for (int i = 1; i < p->n_threads; i++)
            pthread_join(p->threads[i - 1], NULL);
        free(p->threads);
    }
    free(p->scratch);
    free(p);
}

int kern_pool_threads(const struct kern_pool *p)
{
    return p ? p->n_threads : 1;
}
