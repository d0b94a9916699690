/*
 * kind_file.c — the "file" kind (kind.h): a shard in a regular file or a
 * block device, any path sfs_open() is given that no other kind claims.
 *
 * The whole extent [0, end of the hash section) is mmap'ed read-only
 * once: object sizes are the size fields in the mapping, small objects are
 * copied from it, larger ones read with pread() (one device request).
 */
#define _GNU_SOURCE
#include "chd.h"
#include "internal.h"
#include "kind.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)

static int file_claims(const char *source) { return 1; }

static int file_open(sfs_shard_t *s, sfs_error_t *err)
{
    const char *path = s->path;
    int rc;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; the file type
     * is checked right after, and the flag cleared for the rest. */
    s->fd = open(path, (s->writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK);
    if (s->fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    int is_blk;
    if ((rc = sfs_fd_size(s->fd, path, &s->file_size, &is_blk, err)) != SFS_OK)
        return rc;
    fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) & ~O_NONBLOCK);
    uint8_t magic[4];
    if (s->file_size >= sizeof(magic) && pread(s->fd, magic, sizeof(magic), 0) == (ssize_t)sizeof(magic) &&
        memcmp(magic, "\x1a\x45\xdf\xa3", sizeof(magic)) == 0)
        return SFS_EKIND; /* EBML: a MOSAIC file (kind_mosaic.c) */
    if (s->file_size < SFS_HEADER_END)
        return CORRUPT("%s: truncated: %llu bytes, smaller than the 88-byte header", path,
                       (unsigned long long)s->file_size);
    uint8_t raw[SFS_HEADER_END];
    ssize_t got = pread(s->fd, raw, sizeof(raw), 0);
    if (got != (ssize_t)sizeof(raw))
        return sfs_fail(err, SFS_EIO, got < 0 ? errno : EIO, "%s: reading the header: %s", path,
                        got < 0 ? strerror(errno) : "short read");
    if ((rc = sfs_validate_header(s, raw, err)) != SFS_OK)
        return rc;

    /* The dump's own length fields give the extent; read its fixed prefix. */
    uint8_t prefix[31];
    uint64_t avail = s->file_size - s->header.hash_position;
    size_t want = avail < sizeof(prefix) ? (size_t)avail : sizeof(prefix);
    got = pread(s->fd, prefix, want, (off_t)s->header.hash_position);
    if (got != (ssize_t)want)
        return sfs_fail(err, SFS_EIO, got < 0 ? errno : EIO, "%s: reading the hash section: %s",
                        path, got < 0 ? strerror(errno) : "short read");
    uint64_t dump = sfs_chd_dump_size(prefix, want);
    if (dump == 0)
        return CORRUPT("%s: hash section at byte %llu is not a CHD_PH perfect hash (or is "
                       "truncated)",
                       path, (unsigned long long)s->header.hash_position);
    if (dump > avail)
        return CORRUPT("%s: truncated: the hash section needs %llu bytes, the file has %llu after "
                       "hash_position",
                       path, (unsigned long long)dump, (unsigned long long)avail);
    s->extent = s->header.hash_position + dump;
    void *m = mmap(NULL, s->extent, PROT_READ, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED)
        return sfs_fail(err, SFS_EIO, errno, "%s: mmap: %s", path, strerror(errno));
    s->map = m;
    s->map_size = s->extent;
    /* Random lookups: do not read ahead objects and index. Every lookup
     * evaluates the hash: start reading it now. */
    madvise((void *)s->map, s->extent, MADV_RANDOM);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t hash_page = s->header.hash_position & ~(page - 1);
    madvise((void *)(s->map + hash_page), s->extent - hash_page, MADV_WILLNEED);
    char why[256];
    if (sfs_chd_parse(&s->chd, s->map + s->header.hash_position, dump, why, sizeof(why)) < 0)
        return CORRUPT("%s: %s", path, why);
    if (s->chd.n != s->slots)
        return CORRUPT("%s: the perfect hash has %u slots but header field index_size gives %llu",
                       path, s->chd.n, (unsigned long long)s->slots);
    return SFS_OK;
}

/* The object's size field, in the mapping. */
static uint64_t file_object_size(const sfs_shard_t *s, uint64_t slot, uint64_t offset)
{
    return be64(s->map + offset);
}

static int file_object_size_nowait(const sfs_shard_t *s, uint64_t slot, uint64_t offset, uint64_t *size)
{
    uint8_t be[SFS_SIZE_FIELD_SIZE];
    int rc = sfs_page_cache_read(s, be, SFS_SIZE_FIELD_SIZE, offset);
    if (rc == SFS_OK)
        *size = be64(be);
    return rc;
}

static void file_prefetch_size(const sfs_shard_t *s, uint64_t slot, uint64_t offset, int cold)
{
    if (cold) {
        posix_fadvise(s->fd, (off_t)offset, 4096, POSIX_FADV_WILLNEED);
    } else {
        __builtin_prefetch(s->map + offset, 0, 0);
        __builtin_prefetch(s->map + offset + SFS_SIZE_FIELD_SIZE - 1, 0, 0);
    }
}

static const uint8_t *file_data(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    return s->map + offset;
}

/* Up to this many bytes are copied from the mapping: no system call when
 * cached, and a cold page fault reads one 4 KiB page (MADV_RANDOM). Longer
 * ranges are read with pread(), which asks the device for the whole range
 * at once instead of one page per fault: a cold 64 KiB object costs about 2
 * device reads instead of 17 (bench/bench_lookup.py, medium cold). */
#define MMAP_COPY_MAX (16 * 1024)

static int file_read(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    if (length <= MMAP_COPY_MAX) {
        memcpy(dst, s->map + offset, length);
        return SFS_OK;
    }
    uint8_t *d = dst;
    while (length) {
        ssize_t n = pread(s->fd, d, length, (off_t)offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO; /* the file shrank under us */
            return SFS_EIO;
        }
        d += n;
        offset += (uint64_t)n;
        length -= (size_t)n;
    }
    return SFS_OK;
}

static int file_read_nowait(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    return sfs_page_cache_read(s, dst, length, offset);
}

static void file_prefetch(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    posix_fadvise(s->fd, (off_t)offset, (off_t)length, POSIX_FADV_WILLNEED);
}

/* A copy of a large range, or 8 copies of small ones, that took longer
 * than this plus 0.5 ns per byte copied (2 GB/s, slower than any copy
 * from the page cache) waited for the device: the rest of the batch is
 * then asked of the kernel at once (posix_fadvise), so that its reads
 * overlap. */
#define BATCH_SLOW_NS 20000
/* Ranges longer than this are timed one by one. */
#define BATCH_LARGE 16384
/* Ranges whose first bytes are prefetched into the CPU cache ahead of
 * their copy, and how many of their bytes. */
#define COPY_AHEAD 4
#define PREFETCH_BYTES 128

static void file_read_batch(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                            void *const *dsts, int *results)
{
    int cold = 0, first_errno = 0;
    uint64_t t0 = sfs_now_ns(), bytes = 0;
    for (size_t i = 0; i < n; i++) {
        if (!cold && i + COPY_AHEAD < n && results[i + COPY_AHEAD] == SFS_OK) {
            const uint8_t *p = s->map + offsets[i + COPY_AHEAD];
            for (uint64_t at = 0; at < lengths[i + COPY_AHEAD] && at < PREFETCH_BYTES; at += 64)
                __builtin_prefetch(p + at, 0, 0);
        }
        int wanted = results[i] == SFS_OK;
        if (wanted) {
            results[i] = file_read(s, offsets[i], dsts[i], lengths[i]);
            if (results[i] != SFS_OK && !first_errno)
                first_errno = errno;
            bytes += lengths[i];
        }
        /* timed per copy while copies are large, else per group of 8 */
        if (!cold && ((i & 7) == 7 || (wanted && lengths[i] > BATCH_LARGE))) {
            uint64_t t = sfs_now_ns();
            if (t - t0 > BATCH_SLOW_NS + bytes / 2) {
                cold = 1;
                for (size_t j = i + 1; j < n; j++)
                    if (results[j] == SFS_OK && lengths[j])
                        file_prefetch(s, offsets[j], lengths[j]);
            }
            t0 = t;
            bytes = 0;
        }
    }
    if (first_errno)
        errno = first_errno;
}

/* Through the caller's descriptor of the file. */
static ssize_t file_source_read(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (uint8_t *)buf + done, len - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (ssize_t)done;
}

/* Nothing of its own to release (sfs_close unmaps and closes fd); no
 * connection, so no source_error. */
const sfs_kind_t sfs_kind_file = {
    .name = "file",
    .flags = 0,
    .state_size = 0,
    .claims = file_claims,
    .open = file_open,
    .object_size = file_object_size,
    .object_size_nowait = file_object_size_nowait,
    .prefetch_size = file_prefetch_size,
    .data = file_data,
    .read = file_read,
    .read_nowait = file_read_nowait,
    .read_batch = file_read_batch,
    .prefetch = file_prefetch,
    .source_read = file_source_read,
};
