/*
 * vnvm from C: a region written through transactions (one aborted), the transactional
 * allocator and its root object, release, re-init and read back, and the errors of a bad tid,
 * a write outside the region, a double free and a direct store.
 * Build: cc vnvm.c $(pkg-config --cflags --libs tiermem) -o vnvm
 * Usage: vnvm DIR      (DIR: an empty scratch directory, e.g. under /dev/shm)
 * Exits 0 when every check passes; prints what failed otherwise.
 */
#include <tiermem.h>

#include <errno.h>
#include <signal.h>
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

#define REGION_SIZE (1u << 20)

/* The root object of the region's heap: persistent data refer to each other by offset. */
struct root {
    char name[32];
    uint64_t table;     /* offset of a large block */
    uint64_t entries;
};

/* Log a whole buffer, waiting for log space when the log is full. */
static void write_all(nv_instance *vn, uint64_t tid, const void *base, uint64_t off, const void *src, size_t n) {
    size_t done = 0;
    while (done < n) {
        int64_t k = nv_write(vn, tid, (char *)base + off + done, (const char *)src + done, n - done);
        if (k == -ENOSPC) {
            CHECK(nv_wait_log_space(vn, 1000) == 0, "log space");
            continue;
        }
        CHECK(k > 0, "nv_write at %llu: %lld", (unsigned long long)(off + done), (long long)k);
        done += (size_t)k;
    }
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "/dev/shm/tiermem-vnvm-c";
    char inst_dir[512], file[512], other[512];
    snprintf(inst_dir, sizeof inst_dir, "%s/inst", dir);
    snprintf(file, sizeof file, "%s/data.bin", dir);
    snprintf(other, sizeof other, "%s/shared.bin", dir);

    /* 1. An instance and a region. */
    nv_instance *vn = NULL;
    CHECK(nv_init(inst_dir, 1 << 20, 1 << 20, &vn) == 0, "nv_init %s", inst_dir);
    nv_region *r = NULL;
    CHECK(nv_allocate(vn, file, REGION_SIZE, NV_PRIVATE, &r) == 0, "nv_allocate %s", file);
    CHECK(nv_region_size(r) == REGION_SIZE, "size");
    nv_region *sh = NULL;
    CHECK(nv_allocate(vn, other, 4096, NV_SHARED, &sh) == 0, "nv_allocate NV_SHARED %s", other);
    const char *base = nv_region_ptr(r);

    /* 2. Transactions: read committed, commit, abort. */
    uint64_t t = nv_txbegin(vn);
    CHECK(t != 0, "txbegin");
    write_all(vn, t, base, 0x10000, "hello, vnvm", 12);
    CHECK(base[0x10000] == 0, "uncommitted data must not be visible");
    CHECK(nv_commit(vn, t) == 0, "commit");
    CHECK(strcmp(base + 0x10000, "hello, vnvm") == 0, "committed data visible");
    uint64_t committed = t;

    t = nv_txbegin(vn);
    write_all(vn, t, base, 0x10000, "XXXXX", 5);
    CHECK(nv_abort(vn, t) == 0, "abort");
    CHECK(strcmp(base + 0x10000, "hello, vnvm") == 0, "aborted data never visible");
    uint64_t aborted = t;
    printf("transactions: committed, aborted, read committed\n");

    /* A shared region: the file itself, MAP_SHARED; other processes allocating the same path
       with NV_SHARED see the same committed data. A transaction that writes it writes no other
       region. */
    const char *sbase = nv_region_ptr(sh);
    t = nv_txbegin(vn);
    write_all(vn, t, sbase, 0, "shared hello", 13);
    CHECK(nv_write(vn, t, (char *)base, "x", 1) == -EXDEV, "shared + private in one tx -> EXDEV");
    CHECK(nv_commit(vn, t) == 0, "commit shared");
    CHECK(strcmp(sbase, "shared hello") == 0, "shared committed data visible");
    CHECK(nv_free(vn, sh) == 0, "nv_free shared");
    printf("shared region: committed, cross-region write refused\n");

    /* 3. Bad input: tids and destinations. */
    char stack[16] = {0};
    t = nv_txbegin(vn);
    CHECK(nv_write(vn, 987654321, (char *)base, "x", 1) == -ESRCH, "unknown tid -> ESRCH");
    CHECK(nv_write(vn, committed, (char *)base, "x", 1) == -ESRCH, "committed tid -> ESRCH");
    CHECK(nv_write(vn, aborted, (char *)base, "x", 1) == -ECANCELED, "aborted tid -> ECANCELED");
    CHECK(nv_write(vn, t, stack, "x", 1) == -EFAULT, "write outside every region -> EFAULT");
    printf("out of region refused: %s\n", tiermem_last_error());
    CHECK(nv_write(vn, t, (char *)base + REGION_SIZE - 2, "abcd", 4) == -EFAULT, "write across the region end -> EFAULT");
    CHECK(nv_commit(vn, 987654321) == -ESRCH, "commit of an unknown tid");
    CHECK(nv_abort(vn, t) == 0, "abort");

    /* A direct store faults (the region is mapped read-only) and never persists. */
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
        *(volatile char *)base = 'Z';
        _exit(0);
    }
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV, "a direct store must raise SIGSEGV (status %d)", status);
    CHECK(base[0] == 0, "the direct store left no trace");
    printf("direct store: SIGSEGV\n");

    /* 4. The allocator: a root object and a table, in one transaction. */
    t = nv_txbegin(vn);
    uint64_t root_off = 0, table = 0, scratch = 0, got = 0;
    CHECK(nv_tx_alloc(vn, r, t, sizeof(struct root), &root_off) == 0, "alloc root");
    CHECK(nv_tx_alloc(vn, r, t, 100000, &table) == 0, "alloc table");
    CHECK(nv_tx_alloc(vn, r, t, 48, &scratch) == 0, "alloc scratch");
    CHECK(root_off % 16 == 0 && table % 16 == 0, "alignment");
    struct root rt;
    memset(&rt, 0, sizeof rt);
    strcpy(rt.name, "c example");
    rt.table = table;
    rt.entries = 1000;
    write_all(vn, t, base, root_off, &rt, sizeof rt);
    static uint64_t vals[1000];
    for (int i = 0; i < 1000; i++) vals[i] = (uint64_t)i * i;
    write_all(vn, t, base, table, vals, sizeof vals);
    CHECK(nv_set_root(vn, r, t, root_off) == 0, "set root");
    CHECK(nv_root(vn, r, 0, &got) == 0 && got == 0, "the committed root is unchanged before commit");
    CHECK(nv_root(vn, r, t, &got) == 0 && got == root_off, "the transaction sees its own root");
    CHECK(nv_tx_free(vn, r, t, scratch) == 0, "free scratch");
    CHECK(nv_tx_free(vn, r, t, scratch) == -EALREADY, "double free -> EALREADY");
    CHECK(nv_tx_free(vn, r, t, table + 8) == -EINVAL, "foreign offset -> EINVAL");
    printf("bad free refused: %s\n", tiermem_last_error());
    CHECK(nv_tx_free(vn, r, t, root_off) == -EINVAL, "freeing the root -> EINVAL");
    CHECK(nv_tx_alloc(vn, r, t, 0, &got) == -EINVAL, "size 0 -> EINVAL");
    CHECK(nv_tx_alloc(vn, r, t, 2 * REGION_SIZE, &got) == -EINVAL, "larger than the region -> EINVAL");
    CHECK(nv_commit(vn, t) == 0, "commit allocations");
    CHECK(nv_root(vn, r, 0, &got) == 0 && got == root_off, "committed root");

    /* An aborted allocation and free change nothing. */
    t = nv_txbegin(vn);
    uint64_t gone = 0;
    CHECK(nv_tx_alloc(vn, r, t, 32, &gone) == 0, "alloc in an aborted tx");
    CHECK(nv_tx_free(vn, r, t, table) == 0, "free in an aborted tx");
    CHECK(nv_abort(vn, t) == 0, "abort");
    t = nv_txbegin(vn);
    uint64_t again = 0;
    CHECK(nv_tx_alloc(vn, r, t, 32, &again) == 0 && again == gone, "the aborted allocation left the block free");
    CHECK(nv_tx_free(vn, r, t, table) != -EALREADY, "the aborted free left the table allocated");
    CHECK(nv_abort(vn, t) == 0, "abort");
    CHECK(nv_tx_alloc(vn, r, aborted, 32, &got) == -ECANCELED, "allocator with an aborted tid");
    printf("allocator: root %llu, table %llu\n", (unsigned long long)root_off, (unsigned long long)table);

    CHECK(nv_drain(vn) == 0, "drain");
    CHECK(nv_release(vn) == 0, "release");
    CHECK(nv_recover(inst_dir) == 0, "recover of a cleanly released instance");

    /* 5. A new run of the instance reads everything back. */
    CHECK(nv_init(inst_dir, 1 << 20, 1 << 20, &vn) == 0, "re-init");
    CHECK(nv_allocate(vn, file, REGION_SIZE, NV_PRIVATE, &r) == 0, "re-allocate");
    base = nv_region_ptr(r);
    CHECK(strcmp(base + 0x10000, "hello, vnvm") == 0, "data persisted");
    CHECK(nv_root(vn, r, 0, &got) == 0 && got == root_off, "root persisted");
    const struct root *rp = (const struct root *)(base + got);
    CHECK(strcmp(rp->name, "c example") == 0 && rp->entries == 1000, "root object persisted");
    const uint64_t *tab = (const uint64_t *)(base + rp->table);
    for (int i = 0; i < 1000; i++) CHECK(tab[i] == (uint64_t)i * i, "table[%d] = %llu", i, (unsigned long long)tab[i]);
    t = nv_txbegin(vn);
    CHECK(nv_tx_free(vn, r, t, scratch) == -EALREADY, "the committed free persisted");
    CHECK(nv_commit(vn, t) == 0, "commit");
    CHECK(nv_free(vn, r) == 0, "nv_free");
    CHECK(nv_release(vn) == 0, "release");
    printf("C vnvm: all checks passed\n");
    return 0;
}
