/* The pager (NVSwap) from C: a DRAM budget of 64 pages, an NVM buffer of 128 pages and a swap
 * file in argv[1] (a directory on a disk); a region four times the budget is written and read
 * back in random order, so its pages go out to the buffer and the swap file and fault back in;
 * a bound is set; bad input gets clear errors (swap file on tmpfs, unknown region, init twice,
 * shutdown with a region mapped). */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tiermem.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAILED line %d: ", __LINE__);                      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (last error: %s)\n", tiermem_last_error());       \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

enum { PS = 4096, BUDGET = 64, PAGES = 4 * BUDGET };

static uint64_t word(uint64_t p, uint64_t round) {
  return p * 0x9E3779B97F4A7C15ull ^ round * 0xD6E8FEB86659FD93ull;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char swap[4096];
  snprintf(swap, sizeof swap, "%s/pager.swap", argv[1]);

  TiermemPagerOptions o;
  CHECK(tiermem_pager_options_default(&o) == 0, "defaults");
  CHECK(tiermem_pager_map(PS) == NULL && strstr(tiermem_last_error(), "init"), "map before init");

  /* A shared pool that is not there is refused, with what to run. */
  o.pool_path = "/dev/shm/tiermem-c-pager-no-such.pool";
  CHECK(tiermem_pager_init(&o) == -EINVAL, "missing pool");
  CHECK(strstr(tiermem_last_error(), "pager daemon") != NULL, "message: %s", tiermem_last_error());
  o.pool_path = NULL;

  /* A swap file on tmpfs is refused. */
  o.budget_bytes = BUDGET * PS;
  o.nvm_bytes = 128 * PS;
  o.swap_bytes = 16 << 20;
  o.swap_path = "/dev/shm/tiermem-c-pager.swap";
  CHECK(tiermem_pager_init(&o) == -EOPNOTSUPP, "tmpfs swap");
  CHECK(strstr(tiermem_last_error(), "tmpfs") != NULL, "message");

  o.swap_path = swap;
  o.budget_bytes = 8 * PS;
  CHECK(tiermem_pager_init(&o) == -EINVAL, "budget below one group");
  o.budget_bytes = BUDGET * PS;
  o.control = 0; /* every page through the buffer */
  int rc = tiermem_pager_init(&o);
  CHECK(rc == 0, "init: %d", rc);
  CHECK(tiermem_pager_init(&o) == -EEXIST, "init twice");

  uint8_t *r = tiermem_pager_map(PAGES * PS);
  CHECK(r != NULL, "map");
  for (uint64_t round = 1; round <= 2; round++) {
    uint64_t x = 88172645463325252ull + round;
    for (int i = 0; i < PAGES; i++) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      uint64_t p = x % PAGES;
      uint64_t want = round == 1 ? 0 : word(p, 1);
      uint64_t got;
      memcpy(&got, r + p * PS, 8);
      /* Round 1: untouched pages read 0 or the word written earlier this round. */
      CHECK(got == want || got == word(p, round), "page %llu reads %llx", (unsigned long long)p,
            (unsigned long long)got);
      uint64_t w = word(p, round);
      memcpy(r + p * PS, &w, 8);
      memcpy(r + p * PS + PS - 8, &w, 8);
    }
    for (uint64_t p = 0; p < PAGES; p++) { /* the rest of the round: every page written */
      uint64_t w = word(p, round);
      memcpy(r + p * PS, &w, 8);
      memcpy(r + p * PS + PS - 8, &w, 8);
    }
  }
  for (uint64_t p = PAGES; p-- > 0;) {
    uint64_t a, b, w = word(p, 2);
    memcpy(&a, r + p * PS, 8);
    memcpy(&b, r + p * PS + PS - 8, 8);
    CHECK(a == w && b == w, "page %llu after the trips", (unsigned long long)p);
  }
  TiermemPagerStats s;
  CHECK(tiermem_pager_stats(&s) == 0, "stats");
  CHECK(s.pageouts_buffer > 0 && s.pageins_buffer + s.pageins_ssd > 0, "paged: out %llu in %llu",
        (unsigned long long)s.pageouts_buffer,
        (unsigned long long)(s.pageins_buffer + s.pageins_ssd));
  CHECK(s.max_resident_pages <= BUDGET + 32, "resident peaked at %llu",
        (unsigned long long)s.max_resident_pages);

  CHECK(tiermem_pager_set_bound(r, 0.99, 300000) == 0, "bound");
  CHECK(tiermem_pager_set_bound(r, 1.5, 300000) == -EINVAL, "bad percentile");
  CHECK(tiermem_pager_set_bound(r + PS, 0.99, 300000) == -ENOENT, "not a region");
  CHECK(tiermem_pager_unmap(r + PS) == -ENOENT, "unmap inside");

  /* Memory the program already has: written first, then adopted (4x the budget), paged out,
     read back through the pager, and given back whole by unmap. */
  size_t alen = 4 * BUDGET * PS;
  uint8_t *m = aligned_alloc(PS, alen);
  CHECK(m != NULL, "aligned_alloc");
  for (uint64_t p = 0; p < alen / PS; p++) {
    uint64_t w = word(p, 7);
    memcpy(m + p * PS, &w, 8);
  }
  CHECK(tiermem_pager_adopt(m + 1, PS) == -EINVAL, "unaligned adopt");
  CHECK(tiermem_pager_adopt(m, alen) == 0, "adopt: %s", tiermem_last_error());
  CHECK(tiermem_pager_adopt(m, alen) == -EEXIST, "adopt twice");
  TiermemPagerStats s2;
  for (int round = 0; round < 2; round++)
    for (uint64_t p = 0; p < alen / PS; p++) {
      uint64_t got;
      memcpy(&got, m + p * PS, 8);
      CHECK(got == word(p, 7), "adopted page %llu", (unsigned long long)p);
    }
  /* The evictor moves the adopted pages beyond the budget out in the background. */
  for (int i = 0; i < 2000; i++) {
    CHECK(tiermem_pager_stats(&s2) == 0, "stats");
    if (s2.pageouts_buffer + s2.pageouts_ssd > s.pageouts_buffer + s.pageouts_ssd &&
        s2.resident_pages <= BUDGET + 32)
      break;
    usleep(1000);
  }
  CHECK(s2.pageouts_buffer + s2.pageouts_ssd > s.pageouts_buffer + s.pageouts_ssd,
        "adopted memory was paged out: %llu+%llu then %llu+%llu",
        (unsigned long long)s.pageouts_buffer, (unsigned long long)s.pageouts_ssd,
        (unsigned long long)s2.pageouts_buffer, (unsigned long long)s2.pageouts_ssd);
  CHECK(s2.resident_pages <= BUDGET + 32, "resident %llu after adoption",
        (unsigned long long)s2.resident_pages);
  for (uint64_t p = 0; p < alen / PS; p++) {
    uint64_t got;
    memcpy(&got, m + p * PS, 8);
    CHECK(got == word(p, 7), "adopted page %llu read back", (unsigned long long)p);
  }
  CHECK(tiermem_pager_unmap(m) == 0, "give adopted memory back");
  for (uint64_t p = 0; p < alen / PS; p++) {
    uint64_t got;
    memcpy(&got, m + p * PS, 8);
    CHECK(got == word(p, 7), "page %llu after unadopt reads %llx", (unsigned long long)p,
          (unsigned long long)got);
  }
  free(m);

  CHECK(tiermem_pager_shutdown() == -EBUSY, "shutdown with a region");
  CHECK(tiermem_pager_unmap(r) == 0, "unmap");
  CHECK(tiermem_pager_shutdown() == 0, "shutdown");
  printf("C pager: %llu page-outs to the buffer, %llu page-ins (%llu from the swap file)\n",
         (unsigned long long)s.pageouts_buffer,
         (unsigned long long)(s.pageins_buffer + s.pageins_ssd),
         (unsigned long long)s.pageins_ssd);
  printf("C pager: all checks passed\n");
  return 0;
}
