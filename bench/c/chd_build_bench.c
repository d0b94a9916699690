/*
 * chd_build_bench.c — the CHD_PH build alone, cmph's against ours
 * (shardfs/c/chd_build.c), over the same random keys, for profiling.
 *
 *   chd_build_bench KEYS REPS [cmph|shardfs]
 *
 * KEYS random 32-byte keys (xorshift, fixed seed) in one array. Each
 * repetition builds with cmph (cmph_new with the writer's settings: CHD_PH,
 * load factor 0.99, keys_per_bin 1, b 4; then cmph_dump into memory) and
 * with ours, alternating (cmph first on even repetitions); one builder only
 * when named (to profile it: perf record -g chd_build_bench 1000000 5 cmph).
 * Output, one line per build: ns per key (wall clock, CLOCK_MONOTONIC),
 * slots and dump bytes; then the best of each. Exit status 1 if a build
 * fails.
 *
 * Build: gcc -O2 -g -Ishardfs/c -Itests/c bench/c/chd_build_bench.c \
 *            shardfs/c/chd_build.c shardfs/c/chd.c -lcmph
 */
#define _GNU_SOURCE
#include <cmph.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chd.h"
#include "check.h"

static uint8_t *keys;
static uint32_t cursor;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int src_read(void *data, char **key, cmph_uint32 *keylen)
{
    *key = (char *)keys + 32 * (size_t)cursor++;
    *keylen = 32;
    return 32;
}
static void src_dispose(void *data, char *key, cmph_uint32 keylen) {}
static void src_rewind(void *data) { cursor = 0; }
static const uint8_t *key_at(void *ctx, uint32_t i) { return keys + 32 * (size_t)i; }

/* Seconds of one build, or -1; *slots and *bytes of the result. */
static double build_cmph(uint32_t n, uint32_t *slots, size_t *bytes)
{
    cmph_io_adapter_t src = {NULL, n, src_read, src_dispose, src_rewind};
    double t = now();
    cmph_config_t *c = cmph_config_new(&src);
    cmph_config_set_algo(c, CMPH_CHD_PH);
    cmph_config_set_graphsize(c, 0.99);
    cmph_config_set_keys_per_bin(c, 1);
    cmph_config_set_b(c, 4);
    cmph_t *mph = cmph_new(c);
    cmph_config_destroy(c);
    if (!mph)
        return -1;
    char *dump;
    FILE *f = open_memstream(&dump, bytes);
    cmph_dump(mph, f);
    fclose(f);
    t = now() - t;
    *slots = cmph_size(mph);
    free(dump);
    cmph_destroy(mph);
    return t;
}

static double build_ours(uint32_t n, uint32_t *slots, size_t *bytes)
{
    sfs_chd_built_t b;
    char why[200];
    double t = now();
    if (sfs_chd_build(key_at, NULL, n, 32, NULL, &b, why, sizeof(why)) != SFS_CHD_BUILD_OK) {
        fprintf(stderr, "%s\n", why);
        return -1;
    }
    t = now() - t;
    *slots = b.n;
    *bytes = b.dump_len;
    free(b.dump);
    return t;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s KEYS REPS [cmph|shardfs]\n", argv[0]);
        return 2;
    }
    uint32_t n = (uint32_t)strtoul(argv[1], NULL, 10);
    int reps = atoi(argv[2]);
    const char *only = argc > 3 ? argv[3] : NULL;
    keys = malloc(32 * (size_t)n);
    for (uint32_t i = 0; i < n; i++)
        rand_key(keys + 32 * (size_t)i);
    const char *names[2] = {"cmph", "shardfs"};
    double best[2] = {1e30, 1e30};
    for (int r = 0; r < reps; r++) {
        for (int j = 0; j < 2; j++) {
            int which = r % 2 ? 1 - j : j;
            if (only && strcmp(only, names[which]) != 0)
                continue;
            uint32_t slots = 0;
            size_t bytes = 0;
            double t = which ? build_ours(n, &slots, &bytes) : build_cmph(n, &slots, &bytes);
            if (t < 0) {
                fprintf(stderr, "%s: build failed\n", names[which]);
                return 1;
            }
            if (t < best[which])
                best[which] = t;
            printf("%s: %u keys, %.1f ns/key, %u slots, dump %zu bytes\n", names[which], n,
                   t / n * 1e9, slots, bytes);
        }
    }
    for (int which = 0; which < 2; which++)
        if (best[which] < 1e30)
            printf("best %s: %.1f ns/key\n", names[which], best[which] / n * 1e9);
    free(keys);
    return 0;
}
