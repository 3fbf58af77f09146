/*
 * A complete C program over libtiermem: a pool, a lazily filled region, a write tracker.
 * Build: cc tour.c $(pkg-config --cflags --libs tiermem) -o tour
 * Usage: tour DIR      (DIR: where to put the demo pool, e.g. /dev/shm/tiermem)
 * Exits 0 when every check passes; prints what failed otherwise.
 */
#include <tiermem.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGE 4096
#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", tiermem_last_error());       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

/* Fill callback: page i holds the byte (i * 7 + 1) everywhere. Async-signal-safe. */
static int fill_pattern(void *ctx, uint64_t offset, void *page) {
    (void)ctx;
    memset(page, (int)((offset / PAGE) * 7 + 1), PAGE);
    return 0;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm/tiermem";
    char path[512], bad[512];
    snprintf(path, sizeof path, "%s/c-tour-%d.pool", dir, (int)getpid());
    snprintf(bad, sizeof bad, "%s/c-tour-%d.notapool", dir, (int)getpid());
    printf("libtiermem %s\n", tiermem_version());

    /* 1. A pool: create, write durably, reopen, read back. */
    TiermemPool *pool = NULL;
    CHECK(tiermem_pool_create(path, 8 << 20, TIERMEM_POOL_NVM, 0, &pool) == 0, "create %s", path);
    CHECK(tiermem_pool_size(pool) == (8 << 20) - 4096, "data size %llu", (unsigned long long)tiermem_pool_size(pool));
    const char msg[] = "hello, persistent world";
    CHECK(tiermem_pool_write(pool, 4096, msg, sizeof msg) == 0, "write");
    /* The fast path: a direct store, then persist. */
    memcpy((char *)tiermem_pool_base(pool) + 8192, msg, sizeof msg);
    CHECK(tiermem_pool_persist(pool, 8192, sizeof msg) == 0, "persist");
    CHECK(tiermem_pool_create(path, 8 << 20, TIERMEM_POOL_NVM, 0, &pool) == -EEXIST, "create over an existing pool must fail with EEXIST");
    CHECK(tiermem_pool_set_delay(pool, "warp-speed") == -EINVAL, "a bad delay model must be refused");
    CHECK(tiermem_pool_set_delay(pool, "pcm-fam") == 0, "set delay");
    TiermemStats st;
    CHECK(tiermem_pool_stats(pool, &st) == 0 && st.bytes_written >= sizeof msg, "stats");
    tiermem_pool_close(pool);

    TiermemPool *again = NULL;
    CHECK(tiermem_pool_open(path, &again) == 0, "reopen");
    char buf[sizeof msg];
    CHECK(tiermem_pool_read(again, 4096, buf, sizeof buf) == 0 && memcmp(buf, msg, sizeof msg) == 0, "read back");
    CHECK(memcmp((char *)tiermem_pool_base(again) + 8192, msg, sizeof msg) == 0, "direct store read back");
    CHECK(tiermem_pool_read(again, (8 << 20), buf, sizeof buf) == -ERANGE, "read past the end must fail with ERANGE");
    tiermem_pool_close(again);
    printf("pool: created, written, reopened and validated\n");

    /* Bad input: a file that is not a pool. */
    FILE *f = fopen(bad, "w");
    CHECK(f != NULL, "create %s", bad);
    for (int i = 0; i < 3 * 4096; i++) fputc('x', f);
    fclose(f);
    CHECK(tiermem_pool_open(bad, &again) < 0, "a random file must not open as a pool");
    printf("not a pool, refused: %s\n", tiermem_last_error());
    CHECK(tiermem_pool_remove(bad) < 0, "pool_remove must refuse a file that is not a pool");
    unlink(bad);
    CHECK(tiermem_pool_remove(path) == 0, "remove");

    /* 2. A region filled on first touch by a C callback, resolved in the faulting thread. */
    size_t len = 256 * PAGE;
    unsigned char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED, "mmap");
    TiermemRegion *region = NULL;
    CHECK(tiermem_region_register(mem, len, TIERMEM_RESOLVE_IN_THREAD, 0, fill_pattern, NULL, &region) == 0, "register");
    for (size_t i = 0; i < len / PAGE; i++)
        CHECK(mem[i * PAGE + 123] == (unsigned char)(i * 7 + 1), "page %zu has %d", i, mem[i * PAGE + 123]);
    CHECK(tiermem_region_faults(region) == len / PAGE, "faults %llu", (unsigned long long)tiermem_region_faults(region));
    CHECK(tiermem_region_unregister(region) == 0, "unregister");
    CHECK(tiermem_region_register(mem + 1, len, TIERMEM_RESOLVE_IN_THREAD, 0, fill_pattern, NULL, &region) == -EINVAL, "unaligned base must fail with EINVAL");
    printf("region: %zu pages filled lazily in-thread\n", len / PAGE);

    /* 3. Written-page tracking over the (now populated) region. */
    TiermemTracker *tr = NULL;
    CHECK(tiermem_tracker_create(mem, len, 0, &tr) == 0, "tracker");
    size_t written[] = {3, 4, 5, 100, 255};
    for (size_t i = 0; i < sizeof written / sizeof *written; i++) mem[written[i] * PAGE] = 42;
    TiermemPageRange r[2];
    size_t pages = 0, calls = 0;
    long n;
    /* cap 2 on purpose: the runs come back over several calls, none lost */
    while ((n = tiermem_tracker_scan(tr, r, 2)) > 0) {
        for (long i = 0; i < n; i++) pages += r[i].len / PAGE;
        calls++;
        if (n < 2) break;
    }
    CHECK(n >= 0, "scan");
    CHECK(pages == 5, "tracker reported %zu pages, 5 were written", pages);
    CHECK(tiermem_tracker_scan(tr, r, 2) == 0, "a scan without writes must report nothing");
    printf("tracker (%s): 5 written pages reported in %zu calls\n",
           tiermem_tracker_method(tr) == TIERMEM_TRACK_UFFD_WP_ASYNC ? "WP_ASYNC + PAGEMAP_SCAN" : "mprotect", calls);
    tiermem_tracker_destroy(tr);
    munmap(mem, len);
    printf("C tour: all checks passed\n");
    return 0;
}
