/*
 * Snapshots from C: map snapshot-able memory, fill part of it, take a snapshot while a writer
 * thread keeps writing (tiermem_snapshot_begin_paused pauses it through a callback only for
 * the scan and the write protection), and check that the file holds the memory as it was in
 * the pause (every
 * byte, holes as zeros), that the application state comes back, that memory in a running
 * snapshot cannot be freed, that a damaged file is refused naming the failed check, and that
 * bad arguments get a clear error.
 * Build: cc snapshot.c $(pkg-config --cflags --libs tiermem) -lpthread -o snapshot
 * Usage: snapshot [DIR]   (DIR: where the file goes; default /tmp)
 * Exits 0 when every check passes; prints what failed otherwise.
 */
#include <tiermem.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
#define LEN (16u << 20)

static atomic_int paused, parked, stop;
static unsigned char *mem, *ref;

/* Writes random bytes all over the memory until told to stop; parks while paused. */
static void *writer(void *arg) {
    (void)arg;
    unsigned x = 12345;
    while (!atomic_load(&stop)) {
        if (atomic_load(&paused)) {
            atomic_store(&parked, 1);
            while (atomic_load(&paused))
                ;
            atomic_store(&parked, 0);
        }
        x = x * 1103515245u + 12345u;
        mem[(x >> 3) % LEN] = (unsigned char)(x >> 24) | 1;
    }
    return NULL;
}

/* The application's quiesce: the writer parked, the pause's image taken. */
static void pause_writers(void *arg) {
    (void)arg;
    atomic_store(&paused, 1);
    while (!atomic_load(&parked))
        ;
    memcpy(ref, mem, LEN);
}

static void resume_writers(void *arg) {
    (void)arg;
    atomic_store(&paused, 0);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    char path[4096];
    snprintf(path, sizeof path, "%s/tiermem-c-snapshot-%d.snap", dir, (int)getpid());

    void *addr = NULL;
    TiermemSnapshotMemory *m = NULL;
    CHECK(tiermem_snapshot_memory_map("heap", LEN, &addr, &m) == 0, "memory_map");
    mem = addr;
    /* Every third page stays a hole. */
    for (size_t p = 0; p < LEN / PAGE; p++)
        if (p % 3 != 2)
            memset(mem + p * PAGE, (int)(p % 251) + 1, PAGE);
    ref = malloc(LEN);
    CHECK(ref != NULL, "malloc");

    pthread_t t;
    CHECK(pthread_create(&t, NULL, writer, NULL) == 0, "pthread_create");
    usleep(2000); /* the writer is at work before, during and after the snapshot's pause */
    TiermemSnapshotJob *job = NULL;
    const char state[] = "application state";
    TiermemSnapshotMemory *list[1] = {m};
    CHECK(tiermem_snapshot_begin_paused(list, 1, path, state, sizeof state, 16,
                                        TIERMEM_SNAPSHOT_WP, pause_writers,
                                        resume_writers, NULL, &job) == 0,
          "begin_paused");
    CHECK(tiermem_snapshot_memory_free(m) == -EBUSY, "free during a snapshot must be refused");
    uint64_t done = 0, total = 0;
    CHECK(tiermem_snapshot_progress(job, &done, &total) == 0 && total == LEN / (64 * PAGE),
          "progress: %llu of %llu", (unsigned long long)done, (unsigned long long)total);
    TiermemSnapshotReport rep;
    CHECK(tiermem_snapshot_wait(job, &rep) == 0, "wait");
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    CHECK(rep.present_pages >= (LEN / PAGE) - (LEN / PAGE) / 3, "present pages %llu",
          (unsigned long long)rep.present_pages);
    CHECK(rep.dumped_units + rep.staged_units + rep.self_written_units == rep.units,
          "units accounted");

    CHECK(tiermem_snapshot_verify(path) == 0, "verify");
    unsigned char *back = malloc(LEN);
    CHECK(back != NULL, "malloc");
    CHECK(tiermem_snapshot_restore(path, 0, back, LEN) == 0, "restore");
    CHECK(memcmp(back, ref, LEN) == 0, "the file differs from the pause's image");
    char got[64];
    size_t n = 0;
    CHECK(tiermem_snapshot_app_state(path, got, sizeof got, &n) == 0 && n == sizeof state &&
              memcmp(got, state, n) == 0,
          "application state");
    CHECK(tiermem_snapshot_app_state(path, got, 2, &n) == -ERANGE && n == sizeof state,
          "a short buffer is -ERANGE");

    /* The fork-mdc baseline: a forked child dumps the (now quiet) memory. */
    char path2[4200];
    snprintf(path2, sizeof path2, "%s.fork", path);
    CHECK(tiermem_snapshot_begin(list, 1, path2, NULL, 0, 0, TIERMEM_SNAPSHOT_FORK_MDC, &job) ==
              0,
          "begin fork-mdc");
    TiermemSnapshotReport rep2;
    CHECK(tiermem_snapshot_wait(job, &rep2) == 0 && rep2.units == rep.units, "wait fork-mdc");
    CHECK(tiermem_snapshot_restore(path2, 0, back, LEN) == 0 && memcmp(back, mem, LEN) == 0,
          "the fork-mdc file differs from the memory");
    unlink(path2);
    CHECK(tiermem_snapshot_begin(list, 1, path2, NULL, 0, 16, 7, &job) == -EINVAL,
          "an unknown method is refused");

    /* Into an NVM pool file (a media pool of kind NVM) instead of a plain file. */
    CHECK(tiermem_snapshot_begin(list, 1, path2, NULL, 0, 16,
                                 TIERMEM_SNAPSHOT_WP | TIERMEM_SNAPSHOT_NVM_POOL, &job) == 0,
          "begin into an NVM pool");
    CHECK(tiermem_snapshot_wait(job, &rep2) == 0, "wait (NVM pool)");
    CHECK(tiermem_snapshot_verify(path2) == 0, "verify (NVM pool)");
    CHECK(tiermem_snapshot_restore(path2, 0, back, LEN) == 0 && memcmp(back, mem, LEN) == 0,
          "the NVM pool snapshot differs from the memory");
    unlink(path2);

    /* A damaged copy is refused, naming the check. */
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL, "fopen");
    fseek(f, 3 * PAGE + 100, SEEK_SET); /* inside the stored pages */
    int c = fgetc(f);
    fseek(f, 3 * PAGE + 100, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
    CHECK(tiermem_snapshot_verify(path) == -EBADMSG, "a flipped byte must be refused");
    CHECK(strstr(tiermem_last_error(), "CRC of unit") != NULL, "names the check: %s",
          tiermem_last_error());

    /* Bad arguments. */
    CHECK(tiermem_snapshot_begin(NULL, 0, path, NULL, 0, 16, TIERMEM_SNAPSHOT_WP, &job) == -EINVAL, "no memories");
    CHECK(tiermem_snapshot_begin(list, 1, path, NULL, 0, 65, TIERMEM_SNAPSHOT_WP, &job) == -EINVAL, "65 slots");
    CHECK(tiermem_snapshot_begin_paused(list, 1, path, NULL, 0, 16, TIERMEM_SNAPSHOT_WP, NULL, resume_writers, NULL,
                                        &job) == -EINVAL,
          "no pause callback");
    CHECK(tiermem_snapshot_memory_map(NULL, LEN, &addr, &m) == -EINVAL, "NULL name");
    CHECK(tiermem_snapshot_verify("/nonexistent/x.snap") == -ENOENT, "missing file");

    unlink(path);
    CHECK(tiermem_snapshot_memory_free(m) == 0, "free");
    free(ref);
    free(back);
    printf("C snapshot: all checks passed (pause %.2f ms, %llu units: %llu dumped, %llu staged, "
           "%llu written by the writer, %llu pages spilled)\n",
           rep.pause_ns / 1e6, (unsigned long long)rep.units,
           (unsigned long long)rep.dumped_units, (unsigned long long)rep.staged_units,
           (unsigned long long)rep.self_written_units, (unsigned long long)rep.spilled_pages);
    return 0;
}
