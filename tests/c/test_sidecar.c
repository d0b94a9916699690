/*
 * test_sidecar.c — C unit tests of shardfs sidecar files (run by `make test-c`).
 *
 * Builds real shards in a temporary directory, then their sidecars, and
 * checks: the file's layout (order, fingerprints, directory) against the
 * shard, no false negatives and few false positives, candidates() against
 * may_contain() one sidecar at a time, range() against a brute-force scan,
 * deleted slots left out, damaged files that either fail to open with the
 * documented status or answer without reading out of bounds, and builds
 * that fail (missing directory, file size limit) leaving nothing behind.
 */
#define _GNU_SOURCE
#include "shard.h"
#include "sidecar.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"



static const uint8_t ident_a[32] = {1, 2, 3};
static const uint8_t ident_b[32] = {1, 2, 4};

/* A shard of n random keys (tiny objects) at `path`; keys written to keys. */
static int build_shard(const char *path, uint64_t n, uint8_t (*keys)[32])
{
    sfs_writer_t *w;
    sfs_error_t err;
    if (sfs_writer_open(path, &w, &err) != SFS_OK) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
        rand_key(keys[i]);
        if (sfs_writer_add(w, keys[i], keys[i], i % 33, &err) != SFS_OK) {
            fprintf(stderr, "%s\n", err.message);
            sfs_writer_abort(w);
            return -1;
        }
    }
    if (sfs_writer_finish(w, NULL, &err) != SFS_OK) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    return 0;
}

static uint64_t top64(const uint8_t *key)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | key[i];
    return v;
}

/* The first k bits of a and b are equal. */
static int prefix_match(const uint8_t *a, const uint8_t *b, unsigned k)
{
    unsigned bytes = k / 8, rest = k % 8;
    if (memcmp(a, b, bytes) != 0)
        return 0;
    if (rest == 0)
        return 1;
    uint8_t mask = (uint8_t)(0xFF << (8 - rest));
    return (a[bytes] & mask) == (b[bytes] & mask);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int copy_file(const char *src, const char *dst, long len)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "head -c %ld %s > %s", len, src, dst);
    return system(cmd);
}

static int no_temp_files(const char *in)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls -A %s 2>/dev/null | grep -q tmp", in);
    return system(cmd) != 0;
}

/* Every position i: fingerprint and order agree with the shard's key at
 * slot[i]; every live slot appears once. */
static void check_layout(sfs_shard_t *s, sfs_sidecar_t *sc)
{
    uint64_t n = sfs_sidecar_count(sc);
    unsigned p = sfs_sidecar_prefix_bits(sc);
    uint32_t *slots = malloc((n ? n : 1) * sizeof(uint32_t));
    CHECK(sfs_sidecar_slots(sc, 0, n, slots) == n, "slots copied");
    uint64_t bad_fp = 0, bad_order = 0, dead = 0, prev = 0;
    uint32_t prev_slot = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint8_t key[32];
        dead += sfs_slot_get(s, slots[i], key) == SFS_EMPTY_OFFSET;
        uint64_t t = top64(key);
        bad_fp += sfs_sidecar_fingerprint(sc, i) != (uint32_t)((t << p) >> 32);
        if (i && (t < prev || (t == prev && slots[i] <= prev_slot)))
            bad_order++;
        prev = t;
        prev_slot = slots[i];
    }
    CHECK(dead == 0, "%llu empty slots listed", (unsigned long long)dead);
    CHECK(bad_fp == 0, "%llu wrong fingerprints", (unsigned long long)bad_fp);
    CHECK(bad_order == 0, "%llu entries out of order", (unsigned long long)bad_order);
    qsort(slots, n, sizeof(uint32_t), cmp_u32);
    uint64_t dups = 0;
    for (uint64_t i = 1; i < n; i++)
        dups += slots[i] == slots[i - 1];
    CHECK(dups == 0, "%llu slots listed twice", (unsigned long long)dups);
    CHECK(sfs_sidecar_slots(sc, n, n + 5, slots) == 0, "slots past the end: none");
    CHECK(sfs_sidecar_fingerprint(sc, n) == 0, "fingerprint past the end: 0");
    free(slots);
}

/* range(prefix, k) gives exactly the slots of the live keys starting with
 * the prefix's first k bits (a superset when k > p + 32). */
static void check_range(sfs_shard_t *s, sfs_sidecar_t *sc, uint8_t (*keys)[32], uint64_t n,
                        const uint8_t prefix[32], unsigned k)
{
    uint64_t begin = 99, end = 0;
    sfs_sidecar_range(sc, prefix, k, &begin, &end);
    CHECK(begin <= end && end <= n, "range bounds [%llu, %llu) of %llu", (unsigned long long)begin,
          (unsigned long long)end, (unsigned long long)n);
    if (!(begin <= end && end <= n))
        return;
    uint64_t got_n = end - begin, want_n = 0;
    uint32_t *got = malloc((got_n ? got_n : 1) * sizeof(uint32_t));
    uint32_t *want = malloc((n ? n : 1) * sizeof(uint32_t));
    sfs_sidecar_slots(sc, begin, end, got);
    for (uint64_t i = 0; i < n; i++)
        if (prefix_match(keys[i], prefix, k))
            want[want_n++] = sfs_slot_of(s, keys[i]);
    qsort(got, got_n, sizeof(uint32_t), cmp_u32);
    qsort(want, want_n, sizeof(uint32_t), cmp_u32);
    unsigned p = sfs_sidecar_prefix_bits(sc);
    if (k <= p + 32) {
        CHECK(got_n == want_n && memcmp(got, want, want_n * sizeof(uint32_t)) == 0,
              "range of %u bits (p=%u, n=%llu): %llu slots, brute force %llu", k, p,
              (unsigned long long)n, (unsigned long long)got_n, (unsigned long long)want_n);
    } else {
        uint64_t missing = 0, j = 0;
        for (uint64_t i = 0; i < want_n; i++) {
            while (j < got_n && got[j] < want[i])
                j++;
            missing += j == got_n || got[j] != want[i];
        }
        CHECK(missing == 0, "range of %u bits > p+32: %llu slots missing", k,
              (unsigned long long)missing);
    }
    free(got);
    free(want);
}

static sfs_sidecar_t *kept[8];
static uint8_t (*kept_keys[8])[32];
static uint64_t kept_n[8];
static int kept_count;

static void test_sizes(uint64_t n)
{
    uint8_t(*keys)[32] = malloc((n ? n : 1) * 32);
    char name[64];
    snprintf(name, sizeof(name), "s-%llu.shard", (unsigned long long)n);
    char *sp = strdup(path_of(name));
    snprintf(name, sizeof(name), "s-%llu.sidecar", (unsigned long long)n);
    char *cp = strdup(path_of(name));
    CHECK(build_shard(sp, n, keys) == 0, "build shard %llu", (unsigned long long)n);
    sfs_shard_t *s;
    sfs_error_t err;
    CHECK(sfs_open(sp, 0, &s, &err) == SFS_OK, "open %s", sp);
    int rc = sfs_sidecar_build(s, cp, ident_a, &err);
    CHECK(rc == SFS_OK, "build sidecar: %s", err.message);
    /* building again replaces the file */
    rc = sfs_sidecar_build(s, cp, ident_a, &err);
    CHECK(rc == SFS_OK, "rebuild sidecar: %s", err.message);
    CHECK(no_temp_files(dir), "no temporary file left");
    sfs_sidecar_t *sc = NULL;
    rc = sfs_sidecar_open(cp, ident_a, sfs_slot_count(s), &sc, &err);
    CHECK(rc == SFS_OK, "open sidecar: %s", err.message);
    if (rc != SFS_OK) {
        sfs_close(s);
        return;
    }
    unsigned p = sfs_sidecar_prefix_bits(sc);
    CHECK(sfs_sidecar_count(sc) == n, "count");
    CHECK(p == sfs_sidecar_bits_for(n) &&
              (n <= 8 ? p == 0 : (8ull << p) >= n && (8ull << (p - 1)) < n),
          "prefix bits %u for n=%llu", p, (unsigned long long)n);
    CHECK(file_size(cp) == (long)sfs_sidecar_file_size(p, n), "file size");
    CHECK(sfs_sidecar_slot_count(sc) == sfs_slot_count(s), "slot count");
    check_layout(s, sc);

    uint64_t missed = 0;
    for (uint64_t i = 0; i < n; i++)
        missed += !sfs_sidecar_may_contain(sc, keys[i]);
    CHECK(missed == 0, "%llu present keys not contained (n=%llu)", (unsigned long long)missed,
          (unsigned long long)n);
    uint64_t fp = 0;
    for (int i = 0; i < 1000000; i++) {
        uint8_t k[32];
        rand_key(k);
        fp += sfs_sidecar_may_contain(sc, k);
    }
    /* expected about 1e6 * 8 * 2^-32 = 0.002 */
    CHECK(fp <= 2, "%llu false positives in 1M absent keys (n=%llu)", (unsigned long long)fp,
          (unsigned long long)n);

    unsigned bits[] = {0, 1, 3, 4, 8, 12, 16, 20, p, p + 1, p + 7, p + 31, p + 32, p + 33, 64, 256};
    for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++) {
        for (int r = 0; r < 12; r++) {
            uint8_t prefix[32];
            if (n && r < 8)
                memcpy(prefix, keys[next_rand() % n], 32);
            else
                rand_key(prefix);
            check_range(s, sc, keys, n, prefix, bits[b]);
        }
    }
    /* ranges of all 2^12 12-bit prefixes partition [0, n) */
    uint64_t at = 0, gaps = 0;
    for (unsigned v = 0; v < 4096; v++) {
        uint8_t prefix[2] = {(uint8_t)(v >> 4), (uint8_t)(v << 4)};
        uint64_t b, e;
        sfs_sidecar_range(sc, prefix, 12, &b, &e);
        gaps += b != at;
        at = e;
    }
    CHECK(gaps == 0 && at == n, "12-bit ranges tile the entries");

    if (kept_count < 8) {
        kept[kept_count] = sc;
        kept_keys[kept_count] = keys;
        kept_n[kept_count++] = n;
    } else {
        sfs_sidecar_close(sc);
        free(keys);
    }
    sfs_close(s);
    free(sp);
    free(cp);
}

/* candidates() over arrays that mix NULL and the sidecars kept by
 * test_sizes, longer than one chunk, agrees with may_contain(). */
static void test_candidates(void)
{
    size_t count = 203;
    sfs_sidecar_t **arr = calloc(count, sizeof(*arr));
    for (size_t i = 0; i < count; i++)
        arr[i] = i % 7 == 3 ? NULL : kept[(i * 5) % kept_count];
    uint32_t *out = malloc(count * sizeof(uint32_t)), want[256];
    uint64_t mismatches = 0, queries = 0;
    for (int q = 0; q < 3000; q++) {
        uint8_t key[32];
        int j = q % kept_count;
        if (q % 2 && kept_n[j])
            memcpy(key, kept_keys[j][next_rand() % kept_n[j]], 32);
        else
            rand_key(key);
        size_t w = 0;
        for (size_t i = 0; i < count; i++)
            if (!arr[i] || sfs_sidecar_may_contain(arr[i], key))
                want[w++] = (uint32_t)i;
        size_t got = sfs_sidecar_candidates(arr, count, key, out, count);
        mismatches += got != w || memcmp(out, want, w * sizeof(uint32_t)) != 0;
        /* a short output buffer: the total is still returned, the first
         * entries written */
        uint32_t few[3] = {7, 7, 7};
        size_t got2 = sfs_sidecar_candidates(arr, count, key, few, 2);
        mismatches += got2 != w || memcmp(few, want, 2 * sizeof(uint32_t)) != 0 || few[2] != 7;
        queries++;
    }
    CHECK(mismatches == 0, "candidates differ from may_contain in %llu of %llu queries",
          (unsigned long long)mismatches, (unsigned long long)queries);
    CHECK(sfs_sidecar_candidates(arr, 0, (uint8_t[32]){0}, out, count) == 0, "empty array");
    free(arr);
    free(out);
}

/* Deleted slots are left out of the sidecar. */
static void test_deleted(void)
{
    uint64_t n = 1000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("del.shard")), *cp = strdup(path_of("del.sidecar"));
    CHECK(build_shard(sp, n, keys) == 0, "build");
    sfs_shard_t *s;
    sfs_error_t err;
    CHECK(sfs_open(sp, 1, &s, &err) == SFS_OK, "open rw");
    uint32_t dead[10];
    for (int i = 0; i < 10; i++) {
        dead[i] = sfs_slot_of(s, keys[i * 37]);
        CHECK(sfs_delete(s, keys[i * 37], &err) == SFS_OK, "delete: %s", err.message);
    }
    CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build sidecar: %s", err.message);
    sfs_sidecar_t *sc;
    CHECK(sfs_sidecar_open(cp, ident_a, sfs_slot_count(s), &sc, &err) == SFS_OK, "open sidecar");
    CHECK(sfs_sidecar_count(sc) == n - 10, "count %llu", (unsigned long long)sfs_sidecar_count(sc));
    check_layout(s, sc);
    uint32_t *slots = malloc(n * sizeof(uint32_t));
    uint64_t m = sfs_sidecar_slots(sc, 0, n, slots), listed = 0;
    for (uint64_t i = 0; i < m; i++)
        for (int j = 0; j < 10; j++)
            listed += slots[i] == dead[j];
    CHECK(listed == 0, "%llu deleted slots listed", (unsigned long long)listed);
    uint64_t contained = 0;
    for (int i = 0; i < 10; i++)
        contained += sfs_sidecar_may_contain(sc, keys[i * 37]);
    CHECK(contained == 0, "deleted keys not contained");
    uint64_t missed = 0;
    for (uint64_t i = 0; i < n; i++)
        missed += i % 37 != 0 && !sfs_sidecar_may_contain(sc, keys[i]);
    CHECK(missed == 0, "live keys contained");
    free(slots);
    sfs_sidecar_close(sc);
    sfs_close(s);
    free(keys);
    free(sp);
    free(cp);
}

static void patch(const char *path, long at, const void *bytes, size_t len)
{
    int fd = open(path, O_WRONLY);
    if (pwrite(fd, bytes, len, at) != (ssize_t)len)
        perror("pwrite");
    close(fd);
}

/* Every query on an open sidecar stays in [0, n]; exercises the clamps. */
static uint64_t query_everything(sfs_sidecar_t *sc, uint8_t (*keys)[32], uint64_t n)
{
    uint64_t bad = 0, nn = sfs_sidecar_count(sc);
    uint32_t *slots = malloc((nn + 1) * sizeof(uint32_t));
    sfs_sidecar_t *arr[3] = {sc, NULL, sc};
    uint32_t out[3];
    for (uint64_t i = 0; i < n; i++) {
        sfs_sidecar_may_contain(sc, keys[i]);
        bad += sfs_sidecar_candidates(arr, 3, keys[i], out, 3) > 3;
    }
    unsigned p = sfs_sidecar_prefix_bits(sc);
    unsigned bits[] = {0, 4, 8, 12, 16, 20, p, p + 1, p + 32};
    for (size_t b = 0; b < sizeof(bits) / sizeof(bits[0]); b++)
        for (int r = 0; r < 64; r++) {
            uint8_t prefix[32];
            if (r % 2 && n)
                memcpy(prefix, keys[next_rand() % n], 32);
            else
                rand_key(prefix);
            uint64_t begin, end;
            sfs_sidecar_range(sc, prefix, bits[b], &begin, &end);
            if (!(begin <= end && end <= nn)) {
                bad++;
                continue;
            }
            sfs_sidecar_slots(sc, begin, end, slots);
        }
    free(slots);
    return bad;
}

static void test_damaged(void)
{
    uint64_t n = 5000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("dmg.shard")), *cp = strdup(path_of("dmg.sidecar"));
    char *bad = strdup(path_of("bad.sidecar"));
    CHECK(build_shard(sp, n, keys) == 0, "build");
    sfs_shard_t *s;
    sfs_error_t err;
    CHECK(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
    uint64_t slots = sfs_slot_count(s);
    CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build sidecar");
    long size = file_size(cp);
    unsigned p = sfs_sidecar_bits_for(n);
    long dir_end = 64 + 4 * ((1l << p) + 1), fp_end = dir_end + 4 * (long)n;
    sfs_sidecar_t *sc;
    int rc;

    /* truncated or extended: SFS_ECORRUPT */
    long cuts[] = {0, 1, 8, 63, 64, 65, dir_end - 1, dir_end, fp_end, size - 4, size - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        copy_file(cp, bad, cuts[i]);
        rc = sfs_sidecar_open(bad, ident_a, slots, &sc, &err);
        CHECK(rc == SFS_ECORRUPT, "truncated at %ld: rc %d", cuts[i], rc);
        if (rc == SFS_OK)
            sfs_sidecar_close(sc);
    }
    copy_file(cp, bad, size);
    patch(bad, size, "xxxx", 4);
    rc = sfs_sidecar_open(bad, ident_a, slots, &sc, &err);
    CHECK(rc == SFS_ECORRUPT && strstr(err.message, "exactly"), "extended: rc %d %s", rc,
          err.message);
    /* another shard: SFS_ESTALE */
    rc = sfs_sidecar_open(cp, ident_b, slots, &sc, &err);
    CHECK(rc == SFS_ESTALE && strstr(err.message, "identity"), "wrong identity: rc %d %s", rc,
          err.message);
    rc = sfs_sidecar_open(cp, ident_a, slots + 1, &sc, &err);
    CHECK(rc == SFS_ESTALE && strstr(err.message, "slots"), "wrong slot count: rc %d %s", rc,
          err.message);
    rc = sfs_sidecar_open(path_of("none.sidecar"), ident_a, slots, &sc, &err);
    CHECK(rc == SFS_EIO && err.sys_errno == ENOENT, "missing: rc %d", rc);
    /* header fields */
    struct {
        long at;
        uint32_t value;
        int want;
    } fields[] = {
        {0, 0, SFS_ECORRUPT},              /* magic */
        {8, 2, SFS_ECORRUPT},              /* version */
        {12, 33, SFS_ECORRUPT},            /* prefix_bits */
        {12, 0xFFFFFFFF, SFS_ECORRUPT},    /* prefix_bits */
        {12, p + 1, SFS_ECORRUPT},         /* size no longer matches */
        {16, (uint32_t)n + 1, SFS_ECORRUPT}, /* count: size */
        {20, 1, SFS_ECORRUPT},             /* count > slot_count */
        {28, 1, SFS_ESTALE},               /* slot_count: another shard's */
        {40, 0xdeadbeef, SFS_ESTALE},      /* identity */
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        copy_file(cp, bad, size);
        uint32_t v = fields[i].value;
        patch(bad, fields[i].at, &v, 4);
        rc = sfs_sidecar_open(bad, ident_a, slots, &sc, &err);
        CHECK(rc == fields[i].want, "header byte %ld = %u: rc %d (%s)", fields[i].at, v, rc,
              err.message);
        if (rc == SFS_OK)
            sfs_sidecar_close(sc);
    }

    /* Random bytes over the directory and fingerprints: the file still
     * opens (its header is intact), every answer stays in bounds. */
    uint64_t escaped = 0;
    for (int round = 0; round < 200; round++) {
        copy_file(cp, bad, size);
        int fd = open(bad, O_WRONLY);
        for (int j = 0; j < 1 + round % 16; j++) {
            uint8_t b = (uint8_t)next_rand();
            long lo = round % 2 ? 64 : dir_end, hi = round % 2 ? dir_end : fp_end;
            long at = lo + (long)(next_rand() % (uint64_t)(hi - lo));
            if (pwrite(fd, &b, 1, at) != 1)
                perror("pwrite");
        }
        close(fd);
        rc = sfs_sidecar_open(bad, ident_a, slots, &sc, &err);
        CHECK(rc == SFS_OK, "damaged body still opens: %s", err.message);
        if (rc == SFS_OK) {
            escaped += query_everything(sc, keys, n);
            sfs_sidecar_close(sc);
        }
    }
    /* Worst cases: a directory of all 0xFF, and one that decreases. */
    for (int pattern = 0; pattern < 3; pattern++) {
        copy_file(cp, bad, size);
        int fd = open(bad, O_WRONLY);
        for (uint64_t b = 0; b <= (1ull << p); b++) {
            uint32_t v = pattern == 0   ? 0xFFFFFFFF
                         : pattern == 1 ? (uint32_t)(n - b)
                                        : (uint32_t)(n + b);
            if (pwrite(fd, &v, 4, 64 + 4 * (long)b) != 4)
                perror("pwrite");
        }
        close(fd);
        rc = sfs_sidecar_open(bad, ident_a, slots, &sc, &err);
        CHECK(rc == SFS_OK, "open");
        if (rc == SFS_OK) {
            escaped += query_everything(sc, keys, n);
            sfs_sidecar_close(sc);
        }
    }
    CHECK(escaped == 0, "%llu answers out of bounds on damaged sidecars",
          (unsigned long long)escaped);
    sfs_close(s);
    free(keys);
    free(sp);
    free(cp);
    free(bad);
}

/* Tiny sidecars (a file of a few dozen bytes, less than a fixed-width
 * bucket compare): damaged directories still answer in bounds. */
static void test_damaged_tiny(void)
{
    uint64_t sizes[] = {1, 3, 12};
    for (size_t k = 0; k < 3; k++) {
        uint64_t n = sizes[k];
        uint8_t(*keys)[32] = malloc(n * 32);
        char *sp = strdup(path_of("tiny.shard")), *cp = strdup(path_of("tiny.sidecar"));
        char *bad = strdup(path_of("tiny-bad.sidecar"));
        CHECK(build_shard(sp, n, keys) == 0, "build");
        sfs_shard_t *s;
        sfs_error_t err;
        CHECK(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
        CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build sidecar");
        long size = file_size(cp);
        uint64_t escaped = 0;
        for (int round = 0; round < 100; round++) {
            copy_file(cp, bad, size);
            int fd = open(bad, O_WRONLY);
            for (int j = 0; j < 1 + round % 4; j++) {
                uint8_t b = round % 3 ? (uint8_t)next_rand() : 0xFF;
                long at = 64 + (long)(next_rand() % (uint64_t)(size - 64));
                if (pwrite(fd, &b, 1, at) != 1)
                    perror("pwrite");
            }
            close(fd);
            sfs_sidecar_t *sc;
            if (sfs_sidecar_open(bad, ident_a, sfs_slot_count(s), &sc, &err) == SFS_OK) {
                escaped += query_everything(sc, keys, n);
                sfs_sidecar_close(sc);
            }
        }
        CHECK(escaped == 0, "n=%llu: %llu answers out of bounds", (unsigned long long)n,
              (unsigned long long)escaped);
        sfs_close(s);
        free(keys);
        free(sp);
        free(cp);
        free(bad);
    }
}

/* Failed builds leave nothing at the target and no temporary file. */
static void test_failed_builds(void)
{
    uint64_t n = 100000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("fail.shard"));
    CHECK(build_shard(sp, n, keys) == 0, "build");
    sfs_shard_t *s;
    sfs_error_t err;
    CHECK(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");

    char *missing = strdup(path_of("no/such/dir/x.sidecar"));
    int rc = sfs_sidecar_build(s, missing, ident_a, &err);
    CHECK(rc == SFS_EIO && err.sys_errno == ENOENT, "missing directory: rc %d %s", rc, err.message);
    CHECK(access(missing, F_OK) != 0, "nothing built");

    /* A write that fails half way (file size limit: EFBIG, as ENOSPC would):
     * the old file at the target is untouched, the temporary file gone. */
    char *sub = strdup(path_of("limited"));
    mkdir(sub, 0700);
    char target[600];
    snprintf(target, sizeof(target), "%s/x.sidecar", sub);
    int ofd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(ofd >= 0 && write(ofd, "old", 3) == 3, "old file");
    close(ofd);
    struct rlimit old, lim = {200000, 200000};
    getrlimit(RLIMIT_FSIZE, &old);
    lim.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    rc = sfs_sidecar_build(s, target, ident_a, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    CHECK(rc == SFS_EIO && err.sys_errno == EFBIG, "size limit: rc %d %s", rc, err.message);
    CHECK(file_size(target) == 3, "old file untouched");
    CHECK(no_temp_files(sub), "temporary file removed");

    /* A read-only directory: mode 0500, or for root (who may write
     * anywhere) the immutable attribute, when the file system has it. */
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "chattr +i %s 2>/dev/null", sub);
    int readonly = geteuid() != 0 ? chmod(sub, 0500) == 0 : system(cmd) == 0;
    if (readonly) {
        char other[700];
        snprintf(other, sizeof(other), "%s/y.sidecar", sub);
        rc = sfs_sidecar_build(s, other, ident_a, &err);
        CHECK(rc == SFS_EIO && (err.sys_errno == EACCES || err.sys_errno == EPERM),
              "read-only dir: rc %d %s", rc, err.message);
        CHECK(access(other, F_OK) != 0 && no_temp_files(sub), "nothing left");
        snprintf(cmd, sizeof(cmd), "chattr -i %s 2>/dev/null", sub);
        if (geteuid() != 0)
            chmod(sub, 0700);
        else if (system(cmd) != 0)
            fprintf(stderr, "could not clear the immutable attribute of %s\n", sub);
    } else {
        fprintf(stderr, "test_failed_builds: no read-only directory here, skipped\n");
    }
    sfs_close(s);
    free(keys);
    free(sp);
    free(missing);
    free(sub);
}

int main(void)
{
    snprintf(dir, sizeof(dir), "/tmp/shardfs-sidecar-test-XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    uint64_t sizes[] = {0, 1, 7, 9, 1000, 100000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        test_sizes(sizes[i]);
    test_candidates();
    test_deleted();
    test_damaged();
    test_damaged_tiny();
    test_failed_builds();
    for (int i = 0; i < kept_count; i++) {
        sfs_sidecar_close(kept[i]);
        free(kept_keys[i]);
    }
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
