/*
 * check.h — the tiny harness shared by the C tests (and bench/c): a CHECK
 * macro that counts passes and failures, a deterministic xorshift random
 * generator for keys, and paths inside the test's temporary directory.
 * Header-only: each test program includes it once.
 */
#ifndef SHARDFS_TESTS_CHECK_H
#define SHARDFS_TESTS_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed __attribute__((unused)), failed __attribute__((unused));
/* The test's temporary directory (filled by main, e.g. with mkdtemp). */
static char dir[256] __attribute__((unused));

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            passed++;                                                                              \
        } else {                                                                                   \
            failed++;                                                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                   \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* CHECK, and on failure stop the program (exit status 1): for a step the
 * rest depends on, such as opening the shard it goes on to read. */
#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        int required_ = (cond);                                                                    \
        CHECK(required_, __VA_ARGS__);                                                             \
        if (!required_) {                                                                          \
            fprintf(stderr, "stopping: the steps after this one depend on it\n");                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static uint64_t rng = 88172645463325252ull;

/* Next value of a xorshift64 generator (deterministic across runs). */
static inline uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* 32 random bytes: a key. */
static inline void rand_key(uint8_t key[32])
{
    for (int i = 0; i < 4; i++) {
        uint64_t v = next_rand();
        memcpy(key + 8 * i, &v, 8);
    }
}

/* "<dir>/<name>" in a static buffer (valid until the next call). */
static inline char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return p;
}

#endif
