/*
 * lookup_bench.c — lookups per second through the shardfs C API.
 *
 *   lookup_bench SHARD KEYFILE THREADS REPS [--warm]
 *
 * KEYFILE holds raw 32-byte keys back to back, in the order they are looked
 * up (bench/lookup_bench.py writes them shuffled). Each of THREADS threads
 * takes a contiguous share of the list; for every key it calls sfs_lookup()
 * and copies the whole object with sfs_read() into its own buffer (lookup +
 * read, as a reader serving the bytes would). The shard is opened once,
 * before any timing; all threads share the one sfs_shard_t (no lock).
 *
 * --warm makes one untimed pass first (page cache hot). Then REPS timed
 * passes; a pass is timed from the moment all threads are released from a
 * barrier until the last one is done (wall clock, CLOCK_MONOTONIC).
 *
 * Output, one line of JSON on stdout:
 *   {"threads": T, "keys": N, "bytes": B, "seconds": [s1, ...],
 *    "best_lookups_per_second": R}
 * seconds: wall-clock seconds per pass; bytes: object bytes read per pass;
 * R: N / the shortest pass. Exit status 1 on any error (a key not found is
 * an error: the key file must come from the shard).
 *
 * Build: gcc -O2 -Ishardfs/c bench/c/lookup_bench.c shardfs/c/shard.c \
 *            shardfs/c/chd.c shardfs/c/chd_build.c shardfs/c/writer.c \
 *            -lcmph -lcrypto -lpthread
 */
#define _GNU_SOURCE
#include <errno.h>
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
    uint64_t bytes;    /* object bytes copied */
    uint64_t checksum; /* keeps the copies from being optimised away */
    int failed;
} worker_t;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *work(void *arg)
{
    worker_t *w = arg;
    size_t cap = 1 << 20;
    uint8_t *buf = malloc(cap);
    w->bytes = 0;
    w->failed = 0;
    pthread_barrier_wait(w->start);
    if (!buf) {
        w->failed = 1;
        return NULL;
    }
    for (size_t i = 0; i < w->n; i++) {
        const uint8_t *key = w->keys + i * SFS_KEY_SIZE;
        uint64_t off, size;
        int rc = sfs_lookup(w->shard, key, &off, &size);
        if (rc != SFS_OK) {
            fprintf(stderr, "lookup_bench: key %zu: %s\n", i, sfs_strstatus(rc));
            w->failed = 1;
            break;
        }
        if (size > cap) {
            free(buf);
            while (cap < size)
                cap *= 2;
            if (!(buf = malloc(cap))) {
                w->failed = 1;
                return NULL;
            }
        }
        if ((rc = sfs_read(w->shard, off, buf, size)) != SFS_OK) {
            fprintf(stderr, "lookup_bench: read %zu: %s\n", i, sfs_strstatus(rc));
            w->failed = 1;
            break;
        }
        w->bytes += size;
        if (size)
            w->checksum += buf[0] + buf[size - 1];
    }
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
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int t = 0; t < threads; t++) {
        size_t lo = n * t / threads, hi = n * (t + 1) / threads;
        w[t] = (worker_t){shard, keys + lo * SFS_KEY_SIZE, hi - lo, &start, 0, 0, 0};
        if (pthread_create(&tid[t], NULL, work, &w[t]) != 0) {
            fprintf(stderr, "lookup_bench: pthread_create failed\n");
            exit(1);
        }
    }
    pthread_barrier_wait(&start);
    double t0 = now();
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    double dt = now() - t0;
    pthread_barrier_destroy(&start);
    *bytes = 0;
    for (int t = 0; t < threads; t++) {
        if (w[t].failed)
            return -1;
        *bytes += w[t].bytes;
        *checksum += w[t].checksum;
    }
    return dt;
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: lookup_bench SHARD KEYFILE THREADS REPS [--warm]\n");
        return 2;
    }
    int threads = atoi(argv[3]), reps = atoi(argv[4]);
    int warm = argc > 5 && strcmp(argv[5], "--warm") == 0;
    if (threads < 1 || threads > 256 || reps < 1) {
        fprintf(stderr, "lookup_bench: THREADS must be 1..256 and REPS >= 1\n");
        return 2;
    }

    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "lookup_bench: %s: %s\n", argv[2], strerror(errno));
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (len <= 0 || len % SFS_KEY_SIZE) {
        fprintf(stderr, "lookup_bench: %s: not a list of 32-byte keys\n", argv[2]);
        return 1;
    }
    uint8_t *keys = malloc(len);
    if (!keys || fread(keys, 1, len, f) != (size_t)len) {
        fprintf(stderr, "lookup_bench: %s: cannot read\n", argv[2]);
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
    if (warm && pass(shard, keys, n, threads, &bytes, &checksum) < 0)
        return 1;
    double best = 0;
    printf("{\"threads\": %d, \"keys\": %zu, \"seconds\": [", threads, n);
    for (int r = 0; r < reps; r++) {
        double dt = pass(shard, keys, n, threads, &bytes, &checksum);
        if (dt < 0)
            return 1;
        if (r == 0 || dt < best)
            best = dt;
        printf("%s%.6f", r ? ", " : "", dt);
    }
    printf("], \"bytes\": %llu, \"best_lookups_per_second\": %.1f, \"checksum\": %llu}\n",
           (unsigned long long)bytes, n / best, (unsigned long long)checksum);
    sfs_close(shard);
    free(keys);
    return 0;
}
