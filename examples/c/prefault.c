/*
 * The prefault service from C: start a service, register an anonymous region, touch it page by
 * page in ascending order while the service populates ahead, and check what it did (pages
 * populated ahead, tripwires hit, the order it learned, every byte as written, untouched
 * populated pages zero); bad input gets a clear error; a registration ended before munmap;
 * memory mapped by the service (tiermem_prefault_map) walked and unmapped.
 * Build: cc prefault.c $(pkg-config --cflags --libs tiermem) -o prefault
 * Usage: prefault
 * Exits 0 when every check passes; prints what failed otherwise.
 */
#include <tiermem.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", tiermem_last_error());       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define PAGE 4096
#define LEN (32u << 20)

static void spin_us(long us) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    do {
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000000L + (b.tv_nsec - a.tv_nsec) / 1000 < us);
}

int main(void) {
    TiermemPrefaultOptions o;
    CHECK(tiermem_prefault_options_default(&o) == 0, "options_default");
    CHECK(o.budget_bytes == 64u << 20 && o.interval_us == 2000, "defaults: %llu %u",
          (unsigned long long)o.budget_bytes, o.interval_us);
    /* Normal priority: the checks below need the service to run while the walk runs, and a
     * SCHED_IDLE thread gets almost nothing on a machine whose cores are busy (a test suite). */
    o.sched_idle = 0;
    TiermemPrefault *svc = NULL;
    CHECK(tiermem_prefault_start(&o, &svc) == 0 && svc, "start");

    uint8_t *p = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(p != MAP_FAILED, "mmap");
    madvise(p, LEN, MADV_NOHUGEPAGE);
    TiermemPrefaultPolicy pol;
    CHECK(tiermem_prefault_policy_default(&pol) == 0, "policy_default");
    pol.thp = TIERMEM_PREFAULT_THP_OFF;
    uint64_t reg = 0;
    CHECK(tiermem_prefault_register(svc, p, LEN, &pol, &reg) == 0, "register");

    /* Bad input: clear errors, nothing registered. */
    uint64_t bad;
    CHECK(tiermem_prefault_register(svc, p + 1, PAGE, &pol, &bad) == -EINVAL, "unaligned");
    CHECK(strstr(tiermem_last_error(), "4096") != NULL, "message: %s", tiermem_last_error());
    CHECK(tiermem_prefault_register(svc, p + PAGE, PAGE, &pol, &bad) == -EEXIST, "overlap");
    uint8_t *ro = mmap(NULL, 16 * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(tiermem_prefault_register(svc, ro, 16 * PAGE, &pol, &bad) == -EFAULT, "read-only");
    CHECK(strstr(tiermem_last_error(), "not writable") != NULL, "message: %s",
          tiermem_last_error());
    TiermemPrefaultPolicy worse = pol;
    worse.chunk = 1000;
    CHECK(tiermem_prefault_register(svc, ro, 16 * PAGE, &worse, &bad) == -EINVAL, "chunk");
    munmap(ro, 16 * PAGE);

    /* The application: one byte per page, ascending, a little work between touches. */
    size_t pages = LEN / PAGE;
    for (size_t i = 0; i < pages; i++) {
        p[i * PAGE] = (uint8_t)(i | 1);
        spin_us(3);
    }
    TiermemPrefaultStats st;
    TiermemPrefaultRegionStats rs;
    for (int tries = 0; tries < 500; tries++) {
        CHECK(tiermem_prefault_stats(svc, &st) == 0, "stats");
        if (st.populated_bytes > 0 && st.tripwire_hits > 0)
            break;
        usleep(10000);
    }
    CHECK(st.populated_bytes > 0, "nothing populated ahead");
    CHECK(st.tripwire_hits > 0, "no tripwire hit");
    CHECK(st.peak_unused_bytes <= st.budget_bytes, "peak %llu over budget %llu",
          (unsigned long long)st.peak_unused_bytes, (unsigned long long)st.budget_bytes);
    CHECK(tiermem_prefault_region_stats(svc, reg, &rs) == 0, "region_stats");
    CHECK(rs.order == TIERMEM_PREFAULT_ASCENDING, "learned order %d", rs.order);
    for (size_t i = 0; i < pages; i++)
        for (size_t off = 0; off < PAGE; off += 512)
            CHECK(p[i * PAGE + off] == (off == 0 ? (uint8_t)(i | 1) : 0), "page %zu byte %zu", i,
                  off);

    /* End it before munmap (what a munmap hook does), then the token is gone. */
    CHECK(tiermem_prefault_unregister_range(svc, p, LEN) == 1, "unregister_range");
    CHECK(tiermem_prefault_region_stats(svc, reg, &rs) == -ENOENT, "ended registration");
    CHECK(tiermem_prefault_unregister(svc, reg) == 0, "second unregister is a no-op");
    munmap(p, LEN);

    /* Fresh memory the service already knows (no range check): map, walk, unmap. */
    void *q = NULL;
    uint64_t qreg = 0;
    CHECK(tiermem_prefault_map(svc, 3, &pol, &q, &qreg) == -EINVAL, "map of 3 bytes");
    pol.order = TIERMEM_PREFAULT_ASCENDING;
    CHECK(tiermem_prefault_map(svc, 8u << 20, &pol, &q, &qreg) == 0 && q, "map");
    for (size_t i = 0; i < (8u << 20) / PAGE; i++) {
        CHECK(((uint8_t *)q)[i * PAGE + 7] == 0, "mapped page %zu not zero", i);
        ((uint8_t *)q)[i * PAGE] = 1;
        spin_us(3);
    }
    CHECK(tiermem_prefault_region_stats(svc, qreg, &rs) == 0, "mapped region_stats");
    CHECK(rs.populated_bytes > 0, "nothing populated ahead in the mapped region");
    CHECK(tiermem_prefault_unmap(svc, q, 8u << 20) == 0, "unmap");
    CHECK(tiermem_prefault_region_stats(svc, qreg, &rs) == -ENOENT, "unmapped registration");
    CHECK(tiermem_prefault_unmap(svc, (uint8_t *)q + 1, PAGE) == -EINVAL, "unaligned unmap");

    CHECK(tiermem_prefault_stop(svc) == 0, "stop");
    CHECK(tiermem_prefault_stop(svc) == -EBADF, "stop twice");
    printf("C prefault: %llu KiB populated ahead in %llu calls, %llu tripwires hit, service CPU "
           "%.1f ms\n",
           (unsigned long long)(st.populated_bytes >> 10), (unsigned long long)st.populate_calls,
           (unsigned long long)st.tripwire_hits, st.service_cpu_ns / 1e6);
    printf("C prefault: all checks passed\n");
    return 0;
}
