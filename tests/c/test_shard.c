/*
 * test_shard.c — C unit tests of the shardfs core (run by `make test`).
 *
 * Builds real shards in a temporary directory and checks: round trips,
 * our CHD_PH evaluator against cmph's own cmph_search (present and absent
 * keys), batch lookups against single ones, duplicates, empty shards,
 * delete, concurrent readers, that truncated or corrupted files are rejected
 * without crashing, that sfs_writer_add_files writes what sfs_writer_add
 * does file after file, and what the file kind of source (kind.h) gives
 * callers (sfs_data, sfs_read_many).
 */
#define _GNU_SOURCE
#include "chd.h"
#include "guard.h"
#include "shard.h"
#include "rbd.h"

#include <cmph.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

/* Object i: deterministic size (0..300 bytes) and content. */
static size_t obj_size(uint64_t i) { return (size_t)((i * 7919) % 301); }
static void obj_fill(uint64_t i, uint8_t *buf, size_t n)
{
    for (size_t j = 0; j < n; j++)
        buf[j] = (uint8_t)(i * 31 + j);
}


static int build(const char *path, uint64_t n, uint8_t (*keys)[32])
{
    sfs_writer_t *w;
    sfs_error_t err;
    if (sfs_writer_open(path, &w, &err) != SFS_OK) {
        fprintf(stderr, "%s\n", err.message);
        return -1;
    }
    uint8_t buf[512];
    for (uint64_t i = 0; i < n; i++) {
        rand_key(keys[i]);
        size_t sz = obj_size(i);
        obj_fill(i, buf, sz);
        if (sfs_writer_add(w, keys[i], buf, sz, &err) != SFS_OK) {
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

/* Our evaluator against cmph_load + cmph_search of the same dump. */
static void compare_with_cmph(sfs_shard_t *s, uint8_t (*keys)[32], uint64_t n)
{
    const sfs_header_t *h = sfs_header(s);
    FILE *f = fopen(sfs_path(s), "rb");
    REQUIRE(f != NULL, "open %s", sfs_path(s));
    fseeko(f, (off_t)h->hash_position, SEEK_SET);
    cmph_t *mph = cmph_load(f);
    fclose(f);
    CHECK(mph != NULL, "cmph_load");
    if (!mph)
        return;
    uint64_t mismatches = 0;
    for (uint64_t i = 0; i < n; i++)
        mismatches += sfs_slot_of(s, keys[i]) != cmph_search(mph, (char *)keys[i], 32);
    for (int i = 0; i < 20000; i++) {
        uint8_t k[32];
        rand_key(k);
        /* include bytes >= 0x80 and < 0x80 in every position */
        if (i & 1)
            k[i % 32] |= 0x80;
        mismatches += sfs_slot_of(s, k) != cmph_search(mph, (char *)k, 32);
    }
    CHECK(mismatches == 0, "%llu slots differ from cmph_search (n=%llu)",
          (unsigned long long)mismatches, (unsigned long long)n);
    cmph_destroy(mph);
}

/* sfs_lookup_batch gives, for keys present and absent in any order and
 * any count (shorter and longer than its pipeline), what sfs_lookup_slot
 * gives for each key alone. */
static void compare_batch(sfs_shard_t *s, uint8_t (*keys)[32], uint64_t n)
{
    uint64_t m = 2 * n + 3; /* each key, then an absent key; 3 more absent */
    uint8_t(*batch)[32] = malloc(m * 32);
    sfs_found_t *found = malloc(m * sizeof(*found));
    for (uint64_t i = 0; i < m; i++) {
        if (i % 2 == 0 && i / 2 < n)
            memcpy(batch[i], keys[i / 2], 32);
        else
            rand_key(batch[i]);
    }
    uint64_t mismatches = 0;
    for (uint64_t len = 0; len <= m; len = len < 40 ? len + 1 : (len == m ? m + 1 : m)) {
        size_t bad = sfs_lookup_batch(s, (const uint8_t *)batch, len, found);
        mismatches += bad != 0;
        for (uint64_t i = 0; i < len; i++) {
            uint32_t slot;
            uint64_t off = 0, size = 0;
            int rc = sfs_lookup_slot(s, batch[i], &slot, &off, &size);
            mismatches += found[i].status != rc || found[i].slot != slot ||
                          (rc == SFS_OK && (found[i].data_offset != off || found[i].size != size));
        }
    }
    CHECK(mismatches == 0, "sfs_lookup_batch: %llu answers differ from sfs_lookup_slot (n=%llu)",
          (unsigned long long)mismatches, (unsigned long long)n);
    free(batch);
    free(found);
}

static void test_round_trip(uint64_t n)
{
    uint8_t(*keys)[32] = malloc((n ? n : 1) * 32);
    char name[64];
    snprintf(name, sizeof(name), "rt-%llu.shard", (unsigned long long)n);
    char *p = strdup(path_of(name));
    CHECK(build(p, n, keys) == 0, "build %llu", (unsigned long long)n);
    sfs_shard_t *s;
    sfs_error_t err;
    int rc = sfs_open(p, 0, &s, &err);
    CHECK(rc == SFS_OK, "open %s: %s", p, err.message);
    if (rc != SFS_OK) {
        free(keys);
        free(p);
        return;
    }
    CHECK(sfs_header(s)->objects_count == n, "objects_count");
    CHECK(sfs_live_count(s) == n, "live count %llu != %llu",
          (unsigned long long)sfs_live_count(s), (unsigned long long)n);
    CHECK(sfs_slot_count(s) >= n + (n > 0), "slots");
    uint64_t bad = 0;
    uint8_t buf[512], want[512];
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off, size;
        if (sfs_lookup(s, keys[i], &off, &size) != SFS_OK || size != obj_size(i)) {
            bad++;
            continue;
        }
        obj_fill(i, want, size);
        sfs_read(s, off, buf, size);
        bad += memcmp(buf, want, size) != 0;
    }
    CHECK(bad == 0, "%llu objects did not read back", (unsigned long long)bad);
    uint64_t found = 0;
    for (int i = 0; i < 10000; i++) {
        uint8_t k[32];
        uint64_t off, size;
        rand_key(k);
        found += sfs_lookup(s, k, &off, &size) != SFS_ENOTFOUND;
    }
    CHECK(found == 0, "absent keys found");
    uint8_t zero[32] = {0};
    uint64_t off, size;
    CHECK(sfs_lookup(s, zero, &off, &size) == SFS_ENOTFOUND, "zero key is not found");
    CHECK(sfs_check(s, NULL, NULL, 0) == 0, "check clean");
    compare_with_cmph(s, keys, n);
    compare_batch(s, keys, n);
    sfs_close(s);
    free(keys);
    free(p);
}

/* A new shard of n objects built at path_of(name) and opened (read-write
 * if `writable`): its keys and path in *keys and *path, for the caller to
 * free. NULL after a failed CHECK. */
static sfs_shard_t *build_and_open(const char *name, uint64_t n, int writable, uint8_t (**keys)[32],
                                   char **path)
{
    *keys = malloc(n * 32);
    *path = strdup(path_of(name));
    sfs_shard_t *s = NULL;
    sfs_error_t err;
    CHECK(build(*path, n, *keys) == 0, "build %s", name);
    REQUIRE_OR(NULL, sfs_open(*path, writable, &s, &err) == SFS_OK, "open %s: %s", name, err.message);
    return s;
}

/* How many of the pages of the file at `path` are in the page cache
 * (mincore over a fresh mapping), out of `*pages`. Returns 0 or -1. */
static int cached_pages(const char *path, size_t *cached, size_t *pages)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size == 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return -1;
    *pages = (len + page - 1) / page;
    unsigned char *vec = malloc(*pages);
    int rc = vec && mincore(map, len, vec) == 0 ? 0 : -1;
    *cached = 0;
    for (size_t i = 0; rc == 0 && i < *pages; i++)
        *cached += vec[i] & 1;
    free(vec);
    munmap(map, len);
    return rc;
}

/* The page-cache-only path agrees with the blocking one when data is
 * cached, and answers SFS_EAGAIN instead of waiting once it is evicted. */
static void test_nowait(void)
{
    uint64_t n = 2000;
    uint8_t(*keys)[32];
    char *p;
    sfs_shard_t *s = build_and_open("nowait.shard", n, 0, &keys, &p);
    if (!s)
        return;
    sfs_error_t err;
    uint64_t same = 0, eagain = 0;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t off1, size1, off2 = 0, size2 = 0;
        uint32_t slot;
        sfs_lookup(s, keys[i], &off1, &size1);
        int rc = sfs_lookup_nowait(s, keys[i], &slot, &off2, &size2);
        same += rc == SFS_OK && off1 == off2 && size1 == size2 && slot == sfs_slot_of(s, keys[i]);
        uint8_t buf[512];
        same += sfs_read_nowait(s, off1, buf, size1) == SFS_OK;
    }
    CHECK(same == 2 * n, "nowait agrees with lookup on cached data (%llu of %llu)",
          (unsigned long long)same, (unsigned long long)(2 * n));
    uint8_t absent[32];
    rand_key(absent);
    uint64_t off, size;
    uint32_t slot;
    CHECK(sfs_lookup_nowait(s, absent, &slot, &off, &size) == SFS_ENOTFOUND, "absent");
    sfs_close(s);
    /* Reopen, then evict what is not mapped: the open reads the header and
     * the perfect hash (and the kernel may read ahead of them, into the
     * index); the index slots and the objects are not mapped until a
     * lookup touches them, so they go, and must not be read. */
    REQUIRE(sfs_open(p, 0, &s, &err) == SFS_OK, "reopen");
    int fd = open(p, O_RDONLY);
    REQUIRE(fd >= 0, "open %s", p);
    size_t cached = 0, pages = 0;
    /* DONTNEED misses pages still in another CPU's LRU batch (seen under
     * valgrind in CI): evict again until a lookup says it would wait. */
    for (int attempt = 0; attempt < 50 && eagain == 0; attempt++) {
        fdatasync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        REQUIRE(cached_pages(p, &cached, &pages) == 0, "mincore %s", p);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t o, z;
            uint32_t sl;
            eagain += sfs_lookup_nowait(s, keys[i], &sl, &o, &z) == SFS_EAGAIN;
        }
        if (eagain == 0)
            usleep(20000);
    }
    close(fd);
    /* A tmpfs evicts nothing (make_test_dir avoids one when it can); under
     * valgrind a few pages may stay. */
    if (cached < pages)
        CHECK(eagain > 0, "evicted data gives SFS_EAGAIN (%llu of %llu; %zu of %zu pages cached)",
              (unsigned long long)eagain, (unsigned long long)n, cached, pages);
    else
        printf("test_nowait: all %zu pages of %s still cached after POSIX_FADV_DONTNEED "
               "(a tmpfs?): cold lookups not checked\n", pages, p);
    sfs_close(s);
    free(keys);
    free(p);
}

/* The SIGBUS guard (guard.h, what the Python extension wraps every mapped
 * read in): a shard truncated while mapped makes lookups and reads past the
 * new end answer SFS_EGONE instead of killing the process, under ASan and
 * valgrind too (make test-asan, test-valgrind). */
static void test_sigbus_guard(void)
{
    uint64_t n = 3000;
    uint8_t(*keys)[32];
    char *p;
    sfs_shard_t *s = build_and_open("guard.shard", n, 0, &keys, &p);
    if (!s)
        return;
    REQUIRE(sfs_guard_install() == 0, "install the SIGBUS handler");
    uint64_t off = 0, size = 0;
    volatile int rc = -1;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup(s, keys[n - 1], &off, &size));
    CHECK(rc == SFS_OK, "lookup before the truncation: %d", rc);
    uint64_t last = off;
    CHECK(truncate(p, 4096) == 0, "truncate");
    volatile int gone = 0;
    for (volatile uint64_t i = 0; i < n; i += 97) {
        rc = -1;
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup(s, keys[i], &off, &size));
        gone += rc == SFS_EGONE;
    }
    CHECK(gone == (int)((n + 96) / 97), "lookups after the truncation: %d of %d SFS_EGONE", gone,
          (int)((n + 96) / 97));
    uint8_t buf[64];
    rc = -1;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_read(s, last, buf, 1));
    CHECK(rc == SFS_EGONE, "read past the new end: %d", rc);
    sfs_close(s);
    free(keys);
    free(p);
}

static void test_duplicate(void)
{
    sfs_writer_t *w;
    sfs_error_t err;
    char *p = strdup(path_of("dup.shard"));
    REQUIRE(sfs_writer_open(p, &w, &err) == SFS_OK, "open");
    uint8_t k[32] = {1}, k2[32] = {2};
    CHECK(sfs_writer_add(w, k, "a", 1, &err) == SFS_OK, "add");
    CHECK(sfs_writer_add(w, k, "bb", 2, &err) == SFS_EDUPLICATE, "duplicate rejected");
    CHECK(strstr(err.message, "duplicate key 01") != NULL, "message names the key: %s",
          err.message);
    CHECK(sfs_writer_add(w, k2, "ccc", 3, &err) == SFS_OK, "build goes on");
    CHECK(access(p, F_OK) != 0, "nothing at the target before finish");
    CHECK(sfs_writer_finish(w, NULL, &err) == SFS_OK, "finish: %s", err.message);
    sfs_shard_t *s;
    REQUIRE(sfs_open(p, 0, &s, &err) == SFS_OK, "open");
    uint64_t off, size;
    char buf[4] = {0};
    CHECK(sfs_lookup(s, k, &off, &size) == SFS_OK && size == 1, "first kept");
    sfs_read(s, off, buf, size);
    CHECK(buf[0] == 'a', "first object's bytes");
    CHECK(sfs_lookup(s, k2, &off, &size) == SFS_OK && size == 3, "second");
    CHECK(sfs_live_count(s) == 2, "two objects");
    sfs_close(s);
    free(p);
}

static void test_abort_leaves_nothing(void)
{
    sfs_writer_t *w;
    sfs_error_t err;
    char *p = strdup(path_of("aborted.shard"));
    REQUIRE(sfs_writer_open(p, &w, &err) == SFS_OK, "open");
    uint8_t k[32] = {7};
    sfs_writer_add(w, k, "x", 1, &err);
    sfs_writer_abort(w);
    CHECK(access(p, F_OK) != 0, "no shard after abort");
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls -A %s | grep -q tmp", dir);
    CHECK(system(cmd) != 0, "no temporary file left");
    free(p);
}

/* The writer's errors as shard.h lists them: status, errno, a message
 * naming the cause, and the state left. */
static void test_writer_errors(void)
{
    sfs_writer_t *w = (sfs_writer_t *)1;
    sfs_error_t err;
    char missing[600];
    snprintf(missing, sizeof(missing), "%s/no-such-dir/x.shard", dir);
    CHECK(sfs_writer_open(missing, &w, &err) == SFS_EIO && err.sys_errno == ENOENT && !w &&
              strstr(err.message, "no-such-dir"),
          "open in a missing directory: %s", err.message);

    char *p = strdup(path_of("errors.shard")), *src = strdup(path_of("errors.src"));
    REQUIRE(sfs_writer_open(p, &w, &err) == SFS_OK, "open: %s", err.message);
    FILE *f = fopen(src, "w");
    fputs("abc", f);
    fclose(f);
    int fd = open(src, O_RDONLY);
    uint8_t k[32] = {3}, k2[32] = {4};
    CHECK(sfs_writer_add_fd(w, k, fd, 10, &err) == SFS_EIO && err.sys_errno == EIO &&
              strstr(err.message, "shorter than its size"),
          "add_fd of a file shorter than the size: %s", err.message);
    close(fd);
    CHECK(sfs_writer_add_fd(w, k, fd, 3, &err) == SFS_EIO && err.sys_errno == EBADF &&
              strstr(err.message, strerror(EBADF)),
          "add_fd of a closed descriptor: %s", err.message);
    CHECK(sfs_writer_count(w) == 0 && !sfs_writer_contains(w, k), "failed objects rolled back");
    CHECK(sfs_writer_add(w, k2, "xy", 2, &err) == SFS_OK, "usable after the errors: %s",
          err.message);
    CHECK(sfs_writer_finish(w, NULL, &err) == SFS_OK, "finish: %s", err.message);
    sfs_shard_t *s;
    uint64_t off, size;
    REQUIRE(sfs_open(p, 0, &s, &err) == SFS_OK, "open: %s", err.message);
    if (s) {
        CHECK(sfs_live_count(s) == 1 && sfs_lookup(s, k2, &off, &size) == SFS_OK && size == 2 &&
                  sfs_lookup(s, k, &off, &size) == SFS_ENOTFOUND,
              "only the object added after the errors");
        sfs_close(s);
    }

    /* finish cannot publish over a directory: the writer is freed, the
     * temporary file removed, the directory untouched. */
    char *d = strdup(path_of("errors.dir"));
    CHECK(mkdir(d, 0700) == 0, "mkdir");
    REQUIRE(sfs_writer_open(d, &w, &err) == SFS_OK, "open over a directory: %s", err.message);
    CHECK(sfs_writer_add(w, k, "x", 1, &err) == SFS_OK, "add");
    CHECK(sfs_writer_finish(w, NULL, &err) == SFS_EIO && err.sys_errno == EISDIR &&
              strstr(err.message, "publishing"),
          "finish over a directory: %s", err.message);
    struct stat st;
    CHECK(stat(d, &st) == 0 && S_ISDIR(st.st_mode), "the directory is still there");
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "ls -A %s | grep -q tmp", dir);
    CHECK(system(cmd) != 0, "no temporary file left");
    rmdir(d);
    unlink(src);
    free(d);
    free(src);
    free(p);
}

static void test_delete(void)
{
    uint64_t n = 50;
    uint8_t(*keys)[32];
    char *p;
    sfs_shard_t *s = build_and_open("del.shard", n, 1, &keys, &p);
    if (!s)
        return;
    sfs_error_t err;
    uint64_t off, size;
    sfs_lookup(s, keys[3], &off, &size);
    CHECK(sfs_delete(s, keys[3], &err) == SFS_OK, "delete: %s", err.message);
    CHECK(sfs_delete(s, keys[3], &err) == SFS_ENOTFOUND, "second delete is not found");
    CHECK(sfs_lookup(s, keys[3], &off, &size) == SFS_ENOTFOUND, "gone");
    CHECK(sfs_live_count(s) == n - 1, "live count drops");
    CHECK(sfs_check(s, NULL, NULL, 0) == 0, "still clean");
    const uint8_t *bytes = sfs_data(s, off - 8, size + 8);
    int all_zero = 1;
    for (uint64_t i = 0; i < size + 8; i++)
        all_zero &= bytes[i] == 0;
    CHECK(all_zero, "object bytes zeroed");
    CHECK(sfs_lookup(s, keys[4], &off, &size) == SFS_OK, "others remain");
    sfs_found_t found[50];
    CHECK(sfs_lookup_batch(s, (const uint8_t *)keys, n, found) == 0, "batch after a delete");
    CHECK(found[3].status == SFS_ENOTFOUND && found[4].status == SFS_OK, "batch: deleted is gone");
    /* A hint that reads nothing: any slot, in the index or not. */
    uint64_t hinted[] = {0, sfs_slot_of(s, keys[3]), sfs_slot_count(s) - 1, sfs_slot_count(s),
                         UINT64_MAX};
    for (size_t i = 0; i < sizeof(hinted) / sizeof(hinted[0]); i++)
        sfs_prefetch_slot_entry(s, hinted[i]);
    CHECK(sfs_slot_get(s, sfs_slot_of(s, keys[3]), NULL) == SFS_EMPTY_OFFSET, "prefetched: still empty");
    sfs_close(s);
    free(keys);
    free(p);
}

struct reader_arg {
    sfs_shard_t *s;
    uint8_t (*keys)[32];
    uint64_t n, bad;
};

static void *reader(void *a)
{
    struct reader_arg *r = a;
    uint8_t buf[512], want[512];
    for (int round = 0; round < 20; round++)
        for (uint64_t i = 0; i < r->n; i++) {
            uint64_t off, size;
            if (sfs_lookup(r->s, r->keys[i], &off, &size) != SFS_OK) {
                r->bad++;
                continue;
            }
            sfs_read(r->s, off, buf, size);
            obj_fill(i, want, size);
            r->bad += memcmp(buf, want, size) != 0;
        }
    return NULL;
}

static void test_threads(void)
{
    uint64_t n = 5000;
    uint8_t(*keys)[32];
    char *p;
    sfs_shard_t *s = build_and_open("threads.shard", n, 0, &keys, &p);
    if (!s)
        return;
    pthread_t t[8];
    struct reader_arg args[8];
    for (int i = 0; i < 8; i++) {
        args[i] = (struct reader_arg){s, keys, n, 0};
        pthread_create(&t[i], NULL, reader, &args[i]);
    }
    uint64_t bad = 0;
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        bad += args[i].bad;
    }
    CHECK(bad == 0, "%llu bad reads across 8 threads", (unsigned long long)bad);
    sfs_close(s);
    free(keys);
    free(p);
}

static int copy_prefix(const char *src, const char *dst, off_t len)
{
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "head -c %lld %s > %s", (long long)len, src, dst);
    return system(cmd);
}

/* Every truncation and every corrupted header field is an error, not a crash. */
static void test_bad_files(void)
{
    uint64_t n = 300;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *p = strdup(path_of("good.shard"));
    CHECK(build(p, n, keys) == 0, "build");
    struct stat st;
    stat(p, &st);
    sfs_shard_t *s;
    sfs_error_t err;
    sfs_open(p, 0, &s, &err);
    sfs_header_t h = *sfs_header(s);
    sfs_close(s);
    char *bad = strdup(path_of("bad.shard"));
    off_t cuts[] = {0, 1, 31, 32, 87, 88, 511, 512, (off_t)h.index_position - 1,
                    (off_t)h.index_position, (off_t)(h.index_position + 40),
                    (off_t)h.hash_position, (off_t)h.hash_position + 10,
                    (off_t)h.hash_position + 40, st.st_size - 1};
    for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
        copy_prefix(p, bad, cuts[i]);
        int rc = sfs_open(bad, 0, &s, &err);
        CHECK(rc == SFS_ECORRUPT, "truncated at %lld: rc %d", (long long)cuts[i], rc);
        if (rc == SFS_OK)
            sfs_close(s);
    }
    uint64_t values[] = {0, 1, 87, 89, 511, 513, UINT64_MAX, UINT64_MAX - 7, 1ull << 62,
                         (uint64_t)st.st_size, (uint64_t)st.st_size + 1};
    for (int field = 0; field < 7; field++) {
        uint64_t orig[7] = {h.version, h.objects_count, h.objects_position, h.objects_size,
                            h.index_position, h.index_size, h.hash_position};
        for (size_t v = 0; v < sizeof(values) / sizeof(values[0]); v++) {
            if (values[v] == orig[field])
                continue;
            /* objects_count may legitimately be any value up to the slot count */
            if (field == 1 && values[v] <= n)
                continue;
            /* objects_position moved back into the zero padding before the
             * first object is a consistent header: nothing to detect */
            if (field == 2 && values[v] >= 88 && values[v] < orig[2])
                continue;
            copy_prefix(p, bad, st.st_size);
            int fd = open(bad, O_WRONLY);
            uint64_t be = __builtin_bswap64(values[v]);
            pwrite(fd, &be, 8, 32 + 8 * field);
            close(fd);
            int rc = sfs_open(bad, 0, &s, &err);
            CHECK(rc == SFS_ECORRUPT, "field %d = %llu: rc %d", field,
                  (unsigned long long)values[v], rc);
            if (rc == SFS_OK)
                sfs_close(s);
        }
    }
    /* Random bytes over the hash section, many times: never a crash; a
     * shard that still opens must keep every lookup inside the objects
     * section. */
    uint64_t escaped = 0;
    for (int round = 0; round < 300; round++) {
        copy_prefix(p, bad, st.st_size);
        int fd = open(bad, O_WRONLY);
        for (int j = 0; j < 1 + round % 8; j++) {
            uint8_t b = (uint8_t)next_rand();
            off_t at = (off_t)h.hash_position + (off_t)(next_rand() % (st.st_size - h.hash_position));
            pwrite(fd, &b, 1, at);
        }
        close(fd);
        if (sfs_open(bad, 0, &s, &err) == SFS_OK) {
            for (uint64_t i = 0; i < n; i++) {
                uint64_t off, size;
                if (sfs_lookup(s, keys[i], &off, &size) == SFS_OK && !sfs_data(s, off, size))
                    escaped++;
            }
            sfs_check(s, NULL, NULL, 0);
            sfs_close(s);
        }
    }
    CHECK(escaped == 0, "%llu lookups on mutated hash sections left the objects section",
          (unsigned long long)escaped);
    /* A slot pointing outside the objects section is caught on lookup. */
    copy_prefix(p, bad, st.st_size);
    REQUIRE(sfs_open(bad, 0, &s, &err) == SFS_OK, "open");
    uint32_t slot = sfs_slot_of(s, keys[0]);
    sfs_close(s);
    int fd = open(bad, O_WRONLY);
    uint64_t be = __builtin_bswap64(h.index_position + 8);
    pwrite(fd, &be, 8, (off_t)(h.index_position + slot * 40ull + 32));
    close(fd);
    REQUIRE(sfs_open(bad, 0, &s, &err) == SFS_OK, "open with a bad slot");
    uint64_t off, size;
    CHECK(sfs_lookup(s, keys[0], &off, &size) == SFS_ECORRUPT, "bad slot offset is corrupt");
    CHECK(sfs_check(s, NULL, NULL, 0) == 1, "check reports the slot");
    sfs_close(s);
    free(keys);
    free(p);
    free(bad);
}

/* Damaged displacement codes (the length remainders of the CHD_PH dump): a
 * bucket's code that ends before the previous one's, or more than 31 bits
 * after it, or past the store, is rejected at open. Before that check such
 * a shard opened and some keys hashed to no slot (sfs_slot_of returned
 * SFS_CHD_FAIL, against shard.h; found by tests/fuzz/fuzz_shard.c, input
 * tests/fuzz/regressions/shard/chd-code-ends-before-previous). A shard that
 * still opens maps every key to a slot. */
static void test_bad_displacement(void)
{
    uint64_t n = 300;
    uint8_t(*keys)[32] = malloc(n * 32);
    char *p = strdup(path_of("disp.shard"));
    CHECK(build(p, n, keys) == 0, "build");
    struct stat st;
    stat(p, &st);
    uint8_t *buf = malloc((size_t)st.st_size);
    FILE *f = fopen(p, "rb");
    REQUIRE(f && fread(buf, 1, (size_t)st.st_size, f) == (size_t)st.st_size, "read %s", p);
    fclose(f);
    sfs_shard_t *s;
    sfs_error_t err;
    REQUIRE(sfs_open(p, 0, &s, &err) == SFS_OK, "open");
    sfs_header_t h = *sfs_header(s);
    sfs_close(s);
    sfs_chd_t c;
    char why[256];
    CHECK(sfs_chd_parse(&c, buf + h.hash_position, (uint64_t)st.st_size - h.hash_position, why,
                        sizeof(why)) == 0,
          "parse: %s", why);
    uint64_t lr = (uint64_t)(c.length_rems - buf), words = c.length_rems_words;
    CHECK(c.rem_r > 0 && words > 0, "the dump has length remainders");
    char *bad = strdup(path_of("disp-bad.shard"));
    uint64_t rejected = 0, opened = 0, unmapped = 0;
    uint8_t *copy = malloc((size_t)st.st_size);
    for (int round = 0; round < 200 && words; round++) {
        memcpy(copy, buf, (size_t)st.st_size);
        for (int j = 0; j < 1 + round % 4; j++) {
            uint32_t v = (uint32_t)next_rand();
            memcpy(copy + lr + 4 * (next_rand() % words), &v, 4);
        }
        f = fopen(bad, "wb");
        REQUIRE(f != NULL, "open %s", bad);
        fwrite(copy, 1, (size_t)st.st_size, f);
        fclose(f);
        int rc = sfs_open(bad, 0, &s, &err);
        if (rc == SFS_ECORRUPT && strstr(err.message, "displacement code"))
            rejected++;
        if (rc != SFS_OK)
            continue;
        opened++;
        for (uint64_t i = 0; i < n; i++)
            unmapped += sfs_slot_of(s, keys[i]) >= sfs_slot_count(s);
        for (int i = 0; i < 2000; i++) {
            uint8_t k[32];
            rand_key(k);
            unmapped += sfs_slot_of(s, k) >= sfs_slot_count(s);
        }
        sfs_close(s);
    }
    CHECK(unmapped == 0, "%llu keys hash to no slot in shards that opened (%llu of 200)",
          (unsigned long long)unmapped, (unsigned long long)opened);
    CHECK(rejected > 0, "damaged remainders rejected at open (%llu of 200)",
          (unsigned long long)rejected);
    free(copy);
    free(buf);
    free(keys);
    free(p);
    free(bad);
}

/* Bytes [objects_position, + objects_size) of a shard file (malloc'ed). */
static uint8_t *objects_section(const char *path, uint64_t *len)
{
    sfs_shard_t *s;
    sfs_error_t err;
    if (sfs_open(path, 0, &s, &err) != SFS_OK) {
        fprintf(stderr, "%s\n", err.message);
        return NULL;
    }
    const sfs_header_t *h = sfs_header(s);
    *len = h->objects_size;
    uint8_t *buf = malloc(*len ? *len : 1);
    int fd = open(path, O_RDONLY);
    ssize_t got = pread(fd, buf, *len, (off_t)h->objects_position);
    close(fd);
    sfs_close(s);
    if (got != (ssize_t)*len) {
        free(buf);
        return NULL;
    }
    return buf;
}

static void write_file(const char *path, const uint8_t *data, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, data, n) != (ssize_t)n)
        perror(path);
    close(fd);
}

/* sfs_writer_add_files: files read and hashed by threads, appended in the
 * order given, make the objects section a writer fed file after file makes
 * (SHA-256 keys, duplicates once); more files than the window, several
 * calls, a large file streamed, stops before a directory and a FIFO, and a
 * missing file fails naming it with the objects before it kept. */
static void test_add_files(void)
{
    enum { N = 3000, SMALL = 1000 };
    char *paths[N + 3];
    uint8_t buf[4096];
    mkdir(path_of("af"), 0755);
    for (int i = 0; i < N; i++) {
        char name[64];
        snprintf(name, sizeof(name), "af/f%05d", i);
        paths[i] = strdup(path_of(name));
        uint64_t id = i % 7 == 3 ? (uint64_t)(i / 2) : (uint64_t)i; /* some duplicates */
        size_t n = i == 1234 ? sizeof(buf) : obj_size(id);         /* one larger than SMALL */
        obj_fill(id, buf, n);
        write_file(paths[i], buf, n);
    }
    mkdir(path_of("af/sub"), 0755);
    mkfifo(path_of("af/fifo"), 0644);
    paths[N] = strdup(path_of("af/sub"));
    paths[N + 1] = strdup(path_of("af/fifo"));
    paths[N + 2] = strdup(path_of("af/f00001"));

    /* the reference: file after file, through sfs_writer_add */
    char ref[512], got[512];
    snprintf(ref, sizeof(ref), "%s", path_of("af-ref.shard"));
    snprintf(got, sizeof(got), "%s", path_of("af-got.shard"));
    sfs_writer_t *w;
    sfs_error_t err;
    REQUIRE(sfs_writer_open(ref, &w, &err) == SFS_OK, "open");
    size_t ref_dups = 0;
    for (int i = 0; i < N; i++) {
        int fd = open(paths[i], O_RDONLY);
        ssize_t n = read(fd, buf, sizeof(buf));
        close(fd);
        uint8_t key[32];
        unsigned int klen;
        EVP_Digest(buf, (size_t)n, key, &klen, EVP_sha256(), NULL);
        if (sfs_writer_contains(w, key))
            ref_dups++;
        else
            CHECK(sfs_writer_add(w, key, buf, (uint64_t)n, &err) == SFS_OK, "add");
    }
    CHECK(sfs_writer_finish(w, NULL, &err) == SFS_OK, "finish");

    REQUIRE(sfs_writer_open(got, &w, &err) == SFS_OK, "open");
    sfs_add_files_result_t res;
    size_t dups = 0, at = 0;
    unsigned threads[] = {3, 1, 2};
    for (int call = 0; at < N; call++) { /* 1000, 1000, 1000 paths */
        size_t n = N / 3;
        CHECK(sfs_writer_add_files(w, (const char *const *)paths + at, n, SMALL, threads[call], 0,
                                   0, 0, &res, &err) == SFS_OK, "add_files: %s", err.message);
        CHECK(res.done == n && res.stopped == SFS_FILE_REGULAR, "all done: %zu", res.done);
        for (size_t k = 1; k < res.n_dups; k++)
            CHECK(res.dup_index[k] > res.dup_index[k - 1], "duplicates in order");
        dups += res.n_dups;
        free(res.dup_index);
        free(res.dup_keys);
        at += n;
    }
    CHECK(dups == ref_dups, "%zu duplicates, expected %zu", dups, ref_dups);
    /* a directory, then a FIFO (not opened for good: no hang), then a duplicate */
    CHECK(sfs_writer_add_files(w, (const char *const *)paths + N, 3, SMALL, 2, 0, 0, 0, &res,
                               &err) == SFS_OK && res.done == 0 && res.stopped == SFS_FILE_DIRECTORY,
          "stops before the directory");
    CHECK(sfs_writer_add_files(w, (const char *const *)paths + N + 1, 2, SMALL, 2, 0, 0, 0, &res,
                               &err) == SFS_OK && res.done == 0 && res.stopped == SFS_FILE_OTHER,
          "stops before the FIFO");
    CHECK(sfs_writer_add_files(w, (const char *const *)paths + N + 2, 1, SMALL, 2, 0, 0, 0, &res,
                               &err) == SFS_OK && res.done == 1 && res.n_dups == 1 &&
              res.dup_index[0] == 0, "a duplicate listed");
    free(res.dup_index);
    free(res.dup_keys);
    /* a missing file: an error naming it, done = its index, the writer usable */
    const char *missing[] = {paths[0], path_of("af/missing"), paths[1]};
    uint64_t count = sfs_writer_count(w);
    CHECK(sfs_writer_add_files(w, missing, 3, SMALL, 2, 0, 0, 0, &res, &err) == SFS_EIO &&
              res.done == 1 && err.sys_errno == ENOENT && strstr(err.message, "af/missing"),
          "missing file: %s", err.message);
    CHECK(sfs_writer_count(w) == count, "nothing added by the failed call");
    CHECK(sfs_writer_finish(w, NULL, &err) == SFS_OK, "finish: %s", err.message);

    uint64_t len_ref = 0, len_got = 0;
    uint8_t *a = objects_section(ref, &len_ref), *b = objects_section(got, &len_got);
    CHECK(a && b && len_ref == len_got && memcmp(a, b, len_ref) == 0,
          "objects section as file after file (%llu vs %llu bytes)", (unsigned long long)len_got,
          (unsigned long long)len_ref);
    free(a);
    free(b);
    for (int i = 0; i < N + 3; i++)
        free(paths[i]);
}

/* The file kind (kind.h) as callers see it: its name and capabilities,
 * its objects mapped (sfs_data), and sfs_read_many, through the kind's
 * batch read, giving for each range what sfs_read gives: small and large
 * objects (copied from the mapping, read with pread), an empty range, and
 * ranges outside the objects section (SFS_EINVAL, the others still read). */
static void test_kind_file(void)
{
    enum { N = 120, LARGE = 40000 };
    char *p = strdup(path_of("kind-file.shard"));
    uint8_t(*keys)[32] = malloc(N * 32);
    uint8_t *data = malloc(LARGE);
    sfs_writer_t *w;
    sfs_error_t err;
    REQUIRE(sfs_writer_open(p, &w, &err) == SFS_OK, "writer: %s", err.message);
    for (uint64_t i = 0; i < N; i++) {
        size_t n = i % 10 == 3 ? LARGE : obj_size(i);
        rand_key(keys[i]);
        obj_fill(i, data, n);
        REQUIRE(sfs_writer_add(w, keys[i], data, n, &err) == SFS_OK, "add: %s", err.message);
    }
    REQUIRE(sfs_writer_finish(w, NULL, &err) == SFS_OK, "finish: %s", err.message);
    sfs_shard_t *s;
    REQUIRE(sfs_open(p, 0, &s, &err) == SFS_OK, "open: %s", err.message);
    CHECK(!strcmp(sfs_kind_name(s), "file") && sfs_kind_flags(s) == 0, "kind %s, flags %u",
          sfs_kind_name(s), sfs_kind_flags(s));
    CHECK(sfs_source_error(s) == NULL, "a file has no source error");
    enum { M = N + 3 };
    uint64_t offs[M];
    size_t lens[M];
    void *dsts[M];
    int results[M];
    uint64_t bad = 0;
    for (uint64_t i = 0; i < N; i++) {
        uint64_t size;
        bad += sfs_lookup(s, keys[i], &offs[i], &size) != SFS_OK;
        lens[i] = (size_t)size;
        dsts[i] = malloc(size ? size : 1);
        const uint8_t *mapped = sfs_data(s, offs[i], size);
        obj_fill(i, data, size);
        bad += !mapped || memcmp(mapped, data, size) != 0;
    }
    CHECK(bad == 0, "%llu objects not found or not mapped as written", (unsigned long long)bad);
    const sfs_header_t *h = sfs_header(s);
    offs[N] = h->objects_position + h->objects_size; /* empty, at the end: inside */
    lens[N] = 0;
    offs[N + 1] = h->objects_position + h->objects_size - 4; /* runs past the end */
    lens[N + 1] = 8;
    offs[N + 2] = 0; /* the header */
    lens[N + 2] = 8;
    uint8_t scratch[3][8];
    for (int j = 0; j < 3; j++)
        dsts[N + j] = scratch[j];
    CHECK(sfs_read_many(s, M, offs, lens, dsts, results) == SFS_OK, "sfs_read_many");
    for (uint64_t i = 0; i < N; i++) {
        obj_fill(i, data, lens[i]);
        bad += results[i] != SFS_OK || memcmp(dsts[i], data, lens[i]) != 0;
        free(dsts[i]);
    }
    CHECK(bad == 0, "%llu ranges of sfs_read_many did not read back", (unsigned long long)bad);
    CHECK(results[N] == SFS_OK && results[N + 1] == SFS_EINVAL && results[N + 2] == SFS_EINVAL,
          "edge ranges: %d %d %d", results[N], results[N + 1], results[N + 2]);
    CHECK(sfs_data(s, offs[N + 1], lens[N + 1]) == NULL && sfs_read(s, 0, scratch[0], 8) == SFS_EINVAL,
          "outside the objects section");
    sfs_close(s);
    free(keys);
    free(data);
    free(p);
}

/* rbd: sources in a build without librbd (this test's: no SFS_HAVE_RBD):
 * malformed sources are refused first, then any well-formed one fails with
 * one line naming the package to install; nothing is opened. */
static void test_rbd_sources_without_librbd(void)
{
    char pool[SFS_RBD_NAME_MAX], image[SFS_RBD_NAME_MAX];
    sfs_error_t err;
    CHECK(sfs_rbd_parse("rbd:shards/a-b", pool, image, &err) == SFS_OK && !strcmp(pool, "shards") &&
              !strcmp(image, "a-b"), "parse rbd:shards/a-b");
    const char *bad[] = {"rbd:", "rbd:pool", "rbd:/image", "rbd:pool/", "rbd:pool/a/b", "rbd:pool/a@snap",
                         "file.shard"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        sfs_shard_t *s = (sfs_shard_t *)1;
        int rc = sfs_open(bad[i], 0, &s, &err);
        if (!sfs_is_rbd_source(bad[i]))
            rc = sfs_rbd_parse(bad[i], pool, image, &err);
        CHECK(rc == SFS_EINVAL && strstr(err.message, "rbd:POOL/IMAGE"), "%s: %d %s", bad[i], rc, err.message);
    }
    CHECK(sfs_rbd_built() == 0, "this test is built without librbd");
    sfs_shard_t *s = (sfs_shard_t *)1;
    int rc = sfs_open("rbd:shards/image", 0, &s, &err);
    CHECK(rc == SFS_EINVAL && s == NULL && strstr(err.message, "rbd:shards/image") &&
              strstr(err.message, "librbd-dev") && !strchr(err.message, '\n'),
          "%d %s", rc, err.message);
    rc = sfs_open("rbd:shards/image", 1, &s, &err);
    CHECK(rc == SFS_EINVAL && strstr(err.message, "read-only"), "writable: %d %s", rc, err.message);
    char *names = NULL;
    size_t size = 1;
    CHECK(sfs_rbd_list("shards", &names, &size, &err) == SFS_EINVAL && !names && !size &&
              strstr(err.message, "librbd-dev"), "list: %s", err.message);
}

int main(void)
{
    if (make_test_dir("shardfs-ctest") != 0)
        return 1;
    uint64_t sizes[] = {0, 1, 2, 3, 127, 128, 129, 1000, 100000};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
        test_round_trip(sizes[i]);
    test_nowait();
    test_sigbus_guard();
    test_duplicate();
    test_abort_leaves_nothing();
    test_writer_errors();
    test_delete();
    test_threads();
    test_bad_files();
    test_bad_displacement();
    test_add_files();
    test_kind_file();
    test_rbd_sources_without_librbd();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
