/*
 * lookup_bench.c — lookups per second through the shardfs C API
 * (bench/bench_lookup.py builds and runs it).
 *
 *   lookup_bench SHARD KEYFILE THREADS [--warm]
 *
 * KEYFILE holds raw 32-byte keys back to back, in lookup order. Each of
 * THREADS threads takes a contiguous share; for every key it calls
 * sfs_lookup() and copies the whole object with sfs_read() into its own
 * buffer. The shard is opened once, before any timing; the threads share
 * the one sfs_shard_t (no lock). --warm: one untimed pass first. Then one
 * timed pass, from the moment all threads leave a barrier until the last
 * one is done (CLOCK_MONOTONIC). Output, one line of JSON on stdout:
 *   {"threads": T, "keys": N, "bytes": B, "seconds": S, "checksum": C}
 * Exit status 1 on any error (a key not found is one).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "shard.h"

typedef struct {
    const sfs_shard_t *shard;
    const uint8_t *keys; /* this thread's share */
    size_t n;
    pthread_barrier_t *start;
    uint64_t bytes, checksum; /* the checksum keeps the copies from being optimised away */
    int failed;
} worker_t;

static void *work(void *arg)
{
    worker_t *w = arg;
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    pthread_barrier_wait(w->start);
    for (size_t i = 0; buf && i < w->n; i++) {
        uint64_t off, size;
        int rc = sfs_lookup(w->shard, w->keys + i * SFS_KEY_SIZE, &off, &size);
        if (rc == SFS_OK && size > cap) {
            while (cap < size)
                cap *= 2;
            free(buf);
            if (!(buf = malloc(cap)))
                break;
        }
        if (rc == SFS_OK)
            rc = sfs_read(w->shard, off, buf, size);
        if (rc != SFS_OK) {
            fprintf(stderr, "lookup_bench: key %zu: %s\n", i, sfs_strstatus(rc));
            w->failed = 1;
            break;
        }
        w->bytes += size;
        if (size)
            w->checksum += buf[0] + buf[size - 1];
    }
    w->failed |= !buf;
    free(buf);
    return NULL;
}

/* One pass over all keys with `threads` threads: wall-clock seconds, or < 0. */
static double pass(const sfs_shard_t *shard, const uint8_t *keys, size_t n, int threads,
                   uint64_t *bytes, uint64_t *checksum)
{
    pthread_t tid[threads];
    worker_t w[threads];
    pthread_barrier_t start;
    struct timespec t0, t1;
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int t = 0; t < threads; t++) {
        size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        w[t] = (worker_t){shard, keys + lo * SFS_KEY_SIZE, hi - lo, &start, 0, 0, 0};
        if (pthread_create(&tid[t], NULL, work, &w[t]) != 0)
            exit(1);
    }
    pthread_barrier_wait(&start);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pthread_barrier_destroy(&start);
    *bytes = 0;
    for (int t = 0; t < threads; t++) {
        if (w[t].failed)
            return -1;
        *bytes += w[t].bytes;
        *checksum += w[t].checksum;
    }
    return (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

int main(int argc, char **argv)
{
    int threads = argc > 3 ? atoi(argv[3]) : 0;
    if (threads < 1 || threads > 256) {
        fprintf(stderr, "usage: lookup_bench SHARD KEYFILE THREADS(1..256) [--warm]\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    long len = f && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    uint8_t *keys = len > 0 && len % SFS_KEY_SIZE == 0 ? malloc(len) : NULL;
    if (!keys || fseek(f, 0, SEEK_SET) || fread(keys, 1, len, f) != (size_t)len) {
        fprintf(stderr, "lookup_bench: %s: not a readable list of 32-byte keys\n", argv[2]);
        return 1;
    }
    fclose(f);
    size_t n = len / SFS_KEY_SIZE;
    sfs_shard_t *shard;
    sfs_error_t err;
    if (sfs_open(argv[1], 0, &shard, &err) != SFS_OK) {
        fprintf(stderr, "lookup_bench: %s\n", err.message);
        return 1;
    }
    uint64_t bytes = 0, checksum = 0;
    if (argc > 4 && strcmp(argv[4], "--warm") == 0 && pass(shard, keys, n, threads, &bytes, &checksum) < 0)
        return 1;
    double dt = pass(shard, keys, n, threads, &bytes, &checksum);
    if (dt < 0)
        return 1;
    printf("{\"threads\": %d, \"keys\": %zu, \"bytes\": %llu, \"seconds\": %.6f, \"checksum\": %llu}\n",
           threads, n, (unsigned long long)bytes, dt, (unsigned long long)checksum);
    sfs_close(shard);
    free(keys);
    return 0;
}
