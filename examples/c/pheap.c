/*
 * The persistent heap (FGCK) from C with the paper's names: create a heap, allocate named and
 * anonymous objects, write them, checkpoint (nvh_ckall, nvh_ckone), close, reopen, find the
 * objects by name and check their contents; a child that writes without checkpointing and
 * dies leaves the last checkpoint intact; a checkpoint with another thread writing stops it
 * (nvh_ckall_stopping_threads).
 * Build: cc pheap.c $(pkg-config --cflags --libs tiermem) -o pheap
 * Usage: pheap DIR      (DIR: an empty scratch directory, e.g. under /dev/shm)
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
#include <sys/wait.h>
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

#define N_RECORDS 1000

/* A thread that keeps writing a heap object (step 6). */
static atomic_int stop_writer;
static void *writer(void *arg) {
    volatile uint64_t *c = arg;
    while (!atomic_load(&stop_writer)) (*c)++;
    return NULL;
}

struct record {
    uint64_t key;
    char value[56];
};

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: pheap DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/heap", argv[1]);

    /* 1. Create: 2 views (the paper's FGCK), 8 MiB. */
    struct nvh_options opts = {.views = 2, .capacity = 8u << 20};
    CHECK(nvh_open(path, &opts) == 0, "nvh_open (create)");
    CHECK(nvh_open(path, &opts) == -EBUSY, "a second nvh_open must fail with -EBUSY");

    uint64_t *counter = nvh_malloc(sizeof *counter, "counter");
    CHECK(counter != NULL, "nvh_malloc counter");
    *counter = 41;
    struct record **table = nvh_malloc(N_RECORDS * sizeof *table, "table");
    CHECK(table != NULL, "nvh_malloc table");
    for (int i = 0; i < N_RECORDS; i++) {
        table[i] = nvh_malloc(sizeof(struct record), NULL);
        CHECK(table[i] != NULL, "nvh_malloc record %d", i);
        table[i]->key = (uint64_t)i * 7;
        snprintf(table[i]->value, sizeof table[i]->value, "value-%d", i);
    }
    char *msg = nvh_malloc(6, "msg");
    CHECK(msg != NULL, "nvh_malloc msg");
    memcpy(msg, "hello", 6);

    CHECK(nvh_malloc(8, "counter") == NULL, "a duplicate name must fail");
    CHECK(strstr(tiermem_last_error(), "counter") != NULL, "error names the object: %s",
          tiermem_last_error());
    CHECK(nvh_get("no-such-object") == NULL, "nvh_get of an unknown name");
    int x;
    CHECK(nvh_free(&x) == -EINVAL, "nvh_free of a foreign pointer must fail with -EINVAL");

    struct nvh_ckpt_stats st;
    CHECK(nvh_ckall(&st) == 0, "nvh_ckall (first)");
    CHECK(st.epoch == 1, "epoch %llu", (unsigned long long)st.epoch);
    CHECK(st.bytes_copied >= N_RECORDS * sizeof(struct record), "first checkpoint copied %llu bytes",
          (unsigned long long)st.bytes_copied);

    /* 2. A sparse update: one 64-byte record written; the checkpoint copies far less than a page. */
    table[500]->key = 1234567;
    CHECK(nvh_ckall(&st) == 0, "nvh_ckall (sparse)");
    CHECK(st.bytes_copied > 0 && st.bytes_copied < 4096,
          "a one-record update copied %llu bytes (FGCK copies objects, not pages)",
          (unsigned long long)st.bytes_copied);
    printf("sparse checkpoint: %llu bytes, %llu objects, %llu view pages written\n",
           (unsigned long long)st.bytes_copied, (unsigned long long)st.objects_copied,
           (unsigned long long)st.pages_written);

    /* 3. nvh_ckone, realloc keeping the name, free. */
    *counter = 42;
    CHECK(nvh_ckone("counter") == 0, "nvh_ckone counter");
    CHECK(nvh_ckone("no-such-object") == -ENOENT, "nvh_ckone of an unknown name must fail with -ENOENT");
    msg = nvh_realloc(msg, 3000);
    CHECK(msg != NULL, "nvh_realloc msg");
    CHECK(strcmp(msg, "hello") == 0, "realloc kept the contents: %s", msg);
    strcat(msg, ", world");
    CHECK(nvh_get("msg") == msg, "the moved object keeps its name");
    CHECK(nvh_free(table[999]) == 0, "nvh_free record 999");
    table[999] = NULL;
    CHECK(nvh_free(NULL) == 0, "nvh_free(NULL)");
    CHECK(nvh_close() == 0, "nvh_close (final checkpoint)");
    CHECK(nvh_ckall(NULL) == -EBADF, "nvh_ckall without an open heap must fail with -EBADF");

    /* 4. A child opens the heap, writes without checkpointing and dies: nothing of it persists. */
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        if (nvh_open(path, NULL) != 0)
            _exit(2);
        uint64_t *c = nvh_get("counter");
        if (c == NULL || *c != 42)
            _exit(3);
        *c = 999;
        _exit(0); /* no nvh_ckall, no nvh_close: like a crash */
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed (status %d)", status);

    /* 5. Reopen (NULL options: the geometry is in the file) and check everything. */
    CHECK(nvh_open(path, NULL) == 0, "nvh_open (reopen)");
    counter = nvh_get("counter");
    CHECK(counter != NULL, "nvh_get counter");
    CHECK(*counter == 42, "counter %llu, expected 42 (the child's write was never checkpointed)",
          (unsigned long long)*counter);
    table = nvh_get("table");
    CHECK(table != NULL, "nvh_get table");
    for (int i = 0; i < N_RECORDS - 1; i++) {
        char want[56];
        snprintf(want, sizeof want, "value-%d", i);
        uint64_t key = i == 500 ? 1234567 : (uint64_t)i * 7;
        CHECK(table[i]->key == key, "record %d key %llu", i, (unsigned long long)table[i]->key);
        CHECK(strcmp(table[i]->value, want) == 0, "record %d value %s", i, table[i]->value);
    }
    CHECK(table[N_RECORDS - 1] == NULL, "the freed record's slot in the table");
    msg = nvh_get("msg");
    CHECK(msg != NULL && strcmp(msg, "hello, world") == 0, "msg after restart: %s", msg ? msg : "(null)");
    /* The freed record's memory is reusable. */
    void *again = nvh_malloc(sizeof(struct record), "again");
    CHECK(again != NULL, "nvh_malloc after reopen");

    /* 6. A checkpoint while another thread keeps writing: nvh_ckall_stopping_threads parks it
     * (a safepoint) for the checkpoint, then lets it run on. */
    pthread_t w;
    uint64_t seen = *counter;
    CHECK(pthread_create(&w, NULL, writer, counter) == 0, "pthread_create");
    /* Wait (at most 5 s) until the writer is writing. */
    for (int i = 0; i < 5000 && *(volatile uint64_t *)counter == seen; i++) usleep(1000);
    CHECK(*counter != seen, "the writer thread never wrote");
    uint64_t pause_us = 0;
    CHECK(nvh_ckall_stopping_threads(1000, &st, &pause_us) == 0, "nvh_ckall_stopping_threads");
    CHECK(st.pages_written >= 1, "the writer's page was written (%llu)",
          (unsigned long long)st.pages_written);
    seen = *counter;
    for (int i = 0; i < 5000 && *(volatile uint64_t *)counter == seen; i++) usleep(1000);
    CHECK(*counter != seen, "the writer runs again after the checkpoint");
    atomic_store(&stop_writer, 1);
    CHECK(pthread_join(w, NULL) == 0, "pthread_join");
    printf("checkpoint with a writer thread stopped: pause %llu us\n", (unsigned long long)pause_us);
    CHECK(nvh_close() == 0, "nvh_close");
    printf("C pheap: all checks passed\n");
    return 0;
}
