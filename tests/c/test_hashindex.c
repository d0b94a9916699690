/*
 * test_hashindex.c — C unit tests of hash indexes (hashindex.h; run by
 * `make test-c`, and under ASan and valgrind).
 *
 * A shard of objects of many sizes (empty, 1 byte, around the 1 MiB
 * chunk, a deleted one) is indexed by sfs_hashindex_build; every object is
 * found by its sha1 and sha1_git as computed here independently (OpenSSL's
 * one-shot SHA1 of the bytes, and of "blob <n>\0" + bytes), with its slot,
 * offset and size; absent digests, the other hash's digest and the deleted
 * object are not found. An index written from wrong pairs
 * (sfs_hashindex_write: digests moved to other slots) never finds a wrong
 * object. Random bytes written over an index's directory and entries never
 * make a lookup read outside the file (the sanitizers watch) nor find a
 * wrong object; truncated files, damaged headers and another shard's index
 * are refused at open. The 40-bit prefixes are the digests' own, sorted
 * and distinct. Lookups from several threads at once. A shard that shrinks
 * while an object larger than the 1 MiB hashing chunk is being hashed
 * (SIGBUS past the new end, caught by guard.h's SFS_GUARDED) answers
 * SFS_EGONE and leaves no memory behind (the leak check of make test-asan
 * and make test-valgrind).
 */
#define _GNU_SOURCE
#include "guard.h"
#include "hashindex.h"
#include "shard.h"

#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <malloc.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "check.h"

#define N 300

static uint8_t keys[N][32], sha1s[N][20], gits[N][20];
static size_t sizes[N];
static uint8_t identity[32];
static int deleted = 7; /* this object is deleted after the build */

static void digest(const uint8_t *data, size_t n, int git, uint8_t out[20])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha1(), NULL);
    if (git) {
        char head[32];
        int len = snprintf(head, sizeof(head), "blob %zu", n);
        EVP_DigestUpdate(ctx, head, (size_t)len + 1);
    }
    EVP_DigestUpdate(ctx, data, n);
    EVP_DigestFinal_ex(ctx, out, NULL);
    EVP_MD_CTX_free(ctx);
}

static size_t size_of(int i)
{
    static const size_t special[] = {0, 1, 4095, 4096, (1u << 20) - 1, 1u << 20, (1u << 20) + 1, 3u << 20};
    return i < 8 ? special[i] : next_rand() % 20000;
}

static int build(const char *path)
{
    sfs_writer_t *w;
    sfs_error_t err;
    if (sfs_writer_open(path, &w, &err) != SFS_OK)
        return -1;
    uint8_t *buf = malloc(3u << 20);
    for (int i = 0; i < N; i++) {
        sizes[i] = size_of(i);
        for (size_t j = 0; j < sizes[i]; j++)
            buf[j] = (uint8_t)(next_rand() >> 7);
        if (sizes[i] >= 4)
            memcpy(buf, &i, sizeof(i)); /* every object distinct */
        rand_key(keys[i]);
        digest(buf, sizes[i], 0, sha1s[i]);
        digest(buf, sizes[i], 1, gits[i]);
        if (sfs_writer_add(w, keys[i], buf, sizes[i], &err) != SFS_OK) {
            free(buf);
            sfs_writer_abort(w);
            return -1;
        }
    }
    free(buf);
    return sfs_writer_finish(w, NULL, &err) == SFS_OK ? 0 : -1;
}

/* Whether `found` (or not) is right for object i of kind k. */
static int right(sfs_shard_t *s, int i, int rc, uint32_t slot, uint64_t off, uint64_t size)
{
    if (i == deleted || (sizes[i] == 0 && i != 0))
        return 1; /* an empty object other than the first has the same digests */
    if (rc != SFS_OK)
        return 0;
    uint32_t kslot;
    uint64_t koff, ksize;
    return sfs_lookup_slot(s, keys[i], &kslot, &koff, &ksize) == SFS_OK && kslot == slot && koff == off &&
           ksize == size;
}

static void test_find(sfs_shard_t *s, const char *p1, const char *p2)
{
    sfs_hashindex_t *hx[2];
    sfs_error_t err;
    REQUIRE(sfs_hashindex_open(p1, identity, sfs_slot_count(s), &hx[0], &err) == SFS_OK, "open: %s", err.message);
    REQUIRE(sfs_hashindex_open(p2, identity, sfs_slot_count(s), &hx[1], &err) == SFS_OK, "open: %s", err.message);
    CHECK(sfs_hashindex_kind(hx[0]) == SFS_HASH_SHA1 && sfs_hashindex_kind(hx[1]) == SFS_HASH_SHA1_GIT, "kinds");
    CHECK(sfs_hashindex_count(hx[0]) == N, "count %llu", (unsigned long long)sfs_hashindex_count(hx[0]));
    int good = 0;
    for (int i = 0; i < N; i++) {
        for (int k = 0; k < 2; k++) {
            uint32_t slot = 0;
            uint64_t off = 0, size = 0;
            int rc = sfs_hash_find(s, hx[k], k ? gits[i] : sha1s[i], &slot, &off, &size, &err);
            if (i == deleted)
                CHECK(rc == SFS_ENOTFOUND, "deleted object %d found by kind %d", i, k);
            else
                good += right(s, i, rc, slot, off, size);
            /* the other hash's digest names nothing */
            CHECK(sfs_hash_find(s, hx[k], k ? sha1s[i] : gits[i], &slot, &off, &size, &err) == SFS_ENOTFOUND,
                  "object %d found by the other hash", i);
        }
        uint8_t absent[20];
        for (int j = 0; j < 20; j++)
            absent[j] = (uint8_t)next_rand();
        uint32_t slot;
        uint64_t off, size;
        CHECK(sfs_hash_find(s, hx[0], absent, &slot, &off, &size, &err) == SFS_ENOTFOUND, "absent found");
    }
    CHECK(good == 2 * (N - 1), "%d of %d found right", good, 2 * (N - 1));
    uint64_t *pre;
    size_t n;
    REQUIRE(sfs_hashindex_prefixes(hx[1], &pre, &n, &err) == SFS_OK, "prefixes");
    int sorted = 1, known = 1;
    for (size_t j = 0; j < n; j++) {
        sorted &= j == 0 || pre[j - 1] < pre[j];
        int hit = 0;
        for (int i = 0; i < N && !hit; i++) {
            uint64_t v = 0;
            for (int b = 0; b < 5; b++)
                v = v << 8 | gits[i][b];
            hit = v == pre[j];
        }
        known &= hit;
    }
    CHECK(sorted && known && n <= N && n >= N - 8, "prefixes: sorted %d, the digests' %d, %zu", sorted, known, n);
    free(pre);
    sfs_hashindex_close(hx[0]);
    sfs_hashindex_close(hx[1]);
}

static void test_wrong_pairs(sfs_shard_t *s)
{
    /* every sha1 moved to the next object's slot: none may be found */
    uint8_t *d = malloc(20 * N);
    uint32_t *slots = malloc(4 * N);
    for (int i = 0; i < N; i++) {
        uint64_t off, size;
        uint32_t slot;
        CHECK(i == deleted || sfs_lookup_slot(s, keys[(i + 1) % N], &slot, &off, &size) == SFS_OK ||
              (i + 1) % N == deleted, "slot");
        slots[i] = sfs_lookup_slot(s, keys[(i + 1) % N], &slot, &off, &size) == SFS_OK ? slot : 0;
        memcpy(d + 20 * i, sha1s[i], 20);
    }
    sfs_error_t err;
    char *p = strdup(path_of("wrong.sha1"));
    REQUIRE(sfs_hashindex_write(p, SFS_HASH_SHA1, identity, sfs_slot_count(s), d, slots, N, &err) == SFS_OK,
            "write: %s", err.message);
    sfs_hashindex_t *hx;
    REQUIRE(sfs_hashindex_open(p, identity, sfs_slot_count(s), &hx, &err) == SFS_OK, "open");
    int wrong = 0;
    for (int i = 0; i < N; i++) {
        uint32_t slot;
        uint64_t off, size;
        int rc = sfs_hash_find(s, hx, sha1s[i], &slot, &off, &size, &err);
        wrong += rc == SFS_OK && !(sizes[i] == 0); /* empty objects all share one digest */
    }
    CHECK(wrong == 0, "%d objects found under another's sha1", wrong);
    sfs_hashindex_close(hx);
    slots[0] = (uint32_t)sfs_slot_count(s); /* a slot past the index: refused */
    CHECK(sfs_hashindex_write(p, SFS_HASH_SHA1, identity, sfs_slot_count(s), d, slots, N, &err) == SFS_EINVAL,
          "a slot past the index accepted");
    free(p);
    free(d);
    free(slots);
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*len);
    *len = fread(b, 1, *len, f);
    fclose(f);
    return b;
}

static void spill(const char *path, const uint8_t *b, size_t len)
{
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len, f);
    fclose(f);
}

static void test_damaged(sfs_shard_t *s, const char *good)
{
    size_t len;
    uint8_t *orig = slurp(good, &len);
    char *p = strdup(path_of("damaged.sha1_git"));
    sfs_error_t err;
    int wrong = 0, opened = 0;
    for (int round = 0; round < 200; round++) {
        uint8_t *b = malloc(len);
        memcpy(b, orig, len);
        int hits = 1 + (int)(next_rand() % 40);
        for (int h = 0; h < hits; h++)
            b[SFS_HX_HEADER_SIZE + next_rand() % (len - SFS_HX_HEADER_SIZE)] = (uint8_t)next_rand();
        spill(p, b, len);
        free(b);
        sfs_hashindex_t *hx;
        if (sfs_hashindex_open(p, identity, sfs_slot_count(s), &hx, &err) != SFS_OK)
            continue;
        opened++;
        for (int i = 0; i < N; i++) {
            uint32_t slot;
            uint64_t off, size;
            int rc = sfs_hash_find(s, hx, gits[i], &slot, &off, &size, &err);
            if (rc == SFS_OK && !right(s, i, rc, slot, off, size))
                wrong++;
        }
        sfs_hashindex_close(hx);
    }
    CHECK(opened == 200, "damaged bodies opened %d of 200 times (the header is intact)", opened);
    CHECK(wrong == 0, "%d wrong objects found through damaged indexes", wrong);
    sfs_hashindex_t *hx;
    spill(p, orig, len - 1);
    CHECK(sfs_hashindex_open(p, identity, sfs_slot_count(s), &hx, &err) == SFS_ECORRUPT, "truncated: %s",
          err.message);
    uint8_t *b = malloc(len);
    memcpy(b, orig, len);
    b[12] = 9; /* kind */
    spill(p, b, len);
    CHECK(sfs_hashindex_open(p, identity, sfs_slot_count(s), &hx, &err) == SFS_ECORRUPT, "bad kind");
    memcpy(b, orig, len);
    b[0] = 'X';
    spill(p, b, len);
    CHECK(sfs_hashindex_open(p, identity, sfs_slot_count(s), &hx, &err) == SFS_ECORRUPT, "bad magic");
    spill(p, orig, len);
    uint8_t other[32];
    memcpy(other, identity, 32);
    other[0] ^= 1;
    CHECK(sfs_hashindex_open(p, other, sfs_slot_count(s), &hx, &err) == SFS_ESTALE, "another shard's");
    CHECK(sfs_hashindex_open(p, identity, sfs_slot_count(s) + 1, &hx, &err) == SFS_ESTALE, "another slot count");
    free(b);
    free(orig);
    free(p);
}

typedef struct {
    sfs_shard_t *s;
    sfs_hashindex_t *hx;
    int found;
} worker_t;

static void *work(void *arg)
{
    worker_t *w = arg;
    sfs_error_t err;
    for (int round = 0; round < 20; round++)
        for (int i = 0; i < N; i++) {
            uint32_t slot;
            uint64_t off, size;
            w->found += sfs_hash_find(w->s, w->hx, gits[i], &slot, &off, &size, &err) == SFS_OK;
        }
    return NULL;
}

static void test_threads(sfs_shard_t *s, const char *path)
{
    sfs_hashindex_t *hx;
    sfs_error_t err;
    REQUIRE(sfs_hashindex_open(path, identity, sfs_slot_count(s), &hx, &err) == SFS_OK, "open");
    pthread_t t[4];
    worker_t w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker_t){s, hx, 0};
        pthread_create(&t[i], NULL, work, &w[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].found == 20 * (N - 1), "thread %d found %d", i, w[i].found);
    }
    sfs_hashindex_close(hx);
}

/* The file shrinking in the middle of a hash, made deterministic: every
 * pread of this program (the C core's too: it is linked in, so this
 * definition is the one its calls reach) goes to the system call; when
 * shrink_path is set, the first pread of shrink_len bytes or more is
 * followed by truncating that file to shrink_to bytes (once). */
static const char *shrink_path;
static size_t shrink_len;
static off_t shrink_to;
static int shrunk;

ssize_t pread(int fd, void *buf, size_t count, off_t offset)
{
    ssize_t n = syscall(SYS_pread64, fd, buf, count, offset);
    if (shrink_path && !shrunk && count >= shrink_len) {
        shrunk = truncate(shrink_path, shrink_to) == 0 ? 1 : -1;
        shrink_path = NULL;
    }
    return n;
}

/* An object of 1 MiB + 16 KiB is hashed in two reads: the first MiB with
 * pread, then the last 16 KiB (sfs_read copies a range that short from the
 * mapping). The shard is truncated to one page between the two: the copy
 * touches a page past the new end, SIGBUS. Under SFS_GUARDED (`guarded`,
 * as the extension calls it) that is SFS_EGONE; with the handler installed
 * but no guard around the call, sfs_hash_find answers SFS_EIO. Either way
 * the 1 MiB buffer the first part was read into must be freed: the leak
 * checkers of make test-asan and test-valgrind report it otherwise, and
 * without them glibc's count of the bytes in use (mallinfo2; zero under
 * the sanitizers and valgrind, which replace malloc) must not grow by it. */
static void test_shrinks_while_hashing(int guarded)
{
    char *path = strdup(path_of("gone.shard")), *p1 = strdup(path_of("gone.sha1"));
    size_t big = (1u << 20) + (16u << 10);
    uint8_t *data = malloc(big), key[32], d[20];
    for (size_t j = 0; j < big; j++)
        data[j] = (uint8_t)(next_rand() >> 11);
    digest(data, big, 0, d);
    sfs_writer_t *w;
    sfs_shard_t *s = NULL;
    sfs_hashindex_t *hx = NULL;
    sfs_error_t err;
    int ok = sfs_writer_open(path, &w, &err) == SFS_OK;
    for (int i = 0; ok && i < 3; i++) {
        rand_key(key);
        ok = sfs_writer_add(w, key, data, i == 1 ? big : 100 + (size_t)i, &err) == SFS_OK;
    }
    if (ok)
        ok = sfs_writer_finish(w, NULL, &err) == SFS_OK;
    else
        sfs_writer_abort(w);
    free(data);
    const char *paths[2] = {p1, NULL};
    if (ok && sfs_open(path, 0, &s, &err) == SFS_OK &&
        sfs_hashindex_build(s, identity, paths, NULL, NULL, &err) == SFS_OK &&
        sfs_hashindex_open(p1, identity, sfs_slot_count(s), &hx, &err) == SFS_OK && sfs_guard_install() == 0) {
        uint32_t slot = 0;
        uint64_t off = 0, size = 0;
        volatile int rc = -1;
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_hash_find(s, hx, d, &slot, &off, &size, &err));
        CHECK(rc == SFS_OK && size == big, "before the truncation: rc %d, size %llu", rc, (unsigned long long)size);
        shrink_path = path;
        shrink_len = 1u << 20;
        shrink_to = 4096;
        shrunk = 0;
        rc = -1;
        struct mallinfo2 m0 = mallinfo2();
        if (guarded)
            SFS_GUARDED(rc = SFS_EGONE, rc = sfs_hash_find(s, hx, d, &slot, &off, &size, &err));
        else
            rc = sfs_hash_find(s, hx, d, &slot, &off, &size, &err);
        struct mallinfo2 m1 = mallinfo2();
        size_t before = m0.uordblks + m0.hblkhd, after = m1.uordblks + m1.hblkhd;
        CHECK(after < before + (512u << 10), "%zu bytes more in use after the hash cut short", after - before);
        CHECK(shrunk == 1, "the shard was not truncated during the hash (%d)", shrunk);
        if (guarded)
            CHECK(rc == SFS_EGONE, "shrunk while hashing, guarded: rc %d, not SFS_EGONE", rc);
        else
            CHECK(rc == SFS_EIO && err.sys_errno == EIO,
                  "shrunk while hashing, no guard: rc %d (errno %d), not SFS_EIO", rc, err.sys_errno);
        shrink_path = NULL;
    } else {
        CHECK(0, "cannot make the shard and hash index of the shrinking test: %s", err.message);
    }
    sfs_hashindex_close(hx);
    if (s)
        sfs_close(s);
    free(path);
    free(p1);
}

int main(void)
{
    if (make_test_dir("shardfs-hashindex-test") != 0)
        return 1;
    char *shard = strdup(path_of("s.shard")), *p1 = strdup(path_of("s.sha1")), *p2 = strdup(path_of("s.sha1_git"));
    sfs_error_t err;
    sfs_shard_t *s = NULL;
    if (build(shard) != 0 || sfs_open(shard, 1, &s, &err) != SFS_OK) {
        fprintf(stderr, "cannot build the test shard\n");
        return 1;
    }
    for (int i = 0; i < 32; i++)
        identity[i] = (uint8_t)(i * 7);
    const char *paths[2] = {p1, p2};
    CHECK(sfs_hashindex_build(s, identity, paths, NULL, NULL, &err) == SFS_OK, "build: %s", err.message);
    CHECK(sfs_delete(s, keys[deleted], &err) == SFS_OK, "delete");
    test_find(s, p1, p2);
    test_wrong_pairs(s);
    test_damaged(s, p2);
    test_threads(s, p2);
    sfs_close(s);
    test_shrinks_while_hashing(1);
    test_shrinks_while_hashing(0);
    printf("%d passed, %d failed\n", passed, failed);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    free(shard);
    free(p1);
    free(p2);
    return failed != 0;
}
