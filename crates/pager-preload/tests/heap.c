/* A program that knows nothing of tiermem: large blocks from the malloc family and mmap, far
 * more than the DRAM budget it is run under, and system calls whose buffers are in them (by
 * then evicted). Every byte is checked; exit 0 and "ok" on stdout when all is well. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#define PS 4096
#define MIB (1024 * 1024)

static int fails;
#define CHECK(c, ...)                                                                         \
    do {                                                                                      \
        if (!(c)) {                                                                           \
            fprintf(stderr, "FAIL line %d: ", __LINE__);                                      \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
            if (++fails > 20) exit(1);                                                        \
        }                                                                                     \
    } while (0)

static uint64_t word(uint64_t page, uint64_t seed) {
    return (page * 0x9E3779B97F4A7C15ull) ^ (seed * 0xD6E8FEB86659FD93ull) ^ 0x5555;
}

static void fill(unsigned char *p, size_t len, uint64_t seed) {
    for (size_t o = 0; o < len; o += PS) {
        uint64_t w = word(o / PS, seed);
        for (size_t k = 0; k < PS && o + k < len; k += 512) memcpy(p + o + k, &w, 8);
    }
}

static size_t check(const unsigned char *p, size_t len, uint64_t seed) {
    size_t bad = 0;
    for (size_t o = 0; o < len; o += PS) {
        uint64_t w = word(o / PS, seed), got;
        for (size_t k = 0; k < PS && o + k < len; k += 512) {
            memcpy(&got, p + o + k, 8);
            if (got != w) bad++;
        }
    }
    return bad;
}

static void write_all(int fd, const unsigned char *p, size_t len) {
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        CHECK(n > 0, "write: %zd (%s)", n, strerror(errno));
        if (n <= 0) return;
        p += n;
        len -= (size_t)n;
    }
}

static void read_all(int fd, unsigned char *p, size_t len) {
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        CHECK(n > 0, "read: %zd (%s)", n, strerror(errno));
        if (n <= 0) return;
        p += n;
        len -= (size_t)n;
    }
}

int main(int argc, char **argv) {
    const char *tmp = argc > 1 ? argv[1] : "/var/tmp";
    /* malloc: 64 MiB, 8 times a typical test budget. */
    size_t big = 64 * MIB;
    unsigned char *a = malloc(big);
    CHECK(a != NULL, "malloc");
    fill(a, big, 1);
    CHECK(check(a, big, 1) == 0, "malloc block after a full pass");
    CHECK(malloc_usable_size(a) >= big, "usable size %zu", malloc_usable_size(a));

    /* calloc: zeros, even where the arena held other bytes before. */
    unsigned char *z = calloc(16, MIB);
    CHECK(z != NULL, "calloc");
    size_t nz = 0;
    for (size_t i = 0; i < 16 * MIB; i += 1024) nz += z[i] != 0;
    CHECK(nz == 0, "calloc: %zu non-zero bytes", nz);
    free(z);
    z = calloc(16, MIB);
    nz = 0;
    for (size_t i = 0; i < 16 * MIB; i += 1024) nz += z[i] != 0;
    CHECK(nz == 0, "calloc after free: %zu non-zero bytes", nz);

    /* posix_memalign with memcached -L's 2 MiB alignment. */
    void *al = NULL;
    CHECK(posix_memalign(&al, 2 * MIB, 24 * MIB) == 0 && al != NULL, "posix_memalign");
    CHECK(((uintptr_t)al % (2 * MIB)) == 0, "alignment of %p", al);
    fill(al, 24 * MIB, 2);

    /* mmap of anonymous memory, then a partial munmap of its middle. */
    size_t ml = 32 * MIB;
    unsigned char *m = mmap(NULL, ml, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED, "mmap");
    fill(m, ml, 3);
    CHECK(munmap(m + 8 * MIB, 8 * MIB) == 0, "munmap of the middle");
    CHECK(check(m, 8 * MIB, 3) == 0, "mmap head after the partial munmap");
    size_t bad = 0;
    for (size_t o = 16 * MIB; o < ml; o += PS) {
        uint64_t got, w = word(o / PS, 3);
        memcpy(&got, m + o, 8);
        bad += got != w;
    }
    CHECK(bad == 0, "mmap tail after the partial munmap: %zu bad pages", bad);

    /* System calls on evicted memory: write the malloc block's first 8 MiB (long evicted) to
     * a file, read it back into the mmap's tail, compare. */
    char path[256];
    snprintf(path, sizeof path, "%s/tiermem-pager-preload-%d.dat", tmp, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0, "open %s: %s", path, strerror(errno));
    write_all(fd, a, 8 * MIB);
    CHECK(lseek(fd, 0, SEEK_SET) == 0, "lseek");
    read_all(fd, m + 16 * MIB, 8 * MIB);
    CHECK(memcmp(a, m + 16 * MIB, 8 * MIB) == 0, "file round trip differs");
    /* pwrite/pread at an offset. */
    CHECK(pwrite(fd, (unsigned char *)al + 4 * MIB, 2 * MIB, 8 * MIB) == 2 * MIB, "pwrite");
    CHECK(pread(fd, m + 24 * MIB, 2 * MIB, 8 * MIB) == 2 * MIB, "pread");
    CHECK(memcmp((unsigned char *)al + 4 * MIB, m + 24 * MIB, 2 * MIB) == 0, "pread differs");
    close(fd);
    unlink(path);

    /* A buffer freed and allocated again, read into at once: the free's MADV_DONTNEED returns
     * when its event is read, before the pager has marked the pages dropped, so the read's pin
     * waits for that (without the wait read(2) failed with EFAULT now and then: sort under
     * `tiermem pager run`, ~1 run in 30). The window is short: this loop hit it in 2 of 12 runs
     * with three runs at once, not in a run alone. */
    {
        size_t bl = 256 * 1024;
        int rfd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
        CHECK(rfd >= 0, "open %s: %s", path, strerror(errno));
        write_all(rfd, a, bl);
        for (int round = 0; round < 400; round++) {
            unsigned char *b = malloc(bl);
            CHECK(b != NULL, "malloc round %d", round);
            memset(b, round, bl);
            free(b);
            b = malloc(bl);
            CHECK(b != NULL, "malloc again round %d", round);
            ssize_t n = pread(rfd, b, bl, 0);
            CHECK(n == (ssize_t)bl, "pread into a buffer freed and allocated again, round %d: %zd (%s)",
                  round, n, strerror(errno));
            if (n != (ssize_t)bl) break;
            CHECK(memcmp(b, a, bl) == 0, "that pread's bytes differ, round %d", round);
            free(b);
        }
        close(rfd);
        unlink(path);
    }

    /* sendmsg/recvmsg with iovecs into arena memory, through a socket pair. */
    int sv[2];
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0, "socketpair");
    for (int round = 0; round < 32; round++) {
        size_t off = (size_t)round * 2 * MIB + 100; /* unaligned, spanning pages */
        struct iovec out[2] = {{a + off, 3000}, {(unsigned char *)al + off % (20 * MIB), 5000}};
        struct msghdr mh = {0};
        mh.msg_iov = out;
        mh.msg_iovlen = 2;
        CHECK(sendmsg(sv[0], &mh, 0) == 8000, "sendmsg round %d", round);
        unsigned char *dst = m + 26 * MIB + (size_t)round * 8192;
        struct iovec in[1] = {{dst, 8000}};
        struct msghdr mi = {0};
        mi.msg_iov = in;
        mi.msg_iovlen = 1;
        size_t got = 0;
        while (got < 8000) {
            in[0].iov_base = dst + got;
            in[0].iov_len = 8000 - got;
            ssize_t n = recvmsg(sv[1], &mi, 0);
            CHECK(n > 0, "recvmsg: %zd (%s)", n, strerror(errno));
            if (n <= 0) break;
            got += (size_t)n;
        }
        CHECK(memcmp(dst, a + off, 3000) == 0 &&
                  memcmp(dst + 3000, (unsigned char *)al + off % (20 * MIB), 5000) == 0,
              "socket round %d differs", round);
    }
    close(sv[0]);
    close(sv[1]);

    /* realloc: grow the malloc block (it moves), the old bytes follow. */
    unsigned char *b = realloc(a, 96 * MIB);
    CHECK(b != NULL, "realloc");
    CHECK(check(b, big, 1) == 0, "realloc kept the bytes");
    fill(b + big, 32 * MIB, 4);
    CHECK(check(b, big, 1) == 0, "realloc block, second pass");
    CHECK(check(al, 24 * MIB, 2) == 0, "aligned block at the end");

    /* fork: a child that allocates large blocks and frees an inherited arena block (which it
     * cannot touch) exits cleanly; the parent's memory is as it was. */
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        unsigned char *c = malloc(8 * MIB);
        if (c == NULL) _exit(2);
        memset(c, 7, 8 * MIB);
        for (size_t i = 0; i < 8 * MIB; i += PS)
            if (c[i] != 7) _exit(3);
        free(c);
        free(b); /* an arena block of the parent: nothing happens */
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "forked child: status %#x", st);
    CHECK(check(b, big, 1) == 0, "realloc block after the fork");

    free(b);
    free(al);
    free(z);
    munmap(m, 8 * MIB);
    munmap(m + 16 * MIB, 16 * MIB);
    if (fails) return 1;
    printf("ok\n");
    return 0;
}
