/*
 * open_read.c — files per second read whole by a C reader: open(2), read(2)
 * until EOF, close(2), for each path of a list, with no Python (and no
 * ioctl: CPython's buffered open() asks every file whether it is a
 * terminal, which costs a request on any FUSE mount).
 *
 *   open_read DIR NAMEFILE THREADS
 *
 * NAMEFILE holds one name per line, relative to DIR, in the order they are
 * read. Each of THREADS threads takes a contiguous share of the list. One
 * timed pass, from the moment all threads leave a barrier until the last
 * one is done (CLOCK_MONOTONIC). Output, one line of JSON on stdout:
 *   {"files": N, "bytes": B, "seconds": S, "files_per_second": R}
 * Exit status 1 when a file cannot be opened or read.
 *
 * Build: gcc -O2 -o open_read bench/c/open_read.c -lpthread
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char **names;
static size_t nnames;
static int dirfd_;
static pthread_barrier_t start;

typedef struct {
    size_t begin, end;
    unsigned long long bytes;
    int failed;
} share_t;

static void *reader(void *arg)
{
    share_t *sh = arg;
    static __thread char buf[1 << 20];
    pthread_barrier_wait(&start);
    for (size_t i = sh->begin; i < sh->end; i++) {
        int fd = openat(dirfd_, names[i], O_RDONLY);
        if (fd < 0) {
            fprintf(stderr, "open_read: %s: %s\n", names[i], strerror(errno));
            sh->failed = 1;
            return NULL;
        }
        ssize_t n;
        while ((n = read(fd, buf, sizeof(buf))) > 0)
            sh->bytes += (unsigned long long)n;
        if (n < 0) {
            fprintf(stderr, "open_read: %s: %s\n", names[i], strerror(errno));
            sh->failed = 1;
        }
        close(fd);
    }
    return NULL;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: open_read DIR NAMEFILE THREADS\n");
        return 2;
    }
    int threads = atoi(argv[3]);
    dirfd_ = open(argv[1], O_RDONLY | O_DIRECTORY);
    FILE *f = fopen(argv[2], "r");
    if (dirfd_ < 0 || !f || threads < 1 || threads > 256) {
        fprintf(stderr, "open_read: cannot open %s or %s, or bad THREADS\n", argv[1], argv[2]);
        return 2;
    }
    size_t cap = 1024;
    names = malloc(cap * sizeof(char *));
    char *line = NULL;
    size_t len = 0;
    ssize_t got;
    while ((got = getline(&line, &len, f)) > 0) {
        if (line[got - 1] == '\n')
            line[--got] = 0;
        if (!got)
            continue;
        if (nnames == cap)
            names = realloc(names, (cap *= 2) * sizeof(char *));
        names[nnames++] = strdup(line);
    }
    free(line);
    fclose(f);
    pthread_t tid[256];
    share_t sh[256];
    pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
    for (int t = 0; t < threads; t++) {
        sh[t] = (share_t){.begin = nnames * (size_t)t / (size_t)threads,
                          .end = nnames * (size_t)(t + 1) / (size_t)threads};
        pthread_create(&tid[t], NULL, reader, &sh[t]);
    }
    pthread_barrier_wait(&start);
    double t0 = now();
    unsigned long long bytes = 0;
    int failed = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        bytes += sh[t].bytes;
        failed |= sh[t].failed;
    }
    double seconds = now() - t0;
    printf("{\"files\": %zu, \"bytes\": %llu, \"seconds\": %.6f, \"files_per_second\": %.1f}\n", nnames, bytes,
           seconds, (double)nnames / seconds);
    return failed;
}
