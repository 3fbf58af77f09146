/*
 * The C ABI under misuse (issue #13, defect 7): a panic inside an exported function (forced
 * with TIERMEM_CAPI_TEST_PANIC=nvh_open,nvh_malloc,nv_txbegin,tiermem_pool_size) comes back as
 * an error code / NULL / 0 with "internal error (panic) in NAME" in tiermem_last_error() and
 * the library keeps working; NULL pointers, bad lengths and offsets, non-UTF-8 paths, closed
 * handles (used again, closed twice) and pointers that never were handles are errors, not
 * crashes. Run by crates/capi/tests/c_robust.rs with the variable set.
 * Usage: robust DIR
 */
#include <tiermem.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, " (last error: %s)\n", tiermem_last_error());       \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

#define ERR_HAS(s) (strstr(tiermem_last_error(), (s)) != NULL)

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: robust DIR");
    char path[1024];

    /* 1. Panics are contained. */
    snprintf(path, sizeof path, "%s/heap", argv[1]);
    int rc = nvh_open(path, NULL);
    CHECK(rc == -EIO, "nvh_open with a forced panic returned %d", rc);
    CHECK(ERR_HAS("internal error (panic) in nvh_open"), "panic message");
    CHECK(nvh_malloc(16, NULL) == NULL, "nvh_malloc with a forced panic");
    CHECK(ERR_HAS("(panic) in nvh_malloc"), "panic message");
    CHECK(nv_txbegin(NULL) == 0, "nv_txbegin with a forced panic");
    CHECK(ERR_HAS("(panic) in nv_txbegin"), "panic message");
    CHECK(tiermem_pool_size(NULL) == 0, "pool_size with a forced panic");
    CHECK(ERR_HAS("(panic) in tiermem_pool_size"), "panic message");
    CHECK(nvh_ckall(NULL) == -EBADF, "the library still answers after panics");

    /* 2. NULL pointers, non-UTF-8 paths. */
    CHECK(tiermem_pool_open(NULL, NULL) == -EINVAL, "pool_open(NULL)");
    struct TiermemPool *pool = NULL;
    CHECK(tiermem_pool_open("/dev/shm/\xff\xfe", &pool) == -EINVAL && ERR_HAS("UTF-8"),
          "non-UTF-8 path");
    struct nv_instance *inst = NULL;
    CHECK(nv_init("/dev/shm/\xc3\x28", 0, 0, &inst) == -EINVAL && ERR_HAS("UTF-8"),
          "non-UTF-8 dir");
    CHECK(nv_release(NULL) == -EINVAL, "nv_release(NULL)");
    CHECK(nv_region_size(NULL) == 0 && nv_region_ptr(NULL) == NULL, "NULL region");
    CHECK(nvh_get(NULL) == NULL && ERR_HAS("NULL"), "nvh_get(NULL)");
    CHECK(tiermem_tracker_scan(NULL, NULL, 0) == -EINVAL, "tracker_scan(NULL)");
    CHECK(tiermem_tracker_method(NULL) == -EINVAL, "tracker_method(NULL)");
    CHECK(tiermem_migrate_target_region_count(NULL) == -EINVAL, "target NULL");

    /* 3. Bad offsets and lengths on a live pool. */
    snprintf(path, sizeof path, "%s/pool", argv[1]);
    CHECK(tiermem_pool_create(path, 1 << 20, TIERMEM_POOL_NVM, 0, &pool) == 0, "pool_create");
    char buf[64];
    uint64_t size = 1 << 20; /* the data area is smaller (tiermem_pool_size panics here) */
    CHECK(tiermem_pool_read(pool, 0, NULL, 16) == -EINVAL, "read into NULL");
    CHECK(tiermem_pool_read(pool, size - 8, buf, 16) < 0, "read past the end");
    CHECK(tiermem_pool_read(pool, UINT64_MAX - 4, buf, 16) < 0, "offset overflow");
    CHECK(tiermem_pool_write(pool, UINT64_MAX - 4, buf, 16) < 0, "write offset overflow");
    CHECK(tiermem_pool_persist(pool, UINT64_MAX - 4, 16) < 0, "persist offset overflow");
    CHECK(tiermem_pool_read(pool, 0, buf, 16) == 0, "a good read still works");

    /* 4. Closed handles and pointers that never were handles. */
    tiermem_pool_close(pool);
    CHECK(tiermem_pool_read(pool, 0, buf, 16) == -EBADF && ERR_HAS("not open"),
          "read on a closed pool");
    CHECK(tiermem_pool_base(pool) == NULL, "base of a closed pool");
    tiermem_pool_close(pool); /* twice: an error message, no double free */
    CHECK(ERR_HAS("not open"), "double close");
    int not_a_handle = 42;
    CHECK(tiermem_migrate_target_region_count((void *)&not_a_handle) == -EBADF,
          "foreign target pointer");
    tiermem_migrate_target_free((void *)&not_a_handle); /* ignored, not freed */
    tiermem_migrate_source_free((void *)&not_a_handle);
    CHECK(nv_release((void *)&not_a_handle) == -EBADF, "foreign instance pointer");
    CHECK(tiermem_kv_port((void *)&not_a_handle) == -EBADF, "foreign kv pointer");
    CHECK(tiermem_kv_stop((void *)&not_a_handle) == -EBADF, "stop of a foreign kv pointer");
    CHECK(tiermem_kv_stop(NULL) == -EINVAL, "stop of a NULL kv handle");

    size_t len = 4 * 4096;
    void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(mem != MAP_FAILED, "mmap");
    struct TiermemTracker *t = NULL;
    CHECK(tiermem_tracker_create(mem, len, 0, &t) == 0, "tracker_create");
    CHECK(tiermem_tracker_method(t) >= 0, "tracker_method");
    tiermem_tracker_destroy(t);
    CHECK(tiermem_tracker_method(t) == -EBADF, "method of a destroyed tracker");
    struct TiermemPageRange r[4];
    CHECK(tiermem_tracker_scan(t, r, 4) == -EBADF, "scan of a destroyed tracker");
    tiermem_tracker_destroy(t); /* twice */
    munmap(mem, len);

    printf("C robust: all checks passed\n");
    return 0;
}
