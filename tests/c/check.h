/*
 * check.h — the tiny harness shared by the C tests: a CHECK
 * macro that counts passes and failures (REQUIRE: the same, then stop the
 * test), a deterministic xorshift random
 * generator for keys, and paths inside the test's temporary directory.
 * Header-only: each test program includes it once.
 */
#ifndef SHARDFS_TESTS_CHECK_H
#define SHARDFS_TESTS_CHECK_H

#include <linux/magic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

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

/* CHECK a step the rest of the test depends on (an open): on failure, also
 * return from the enclosing function (void, or REQUIRE_OR's value) instead
 * of going on with a pointer or descriptor that was never set. */
#define REQUIRE_OR(value, cond, ...)                                                               \
    do {                                                                                           \
        int required_ = (cond);                                                                    \
        CHECK(required_, __VA_ARGS__);                                                             \
        if (!required_)                                                                            \
            return value;                                                                          \
    } while (0)
#define REQUIRE(cond, ...) REQUIRE_OR(, cond, __VA_ARGS__)

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

/* Make the test's temporary directory `dir`: "<parent>/<prefix>-XXXXXX",
 * the parent being the first of $TMPDIR, /tmp and the current directory
 * that is not a tmpfs (whose pages posix_fadvise(POSIX_FADV_DONTNEED)
 * cannot evict: the cold-cache checks need a real filesystem), else /tmp.
 * Returns 0, or -1 after perror. */
static inline int make_test_dir(const char *prefix)
{
    const char *parents[] = {getenv("TMPDIR"), "/tmp", "."}, *parent = "/tmp";
    for (size_t i = 0; i < sizeof(parents) / sizeof(parents[0]); i++) {
        struct statfs fs;
        if (parents[i] && *parents[i] && statfs(parents[i], &fs) == 0 && fs.f_type != TMPFS_MAGIC) {
            parent = parents[i];
            break;
        }
    }
    snprintf(dir, sizeof(dir), "%s/%s-XXXXXX", parent, prefix);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return -1;
    }
    return 0;
}

/* "<dir>/<name>" in a static buffer (valid until the next call). */
static inline char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return p;
}

#endif
