/*
 * test_gindex.c — C unit tests of global index levels (run by `make test-c`).
 *
 * Levels written from synthetic runs (empty, tiny, at the bucket_bits
 * boundaries, values at both ends of the 40-bit range, keys shared by
 * several shards, repeated values) are compared byte for byte with the
 * level built by brute force (every (prefix, shard) pair sorted and
 * deduplicated, its directory by a scan); every prefix's lookup lists
 * exactly its shards, absent keys almost never match. Merges (with and
 * without masks, shards shared by levels, equal identities inside a level,
 * into the path of an input, of no level) are compared with a brute-force
 * merge. Runs from real shards (sfs_shard_key_prefixes) against their keys,
 * deleted keys left out. Bad arguments and failed writes leave nothing
 * behind; truncated files and damaged headers are refused; random bytes in
 * a level's body never make a lookup crash or list a shard outside the
 * table, and a merge of such a level either fails with SFS_ECORRUPT or
 * writes a valid level. Lookups from several threads at once.
 */
#define _GNU_SOURCE
#include "gindex.h"
#include "shard.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

#define LIMIT40 (UINT64_C(1) << 40)

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(size > 0 ? (size_t)size : 1);
    if (size > 0 && fread(buf, 1, (size_t)size, f) != (size_t)size) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)size;
    return buf;
}

static int write_all(const char *path, const uint8_t *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    int ok = fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok ? 0 : -1;
}

static int no_temp_files(const char *in)
{
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls -A %s 2>/dev/null | grep -q tmp", in);
    return system(cmd) != 0;
}

/* A key whose top 40 bits are v, the rest random. */
static void key_of(uint64_t v, uint8_t key[32])
{
    rand_key(key);
    for (int i = 0; i < 5; i++)
        key[i] = (uint8_t)(v >> (32 - 8 * i));
}

static void identity_of(uint64_t i, uint8_t id[32])
{
    memset(id, 0, 32);
    memcpy(id, "shard-", 6);
    for (int b = 0; b < 8; b++)
        id[8 + b] = (uint8_t)(i >> (8 * b));
}

/* A level as expected: shard table and sorted distinct entries. */
typedef struct {
    uint64_t s, n;
    uint8_t (*ids)[32];
    uint64_t *e;
} level_t;

static void level_free(level_t *l)
{
    free(l->ids);
    free(l->e);
}

/* The whole values of the n entries of a level file f of s shards and
 * bucket_bits b: each entry's kept low 64 - b bits (w bytes) under the top
 * b bits of its bucket, found by walking the directory. malloc'ed. */
static uint64_t *entry_values(const uint8_t *f, uint64_t s, unsigned b, uint64_t n)
{
    unsigned w = (64 - b + 7) / 8;
    const uint8_t *dir = f + 64 + 32 * s, *ent = dir + 8 * ((UINT64_C(1) << b) + 1);
    uint64_t *e = malloc((n ? n : 1) * 8), k = 0;
    for (uint64_t i = 0; i < n; i++) {
        while (k < (UINT64_C(1) << b) && get_le64(dir + 8 * (k + 1)) <= i)
            k++;
        uint64_t low = 0;
        for (unsigned x = 0; x < w; x++)
            low |= (uint64_t)ent[w * i + x] << (8 * x);
        e[i] = b ? k << (64 - b) | low : low;
    }
    return e;
}

/* The file's bytes equal the level: header, table, directory (computed
 * here by a scan), entries of w bytes (the low 64 - b bits of their
 * values, nothing above), 8 zero bytes. */
static int file_is(const char *path, const level_t *want)
{
    size_t len;
    uint8_t *f = read_all(path, &len);
    if (!f)
        return 0;
    unsigned b = sfs_gindex_bits_for(want->n);
    unsigned w = (64 - b + 7) / 8;
    uint64_t buckets = UINT64_C(1) << b;
    uint64_t low_mask = b ? UINT64_MAX >> b : UINT64_MAX;
    size_t size = 64 + 32 * want->s + 8 * (buckets + 1) + w * want->n + 8;
    int ok = len == size && sfs_gindex_file_size(want->s, b, want->n) == size &&
             sfs_gindex_entry_size(b) == w;
    ok = ok && memcmp(f, "SFSGIDX1\2\0\0\0", 12) == 0 && get_le64(f + 12) % (1ull << 32) == b &&
         get_le64(f + 16) == want->n && get_le64(f + 24) == want->s;
    for (int i = 32; ok && i < 64; i++)
        ok = f[i] == 0;
    ok = ok && (want->s == 0 || memcmp(f + 64, want->ids, 32 * want->s) == 0);
    const uint8_t *dir = f + 64 + 32 * want->s, *ent = dir + 8 * (buckets + 1);
    uint64_t at = 0;
    for (uint64_t k = 0; ok && k <= buckets; k++) {
        while (at < want->n && (want->e[at] >> 24) >> (40 - b) < k)
            at++;
        ok = get_le64(dir + 8 * k) == (k == buckets ? want->n : at);
    }
    for (uint64_t i = 0; ok && i < want->n; i++) {
        uint64_t low = 0;
        for (unsigned x = 0; x < w; x++)
            low |= (uint64_t)ent[w * i + x] << (8 * x);
        ok = low == (want->e[i] & low_mask);
    }
    for (size_t i = size - 8; ok && i < size; i++)
        ok = f[i] == 0;
    if (ok) { /* and decoded through the directory, the whole values */
        uint64_t *e = entry_values(f, want->s, b, want->n);
        ok = want->n == 0 || memcmp(e, want->e, 8 * want->n) == 0;
        free(e);
    }
    free(f);
    return ok;
}

/* Every entry's prefix lists exactly the shards of its entries; a key of
 * another prefix lists nothing (n / 2^40 false positives in all). */
static int lookups_agree(const sfs_gindex_t *g, const level_t *want, uint64_t *false_pos)
{
    uint32_t out[64];
    uint8_t key[32];
    int ok = 1;
    for (uint64_t i = 0; ok && i < want->n;) {
        uint64_t v = want->e[i] >> 24, j = i;
        while (j < want->n && want->e[j] >> 24 == v)
            j++;
        key_of(v, key);
        size_t got = sfs_gindex_lookup(g, key, out, 64);
        ok = got == j - i;
        for (uint64_t x = i; ok && x < j; x++)
            ok = x - i >= 64 || out[x - i] == (uint32_t)(want->e[x] & 0xFFFFFF);
        if (!ok)
            fprintf(stderr, "prefix %llx: %zu shards, want %llu\n", (unsigned long long)v, got,
                    (unsigned long long)(j - i));
        i = j;
    }
    for (int t = 0; t < 2000; t++) {
        rand_key(key);
        *false_pos += sfs_gindex_lookup(g, key, out, 64);
    }
    return ok;
}

/* nruns random runs: run i has about len[i] values (sorted, some repeated,
 * about `shared` of them copied from run 0 so that keys are in several
 * shards); the expected level in *want. */
static uint64_t **make_runs(size_t nruns, const uint64_t *len_in, double shared, uint64_t **len_out,
                            level_t *want)
{
    uint64_t **runs = calloc(nruns ? nruns : 1, sizeof(uint64_t *));
    uint64_t *len = calloc(nruns ? nruns : 1, sizeof(uint64_t)), total = 0;
    for (size_t i = 0; i < nruns; i++) {
        uint64_t m = len_in[i];
        runs[i] = malloc((m ? m : 1) * sizeof(uint64_t));
        for (uint64_t j = 0; j < m; j++) {
            uint64_t r = next_rand();
            if (j && r % 17 == 0)
                runs[i][j] = runs[i][j - 1]; /* a repeat */
            else if (i && len_in[0] && (double)(r % 1000) < shared * 1000)
                runs[i][j] = runs[0][r % len_in[0]];
            else
                runs[i][j] = next_rand() % LIMIT40;
        }
        qsort(runs[i], m, sizeof(uint64_t), cmp_u64);
        len[i] = m;
        total += m;
    }
    want->s = nruns;
    want->ids = malloc((nruns ? nruns : 1) * 32);
    want->e = malloc((total ? total : 1) * sizeof(uint64_t));
    uint64_t n = 0;
    for (size_t i = 0; i < nruns; i++) {
        identity_of(i, want->ids[i]);
        for (uint64_t j = 0; j < len[i]; j++)
            want->e[n++] = runs[i][j] << 24 | i;
    }
    qsort(want->e, n, sizeof(uint64_t), cmp_u64);
    uint64_t d = 0;
    for (uint64_t i = 0; i < n; i++)
        if (!d || want->e[i] != want->e[d - 1])
            want->e[d++] = want->e[i];
    want->n = d;
    *len_out = len;
    return runs;
}

static void free_runs(uint64_t **runs, uint64_t *len, size_t nruns)
{
    for (size_t i = 0; i < nruns; i++)
        free(runs[i]);
    free(runs);
    free(len);
}

/* Write the level of runs at path, check it against want. */
static void check_write(const char *name, size_t nruns, const uint64_t *len_in, double shared)
{
    uint64_t *len;
    level_t want;
    uint64_t **runs = make_runs(nruns, len_in, shared, &len, &want);
    sfs_error_t err;
    char *path = strdup(path_of(name));
    int rc = sfs_gindex_write(path, (const uint64_t *const *)runs, len,
                              (const uint8_t(*)[32])want.ids, nruns, &err);
    CHECK(rc == SFS_OK, "%s: write: %s", name, err.message);
    CHECK(file_is(path, &want), "%s: file bytes (n %llu)", name, (unsigned long long)want.n);
    sfs_gindex_t *g;
    rc = sfs_gindex_open(path, &g, &err);
    CHECK(rc == SFS_OK, "%s: open: %s", name, err.message);
    if (rc == SFS_OK) {
        CHECK(sfs_gindex_count(g) == want.n && sfs_gindex_shard_count(g) == nruns &&
                  sfs_gindex_bucket_bits(g) == sfs_gindex_bits_for(want.n),
              "%s: accessors", name);
        int ids_ok = sfs_gindex_identity(g, nruns) == NULL;
        for (size_t i = 0; i < nruns; i++)
            ids_ok &= memcmp(sfs_gindex_identity(g, i), want.ids[i], 32) == 0;
        CHECK(ids_ok, "%s: identities", name);
        uint64_t fp = 0;
        CHECK(lookups_agree(g, &want, &fp), "%s: lookups", name);
        /* 2000 absent keys: expected n * 2000 / 2^40 */
        CHECK(fp <= 2, "%s: %llu false positives", name, (unsigned long long)fp);
        sfs_gindex_close(g);
    }
    free(path);
    level_free(&want);
    free_runs(runs, len, nruns);
}

static void test_write(void)
{
    check_write("empty.gidx", 0, NULL, 0);
    uint64_t zero[1] = {0};
    check_write("one-empty.gidx", 1, zero, 0);
    uint64_t one[1] = {1};
    check_write("one.gidx", 1, one, 0);
    uint64_t at64[1] = {64}, at65[2] = {40, 25}, at129[3] = {43, 43, 43};
    check_write("b0.gidx", 1, at64, 0);
    check_write("b1.gidx", 2, at65, 0.5);
    check_write("b2.gidx", 3, at129, 0.3);
    uint64_t some[5] = {1000, 0, 3000, 17, 2500};
    check_write("some.gidx", 5, some, 0.2);
    uint64_t many[300];
    for (int i = 0; i < 300; i++)
        many[i] = 500 + (uint64_t)(next_rand() % 2000);
    check_write("many.gidx", 300, many, 0.05);

    /* values at both ends of the range, every shard holding them */
    uint64_t e0[] = {0, 0, 1, LIMIT40 - 2, LIMIT40 - 1}, e1[] = {0, LIMIT40 - 1};
    const uint64_t *runs[] = {e0, e1};
    uint64_t len[] = {5, 2};
    uint8_t ids[2][32];
    identity_of(0, ids[0]);
    identity_of(1, ids[1]);
    sfs_error_t err;
    char *path = strdup(path_of("ends.gidx"));
    CHECK(sfs_gindex_write(path, runs, len, (const uint8_t(*)[32])ids, 2, &err) == SFS_OK,
          "ends: %s", err.message);
    sfs_gindex_t *g;
    if (sfs_gindex_open(path, &g, &err) == SFS_OK) {
        uint8_t key[32];
        uint32_t out[4];
        key_of(0, key);
        CHECK(sfs_gindex_lookup(g, key, out, 4) == 2 && out[0] == 0 && out[1] == 1, "prefix 0");
        memset(key, 0xFF, 32);
        CHECK(sfs_gindex_lookup(g, key, out, 4) == 2 && out[0] == 0 && out[1] == 1, "prefix max");
        CHECK(sfs_gindex_lookup(g, key, out, 1) == 2 && out[0] == 0, "max 1: count all");
        CHECK(sfs_gindex_lookup(g, key, NULL, 0) == 2, "max 0");
        key_of(LIMIT40 - 2, key);
        CHECK(sfs_gindex_lookup(g, key, out, 4) == 1 && out[0] == 0, "prefix max - 1");
        key_of(2, key);
        CHECK(sfs_gindex_lookup(g, key, out, 4) == 0, "absent");
        CHECK(sfs_gindex_count(g) == 6, "count %llu", (unsigned long long)sfs_gindex_count(g));
        sfs_gindex_close(g);
    } else {
        CHECK(0, "ends: open: %s", err.message);
    }
    free(path);
}

/* A large level: 1,000,000 entries from 1,000 shards (~1,000 each). */
static void test_large(void)
{
    uint64_t len[1000];
    for (int i = 0; i < 1000; i++)
        len[i] = 900 + (uint64_t)(next_rand() % 200);
    check_write("large.gidx", 1000, len, 0.01);
}

static void test_bad_writes(void)
{
    sfs_error_t err;
    uint8_t ids[2][32] = {{1}, {2}};
    uint64_t good[] = {1, 2, 3}, unsorted[] = {1, 3, 2}, big[] = {1, LIMIT40};
    uint64_t len[] = {3, 3};
    char *sub = strdup(path_of("bad"));
    mkdir(sub, 0700);
    char target[600];
    snprintf(target, sizeof(target), "%s/x.gidx", sub);

    const uint64_t *r1[] = {good, unsorted};
    int rc = sfs_gindex_write(target, r1, len, (const uint8_t(*)[32])ids, 2, &err);
    CHECK(rc == SFS_EINVAL && strstr(err.message, "run 1 is not sorted"), "unsorted: %d %s", rc,
          err.message);
    const uint64_t *r2[] = {big, good};
    uint64_t len2[] = {2, 3};
    rc = sfs_gindex_write(target, r2, len2, (const uint8_t(*)[32])ids, 2, &err);
    CHECK(rc == SFS_EINVAL && strstr(err.message, "40-bit"), "2^40: %d %s", rc, err.message);
    const uint64_t *r3[] = {NULL, good};
    rc = sfs_gindex_write(target, r3, len, (const uint8_t(*)[32])ids, 2, &err);
    CHECK(rc == SFS_EINVAL, "NULL run: %d %s", rc, err.message);
    rc = sfs_gindex_write(target, NULL, NULL, NULL, (size_t)(1 << 24) + 1, &err);
    CHECK(rc == SFS_EINVAL, "2^24 + 1 shards: %d %s", rc, err.message);
    CHECK(access(target, F_OK) != 0 && no_temp_files(sub), "nothing left after bad arguments");

    char *missing = strdup(path_of("no/such/dir/x.gidx"));
    const uint64_t *r4[] = {good, good};
    rc = sfs_gindex_write(missing, r4, len, (const uint8_t(*)[32])ids, 2, &err);
    CHECK(rc == SFS_EIO && err.sys_errno == ENOENT, "missing directory: %d %s", rc, err.message);
    sfs_gindex_t *g;
    rc = sfs_gindex_open(missing, &g, &err);
    CHECK(rc == SFS_EIO && err.sys_errno == ENOENT, "open missing: %d %s", rc, err.message);

    /* A write that fails half way (file size limit: EFBIG, as ENOSPC
     * would): the old file untouched, no temporary file. */
    int ofd = open(target, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(ofd >= 0 && write(ofd, "old", 3) == 3, "old file");
    close(ofd);
    uint64_t m = 100000;
    uint64_t *runs[2] = {malloc(m * 8), malloc(m * 8)};
    for (uint64_t i = 0; i < m; i++)
        runs[0][i] = runs[1][i] = i * 1000;
    uint64_t blen[] = {m, m};
    struct rlimit old, lim = {200000, 200000};
    getrlimit(RLIMIT_FSIZE, &old);
    lim.rlim_max = old.rlim_max;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    rc = sfs_gindex_write(target, (const uint64_t *const *)runs, blen, (const uint8_t(*)[32])ids,
                          2, &err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    CHECK(rc == SFS_EIO && err.sys_errno == EFBIG, "size limit: %d %s", rc, err.message);
    size_t flen;
    uint8_t *f = read_all(target, &flen);
    CHECK(f && flen == 3, "old file untouched");
    free(f);
    CHECK(no_temp_files(sub), "temporary file removed");
    /* and it replaces a file when it succeeds */
    rc = sfs_gindex_write(target, (const uint64_t *const *)runs, blen, (const uint8_t(*)[32])ids,
                          2, &err);
    CHECK(rc == SFS_OK && sfs_gindex_open(target, &g, &err) == SFS_OK, "replace: %s",
          err.message);
    if (rc == SFS_OK) {
        CHECK(sfs_gindex_count(g) == 2 * m, "replaced count");
        sfs_gindex_close(g);
    }
    free(runs[0]);
    free(runs[1]);
    free(sub);
    free(missing);
}

/* ---------------------------------------------------------------- merge */

/* The brute-force merge of levels (given as expected levels) with masks. */
static void merge_expected(const level_t *in, size_t nlevels, const uint8_t *const *masks,
                           level_t *out)
{
    uint64_t total = 0, entries = 0;
    for (size_t i = 0; i < nlevels; i++) {
        total += in[i].s;
        entries += in[i].n;
    }
    out->ids = malloc((total ? total : 1) * 32);
    out->e = malloc((entries ? entries : 1) * 8);
    out->s = 0;
    uint32_t **map = malloc((nlevels ? nlevels : 1) * sizeof(uint32_t *));
    for (size_t i = 0; i < nlevels; i++) {
        map[i] = malloc((in[i].s ? in[i].s : 1) * sizeof(uint32_t));
        for (uint64_t j = 0; j < in[i].s; j++) {
            map[i][j] = UINT32_MAX;
            if (masks && masks[i] && !masks[i][j])
                continue;
            uint64_t k = 0;
            while (k < out->s && memcmp(out->ids[k], in[i].ids[j], 32) != 0)
                k++;
            if (k == out->s)
                memcpy(out->ids[out->s++], in[i].ids[j], 32);
            map[i][j] = (uint32_t)k;
        }
    }
    uint64_t n = 0;
    for (size_t i = 0; i < nlevels; i++)
        for (uint64_t x = 0; x < in[i].n; x++) {
            uint32_t k = map[i][in[i].e[x] & 0xFFFFFF];
            if (k != UINT32_MAX)
                out->e[n++] = (in[i].e[x] >> 24) << 24 | k;
        }
    qsort(out->e, n, 8, cmp_u64);
    uint64_t d = 0;
    for (uint64_t i = 0; i < n; i++)
        if (!d || out->e[i] != out->e[d - 1])
            out->e[d++] = out->e[i];
    out->n = d;
    for (size_t i = 0; i < nlevels; i++)
        free(map[i]);
    free(map);
}

/* Write the level of runs with the given identity numbers at path. */
static void write_level(const char *path, size_t nruns, const uint64_t *id_numbers,
                        const uint64_t *len_in, double shared, level_t *want)
{
    uint64_t *len;
    uint64_t **runs = make_runs(nruns, len_in, shared, &len, want);
    for (size_t i = 0; i < nruns; i++)
        identity_of(id_numbers[i], want->ids[i]);
    sfs_error_t err;
    CHECK(sfs_gindex_write(path, (const uint64_t *const *)runs, len,
                           (const uint8_t(*)[32])want->ids, nruns, &err) == SFS_OK,
          "write %s: %s", path, err.message);
    free_runs(runs, len, nruns);
}

static void check_merge(const char *name, sfs_gindex_t **g, const level_t *in, size_t nlevels,
                        const uint8_t *const *masks)
{
    level_t want;
    merge_expected(in, nlevels, masks, &want);
    sfs_error_t err;
    char *path = strdup(path_of(name));
    int rc = sfs_gindex_merge(path, g, nlevels, masks, &err);
    CHECK(rc == SFS_OK, "%s: merge: %s", name, err.message);
    CHECK(file_is(path, &want), "%s: file bytes (n %llu, s %llu)", name,
          (unsigned long long)want.n, (unsigned long long)want.s);
    sfs_gindex_t *m;
    if (sfs_gindex_open(path, &m, &err) == SFS_OK) {
        uint64_t fp = 0;
        CHECK(lookups_agree(m, &want, &fp), "%s: lookups", name);
        CHECK(fp <= 2, "%s: %llu false positives", name, (unsigned long long)fp);
        sfs_gindex_close(m);
    } else {
        CHECK(0, "%s: open: %s", name, err.message);
    }
    free(path);
    level_free(&want);
}

static void test_merge(void)
{
    /* level A: shards 0, 1, 2; level B: shards 2 (the same as A's), 3, 0
     * (again), 4 and 4 again (equal identities inside one level) */
    uint64_t ida[] = {0, 1, 2}, lena[] = {3000, 2000, 1000};
    uint64_t idb[] = {2, 3, 0, 4, 4}, lenb[] = {1500, 10, 0, 500, 700};
    level_t in[3];
    char *pa = strdup(path_of("a.gidx")), *pb = strdup(path_of("b.gidx")),
         *pc = strdup(path_of("c.gidx"));
    write_level(pa, 3, ida, lena, 0.3, &in[0]);
    write_level(pb, 5, idb, lenb, 0.3, &in[1]);
    uint64_t idc[] = {7}, lenc[] = {0};
    write_level(pc, 1, idc, lenc, 0, &in[2]); /* one shard, no entry */
    sfs_gindex_t *g[3];
    sfs_error_t err;
    REQUIRE(sfs_gindex_open(pa, &g[0], &err) == SFS_OK, "%s", err.message);
    REQUIRE(sfs_gindex_open(pb, &g[1], &err) == SFS_OK, "%s", err.message);
    REQUIRE(sfs_gindex_open(pc, &g[2], &err) == SFS_OK, "%s", err.message);

    check_merge("m-all.gidx", g, in, 3, NULL);
    check_merge("m-one.gidx", g, in, 1, NULL);
    check_merge("m-none.gidx", g, in, 0, NULL);
    const uint8_t keep_a[] = {1, 0, 1}, keep_b[] = {1, 1, 1, 0, 1}, none_b[] = {0, 0, 0, 0, 0};
    const uint8_t *masks1[] = {keep_a, keep_b, NULL};
    check_merge("m-mask.gidx", g, in, 3, masks1);
    /* shard 0 dropped through B, kept through A: only A's entries */
    const uint8_t *masks2[] = {NULL, none_b, NULL};
    check_merge("m-drop-b.gidx", g, in, 3, masks2);
    const uint8_t none_a[] = {0, 0, 0}, none_c[] = {0};
    const uint8_t *masks3[] = {none_a, none_b, none_c};
    check_merge("m-nothing.gidx", g, in, 3, masks3);

    /* shard 1 (only in A) is gone after a masked merge */
    level_t want;
    merge_expected(in, 3, masks1, &want);
    sfs_gindex_t *m;
    if (sfs_gindex_open(path_of("m-mask.gidx"), &m, &err) == SFS_OK) {
        uint8_t id1[32];
        identity_of(1, id1);
        int absent = 1;
        for (uint64_t j = 0; j < sfs_gindex_shard_count(m); j++)
            absent &= memcmp(sfs_gindex_identity(m, j), id1, 32) != 0;
        CHECK(absent && sfs_gindex_shard_count(m) == 5, "masked shard gone, 5 left (0, 2, 3, 4, 7)");
        sfs_gindex_close(m);
    }
    level_free(&want);

    /* merge into the path of an input: the open level keeps its file */
    uint64_t before = sfs_gindex_count(g[0]);
    int rc = sfs_gindex_merge(pa, g, 2, NULL, &err);
    CHECK(rc == SFS_OK, "merge onto an input: %s", err.message);
    uint8_t key[32];
    uint32_t out[8];
    key_of(in[0].e[0] >> 24, key);
    CHECK(sfs_gindex_count(g[0]) == before && sfs_gindex_lookup(g[0], key, out, 8) >= 1,
          "old level still readable");
    if (sfs_gindex_open(pa, &m, &err) == SFS_OK) {
        merge_expected(in, 2, NULL, &want);
        CHECK(sfs_gindex_count(m) == want.n, "replaced by the merge");
        level_free(&want);
        sfs_gindex_close(m);
    }

    /* a merge into a missing directory leaves nothing */
    rc = sfs_gindex_merge(path_of("no/dir/x.gidx"), g, 2, NULL, &err);
    CHECK(rc == SFS_EIO && err.sys_errno == ENOENT, "merge missing dir: %d %s", rc, err.message);

    for (int i = 0; i < 3; i++) {
        sfs_gindex_close(g[i]);
        level_free(&in[i]);
    }
    free(pa);
    free(pb);
    free(pc);
}

/* Random merges: 4 levels of random shards drawn from 30 identities,
 * random masks, against the brute force. */
static void test_random_merges(void)
{
    for (int round = 0; round < 6; round++) {
        level_t in[4];
        sfs_gindex_t *g[4];
        uint8_t *masks[4];
        sfs_error_t err;
        for (int i = 0; i < 4; i++) {
            size_t s = 1 + next_rand() % 12;
            uint64_t ids[12], len[12];
            for (size_t j = 0; j < s; j++) {
                ids[j] = next_rand() % 30;
                len[j] = next_rand() % 800;
            }
            char name[64];
            snprintf(name, sizeof(name), "r%d-%d.gidx", round, i);
            write_level(path_of(name), s, ids, len, 0.2, &in[i]);
            REQUIRE(sfs_gindex_open(path_of(name), &g[i], &err) == SFS_OK, "%s", err.message);
            masks[i] = malloc(s);
            for (size_t j = 0; j < s; j++)
                masks[i][j] = next_rand() % 4 != 0;
        }
        check_merge("r-all.gidx", g, in, 4, NULL);
        check_merge("r-mask.gidx", g, in, 4, (const uint8_t *const *)masks);
        for (int i = 0; i < 4; i++) {
            sfs_gindex_close(g[i]);
            level_free(&in[i]);
            free(masks[i]);
        }
    }
}

/* ---------------------------------------------------------------- shards */

static int build_shard_of(const char *path, uint64_t n, uint8_t (*keys)[32])
{
    sfs_writer_t *w;
    sfs_error_t err;
    if (sfs_writer_open(path, &w, &err) != SFS_OK)
        return -1;
    for (uint64_t i = 0; i < n; i++)
        if (sfs_writer_add(w, keys[i], keys[i], i % 33, &err) != SFS_OK) {
            sfs_writer_abort(w);
            return -1;
        }
    return sfs_writer_finish(w, NULL, &err) == SFS_OK ? 0 : -1;
}

/* The sorted distinct prefixes of keys[0, n) but those in `gone`. */
static uint64_t expected_prefixes(uint8_t (*keys)[32], uint64_t n, const uint8_t *gone,
                                  uint64_t *out)
{
    uint64_t m = 0;
    for (uint64_t i = 0; i < n; i++)
        if (!gone || !gone[i])
            out[m++] = sfs_gindex_prefix(keys[i]);
    qsort(out, m, 8, cmp_u64);
    uint64_t d = 0;
    for (uint64_t i = 0; i < m; i++)
        if (!d || out[i] != out[d - 1])
            out[d++] = out[i];
    return d;
}

static void test_shard_prefixes(void)
{
    uint64_t sizes[] = {0, 1, 5, 3000, 50000};
    for (size_t t = 0; t < sizeof(sizes) / sizeof(sizes[0]); t++) {
        uint64_t n = sizes[t];
        uint8_t(*keys)[32] = malloc((n ? n : 1) * 32);
        for (uint64_t i = 0; i < n; i++)
            rand_key(keys[i]);
        /* keys sharing their top 40 bits (and more) */
        for (uint64_t i = 1; i < n; i += 97)
            memcpy(keys[i], keys[i - 1], 5 + i % 20);
        char name[64];
        snprintf(name, sizeof(name), "p%llu.shard", (unsigned long long)n);
        char *sp = strdup(path_of(name));
        CHECK(build_shard_of(sp, n, keys) == 0, "build %s", name);
        sfs_shard_t *s;
        sfs_error_t err;
        REQUIRE(sfs_open(sp, 1, &s, &err) == SFS_OK, "open %s: %s", name, err.message);
        uint64_t *want = malloc((n ? n : 1) * 8), *got;
        size_t m;
        uint64_t wm = expected_prefixes(keys, n, NULL, want);
        int rc = sfs_shard_key_prefixes(s, &got, &m, &err);
        CHECK(rc == SFS_OK && m == wm && (m == 0 || memcmp(got, want, m * 8) == 0),
              "%s: prefixes (%zu, want %llu): %s", name, m, (unsigned long long)wm,
              rc ? err.message : "");
        if (rc == SFS_OK)
            free(got);
        /* deleted keys are left out */
        uint8_t *gone = calloc(n ? n : 1, 1);
        for (uint64_t i = 0; i < n; i += 3) {
            gone[i] = 1;
            CHECK(sfs_delete(s, keys[i], &err) == SFS_OK, "delete: %s", err.message);
        }
        wm = expected_prefixes(keys, n, gone, want);
        rc = sfs_shard_key_prefixes(s, &got, &m, &err);
        CHECK(rc == SFS_OK && m == wm && (m == 0 || memcmp(got, want, m * 8) == 0),
              "%s after deletes: %zu, want %llu", name, m, (unsigned long long)wm);
        if (rc == SFS_OK) {
            /* end to end: a level of this shard and another finds every key */
            uint64_t other[] = {1, 2, 3};
            const uint64_t *runs[] = {got, other};
            uint64_t len[] = {m, 3};
            uint8_t ids[2][32] = {{9}, {8}};
            char *lp = strdup(path_of("p.gidx"));
            sfs_gindex_t *g;
            CHECK(sfs_gindex_write(lp, runs, len, (const uint8_t(*)[32])ids, 2, &err) == SFS_OK &&
                      sfs_gindex_open(lp, &g, &err) == SFS_OK,
                  "level of %s: %s", name, err.message);
            int all = 1;
            uint32_t out[4];
            for (uint64_t i = 0; i < n; i++)
                if (!gone[i])
                    all &= sfs_gindex_lookup(g, keys[i], out, 4) >= 1 && out[0] == 0;
            CHECK(all, "%s: every live key found in shard 0", name);
            sfs_gindex_close(g);
            free(lp);
            free(got);
        }
        /* a shard truncated after sfs_open: SFS_EIO, no SIGBUS */
        if (n >= 3000) {
            CHECK(truncate(sp, 1000) == 0, "truncate");
            rc = sfs_shard_key_prefixes(s, &got, &m, &err);
            CHECK(rc == SFS_EIO, "truncated shard: %d %s", rc, err.message);
        }
        sfs_close(s);
        free(gone);
        free(want);
        free(keys);
        free(sp);
    }
}

/* ---------------------------------------------------------------- damage */

static void test_damaged(void)
{
    uint64_t len[3] = {700, 500, 300};
    level_t want;
    uint64_t *lens;
    uint64_t **runs = make_runs(3, len, 0.2, &lens, &want);
    char *path = strdup(path_of("d.gidx"));
    sfs_error_t err;
    CHECK(sfs_gindex_write(path, (const uint64_t *const *)runs, lens,
                           (const uint8_t(*)[32])want.ids, 3, &err) == SFS_OK, "%s", err.message);
    free_runs(runs, lens, 3);
    size_t size;
    uint8_t *good = read_all(path, &size);
    char *bad = strdup(path_of("bad.gidx"));
    sfs_gindex_t *g;

    /* every truncation is refused */
    int all = 1;
    for (size_t cut = 0; cut < size; cut += (cut < 200 ? 1 : 97)) {
        write_all(bad, good, cut);
        int rc = sfs_gindex_open(bad, &g, &err);
        all &= rc == SFS_ECORRUPT;
        if (rc == SFS_OK)
            sfs_gindex_close(g);
    }
    CHECK(all, "truncations refused");
    /* one byte more, too */
    uint8_t *longer = malloc(size + 1);
    memcpy(longer, good, size);
    longer[size] = 0;
    write_all(bad, longer, size + 1);
    CHECK(sfs_gindex_open(bad, &g, &err) == SFS_ECORRUPT, "longer: %s", err.message);
    free(longer);

    /* damaged headers */
    struct {
        size_t at;
        uint64_t value;
        int width;
        const char *what;
    } fields[] = {
        {0, 0x5858585858585858ull, 8, "magic"},  {8, 1, 4, "version 1"},
        {12, 33, 4, "bucket_bits > 32"},         {12, 0, 4, "bucket_bits (size)"},
        {16, want.n + 1, 8, "count"},            {16, UINT64_MAX, 8, "count 2^64 - 1"},
        {16, UINT64_MAX / 8, 8, "count overflow"}, {24, (1ull << 24) + 1, 8, "shard_count"},
        {24, 2, 8, "shard_count (size)"},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        uint8_t *f = malloc(size);
        memcpy(f, good, size);
        for (int b = 0; b < fields[i].width; b++)
            f[fields[i].at + b] = (uint8_t)(fields[i].value >> (8 * b));
        write_all(bad, f, size);
        int rc = sfs_gindex_open(bad, &g, &err);
        CHECK(rc == SFS_ECORRUPT && strstr(err.message, "bad.gidx"), "%s: %d %s",
              fields[i].what, rc, err.message);
        if (rc == SFS_OK)
            sfs_gindex_close(g);
        free(f);
    }
    CHECK(sfs_gindex_open(dir, &g, &err) == SFS_ECORRUPT, "a directory: %s", err.message);

    /* bucket_bits other than the writer's, size consistent: still right */
    {
        size_t table = 64 + 32 * 3;
        size_t nsize = table + 16 + 8 * want.n + 8; /* b = 0: 8-byte entries */
        uint8_t *f = calloc(1, nsize);
        memcpy(f, good, table);
        f[12] = 0;
        put_le64(f + table, 0);
        put_le64(f + table + 8, want.n);
        for (uint64_t x = 0; x < want.n; x++)
            put_le64(f + table + 16 + 8 * x, want.e[x]);
        write_all(bad, f, nsize);
        REQUIRE(sfs_gindex_open(bad, &g, &err) == SFS_OK, "b = 0: %s", err.message);
        uint64_t fp = 0;
        CHECK(lookups_agree(g, &want, &fp), "b = 0: lookups");
        sfs_gindex_close(g);
        free(f);
    }

    /* random bytes in the body: lookups never crash nor name a shard
     * outside the table; a merge fails with SFS_ECORRUPT or writes a valid
     * level */
    int merged = 0, refused = 0, lookups_ok = 1, merges_ok = 1;
    for (int round = 0; round < 300; round++) {
        uint8_t *f = malloc(size);
        memcpy(f, good, size);
        int mode = round % 3;
        if (mode == 0) { /* a few bytes anywhere after the header */
            for (int k = 0; k < 1 + round % 20; k++)
                f[64 + next_rand() % (size - 64)] = (uint8_t)next_rand();
        } else if (mode == 1) { /* the directory: huge and random values */
            size_t d0 = 64 + 32 * 3, nd = (1u << sfs_gindex_bits_for(want.n)) + 1;
            for (int k = 0; k < 4; k++) {
                uint64_t v = next_rand();
                put_le64(f + d0 + 8 * (next_rand() % nd),
                         k == 0 ? UINT64_MAX : k == 1 ? want.n + 1 : v);
            }
        } else { /* the whole body random */
            for (size_t k = 64; k < size; k++)
                f[k] = (uint8_t)next_rand();
        }
        write_all(bad, f, size);
        free(f);
        if (sfs_gindex_open(bad, &g, &err) != SFS_OK) {
            lookups_ok = 0;
            continue;
        }
        uint8_t key[32];
        uint32_t out[8];
        for (int k = 0; k < 300; k++) {
            if (k % 2)
                rand_key(key);
            else
                key_of(want.e[next_rand() % want.n] >> 24, key);
            size_t got = sfs_gindex_lookup(g, key, out, 8);
            lookups_ok &= got <= want.n;
            for (size_t x = 0; x < got && x < 8; x++)
                lookups_ok &= out[x] < 3;
        }
        char *mp = strdup(path_of("bad-merged.gidx"));
        int rc = sfs_gindex_merge(mp, &g, 1, NULL, &err);
        if (rc == SFS_OK) {
            merged++;
            sfs_gindex_t *m;
            if (sfs_gindex_open(mp, &m, &err) == SFS_OK) {
                /* a valid level: read it back and compare with itself */
                size_t mlen;
                uint8_t *mf = read_all(mp, &mlen);
                level_t mw = {3, sfs_gindex_count(m), malloc(96), NULL};
                memcpy(mw.ids, mf + 64, 96);
                mw.e = entry_values(mf, 3, sfs_gindex_bits_for(mw.n), mw.n);
                int sorted = 1;
                for (uint64_t x = 1; x < mw.n; x++)
                    sorted &= mw.e[x] > mw.e[x - 1];
                merges_ok &= sorted && file_is(mp, &mw);
                level_free(&mw);
                free(mf);
                sfs_gindex_close(m);
            } else {
                merges_ok = 0;
            }
        } else {
            refused++;
            merges_ok &= rc == SFS_ECORRUPT;
        }
        free(mp);
        sfs_gindex_close(g);
    }
    CHECK(lookups_ok, "damaged bodies: lookups in bounds");
    CHECK(merges_ok, "damaged bodies: merges valid or SFS_ECORRUPT (%d merged, %d refused)",
          merged, refused);
    CHECK(refused > 0 && merged > 0, "both outcomes seen (%d merged, %d refused)", merged,
          refused);
    CHECK(no_temp_files(dir), "no temporary file left");

    /* a level truncated after open: the merge fails with SFS_EIO */
    write_all(bad, good, size);
    REQUIRE(sfs_gindex_open(bad, &g, &err) == SFS_OK, "reopen: %s", err.message);
    CHECK(truncate(bad, (off_t)(size - 100)) == 0, "truncate");
    int rc = sfs_gindex_merge(path_of("t.gidx"), &g, 1, NULL, &err);
    CHECK(rc == SFS_EIO, "truncated level: %d %s", rc, err.message);
    CHECK(access(path_of("t.gidx"), F_OK) != 0, "nothing written");
    sfs_gindex_close(g);

    level_free(&want);
    free(good);
    free(bad);
    free(path);
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    const sfs_gindex_t *g;
    const level_t *want;
    int ok;
} thread_arg;

static void *lookup_thread(void *p)
{
    thread_arg *a = p;
    uint32_t out[16];
    uint8_t key[32];
    a->ok = 1;
    for (int round = 0; round < 3; round++)
        for (uint64_t i = 0; i < a->want->n; i++) {
            memset(key, 0xA5, 32);
            for (int b = 0; b < 5; b++)
                key[b] = (uint8_t)((a->want->e[i] >> 24) >> (32 - 8 * b));
            size_t got = sfs_gindex_lookup(a->g, key, out, 16);
            int has = 0;
            for (size_t x = 0; x < got && x < 16; x++)
                has |= out[x] == (a->want->e[i] & 0xFFFFFF);
            a->ok &= has;
        }
    return NULL;
}

static void test_threads(void)
{
    uint64_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = 5000;
    level_t want;
    uint64_t *lens;
    uint64_t **runs = make_runs(8, len, 0.1, &lens, &want);
    char *path = strdup(path_of("th.gidx"));
    sfs_error_t err;
    sfs_gindex_t *g;
    CHECK(sfs_gindex_write(path, (const uint64_t *const *)runs, lens,
                           (const uint8_t(*)[32])want.ids, 8, &err) == SFS_OK &&
              sfs_gindex_open(path, &g, &err) == SFS_OK,
          "%s", err.message);
    pthread_t t[4];
    thread_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (thread_arg){g, &want, 0};
        pthread_create(&t[i], NULL, lookup_thread, &a[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(a[i].ok, "thread %d", i);
    }
    sfs_gindex_close(g);
    free_runs(runs, lens, 8);
    level_free(&want);
    free(path);
}

int main(void)
{
    if (make_test_dir("shardfs-gindex-test") != 0)
        return 1;
    CHECK(sfs_gindex_bits_for(0) == 0 && sfs_gindex_bits_for(64) == 0 &&
              sfs_gindex_bits_for(65) == 1 && sfs_gindex_bits_for(128) == 1 &&
              sfs_gindex_bits_for(129) == 2 && sfs_gindex_bits_for(1000000) == 14 &&
              sfs_gindex_bits_for(UINT64_MAX) == 32,
          "bits_for");
    CHECK(sfs_gindex_file_size(3, 2, 10) == 64 + 96 + 40 + 80 + 8, "file_size");
    CHECK(sfs_gindex_entry_size(0) == 8 && sfs_gindex_entry_size(1) == 8 &&
              sfs_gindex_entry_size(8) == 7 && sfs_gindex_entry_size(14) == 7 &&
              sfs_gindex_entry_size(16) == 6 && sfs_gindex_entry_size(24) == 5 &&
              sfs_gindex_entry_size(29) == 5 && sfs_gindex_entry_size(32) == 4,
          "entry_size");
    uint8_t key[32] = {0x12, 0x34, 0x56, 0x78, 0x9A, 0xBC};
    CHECK(sfs_gindex_prefix(key) == 0x123456789Aull, "prefix");
    test_write();
    test_large();
    test_bad_writes();
    test_merge();
    test_random_merges();
    test_shard_prefixes();
    test_damaged();
    test_threads();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
