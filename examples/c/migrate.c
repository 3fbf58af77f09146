/*
 * FAM-aware post-copy migration through the C ABI: a parent fills a region with a pattern and
 * forks; the child is the source (checkpoint the region and a state blob into a FAM directory,
 * then dump + serve the page-server on 127.0.0.1 until every page is in FAM, exit); the parent
 * is the target (restore with the child's address, run on the region at once, read and verify
 * every byte, complete, print the fault counts). Also checks argument errors.
 * Build: cc migrate.c $(pkg-config --cflags --libs tiermem) -o migrate
 * Usage: migrate [DIR]   (the FAM directory is a fresh mkdtemp under DIR, default /dev/shm,
 *                         removed at the end)
 * Exits 0 when every check passes; prints what failed otherwise.
 */
#include <tiermem.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
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

#define REGION_LEN ((size_t)32 << 20) /* 16 vectors of 2 MiB */
#define VECTOR ((size_t)2 << 20)
#define MIG_ID 0x5eedULL

static const char BLOB[] = "engine volatile\nroot 4096\n";

/* The byte every offset must hold (never all zero over a page). */
static uint8_t pattern(size_t i) { return (uint8_t)((i >> 12) * 7 + i * 13 + 1); }

/* A free TCP port on 127.0.0.1 (bound, read, released: the child binds it right after). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind: %s", strerror(errno));
    socklen_t n = sizeof a;
    CHECK(getsockname(fd, (struct sockaddr *)&a, &n) == 0, "getsockname: %s", strerror(errno));
    close(fd);
    return ntohs(a.sin_port);
}

/* The source: checkpoint, tell the parent over the pipe, serve until the dump is complete. */
static int run_source(const char *fam, void *region, const char *addr, int ready_fd) {
    tiermem_migrate_region r = {region, REGION_LEN};
    /* pcm-fam delay, one write per 2 MiB vector: the target's first faults (the last vector)
     * are ahead of the dumper and go to the page-server. */
    tiermem_migrate_source *src = NULL;
    int rc = tiermem_migrate_source_checkpoint(fam, MIG_ID, &r, 1, BLOB, sizeof BLOB, "pcm-fam", 0,
                                               &src);
    char status = rc == 0 ? 'c' : 'e';
    if (write(ready_fd, &status, 1) != 1 || rc != 0) {
        fprintf(stderr, "source: checkpoint failed: %d %s\n", rc, tiermem_last_error());
        return 1;
    }
    close(ready_fd);
    tiermem_migrate_source_report rep;
    rc = tiermem_migrate_source_serve(src, addr, &rep);
    if (rc != 0) {
        fprintf(stderr, "source: serve failed: %d %s\n", rc, tiermem_last_error());
        return 1;
    }
    if (rep.bytes != REGION_LEN) {
        fprintf(stderr, "source: dumped %llu bytes, expected %zu\n", (unsigned long long)rep.bytes,
                REGION_LEN);
        return 1;
    }
    printf("source: busy %.1f ms, %llu requests, %llu vectors on demand, %llu bytes, told done %d\n",
           (double)rep.busy_ns / 1e6, (unsigned long long)rep.requests,
           (unsigned long long)rep.on_demand_vectors, (unsigned long long)rep.bytes, rep.told_done);
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

int main(int argc, char **argv) {
    const char *root = argc >= 2 ? argv[1] : "/dev/shm";
    char fam[4096];
    CHECK(snprintf(fam, sizeof fam, "%s/tiermem-migrate-XXXXXX", root) < (int)sizeof fam, "path");
    CHECK(mkdtemp(fam) != NULL, "mkdtemp %s: %s", fam, strerror(errno));

    uint8_t *region = mmap(NULL, REGION_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(region != MAP_FAILED, "mmap: %s", strerror(errno));
    for (size_t i = 0; i < REGION_LEN; i++) region[i] = pattern(i);

    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    int pipefd[2];
    CHECK(pipe(pipefd) == 0, "pipe: %s", strerror(errno));
    fflush(stdout);
    /* Fork before any tiermem call: the fault engine is per process. */
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(pipefd[0]);
        int code = run_source(fam, region, addr, pipefd[1]);
        fflush(stdout);
        _exit(code);
    }
    close(pipefd[1]);
    munmap(region, REGION_LEN); /* the target never reads the parent's copy */

    /* Argument errors (target-side calls and a checkpoint rejected before any file exists). */
    tiermem_migrate_target *t = NULL;
    CHECK(tiermem_migrate_target_restore(fam, MIG_ID, NULL, 0, NULL) == -EINVAL, "NULL out");
    CHECK(tiermem_migrate_target_restore(NULL, MIG_ID, NULL, 0, &t) == -EINVAL, "NULL fam_dir");
    CHECK(tiermem_migrate_target_restore(fam, MIG_ID, "not-an-address", 0, &t) == -EINVAL,
          "bad source address");
    CHECK(tiermem_migrate_target_restore(fam, 0xdead, NULL, 0, &t) == -ENOENT, "missing migration");
    tiermem_migrate_source *bad = NULL;
    tiermem_migrate_region none = {NULL, 4096};
    CHECK(tiermem_migrate_source_checkpoint(fam, 1, &none, 0, NULL, 0, NULL, 0, &bad) == -EINVAL,
          "zero regions");
    CHECK(tiermem_migrate_source_checkpoint(fam, 1, &none, 1, NULL, 0, NULL, 0, &bad) == -EINVAL,
          "NULL region base");
    CHECK(tiermem_migrate_source_checkpoint(fam, 1, &none, 1, NULL, 0, "warp-speed", 0, &bad) ==
              -EINVAL,
          "unknown delay model");
    CHECK(tiermem_migrate_source_serve(NULL, addr, NULL) == -EINVAL, "NULL source");
    CHECK(tiermem_migrate_target_region_count(NULL) == -EINVAL, "NULL target");
    tiermem_migrate_source_free(NULL);
    tiermem_migrate_target_free(NULL);

    /* Wait for the checkpoint, then restore; the child may not listen yet: retry briefly. */
    char status = 0;
    CHECK(read(pipefd[0], &status, 1) == 1 && status == 'c', "the source failed to checkpoint");
    close(pipefd[0]);
    int rc = -1;
    for (int tries = 0; tries < 500; tries++) {
        rc = tiermem_migrate_target_restore(fam, MIG_ID, addr, 5000, &t);
        if (rc == 0) break;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    CHECK(rc == 0, "restore: %d", rc);

    CHECK(tiermem_migrate_target_region_count(t) == 1, "region count");
    void *base = NULL;
    size_t len = 0;
    CHECK(tiermem_migrate_target_region(t, 0, &base, &len) == 0, "region 0");
    CHECK(base != NULL && len == REGION_LEN, "region 0 is %zu bytes", len);
    CHECK(tiermem_migrate_target_region(t, 1, &base, &len) == -ERANGE, "region 1 must not exist");
    CHECK(tiermem_migrate_target_region(t, 0, NULL, &len) == -EINVAL, "NULL base");
    const void *blob = NULL;
    size_t blob_len = 0;
    CHECK(tiermem_migrate_target_blob(t, &blob, &blob_len) == 0, "blob");
    CHECK(blob_len == sizeof BLOB && memcmp(blob, BLOB, sizeof BLOB) == 0, "blob contents");

    /* Run on the region at once: read every byte, the last vector first (likely not dumped
     * yet: those pages come from the page-server), then the rest. */
    CHECK(tiermem_migrate_target_region(t, 0, &base, &len) == 0, "region 0");
    const uint8_t *mem = base;
    for (size_t v = REGION_LEN / VECTOR; v-- > 0;)
        for (size_t i = v * VECTOR; i < (v + 1) * VECTOR; i++)
            CHECK(mem[i] == pattern(i), "byte %zu is %u, expected %u", i, mem[i], pattern(i));
    uint64_t resume_ns = 0, from_fam = 0, on_demand = 0;
    CHECK(tiermem_migrate_target_complete(t, &resume_ns) == 0, "complete");
    CHECK(tiermem_migrate_target_faults(t, &from_fam, &on_demand) == 0, "faults");
    CHECK(from_fam + on_demand >= REGION_LEN / VECTOR, "only %llu faults resolved for %zu vectors",
          (unsigned long long)(from_fam + on_demand), REGION_LEN / VECTOR);
    printf("target: resume %.1f ms, %llu faults from FAM, %llu on demand\n", (double)resume_ns / 1e6,
           (unsigned long long)from_fam, (unsigned long long)on_demand);
    tiermem_migrate_target_free(t);

    int wst = 0;
    CHECK(waitpid(pid, &wst, 0) == pid, "waitpid: %s", strerror(errno));
    CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "the source exited with status %d", wst);

    /* The dump is complete: a second restore needs no source. */
    CHECK(tiermem_migrate_target_restore(fam, MIG_ID, NULL, 0, &t) == 0, "restore without source");
    CHECK(tiermem_migrate_target_region(t, 0, &base, &len) == 0, "region 0");
    mem = base;
    for (size_t i = 0; i < REGION_LEN; i += 4093)
        CHECK(mem[i] == pattern(i), "second restore: byte %zu", i);
    tiermem_migrate_target_free(t);

    CHECK(nftw(fam, rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0, "removing %s: %s", fam, strerror(errno));
    printf("C migrate: all checks passed\n");
    return 0;
}
