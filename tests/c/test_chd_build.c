/*
 * test_chd_build.c — C tests of our CHD_PH builder (shardfs/c/chd_build.c).
 *
 * For key sets of 1, 2, 3, 100, 128, 129, 10,000 and 1,000,000 random keys,
 * and for sets built to crowd one bucket: the dump is accepted by
 * sfs_chd_parse() and by cmph_load(); cmph_search() and sfs_chd_search()
 * agree on every key and on absent keys; every key gets its own slot below
 * n; n and nbuckets are sfs_chd_build_shape()'s; the same keys give the
 * same bytes. A seed that fails (two keys of one bucket with the same
 * (f, h), found by search for the builder's first seed) makes the builder
 * go on to the next seed; duplicate keys, zero keys and max_seeds = 1 on
 * that failing seed are errors with their codes.
 */
#define _GNU_SOURCE
#include "chd.h"

#include <cmph.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static const uint8_t *key_at(void *ctx, uint32_t i) { return (const uint8_t *)ctx + 32 * (size_t)i; }

/* Check a built function over keys[0..n) against cmph and our evaluator. */
static void check_function(const char *what, const sfs_chd_built_t *b, const uint8_t *keys,
                           uint32_t nkeys)
{
    uint32_t n, nb;
    CHECK(sfs_chd_build_shape(nkeys, &n, &nb) == 0 && b->n == n && b->nbuckets == nb,
          "%s: shape %u slots %u buckets", what, b->n, b->nbuckets);
    sfs_chd_t c;
    char why[256];
    if (sfs_chd_parse(&c, b->dump, b->dump_len, why, sizeof(why)) < 0) {
        CHECK(0, "%s: parse: %s", what, why);
        return;
    }
    CHECK(c.n == b->n && c.nbuckets == b->nbuckets && c.seed == b->seed && c.rem_r >= 1 &&
              c.dump_size == b->dump_len,
          "%s: parsed n %u nbuckets %u seed %u rem_r %u", what, c.n, c.nbuckets, c.seed, c.rem_r);
    FILE *f = fmemopen(b->dump, b->dump_len, "r");
    cmph_t *mph = f ? cmph_load(f) : NULL;
    if (f)
        fclose(f);
    if (!mph) {
        CHECK(0, "%s: cmph_load", what);
        return;
    }
    CHECK(cmph_size(mph) == b->n, "%s: cmph_size %u", what, cmph_size(mph));
    uint8_t *used = calloc(b->n, 1);
    uint64_t disagree = 0, out = 0, twice = 0;
    for (uint32_t i = 0; i < nkeys; i++) {
        const uint8_t *k = keys + 32 * (size_t)i;
        uint32_t s = cmph_search(mph, (const char *)k, 32);
        disagree += sfs_chd_search(&c, k, 32) != s;
        if (s >= b->n) {
            out++;
            continue;
        }
        twice += used[s]++ != 0;
    }
    for (int i = 0; i < 2000; i++) {
        uint8_t k[32];
        rand_key(k);
        uint32_t s = cmph_search(mph, (const char *)k, 32);
        disagree += sfs_chd_search(&c, k, 32) != s;
        out += s >= b->n;
    }
    CHECK(disagree == 0 && out == 0 && twice == 0,
          "%s: %llu keys where cmph and ours disagree, %llu out of range, %llu slots used twice",
          what, (unsigned long long)disagree, (unsigned long long)out, (unsigned long long)twice);
    free(used);
    cmph_destroy(mph);
}

static uint8_t *random_keys(uint32_t n)
{
    uint8_t *keys = malloc(32 * (size_t)n + 1);
    for (uint32_t i = 0; i < n; i++)
        rand_key(keys + 32 * (size_t)i);
    return keys;
}

static void test_sizes(void)
{
    uint32_t sizes[] = {1, 2, 3, 100, 128, 129, 10000, 1000000};
    for (size_t t = 0; t < sizeof(sizes) / sizeof(sizes[0]); t++) {
        uint32_t n = sizes[t];
        uint8_t *keys = random_keys(n);
        sfs_chd_built_t b, again;
        char why[256], what[64];
        snprintf(what, sizeof(what), "%u keys", n);
        int rc = sfs_chd_build(key_at, keys, n, 32, NULL, &b, why, sizeof(why));
        CHECK(rc == SFS_CHD_BUILD_OK, "%s: build: %d %s", what, rc, why);
        if (rc == SFS_CHD_BUILD_OK) {
            check_function(what, &b, keys, n);
            /* deterministic: the same keys, the same bytes */
            rc = sfs_chd_build(key_at, keys, n, 32, NULL, &again, why, sizeof(why));
            CHECK(rc == SFS_CHD_BUILD_OK && again.dump_len == b.dump_len &&
                      memcmp(again.dump, b.dump, b.dump_len) == 0,
                  "%s: a second build differs", what);
            if (rc == SFS_CHD_BUILD_OK)
                free(again.dump);
            free(b.dump);
        }
        free(keys);
    }
}

/* Bucket of a key under the builder's seed number k, for a set of nkeys. */
static uint32_t bucket_of(const uint8_t *key, uint32_t k, uint32_t nkeys, uint32_t *f,
                          uint32_t *h)
{
    uint32_t n, nb, hl[3];
    sfs_chd_build_shape(nkeys, &n, &nb);
    sfs_chd_jenkins(sfs_chd_build_seed(k), key, 32, hl);
    *f = hl[1] % n;
    *h = hl[2] % (n - 1) + 1;
    return hl[0] % nb;
}

/* Two keys that are twins under seed 0 (same bucket, f and h): seed 0 must
 * fail and seed 1 be used. */
static void test_failing_seed(void)
{
    uint8_t keys[64];
    uint32_t f0, h0, f1, h1, tries = 0;
    rand_key(keys);
    uint32_t g0 = bucket_of(keys, 0, 2, &f0, &h0);
    do {
        rand_key(keys + 32);
        tries++;
    } while (bucket_of(keys + 32, 0, 2, &f1, &h1) != g0 || f1 != f0 || h1 != h0);
    sfs_chd_built_t b;
    char why[256] = "";
    int rc = sfs_chd_build(key_at, keys, 2, 32, NULL, &b, why, sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_OK, "twins: build: %s", why);
    if (rc == SFS_CHD_BUILD_OK) {
        CHECK(b.seeds_tried >= 2 && b.seed != sfs_chd_build_seed(0),
              "twins: %u seeds tried (after %u candidate keys)", b.seeds_tried, tries);
        check_function("twins", &b, keys, 2);
        free(b.dump);
    }
    sfs_chd_build_opts_t one = {.first_seed = 0, .max_seeds = 1};
    rc = sfs_chd_build(key_at, keys, 2, 32, &one, &b, why, sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_FAILED && strstr(why, "after 1 seeds") && b.dump == NULL,
          "twins, one seed: %d %s", rc, why);
    /* the same pair, starting at seed 1: works at once */
    sfs_chd_build_opts_t from1 = {.first_seed = 1, .max_seeds = 1};
    rc = sfs_chd_build(key_at, keys, 2, 32, &from1, &b, why, sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_OK && b.seeds_tried == 1 && b.seed == sfs_chd_build_seed(1),
          "twins from seed 1: %d %s", rc, why);
    if (rc == SFS_CHD_BUILD_OK)
        free(b.dump);
}

/* 1,000 keys, of which `crowd` share one bucket under seed 0. */
static void test_crowded_bucket(uint32_t crowd)
{
    uint32_t n = 1000, f, h;
    uint8_t *keys = malloc(32 * (size_t)n);
    for (uint32_t i = 0; i < n; i++) {
        do
            rand_key(keys + 32 * (size_t)i);
        while (i < crowd && bucket_of(keys + 32 * (size_t)i, 0, n, &f, &h) != 7);
    }
    sfs_chd_built_t b;
    char why[256] = "", what[64];
    snprintf(what, sizeof(what), "a bucket of %u keys", crowd);
    int rc = sfs_chd_build(key_at, keys, n, 32, NULL, &b, why, sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_OK, "%s: build: %s", what, why);
    if (rc == SFS_CHD_BUILD_OK) {
        check_function(what, &b, keys, n);
        free(b.dump);
    }
    free(keys);
}

static void test_errors(void)
{
    uint8_t keys[64];
    sfs_chd_built_t b;
    char why[256] = "";
    int rc = sfs_chd_build(key_at, keys, 0, 32, NULL, &b, why, sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_EINVAL && b.dump == NULL, "0 keys: %d %s", rc, why);
    rc = sfs_chd_build(key_at, keys, (uint64_t)SFS_CHD_MAX_KEYS + 1, 32, NULL, &b, why,
                       sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_EINVAL, "too many keys: %d %s", rc, why);
    rand_key(keys);
    memcpy(keys + 32, keys, 32);
    rc = sfs_chd_build(key_at, keys, 2, 32, NULL, &b, why, sizeof(why));
    CHECK(rc == SFS_CHD_BUILD_FAILED && strstr(why, "after 100 seeds"), "duplicate keys: %d %s",
          rc, why);
}

int main(void)
{
    test_sizes();
    test_failing_seed();
    test_crowded_bucket(20);
    test_crowded_bucket(60);
    test_errors();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
