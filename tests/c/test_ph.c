/*
 * test_ph.c — C unit tests of ph.h, the MOSAIC index's minimal perfect hash
 * (ph::fmph::GOFunction of ph 0.10.0) as shardfs/c/gof.c reads and
 * evaluates it, against the answers of ph itself.
 *
 * The fixtures come from the Rust crate shardfs/c/ph/ (a wrapper of ph
 * kept only as this test's oracle): `cargo test --release --manifest-path
 * shardfs/c/ph/Cargo.toml` writes shardfs/c/ph/target/fixtures/ (*.bin):
 * functions over 1, 2, 1000 and 100000 keys of 20 and 32 bytes, over keys
 * of mixed lengths (0 to 100 bytes), over the empty key alone and over no
 * key, each with keys that are not members; and damaged.bin, 6000 damaged,
 * truncated and random buffers. A file is a sequence of records, all
 * integers little-endian (see `record` in shardfs/c/ph/src/tests.rs):
 *
 *   u8   kind: 0 = a function as ph wrote it, 1 = any other buffer
 *   u64  buf_len, then buf_len bytes
 *   i64  used: the bytes the function takes, -1 when it must be refused
 *   u32  members, u32 total
 *   total times: u32 key_len, then key_len bytes (members first)
 *   total times: i64 ph's get of the key, -1 for None
 *
 * Checks: for every record, sfs_gof_read of an exact-size copy accepts it
 * exactly when ph's reader (behind the wrapper's size checks) does, with
 * the same *used, and every key gets ph's value, members and others alike
 * (on damaged functions too). For the functions (kind 0), also: the
 * members' values are a permutation of 0..members; the same answers from
 * 4 threads sharing one handle; with bytes after the function; every
 * proper prefix (copied to a buffer of exactly that size, so that ASan or
 * valgrind see any read past it) refused; damaged headers refused. Then
 * a fuzz loop (no libFuzzer): random buffers and random mutations of the
 * fixtures' functions must never crash, and when accepted they must keep
 * the invariants (used <= len; values in [-1, 8 * used); the memory held
 * at most 4 * len + 128 bytes; buf[0..used) accepted alike, one byte less
 * refused). NULL arguments. The fuzz loop makes 20000 random buffers and
 * 2000 mutations of each function of at most 100000 bytes; set
 * SFS_FUZZ_ROUNDS (default 20000) for a longer run.
 *
 * Build and run from the repository root (no Rust needed once the
 * fixtures exist):
 *
 *   gcc -O2 -g -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Ishardfs/c \
 *       -o shardfs/c/ph/target/test_ph tests/c/test_ph.c shardfs/c/gof.c \
 *       -lpthread
 *   ./shardfs/c/ph/target/test_ph [fixture...]
 *
 * and once under the sanitizers (add -fsanitize=address,undefined
 * -fno-omit-frame-pointer -O1 to the gcc line). Speed:
 *
 *   ./shardfs/c/ph/target/test_ph --bench shardfs/c/ph/target/bench/keys32-n1000000.bin
 *
 * times the lookup of every key of that file (written by the crate's
 * ignored test bench_1m, which times the Rust side the same way).
 */
#define _GNU_SOURCE
#include "ph.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define THREADS 4
#define FIXTURE_DIR "shardfs/c/ph/target/fixtures"

struct record {
    const char *file; /* for messages */
    unsigned index;   /* of the record in its file */
    uint8_t kind;     /* 0 = a function as ph wrote it, 1 = any buffer */
    const uint8_t *buf; /* inside the file's bytes */
    size_t buf_len;
    int64_t used; /* -1: must be refused */
    uint32_t members, total;
    const uint8_t **keys; /* total pointers into the file's bytes */
    uint32_t *key_lens;
    int64_t *expected;
};

struct file {
    char *path;
    uint8_t *bytes;
    size_t size;
    struct record *records;
    unsigned count;
};

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        perror("malloc");
        abort();
    }
    return p;
}

/* Parse one record at *p (end: the file's end); 0, or -1 if malformed. */
static int parse_record(const uint8_t **p, const uint8_t *end, struct record *r)
{
    const uint8_t *q = *p;
    if (end - q < 9)
        return -1;
    r->kind = q[0];
    uint64_t buf_len = le(q + 1, 8);
    q += 9;
    if ((uint64_t)(end - q) < buf_len || (uint64_t)(end - q) - buf_len < 16)
        return -1;
    r->buf = q;
    r->buf_len = (size_t)buf_len;
    q += buf_len;
    r->used = (int64_t)le(q, 8);
    r->members = (uint32_t)le(q + 8, 4);
    r->total = (uint32_t)le(q + 12, 4);
    q += 16;
    if (r->members > r->total || r->kind > 1)
        return -1;
    r->keys = xmalloc(((size_t)r->total + 1) * sizeof(*r->keys));
    r->key_lens = xmalloc(((size_t)r->total + 1) * sizeof(*r->key_lens));
    r->expected = xmalloc(((size_t)r->total + 1) * sizeof(*r->expected));
    for (uint32_t i = 0; i < r->total; i++) {
        if (end - q < 4)
            return -1;
        uint32_t n = (uint32_t)le(q, 4);
        q += 4;
        if ((uint64_t)(end - q) < n)
            return -1;
        r->keys[i] = q;
        r->key_lens[i] = n;
        q += n;
    }
    if ((uint64_t)(end - q) < 8 * (uint64_t)r->total)
        return -1;
    for (uint32_t i = 0; i < r->total; i++)
        r->expected[i] = (int64_t)le(q + 8 * (size_t)i, 8);
    q += 8 * (size_t)r->total;
    *p = q;
    return 0;
}

/* Read the file at `path` and parse its records; 0, or -1 after a message. */
static int load(const char *path, struct file *fx)
{
    memset(fx, 0, sizeof(*fx));
    fx->path = strdup(path);
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    fx->bytes = xmalloc(size > 0 ? (size_t)size : 1);
    if (size < 0 || fread(fx->bytes, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "%s: cannot read\n", path);
        fclose(f);
        return -1;
    }
    fclose(f);
    fx->size = (size_t)size;
    const uint8_t *p = fx->bytes, *end = fx->bytes + fx->size;
    unsigned cap = 0;
    while (p < end) {
        if (fx->count == cap) {
            cap = cap ? 2 * cap : 16;
            fx->records = realloc(fx->records, cap * sizeof(*fx->records));
            if (!fx->records)
                abort();
        }
        struct record *r = &fx->records[fx->count];
        memset(r, 0, sizeof(*r));
        r->file = fx->path;
        r->index = fx->count++;
        if (parse_record(&p, end, r) != 0) {
            fprintf(stderr, "%s: record %u malformed\n", path, r->index);
            return -1;
        }
    }
    if (fx->count == 0) {
        fprintf(stderr, "%s: no record\n", path);
        return -1;
    }
    return 0;
}

static void unload(struct file *fx)
{
    for (unsigned i = 0; i < fx->count; i++) {
        free(fx->records[i].keys);
        free(fx->records[i].key_lens);
        free(fx->records[i].expected);
    }
    free(fx->records);
    free(fx->bytes);
    free(fx->path);
}

/* sfs_gof_read of a private copy of bytes[0..len) (exactly len bytes). */
static sfs_gof_t *read_copy(const uint8_t *bytes, size_t len, size_t *used)
{
    uint8_t *copy = xmalloc(len);
    if (len)
        memcpy(copy, bytes, len);
    sfs_gof_t *f = sfs_gof_read(copy, len, used);
    free(copy); /* the handle holds its own copy */
    return f;
}

/* Number of keys whose sfs_gof_get differs from ph's, from key `start` on. */
static uint32_t mismatches(const struct record *r, const sfs_gof_t *f, uint32_t start)
{
    uint32_t bad = 0;
    for (uint32_t j = 0; j < r->total; j++) {
        uint32_t i = (start + j) % r->total;
        if (sfs_gof_get(f, r->keys[i], r->key_lens[i]) != r->expected[i])
            bad++;
    }
    return bad;
}

struct worker {
    const struct record *r;
    const sfs_gof_t *f;
    uint32_t start, bad;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    for (int round = 0; round < 3; round++)
        w->bad += mismatches(w->r, w->f, w->start);
    return NULL;
}

/* Position of the seed-size byte of a well-formed function: after the
 * header byte, the VBytes (LEB128; the 9th byte of one is taken whole) of
 * the level count and sizes, and ceil(G / 4) words of fingerprints. */
static size_t seed_size_at(const uint8_t *gof, size_t len)
{
    size_t pos = 1;
    uint64_t levels = 0, groups = 0;
    for (uint64_t i = 0; i <= levels; i++) {
        uint64_t v = 0;
        for (int shift = 0; pos < len; shift += 7) {
            uint8_t b = gof[pos++];
            if (shift == 56) {
                v |= (uint64_t)b << 56;
                break;
            }
            v |= (uint64_t)(b & 0x7F) << shift;
            if (b < 128)
                break;
        }
        if (i == 0)
            levels = v;
        else
            groups += v;
    }
    return pos + 8 * ((groups + 3) / 4);
}

/* Any record: accepted exactly when ph accepts it, the same *used, ph's
 * value for every key. */
static void test_record(const struct record *r)
{
    size_t used = 12345;
    sfs_gof_t *f = read_copy(r->buf, r->buf_len, &used);
    if (r->used < 0) {
        CHECK(f == NULL && used == 12345, "%s #%u: accepted (used %zu), ph refuses it", r->file,
              r->index, used);
        sfs_gof_free(f);
        return;
    }
    REQUIRE(f != NULL, "%s #%u: refused, ph reads %lld of %zu bytes", r->file, r->index,
            (long long)r->used, r->buf_len);
    CHECK(used == (size_t)r->used, "%s #%u: used %zu, ph %lld", r->file, r->index, used,
          (long long)r->used);
    uint32_t bad = mismatches(r, f, 0);
    CHECK(bad == 0, "%s #%u: %u of %u keys differ from ph", r->file, r->index, bad, r->total);
    CHECK(sfs_gof_size_bytes(f) <= 4 * (uint64_t)used + 128, "%s #%u: %llu bytes held for %zu",
          r->file, r->index, (unsigned long long)sfs_gof_size_bytes(f), used);
    sfs_gof_free(f);
}

/* A function as ph wrote it: the checks above and more. */
static void test_function(const struct record *r)
{
    size_t used = 0;
    REQUIRE(r->used == (int64_t)r->buf_len, "%s: a function of %zu bytes, used %lld", r->file,
            r->buf_len, (long long)r->used);
    sfs_gof_t *f = read_copy(r->buf, r->buf_len, &used);
    REQUIRE(f != NULL, "%s: sfs_gof_read failed on %zu bytes", r->file, r->buf_len);

    /* members: a permutation of 0..members; others: -1 or in range */
    uint8_t *seen = calloc((size_t)r->members + 1, 1);
    REQUIRE(seen != NULL, "calloc");
    uint32_t bad = 0, absent = 0;
    for (uint32_t i = 0; i < r->members; i++) {
        int64_t v = sfs_gof_get(f, r->keys[i], r->key_lens[i]);
        if (v < 0 || v >= r->members || seen[v])
            bad++;
        else
            seen[v] = 1;
    }
    free(seen);
    CHECK(bad == 0, "%s: %u members without a distinct value in [0, %u)", r->file, bad, r->members);
    for (uint32_t i = r->members; i < r->total; i++) {
        int64_t v = sfs_gof_get(f, r->keys[i], r->key_lens[i]);
        CHECK(v >= -1 && v < (int64_t)r->members, "%s: other key %u: value %lld", r->file, i,
              (long long)v);
        absent += v == -1;
    }
    printf("%s: %u keys, %zu bytes (%.2f bits/key), %llu bytes in memory; %u of %u other keys "
           "answered -1 (ph: the same)\n",
           r->file, r->members, r->buf_len, 8.0 * r->buf_len / (r->members ? r->members : 1),
           (unsigned long long)sfs_gof_size_bytes(f), absent, r->total - r->members);

    /* one handle, several threads */
    pthread_t threads[THREADS];
    struct worker workers[THREADS];
    for (int t = 0; t < THREADS; t++) {
        workers[t] = (struct worker){r, f, (uint32_t)t * (r->total / THREADS), 0};
        CHECK(pthread_create(&threads[t], NULL, work, &workers[t]) == 0, "pthread_create");
    }
    for (int t = 0; t < THREADS; t++) {
        pthread_join(threads[t], NULL);
        CHECK(workers[t].bad == 0, "%s: thread %d: %u mismatches", r->file, t, workers[t].bad);
    }
    sfs_gof_free(f);

    /* with bytes after it: the same function, the same size */
    uint8_t *longer = xmalloc(r->buf_len + 100);
    memcpy(longer, r->buf, r->buf_len);
    memset(longer + r->buf_len, 0xA5, 100);
    used = 0;
    f = sfs_gof_read(longer, r->buf_len + 100, &used);
    free(longer);
    CHECK(f && used == r->buf_len, "%s: with trailing bytes: used %zu", r->file, used);
    if (f)
        CHECK(mismatches(r, f, 7) == 0, "%s: with trailing bytes: keys differ", r->file);
    sfs_gof_free(f);

    /* every proper prefix: NULL, *used untouched */
    uint32_t accepted = 0;
    for (size_t cut = 0; cut < r->buf_len; cut++) {
        used = 12345;
        sfs_gof_t *g = read_copy(r->buf, cut, &used);
        if (g || used != 12345)
            accepted++;
        sfs_gof_free(g);
    }
    CHECK(accepted == 0, "%s: %u truncated copies accepted", r->file, accepted);

    /* damaged headers */
    size_t seed_at = seed_size_at(r->buf, r->buf_len);
    REQUIRE(r->buf[0] == 16 && seed_at < r->buf_len && r->buf[seed_at] == 4,
            "%s: group size %u, seed size at %zu not 4", r->file, r->buf[0], seed_at);
    uint8_t *copy = xmalloc(r->buf_len);
    struct {
        size_t at;
        uint8_t value;
        int refused; /* must be refused (a level size may still fit) */
        const char *what;
    } damages[] = {
        {0, 8, 1, "group size 8"},        {0, 32, 1, "group size 32"},
        {0, 0, 1, "group size 0"},        {1, 0xFF, 0, "huge level count"},
        {2, 0x00, 1, "level of 0 groups"}, {2, 0xFF, 0, "huge level size"},
        {seed_at, 8, 1, "seed size 8"},   {seed_at, 0, 1, "seed size 0"},
    };
    for (size_t d = 0; d < sizeof(damages) / sizeof(damages[0]); d++) {
        if (damages[d].at == 2 && r->buf[1] == 0)
            continue; /* no level */
        memcpy(copy, r->buf, r->buf_len);
        copy[damages[d].at] = damages[d].value;
        sfs_gof_t *g = sfs_gof_read(copy, r->buf_len, NULL);
        if (damages[d].refused)
            CHECK(g == NULL, "%s: %s accepted", r->file, damages[d].what);
        if (g)
            for (uint32_t i = 0; i < r->total; i += 97) {
                int64_t v = sfs_gof_get(g, r->keys[i], r->key_lens[i]);
                CHECK(v >= -1, "%s: %s: value %lld", r->file, damages[d].what, (long long)v);
            }
        sfs_gof_free(g);
    }
    free(copy);
}

/* ------------------------------------------------------------- fuzzing */

/* Read buf[0..len) (exact-size copy); when accepted check the invariants
 * and look up a few random keys. Returns 1 if accepted. */
static int fuzz_one(const uint8_t *buf, size_t len)
{
    size_t used = 12345;
    sfs_gof_t *f = read_copy(buf, len, &used);
    if (!f) {
        CHECK(used == 12345, "fuzz: *used written on refusal");
        return 0;
    }
    int ok = used <= len && sfs_gof_size_bytes(f) <= 4 * (uint64_t)used + 128;
    uint8_t key[64];
    int64_t values[8];
    uint64_t keys_seed = next_rand();
    for (int k = 0; k < 8; k++) {
        uint64_t x = keys_seed + (uint64_t)k * 0x9E3779B97F4A7C15ULL;
        size_t n = (size_t)(x % 65);
        for (size_t i = 0; i < n; i++)
            key[i] = (uint8_t)(x >> (8 * (i % 8))) ^ (uint8_t)i;
        values[k] = sfs_gof_get(f, key, n);
        ok &= values[k] >= -1 && values[k] < 8 * (int64_t)used;
    }
    sfs_gof_free(f);
    /* the function alone: the same; one byte less: refused */
    if (used <= len && used > 0) {
        size_t used2 = 0;
        sfs_gof_t *g = read_copy(buf, used, &used2);
        ok &= g != NULL && used2 == used;
        if (g)
            for (int k = 0; k < 8; k++) {
                uint64_t x = keys_seed + (uint64_t)k * 0x9E3779B97F4A7C15ULL;
                size_t n = (size_t)(x % 65);
                for (size_t i = 0; i < n; i++)
                    key[i] = (uint8_t)(x >> (8 * (i % 8))) ^ (uint8_t)i;
                ok &= sfs_gof_get(g, key, n) == values[k];
            }
        sfs_gof_free(g);
        ok &= read_copy(buf, used - 1, NULL) == NULL;
    }
    CHECK(ok, "fuzz: invariants broken on a buffer of %zu bytes (used %zu)", len, used);
    return 1;
}

/* Random buffers, then mutations of the functions of `files`. */
static void fuzz(struct file *files, int nfiles, unsigned rounds)
{
    unsigned accepted = 0, tried = 0;
    uint8_t *buf = xmalloc(1024);
    for (unsigned i = 0; i < rounds; i++) {
        size_t len = (size_t)(next_rand() % 1024);
        for (size_t j = 0; j < len; j++)
            buf[j] = (uint8_t)next_rand();
        if (i % 4 != 0 && len > 0)
            buf[0] = 16; /* steer past the first checks */
        if (i % 4 >= 2 && len > 2)
            buf[1] = (uint8_t)(next_rand() % 4); /* few levels */
        if (i % 4 == 3 && len > 3)
            buf[2] = (uint8_t)(1 + next_rand() % 8); /* a small first level */
        accepted += fuzz_one(buf, len);
        tried++;
    }
    free(buf);
    /* mutations of the (small) functions of the fixtures */
    for (int fi = 0; fi < nfiles; fi++)
        for (unsigned ri = 0; ri < files[fi].count; ri++) {
            const struct record *r = &files[fi].records[ri];
            if (r->kind != 0 || r->buf_len > 100000)
                continue;
            uint8_t *m = xmalloc(r->buf_len + 64);
            for (unsigned i = 0; i < rounds / 10; i++) {
                size_t len = r->buf_len;
                memcpy(m, r->buf, len);
                unsigned changes = 1 + (unsigned)(next_rand() % 4);
                for (unsigned c = 0; c < changes && len > 0; c++) {
                    size_t at = (size_t)(next_rand() % len);
                    switch (next_rand() % 6) {
                    case 0: m[at] ^= (uint8_t)(1u << (next_rand() % 8)); break;
                    case 1: m[at] = (uint8_t)next_rand(); break;
                    case 2: /* in the header: level count, sizes, seed size */
                        m[at % (len < 16 ? len : 16)] = (uint8_t)next_rand();
                        break;
                    case 3: len = at; break; /* truncate */
                    case 4: /* insert a byte */
                        if (len < r->buf_len + 64) {
                            memmove(m + at + 1, m + at, len - at);
                            m[at] = (uint8_t)next_rand();
                            len++;
                        }
                        break;
                    default: /* delete a byte */
                        memmove(m + at, m + at + 1, len - at - 1);
                        len--;
                        break;
                    }
                }
                accepted += fuzz_one(m, len);
                tried++;
            }
            free(m);
        }
    printf("fuzz: %u buffers, %u accepted, none crashed\n", tried, accepted);
}

/* ---------------------------------------------------------------- other */

static void test_null_and_empty(void)
{
    static const uint8_t empty[] = {16, 0, 4}; /* GOFunction of no key */
    size_t used = 0;
    sfs_gof_t *f = sfs_gof_read(empty, sizeof(empty), &used);
    REQUIRE(f != NULL, "empty function rejected");
    CHECK(used == 3, "empty function: used %zu", used);
    CHECK(sfs_gof_get(f, (const uint8_t *)"abc", 3) == -1, "empty function: a value");
    CHECK(sfs_gof_get(f, NULL, 0) == -1, "empty function: empty key");
    CHECK(sfs_gof_get(f, NULL, 20) == -1, "NULL key");
    CHECK(sfs_gof_size_bytes(f) > 0, "size of the empty function");
    sfs_gof_free(f);
    CHECK(sfs_gof_read(NULL, 10, &used) == NULL, "NULL buf accepted");
    CHECK(sfs_gof_read(NULL, 0, &used) == NULL, "NULL buf, 0 bytes accepted");
    CHECK(sfs_gof_read(empty, 0, &used) == NULL, "0 bytes accepted");
    CHECK(sfs_gof_get(NULL, empty, 3) == -1, "NULL handle");
    CHECK(sfs_gof_size_bytes(NULL) == 0, "size of NULL");
    sfs_gof_free(NULL);
    /* one level of 4 groups, every bit set: a key's value is its bit's rank,
     * bit = 16 * group + (0..15), so within [16 * group, 16 * group + 16) */
    uint8_t full[3 + 8 + 1 + 8];
    memcpy(full, (const uint8_t[]){16, 1, 4}, 3);
    memset(full + 3, 0xFF, 8);
    full[11] = 4;
    memset(full + 12, 0, 8);
    f = sfs_gof_read(full, sizeof(full), &used);
    REQUIRE(f != NULL, "one full level rejected");
    int64_t v = sfs_gof_get(f, (const uint8_t *)"key", 3);
    CHECK(v >= 0 && v < 64, "full level: value %lld", (long long)v);
    sfs_gof_free(f);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* --bench FILE: every key of the file's first record, in order, best of 5
 * timed passes after one warm-up, as bench_1m does in Rust. */
static int bench(const char *path)
{
    struct file fx;
    if (load(path, &fx) != 0)
        return 1;
    const struct record *r = &fx.records[0];
    sfs_gof_t *f = sfs_gof_read(r->buf, r->buf_len, NULL);
    if (!f) {
        fprintf(stderr, "%s: refused\n", path);
        return 1;
    }
    double best = 1e300;
    int64_t sum = 0;
    for (int pass = 0; pass < 6; pass++) {
        double t = now();
        for (uint32_t i = 0; i < r->total; i++)
            sum += sfs_gof_get(f, r->keys[i], r->key_lens[i]);
        double ns = (now() - t) * 1e9 / r->total;
        if (pass > 0 && ns < best)
            best = ns;
    }
    uint32_t bad = mismatches(r, f, 0);
    printf("bench: %u lookups, %zu-byte function: %.1f ns/lookup (checksum %lld), %u mismatches\n",
           r->total, r->buf_len, best, (long long)sum, bad);
    sfs_gof_free(f);
    unload(&fx);
    return bad != 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--bench") == 0)
        return bench(argv[2]);
    char **paths = NULL;
    int count = 0;
    if (argc > 1) {
        paths = argv + 1;
        count = argc - 1;
    } else {
        DIR *d = opendir(FIXTURE_DIR);
        if (!d) {
            perror(FIXTURE_DIR " (run the crate's tests first)");
            return 1;
        }
        paths = xmalloc(256 * sizeof(*paths));
        for (struct dirent *e; (e = readdir(d)) && count < 256;) {
            size_t n = strlen(e->d_name);
            if (n > 4 && strcmp(e->d_name + n - 4, ".bin") == 0) {
                paths[count] = xmalloc(sizeof(FIXTURE_DIR) + n + 1);
                sprintf(paths[count++], "%s/%s", FIXTURE_DIR, e->d_name);
            }
        }
        closedir(d);
        qsort(paths, (size_t)count, sizeof(*paths), by_name);
    }
    test_null_and_empty();
    struct file *files = xmalloc(((size_t)count + 1) * sizeof(*files));
    unsigned records = 0;
    for (int i = 0; i < count; i++) {
        if (load(paths[i], &files[i]) != 0) {
            failed++;
            continue;
        }
        for (unsigned j = 0; j < files[i].count; j++) {
            const struct record *r = &files[i].records[j];
            test_record(r);
            if (r->kind == 0)
                test_function(r);
        }
        records += files[i].count;
    }
    printf("%d files, %u records\n", count, records);
    const char *rounds = getenv("SFS_FUZZ_ROUNDS");
    fuzz(files, count, rounds && atoi(rounds) > 0 ? (unsigned)atoi(rounds) : 20000);
    for (int i = 0; i < count; i++)
        unload(&files[i]);
    free(files);
    if (argc <= 1) {
        for (int i = 0; i < count; i++)
            free(paths[i]);
        free(paths);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
