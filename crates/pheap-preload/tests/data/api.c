/* Allocator semantics under LD_PRELOAD=libtiermem_pheap_preload.so: every entry point, the
 * glibc/pheap ownership split, alignment, zeroing, realloc contents. Prints "api ok". */
#define _GNU_SOURCE
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c)                                                      \
    do {                                                              \
        if (!(c)) {                                                   \
            fprintf(stderr, "check failed line %d: %s\n", __LINE__, #c); \
            return 1;                                                 \
        }                                                             \
    } while (0)

/* Opaque to the compiler, so that it does not reject the deliberate overflows at build time. */
static volatile size_t huge = SIZE_MAX / 2;

static int aligned(void *p, size_t a) { return ((uintptr_t)p % a) == 0; }

int main(void) {
    /* malloc/free of many sizes, contents survive neighbours' writes. */
    enum { N = 2000 };
    static unsigned char *ps[N];
    for (int i = 0; i < N; i++) {
        size_t sz = 1 + (size_t)(i * 37) % 9000;
        ps[i] = malloc(sz);
        CHECK(ps[i] != NULL);
        CHECK(aligned(ps[i], 16));
        CHECK(malloc_usable_size(ps[i]) >= sz);
        memset(ps[i], i & 0xff, sz);
    }
    for (int i = 0; i < N; i++) {
        size_t sz = 1 + (size_t)(i * 37) % 9000;
        for (size_t j = 0; j < sz; j += 97) CHECK(ps[i][j] == (unsigned char)(i & 0xff));
        if (i % 2) free(ps[i]);
    }
    /* realloc keeps contents across grow (moving) and shrink. */
    for (int i = 0; i < N; i += 2) {
        size_t sz = 1 + (size_t)(i * 37) % 9000;
        unsigned char *q = realloc(ps[i], sz * 3 + 5000);
        CHECK(q != NULL);
        for (size_t j = 0; j < sz; j += 13) CHECK(q[j] == (unsigned char)(i & 0xff));
        q = realloc(q, 8);
        CHECK(q != NULL);
        CHECK(q[0] == (unsigned char)(i & 0xff));
        free(q);
    }
    /* calloc zeroes, also a reused slot; overflow refused. */
    unsigned char *d = malloc(512);
    memset(d, 0xAB, 512);
    free(d);
    unsigned char *z = calloc(64, 8);
    CHECK(z != NULL);
    for (int j = 0; j < 512; j++) CHECK(z[j] == 0);
    free(z);
    errno = 0;
    CHECK(calloc(huge, 4) == NULL && errno == ENOMEM);
    /* Aligned allocations, small and large alignments. */
    size_t aligns[] = {8, 16, 32, 64, 256, 1024, 4096, 8192, 65536};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        size_t a = aligns[k];
        void *p = NULL;
        CHECK(posix_memalign(&p, a, 100) == 0 && aligned(p, a));
        memset(p, 1, 100);
        free(p);
        p = aligned_alloc(a, 3 * a);
        CHECK(p != NULL && aligned(p, a));
        memset(p, 2, 3 * a);
        p = realloc(p, 6 * a);
        CHECK(p != NULL && ((unsigned char *)p)[3 * a - 1] == 2);
        free(p);
        p = memalign(a, 5000);
        CHECK(p != NULL && aligned(p, a));
        free(p);
    }
    void *p = NULL;
    CHECK(posix_memalign(&p, 24, 10) == EINVAL);
    p = valloc(10);
    CHECK(p != NULL && aligned(p, 4096));
    free(p);
    p = pvalloc(10);
    CHECK(p != NULL && aligned(p, 4096) && malloc_usable_size(p) >= 4096);
    free(p);
    /* reallocarray, realloc(NULL), realloc(p, 0), free(NULL). */
    int *arr = reallocarray(NULL, 100, sizeof(int));
    CHECK(arr != NULL);
    for (int i = 0; i < 100; i++) arr[i] = i;
    arr = reallocarray(arr, 10000, sizeof(int));
    CHECK(arr != NULL && arr[99] == 99);
    errno = 0;
    CHECK(reallocarray(arr, huge, 4) == NULL && errno == ENOMEM);
    free(arr);
    p = realloc(NULL, 33);
    CHECK(p != NULL);
    CHECK(realloc(p, 0) == NULL);
    free(NULL);
    /* glibc-internal allocations handed to the program and freed by it. */
    char *s = strdup("hello pheap");
    CHECK(s && strcmp(s, "hello pheap") == 0);
    free(s);
    char *line = NULL;
    size_t cap = 0;
    FILE *f = fmemopen("one line\nand a much longer second line of text\n", 48, "r");
    CHECK(f != NULL);
    while (getline(&line, &cap, f) > 0) {}
    fclose(f);
    free(line);
    CHECK(malloc_usable_size(NULL) == 0);
    /* fork: the child's heap writes must not reach the parent's heap. */
    char *mine = malloc(64);
    strcpy(mine, "parent");
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        strcpy(mine, "child!");
        char *x = malloc(100);
        strcpy(x, "child allocation");
        free(x);
        /* No free(mine) here: the compiler may drop stores to memory that is then freed. */
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK(strcmp(mine, "parent") == 0);
    free(mine);
    printf("api ok\n");
    return 0;
}
