/* A program that calls the allocator rarely: one allocation and one free every 10 ms for
 * 0.6 s, each object written. Used to check that a periodic checkpoint still comes about on
 * time when a thread's calls are slow (the preload reads the clock on every such call). */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int main(void) {
    void *keep[60];
    for (int i = 0; i < 60; i++) {
        keep[i] = malloc(100 + i);
        if (!keep[i])
            return 1;
        memset(keep[i], i, 100 + i);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < 60; i++)
        free(keep[i]);
    puts("slow ok");
    return 0;
}
