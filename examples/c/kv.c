/*
 * tiermem-kv inside a C program: start the Redis-protocol server on a free port with the
 * volatile engine and then the durable vnvm engine, talk RESP to it over a socket, stop it,
 * restart the durable one and read the data back.
 * Build: cc kv.c $(pkg-config --cflags --libs tiermem) -o kv
 * Usage: kv DIR      (DIR: an empty scratch directory, e.g. under /dev/shm)
 * Exits 0 when every check passes; prints what failed otherwise.
 */
#include <tiermem.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
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

static int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0, "socket");
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(connect(fd, (struct sockaddr *)&a, sizeof a) == 0, "connect to port %d: %s", port, strerror(errno));
    return fd;
}

/* Send a request (RESP text) and check the exact reply. */
static void expect(int fd, const char *request, const char *reply) {
    size_t n = strlen(request), want = strlen(reply);
    CHECK(write(fd, request, n) == (ssize_t)n, "write");
    char buf[256];
    size_t got = 0;
    while (got < want) {
        ssize_t k = read(fd, buf + got, sizeof buf - 1 - got);
        CHECK(k > 0, "read: connection closed after %zu bytes", got);
        got += (size_t)k;
    }
    buf[got] = 0;
    CHECK(strcmp(buf, reply) == 0, "request %s: reply %s, expected %s", request, buf, reply);
}

int main(int argc, char **argv) {
    CHECK(argc == 2, "usage: kv DIR");
    char settings[1024];
    tiermem_kv *kv = NULL;

    /* A bad setting is refused with its line. */
    CHECK(tiermem_kv_start("engine nosuch\n", &kv) == -EINVAL, "a bad engine is EINVAL");
    CHECK(tiermem_kv_start("port many\n", &kv) == -EINVAL, "a bad port is EINVAL");
    CHECK(strstr(tiermem_last_error(), "settings:1") != NULL, "error names the line: %s", tiermem_last_error());

    /* Volatile: one registered anonymous region. */
    CHECK(tiermem_kv_start("engine volatile\nport 0\nheap-size 64mb\n", &kv) == 0, "start volatile");
    int port = tiermem_kv_port(kv);
    CHECK(port > 0, "port %d", port);
    int fd = connect_to(port);
    expect(fd, "PING\r\n", "+PONG\r\n");
    expect(fd, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n", "+OK\r\n");
    expect(fd, "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "$5\r\nhello\r\n");
    close(fd);
    CHECK(tiermem_kv_stop(kv) == 0, "stop volatile");

    /* Durable: a new instance in DIR/kv, which does not exist yet ("new yes"); its data survives a stop and a
       restart (without "new": open the existing instance, never create one). */
    char create[1100];
    snprintf(settings, sizeof settings, "engine vnvm\ndir %s/kv\nport 0\nheap-size 64mb\nlog-size 8mb\ncache-size 8mb\n", argv[1]);
    CHECK(tiermem_kv_start(settings, &kv) == -EIO, "no instance in DIR yet, and no \"new yes\"");
    CHECK(strstr(tiermem_last_error(), "--new") != NULL, "error says how to create one: %s", tiermem_last_error());
    snprintf(create, sizeof create, "%snew yes\n", settings);
    CHECK(tiermem_kv_start(create, &kv) == 0, "start vnvm");
    fd = connect_to(tiermem_kv_port(kv));
    expect(fd, "*4\r\n$5\r\nRPUSH\r\n$4\r\nlist\r\n$1\r\na\r\n$1\r\nb\r\n", ":2\r\n");
    expect(fd, "*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n", ":1\r\n");
    close(fd);
    CHECK(tiermem_kv_stop(kv) == 0, "stop vnvm");

    CHECK(tiermem_kv_start(settings, &kv) == 0, "restart vnvm");
    fd = connect_to(tiermem_kv_port(kv));
    expect(fd, "*4\r\n$6\r\nLRANGE\r\n$4\r\nlist\r\n$1\r\n0\r\n$2\r\n-1\r\n", "*2\r\n$1\r\na\r\n$1\r\nb\r\n");
    expect(fd, "*2\r\n$4\r\nINCR\r\n$1\r\nn\r\n", ":2\r\n");
    close(fd);
    CHECK(tiermem_kv_stop(kv) == 0, "stop vnvm again");
    CHECK(tiermem_kv_start(create, &kv) == -EIO, "\"new yes\" over an instance is refused");

    printf("C kv: all checks passed\n");
    return 0;
}
