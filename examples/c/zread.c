/* z-READ from C: zero-copy views of a file this program writes (argv[1]: a directory on a block
 * file system), tiermem_zread_into into page-aligned buffers with the loss model off (every
 * aligned page remapped) and on, a forked child that overwrites the file while a view and a
 * remapped buffer are held (both keep the old bytes, a new read sees the new ones), exclusive
 * mode's writes, a truncation under a view with privatisation off (tiermem_zread_check says
 * -ESTALE), and bad input (a directory, a write-only fd, a pipe, NULL and closed handles). */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <tiermem.h>
#include <unistd.h>

#define CHECK(cond, ...)                                                   \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "FAILED line %d: ", __LINE__);                      \
      fprintf(stderr, __VA_ARGS__);                                        \
      fprintf(stderr, " (errno %d, last error: %s)\n", errno,             \
              tiermem_last_error());                                       \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

enum { PS = 4096, PAGES = 64 };

/* The byte at file offset `off` in generation `gen` of the file. */
static uint8_t byte_at(uint64_t off, unsigned gen) {
  return (uint8_t)((off / PS) * 7u + off % 251u + gen * 101u);
}

static int matches(const uint8_t *p, uint64_t off, size_t len, unsigned gen) {
  for (size_t i = 0; i < len; i++)
    if (p[i] != byte_at(off + i, gen)) return 0;
  return 1;
}

static void write_file(const char *path, unsigned gen) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0, "create %s", path);
  static uint8_t page[PS];
  for (uint64_t p = 0; p < PAGES; p++) {
    for (int i = 0; i < PS; i++) page[i] = byte_at(p * PS + i, gen);
    CHECK(pwrite(fd, page, PS, (off_t)(p * PS)) == PS, "pwrite");
  }
  CHECK(close(fd) == 0, "close");
}

/* Runs `what` in a forked child (open O_RDWR + pwrite of generation `gen`, or truncate) and
 * waits for it: the child's open or truncate waits for the lease break to be handled. */
static void child_overwrites(const char *path, unsigned gen, int truncate_to_pages) {
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    if (truncate_to_pages >= 0) _exit(truncate(path, (off_t)truncate_to_pages * PS) == 0 ? 0 : 3);
    int fd = open(path, O_RDWR);
    if (fd < 0) _exit(4);
    static uint8_t page[PS];
    for (uint64_t p = 0; p < PAGES; p++) {
      for (int i = 0; i < PS; i++) page[i] = byte_at(p * PS + i, gen);
      if (pwrite(fd, page, PS, (off_t)(p * PS)) != PS) _exit(5);
    }
    _exit(close(fd) == 0 ? 0 : 6);
  }
  int st = 0;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %d", st);
}

static TiermemZreadStats stats_of(const TiermemZfile *z) {
  TiermemZreadStats s;
  CHECK(tiermem_zread_stats(z, &s) == 0, "stats");
  return s;
}

static void *aligned_buffer(size_t len) {
  void *p = NULL;
  CHECK(posix_memalign(&p, PS, len) == 0, "posix_memalign");
  memset(p, 0xEE, len);
  return p;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  char path[4096];
  snprintf(path, sizeof path, "%s/zdata", argv[1]);
  write_file(path, 0);

  /* 1. Views: the page cache's own pages under a read lease. */
  TiermemZreadOptions o;
  CHECK(tiermem_zread_options_default(&o) == 0, "defaults");
  CHECK(o.zero_copy == TIERMEM_ZREAD_LEASE && o.privatise == 1 && o.model == 1 && o.zap_after > 0,
        "default options");
  TiermemZfile *z = tiermem_zread_open(path, NULL);
  CHECK(z != NULL, "open %s", path);
  CHECK(tiermem_zread_is_zero_copy(z) == 1, "no zero copy after open");
  const uint8_t *p = NULL;
  size_t n = 0;
  TiermemZview *v = tiermem_zread(z, 100, 3 * PS, &p, &n);
  CHECK(v != NULL && n == 3 * PS && matches(p, 100, n, 0), "view of 3 pages at 100");
  CHECK(tiermem_zread_view_is_zero_copy(v) == 1, "view is a copy");
  CHECK(tiermem_zread_check(v) == 0, "check");
  CHECK(tiermem_zread_release(z, v) == 0, "release");
  CHECK(tiermem_zread_release(z, v) == -EBADF, "double release");
  /* Past the end: short, then empty. */
  v = tiermem_zread(z, (PAGES - 1) * PS + 10, 2 * PS, &p, &n);
  CHECK(v != NULL && n == PS - 10 && matches(p, (PAGES - 1) * PS + 10, n, 0), "tail view");
  CHECK(tiermem_zread_release(z, v) == 0, "release");
  v = tiermem_zread(z, PAGES * PS + 5, 10, &p, &n);
  CHECK(v != NULL && n == 0, "view past the end: %zu bytes", n);
  CHECK(tiermem_zread_release(z, v) == 0, "release");

  /* 2. zread_into with the model off: every aligned page is remapped. */
  o.model = 0;
  TiermemZfile *z2 = tiermem_zread_open(path, &o);
  CHECK(z2 != NULL, "open with model off");
  uint8_t *buf = aligned_buffer(16 * PS);
  ptrdiff_t r = tiermem_zread_into(z2, 4 * PS, buf, 16 * PS);
  CHECK(r == 16 * PS && matches(buf, 4 * PS, 16 * PS, 0), "zread_into (model off): %td", r);
  TiermemZreadStats s = stats_of(z2);
  CHECK(s.into_calls == 1 && s.into_remapped_pages == 16, "remapped %llu pages, not 16",
        (unsigned long long)s.into_remapped_pages);
  /* Unaligned offset: copied, same bytes. */
  uint8_t *buf2 = aligned_buffer(4 * PS);
  r = tiermem_zread_into(z2, 4 * PS + 1, buf2, 4 * PS);
  CHECK(r == 4 * PS && matches(buf2, 4 * PS + 1, 4 * PS, 0), "unaligned zread_into");
  CHECK(stats_of(z2).into_remapped_pages == 16, "an unaligned read remapped");
  /* Writing into a remapped buffer changes the buffer only (copy-on-write), not the file. */
  r = tiermem_zread_into(z2, 0, buf2, 4 * PS);
  CHECK(r == 4 * PS && matches(buf2, 0, 4 * PS, 0), "re-read");
  const uint8_t flipped = (uint8_t)(byte_at(5, 0) ^ 0xFF);
  buf2[5] = flipped;
  CHECK(buf2[5] == flipped, "the write to the remapped buffer was lost");
  v = tiermem_zread(z, 0, PS, &p, &n);
  CHECK(v != NULL && matches(p, 0, PS, 0), "the file changed through a remapped buffer");
  CHECK(tiermem_zread_release(z, v) == 0, "release");

  /* 3. zread_into with the model on: the bytes are right whatever it chooses. */
  uint8_t *buf3 = aligned_buffer(8 * PS);
  for (int i = 0; i < 4; i++) {
    r = tiermem_zread_into(z, (uint64_t)(8 + i * 8) * PS, buf3, 8 * PS);
    CHECK(r == 8 * PS && matches(buf3, (uint64_t)(8 + i * 8) * PS, 8 * PS, 0), "zread_into (model on)");
  }
  s = stats_of(z);
  printf("model on: %llu of %llu requests remapped (%llu pages), %llu sent to copy by the model\n",
         (unsigned long long)(s.into_calls - s.model_copies), (unsigned long long)s.into_calls,
         (unsigned long long)s.into_remapped_pages, (unsigned long long)s.model_copies);

  /* 4. Another process overwrites the file while a view and a remapped buffer are held. */
  TiermemZview *held = tiermem_zread(z, 0, 8 * PS, &p, &n);
  CHECK(held != NULL && n == 8 * PS && matches(p, 0, n, 0), "held view");
  CHECK(tiermem_zread_view_is_zero_copy(held) == 1, "held view is a copy");
  r = tiermem_zread_into(z2, 4 * PS, buf, 16 * PS);
  CHECK(r == 16 * PS && stats_of(z2).into_remapped_pages == 16 + 4 + 16, "remap before the write");
  child_overwrites(path, 1, -1);
  CHECK(matches(p, 0, 8 * PS, 0), "the held view changed under a writer");
  CHECK(tiermem_zread_check(held) == 0, "check of the held view");
  CHECK(matches(buf, 4 * PS, 16 * PS, 0), "the remapped buffer changed under a writer");
  const uint8_t *q = NULL;
  TiermemZview *fresh = tiermem_zread(z, 0, 8 * PS, &q, &n);
  CHECK(fresh != NULL && n == 8 * PS && matches(q, 0, n, 1), "a new view does not see the write");
  r = tiermem_zread_into(z2, 4 * PS, buf, 16 * PS);
  CHECK(r == 16 * PS && matches(buf, 4 * PS, 16 * PS, 1), "a new zread_into does not see the write");
  s = stats_of(z);
  CHECK(s.lease_breaks >= 1 && s.privatised_pages >= 8, "lease breaks %llu, privatised pages %llu",
        (unsigned long long)s.lease_breaks, (unsigned long long)s.privatised_pages);
  /* The first of the two files to hear its lease break makes every buffer remapped onto the
   * file private (they are found by inode), so the count may be either file's. */
  CHECK(s.privatised_buffers + stats_of(z2).privatised_buffers >= 1, "no buffer privatised");
  CHECK(tiermem_zread_release(z, fresh) == 0, "release");
  CHECK(tiermem_zread_release(z2, held) == -EINVAL, "release through the wrong file");
  /* Close releases the views still held. */
  CHECK(tiermem_zread_close(z) == 0, "close");
  CHECK(tiermem_zread_check(held) == -EBADF, "a view outlived its file's close");
  CHECK(tiermem_zread_close(z) == -EBADF, "double close");
  CHECK(tiermem_zread_close(z2) == 0, "close");

  /* 5. From a caller's fd, and the fd-keyed calls. */
  int fd = open(path, O_RDONLY);
  CHECK(fd >= 0, "open");
  TiermemZfile *zf = tiermem_zread_open_fd(fd, NULL);
  CHECK(zf != NULL, "open_fd");
  v = tiermem_zread(zf, PS, PS, &p, &n);
  CHECK(v != NULL && n == PS && matches(p, PS, PS, 1), "view through open_fd");
  CHECK(tiermem_zread_close(zf) == 0, "close");
  r = tiermem_zread_into_fd(fd, 2 * PS, buf3, 8 * PS);
  CHECK(r == 8 * PS && matches(buf3, 2 * PS, 8 * PS, 1), "zread_into_fd");
  CHECK(tiermem_zforget(fd) == 0, "zforget");
  CHECK(close(fd) == 0, "close");

  /* 6. Bad input. */
  errno = 0;
  CHECK(tiermem_zread_open(argv[1], NULL) == NULL && errno == EISDIR, "a directory");
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/missing", argv[1]);
  errno = 0;
  CHECK(tiermem_zread_open(missing, NULL) == NULL && errno == ENOENT, "a missing file");
  errno = 0;
  CHECK(tiermem_zread_open(NULL, NULL) == NULL && errno == EINVAL, "NULL path");
  fd = open(path, O_WRONLY);
  CHECK(fd >= 0, "open write-only");
  errno = 0;
  CHECK(tiermem_zread_open_fd(fd, NULL) == NULL && errno == EBADF, "a write-only fd");
  CHECK(tiermem_zread_into_fd(fd, 0, buf3, PS) == -EBADF, "zread_into_fd on a write-only fd");
  close(fd);
  int pfd[2];
  CHECK(pipe(pfd) == 0, "pipe");
  errno = 0;
  CHECK(tiermem_zread_open_fd(pfd[0], NULL) == NULL && errno == EINVAL, "a pipe");
  close(pfd[0]);
  close(pfd[1]);
  errno = 0;
  CHECK(tiermem_zread_open_fd(-1, NULL) == NULL && errno == EBADF, "fd -1");
  TiermemZreadOptions bad = o;
  bad.zero_copy = 7;
  errno = 0;
  CHECK(tiermem_zread_open(path, &bad) == NULL && errno == EINVAL, "unknown mode");
  errno = 0;
  CHECK(tiermem_zread(NULL, 0, 1, &p, &n) == NULL && errno == EINVAL, "NULL file");
  CHECK(tiermem_zread_options_default(NULL) == -EINVAL, "NULL options");
  CHECK(tiermem_zread_check(NULL) == -EINVAL, "NULL view");
  CHECK(tiermem_zread_stats(NULL, &s) == -EINVAL, "NULL file stats");
  z = tiermem_zread_open(path, NULL);
  CHECK(z != NULL, "reopen");
  errno = 0;
  CHECK(tiermem_zread(z, 0, 1, NULL, &n) == NULL && errno == EINVAL, "NULL out_ptr");
  CHECK(tiermem_zread_into(z, 0, NULL, 10) == -EINVAL, "NULL buffer");
  CHECK(tiermem_zread_stats(z, NULL) == -EINVAL, "NULL stats");
  CHECK(tiermem_zread_write(z, 0, buf3, 10) == -EPERM, "a write in lease mode");
  CHECK(tiermem_zread_close(z) == 0, "close");

  /* 7. Exclusive mode: writes through z-READ keep held views and are seen after. */
  o.zero_copy = TIERMEM_ZREAD_EXCLUSIVE;
  TiermemZfile *zx = tiermem_zread_open(path, &o);
  CHECK(zx != NULL, "open exclusive");
  held = tiermem_zread(zx, 0, 2 * PS, &p, &n);
  CHECK(held != NULL && n == 2 * PS && matches(p, 0, n, 1) && tiermem_zread_view_is_zero_copy(held) == 1,
        "exclusive view");
  uint8_t *page = aligned_buffer(2 * PS);
  for (int i = 0; i < 2 * PS; i++) page[i] = byte_at((uint64_t)i, 2);
  CHECK(tiermem_zread_write(zx, 0, page, 2 * PS) == 0, "exclusive write");
  CHECK(matches(p, 0, 2 * PS, 1), "a held view changed under an exclusive write");
  fresh = tiermem_zread(zx, 0, 2 * PS, &q, &n);
  CHECK(fresh != NULL && matches(q, 0, 2 * PS, 2), "the exclusive write is not seen");
  CHECK(stats_of(zx).writes == 1, "write count");
  CHECK(tiermem_zread_close(zx) == 0, "close");

  /* 8. A truncation under a view that is not made private: the guard reads zeros there and
   * tiermem_zread_check says the bytes are not the file's. */
  o.zero_copy = TIERMEM_ZREAD_LEASE;
  o.privatise = 0;
  TiermemZfile *zt = tiermem_zread_open(path, &o);
  CHECK(zt != NULL, "open without privatisation");
  CHECK(tiermem_zread_is_zero_copy(zt) == 1, "no lease");
  held = tiermem_zread(zt, (PAGES - 4) * PS, 4 * PS, &p, &n);
  CHECK(held != NULL && n == 4 * PS && tiermem_zread_view_is_zero_copy(held) == 1, "tail view");
  CHECK(tiermem_zread_check(held) == 0, "check before truncation");
  child_overwrites(path, 0, PAGES / 2);
  unsigned sum = 0;
  for (size_t i = 0; i < n; i += PS) sum += p[i]; /* touches each page: the guard zero-fills */
  CHECK(sum == 0, "truncated pages do not read as zeros");
  CHECK(tiermem_zread_check(held) == -ESTALE, "check after truncation");
  CHECK(tiermem_zread_close(zt) == 0, "close");

  free(buf);
  free(buf2);
  free(buf3);
  free(page);
  printf("C zread: all checks passed\n");
  return 0;
}
