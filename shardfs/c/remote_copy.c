/*
 * remote_copy.c — the local copy of a shard read over a network (remote_copy.h).
 *
 * The local copy of a remote source (an rbd: image, an s3: object) is a sparse file
 * laid out like the shard: bytes [0, min(objects_position, 64 KiB)) and the
 * index and hash sections at their own offsets, the objects section a hole;
 * then, at the extent rounded up to 4 KiB, each slot's object size (u64
 * little-endian; 2^64-1 for an empty slot); then a 64-byte trailer:
 *   bytes  0..8   magic "SFSRBDC1"     bytes  8..12  u32 version = 1
 *   bytes 16..24  u64 extent           bytes 24..32  u64 sizes_offset
 *   bytes 32..40  u64 slot count       bytes 40..48  u64 image size (bytes)
 * Written whole (O_TMPFILE, fdatasync, rename) by sfs_copy_build; checked
 * by sfs_copy_open. The magic keeps its first kind's name: copies of rbd:
 * images made before s3: sources existed stay valid. Each kind checks at
 * every connection that the source is still the one copied (rbd: its
 * header, sfs_rbd_new's `expect`; s3: its ETag), so a replaced source fails
 * reads with ESTALE instead of serving the copy's sizes with another
 * shard's bytes. */
#define _GNU_SOURCE
#include "remote_copy.h"
#include "chd.h"
#include "internal.h"
#include "kind.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)

#define COPY_MAGIC "SFSRBDC1"
#define COPY_TRAILER 64
#define COPY_HEAD_MAX 65536          /* bytes before the objects copied at most */
#define COPY_CHUNK SFS_COPY_CHUNK   /* bytes per read while copying */
#define COPY_SIZE_BATCH 256          /* size fields read at once when they must be */
#define COPY_SAMPLES 64              /* size fields checked against the offsets */

static uint64_t align_page(uint64_t v) { return (v + 4095) & ~(uint64_t)4095; }

typedef struct {
    uint64_t offset;
    uint32_t slot;
} live_slot_t;

static int by_offset(const void *a, const void *b)
{
    uint64_t x = ((const live_slot_t *)a)->offset, y = ((const live_slot_t *)b)->offset;
    return x < y ? -1 : x > y;
}

/* Read the size fields of live[0, n) from the source into sizes (by slot). */
static int read_size_fields(const sfs_remote_ops_t *ops, void *conn, const live_slot_t *live, size_t n, uint8_t *sizes,
                            const char *src, sfs_error_t *err)
{
    uint64_t offs[COPY_SIZE_BATCH];
    size_t lens[COPY_SIZE_BATCH];
    uint8_t raw[COPY_SIZE_BATCH][8];
    void *bufs[COPY_SIZE_BATCH];
    int64_t got[COPY_SIZE_BATCH];
    for (size_t i = 0; i < n; i += COPY_SIZE_BATCH) {
        size_t k = n - i < COPY_SIZE_BATCH ? n - i : COPY_SIZE_BATCH;
        for (size_t j = 0; j < k; j++) {
            offs[j] = live[i + j].offset;
            lens[j] = 8;
            bufs[j] = raw[j];
        }
        int rc = ops->pread_many(conn, k, offs, lens, bufs, got);
        for (size_t j = 0; j < k; j++) {
            int e = rc < 0 ? -rc : got[j] < 0 ? (int)-got[j] : got[j] != 8 ? EIO : 0;
            if (e)
                return sfs_fail(err, SFS_EIO, e, "%s: reading size fields: %s", src, strerror(e));
            put_le64(sizes + 8 * (uint64_t)live[i + j].slot, be64(raw[j]));
        }
    }
    return SFS_OK;
}

int sfs_copy_directories(const char *src, const char *copy_path, sfs_error_t *err)
{
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", copy_path);
    for (char *at = strchr(dir + 1, '/'); at; at = strchr(at + 1, '/')) {
        *at = 0;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST)
            return sfs_fail(err, SFS_EIO, errno, "%s: creating %s: %s", src, dir, strerror(errno));
        *at = '/';
    }
    return SFS_OK;
}

int sfs_copy_range(const char *src, const sfs_remote_ops_t *ops, void *conn, int fd, uint64_t from, uint64_t to,
                   uint8_t *buf, sfs_error_t *err)
{
    for (uint64_t at = from; at < to;) {
        size_t len = to - at < COPY_CHUNK ? (size_t)(to - at) : COPY_CHUNK;
        int64_t got = ops->pread(conn, buf, len, at);
        if (got != (int64_t)len) {
            int e = got < 0 ? (int)-got : EIO;
            return sfs_fail(err, SFS_EIO, e, "%s: copying byte %llu: %s", src, (unsigned long long)at, strerror(e));
        }
        if (sfs_pwrite_all(fd, buf, len, at) < 0)
            return sfs_fail(err, SFS_EIO, errno, "%s: writing its local copy: %s", src, strerror(errno));
        at += len;
    }
    return SFS_OK;
}

int sfs_copy_build(const char *src, const sfs_remote_ops_t *ops, void *conn, uint64_t size, const char *copy_path,
                   sfs_error_t *err)
{
    sfs_shard_t t = {.fd = -1, .path = (char *)src};
    uint8_t *buf = NULL, *index = NULL, *sizes = NULL;
    live_slot_t *live = NULL;
    char *tmp = NULL;
    int fd = -1, rc;
    t.file_size = size;
    uint8_t raw[SFS_HEADER_END], prefix[31];
    int64_t got = size < SFS_HEADER_END ? 0 : ops->pread(conn, raw, sizeof(raw), 0);
    if (got < 0) {
        rc = sfs_fail(err, SFS_EIO, (int)-got, "%s: reading the header: %s", src, strerror((int)-got));
        goto out;
    }
    if (got != SFS_HEADER_END) {
        rc = CORRUPT("%s: truncated: %llu bytes, smaller than the 88-byte header", src,
                     (unsigned long long)size);
        goto out;
    }
    if ((rc = sfs_validate_header(&t, raw, err)) != SFS_OK)
        goto out;
    const sfs_header_t *h = &t.header;
    uint64_t avail = size - h->hash_position;
    size_t want = avail < sizeof(prefix) ? (size_t)avail : sizeof(prefix);
    got = ops->pread(conn, prefix, want, h->hash_position);
    if (got != (int64_t)want) {
        int e = got < 0 ? (int)-got : EIO;
        rc = sfs_fail(err, SFS_EIO, e, "%s: reading the hash section: %s", src, strerror(e));
        goto out;
    }
    uint64_t dump = sfs_chd_dump_size(prefix, want);
    if (dump == 0 || dump > avail) {
        rc = CORRUPT("%s: hash section at byte %llu is not a whole CHD_PH perfect hash", src,
                     (unsigned long long)h->hash_position);
        goto out;
    }
    uint64_t extent = h->hash_position + dump, sizes_offset = align_page(extent);
    uint64_t total = sizes_offset + 8 * t.slots + COPY_TRAILER;

    if ((rc = sfs_copy_directories(src, copy_path, err)) != SFS_OK ||
        (rc = sfs_output_create(copy_path, 0644, &fd, &tmp, err)) != SFS_OK)
        goto out;
    if (ftruncate(fd, (off_t)total) < 0)
        goto io;
    if (!(buf = malloc(COPY_CHUNK)))
        goto nomem;
    /* the bytes before the objects, then the index and the hash sections */
    uint64_t head = h->objects_position < COPY_HEAD_MAX ? h->objects_position : SFS_HEADER_END;
    if ((rc = sfs_copy_range(src, ops, conn, fd, 0, head, buf, err)) != SFS_OK ||
        (rc = sfs_copy_range(src, ops, conn, fd, h->index_position, extent, buf, err)) != SFS_OK)
        goto out;

    /* each slot's object size: from the gaps between the objects' offsets
     * when the objects lie back to back (the writers' layout, checked on a
     * sample), else read from each size field */
    index = malloc(h->index_size > COPY_CHUNK ? COPY_CHUNK : h->index_size);
    sizes = malloc(8 * t.slots);
    live = malloc(sizeof(*live) * (t.slots ? t.slots : 1));
    if (!index || !sizes || !live)
        goto nomem;
    memset(sizes, 0xff, 8 * t.slots);
    /* every slot must be empty or hold a key the perfect hash sends there,
     * at an offset inside the objects section: an image still being
     * written (rbd import) or damaged is refused, not copied */
    uint8_t *hash = malloc(dump);
    if (!hash)
        goto nomem;
    char why[256];
    if (sfs_pread_full(fd, hash, dump, h->hash_position) < 0) {
        free(hash);
        goto io;
    }
    if (sfs_chd_parse(&t.chd, hash, dump, why, sizeof(why)) < 0 || t.chd.n != t.slots) {
        free(hash);
        rc = CORRUPT("%s: %s", src, t.chd.n != t.slots ? "the perfect hash's slot count differs from the index's" : why);
        goto out;
    }
    size_t n = 0;
    for (uint64_t first = 0; first < t.slots && rc == SFS_OK;) {
        uint64_t count = t.slots - first;
        if (count > COPY_CHUNK / SFS_SLOT_SIZE)
            count = COPY_CHUNK / SFS_SLOT_SIZE;
        if (sfs_pread_full(fd, index, count * SFS_SLOT_SIZE,
                           h->index_position + first * SFS_SLOT_SIZE) < 0) {
            free(hash);
            goto io;
        }
        for (uint64_t i = 0; i < count; i++) {
            const uint8_t *slot = index + i * SFS_SLOT_SIZE;
            uint64_t off = be64(slot + SFS_KEY_SIZE);
            if (off == SFS_EMPTY_OFFSET)
                continue;
            if (off < h->objects_position || off > t.objects_end ||
                t.objects_end - off < SFS_SIZE_FIELD_SIZE ||
                sfs_chd_search(&t.chd, slot, SFS_KEY_SIZE) != first + i) {
                rc = CORRUPT("%s: slot %llu does not hold a valid entry (an image still being "
                             "written, or a damaged shard): not copied",
                             src, (unsigned long long)(first + i));
                break;
            }
            live[n++] = (live_slot_t){off, (uint32_t)(first + i)};
        }
        first += count;
    }
    free(hash);
    if (rc != SFS_OK)
        goto out;
    qsort(live, n, sizeof(*live), by_offset);
    int packed = n == h->objects_count && (n == 0 || live[0].offset == h->objects_position);
    for (size_t i = 0; packed && i < n; i++) {
        uint64_t end = i + 1 < n ? live[i + 1].offset : t.objects_end;
        if (end < live[i].offset + SFS_SIZE_FIELD_SIZE)
            packed = 0;
        else
            put_le64(sizes + 8 * (uint64_t)live[i].slot, end - live[i].offset - SFS_SIZE_FIELD_SIZE);
    }
    if (packed && n) {
        live_slot_t sample[COPY_SAMPLES];
        size_t k = n < COPY_SAMPLES ? n : COPY_SAMPLES;
        uint8_t *check = malloc(8 * t.slots);
        if (!check)
            goto nomem;
        for (size_t j = 0; j < k; j++)
            sample[j] = live[(uint64_t)j * n / k];
        rc = read_size_fields(ops, conn, sample, k, check, src, err);
        for (size_t j = 0; rc == SFS_OK && j < k; j++)
            packed &= !memcmp(check + 8 * (uint64_t)sample[j].slot,
                              sizes + 8 * (uint64_t)sample[j].slot, 8);
        free(check);
        if (rc != SFS_OK)
            goto out;
    }
    if (!packed && (rc = read_size_fields(ops, conn, live, n, sizes, src, err)) != SFS_OK)
        goto out;
    if (sfs_pwrite_all(fd, sizes, 8 * t.slots, sizes_offset) < 0)
        goto io;
    uint8_t trailer[COPY_TRAILER] = {0};
    memcpy(trailer, COPY_MAGIC, 8);
    put_le32(trailer + 8, 1);
    put_le64(trailer + 16, extent);
    put_le64(trailer + 24, sizes_offset);
    put_le64(trailer + 32, t.slots);
    put_le64(trailer + 40, size);
    if (sfs_pwrite_all(fd, trailer, sizeof(trailer), total - COPY_TRAILER) < 0 || fdatasync(fd) < 0)
        goto io;
    if (sfs_output_publish(fd, &tmp, copy_path) < 0)
        goto io;
    sfs_sync_directory(copy_path);
    rc = SFS_OK;
    goto out;
io:
    rc = sfs_fail(err, SFS_EIO, errno, "%s: writing its local copy %s: %s", src, copy_path,
                  strerror(errno));
    goto out;
nomem:
    rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", src);
out:
    sfs_output_discard(fd, &tmp);
    free(buf);
    free(index);
    free(sizes);
    free(live);
    return rc;
}

int sfs_copy_open(sfs_shard_t *s, const char *copy_path, const uint8_t **sizes, uint64_t *sizes_offset_out,
                  uint8_t raw_out[SFS_HEADER_END], sfs_error_t *err)
{
    const char *src = s->path;
    s->fd = open(copy_path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0)
        return errno == ENOENT ? SFS_ENOTFOUND
                               : sfs_fail(err, SFS_EIO, errno, "%s: its local copy %s: %s", src,
                                          copy_path, strerror(errno));
    struct stat st;
    uint8_t trailer[COPY_TRAILER], raw[SFS_HEADER_END], prefix[31];
    if (fstat(s->fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size < COPY_TRAILER + SFS_HEADER_END ||
        sfs_pread_full(s->fd, trailer, COPY_TRAILER, (uint64_t)st.st_size - COPY_TRAILER) < 0 ||
        memcmp(trailer, COPY_MAGIC, 8) || get_le32(trailer + 8) != 1 ||
        sfs_pread_full(s->fd, raw, sizeof(raw), 0) < 0)
        return SFS_ENOTFOUND;
    uint64_t extent = get_le64(trailer + 16), sizes_offset = get_le64(trailer + 24);
    uint64_t slots = get_le64(trailer + 32);
    s->file_size = get_le64(trailer + 40);
    sfs_error_t why;
    if (sfs_validate_header(s, raw, &why) != SFS_OK || slots != s->slots ||
        sizes_offset != align_page(extent) || extent > s->file_size || extent <= s->header.hash_position ||
        (uint64_t)st.st_size != sizes_offset + 8 * slots + COPY_TRAILER)
        return SFS_ENOTFOUND;
    size_t want = extent - s->header.hash_position < sizeof(prefix)
                      ? (size_t)(extent - s->header.hash_position) : sizeof(prefix);
    if (sfs_pread_full(s->fd, prefix, want, s->header.hash_position) < 0 ||
        s->header.hash_position + sfs_chd_dump_size(prefix, want) != extent)
        return SFS_ENOTFOUND;
    s->extent = extent;
    s->map_size = (uint64_t)st.st_size;
    void *m = mmap(NULL, s->map_size, PROT_READ, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED)
        return sfs_fail(err, SFS_EIO, errno, "%s: mmap of its local copy: %s", src, strerror(errno));
    s->map = m;
    *sizes = s->map + sizes_offset;
    *sizes_offset_out = sizes_offset;
    memcpy(raw_out, raw, SFS_HEADER_END);
    madvise((void *)s->map, s->map_size, MADV_RANDOM);
    char reason[256];
    if (sfs_chd_parse(&s->chd, s->map + s->header.hash_position, extent - s->header.hash_position,
                      reason, sizeof(reason)) < 0 || s->chd.n != s->slots)
        return CORRUPT("%s: its local copy %s holds a bad perfect hash: remove it", src, copy_path);
    return SFS_OK;
}


/* ---------------------------------------------------------------- operations */

static inline const sfs_remote_state_t *remote_of(const sfs_shard_t *s) { return sfs_kind_state(s); }

uint64_t sfs_remote_object_size(const sfs_shard_t *s, uint64_t slot, uint64_t offset)
{
    return get_le64(remote_of(s)->sizes + 8 * slot);
}

int sfs_remote_object_size_nowait(const sfs_shard_t *s, uint64_t slot, uint64_t offset, uint64_t *size)
{
    uint8_t le[8];
    int rc = sfs_page_cache_read(s, le, 8, remote_of(s)->sizes_offset + 8 * slot);
    if (rc == SFS_OK)
        *size = get_le64(le);
    return rc;
}

int sfs_remote_read(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    const sfs_remote_state_t *r = remote_of(s);
    int64_t n = length ? r->ops->pread(r->conn, dst, length, offset) : 0;
    if (n == (int64_t)length)
        return SFS_OK;
    errno = n < 0 ? (int)-n : EIO; /* short: the source shrank */
    return SFS_EIO;
}

void sfs_remote_read_batch(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                           void *const *dsts, int *results)
{
    enum { BATCH = 64 };
    const sfs_remote_state_t *r = remote_of(s);
    int first_errno = 0;
    for (size_t i = 0; i < n; i += BATCH) {
        uint64_t offs[BATCH];
        size_t lens[BATCH], at[BATCH], k = 0;
        void *bufs[BATCH];
        int64_t got[BATCH];
        for (size_t j = i; j < n && j < i + BATCH; j++)
            if (results[j] == SFS_OK && lengths[j]) {
                offs[k] = offsets[j];
                lens[k] = lengths[j];
                bufs[k] = dsts[j];
                at[k++] = j;
            }
        int rc = k ? r->ops->pread_many(r->conn, k, offs, lens, bufs, got) : 0;
        for (size_t j = 0; j < k; j++) {
            int e = rc < 0 ? -rc : got[j] < 0 ? (int)-got[j] : got[j] != (int64_t)lens[j] ? EIO : 0;
            if (e) {
                if (!first_errno)
                    first_errno = e;
                results[at[j]] = SFS_EIO;
            }
        }
    }
    if (first_errno)
        errno = first_errno;
}

ssize_t sfs_remote_source_read(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset)
{
    const sfs_remote_state_t *r = remote_of(s);
    int64_t n = r->ops->pread(r->conn, buf, len, offset);
    if (n < 0) {
        errno = (int)-n;
        return -1;
    }
    return (ssize_t)n;
}
