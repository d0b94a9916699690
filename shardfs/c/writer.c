/*
 * writer.c — build a Read Shard in one streaming pass.
 *
 * Objects are appended to a temporary file as they come (no count needed up
 * front). In memory we keep only, per key, its 32 bytes and its offset (40
 * bytes, in fixed blocks so growth never copies) plus a 4-byte-per-entry open
 * addressing table that rejects a duplicate key when it is added. At finish:
 * the CHD_PH function over the keys is built (chd_build.c; cmph's builder
 * when SHARDFS_CHD_BUILDER=cmph, or when ours finds no seed), loaded back
 * with cmph_load() and checked key by key against cmph_search() and our
 * evaluator, the index and the dump are appended, the header is written at
 * byte 0, the file is fdatasync'ed and renamed over the target, and the
 * directory is fsync'ed.
 *
 * The file is created and published by output.c: unnamed (O_TMPFILE) where
 * the file system allows it, so a process killed mid-build leaves nothing
 * behind; linked or renamed over the target only once complete.
 */
#define _GNU_SOURCE
#include "chd.h"
#include "internal.h"
#include "shard.h"

#include <cmph.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_BITS 16
#define BLOCK_ENTRIES (1u << BLOCK_BITS)
#define BUFFER_SIZE (1u << 20)
#define WRITEBACK (8u << 20)
#define MAX_KEYS (UINT32_MAX - 2) /* cmph counts keys in u32 */

typedef struct entry {
    uint8_t key[SFS_KEY_SIZE];
    uint64_t offset; /* byte offset of the object's size field */
} entry_t;

struct sfs_writer {
    char *path;      /* target */
    char *tmp_path;  /* the file's temporary name, NULL while unnamed (output.c) */
    int regular;     /* writing a new file (else a block device, in place) */
    int fd;
    uint64_t flushed; /* bytes [0, flushed) are in the file */
    uint8_t *buf;     /* bytes [flushed, flushed + buf_len) */
    size_t buf_len;
    entry_t **blocks;
    uint64_t nblocks, count, bytes;
    uint32_t *table;  /* entry index + 1; 0 = free */
    uint64_t table_cap;
    uint64_t cursor;  /* cmph key source position */
    uint64_t written_back; /* bytes [SFS_OBJECTS_POSITION, written_back) sent to the device */
    struct job *jobs; /* sfs_writer_add_files's window, kept with its buffers from call to call */
};

static inline entry_t *entry_at(const sfs_writer_t *w, uint64_t i)
{
    return &w->blocks[i >> BLOCK_BITS][i & (BLOCK_ENTRIES - 1)];
}

static inline uint64_t pos(const sfs_writer_t *w) { return w->flushed + w->buf_len; }

static inline uint64_t key_hash(const uint8_t key[SFS_KEY_SIZE])
{
    /* Keys are usually SHA-256 digests, but callers may pass anything
     * (e.g. counters): mix all 32 bytes. */
    uint64_t h = 0x9e3779b97f4a7c15ull, w;
    for (int i = 0; i < 4; i++) {
        memcpy(&w, key + 8 * i, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
    }
    return h;
}

/* Slot of key in the table: where it is, or the free slot it would take. */
static uint64_t table_find(const sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE])
{
    uint64_t mask = w->table_cap - 1, i = key_hash(key) & mask;
    while (w->table[i] && memcmp(entry_at(w, w->table[i] - 1)->key, key, SFS_KEY_SIZE) != 0)
        i = (i + 1) & mask;
    return i;
}

static int table_grow(sfs_writer_t *w)
{
    uint64_t cap = w->table_cap ? w->table_cap * 2 : 1024;
    uint32_t *old = w->table;
    uint64_t old_cap = w->table_cap;
    w->table = calloc(cap, sizeof(uint32_t));
    if (!w->table) {
        w->table = old;
        return -1;
    }
    w->table_cap = cap;
    for (uint64_t i = 0; i < old_cap; i++)
        if (old[i])
            w->table[table_find(w, entry_at(w, old[i] - 1)->key)] = old[i];
    free(old);
    return 0;
}

static int io_fail(sfs_writer_t *w, sfs_error_t *err, const char *what)
{
    int e = errno;
    return sfs_fail(err, SFS_EIO, e, "%s: %s: %s", w->path, what, strerror(e));
}

static int flush(sfs_writer_t *w)
{
    if (w->buf_len && sfs_pwrite_all(w->fd, w->buf, w->buf_len, w->flushed) < 0)
        return -1;
    w->flushed += w->buf_len;
    w->buf_len = 0;
    /* Start writing back what is written, WRITEBACK bytes at a time, without
     * waiting: the device works while objects come, and the fdatasync of
     * finish() has only the tail left to wait for. (Best effort: an error
     * shows there.) */
    if (w->flushed - w->written_back >= WRITEBACK) {
        sync_file_range(w->fd, (off64_t)w->written_back, (off64_t)(w->flushed - w->written_back),
                        SYNC_FILE_RANGE_WRITE);
        w->written_back = w->flushed;
    }
    return 0;
}

static int append(sfs_writer_t *w, const void *data, size_t len)
{
    const uint8_t *p = data;
    if (w->buf_len + len <= BUFFER_SIZE) {
        memcpy(w->buf + w->buf_len, p, len);
        w->buf_len += len;
        return 0;
    }
    if (flush(w) < 0)
        return -1;
    if (len >= BUFFER_SIZE) {
        if (sfs_pwrite_all(w->fd, p, len, w->flushed) < 0)
            return -1;
        w->flushed += len;
        return 0;
    }
    memcpy(w->buf, p, len);
    w->buf_len = len;
    return 0;
}

/* Forget every byte from `start` on (an object that failed half-way). */
static void rollback(sfs_writer_t *w, uint64_t start)
{
    if (start >= w->flushed) {
        w->buf_len = (size_t)(start - w->flushed);
    } else {
        w->buf_len = 0;
        w->flushed = start;
        if (w->written_back > start) /* else flush()'s next range would be negative */
            w->written_back = start;
        if (w->regular && ftruncate(w->fd, (off_t)start) < 0) {
            /* The bytes past `start` are overwritten or cut at finish. */
        }
    }
}

int sfs_writer_open(const char *path, sfs_writer_t **out, sfs_error_t *err)
{
    *out = NULL;
    sfs_writer_t *w = calloc(1, sizeof(*w));
    if (!w)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    w->fd = -1;
    w->path = strdup(path);
    w->buf = malloc(BUFFER_SIZE);
    if (!w->path || !w->buf || table_grow(w) < 0) {
        sfs_writer_abort(w);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    }
    struct stat st;
    if (stat(path, &st) == 0 && S_ISBLK(st.st_mode)) {
        w->fd = open(path, O_WRONLY | O_CLOEXEC);
        if (w->fd < 0) {
            int rc = sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
            sfs_writer_abort(w);
            return rc;
        }
    } else {
        w->regular = 1;
        mode_t um = umask(0);
        umask(um);
        int rc = sfs_output_create(path, 0666 & ~um, &w->fd, &w->tmp_path, err);
        if (rc != SFS_OK) {
            sfs_writer_abort(w);
            return rc;
        }
    }
    w->flushed = w->written_back = SFS_OBJECTS_POSITION;
    *out = w;
    return SFS_OK;
}

int sfs_writer_contains(const sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE])
{
    return w->table[table_find(w, key)] != 0;
}

uint64_t sfs_writer_count(const sfs_writer_t *w) { return w->count; }
uint64_t sfs_writer_bytes(const sfs_writer_t *w) { return w->bytes; }

/* Reserve the entry for key: checks duplicates and limits. */
static int begin_object(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], sfs_error_t *err)
{
    if (sfs_writer_contains(w, key)) {
        char hk[65];
        for (int i = 0; i < SFS_KEY_SIZE; i++)
            snprintf(hk + 2 * i, 3, "%02x", key[i]);
        return sfs_fail(err, SFS_EDUPLICATE, 0, "%s: duplicate key %s", w->path, hk);
    }
    if (w->count >= MAX_KEYS)
        return sfs_fail(err, SFS_ELIMIT, 0, "%s: a shard holds at most %u objects", w->path,
                        MAX_KEYS);
    if ((w->count >> BLOCK_BITS) >= w->nblocks) {
        entry_t **blocks = realloc(w->blocks, (w->nblocks + 1) * sizeof(*blocks));
        if (!blocks)
            return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
        w->blocks = blocks;
        if (!(w->blocks[w->nblocks] = malloc(BLOCK_ENTRIES * sizeof(entry_t))))
            return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
        w->nblocks++;
    }
    if ((w->count + 1) * 2 > w->table_cap && table_grow(w) < 0)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    return SFS_OK;
}

static void commit_object(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], uint64_t start,
                          uint64_t size)
{
    entry_t *e = entry_at(w, w->count);
    memcpy(e->key, key, SFS_KEY_SIZE);
    e->offset = start;
    w->count++;
    w->table[table_find(w, key)] = (uint32_t)w->count;
    w->bytes += size;
}

/* Check the key and append the object's big-endian size field; on failure
 * nothing is left appended. Returns the object's start offset in *start. */
static int begin_append(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], uint64_t size,
                        uint64_t *start, sfs_error_t *err)
{
    int rc = begin_object(w, key, err);
    if (rc != SFS_OK)
        return rc;
    *start = pos(w);
    uint64_t be = __builtin_bswap64(size);
    if (append(w, &be, SFS_SIZE_FIELD_SIZE) < 0) {
        rc = io_fail(w, err, "writing an object");
        rollback(w, *start);
        return rc;
    }
    return SFS_OK;
}

int sfs_writer_add(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], const void *data,
                   uint64_t size, sfs_error_t *err)
{
    uint64_t start;
    int rc = begin_append(w, key, size, &start, err);
    if (rc != SFS_OK)
        return rc;
    if (append(w, data, (size_t)size) < 0) {
        rc = io_fail(w, err, "writing an object");
        rollback(w, start);
        return rc;
    }
    commit_object(w, key, start, size);
    return SFS_OK;
}

/* Append `left` bytes read from fd at its position, straight into the write
 * buffer (flushed when full). 0; -1 when a write failed (errno set); -2 when
 * a read failed, *read_errno = its errno, or 0 when the file ended first. */
static int copy_fd(sfs_writer_t *w, int fd, uint64_t left, int *read_errno)
{
    while (left) {
        if (w->buf_len == BUFFER_SIZE && flush(w) < 0)
            return -1;
        size_t room = BUFFER_SIZE - w->buf_len;
        size_t want = left < room ? (size_t)left : room;
        ssize_t n = read(fd, w->buf + w->buf_len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            *read_errno = n < 0 ? errno : 0;
            return -2;
        }
        w->buf_len += (size_t)n;
        left -= (uint64_t)n;
    }
    return 0;
}

#define SHRANK "the file is shorter than its size (changed while being added?)"

/* Append an object of `size` bytes read from fd at its position; a failed
 * read is reported naming `source` (the file read), or when NULL as a
 * failure of the writer. */
static int add_from_fd(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], int fd, uint64_t size,
                       const char *source, sfs_error_t *err)
{
    uint64_t start;
    int rc = begin_append(w, key, size, &start, err);
    if (rc != SFS_OK)
        return rc;
    int read_errno;
    int got = copy_fd(w, fd, size, &read_errno);
    if (got == -1) {
        rc = io_fail(w, err, "writing an object");
    } else if (got == -2) {
        const char *why = read_errno ? strerror(read_errno) : SHRANK;
        int e = read_errno ? read_errno : EIO;
        rc = source ? sfs_fail(err, SFS_EIO, e, "%s: %s", source, why)
                    : sfs_fail(err, SFS_EIO, e, "%s: reading an object's source: %s", w->path, why);
    }
    if (got < 0) {
        rollback(w, start);
        return rc;
    }
    commit_object(w, key, start, size);
    return SFS_OK;
}

int sfs_writer_add_fd(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], int fd, uint64_t size,
                      sfs_error_t *err)
{
    return add_from_fd(w, key, fd, size, NULL, err);
}

/* ------------------------------------------------------------- add_files */

#define WINDOW 1024        /* files read ahead of the writer, at most... */
#define INFLIGHT (16u << 20) /* ...and bytes they hold, about (a large file: 1 MiB) */
#define CLAIM 4            /* files a reader takes at a time */
#define LAG 32             /* a writer that must wait sleeps until this many more are ready */
#define HASH_CHUNK (1u << 20) /* bytes per read when hashing a large file */
#define MAX_THREADS 64

/* One path being read: filled by a reader thread, consumed by the writer. */
typedef struct job {
    atomic_int ready; /* filled in */
    int kind;         /* an sfs_file_kind */
    int skip;         /* the shard being written, or the excluded file */
    int fd;           /* a large file, left open for the writer; else -1 */
    int sys_errno;    /* != 0: opening or reading failed */
    int shrank;       /* the file ended before its fstat size */
    uint8_t key[SFS_KEY_SIZE];
    uint8_t *data;    /* a small file's bytes: a buffer of `cap` bytes kept from
                       * file to file up to KEEP bytes (malloc'ed) */
    size_t cap;
    uint64_t size;
    uint64_t charge;  /* what it counts in batch.inflight */
} job_t;

#define KEEP (16u << 10)

/* A reader thread's own state. */
typedef struct reader {
    EVP_MD_CTX *ctx;
    uint8_t *chunk;   /* HASH_CHUNK bytes, for large files (malloc'ed when needed) */
    char *dir;        /* the directory of the last path opened... */
    size_t dir_len, dir_cap;
    int dirfd;        /* ...open (O_PATH) to open the next ones in it by name; -1 none */
} reader_t;

typedef struct batch {
    const char *const *paths;
    size_t n;
    uint64_t small;
    dev_t skip_dev[2];
    ino_t skip_ino[2];
    int n_skip;
    EVP_MD *md;
    job_t *jobs;          /* WINDOW jobs (the writer's): path i in jobs[i % WINDOW] */
    /* Jobs are claimed, marked ready and consumed with atomics; the lock
     * and conditions serve only a thread that must sleep: it announces
     * itself (awaited, readers_waiting) before checking again, the other
     * side checks for it after its own store (both sequentially
     * consistent), and signals under the lock. */
    pthread_mutex_t lock;
    pthread_cond_t ready;        /* the job the writer awaits is ready */
    pthread_cond_t room;         /* the writer consumed jobs */
    atomic_size_t next;          /* the next path to claim */
    atomic_size_t consumed;      /* paths the writer is done with */
    atomic_size_t awaited;       /* 1 + the index of the job the writer sleeps on; 0: none */
    atomic_uint_fast64_t inflight; /* bytes held by ready jobs (job.charge) */
    atomic_size_t wake_at;       /* wake sleeping readers once `consumed` reaches it; 0: any */
    atomic_int readers_waiting;
    atomic_int stop;
} batch_t;

static void release_job(job_t *j)
{
    if (j->cap > KEEP) {
        free(j->data);
        j->data = NULL;
        j->cap = 0;
    }
    if (j->fd >= 0)
        close(j->fd);
    j->fd = -1;
    atomic_store_explicit(&j->ready, 0, memory_order_relaxed); /* published by `consumed` */
}

/* Read exactly len bytes at offset 0 on: 0, or -1 with errno (0 when the
 * file ended first). */
static int read_exact(int fd, uint8_t *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        ssize_t got = read(fd, buf + done, len - done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            if (got == 0)
                errno = 0;
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

/* Make j->data hold at least len bytes: 0, or -1 (ENOMEM). */
static int job_room(job_t *j, size_t len)
{
    if (len <= j->cap)
        return 0;
    size_t cap = len < 4096 ? 4096 : len;
    free(j->data);
    j->data = malloc(cap);
    j->cap = j->data ? cap : 0;
    return j->data ? 0 : -1;
}

/* Read to the end of a file into j->data, j->size bytes: 0, or -1 with
 * errno. */
static int read_unsized(int fd, job_t *j)
{
    size_t len = 0;
    if (job_room(j, 4096) < 0)
        return -1;
    for (;;) {
        ssize_t got = read(fd, j->data + len, j->cap - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        len += (size_t)got;
        if (len == j->cap) {
            uint8_t *more = realloc(j->data, 2 * j->cap);
            if (!more)
                return -1;
            j->data = more;
            j->cap *= 2;
        }
    }
    j->size = len;
    return 0;
}

/* open(path) for reading, through the directory of the previous path when
 * it is the same (openat by name: the kernel resolves one component, not
 * the whole path). The path is opened whole when it has no directory part
 * or its directory cannot be opened (the error is then the path's own). */
static int open_source(reader_t *r, const char *path)
{
    const int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    const char *slash = strrchr(path, '/');
    if (!slash || slash == path || !slash[1])
        return open(path, flags);
    size_t len = (size_t)(slash - path);
    if (!r->dir || len != r->dir_len || memcmp(path, r->dir, len) != 0) {
        if (r->dirfd >= 0)
            close(r->dirfd);
        r->dirfd = -1;
        if (len + 1 > r->dir_cap) {
            char *dir = realloc(r->dir, len + 1);
            if (!dir)
                return open(path, flags);
            r->dir = dir;
            r->dir_cap = len + 1;
        }
        memcpy(r->dir, path, len);
        r->dir[len] = 0;
        r->dir_len = len;
        r->dirfd = open(r->dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    return r->dirfd >= 0 ? openat(r->dirfd, slash + 1, flags) : open(path, flags);
}

/* Open, fstat, read and hash paths[i] into j (a reader thread). */
static void read_job(batch_t *b, job_t *j, const char *path, reader_t *r)
{
    j->kind = SFS_FILE_REGULAR;
    j->skip = j->sys_errno = j->shrank = 0;
    j->fd = -1;
    j->size = 0;
    int fd = open_source(r, path);
    if (fd < 0) {
        if (errno == ENXIO) /* a socket */
            j->kind = SFS_FILE_OTHER;
        else
            j->sys_errno = errno;
        return;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        j->sys_errno = errno;
        close(fd);
        return;
    }
    if (!S_ISREG(st.st_mode)) {
        j->kind = S_ISDIR(st.st_mode) ? SFS_FILE_DIRECTORY : SFS_FILE_OTHER;
        close(fd);
        return;
    }
    for (int k = 0; k < b->n_skip; k++)
        if (st.st_dev == b->skip_dev[k] && st.st_ino == b->skip_ino[k]) {
            j->skip = 1;
            close(fd);
            return;
        }
    j->size = (uint64_t)st.st_size;
    EVP_MD_CTX *ctx = r->ctx;
    if (!EVP_DigestInit_ex2(ctx, b->md, NULL)) {
        j->sys_errno = ENOMEM;
        close(fd);
        return;
    }
    if (j->size == 0) {
        /* Empty, or a file whose size says nothing (/proc): read to the end. */
        if (read_unsized(fd, j) < 0)
            j->sys_errno = errno ? errno : ENOMEM;
        else
            EVP_DigestUpdate(ctx, j->data, j->size);
        close(fd);
    } else if (j->size <= b->small) {
        if (job_room(j, (size_t)j->size) < 0)
            j->sys_errno = ENOMEM;
        else if (read_exact(fd, j->data, j->size) < 0) {
            j->shrank = errno == 0;
            j->sys_errno = j->shrank ? EIO : errno;
        } else {
            EVP_DigestUpdate(ctx, j->data, j->size);
        }
        close(fd);
    } else {
        /* Hashed now through pread (the position stays 0), read again by
         * the writer: memory stays bounded whatever the size. */
        if (!r->chunk && !(r->chunk = malloc(HASH_CHUNK))) {
            j->sys_errno = ENOMEM;
            close(fd);
            return;
        }
        uint64_t at = 0;
        while (at < j->size) {
            size_t want = j->size - at < HASH_CHUNK ? (size_t)(j->size - at) : HASH_CHUNK;
            ssize_t got = pread(fd, r->chunk, want, (off_t)at);
            if (got < 0 && errno == EINTR)
                continue;
            if (got <= 0) {
                j->sys_errno = got < 0 ? errno : EIO;
                j->shrank = got == 0;
                close(fd);
                return;
            }
            EVP_DigestUpdate(ctx, r->chunk, (size_t)got);
            at += (uint64_t)got;
        }
        j->fd = fd;
    }
    if (!j->sys_errno && !EVP_DigestFinal_ex(ctx, j->key, NULL))
        j->sys_errno = ENOMEM;
}

/* A reader sleeps until path end - 1 fits in the window (end > 0), or until
 * less than INFLIGHT bytes are held (end == 0: it holds no job then, so the
 * writer cannot be waiting for it). It asks to be woken a quarter window or
 * half the bytes later, not at every file. */
static void wait_room(batch_t *b, size_t end)
{
    pthread_mutex_lock(&b->lock);
    atomic_fetch_add(&b->readers_waiting, 1);
    while (!atomic_load(&b->stop) && (end ? end > atomic_load(&b->consumed) + WINDOW
                                          : atomic_load(&b->inflight) >= INFLIGHT)) {
        size_t at = end ? end - WINDOW + WINDOW / 4 : 0, cur = atomic_load(&b->wake_at);
        if (at && (!cur || at < cur))
            atomic_store(&b->wake_at, at);
        pthread_cond_wait(&b->room, &b->lock);
    }
    atomic_fetch_sub(&b->readers_waiting, 1);
    pthread_mutex_unlock(&b->lock);
}

/* Wake the sleeping readers (the writer). */
static void wake_readers(batch_t *b)
{
    pthread_mutex_lock(&b->lock);
    atomic_store(&b->wake_at, 0);
    pthread_cond_broadcast(&b->room);
    pthread_mutex_unlock(&b->lock);
}

static void *reader_main(void *arg)
{
    batch_t *b = arg;
    reader_t r = {.ctx = EVP_MD_CTX_new(), .dirfd = -1};
    while (!atomic_load(&b->stop)) {
        if (atomic_load(&b->inflight) >= INFLIGHT)
            wait_room(b, 0);
        size_t i = atomic_fetch_add(&b->next, CLAIM);
        if (i >= b->n)
            break;
        size_t end = i + CLAIM < b->n ? i + CLAIM : b->n;
        if (end > atomic_load(&b->consumed) + WINDOW)
            wait_room(b, end);
        for (; i < end && !atomic_load(&b->stop); i++) {
            job_t *j = &b->jobs[i % WINDOW];
            if (r.ctx) {
                read_job(b, j, b->paths[i], &r);
            } else {
                j->kind = SFS_FILE_REGULAR;
                j->fd = -1;
                j->size = 0;
                j->sys_errno = ENOMEM;
                j->shrank = 0;
            }
            /* A large file holds a descriptor: it counts as 1 MiB, which
             * bounds the descriptors open too. */
            j->charge = j->fd >= 0 ? HASH_CHUNK : j->size + sizeof(job_t);
            atomic_fetch_add(&b->inflight, j->charge);
            atomic_store(&j->ready, 1);
            if (atomic_load(&b->awaited) == i + 1) {
                pthread_mutex_lock(&b->lock);
                pthread_cond_signal(&b->ready);
                pthread_mutex_unlock(&b->lock);
            }
        }
    }
    free(r.chunk);
    free(r.dir);
    if (r.dirfd >= 0)
        close(r.dirfd);
    EVP_MD_CTX_free(r.ctx);
    return NULL;
}

/* The writer sleeps until path i is ready. */
static void await_job(batch_t *b, size_t i)
{
    job_t *j = &b->jobs[i % WINDOW];
    if (atomic_load(&b->readers_waiting)) /* whatever they wait for */
        wake_readers(b);
    pthread_mutex_lock(&b->lock);
    atomic_store(&b->awaited, i + 1);
    while (!atomic_load(&j->ready))
        pthread_cond_wait(&b->ready, &b->lock);
    atomic_store(&b->awaited, 0);
    pthread_mutex_unlock(&b->lock);
}

/* The writer's part for one ready job: 1 to go on, 0 to stop (res set), or
 * an error status. */
static int take_job(sfs_writer_t *w, job_t *j, const char *path, size_t i,
                    sfs_add_files_result_t *res, sfs_error_t *err)
{
    if (j->sys_errno)
        return sfs_fail(err, j->sys_errno == ENOMEM ? SFS_ENOMEM : SFS_EIO, j->sys_errno,
                        "%s: %s", path, j->shrank ? SHRANK : strerror(j->sys_errno));
    if (j->kind != SFS_FILE_REGULAR) {
        res->stopped = j->kind;
        return 0;
    }
    if (j->skip)
        return 1;
    if (sfs_writer_contains(w, j->key)) {
        if ((res->n_dups & (res->n_dups - 1)) == 0) { /* 0, 1, 2, 4...: grow */
            size_t cap = res->n_dups ? 2 * res->n_dups : 16;
            size_t *idx = realloc(res->dup_index, cap * sizeof(size_t));
            if (idx)
                res->dup_index = idx;
            uint8_t *keys = idx ? realloc(res->dup_keys, cap * SFS_KEY_SIZE) : NULL;
            if (!keys)
                return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
            res->dup_keys = keys;
        }
        res->dup_index[res->n_dups] = i;
        memcpy(res->dup_keys + SFS_KEY_SIZE * res->n_dups, j->key, SFS_KEY_SIZE);
        res->n_dups++;
        return 1;
    }
    int rc = j->fd < 0 ? sfs_writer_add(w, j->key, j->data, j->size, err)
                       : add_from_fd(w, j->key, j->fd, j->size, path, err);
    return rc == SFS_OK ? 1 : rc;
}

int sfs_writer_add_files(sfs_writer_t *w, const char *const *paths, size_t n, uint64_t small,
                         unsigned threads, int exclude, uint64_t exclude_dev, uint64_t exclude_ino,
                         sfs_add_files_result_t *res, sfs_error_t *err)
{
    memset(res, 0, sizeof(*res));
    if (n == 0)
        return SFS_OK;
    if (!w->jobs) {
        if (!(w->jobs = calloc(WINDOW, sizeof(job_t))))
            return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
        for (int k = 0; k < WINDOW; k++)
            w->jobs[k].fd = -1;
    }
    batch_t *b = calloc(1, sizeof(*b));
    if (!b)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    b->jobs = w->jobs;
    b->paths = paths;
    b->n = n;
    b->small = small;
    struct stat st;
    if (w->regular && fstat(w->fd, &st) == 0) {
        b->skip_dev[b->n_skip] = st.st_dev;
        b->skip_ino[b->n_skip++] = st.st_ino;
    }
    if (exclude) {
        b->skip_dev[b->n_skip] = (dev_t)exclude_dev;
        b->skip_ino[b->n_skip++] = (ino_t)exclude_ino;
    }
    b->md = EVP_MD_fetch(NULL, "SHA256", NULL);
    if (!b->md) {
        free(b);
        return sfs_fail(err, SFS_EINVAL, 0, "OpenSSL has no SHA-256");
    }
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->ready, NULL);
    pthread_cond_init(&b->room, NULL);

    if (threads < 1)
        threads = 1;
    if (threads > MAX_THREADS)
        threads = MAX_THREADS;
    if (threads > n)
        threads = (unsigned)n;
    pthread_t tids[MAX_THREADS];
    unsigned started = 0;
    int rc = SFS_OK;
    for (; started < threads; started++)
        if ((errno = pthread_create(&tids[started], NULL, reader_main, b)) != 0)
            break;
    if (started == 0)
        rc = sfs_fail(err, SFS_ENOMEM, errno, "%s: cannot start a thread: %s", w->path,
                      strerror(errno));

    size_t i = 0;
    for (; rc == SFS_OK && i < n; i++) {
        job_t *j = &b->jobs[i % WINDOW];
        if (!atomic_load(&j->ready)) {
            /* Sleep until a few more are ready, not once per file. */
            await_job(b, i + LAG < n ? i + LAG : n - 1);
            if (!atomic_load(&j->ready))
                await_job(b, i);
        }
        int go = take_job(w, j, paths[i], i, res, err);
        atomic_fetch_sub(&b->inflight, j->charge);
        release_job(j);
        if (go != 1) {
            rc = go == 0 ? SFS_OK : go;
            break;
        }
        atomic_store(&b->consumed, i + 1);
        if (atomic_load(&b->readers_waiting) && i + 1 >= atomic_load(&b->wake_at) &&
            atomic_load(&b->inflight) <= INFLIGHT / 2)
            wake_readers(b);
    }
    res->done = i;

    atomic_store(&b->stop, 1);
    pthread_mutex_lock(&b->lock);
    pthread_cond_broadcast(&b->room);
    pthread_mutex_unlock(&b->lock);
    for (unsigned t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    for (int k = 0; k < WINDOW; k++) /* read ahead past a stop or an error */
        if (atomic_load(&b->jobs[k].ready))
            release_job(&b->jobs[k]);
    pthread_cond_destroy(&b->room);
    pthread_cond_destroy(&b->ready);
    pthread_mutex_destroy(&b->lock);
    EVP_MD_free(b->md);
    free(b);
    if (rc != SFS_OK) {
        free(res->dup_index);
        free(res->dup_keys);
        res->dup_index = NULL;
        res->dup_keys = NULL;
        res->n_dups = 0;
    }
    return rc;
}

/* ------------------------------------------------------------ key source */

static const uint8_t ZERO_KEY[SFS_KEY_SIZE];

static int src_read(void *data, char **key, cmph_uint32 *keylen)
{
    sfs_writer_t *w = data;
    /* An empty shard is hashed over the single all-zero key (the empty-slot
     * key), so that its index has slots and every lookup lands on an empty
     * one: cmph cannot build a function over no key at all. */
    *key = w->count ? (char *)entry_at(w, w->cursor)->key : (char *)ZERO_KEY;
    w->cursor++;
    *keylen = SFS_KEY_SIZE;
    return SFS_KEY_SIZE;
}

static void src_dispose(void *data, char *key, cmph_uint32 keylen) {}

/* The same keys for chd_build.c. */
static const uint8_t *key_at(void *data, uint32_t i)
{
    sfs_writer_t *w = data;
    return w->count ? entry_at(w, i)->key : ZERO_KEY;
}

static void src_rewind(void *data) { ((sfs_writer_t *)data)->cursor = 0; }

/* ---------------------------------------------------------------- finish */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The perfect hash over the writer's keys, as finish() builds, checks and
 * writes it. */
typedef struct hash {
    char *dump;           /* the function as cmph_dump() writes it (malloc'ed) */
    size_t dump_len;
    cmph_t *mph;          /* cmph's: its builder's, or the dump loaded back */
    sfs_chd_t chd;        /* our evaluator, over dump */
    uint64_t slots;
    uint32_t *slot_entry; /* the entry in each slot, UINT32_MAX for none (malloc'ed) */
} hash_t;

static void free_hash(hash_t *hs)
{
    free(hs->slot_entry);
    free(hs->dump);
    if (hs->mph)
        cmph_destroy(hs->mph);
}

/* Build with cmph: hs->mph and its dump in hs->dump. `ours_failed` is why
 * our builder failed before ("" when it was not tried): an error names it. */
static int build_cmph(sfs_writer_t *w, hash_t *hs, const char *ours_failed, sfs_error_t *err)
{
    cmph_io_adapter_t source = {
        .data = w,
        .nkeys = (cmph_uint32)(w->count ? w->count : 1),
        .read = src_read,
        .dispose = src_dispose,
        .rewind = src_rewind,
    };
    cmph_config_t *config = cmph_config_new(&source);
    if (!config)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    cmph_config_set_algo(config, CMPH_CHD_PH);
    cmph_config_set_graphsize(config, 0.99);
    cmph_config_set_keys_per_bin(config, 1);
    cmph_config_set_b(config, 4);
    hs->mph = cmph_new(config);
    cmph_config_destroy(config);
    if (!hs->mph && *ours_failed)
        return sfs_fail(err, SFS_EHASH, 0, "%s: %s; cmph could not build one either", w->path,
                        ours_failed);
    if (!hs->mph)
        return sfs_fail(err, SFS_EHASH, 0, "%s: cmph could not build the perfect hash over %llu "
                        "keys", w->path, (unsigned long long)w->count);
    /* A memory stream fails only when it cannot grow (cmph_dump itself
     * ignores its write errors: ferror tells). */
    FILE *mem = open_memstream(&hs->dump, &hs->dump_len);
    if (!mem)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    int dumped = cmph_dump(hs->mph, mem) == 1 && !ferror(mem);
    if (fclose(mem) != 0 || !dumped)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory writing cmph's perfect hash "
                        "into memory (cmph_dump or fclose of its memory stream failed)", w->path);
    return SFS_OK;
}

/* Build with chd_build.c: hs->dump. SFS_EHASH when no seed worked, the
 * reason in why (the caller then tries cmph). */
static int build_ours(sfs_writer_t *w, hash_t *hs, char *why, size_t why_size, sfs_error_t *err)
{
    sfs_chd_built_t built;
    int rc = sfs_chd_build(key_at, w, w->count ? w->count : 1, SFS_KEY_SIZE, NULL, &built, why,
                           why_size);
    if (rc == SFS_CHD_BUILD_NOMEM)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: %s", w->path, why);
    if (rc != SFS_CHD_BUILD_OK)
        return sfs_fail(err, SFS_EHASH, 0, "%s: %s", w->path, why);
    hs->dump = (char *)built.dump;
    hs->dump_len = built.dump_len;
    return SFS_OK;
}

/* cmph's builder instead of ours (bench/bench_build.py times both, and a way out
 * should ours ever misbehave): SHARDFS_CHD_BUILDER=cmph. */
static int want_cmph_builder(void)
{
    const char *v = getenv("SHARDFS_CHD_BUILDER");
    return v && strcmp(v, "cmph") == 0;
}

/* The perfect hash over the keys into hs (dump, and mph when cmph built
 * it): ours, or cmph's when asked for or when ours finds no seed. */
static int build_hash(sfs_writer_t *w, hash_t *hs, sfs_build_stats_t *stats, sfs_error_t *err)
{
    char why[200] = "";
    stats->builder = "shardfs";
    if (!want_cmph_builder()) {
        int rc = build_ours(w, hs, why, sizeof(why), err);
        if (rc != SFS_EHASH)
            return rc;
    }
    stats->builder = "cmph";
    return build_cmph(w, hs, why, err);
}

/* hs->mph: the dump (built by ours) loaded back by cmph_load, as
 * swh-shard's reader loads it. */
static int load_cmph(sfs_writer_t *w, hash_t *hs, sfs_error_t *err)
{
    FILE *mem = fmemopen(hs->dump, hs->dump_len, "r");
    if (!mem) {
        int e = errno;
        return sfs_fail(err, e == ENOMEM ? SFS_ENOMEM : SFS_EIO, e, "%s: fmemopen of the perfect "
                        "hash for cmph_load: %s", w->path, strerror(e));
    }
    hs->mph = cmph_load(mem);
    if (fclose(mem) != 0) {
        int e = errno;
        return sfs_fail(err, SFS_EIO, e, "%s: fclose of the perfect hash read by cmph_load: %s",
                        w->path, strerror(e));
    }
    if (!hs->mph)
        return sfs_fail(err, SFS_EHASH, 0, "%s: cmph cannot load the perfect hash built",
                        w->path);
    return SFS_OK;
}

/* Every key is checked before anything is written: cmph (as swh-shard's
 * reader evaluates the function) and our evaluator (the one our readers
 * use) must agree on it, inside the index, and no slot may be used twice.
 * The dump is validated by our parser first, then loaded by cmph. A
 * disagreement costs a failed build, not an unreadable shard. Sets
 * hs->chd, hs->slots and hs->slot_entry. */
static int check_hash(sfs_writer_t *w, hash_t *hs, const char *builder, sfs_error_t *err)
{
    char why[256] = "";
    if (sfs_chd_parse(&hs->chd, (const uint8_t *)hs->dump, hs->dump_len, why, sizeof(why)) < 0)
        return sfs_fail(err, SFS_EHASH, 0, "%s: the perfect hash built (%s) cannot be read: %s",
                        w->path, builder, why);
    int rc = hs->mph ? SFS_OK : load_cmph(w, hs, err);
    if (rc != SFS_OK)
        return rc;
    const uint64_t slots = hs->slots = cmph_size(hs->mph);
    if (hs->chd.n != slots)
        return sfs_fail(err, SFS_EHASH, 0, "%s: cmph and our parser disagree on the slot count "
                        "(%llu and %u)", w->path, (unsigned long long)slots, hs->chd.n);
    uint32_t *slot_entry = hs->slot_entry = malloc(slots * sizeof(uint32_t));
    if (!slot_entry)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    memset(slot_entry, 0xff, slots * sizeof(uint32_t));
    cmph_t *mph = hs->mph;
    const sfs_chd_t *chd = &hs->chd;
    for (uint64_t i = 0; i < w->count; i++) {
        const uint8_t *key = entry_at(w, i)->key;
        cmph_uint32 s = cmph_search(mph, (const char *)key, SFS_KEY_SIZE);
        if (s >= slots || slot_entry[s] != UINT32_MAX || sfs_chd_search(chd, key, SFS_KEY_SIZE) != s)
            return sfs_fail(err, SFS_EHASH, 0, "%s: perfect hash inconsistent at key %llu",
                            w->path, (unsigned long long)i);
        slot_entry[s] = (uint32_t)i;
    }
    return SFS_OK;
}

/* Append the index (a slot per hash value) and the dump; sets the
 * header's index_size and hash_position. */
static int write_index(sfs_writer_t *w, const hash_t *hs, sfs_header_t *h, sfs_error_t *err)
{
    h->index_size = hs->slots * SFS_SLOT_SIZE;
    for (uint64_t s = 0; s < hs->slots; s++) {
        uint8_t slot[SFS_SLOT_SIZE] = {0};
        uint64_t off = SFS_EMPTY_OFFSET;
        if (hs->slot_entry[s] != UINT32_MAX) {
            const entry_t *e = entry_at(w, hs->slot_entry[s]);
            memcpy(slot, e->key, SFS_KEY_SIZE);
            off = e->offset;
        }
        off = __builtin_bswap64(off);
        memcpy(slot + SFS_KEY_SIZE, &off, 8);
        if (append(w, slot, sizeof(slot)) < 0)
            return io_fail(w, err, "writing the index");
    }
    h->hash_position = pos(w);
    if (append(w, hs->dump, hs->dump_len) < 0 || flush(w) < 0)
        return io_fail(w, err, "writing the hash");
    return SFS_OK;
}

/* Write the header block at byte 0 (last: until then the file has no
 * magic), cut a regular file after the hash, fdatasync. */
static int write_header_and_sync(sfs_writer_t *w, const sfs_header_t *h, sfs_error_t *err)
{
    uint8_t head[SFS_OBJECTS_POSITION] = {0};
    memcpy(head, SFS_MAGIC, sizeof(SFS_MAGIC) - 1);
    uint64_t fields[7] = {h->version, h->objects_count, h->objects_position, h->objects_size,
                          h->index_position, h->index_size, h->hash_position};
    for (int i = 0; i < 7; i++) {
        uint64_t v = __builtin_bswap64(fields[i]);
        memcpy(head + SFS_MAGIC_SIZE + 8 * i, &v, 8);
    }
    if (sfs_pwrite_all(w->fd, head, sizeof(head), 0) < 0)
        return io_fail(w, err, "writing the header");
    if (w->regular && ftruncate(w->fd, (off_t)w->flushed) < 0)
        return io_fail(w, err, "truncating");
    if (fdatasync(w->fd) < 0 && errno != EINVAL && errno != EROFS)
        return io_fail(w, err, "fdatasync");
    return SFS_OK;
}

/* Everything but publishing: the hash built and checked, index, hash and
 * header written, the file synced. The timings into stats, but for
 * sync_seconds (sfs_writer_finish's). */
static int finish(sfs_writer_t *w, sfs_build_stats_t *stats, sfs_error_t *err)
{
    double t0 = now();
    if (flush(w) < 0)
        return io_fail(w, err, "writing objects");
    sfs_header_t h = {
        .version = SFS_VERSION,
        .objects_count = w->count,
        .objects_position = SFS_OBJECTS_POSITION,
        .objects_size = w->flushed - SFS_OBJECTS_POSITION,
        .index_position = w->flushed,
    };

    /* The duplicate table is not needed any more: free it before the build. */
    free(w->table);
    w->table = NULL;
    w->table_cap = 0;

    hash_t hs = {0};
    double tb = now();
    int rc = build_hash(w, &hs, stats, err);
    double t1 = now();
    if (rc == SFS_OK)
        rc = check_hash(w, &hs, stats->builder, err);
    double t2 = now();
    if (rc == SFS_OK)
        rc = write_index(w, &hs, &h, err);
    double t3 = now();
    if (rc == SFS_OK)
        rc = write_header_and_sync(w, &h, err);
    if (rc == SFS_OK) {
        stats->hash_seconds = t1 - tb;
        stats->check_seconds = t2 - t1;
        stats->index_seconds = (tb - t0) + (t3 - t2);
        stats->slots = hs.slots;
    }
    free_hash(&hs);
    return rc;
}

static void free_writer(sfs_writer_t *w)
{
    for (int k = 0; w->jobs && k < WINDOW; k++)
        free(w->jobs[k].data);
    free(w->jobs);
    for (uint64_t i = 0; i < w->nblocks; i++)
        free(w->blocks[i]);
    free(w->blocks);
    free(w->table);
    free(w->buf);
    free(w->tmp_path);
    free(w->path);
    free(w);
}

int sfs_writer_finish(sfs_writer_t *w, sfs_build_stats_t *stats, sfs_error_t *err)
{
    sfs_build_stats_t local;
    if (!stats)
        stats = &local;
    double t = now();
    int rc = finish(w, stats, err);
    if (rc == SFS_OK && w->regular) {
        if (sfs_output_publish(w->fd, &w->tmp_path, w->path) < 0)
            rc = io_fail(w, err, "publishing");
        else
            sfs_sync_directory(w->path);
    }
    if (rc == SFS_OK)
        stats->sync_seconds = now() - t - stats->hash_seconds - stats->check_seconds -
                              stats->index_seconds;
    if (close(w->fd) < 0 && rc == SFS_OK)
        rc = io_fail(w, err, "close");
    w->fd = -1;
    if (rc != SFS_OK && w->tmp_path)
        unlink(w->tmp_path);
    free_writer(w);
    return rc;
}

void sfs_writer_abort(sfs_writer_t *w)
{
    if (!w)
        return;
    if (w->fd >= 0)
        close(w->fd);
    if (w->tmp_path)
        unlink(w->tmp_path);
    free_writer(w);
}
