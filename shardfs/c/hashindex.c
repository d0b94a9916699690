/* hashindex.c — objects found by SHA-1 or git's blob hash (hashindex.h). */
#define _GNU_SOURCE
#include "hashindex.h"

#include "guard.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>
#include <pthread.h>

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)
#define HASH_CHUNK (1u << 20)       /* bytes hashed per read of a large object */
#define BUILD_BUFFER (4u << 20)     /* bytes read at once by a build */
#define INDEX_CHUNK 16384u          /* slots read at once by a build */
#define PROGRESS_EVERY (64u << 20)  /* bytes hashed between progress calls */
#define BUILD_THREADS 8             /* most threads hashing a shard */

struct sfs_hashindex {
    int refs; /* holders beyond the first (internal.h) */
    uint8_t *map;
    size_t map_size;
    const uint8_t *dir; /* u32[2^b + 1] */
    const uint8_t *entries;
    uint64_t n, slot_count;
    unsigned b, s;
    int kind;
};

static uint64_t top64(const uint8_t *digest)
{
    return be64(digest);
}

static unsigned slot_bits_for(uint64_t slot_count)
{
    unsigned s = 1;
    while (s < 32 && (UINT64_C(1) << s) < slot_count)
        s++;
    return s;
}

static unsigned bucket_bits_for(uint64_t n, unsigned s)
{
    unsigned b = s > 24 ? s - 24 : 0;
    while (b < 32 && (UINT64_C(1) << b) * 512 < n)
        b++;
    return b;
}

static uint64_t file_size(unsigned b, uint64_t n)
{
    return SFS_HX_HEADER_SIZE + 4 * ((UINT64_C(1) << b) + 1) + 8 * n;
}

/* ---------------------------------------------------------------- hashing */

/* SHA-1 fetched once (an implicit fetch at every init costs more than
 * hashing a small object), and one digest context per thread for the
 * lookups' checks (freed when the thread exits). */
static EVP_MD *sha1_md_;
static pthread_once_t sha1_once = PTHREAD_ONCE_INIT;
static pthread_key_t ctx_key;

static void sha1_init(void)
{
    sha1_md_ = EVP_MD_fetch(NULL, "SHA1", NULL);
    pthread_key_create(&ctx_key, (void (*)(void *))EVP_MD_CTX_free);
}

static const EVP_MD *sha1_md(void)
{
    pthread_once(&sha1_once, sha1_init);
    return sha1_md_ ? sha1_md_ : EVP_sha1();
}

static EVP_MD_CTX *thread_ctx(void)
{
    sha1_md();
    EVP_MD_CTX *ctx = pthread_getspecific(ctx_key);
    if (!ctx && (ctx = EVP_MD_CTX_new()) != NULL)
        pthread_setspecific(ctx_key, ctx);
    return ctx;
}

typedef struct {
    EVP_MD_CTX *ctx[2]; /* sha1, sha1_git; NULL when not wanted */
} hasher_t;

static int hasher_begin(hasher_t *h, uint64_t size)
{
    if (h->ctx[0] && !EVP_DigestInit_ex(h->ctx[0], sha1_md(), NULL))
        return -1;
    if (h->ctx[1]) {
        char head[32];
        int len = snprintf(head, sizeof(head), "blob %" PRIu64, size);
        if (!EVP_DigestInit_ex(h->ctx[1], sha1_md(), NULL) || !EVP_DigestUpdate(h->ctx[1], head, (size_t)len + 1))
            return -1;
    }
    return 0;
}

static int hasher_update(hasher_t *h, const void *data, size_t n)
{
    for (int k = 0; k < 2; k++)
        if (h->ctx[k] && !EVP_DigestUpdate(h->ctx[k], data, n))
            return -1;
    return 0;
}

static int hasher_end(hasher_t *h, uint8_t out[2][SFS_HX_DIGEST_SIZE])
{
    for (int k = 0; k < 2; k++)
        if (h->ctx[k] && !EVP_DigestFinal_ex(h->ctx[k], out[k], NULL))
            return -1;
    return 0;
}

static void hasher_free(hasher_t *h)
{
    EVP_MD_CTX_free(h->ctx[0]);
    EVP_MD_CTX_free(h->ctx[1]);
}

static int hasher_new(hasher_t *h, int want_sha1, int want_git)
{
    h->ctx[0] = want_sha1 ? EVP_MD_CTX_new() : NULL;
    h->ctx[1] = want_git ? EVP_MD_CTX_new() : NULL;
    if ((want_sha1 && !h->ctx[0]) || (want_git && !h->ctx[1])) {
        hasher_free(h);
        return -1;
    }
    return 0;
}

/* Feed the `size` bytes at `off` of `shard` to `ctx`, HASH_CHUNK at a time
 * through `buf`. */
static int hash_chunks(const sfs_shard_t *shard, EVP_MD_CTX *ctx, uint64_t off, uint64_t size, uint8_t *buf)
{
    int rc = SFS_OK;
    for (uint64_t done = 0; rc == SFS_OK && done < size;) {
        size_t len = size - done < HASH_CHUNK ? (size_t)(size - done) : HASH_CHUNK;
        rc = sfs_read(shard, off + done, buf, len);
        if (rc == SFS_OK && !EVP_DigestUpdate(ctx, buf, len))
            rc = SFS_ENOMEM;
        done += len;
    }
    return rc;
}

/* hash_chunks through a buffer of its own. Called under the caller's
 * SFS_GUARDED (guard.h), which abandons the frames below it if the shard
 * shrinks under a read (sfs_read copies short ranges, such as the last
 * part of an object, from the mapping: SIGBUS past the new end). The
 * buffer is allocated before a guard of this frame and freed after it, on
 * both paths; a fault is then handed on to the caller's guard. Not inlined:
 * no other local of the callers lives across the sigsetjmp. */
static __attribute__((noinline)) int hash_large(const sfs_shard_t *shard, EVP_MD_CTX *ctx, uint64_t off,
                                                uint64_t size)
{
    uint8_t *const buf = malloc(HASH_CHUNK); /* set before the guard: kept by the jump */
    if (!buf)
        return SFS_ENOMEM;
    volatile int rc = SFS_OK, gone = 0;
    SFS_GUARDED(gone = 1, rc = hash_chunks(shard, ctx, off, size, buf));
    free(buf);
    if (gone) {
        sfs_guard_pass_on();
        errno = EIO; /* no guard around: the file shrank, as sfs_read says when pread finds it shorter */
        return SFS_EIO;
    }
    return rc;
}

/* Digest of kind `kind` of the `size` bytes at `off` of `shard`. */
static int hash_object(const sfs_shard_t *shard, uint64_t off, uint64_t size, int kind,
                       uint8_t out[SFS_HX_DIGEST_SIZE])
{
    EVP_MD_CTX *ctx = thread_ctx();
    if (!ctx || !EVP_DigestInit_ex(ctx, sha1_md(), NULL))
        return SFS_ENOMEM;
    if (kind == SFS_HASH_SHA1_GIT) {
        char head[32];
        int len = snprintf(head, sizeof(head), "blob %" PRIu64, size);
        if (!EVP_DigestUpdate(ctx, head, (size_t)len + 1))
            return SFS_ENOMEM;
    }
    int rc = SFS_OK;
    const uint8_t *mapped = size <= HASH_CHUNK ? sfs_data(shard, off, size) : NULL;
    if (mapped || size == 0) {
        if (size && !EVP_DigestUpdate(ctx, mapped, (size_t)size))
            rc = SFS_ENOMEM;
    } else {
        rc = hash_large(shard, ctx, off, size);
    }
    if (rc == SFS_OK && !EVP_DigestFinal_ex(ctx, out, NULL))
        rc = SFS_ENOMEM;
    return rc;
}

/* ---------------------------------------------------------------- writing */

typedef struct {
    uint64_t t;    /* the digest's top 64 bits (big-endian) */
    uint32_t slot;
} pair_t;

static int cmp_pair(const void *x, const void *y)
{
    const pair_t *a = x, *b = y;
    if (a->t != b->t)
        return a->t < b->t ? -1 : 1;
    return (a->slot > b->slot) - (a->slot < b->slot);
}

/* Sort `pairs`, drop repeats, and write the file. */
static int write_pairs(const char *path, int kind, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                       uint64_t slot_count, pair_t *pairs, size_t n, sfs_error_t *err)
{
    unsigned s = slot_bits_for(slot_count), b = bucket_bits_for(n, s);
    /* only the digest bits an entry keeps order it: ties by slot */
    for (size_t i = 0; i < n; i++)
        pairs[i].t &= ~((UINT64_C(1) << (s - b)) - 1);
    qsort(pairs, n, sizeof(*pairs), cmp_pair);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || pairs[i].t != pairs[m - 1].t || pairs[i].slot != pairs[m - 1].slot)
            pairs[m++] = pairs[i];
    uint64_t buckets = UINT64_C(1) << b;
    size_t head = SFS_HX_HEADER_SIZE + 4 * (size_t)(buckets + 1);
    uint8_t *out = calloc(1, head);
    if (!out)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    memcpy(out, SFS_HX_MAGIC, 8);
    put_le32(out + 8, SFS_HX_VERSION);
    put_le32(out + 12, (uint32_t)kind);
    put_le64(out + 16, m);
    put_le64(out + 24, slot_count);
    put_le32(out + 32, b);
    put_le32(out + 36, s);
    memcpy(out + 64, identity, SFS_HX_IDENTITY_SIZE);
    size_t i = 0;
    for (uint64_t k = 0; k <= buckets; k++) {
        while (i < m && (b ? pairs[i].t >> (64 - b) : 0) < k)
            i++;
        put_le32(out + SFS_HX_HEADER_SIZE + 4 * k, (uint32_t)(k == buckets ? m : i));
    }
    int fd;
    char *tmp = NULL;
    int rc = sfs_output_create(path, 0600, &fd, &tmp, err);
    if (rc != SFS_OK) {
        free(out);
        return rc;
    }
    int e = 0;
    if (sfs_pwrite_all(fd, out, head, 0) < 0)
        e = errno;
    free(out);
    enum { BATCH = 8192 };
    uint8_t buf[8 * BATCH];
    uint64_t mask = (UINT64_C(1) << s) - 1;
    for (size_t j = 0; !e && j < m; j += BATCH) {
        size_t len = m - j < BATCH ? m - j : BATCH;
        for (size_t q = 0; q < len; q++) {
            uint64_t bits = (pairs[j + q].t << b) >> s; /* digest bits [b, b + 64 - s) */
            put_le64(buf + 8 * q, bits << s | (pairs[j + q].slot & mask));
        }
        if (sfs_pwrite_all(fd, buf, 8 * len, head + 8 * (uint64_t)j) < 0)
            e = errno;
    }
    if (!e && fdatasync(fd) < 0)
        e = errno;
    if (!e && sfs_output_publish(fd, &tmp, path) < 0)
        e = errno;
    close(fd);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    if (e)
        return sfs_fail(err, SFS_EIO, e, "%s: writing the hash index: %s", path, strerror(e));
    sfs_sync_directory(path);
    return SFS_OK;
}

int sfs_hashindex_write(const char *path, int kind, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                        uint64_t slot_count, const uint8_t *digests, const uint32_t *slots, size_t n,
                        sfs_error_t *err)
{
    if (kind != SFS_HASH_SHA1 && kind != SFS_HASH_SHA1_GIT)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: unknown hash kind %d", path, kind);
    if (slot_count == 0 || slot_count > UINT32_MAX)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: slot count %" PRIu64 " out of range", path, slot_count);
    pair_t *pairs = malloc(n ? n * sizeof(*pairs) : 1);
    if (!pairs)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < n; i++) {
        if (slots[i] >= slot_count) {
            free(pairs);
            return sfs_fail(err, SFS_EINVAL, 0, "%s: slot %u of pair %zu is not below the slot count %" PRIu64,
                            path, slots[i], i, slot_count);
        }
        pairs[i].t = top64(digests + (size_t)SFS_HX_DIGEST_SIZE * i);
        pairs[i].slot = slots[i];
    }
    int rc = write_pairs(path, kind, identity, slot_count, pairs, n, err);
    free(pairs);
    return rc;
}

/* ---------------------------------------------------------------- building */

typedef struct {
    uint64_t offset; /* of the object's size field */
    uint32_t slot;
} live_t;

static int cmp_live(const void *x, const void *y)
{
    const live_t *a = x, *b = y;
    return (a->offset > b->offset) - (a->offset < b->offset);
}

/* Forward-only buffered reads of one descriptor (or of an rbd: source's
 * image: sfs_source_read). */
typedef struct {
    const sfs_shard_t *shard;
    int fd;
    uint8_t *buf;
    uint64_t start, len; /* bytes [start, start + len) of the file are in buf */
} reader_t;

/* Make [pos, pos + want) (want <= BUILD_BUFFER) available; *got = bytes
 * available from pos (>= want unless the file ends). 0 or -1 (errno). */
static int reader_at(reader_t *r, uint64_t pos, uint64_t want, const uint8_t **p, uint64_t *got)
{
    if (pos < r->start || pos + want > r->start + r->len) {
        /* fewer bytes only at the end of the file */
        ssize_t n = sfs_source_read(r->shard, r->fd, r->buf, BUILD_BUFFER, pos);
        if (n < 0)
            return -1;
        r->start = pos;
        r->len = (uint64_t)n;
        /* the next window comes from the device while this one is hashed */
        posix_fadvise(r->fd, (off_t)(pos + (uint64_t)n), 4 * BUILD_BUFFER, POSIX_FADV_WILLNEED);
    }
    *p = r->buf + (pos - r->start);
    *got = r->start + r->len - pos;
    return 0;
}

/* One thread's part of a build: live[begin, end) hashed in order through
 * its own buffer (pread on the shared descriptor: no file position). */
typedef struct {
    const sfs_shard_t *shard;
    const live_t *live;
    size_t begin, end;
    pair_t *pairs[2];
    int fd;
    uint64_t *hashed;     /* object bytes hashed by every thread (atomic) */
    volatile int *stop;   /* set by any thread on error or interruption */
    int (*progress)(void *ctx, uint64_t done);
    void *ctx;            /* progress is called by part 0 only */
    int rc;
    sfs_error_t err;
} part_t;

static void *hash_part(void *arg)
{
    part_t *pt = arg;
    const sfs_header_t *hd = sfs_header(pt->shard);
    const char *name = sfs_path(pt->shard);
    reader_t r = {.shard = pt->shard, .fd = pt->fd, .buf = malloc(BUILD_BUFFER)};
    hasher_t h = {{NULL, NULL}};
    sfs_error_t *err = &pt->err;
    uint64_t lo = hd->objects_position, hi = hd->objects_position + hd->objects_size, told = 0;
    if (!r.buf || hasher_new(&h, pt->pairs[0] != NULL, pt->pairs[1] != NULL) < 0) {
        pt->rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", name);
        goto out;
    }
    for (size_t i = pt->begin; i < pt->end && !*pt->stop; i++) {
        uint64_t off = pt->live[i].offset, size, got;
        const uint8_t *p;
        if (off < lo || off > hi - SFS_SIZE_FIELD_SIZE) {
            pt->rc = CORRUPT("%s: slot %u: offset %" PRIu64 " outside the objects section", name, pt->live[i].slot, off);
            goto out;
        }
        if (reader_at(&r, off, SFS_SIZE_FIELD_SIZE, &p, &got) < 0 || got < SFS_SIZE_FIELD_SIZE)
            goto io;
        size = be64(p);
        if (size > hi - off - SFS_SIZE_FIELD_SIZE) {
            pt->rc = CORRUPT("%s: slot %u: object of %" PRIu64 " bytes past the objects section", name,
                             pt->live[i].slot, size);
            goto out;
        }
        if (hasher_begin(&h, size) < 0)
            goto nomem;
        for (uint64_t pos = off + SFS_SIZE_FIELD_SIZE, left = size; left;) {
            uint64_t want = left < BUILD_BUFFER ? left : BUILD_BUFFER;
            if (reader_at(&r, pos, want, &p, &got) < 0 || got < want)
                goto io;
            hasher_update(&h, p, (size_t)want);
            pos += want;
            left -= want;
        }
        uint8_t d[2][SFS_HX_DIGEST_SIZE];
        if (hasher_end(&h, d) < 0)
            goto nomem;
        for (int k = 0; k < 2; k++)
            if (pt->pairs[k])
                pt->pairs[k][i] = (pair_t){top64(d[k]), pt->live[i].slot};
        uint64_t all = __atomic_add_fetch(pt->hashed, size, __ATOMIC_RELAXED);
        if (pt->progress && all - told >= PROGRESS_EVERY) {
            told = all;
            if (pt->progress(pt->ctx, all)) {
                pt->rc = sfs_fail(err, SFS_EINVAL, EINTR, "%s: hash index build interrupted", name);
                goto out;
            }
        }
    }
    goto out;
io:
    pt->rc = sfs_fail(err, SFS_EIO, errno ? errno : EIO, "%s: reading objects: %s", name, strerror(errno ? errno : EIO));
    goto out;
nomem:
    pt->rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: hashing: out of memory", name);
out:
    if (pt->rc != SFS_OK)
        *pt->stop = 1;
    hasher_free(&h);
    free(r.buf);
    return NULL;
}

typedef struct {
    pair_t *pairs;
    size_t count, max;
} own_t;

static void own_emit(void *ctx, const uint8_t *digest, uint32_t slot)
{
    own_t *o = ctx;
    if (o->count < o->max)
        o->pairs[o->count++] = (pair_t){top64(digest), slot};
}

int sfs_hashindex_build(const sfs_shard_t *shard, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                        const char *const paths[2], int (*progress)(void *ctx, uint64_t done),
                        void *ctx, sfs_error_t *err)
{
    const sfs_header_t *hd = sfs_header(shard);
    const char *name = sfs_path(shard);
    uint64_t slots = sfs_slot_count(shard);
    if (slots == 0 || slots > UINT32_MAX)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: %" PRIu64 " slots: no hash index", name, slots);
    int fd = -1, rc = sfs_reopen_for_index(shard, &fd, err);
    if (rc != SFS_OK)
        return rc;
    live_t *live = malloc(slots * sizeof(*live));
    pair_t *pairs[2] = {NULL, NULL};
    uint8_t *chunk = malloc((size_t)INDEX_CHUNK * SFS_SLOT_SIZE);
    size_t n = 0;
    if (!live || !chunk) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", name);
        goto out;
    }
    for (uint64_t first = 0; first < slots; first += INDEX_CHUNK) {
        uint64_t count = slots - first < INDEX_CHUNK ? slots - first : INDEX_CHUNK;
        if (sfs_index_read(shard, fd, first, count, chunk) != 0) {
            rc = sfs_fail(err, SFS_EIO, errno ? errno : EIO, "%s: reading the index: %s", name, strerror(errno ? errno : EIO));
            goto out;
        }
        for (uint64_t i = 0; i < count; i++) {
            uint64_t off = be64(chunk + i * SFS_SLOT_SIZE + SFS_KEY_SIZE);
            if (off != SFS_EMPTY_OFFSET)
                live[n++] = (live_t){off, (uint32_t)(first + i)};
        }
    }
    qsort(live, n, sizeof(*live), cmp_live);
    for (int k = 0; k < 2; k++)
        if (paths[k] && !(pairs[k] = malloc(n ? n * sizeof(pair_t) : 1))) {
            rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", name);
            goto out;
        }
    /* the digests the source's own index gives (a MOSAIC file's), no
     * object read for them */
    for (int k = 0; k < 2; k++) {
        own_t own = {pairs[k], 0, n};
        int got = pairs[k] ? sfs_own_digests(shard, k == 0 ? SFS_HASH_SHA1 : SFS_HASH_SHA1_GIT, own_emit, &own)
                           : SFS_ENOTFOUND;
        if (got == SFS_ENOMEM) {
            rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", name);
            goto out;
        }
        if (got == SFS_OK) {
            rc = write_pairs(paths[k], k == 0 ? SFS_HASH_SHA1 : SFS_HASH_SHA1_GIT, identity, slots, pairs[k],
                             own.count, err);
            free(pairs[k]);
            pairs[k] = NULL;
            if (rc != SFS_OK)
                goto out;
        }
    }
    if (!pairs[0] && !pairs[1])
        goto out; /* every index asked for came from the source's own */
    /* One part per CPU (at most BUILD_THREADS), cut by bytes so that each
     * reads and hashes about as much, each a sequential stream. */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t nparts = cpus < 1 ? 1 : cpus > BUILD_THREADS ? BUILD_THREADS : (size_t)cpus;
    if (n < 64 * nparts)
        nparts = 1;
    part_t parts[BUILD_THREADS];
    pthread_t tids[BUILD_THREADS];
    uint64_t hashed = 0, span = hd->objects_size / nparts + 1;
    volatile int stop = 0;
    size_t at = 0;
    for (size_t t = 0; t < nparts; t++) {
        size_t end = at;
        uint64_t limit = hd->objects_position + span * (t + 1);
        while (end < n && (t == nparts - 1 || live[end].offset < limit))
            end++;
        parts[t] = (part_t){.shard = shard, .live = live, .begin = at, .end = end, .pairs = {pairs[0], pairs[1]},
                            .fd = fd, .hashed = &hashed, .stop = &stop, .progress = t == 0 ? progress : NULL,
                            .ctx = ctx};
        at = end;
    }
    size_t started = 1;
    for (size_t t = 1; t < nparts; t++, started++)
        if (pthread_create(&tids[t], NULL, hash_part, &parts[t]) != 0) {
            parts[t].rc = sfs_fail(&parts[t].err, SFS_ENOMEM, EAGAIN, "%s: cannot start a thread", name);
            stop = 1;
            break;
        }
    hash_part(&parts[0]);
    for (size_t t = 1; t < started; t++)
        pthread_join(tids[t], NULL);
    for (size_t t = 0; t < nparts && rc == SFS_OK; t++)
        if (parts[t].rc != SFS_OK) {
            rc = parts[t].rc;
            if (err)
                *err = parts[t].err;
        }
    for (int k = 0; k < 2 && rc == SFS_OK; k++)
        if (pairs[k])
            rc = write_pairs(paths[k], k == 0 ? SFS_HASH_SHA1 : SFS_HASH_SHA1_GIT, identity, slots, pairs[k], n, err);
    if (rc == SFS_OK && progress)
        progress(ctx, hashed);
out:
    free(pairs[0]);
    free(pairs[1]);
    free(live);
    free(chunk);
    close(fd);
    return rc;
}

/* ---------------------------------------------------------------- reading */

int sfs_hashindex_open(const char *path, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                       uint64_t slot_count, sfs_hashindex_t **out, sfs_error_t *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc;
    if (fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    struct stat st;
    uint8_t h[SFS_HX_HEADER_SIZE];
    if (fstat(fd, &st) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < SFS_HX_HEADER_SIZE) {
        rc = CORRUPT("%s: not a hash index: not a regular file of 96 bytes or more", path);
        goto fail;
    }
    if (sfs_pread_full(fd, h, sizeof(h), 0) != 0) {
        rc = sfs_fail(err, SFS_EIO, errno ? errno : EIO, "%s: reading the header: %s", path, strerror(errno ? errno : EIO));
        goto fail;
    }
    uint32_t kind = get_le32(h + 12), b = get_le32(h + 32), s = get_le32(h + 36);
    uint64_t n = get_le64(h + 16), slots = get_le64(h + 24);
    if (memcmp(h, SFS_HX_MAGIC, 8) != 0 || get_le32(h + 8) != SFS_HX_VERSION) {
        rc = CORRUPT("%s: not a shardfs hash index of version 1 (magic \"SFSHASH1\")", path);
        goto fail;
    }
    if ((kind != SFS_HASH_SHA1 && kind != SFS_HASH_SHA1_GIT) || b > 32 || s != slot_bits_for(slots) ||
        n > UINT32_MAX || (uint64_t)st.st_size != file_size(b, n)) {
        rc = CORRUPT("%s: damaged hash index header (kind %u, bucket_bits %u, slot_bits %u, count %" PRIu64
                     ", %lld bytes)", path, kind, b, s, n, (long long)st.st_size);
        goto fail;
    }
    if (memcmp(h + 64, identity, SFS_HX_IDENTITY_SIZE) != 0 || slots != slot_count) {
        rc = sfs_fail(err, SFS_ESTALE, 0, "%s: stale hash index: built for another shard", path);
        goto fail;
    }
    sfs_hashindex_t *hx = calloc(1, sizeof(*hx));
    if (!hx) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: mmap: %s", path, strerror(errno));
        free(hx);
        goto fail;
    }
    madvise(m, (size_t)st.st_size, MADV_RANDOM);
    close(fd);
    hx->map = m;
    hx->map_size = (size_t)st.st_size;
    hx->dir = hx->map + SFS_HX_HEADER_SIZE;
    hx->entries = hx->dir + 4 * ((UINT64_C(1) << b) + 1);
    hx->n = n;
    hx->slot_count = slots;
    hx->b = b;
    hx->s = s;
    hx->kind = (int)kind;
    *out = hx;
    return SFS_OK;
fail:
    close(fd);
    return rc;
}

sfs_hashindex_t *sfs_hashindex_ref(sfs_hashindex_t *hx)
{
    sfs_ref_take(&hx->refs);
    return hx;
}

void sfs_hashindex_close(sfs_hashindex_t *hx)
{
    if (hx && sfs_ref_drop(&hx->refs)) {
        munmap(hx->map, hx->map_size);
        free(hx);
    }
}

int sfs_hashindex_kind(const sfs_hashindex_t *hx) { return hx->kind; }
uint64_t sfs_hashindex_count(const sfs_hashindex_t *hx) { return hx->n; }

/* Entries [*lo, *hi) of bucket k, clamped to [0, n] and ordered. */
static void bucket_range(const sfs_hashindex_t *hx, uint64_t k, uint64_t *lo, uint64_t *hi)
{
    uint64_t a = get_le32(hx->dir + 4 * k), z = get_le32(hx->dir + 4 * (k + 1));
    a = a > hx->n ? hx->n : a;
    z = z > hx->n ? hx->n : z;
    *lo = a;
    *hi = z < a ? a : z;
}

size_t sfs_hashindex_lookup(const sfs_hashindex_t *hx, const uint8_t digest[SFS_HX_DIGEST_SIZE],
                            uint32_t *out, size_t max)
{
    uint64_t t = top64(digest), lo, hi;
    unsigned b = hx->b, s = hx->s;
    bucket_range(hx, b ? t >> (64 - b) : 0, &lo, &hi);
    uint64_t want = (t << b) >> s; /* digest bits [b, b + 64 - s) */
    while (lo < hi) {                /* first entry >= want */
        uint64_t mid = lo + (hi - lo) / 2;
        if ((get_le64(hx->entries + 8 * mid) >> s) < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t found = 0;
    uint64_t mask = (UINT64_C(1) << s) - 1;
    for (uint64_t i = lo; i < hx->n; i++) {
        uint64_t e = get_le64(hx->entries + 8 * i);
        if (e >> s != want)
            break;
        if ((e & mask) < hx->slot_count) {
            if (found < max)
                out[found] = (uint32_t)(e & mask);
            found++;
        }
    }
    return found;
}

int sfs_hashindex_prefixes(const sfs_hashindex_t *hx, uint64_t **out, size_t *n, sfs_error_t *err)
{
    uint64_t *v = malloc(hx->n ? hx->n * sizeof(*v) : 1);
    if (!v)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "hash index prefixes: out of memory");
    unsigned b = hx->b, s = hx->s, have = b + 64 - s; /* digest bits an entry and its bucket give: >= 40 */
    size_t m = 0;
    for (uint64_t k = 0; k < (UINT64_C(1) << b); k++) {
        uint64_t lo, hi;
        bucket_range(hx, k, &lo, &hi);
        for (uint64_t i = lo; i < hi; i++) {
            uint64_t bits = get_le64(hx->entries + 8 * i) >> s; /* 64 - s bits */
            uint64_t top = (b ? k << (64 - s) : 0) | bits;       /* `have` bits */
            uint64_t prefix = have > 40 ? top >> (have - 40) : top << (40 - have);
            if (m == 0 || v[m - 1] < prefix)
                v[m++] = prefix;
        }
    }
    *out = v;
    *n = m;
    return SFS_OK;
}

int sfs_hash_find(const sfs_shard_t *shard, const sfs_hashindex_t *hx,
                  const uint8_t digest[SFS_HX_DIGEST_SIZE], uint32_t *slot, uint64_t *data_offset,
                  uint64_t *size, sfs_error_t *err)
{
    uint32_t cand[8];
    size_t total = sfs_hashindex_lookup(hx, digest, cand, 8);
    for (size_t i = 0; i < total && i < 8; i++) {
        uint8_t d[SFS_HX_DIGEST_SIZE], key[SFS_KEY_SIZE];
        uint64_t off, len;
        int rc = sfs_slot_object(shard, cand[i], key, &off, &len);
        if (rc == SFS_ENOTFOUND || rc == SFS_ECORRUPT)
            continue; /* deleted since, or a damaged entry: not this one */
        if (rc == SFS_OK)
            rc = hash_object(shard, off, len, hx->kind, d);
        if (rc != SFS_OK)
            return sfs_fail(err, rc, rc == SFS_EIO ? errno : 0, "%s: hashing slot %u: %s", sfs_path(shard), cand[i],
                            sfs_strstatus(rc));
        if (memcmp(d, digest, SFS_HX_DIGEST_SIZE) == 0) {
            *slot = cand[i];
            *data_offset = off;
            *size = len;
            return SFS_OK;
        }
    }
    return sfs_fail(err, SFS_ENOTFOUND, 0, "not found");
}
