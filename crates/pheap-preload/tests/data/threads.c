/* A multi-threaded program under LD_PRELOAD=libtiermem_pheap_preload.so: WORKERS threads
 * allocate, fill, check, resize and free objects as fast as they can, REWRITERS threads
 * rewrite their objects without allocator calls, one thread sleeps
 * in nanosleep and one is blocked in read(2) on a pipe, so checkpoints (safepoints) land in
 * allocator calls, in the middle of writes and in system calls. Every object holds a pattern
 * derived from its seed; a thread checks it before every realloc and free, so a checkpoint
 * that disturbed a thread's memory is caught. With FORKS, the main thread forks that many
 * children while the others run; each checks the rewriters' objects in its copy of the heap.
 * Usage: threads ITERATIONS (0 = until killed) [FORKS].
 * Prints "threads ok". */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>

enum { WORKERS = 2, REWRITERS = 2, SLOTS = 512 };

static long iterations;
static int pipefd[2];
static volatile int done; /* set when the workers are done */

struct obj {
    unsigned char *p;
    size_t size;
    uint32_t seed;
    volatile int busy; /* set while the object is being rewritten */
};

/* The rewriters' objects, global so that a forked child can check them (its copy of this
 * array is the parent's at the instant of the fork). */
static struct obj rw_objs[2][512];

static uint32_t next(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}

static void fill(unsigned char *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 31);
}

static int intact(const unsigned char *p, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(seed + i * 31)) return 0;
    return 1;
}

static void fail(const char *what, long it) {
    fprintf(stderr, "threads: %s at iteration %ld\n", what, it);
    exit(1);
}

static void *worker(void *arg) {
    uint32_t rng = 0x9e3779b9u * (uint32_t)(uintptr_t)(arg) + 1;
    struct obj o[SLOTS];
    memset(o, 0, sizeof o);
    for (long it = 0; iterations == 0 || it < iterations; it++) {
        struct obj *s = &o[next(&rng) % SLOTS];
        uint32_t r = next(&rng);
        /* Mostly small objects, some of several pages. */
        size_t size = (r % 16 == 0) ? 4096 + r % 20000 : 1 + r % 700;
        if (s->p && !intact(s->p, s->size, s->seed)) fail("object damaged", it);
        if (s->p && r % 3 == 0) {
            unsigned char *q = realloc(s->p, size);
            if (!q) fail("realloc failed", it);
            size_t keep = s->size < size ? s->size : size;
            if (!intact(q, keep, s->seed)) fail("realloc lost contents", it);
            s->p = q;
        } else {
            free(s->p);
            s->p = malloc(size);
            if (!s->p) fail("malloc failed", it);
        }
        s->size = size;
        s->seed = next(&rng);
        fill(s->p, size, s->seed);
    }
    for (int i = 0; i < SLOTS; i++) {
        if (o[i].p && !intact(o[i].p, o[i].size, o[i].seed)) fail("object damaged at the end", -1);
        free(o[i].p);
    }
    return NULL;
}

/* Allocates its objects once, then only rewrites them (checking each first) until the
 * allocating workers are done: writes that no allocator call ever interrupts, so only a
 * safepoint stops them during a checkpoint. */
static void *rewriter(void *arg) {
    uint32_t rng = 0x85ebca6bu * (uint32_t)(uintptr_t)(arg) + 1;
    struct obj *o = rw_objs[(uintptr_t)arg - 1];
    for (int i = 0; i < SLOTS; i++) {
        o[i].busy = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        o[i].size = 1 + next(&rng) % 1500;
        o[i].seed = next(&rng);
        o[i].p = malloc(o[i].size);
        if (!o[i].p) fail("malloc failed", -1);
        fill(o[i].p, o[i].size, o[i].seed);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        o[i].busy = 0;
    }
    for (long it = 0; !done; it++) {
        struct obj *t = &o[next(&rng) % SLOTS];
        if (!intact(t->p, t->size, t->seed)) fail("rewritten object damaged", it);
        t->busy = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        t->seed = next(&rng);
        fill(t->p, t->size, t->seed);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        t->busy = 0;
    }
    for (int i = 0; i < SLOTS; i++) free(o[i].p);
    return NULL;
}

static void *sleeper(void *arg) {
    (void)arg;
    struct timespec ts = {0, 1000000};
    while (!done) nanosleep(&ts, NULL);
    return NULL;
}

static void *reader(void *arg) {
    (void)arg;
    char c;
    ssize_t n;
    do n = read(pipefd[0], &c, 1);
    while (n < 0);
    return NULL;
}

/* Forked while the others write: the child's heap must be the parent's at the instant of the
 * fork, so every rewriter object not being rewritten then holds its pattern. Returns the
 * number of children that found a damaged object or failed. */
static int fork_checks(int n) {
    int bad = 0;
    for (int i = 0; i < n; i++) {
        struct timespec ts = {0, 3000000};
        nanosleep(&ts, NULL);
        pid_t pid = fork();
        if (pid < 0) return n;
        if (pid == 0) {
            int damaged = 0;
            for (int r = 0; r < REWRITERS; r++)
                for (int k = 0; k < SLOTS; k++) {
                    struct obj *t = &rw_objs[r][k];
                    if (t->p && !t->busy && !intact(t->p, t->size, t->seed)) damaged++;
                }
            _exit(damaged ? 1 : 0);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
    }
    return bad;
}

int main(int argc, char **argv) {
    iterations = argc > 1 ? atol(argv[1]) : 200000;
    int forks = argc > 2 ? atoi(argv[2]) : 0;
    if (pipe(pipefd) != 0) return 2;
    pthread_t w[WORKERS], rw[REWRITERS], sl, rd;
    if (pthread_create(&sl, NULL, sleeper, NULL) || pthread_create(&rd, NULL, reader, NULL)) return 2;
    for (long i = 0; i < REWRITERS; i++)
        if (pthread_create(&rw[i], NULL, rewriter, (void *)(i + 1))) return 2;
    for (long i = 0; i < WORKERS; i++)
        if (pthread_create(&w[i], NULL, worker, (void *)(i + 1))) return 2;
    int bad_forks = forks ? fork_checks(forks) : 0;
    for (int i = 0; i < WORKERS; i++) pthread_join(w[i], NULL);
    done = 1;
    if (write(pipefd[1], "x", 1) != 1) return 2;
    for (int i = 0; i < REWRITERS; i++) pthread_join(rw[i], NULL);
    pthread_join(sl, NULL);
    pthread_join(rd, NULL);
    if (bad_forks) {
        fprintf(stderr, "threads: %d of %d forked children found a torn heap\n", bad_forks, forks);
        return 1;
    }
    printf("threads ok\n");
    return 0;
}
