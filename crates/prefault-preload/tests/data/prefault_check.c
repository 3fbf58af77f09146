/* prefault_check.c — the checks tests/checks.rs runs under libtiermem_prefault_preload.so.
 *
 * Usage: prefault_check MODE [ARG...]
 *   ops DIR [K]   munmap / mremap / MADV_DONTNEED / mprotect(PROT_NONE) / MAP_FIXED file
 *                 mapping over the upper part of a region the service is populating (run with
 *                 an ascending order and a window smaller than the lower part), then the lower
 *                 part touched: afterwards nothing is populated in the upper part (page
 *                 presence from /proc/self/pagemap), and the file mapping holds the file's
 *                 bytes. K: only the K-th of those five.
 *   writers       threads writing every byte of their pages (random order) while the service
 *                 populates the same region, and a malloc block grown by realloc: no byte lost.
 *   zero          pages the service populated and nobody touched read zero.
 *   fork N EXPECT N forks while the service populates and another thread maps, unmaps,
 *                 allocates and frees; each child allocates, maps, unmaps and frees under an
 *                 alarm (a deadlock kills it), and checks that the library serves it (EXPECT 1)
 *                 or not (EXPECT 0).
 *   plain         the library does not serve (a malformed variable, DISABLE): big allocations
 *                 and mappings still work.
 *   heap          small allocations grow [heap]; all freed, malloc_trim, grown again.
 *
 * Prints one "ok ..." line and exits 0, or prints what failed on stderr and exits 1. Waiting
 * for the service is counted in its passes (tiermem_prefault_preload_passes), never in time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define PAGE 4096UL
#define MIB (1UL << 20)

static int pagemap = -1;
static uint64_t (*passes_fn)(void);
static int (*active_fn)(void);
static uint64_t (*populated_fn)(void);

static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "prefault_check: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static int active(void) { return active_fn ? active_fn() : 0; }

static uint64_t passes(void) {
    if (!passes_fn)
        die("tiermem_prefault_preload_passes not found: not run under the preload library");
    return passes_fn();
}

/* Until the service has made n more passes (looked at every region since). */
static void wait_passes(uint64_t n) {
    uint64_t p0 = passes();
    for (long i = 0; i < 2000000; i++) {
        if (passes() >= p0 + n)
            return;
        usleep(50);
    }
    die("the service made no %lu passes", (unsigned long)n);
}

/* Pages of [addr, addr+len) present (or swapped), from /proc/self/pagemap. */
static size_t count_present(const void *addr, size_t len) {
    static uint64_t buf[4096];
    size_t pages = len / PAGE, n = 0;
    uintptr_t first = (uintptr_t)addr / PAGE;
    for (size_t i = 0; i < pages; i += 4096) {
        size_t k = pages - i < 4096 ? pages - i : 4096;
        ssize_t r = pread(pagemap, buf, k * 8, (off_t)((first + i) * 8));
        if (r != (ssize_t)(k * 8))
            die("pread /proc/self/pagemap: %s", strerror(errno));
        for (size_t j = 0; j < k; j++)
            n += (buf[j] >> 63 & 1) | (buf[j] >> 62 & 1);
    }
    return n;
}

static char *map_rw(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        die("mmap %zu: %s", len, strerror(errno));
    return p;
}

/* Until the service has populated something in [p, p+len) (nobody else touches it). */
static size_t wait_populated(const void *p, size_t len) {
    for (int i = 0; i < 5000; i++) {
        size_t n = count_present(p, len);
        if (n > 0)
            return n;
        wait_passes(1);
    }
    die("the service populated nothing in a registered region");
    return 0;
}

/* Maps [t, t+len) again as 128 KiB anonymous read-write pieces: each below
 * TIERMEM_PREFAULT_MIN, so none is registered — a stale registration would populate them. */
static void fill_pieces(char *t, size_t len) {
    for (size_t off = 0; off < len; off += 128 << 10) {
        void *p = mmap(t + off, 128 << 10, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (p != t + off)
            die("mmap MAP_FIXED piece: %s", strerror(errno));
    }
}

static uint64_t stamp(size_t off) { return (uint64_t)off * 0x9E3779B97F4A7C15ull ^ 0xA5A5A5A5ull; }

enum { OP_MUNMAP, OP_MREMAP, OP_DONTNEED, OP_MPROTECT, OP_FIXED_FILE, OP_COUNT };
static const char *op_name[] = {"munmap", "mremap", "MADV_DONTNEED", "mprotect(PROT_NONE)",
                                "MAP_FIXED file mapping"};

static int mode_ops(const char *dir, int only) {
    const size_t R = 32 * MIB, T = 8 * MIB, TL = 8 * MIB;
    char path[4096];
    snprintf(path, sizeof path, "%s/prefault_check.data", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        die("open %s: %s", path, strerror(errno));
    {
        uint64_t *w = malloc(MIB);
        for (size_t off = 0; off < TL; off += MIB) {
            for (size_t i = 0; i < MIB / 8; i++)
                w[i] = stamp(off + i * 8);
            if (pwrite(fd, w, MIB, (off_t)off) != (ssize_t)MIB)
                die("pwrite: %s", strerror(errno));
        }
        free(w);
    }
    int rounds = 0;
    size_t seen_before = 0;
    for (int round = 0; round < 6; round++) {
        for (int op = 0; op < OP_COUNT; op++) {
            if (only >= 0 && op != only)
                continue;
            char *r = map_rw(R);
            seen_before += wait_populated(r, R);
            /* Mid-pass: right away, or a pass or two later. */
            if (round % 3)
                wait_passes(round % 3);
            char *t = r + T, *dst = NULL;
            size_t expect = 0;
            switch (op) {
            case OP_MUNMAP:
                if (munmap(t, TL))
                    die("munmap: %s", strerror(errno));
                fill_pieces(t, TL);
                break;
            case OP_MREMAP:
                t[100] = 0x5a;
                dst = mmap(NULL, TL, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                if (dst == MAP_FAILED)
                    die("mmap: %s", strerror(errno));
                if (mremap(t, TL, TL, MREMAP_MAYMOVE | MREMAP_FIXED, dst) != dst)
                    die("mremap: %s", strerror(errno));
                if (dst[100] != 0x5a)
                    die("mremap lost a byte");
                fill_pieces(t, TL);
                break;
            case OP_DONTNEED:
                if (madvise(t, TL, MADV_DONTNEED))
                    die("madvise: %s", strerror(errno));
                if (count_present(t, TL))
                    die("pages present right after MADV_DONTNEED");
                break;
            case OP_MPROTECT:
                if (mprotect(t, TL, PROT_NONE))
                    die("mprotect: %s", strerror(errno));
                expect = count_present(t, TL);
                /* Writable again at once (a service still holding the range would go on
                 * populating it) or after some passes (one that tried would have failed). */
                if (round & 1)
                    wait_passes(3);
                if (mprotect(t, TL, PROT_READ | PROT_WRITE))
                    die("mprotect: %s", strerror(errno));
                break;
            case OP_FIXED_FILE:
                if (mmap(t, TL, PROT_READ | PROT_WRITE,
                         (round & 1 ? MAP_SHARED : MAP_PRIVATE) | MAP_FIXED, fd, 0) != t)
                    die("mmap file MAP_FIXED: %s", strerror(errno));
                break;
            }
            /* Drive the window on: touch every page below the range, as an application
             * filling the region would. A registration still covering the range would be
             * populated into it now (the window follows the touches and jumps ahead of them). */
            for (size_t off = 0; off < T; off += PAGE)
                r[off] = 1;
            wait_passes(3);
            size_t after = count_present(t, TL);
            if (after != expect)
                die("%s (round %d): %zu pages of the range present after the call and 3 passes, "
                    "expected %zu", op_name[op], round, after, expect);
            if (op == OP_FIXED_FILE) {
                const uint64_t *w = (const uint64_t *)t;
                for (size_t i = 0; i < TL / 8; i++)
                    if (w[i] != stamp(i * 8))
                        die("file mapping: byte %zu is not the file's", i * 8);
            } else if (op == OP_MPROTECT) {
                for (size_t i = 0; i < TL; i++)
                    if (t[i])
                        die("mprotect: byte %zu is not zero", i);
            }
            if (munmap(r, R))
                die("munmap: %s", strerror(errno));
            if (dst && munmap(dst, TL))
                die("munmap: %s", strerror(errno));
            rounds++;
        }
    }
    close(fd);
    unlink(path);
    printf("ok ops: %d rounds, %zu pages populated before the calls\n", rounds, seen_before);
    return 0;
}

struct writer {
    unsigned char *base;
    size_t pages;
    int id, n;
};

static unsigned char value(size_t page, size_t off) { return (unsigned char)(page * 7 + off * 13 + 1); }

static void *writer(void *arg) {
    struct writer *w = arg;
    /* Pages id, id+n, ... in a pseudo-random order: a full-period LCG over a power of two. */
    size_t mine = (w->pages - w->id + w->n - 1) / w->n, m = 1;
    while (m < mine)
        m <<= 1;
    size_t x = (size_t)w->id * 977;
    for (size_t k = 0; k < m; k++) {
        x = (x * 5 + 3) & (m - 1);
        if (x >= mine)
            continue;
        size_t page = w->id + x * w->n;
        unsigned char *p = w->base + page * PAGE;
        for (size_t off = 0; off < PAGE; off++)
            p[off] = value(page, off);
    }
    return NULL;
}

static void race(unsigned char *base, size_t len, const char *what) {
    enum { N = 4 };
    pthread_t th[N];
    struct writer w[N];
    for (int i = 0; i < N; i++) {
        w[i] = (struct writer){base, len / PAGE, i, N};
        if (pthread_create(&th[i], NULL, writer, &w[i]))
            die("pthread_create");
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (size_t page = 0; page < len / PAGE; page++)
        for (size_t off = 0; off < PAGE; off++)
            if (base[page * PAGE + off] != value(page, off))
                die("%s: byte %zu of page %zu lost", what, off, page);
}

static int mode_writers(void) {
    size_t populated = 0;
    for (int round = 0; round < 4; round++) {
        const size_t R = 64 * MIB;
        unsigned char *r = (unsigned char *)map_rw(R);
        race(r, R, "mapping");
        populated += count_present(r, R);
        munmap(r, R);
        /* A malloc block (glibc maps it: registered), then grown by realloc (mremap). */
        size_t B = 24 * MIB;
        unsigned char *b = malloc(B);
        if (!b)
            die("malloc");
        race(b, B, "malloc block");
        unsigned char *g = realloc(b, 3 * B);
        if (!g)
            die("realloc");
        for (size_t page = 0; page < B / PAGE; page++)
            for (size_t off = 0; off < PAGE; off += 511)
                if (g[page * PAGE + off] != value(page, off))
                    die("realloc lost byte %zu of page %zu", off, page);
        race(g, 3 * B, "grown block");
        free(g);
    }
    printf("ok writers: no byte lost (%zu pages)\n", populated);
    return 0;
}

static int mode_zero(void) {
    const size_t R = 64 * MIB;
    size_t total = 0;
    for (int round = 0; round < 3; round++) {
        unsigned char *r = (unsigned char *)map_rw(R);
        wait_populated(r, R);
        wait_passes(2);
        size_t n = count_present(r, R);
        for (size_t i = 0; i < R; i += sizeof(uint64_t))
            if (*(uint64_t *)(r + i))
                die("an untouched page reads non-zero at offset %zu", i);
        total += n;
        munmap(r, R);
        unsigned char *b = malloc(R);
        wait_populated(b + PAGE, R - 2 * PAGE);
        for (size_t i = PAGE; i < R - PAGE; i++)
            if (b[i])
                die("an untouched page of a malloc block reads non-zero at offset %zu", i);
        free(b);
    }
    printf("ok zero: %zu populated pages read zero\n", total);
    return 0;
}

static volatile int stop_churn;

static void *churn(void *arg) {
    (void)arg;
    while (!stop_churn) {
        char *p = malloc(512 << 10);
        if (!p)
            die("malloc");
        p[0] = 1;
        char *m = map_rw(MIB);
        m[0] = 1;
        madvise(m, MIB, MADV_DONTNEED);
        munmap(m, MIB);
        free(p);
        void *small[64];
        for (int i = 0; i < 64; i++)
            small[i] = malloc(64 + i);
        for (int i = 0; i < 64; i++)
            free(small[i]);
    }
    return NULL;
}

static int mode_fork(int n, int expect) {
    pthread_t th;
    if (pthread_create(&th, NULL, churn, NULL))
        die("pthread_create");
    const size_t R = 16 * MIB;
    char *r = map_rw(R);
    for (int i = 0; i < n; i++) {
        /* A fresh region every few forks: the service is populating while we fork. */
        if (i % 4 == 0) {
            munmap(r, R);
            r = map_rw(R);
        }
        pid_t pid = fork();
        if (pid < 0)
            die("fork: %s", strerror(errno));
        if (pid == 0) {
            alarm(20);
            char *a = malloc(MIB);
            if (!a)
                _exit(10);
            memset(a, 1, MIB);
            char *m = mmap(NULL, 2 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                           -1, 0);
            if (m == MAP_FAILED)
                _exit(11);
            memset(m, 2, 2 * MIB);
            if (munmap(m, 2 * MIB))
                _exit(12);
            void *c = calloc(1, 3 * MIB);
            if (!c)
                _exit(13);
            free(c);
            if (munmap(r, R))
                _exit(14);
            char *s = realloc(a, 4 * MIB);
            if (!s || s[MIB - 1] != 1)
                _exit(15);
            free(s);
            exit(active() == expect ? 0 : 16); /* exit(): the atexit handlers run */
        }
        int st;
        if (waitpid(pid, &st, 0) != pid)
            die("waitpid: %s", strerror(errno));
        if (WIFSIGNALED(st))
            die("fork %d: the child was killed by signal %d%s", i, WTERMSIG(st),
                WTERMSIG(st) == SIGALRM ? " (it deadlocked)" : "");
        if (WEXITSTATUS(st) == 16)
            die("fork %d: the child says the library %s it", i, expect ? "does not serve" : "serves");
        if (WEXITSTATUS(st))
            die("fork %d: the child failed (status %d)", i, WEXITSTATUS(st));
    }
    stop_churn = 1;
    pthread_join(th, NULL);
    if (!active())
        die("the library does not serve the parent");
    printf("ok fork: %d children\n", n);
    return 0;
}

static int mode_plain(void) {
    if (active())
        die("the library serves, expected a plain run");
    char *a = malloc(8 * MIB);
    memset(a, 3, 8 * MIB);
    char *m = map_rw(8 * MIB);
    memset(m, 4, 8 * MIB);
    madvise(m, 8 * MIB, MADV_DONTNEED);
    munmap(m, 8 * MIB);
    a = realloc(a, 16 * MIB);
    if (a[8 * MIB - 1] != 3)
        die("realloc lost a byte");
    free(a);
    printf("ok plain\n");
    return 0;
}

static int mode_heap(void) {
    enum { N = 400000 };
    char **v = malloc(N * sizeof *v);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < N; i++) {
            v[i] = malloc(96);
            memset(v[i], i & 0xff, 96);
        }
        for (int i = 0; i < N; i++)
            if (v[i][95] != (char)(i & 0xff))
                die("heap block %d lost a byte", i);
        for (int i = N - 1; i >= 0; i--)
            free(v[i]);
        malloc_trim(0);
    }
    free(v);
    printf("ok heap\n");
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2)
        die("usage: prefault_check ops DIR|writers|zero|fork N EXPECT|plain|heap");
    /* 4 KiB pages throughout: a huge page (or khugepaged collapsing one) would change the
     * presence counts these checks compare. */
    prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0);
    pagemap = open("/proc/self/pagemap", O_RDONLY);
    if (pagemap < 0)
        die("open /proc/self/pagemap: %s", strerror(errno));
    passes_fn = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "tiermem_prefault_preload_passes");
    active_fn = (int (*)(void))dlsym(RTLD_DEFAULT, "tiermem_prefault_preload_active");
    populated_fn = (uint64_t(*)(void))dlsym(RTLD_DEFAULT, "tiermem_prefault_preload_populated_bytes");
    const char *mode = argv[1];
    if (!strcmp(mode, "ops") && argc > 2)
        return mode_ops(argv[2], argc > 3 ? atoi(argv[3]) : -1);
    if (!strcmp(mode, "writers"))
        return mode_writers();
    if (!strcmp(mode, "zero"))
        return mode_zero();
    if (!strcmp(mode, "fork") && argc > 3)
        return mode_fork(atoi(argv[2]), atoi(argv[3]));
    if (!strcmp(mode, "plain"))
        return mode_plain();
    if (!strcmp(mode, "heap"))
        return mode_heap();
    die("unknown mode %s", mode);
    return 2;
}
