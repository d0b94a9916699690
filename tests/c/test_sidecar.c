/*
 * test_sidecar.c — C unit tests of shardfs sidecar files (run by `make test-c`).
 *
 * Builds real shards in a temporary directory, then their sidecars, and
 * checks: the file's layout (order, fingerprints, directory) against the
 * shard, no false negatives and few false positives, candidates() against
 * may_contain() one sidecar at a time, range() against a brute-force scan,
 * deleted slots left out, the slots deleted since a build found
 * (sfs_sidecar_deleted), damaged files that either fail to open with the
 * documented status or answer without reading out of bounds, and builds
 * that fail (missing directory, file size limit) leaving nothing behind.
 * Every sidecar built from a quiet shard is also compared byte for byte
 * with one built by brute force (qsort of (top 64 bits, slot)), including
 * shards with most slots emptied and keys crafted to share their bucket
 * and fingerprint. Builds on a shard truncated, replaced or removed after
 * sfs_open fail with SFS_EIO (no SIGBUS) and leave nothing; a shard
 * truncated or emptied while the build runs, and a build killed by
 * SIGKILL, leave nothing either.
 */
#define _GNU_SOURCE
#include "shard.h"
#include "sidecar.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"



static const uint8_t ident_a[32] = {1, 2, 3};
static const uint8_t ident_b[32] = {1, 2, 4};

/* A shard of the n keys given (tiny objects) at `path`. */
static int build_shard_of(const char *path, uint64_t n, uint8_t (*keys)[32])
{
    sfs_writer_t *w;
    sfs_error_t err;
    if (sfs_writer_open(path, &w, &err) != SFS_OK) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    for (uint64_t i = 0; i < n; i++) {
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

/* A shard of n random keys (tiny objects) at `path`; keys written to keys. */
static int build_shard(const char *path, uint64_t n, uint8_t (*keys)[32])
{
    for (uint64_t i = 0; i < n; i++)
        rand_key(keys[i]);
    return build_shard_of(path, n, keys);
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

typedef struct {
    uint64_t top;
    uint32_t slot;
} pair_t;

static int cmp_pair(const void *a, const void *b)
{
    const pair_t *x = a, *y = b;
    if (x->top != y->top)
        return x->top < y->top ? -1 : 1;
    return x->slot < y->slot ? -1 : x->slot > y->slot;
}

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); } /* little-endian hosts */

/* The file sfs_sidecar_build must write for `s`, built by brute force from
 * sidecar.h alone: the live slots' (top 64 bits, slot) sorted by qsort. */
static uint8_t *expected_sidecar(sfs_shard_t *s, const uint8_t ident[32], size_t *len)
{
    uint64_t slots = sfs_slot_count(s), n = 0;
    pair_t *e = malloc((slots ? slots : 1) * sizeof(pair_t));
    for (uint64_t i = 0; i < slots; i++) {
        uint8_t key[32];
        if (sfs_slot_get(s, i, key) == SFS_EMPTY_OFFSET)
            continue;
        e[n].top = top64(key);
        e[n++].slot = (uint32_t)i;
    }
    qsort(e, n, sizeof(pair_t), cmp_pair);
    unsigned p = 0;
    while (p < 32 && (8ull << p) < n)
        p++;
    uint64_t buckets = 1ull << p;
    *len = 64 + 4 * (buckets + 1) + 8 * n;
    uint8_t *f = calloc(1, *len);
    memcpy(f, "SFSSIDE1", 8);
    put32(f + 8, 1);
    put32(f + 12, p);
    memcpy(f + 16, &n, 8);
    memcpy(f + 24, &slots, 8);
    memcpy(f + 32, ident, 32);
    uint8_t *dirp = f + 64, *fps = dirp + 4 * (buckets + 1), *sl = fps + 4 * n;
    uint64_t at = 0;
    for (uint64_t b = 0; b <= buckets; b++) {
        while (at < n && (p ? e[at].top >> (64 - p) : 0) < b)
            at++;
        put32(dirp + 4 * b, (uint32_t)at);
    }
    for (uint64_t i = 0; i < n; i++) {
        put32(fps + 4 * i, (uint32_t)((e[i].top << p) >> 32));
        put32(sl + 4 * i, e[i].slot);
    }
    free(e);
    return f;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    long size = file_size(path);
    if (size < 0)
        return NULL;
    uint8_t *buf = malloc(size ? (size_t)size : 1);
    int fd = open(path, O_RDONLY);
    if (fd < 0 || read(fd, buf, (size_t)size) != size) {
        if (fd >= 0)
            close(fd);
        free(buf);
        return NULL;
    }
    close(fd);
    *len = (size_t)size;
    return buf;
}

/* The sidecar at `path` equals, byte for byte, the brute-force one. */
static void check_brute_force(sfs_shard_t *s, const char *path, const uint8_t ident[32],
                              const char *what)
{
    size_t want_len, got_len = 0;
    uint8_t *want = expected_sidecar(s, ident, &want_len), *got = read_all(path, &got_len);
    size_t at = 0;
    if (got)
        while (at < want_len && at < got_len && want[at] == got[at])
            at++;
    CHECK(got && got_len == want_len && at == want_len,
          "%s: sidecar differs from the brute-force sort (%zu bytes, want %zu, first "
          "difference at byte %zu)", what, got_len, want_len, at);
    free(want);
    free(got);
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
    REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open %s", sp);
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
    struct stat st;
    CHECK(stat(cp, &st) == 0 && (st.st_mode & 0777) == 0600, "mode 0600");
    check_layout(s, sc);
    snprintf(name, sizeof(name), "n=%llu", (unsigned long long)n);
    check_brute_force(s, cp, ident_a, name);

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
    REQUIRE(sfs_open(sp, 1, &s, &err) == SFS_OK, "open rw");
    uint32_t dead[10];
    for (int i = 0; i < 10; i++) {
        dead[i] = sfs_slot_of(s, keys[i * 37]);
        CHECK(sfs_delete(s, keys[i * 37], &err) == SFS_OK, "delete: %s", err.message);
    }
    CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build sidecar: %s", err.message);
    sfs_sidecar_t *sc;
    REQUIRE(sfs_sidecar_open(cp, ident_a, sfs_slot_count(s), &sc, &err) == SFS_OK, "open sidecar");
    CHECK(sfs_sidecar_count(sc) == n - 10, "count %llu", (unsigned long long)sfs_sidecar_count(sc));
    check_layout(s, sc);
    check_brute_force(s, cp, ident_a, "10 deleted of 1000");
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
    REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
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
        REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
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
    REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");

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

/* Empty slot `slot` of the shard at `path` as a delete does (32 zero bytes
 * and the empty offset), without the fdatasync of sfs_delete. */
static void empty_slot(int fd, uint64_t index_position, uint64_t slot)
{
    uint8_t rec[40];
    memset(rec, 0, 32);
    memset(rec + 32, 0xFF, 8);
    if (pwrite(fd, rec, 40, (off_t)(index_position + slot * 40)) != 40)
        perror("pwrite");
}

/* Many slots emptied: fewer prefix bits than the slot count gives (the
 * bucket counts of pass 1 are summed in groups of 2, then 16), then none
 * left at all. Byte-for-byte equal to the brute-force sidecar each time. */
static void test_many_deleted(void)
{
    uint64_t n = 2000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("many-del.shard")), *cp = strdup(path_of("many-del.sidecar"));
    CHECK(build_shard(sp, n, keys) == 0, "build");
    sfs_shard_t *s;
    sfs_error_t err;
    REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
    uint64_t slots = sfs_slot_count(s), index_position = sfs_header(s)->index_position;
    int fd = open(sp, O_WRONLY);
    uint64_t left = n, stages[] = {700, 100, 1, 0};
    for (size_t k = 0; k < sizeof(stages) / sizeof(stages[0]); k++) {
        for (; left > stages[k]; left--)
            empty_slot(fd, index_position, sfs_slot_of(s, keys[left - 1]));
        int rc = sfs_sidecar_build(s, cp, ident_a, &err);
        CHECK(rc == SFS_OK, "build with %llu live of %llu slots: %s", (unsigned long long)left,
              (unsigned long long)slots, err.message);
        sfs_sidecar_t *sc;
        rc = sfs_sidecar_open(cp, ident_a, slots, &sc, &err);
        CHECK(rc == SFS_OK, "open: %s", err.message);
        if (rc != SFS_OK)
            continue;
        CHECK(sfs_sidecar_count(sc) == left && sfs_sidecar_prefix_bits(sc) ==
                                                   sfs_sidecar_bits_for(left),
              "count %llu (want %llu), p %u", (unsigned long long)sfs_sidecar_count(sc),
              (unsigned long long)left, sfs_sidecar_prefix_bits(sc));
        CHECK(sfs_sidecar_bits_for(left) < sfs_sidecar_bits_for(slots), "fewer bits than slots");
        check_layout(s, sc);
        char what[64];
        snprintf(what, sizeof(what), "%llu live of %llu", (unsigned long long)left,
                 (unsigned long long)slots);
        check_brute_force(s, cp, ident_a, what);
        uint64_t missed = 0;
        for (uint64_t i = 0; i < left; i++)
            missed += !sfs_sidecar_may_contain(sc, keys[i]);
        CHECK(missed == 0, "%llu live keys not contained", (unsigned long long)missed);
        sfs_sidecar_close(sc);
    }
    close(fd);
    sfs_close(s);
    free(keys);
    free(sp);
    free(cp);
}

/* sfs_sidecar_deleted: found `found` slots in out, exactly the listed ones
 * (listed[i] for want[i] set, in position order)? */
static int same_deleted(const uint32_t *out, uint64_t found, const uint32_t *listed,
                        const char *want, uint64_t n)
{
    uint64_t j = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (!want[i])
            continue;
        if (j >= found || out[j] != listed[i])
            return 0;
        j++;
    }
    return j == found;
}

/* sfs_sidecar_deleted after deletes made once the sidecar was built: it
 * finds exactly the deleted slots the sidecar lists, in position order,
 * over the whole range and over ranges of any size put end to end, and
 * nothing before the deletes; the slots empty since the shard was written
 * (never listed) are not reported, nor a listed slot outside the index (a
 * damaged sidecar); another shard's sidecar (another slot count) is
 * refused with SFS_EINVAL. */
static void test_deleted_since_build(void)
{
    uint64_t n = 5000, m = 300;
    uint8_t(*keys)[32] = malloc(n * 32), (*other_keys)[32] = malloc(m * 32);
    char *sp = strdup(path_of("since.shard")), *cp = strdup(path_of("since.sidecar"));
    char *dp = strdup(path_of("since-damaged.sidecar"));
    char *op = strdup(path_of("since-other.shard")), *ocp = strdup(path_of("since-other.sidecar"));
    uint32_t *listed = malloc(n * sizeof(uint32_t)), *out = malloc((n + 1) * sizeof(uint32_t));
    char *want = calloc(n, 1);
    CHECK(build_shard(sp, n, keys) == 0, "build");
    CHECK(build_shard(op, m, other_keys) == 0, "build the other");
    sfs_shard_t *s, *o;
    sfs_sidecar_t *sc, *osc, *dsc;
    sfs_error_t err;
    REQUIRE(sfs_open(sp, 1, &s, &err) == SFS_OK, "open rw: %s", err.message);
    REQUIRE(sfs_open(op, 0, &o, &err) == SFS_OK, "open the other: %s", err.message);
    uint64_t slots = sfs_slot_count(s);
    CHECK(sfs_slot_count(o) != slots, "slot counts differ");
    CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build sidecar: %s", err.message);
    CHECK(sfs_sidecar_build(o, ocp, ident_b, &err) == SFS_OK, "build sidecar: %s", err.message);
    REQUIRE(sfs_sidecar_open(cp, ident_a, slots, &sc, &err) == SFS_OK, "open sidecar: %s", err.message);
    REQUIRE(sfs_sidecar_open(ocp, ident_b, sfs_slot_count(o), &osc, &err) == SFS_OK, "open: %s",
            err.message);
    REQUIRE(sfs_sidecar_slots(sc, 0, n, listed) == n, "all listed");
    CHECK(slots > n, "some slots empty from the start (%llu slots)", (unsigned long long)slots);

    uint64_t found = 99;
    CHECK(sfs_sidecar_deleted(sc, s, 0, n, out, &found) == SFS_OK && found == 0,
          "none deleted yet: %llu found", (unsigned long long)found);

    /* Deleted: the first and last positions and every 97th. */
    uint64_t deleted = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (i != 0 && i != n - 1 && i % 97 != 5)
            continue;
        uint8_t key[32];
        CHECK(sfs_slot_get(s, listed[i], key) != SFS_EMPTY_OFFSET, "listed slot live");
        CHECK(sfs_delete(s, key, &err) == SFS_OK, "delete: %s", err.message);
        want[i] = 1;
        deleted++;
    }
    found = 0;
    CHECK(sfs_sidecar_deleted(sc, s, 0, n, out, &found) == SFS_OK, "whole range");
    CHECK(found == deleted, "%llu found, %llu deleted", (unsigned long long)found,
          (unsigned long long)deleted);
    CHECK(same_deleted(out, found, listed, want, n), "the deleted slots, in position order");
    found = 0;
    CHECK(sfs_sidecar_deleted(sc, s, 0, n + 1000, out, &found) == SFS_OK && found == deleted,
          "end clamped to the count");
    uint64_t chunks[] = {1, 7, 97, 1000, 4999};
    for (size_t c = 0; c < sizeof(chunks) / sizeof(chunks[0]); c++) {
        uint64_t total = 0, ok = 1;
        for (uint64_t at = 0; at < n; at += chunks[c]) {
            uint64_t got = 0;
            ok &= sfs_sidecar_deleted(sc, s, at, at + chunks[c], out + total, &got) == SFS_OK;
            total += got;
        }
        CHECK(ok && total == deleted && same_deleted(out, total, listed, want, n),
              "ranges of %llu end to end: %llu found", (unsigned long long)chunks[c],
              (unsigned long long)total);
    }
    found = 99;
    CHECK(sfs_sidecar_deleted(sc, s, n, n + 5, out, &found) == SFS_OK && found == 0, "past the end");
    found = 99;
    CHECK(sfs_sidecar_deleted(sc, s, 10, 10, out, &found) == SFS_OK && found == 0, "empty range");
    found = 99;
    CHECK(sfs_sidecar_deleted(sc, s, 20, 10, out, &found) == SFS_OK && found == 0, "begin > end");
    found = 99;
    CHECK(sfs_sidecar_deleted(sc, s, UINT64_MAX - 1, UINT64_MAX, out, &found) == SFS_OK && found == 0,
          "a range far past the end");

    /* Another shard's sidecar, either way round: refused, nothing found. */
    found = 99;
    CHECK(sfs_sidecar_deleted(osc, s, 0, m, out, &found) == SFS_EINVAL && found == 0,
          "another shard's sidecar");
    found = 99;
    CHECK(sfs_sidecar_deleted(sc, o, 0, n, out, &found) == SFS_EINVAL && found == 0,
          "another shard's sidecar (2)");

    /* A damaged copy whose first entry (deleted) lists a slot past the
     * index and whose second (live) the first slot past it: neither is
     * reported. */
    long size = file_size(cp);
    CHECK(copy_file(cp, dp, size) == 0, "copy");
    long at = 64 + 4 * ((1L << sfs_sidecar_prefix_bits(sc)) + 1) + 4 * (long)n;
    uint32_t past[2] = {0xFFFFFFFFu, (uint32_t)slots};
    CHECK(!want[1], "position 1 live");
    patch(dp, at, past, sizeof(past));
    REQUIRE(sfs_sidecar_open(dp, ident_a, slots, &dsc, &err) == SFS_OK, "open: %s", err.message);
    found = 0;
    CHECK(sfs_sidecar_deleted(dsc, s, 0, n, out, &found) == SFS_OK && found == deleted - 1,
          "damaged: %llu found, want %llu", (unsigned long long)found,
          (unsigned long long)deleted - 1);
    want[0] = 0;
    CHECK(same_deleted(out, found, listed, want, n), "damaged: the others, in order");

    sfs_sidecar_close(dsc);
    sfs_sidecar_close(osc);
    sfs_sidecar_close(sc);
    sfs_close(o);
    sfs_close(s);
    free(want);
    free(out);
    free(listed);
    free(keys);
    free(other_keys);
    free(sp);
    free(cp);
    free(dp);
    free(op);
    free(ocp);
}

/* Keys that agree on their first `bits` bits with `base`, random after. */
static void key_sharing(uint8_t out[32], const uint8_t base[32], unsigned bits)
{
    uint8_t r[32];
    rand_key(r);
    for (unsigned i = 0; i < 32; i++) {
        unsigned from = 8 * i; /* bits of byte i kept from base: [from, bits) */
        uint8_t keep = bits >= from + 8 ? 0xFF : bits <= from ? 0 : (uint8_t)(0xFF << (8 - (bits - from)));
        out[i] = (uint8_t)((base[i] & keep) | (r[i] & ~keep));
    }
}

/* Keys sharing their bucket and fingerprint (bits [0, p+32)), some also all
 * of their top 64 bits (order by slot), one bucket far over the usual ~8
 * (heap sort): the order is still the brute force's. */
static void test_ties(void)
{
    uint64_t sizes[] = {1000, 5000, 100000};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint64_t n = sizes[k];
        unsigned p = sfs_sidecar_bits_for(n);
        uint8_t(*keys)[32] = malloc(n * 32);
        uint64_t i = 0;
        /* a third of the keys in groups of 2..17 sharing p+32, p+33, p+40,
         * 64 or 63 bits; for n = 5000, 3000 keys sharing 64 bits */
        unsigned shares[] = {p + 32, p + 33, p + 40, 64, 63};
        uint64_t grouped = n == 5000 ? 3000 : n / 3;
        for (unsigned g = 0; i < grouped; g++) {
            uint8_t base[32];
            rand_key(base);
            uint64_t m = n == 5000 ? grouped : 2 + g % 16;
            for (uint64_t j = 0; j < m && i < grouped; j++)
                key_sharing(keys[i++], base, n == 5000 ? 64 : shares[g % 5]);
        }
        for (; i < n; i++)
            rand_key(keys[i]);
        char name[64];
        snprintf(name, sizeof(name), "ties-%llu.shard", (unsigned long long)n);
        char *sp = strdup(path_of(name));
        snprintf(name, sizeof(name), "ties-%llu.sidecar", (unsigned long long)n);
        char *cp = strdup(path_of(name));
        CHECK(build_shard_of(sp, n, keys) == 0, "build shard of tied keys");
        sfs_shard_t *s;
        sfs_error_t err;
        REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
        CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build: %s", err.message);
        snprintf(name, sizeof(name), "tied keys, n=%llu", (unsigned long long)n);
        check_brute_force(s, cp, ident_a, name);
        sfs_sidecar_t *sc;
        if (sfs_sidecar_open(cp, ident_a, sfs_slot_count(s), &sc, &err) == SFS_OK) {
            check_layout(s, sc);
            uint64_t missed = 0;
            for (uint64_t j = 0; j < n; j++)
                missed += !sfs_sidecar_may_contain(sc, keys[j]);
            CHECK(missed == 0, "%llu tied keys not contained", (unsigned long long)missed);
            sfs_sidecar_close(sc);
        } else {
            CHECK(0, "open: %s", err.message);
        }
        sfs_close(s);
        free(keys);
        free(sp);
        free(cp);
    }
}

/* A shard truncated after sfs_open: the build reads the index with pread,
 * never through the mapping, so it fails with SFS_EIO (no SIGBUS) and leaves
 * nothing at the target or beside it. A shard renamed over or removed after
 * sfs_open is still read whole (through its descriptor). */
static void test_truncated_shard(void)
{
    uint64_t n = 20000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("trunc.shard")), *pristine = strdup(path_of("trunc.orig"));
    char *other = strdup(path_of("trunc.other"));
    char *sub = strdup(path_of("trunc-out"));
    mkdir(sub, 0700);
    char cp[600];
    snprintf(cp, sizeof(cp), "%s/t.sidecar", sub);
    CHECK(build_shard(pristine, n, keys) == 0, "build");
    CHECK(build_shard(other, 10, keys) == 0, "build another");
    long size = file_size(pristine);
    sfs_shard_t *s;
    sfs_error_t err;
    REQUIRE(sfs_open(pristine, 0, &s, &err) == SFS_OK, "open");
    uint64_t index_position = sfs_header(s)->index_position, slots = sfs_slot_count(s);
    sfs_close(s);
    long index_end = (long)(index_position + 40 * slots);
    long cuts[] = {0, 50, (long)index_position, (long)index_position + 40 * 1000 + 7,
                   index_end - 1};
    for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++) {
        copy_file(pristine, sp, size);
        REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open copy");
        CHECK(truncate(sp, cuts[k]) == 0, "truncate");
        int rc = sfs_sidecar_build(s, cp, ident_a, &err);
        CHECK(rc == SFS_EIO && strstr(err.message, "shrank"), "shard truncated at %ld of %ld: "
              "rc %d: %s", cuts[k], size, rc, err.message);
        CHECK(access(cp, F_OK) != 0 && no_temp_files(sub), "truncated at %ld: nothing left",
              cuts[k]);
        sfs_close(s);
    }
    /* The path now names another shard, or nothing: the build reads the
     * opened file through its descriptor, not the path. */
    for (int removed = 0; removed <= 1; removed++) {
        copy_file(pristine, sp, size);
        REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open copy");
        if (removed)
            CHECK(unlink(sp) == 0, "remove");
        else
            CHECK(rename(other, sp) == 0, "replace");
        int rc = sfs_sidecar_build(s, cp, ident_a, &err);
        CHECK(rc == SFS_OK, "shard %s: rc %d: %s", removed ? "removed" : "replaced", rc, err.message);
        sfs_sidecar_t *sc = NULL;
        REQUIRE(sfs_sidecar_open(cp, ident_a, slots, &sc, &err) == SFS_OK, "open the sidecar: %s",
              err.message);
        if (sc) {
            CHECK(sfs_sidecar_count(sc) == n, "the opened shard's %llu keys, not the new file's: %llu",
                  (unsigned long long)n, (unsigned long long)sfs_sidecar_count(sc));
            sfs_sidecar_close(sc);
        }
        unlink(cp);
        sfs_close(s);
        if (!removed)
            CHECK(build_shard(other, 10, keys + n - 10) == 0, "build another again");
    }
    unlink(pristine);
    free(keys);
    free(sp);
    free(pristine);
    free(other);
    free(sub);
}

struct meddler {
    const char *path;
    uint64_t index_position;
    const uint32_t *slots; /* to empty, in order */
    int count;
    long delay_us;         /* before the first change, and between changes */
    int truncate_to;       /* instead: truncate the file to this many bytes */
};

static void *meddle(void *arg)
{
    struct meddler *m = arg;
    usleep((useconds_t)m->delay_us);
    if (m->truncate_to >= 0) {
        if (truncate(m->path, m->truncate_to) != 0)
            perror("truncate");
        return NULL;
    }
    int fd = open(m->path, O_WRONLY);
    for (int i = 0; i < m->count; i++) {
        empty_slot(fd, m->index_position, m->slots[i]);
        usleep((useconds_t)m->delay_us);
    }
    close(fd);
    return NULL;
}

/* The shard changing while its sidecar is built: truncated at some point of
 * the scans (an error, nothing left, or a complete sidecar if the scans
 * were over), and slots emptied between and during the scans (a build that
 * saw the change starts again; it either succeeds, listing every slot live
 * at its end and only slots live at its start, or fails with EAGAIN). */
static void test_concurrent_changes(void)
{
    uint64_t n = 300000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("busy.shard")), *pristine = strdup(path_of("busy.orig"));
    char *sub = strdup(path_of("busy-out"));
    mkdir(sub, 0700);
    char cp[600];
    snprintf(cp, sizeof(cp), "%s/b.sidecar", sub);
    CHECK(build_shard(pristine, n, keys) == 0, "build");
    long size = file_size(pristine);
    sfs_shard_t *s;
    sfs_error_t err;
    int failed_builds = 0, ok_builds = 0, again = 0;
    for (long delay = 0; delay <= 24000; delay += 3000) {
        copy_file(pristine, sp, size);
        REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
        struct meddler m = {sp, 0, NULL, 0, delay, 4096};
        pthread_t t;
        pthread_create(&t, NULL, meddle, &m);
        unlink(cp);
        int rc = sfs_sidecar_build(s, cp, ident_a, &err);
        pthread_join(t, NULL);
        if (rc == SFS_OK) {
            ok_builds++;
            sfs_sidecar_t *sc;
            REQUIRE(sfs_sidecar_open(cp, ident_a, sfs_slot_count(s), &sc, &err) == SFS_OK &&
                      sfs_sidecar_count(sc) == n,
                  "a build that succeeded is complete");
            if (sc)
                sfs_sidecar_close(sc);
        } else {
            failed_builds++;
            CHECK(rc == SFS_EIO && strstr(err.message, "shrank"), "truncated after %ld us: %s",
                  delay, err.message);
            CHECK(access(cp, F_OK) != 0, "nothing left");
        }
        CHECK(no_temp_files(sub), "no temporary file");
        sfs_close(s);
    }
    printf("test_concurrent_changes: truncated during %d builds, after %d\n", failed_builds,
           ok_builds);

    copy_file(pristine, sp, size);
    REQUIRE(sfs_open(sp, 0, &s, &err) == SFS_OK, "open");
    uint32_t *victims = malloc(2000 * sizeof(uint32_t));
    for (int i = 0; i < 2000; i++)
        victims[i] = sfs_slot_of(s, keys[(uint64_t)i * 101]);
    ok_builds = 0;
    for (int round = 0; round < 12; round++) {
        /* a burst of 250 changes, 20 us apart (each scan sees some), or a
         * single one at some point of the build (a second attempt succeeds) */
        int burst = round % 4 == 0;
        struct meddler m = {sp, sfs_header(s)->index_position, victims + 100 * round,
                            burst ? 250 : 1, burst ? 20 : 400 * round, -1};
        uint64_t live_before = 0;
        for (uint64_t i = 0; i < sfs_slot_count(s); i++)
            live_before += sfs_slot_get(s, i, NULL) != SFS_EMPTY_OFFSET;
        pthread_t t;
        pthread_create(&t, NULL, meddle, &m);
        int rc = sfs_sidecar_build(s, cp, ident_a, &err);
        pthread_join(t, NULL);
        if (rc != SFS_OK) {
            again++;
            CHECK(rc == SFS_EIO && err.sys_errno == EAGAIN, "emptied during the build: %s",
                  err.message);
            continue;
        }
        ok_builds++;
        sfs_sidecar_t *sc;
        REQUIRE(sfs_sidecar_open(cp, ident_a, sfs_slot_count(s), &sc, &err) == SFS_OK, "open");
        uint64_t c = sfs_sidecar_count(sc), listed_live = 0, live_after = 0;
        uint32_t *sl = malloc((c ? c : 1) * sizeof(uint32_t));
        sfs_sidecar_slots(sc, 0, c, sl);
        for (uint64_t i = 0; i < c; i++)
            listed_live += sfs_slot_get(s, sl[i], NULL) != SFS_EMPTY_OFFSET;
        for (uint64_t i = 0; i < sfs_slot_count(s); i++)
            live_after += sfs_slot_get(s, i, NULL) != SFS_EMPTY_OFFSET;
        CHECK(c <= live_before && listed_live == live_after,
              "round %d: %llu listed (%llu live now, %llu live before)", round,
              (unsigned long long)c, (unsigned long long)live_after,
              (unsigned long long)live_before);
        free(sl);
        sfs_sidecar_close(sc);
    }
    printf("test_concurrent_changes: slots emptied during %d builds that succeeded, %d that "
           "gave up\n", ok_builds, again);
    /* quiet again: exact */
    CHECK(sfs_sidecar_build(s, cp, ident_a, &err) == SFS_OK, "build: %s", err.message);
    check_brute_force(s, cp, ident_a, "after the deletes");
    sfs_close(s);
    free(victims);
    free(keys);
    free(sp);
    free(pristine);
    free(sub);
}

/* A build killed (SIGKILL) at any point leaves no file behind: its output
 * is unnamed (O_TMPFILE) until complete. Skipped where the file system has
 * no O_TMPFILE (the named fallback would be left). */
static void test_killed_build(void)
{
    char *sub = strdup(path_of("killed"));
    mkdir(sub, 0700);
#ifdef O_TMPFILE
    int probe = open(sub, O_TMPFILE | O_RDWR, 0600);
#else
    int probe = -1;
#endif
    if (probe < 0) {
        fprintf(stderr, "test_killed_build: no O_TMPFILE here, skipped\n");
        free(sub);
        return;
    }
    close(probe);
    uint64_t n = 100000;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *sp = strdup(path_of("killed.shard"));
    CHECK(build_shard(sp, n, keys) == 0, "build");
    char cp[600];
    snprintf(cp, sizeof(cp), "%s/k.sidecar", sub);
    for (int round = 0; round < 5; round++) {
        pid_t pid = fork();
        if (pid == 0) {
            sfs_shard_t *s;
            sfs_error_t err;
            if (sfs_open(sp, 0, &s, &err) != SFS_OK)
                _exit(1);
            for (;;) {
                unlink(cp);
                sfs_sidecar_build(s, cp, ident_a, &err);
            }
        }
        usleep(20000 + 7000 * (useconds_t)round);
        kill(pid, SIGKILL);
        int status;
        waitpid(pid, &status, 0);
        CHECK(WIFSIGNALED(status) && no_temp_files(sub), "killed build %d: no temporary file",
              round);
    }
    free(keys);
    free(sp);
    free(sub);
}

int main(void)
{
    if (make_test_dir("shardfs-sidecar-test") != 0)
        return 1;
    uint64_t sizes[] = {0, 1, 7, 9, 1000, 100000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        test_sizes(sizes[i]);
    test_candidates();
    test_deleted();
    test_damaged();
    test_damaged_tiny();
    test_failed_builds();
    test_many_deleted();
    test_deleted_since_build();
    test_ties();
    test_truncated_shard();
    test_concurrent_changes();
    test_killed_build();
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
