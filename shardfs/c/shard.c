/*
 * shard.c — open, validate and read Read Shards; check and delete.
 *
 * The whole extent [0, end of the hash section) is mmap'ed read-only once;
 * lookups and reads are then plain loads from the mapping: no lock, no file
 * position, no system call on the hot path. Every offset and size read from
 * the file is checked against the section it must lie in before use.
 */
#define _GNU_SOURCE
#include "shard.h"
#include "chd.h"
#include "internal.h"
#include "rbd.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct sfs_shard {
    int refs;             /* holders beyond the first (internal.h) */
    int fd;
    int writable;
    char *path;
    sfs_header_t header;
    uint64_t file_size;   /* bytes of the file or device */
    uint64_t extent;      /* bytes used by the shard */
    uint64_t slots;
    uint64_t objects_end; /* objects_position + objects_size */
    const uint8_t *map;
    sfs_chd_t chd;
    uint64_t live;        /* cached live count + 1; 0 = not counted yet */
    int no_nowait;        /* preadv2(RWF_NOWAIT) unsupported here */
    uint64_t map_size;    /* bytes mapped: the extent, or a local copy's whole file */
    /* An rbd: source (rbd.h): `fd` and `map` are its local copy, object
     * bytes come from the image, and each slot's object size from `sizes`
     * (u64 little-endian per slot, in the copy at byte `sizes_offset`). */
    sfs_rbd_t *rbd;
    const uint8_t *sizes;
    uint64_t sizes_offset;
    char rbd_pool[SFS_RBD_NAME_MAX], rbd_image[SFS_RBD_NAME_MAX];
};


static inline void put_be64(uint8_t *p, uint64_t v)
{
    v = __builtin_bswap64(v);
    memcpy(p, &v, 8);
}

const char *sfs_strstatus(int status)
{
    switch (status) {
    case SFS_OK: return "ok";
    case SFS_ENOTFOUND: return "not found";
    case SFS_ECORRUPT: return "corrupt shard";
    case SFS_EIO: return "input/output error";
    case SFS_EINVAL: return "invalid argument";
    case SFS_EDUPLICATE: return "duplicate key";
    case SFS_ENOMEM: return "out of memory";
    case SFS_ELIMIT: return "too many keys";
    case SFS_EHASH: return "perfect hash build failed";
    case SFS_EAGAIN: return "not in the page cache";
    case SFS_ESTALE: return "stale sidecar";
    default: return "unknown error";
    }
}

int sfs_fail(sfs_error_t *err, int status, int sys_errno, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        err->status = status;
        err->sys_errno = sys_errno;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof(err->message), fmt, ap);
        va_end(ap);
    }
    return status;
}

/* Size in bytes of a regular file or block device open on fd. */
int sfs_fd_size(int fd, const char *path, uint64_t *size, int *is_blk, sfs_error_t *err)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    *is_blk = S_ISBLK(st.st_mode);
    if (S_ISREG(st.st_mode)) {
        *size = (uint64_t)st.st_size;
    } else if (S_ISBLK(st.st_mode)) {
        if (ioctl(fd, BLKGETSIZE64, size) < 0)
            return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    } else {
        return sfs_fail(err, SFS_EINVAL, 0, "%s: not a regular file or block device", path);
    }
    return SFS_OK;
}

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)

/* Validate the header against the file size; sets slots and objects_end. */
static int validate_header(sfs_shard_t *s, const uint8_t raw[SFS_HEADER_END], sfs_error_t *err)
{
    const char *p = s->path;
    uint64_t size = s->file_size;
    uint8_t magic[SFS_MAGIC_SIZE] = {0};
    memcpy(magic, SFS_MAGIC, sizeof(SFS_MAGIC) - 1);
    if (memcmp(raw, magic, SFS_MAGIC_SIZE) != 0)
        return CORRUPT("%s: bad magic: not a Read Shard (expected \"SWHShard\" padded with NULs)", p);
    uint64_t f[7];
    for (int i = 0; i < 7; i++)
        f[i] = be64(raw + SFS_MAGIC_SIZE + 8 * i);
    sfs_header_t *h = &s->header;
    h->version = f[0];
    h->objects_count = f[1];
    h->objects_position = f[2];
    h->objects_size = f[3];
    h->index_position = f[4];
    h->index_size = f[5];
    h->hash_position = f[6];

    if (h->version != SFS_VERSION)
        return CORRUPT("%s: header field version is %llu, only version 1 is supported", p,
                       (unsigned long long)h->version);
    if (h->objects_position < SFS_HEADER_END || h->objects_position > size)
        return CORRUPT("%s: header field objects_position is %llu, outside [88, %llu] (file size)",
                       p, (unsigned long long)h->objects_position, (unsigned long long)size);
    if (h->objects_size > size - h->objects_position)
        return CORRUPT("%s: header field objects_size is %llu: the objects section would end past "
                       "the end of the file (%llu bytes)",
                       p, (unsigned long long)h->objects_size, (unsigned long long)size);
    s->objects_end = h->objects_position + h->objects_size;
    if (h->index_position < s->objects_end || h->index_position > size)
        return CORRUPT("%s: header field index_position is %llu, outside [%llu, %llu] (end of "
                       "objects, file size)",
                       p, (unsigned long long)h->index_position,
                       (unsigned long long)s->objects_end, (unsigned long long)size);
    if (h->index_size == 0 || h->index_size % SFS_SLOT_SIZE != 0)
        return CORRUPT("%s: header field index_size is %llu, not a positive multiple of 40", p,
                       (unsigned long long)h->index_size);
    if (h->index_size > size - h->index_position)
        return CORRUPT("%s: header field index_size is %llu: the index would end past the end "
                       "of the file (%llu bytes)",
                       p, (unsigned long long)h->index_size, (unsigned long long)size);
    s->slots = h->index_size / SFS_SLOT_SIZE;
    if (s->slots > UINT32_MAX)
        return CORRUPT("%s: header field index_size is %llu: more slots than a perfect hash holds",
                       p, (unsigned long long)h->index_size);
    if (h->objects_count > s->slots)
        return CORRUPT("%s: header field objects_count is %llu, more than the %llu slots of the "
                       "index",
                       p, (unsigned long long)h->objects_count, (unsigned long long)s->slots);
    if (h->objects_count > h->objects_size / 8)
        return CORRUPT("%s: header field objects_count is %llu but objects_size (%llu bytes) "
                       "cannot hold that many 8-byte size fields",
                       p, (unsigned long long)h->objects_count,
                       (unsigned long long)h->objects_size);
    uint64_t index_end = h->index_position + h->index_size;
    if (h->hash_position < index_end || h->hash_position >= size)
        return CORRUPT("%s: header field hash_position is %llu, outside [%llu, %llu) (end of "
                       "index, file size)",
                       p, (unsigned long long)h->hash_position, (unsigned long long)index_end,
                       (unsigned long long)size);
    return SFS_OK;
}

/* ---------------------------------------------------------------- rbd: sources
 *
 * The local copy of an rbd: source (rbd.h, docs/ceph.md) is a sparse file
 * laid out like the shard: bytes [0, min(objects_position, 64 KiB)) and the
 * index and hash sections at their own offsets, the objects section a hole;
 * then, at the extent rounded up to 4 KiB, each slot's object size (u64
 * little-endian; 2^64-1 for an empty slot); then a 64-byte trailer:
 *   bytes  0..8   magic "SFSRBDC1"     bytes  8..12  u32 version = 1
 *   bytes 16..24  u64 extent           bytes 24..32  u64 sizes_offset
 *   bytes 32..40  u64 slot count       bytes 40..48  u64 image size (bytes)
 * Written whole (O_TMPFILE, fdatasync, rename) by build_copy; checked by
 * open_copy; its header is compared with the image's at every connection
 * (sfs_rbd_new's `expect`), so a replaced image fails reads with ESTALE
 * instead of serving the copy's sizes with another shard's bytes. */

#define COPY_MAGIC "SFSRBDC1"
#define COPY_TRAILER 64
#define COPY_HEAD_MAX 65536          /* bytes before the objects copied at most */
#define COPY_CHUNK (4u << 20)        /* bytes per image read while copying */
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

typedef struct {
    const char *source, *pool, *image, *copy_path;
} copy_job_t;

/* Read the size fields of live[0, n) from the image into sizes (by slot). */
static int read_size_fields(sfs_rbd_t *r, const live_slot_t *live, size_t n, uint8_t *sizes,
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
        int rc = sfs_rbd_pread_many(r, k, offs, lens, bufs, got);
        for (size_t j = 0; j < k; j++) {
            int e = rc < 0 ? -rc : got[j] < 0 ? (int)-got[j] : got[j] != 8 ? EIO : 0;
            if (e)
                return sfs_fail(err, SFS_EIO, e, "%s: reading size fields: %s", src, strerror(e));
            put_le64(sizes + 8 * (uint64_t)live[i + j].slot, be64(raw[j]));
        }
    }
    return SFS_OK;
}

/* Build the local copy of job->source at job->copy_path (may run in a
 * child process: sfs_rbd_isolated). */
static int build_copy(void *arg, sfs_error_t *err)
{
    copy_job_t *job = arg;
    const char *src = job->source;
    sfs_shard_t t = {.fd = -1, .path = (char *)src};
    sfs_rbd_t *r = NULL;
    uint8_t *buf = NULL, *index = NULL, *sizes = NULL;
    live_slot_t *live = NULL;
    char *tmp = NULL;
    int fd = -1, rc;
    uint64_t size;
    if ((rc = sfs_rbd_new(job->pool, job->image, NULL, 0, &r, err)) != SFS_OK ||
        (rc = sfs_rbd_connect(r, &size, err)) != SFS_OK)
        goto out;
    t.file_size = size;
    uint8_t raw[SFS_HEADER_END], prefix[31];
    int64_t got = size < SFS_HEADER_END ? 0 : sfs_rbd_pread(r, raw, sizeof(raw), 0);
    if (got < 0) {
        rc = sfs_fail(err, SFS_EIO, (int)-got, "%s: reading the header: %s", src, strerror((int)-got));
        goto out;
    }
    if (got != SFS_HEADER_END) {
        rc = CORRUPT("%s: truncated: %llu bytes, smaller than the 88-byte header", src,
                     (unsigned long long)size);
        goto out;
    }
    if ((rc = validate_header(&t, raw, err)) != SFS_OK)
        goto out;
    const sfs_header_t *h = &t.header;
    uint64_t avail = size - h->hash_position;
    size_t want = avail < sizeof(prefix) ? (size_t)avail : sizeof(prefix);
    got = sfs_rbd_pread(r, prefix, want, h->hash_position);
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

    /* the directories <cache>/rbd/<pool> */
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", job->copy_path);
    for (char *at = strchr(dir + 1, '/'); at; at = strchr(at + 1, '/')) {
        *at = 0;
        if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
            rc = sfs_fail(err, SFS_EIO, errno, "%s: creating %s: %s", src, dir, strerror(errno));
            goto out;
        }
        *at = '/';
    }
    if ((rc = sfs_output_create(job->copy_path, 0644, &fd, &tmp, err)) != SFS_OK)
        goto out;
    if (ftruncate(fd, (off_t)total) < 0)
        goto io;
    if (!(buf = malloc(COPY_CHUNK)))
        goto nomem;
    /* the bytes before the objects, then the index and the hash sections */
    uint64_t head = h->objects_position < COPY_HEAD_MAX ? h->objects_position : SFS_HEADER_END;
    uint64_t ranges[2][2] = {{0, head}, {h->index_position, extent}};
    for (int k = 0; k < 2; k++)
        for (uint64_t at = ranges[k][0]; at < ranges[k][1];) {
            size_t len = ranges[k][1] - at < COPY_CHUNK ? (size_t)(ranges[k][1] - at) : COPY_CHUNK;
            got = sfs_rbd_pread(r, buf, len, at);
            if (got != (int64_t)len) {
                int e = got < 0 ? (int)-got : EIO;
                rc = sfs_fail(err, SFS_EIO, e, "%s: copying byte %llu: %s", src,
                              (unsigned long long)at, strerror(e));
                goto out;
            }
            if (sfs_pwrite_all(fd, buf, len, at) < 0)
                goto io;
            at += len;
        }

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
        rc = read_size_fields(r, sample, k, check, src, err);
        for (size_t j = 0; rc == SFS_OK && j < k; j++)
            packed &= !memcmp(check + 8 * (uint64_t)sample[j].slot,
                              sizes + 8 * (uint64_t)sample[j].slot, 8);
        free(check);
        if (rc != SFS_OK)
            goto out;
    }
    if (!packed && (rc = read_size_fields(r, live, n, sizes, src, err)) != SFS_OK)
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
    if (sfs_output_publish(fd, &tmp, job->copy_path) < 0)
        goto io;
    sfs_sync_directory(job->copy_path);
    rc = SFS_OK;
    goto out;
io:
    rc = sfs_fail(err, SFS_EIO, errno, "%s: writing its local copy %s: %s", src, job->copy_path,
                  strerror(errno));
    goto out;
nomem:
    rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", src);
out:
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    if (fd >= 0)
        close(fd);
    free(buf);
    free(index);
    free(sizes);
    free(live);
    sfs_rbd_close(r);
    return rc;
}

/* Open the local copy at copy_path into s (s->path the source). SFS_OK;
 * SFS_ENOTFOUND when there is none or it is not a whole copy (to build);
 * SFS_ECORRUPT / SFS_EIO / SFS_ENOMEM. */
static int open_copy(sfs_shard_t *s, const char *copy_path, sfs_error_t *err)
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
    if (validate_header(s, raw, &why) != SFS_OK || slots != s->slots ||
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
    s->sizes = s->map + sizes_offset;
    s->sizes_offset = sizes_offset;
    madvise((void *)s->map, s->map_size, MADV_RANDOM);
    char reason[256];
    if (sfs_chd_parse(&s->chd, s->map + s->header.hash_position, extent - s->header.hash_position,
                      reason, sizeof(reason)) < 0 || s->chd.n != s->slots)
        return CORRUPT("%s: its local copy %s holds a bad perfect hash: remove it", src, copy_path);
    return sfs_rbd_new(s->rbd_pool, s->rbd_image, raw, sizeof(raw), &s->rbd, err);
}

/* sfs_open of an rbd: source: its local copy, built first if needed. */
static int open_rbd(sfs_shard_t *s, sfs_error_t *err)
{
    const char *src = s->path, *cache = sfs_rbd_cache_dir();
    int rc = sfs_rbd_parse(src, s->rbd_pool, s->rbd_image, err);
    if (rc != SFS_OK)
        return rc;
    if (s->writable)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: RBD images are opened read-only", src);
    if (!sfs_rbd_built())
        return sfs_rbd_new(s->rbd_pool, s->rbd_image, NULL, 0, &s->rbd, err);
    if (!cache)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: no cache directory for its local copy", src);
    char copy_path[4096];
    if ((size_t)snprintf(copy_path, sizeof(copy_path), "%s/rbd/%s/%s.copy", cache, s->rbd_pool,
                         s->rbd_image) >= sizeof(copy_path))
        return sfs_fail(err, SFS_EINVAL, 0, "%s: cache directory path too long", src);
    for (int attempt = 0; attempt < 2; attempt++) {
        if ((rc = open_copy(s, copy_path, err)) != SFS_ENOTFOUND)
            return rc;
        if (s->fd >= 0) {
            close(s->fd);
            s->fd = -1;
        }
        if (attempt)
            break;
        copy_job_t job = {src, s->rbd_pool, s->rbd_image, copy_path};
        if ((rc = sfs_rbd_isolated(build_copy, &job, err)) != SFS_OK)
            return rc;
    }
    return sfs_fail(err, SFS_EIO, EIO, "%s: its local copy %s is unreadable after it was built",
                    src, copy_path);
}

int sfs_open(const char *path, int writable, sfs_shard_t **out, sfs_error_t *err)
{
    *out = NULL;
    sfs_shard_t *s = calloc(1, sizeof(*s));
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    }
    s->fd = -1;
    s->writable = writable;
    int rc;
    if (sfs_is_rbd_source(path)) {
        if ((rc = open_rbd(s, err)) != SFS_OK)
            goto fail;
        *out = s;
        return SFS_OK;
    }
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; the file type
     * is checked right after, and the flag cleared for the rest. */
    s->fd = open(path, (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NONBLOCK);
    if (s->fd < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    int is_blk;
    if ((rc = sfs_fd_size(s->fd, path, &s->file_size, &is_blk, err)) != SFS_OK)
        goto fail;
    fcntl(s->fd, F_SETFL, fcntl(s->fd, F_GETFL) & ~O_NONBLOCK);
    if (s->file_size < SFS_HEADER_END) {
        rc = CORRUPT("%s: truncated: %llu bytes, smaller than the 88-byte header", path,
                     (unsigned long long)s->file_size);
        goto fail;
    }
    uint8_t raw[SFS_HEADER_END];
    ssize_t got = pread(s->fd, raw, sizeof(raw), 0);
    if (got != (ssize_t)sizeof(raw)) {
        rc = sfs_fail(err, SFS_EIO, got < 0 ? errno : EIO, "%s: reading the header: %s", path,
                      got < 0 ? strerror(errno) : "short read");
        goto fail;
    }
    if ((rc = validate_header(s, raw, err)) != SFS_OK)
        goto fail;

    /* The dump's own length fields give the extent; read its fixed prefix. */
    uint8_t prefix[31];
    uint64_t avail = s->file_size - s->header.hash_position;
    size_t want = avail < sizeof(prefix) ? (size_t)avail : sizeof(prefix);
    got = pread(s->fd, prefix, want, (off_t)s->header.hash_position);
    if (got != (ssize_t)want) {
        rc = sfs_fail(err, SFS_EIO, got < 0 ? errno : EIO, "%s: reading the hash section: %s",
                      path, got < 0 ? strerror(errno) : "short read");
        goto fail;
    }
    uint64_t dump = sfs_chd_dump_size(prefix, want);
    if (dump == 0) {
        rc = CORRUPT("%s: hash section at byte %llu is not a CHD_PH perfect hash (or is "
                     "truncated)",
                     path, (unsigned long long)s->header.hash_position);
        goto fail;
    }
    if (dump > avail) {
        rc = CORRUPT("%s: truncated: the hash section needs %llu bytes, the file has %llu after "
                     "hash_position",
                     path, (unsigned long long)dump, (unsigned long long)avail);
        goto fail;
    }
    s->extent = s->header.hash_position + dump;
    void *m = mmap(NULL, s->extent, PROT_READ, MAP_SHARED, s->fd, 0);
    if (m == MAP_FAILED) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    s->map = m;
    s->map_size = s->extent;
    /* Random lookups: do not read ahead objects and index. Every lookup
     * evaluates the hash: start reading it now. */
    madvise((void *)s->map, s->extent, MADV_RANDOM);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t hash_page = s->header.hash_position & ~(page - 1);
    madvise((void *)(s->map + hash_page), s->extent - hash_page, MADV_WILLNEED);
    char why[256];
    if (sfs_chd_parse(&s->chd, s->map + s->header.hash_position, dump, why, sizeof(why)) < 0) {
        rc = CORRUPT("%s: %s", path, why);
        goto fail;
    }
    if (s->chd.n != s->slots) {
        rc = CORRUPT("%s: the perfect hash has %u slots but header field index_size gives %llu",
                     path, s->chd.n, (unsigned long long)s->slots);
        goto fail;
    }
    *out = s;
    return SFS_OK;
fail:
    sfs_close(s);
    return rc;
}

sfs_shard_t *sfs_ref(sfs_shard_t *s)
{
    sfs_ref_take(&s->refs);
    return s;
}

void sfs_close(sfs_shard_t *s)
{
    if (!s || !sfs_ref_drop(&s->refs))
        return;
    if (s->map)
        munmap((void *)s->map, s->map_size);
    if (s->fd >= 0)
        close(s->fd);
    sfs_rbd_close(s->rbd);
    free(s->path);
    free(s);
}

const sfs_header_t *sfs_header(const sfs_shard_t *s) { return &s->header; }
const char *sfs_path(const sfs_shard_t *s) { return s->path; }
int sfs_fd(const sfs_shard_t *s) { return s->fd; }
uint64_t sfs_slot_count(const sfs_shard_t *s) { return s->slots; }
uint64_t sfs_extent(const sfs_shard_t *s) { return s->extent; }
uint64_t sfs_hash_size(const sfs_shard_t *s) { return s->chd.dump_size; }

uint32_t sfs_slot_of(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE])
{
    return sfs_chd_search(&s->chd, key, SFS_KEY_SIZE);
}

static inline const uint8_t *slot_ptr(const sfs_shard_t *s, uint64_t slot)
{
    return s->map + s->header.index_position + slot * SFS_SLOT_SIZE;
}

uint64_t sfs_slot_get(const sfs_shard_t *s, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE])
{
    if (slot >= s->slots)
        return SFS_EMPTY_OFFSET;
    const uint8_t *p = slot_ptr(s, slot);
    if (key_out)
        memcpy(key_out, p, SFS_KEY_SIZE);
    return be64(p + SFS_KEY_SIZE);
}

void sfs_prefetch_slot_entry(const sfs_shard_t *s, uint64_t slot)
{
    if (slot < s->slots)
        __builtin_prefetch(slot_ptr(s, slot) + SFS_KEY_SIZE, 0, 0);
}

/* A size field at `offset` lies inside the objects section. */
static inline int size_field_ok(const sfs_shard_t *s, uint64_t offset)
{
    return offset >= s->header.objects_position && offset <= s->objects_end &&
           s->objects_end - offset >= SFS_SIZE_FIELD_SIZE;
}

/* An object of `n` bytes after its size field at `offset` (size_field_ok)
 * ends inside the objects section. */
static inline int object_fits(const sfs_shard_t *s, uint64_t offset, uint64_t n)
{
    return n <= s->objects_end - offset - SFS_SIZE_FIELD_SIZE;
}

/* The size of the object of slot `slot` whose size field is at `offset`:
 * the field itself, or for an rbd: source the local copy's size table. */
static inline uint64_t size_at(const sfs_shard_t *s, uint64_t slot, uint64_t offset)
{
    return s->sizes ? get_le64(s->sizes + 8 * slot) : be64(s->map + offset);
}

/* Object of slot `slot` at `offset` (of its size field): data offset and
 * size, bounded by the objects section. */
static inline int resolve(const sfs_shard_t *s, uint64_t slot, uint64_t offset,
                          uint64_t *data_offset, uint64_t *size)
{
    if (!size_field_ok(s, offset))
        return SFS_ECORRUPT;
    uint64_t n = size_at(s, slot, offset);
    if (!object_fits(s, offset, n))
        return SFS_ECORRUPT;
    *data_offset = offset + SFS_SIZE_FIELD_SIZE;
    *size = n;
    return SFS_OK;
}

int sfs_lookup_slot(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                    uint64_t *data_offset, uint64_t *size)
{
    *slot = sfs_chd_search(&s->chd, key, SFS_KEY_SIZE);
    if (*slot >= s->slots)
        return SFS_ECORRUPT;
    const uint8_t *p = slot_ptr(s, *slot);
    uint64_t offset = be64(p + SFS_KEY_SIZE);
    if (offset == SFS_EMPTY_OFFSET || memcmp(p, key, SFS_KEY_SIZE) != 0)
        return SFS_ENOTFOUND;
    return resolve(s, *slot, offset, data_offset, size);
}

int sfs_lookup(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], uint64_t *data_offset,
               uint64_t *size)
{
    uint32_t slot;
    return sfs_lookup_slot(s, key, &slot, data_offset, size);
}

/* Keys a batch's stages run ahead of each other: the slot of key i is
 * computed and prefetched while the slot of key i - BATCH_AHEAD is read
 * and the size field of key i - 2 * BATCH_AHEAD resolved, so that the
 * cache misses of about 2 * BATCH_AHEAD lookups overlap. */
#define BATCH_AHEAD 8
/* A group of 8 lookups slower than this waited for the device. */
#define BATCH_SLOW_NS 20000

static inline void prefetch_range(const uint8_t *p, size_t length)
{
    __builtin_prefetch(p, 0, 0);
    __builtin_prefetch(p + length - 1, 0, 0);
}

size_t sfs_lookup_batch(const sfs_shard_t *s, const uint8_t *keys, size_t n, sfs_found_t *found)
{
    size_t bad = 0;
    int cold = 0, slow = 0;
    uint64_t t0 = sfs_now_ns();
    for (size_t i = 0; i < n + 2 * BATCH_AHEAD; i++) {
        if (i < n) { /* stage 1: the slot, prefetched */
            uint32_t slot = sfs_chd_search(&s->chd, keys + SFS_KEY_SIZE * i, SFS_KEY_SIZE);
            found[i].slot = slot;
            if (slot < s->slots)
                prefetch_range(slot_ptr(s, slot), SFS_SLOT_SIZE);
        }
        if (i >= BATCH_AHEAD && i - BATCH_AHEAD < n) { /* stage 2: the slot's key and offset */
            sfs_found_t *f = &found[i - BATCH_AHEAD];
            const uint8_t *key = keys + SFS_KEY_SIZE * (i - BATCH_AHEAD);
            f->data_offset = f->size = 0;
            if (f->slot >= s->slots) {
                f->status = SFS_ECORRUPT;
                bad++;
            } else {
                const uint8_t *p = slot_ptr(s, f->slot);
                uint64_t offset = be64(p + SFS_KEY_SIZE);
                if (offset == SFS_EMPTY_OFFSET || memcmp(p, key, SFS_KEY_SIZE) != 0) {
                    f->status = SFS_ENOTFOUND;
                } else {
                    f->status = SFS_OK;
                    f->data_offset = offset; /* of the size field, until stage 3 */
                    if (s->sizes) {
                        prefetch_range(s->sizes + 8 * (uint64_t)f->slot, 8);
                    } else if (size_field_ok(s, offset)) {
                        if (cold)
                            posix_fadvise(s->fd, (off_t)offset, 4096, POSIX_FADV_WILLNEED);
                        else
                            prefetch_range(s->map + offset, 8);
                    }
                }
            }
        }
        if (i >= 2 * BATCH_AHEAD) { /* stage 3: the size field */
            sfs_found_t *f = &found[i - 2 * BATCH_AHEAD];
            if (f->status == SFS_OK &&
                resolve(s, f->slot, f->data_offset, &f->data_offset, &f->size) != SFS_OK) {
                f->status = SFS_ECORRUPT;
                f->data_offset = f->size = 0;
                bad++;
            }
        }
        if (!cold && (i & 7) == 7) {
            uint64_t t = sfs_now_ns();
            /* two slow groups in a row: the device is waited on (one alone
             * may be this thread losing its core), so every remaining slot
             * is asked for at once */
            slow = t - t0 > BATCH_SLOW_NS ? slow + 1 : 0;
            if (slow == 2) {
                cold = 1;
                for (size_t j = i + 1; j < n; j++)
                    sfs_prefetch_slot(s, keys + SFS_KEY_SIZE * j);
            }
            t0 = t;
        }
    }
    return bad;
}

/* Copy from the page cache only (preadv2 RWF_NOWAIT). */
static int read_nowait(const sfs_shard_t *s, void *dst, size_t length, uint64_t offset)
{
    if (length == 0)
        return SFS_OK;
#ifdef RWF_NOWAIT
    if (__atomic_load_n(&s->no_nowait, __ATOMIC_RELAXED))
        return SFS_EAGAIN;
    struct iovec iov = {dst, length};
    ssize_t n = preadv2(s->fd, &iov, 1, (off_t)offset, RWF_NOWAIT);
    if (n == (ssize_t)length)
        return SFS_OK;
    if (n < 0 && (errno == EOPNOTSUPP || errno == ENOSYS || errno == EINVAL))
        __atomic_store_n((int *)&s->no_nowait, 1, __ATOMIC_RELAXED);
#endif
    return SFS_EAGAIN;
}

/* resolve() from the page cache only. */
static int resolve_nowait(const sfs_shard_t *s, uint64_t slot, uint64_t offset,
                          uint64_t *data_offset, uint64_t *size)
{
    uint8_t be[SFS_SIZE_FIELD_SIZE];
    if (!size_field_ok(s, offset))
        return SFS_ECORRUPT;
    int rc = s->sizes ? read_nowait(s, be, 8, s->sizes_offset + 8 * slot)
                      : read_nowait(s, be, SFS_SIZE_FIELD_SIZE, offset);
    if (rc != SFS_OK)
        return rc;
    uint64_t n = s->sizes ? get_le64(be) : be64(be);
    if (!object_fits(s, offset, n))
        return SFS_ECORRUPT;
    *data_offset = offset + SFS_SIZE_FIELD_SIZE;
    *size = n;
    return SFS_OK;
}

/* The 40 bytes of slot `slot` (< s->slots) from the page cache only. */
static int slot_nowait(const sfs_shard_t *s, uint64_t slot, uint8_t raw[SFS_SLOT_SIZE])
{
    return read_nowait(s, raw, SFS_SLOT_SIZE, s->header.index_position + slot * (uint64_t)SFS_SLOT_SIZE);
}

int sfs_lookup_nowait(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                      uint64_t *data_offset, uint64_t *size)
{
    *slot = sfs_chd_search(&s->chd, key, SFS_KEY_SIZE);
    if (*slot >= s->slots)
        return SFS_ECORRUPT;
    uint8_t raw[SFS_SLOT_SIZE];
    int rc = slot_nowait(s, *slot, raw);
    if (rc != SFS_OK)
        return rc;
    uint64_t offset = be64(raw + SFS_KEY_SIZE);
    if (offset == SFS_EMPTY_OFFSET || memcmp(raw, key, SFS_KEY_SIZE) != 0)
        return SFS_ENOTFOUND;
    return resolve_nowait(s, *slot, offset, data_offset, size);
}

int sfs_slot_object_nowait(const sfs_shard_t *s, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE],
                           uint64_t *data_offset, uint64_t *size)
{
    if (slot >= s->slots)
        return SFS_EINVAL;
    uint8_t raw[SFS_SLOT_SIZE];
    int rc = slot_nowait(s, slot, raw);
    if (rc != SFS_OK)
        return rc;
    uint64_t offset = be64(raw + SFS_KEY_SIZE);
    if (offset == SFS_EMPTY_OFFSET)
        return SFS_ENOTFOUND;
    if (key_out)
        memcpy(key_out, raw, SFS_KEY_SIZE);
    return resolve_nowait(s, slot, offset, data_offset, size);
}

/* [offset, offset + length) lies inside the objects section. */
static inline int in_objects(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    return offset >= s->header.objects_position && offset <= s->objects_end &&
           length <= s->objects_end - offset;
}

int sfs_read_nowait(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    if (!in_objects(s, offset, length))
        return SFS_EINVAL;
    if (s->rbd) /* object bytes are never in this host's page cache */
        return length ? SFS_EAGAIN : SFS_OK;
    return read_nowait(s, dst, length, offset);
}

int sfs_prefetch(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    if (!in_objects(s, offset, length))
        return SFS_EINVAL;
    if (length && s->rbd)
        sfs_rbd_prefetch(s->rbd, offset, (size_t)(length < SFS_RBD_AHEAD_MAX ? length : SFS_RBD_AHEAD_MAX));
    else if (length)
        posix_fadvise(s->fd, (off_t)offset, (off_t)length, POSIX_FADV_WILLNEED);
    return SFS_OK;
}

void sfs_prefetch_reader(const sfs_shard_t *s)
{
    if (!s)
        return;
    for (size_t at = 0; at < offsetof(sfs_shard_t, rbd_pool); at += 64)
        __builtin_prefetch((const char *)s + at, 0, 3);
}

void sfs_prefetch_slot(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE])
{
    uint32_t slot = sfs_chd_search(&s->chd, key, SFS_KEY_SIZE);
    if (slot < s->slots)
        posix_fadvise(s->fd, (off_t)(s->header.index_position + (uint64_t)slot * SFS_SLOT_SIZE),
                      SFS_SLOT_SIZE, POSIX_FADV_WILLNEED);
}

int sfs_slot_object(const sfs_shard_t *s, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE],
                    uint64_t *data_offset, uint64_t *size)
{
    if (slot >= s->slots)
        return SFS_EINVAL;
    uint64_t offset = sfs_slot_get(s, slot, key_out);
    if (offset == SFS_EMPTY_OFFSET)
        return SFS_ENOTFOUND;
    return resolve(s, slot, offset, data_offset, size);
}

const uint8_t *sfs_data(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    if (s->rbd || !in_objects(s, offset, length))
        return NULL;
    return s->map + offset;
}

int sfs_is_rbd(const sfs_shard_t *s) { return s->rbd != NULL; }

const char *sfs_source_error(const sfs_shard_t *s) { return s->rbd ? sfs_rbd_error(s->rbd) : NULL; }

/* Up to this many bytes are copied from the mapping: no system call when
 * cached, and a cold page fault reads one 4 KiB page (MADV_RANDOM). Longer
 * ranges are read with pread(), which asks the device for the whole range
 * at once instead of one page per fault: a cold 64 KiB object costs about 2
 * device reads instead of 17 (bench/bench_lookup.py, medium cold). */
#define MMAP_COPY_MAX (16 * 1024)

/* An rbd: source's bytes: SFS_OK, or SFS_EIO with errno set. */
static int rbd_read_full(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    int64_t n = length ? sfs_rbd_pread(s->rbd, dst, length, offset) : 0;
    if (n == (int64_t)length)
        return SFS_OK;
    errno = n < 0 ? (int)-n : EIO; /* short: the image shrank */
    return SFS_EIO;
}

int sfs_read(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    if (s->rbd)
        return in_objects(s, offset, length) ? rbd_read_full(s, offset, dst, length) : SFS_EINVAL;
    const uint8_t *p = sfs_data(s, offset, length);
    if (!p)
        return SFS_EINVAL;
    if (length <= MMAP_COPY_MAX) {
        memcpy(dst, p, length);
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

int sfs_read_many(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                  void *const *dsts, int *results)
{
    enum { BATCH = 64 };
    for (size_t i = 0; i < n; i++)
        results[i] = in_objects(s, offsets[i], lengths[i]) ? SFS_OK : SFS_EINVAL;
    if (!s->rbd) {
        for (size_t i = 0; i < n; i++)
            if (results[i] == SFS_OK)
                results[i] = sfs_read(s, offsets[i], dsts[i], lengths[i]);
        return SFS_OK;
    }
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
        int rc = k ? sfs_rbd_pread_many(s->rbd, k, offs, lens, bufs, got) : 0;
        for (size_t j = 0; j < k; j++) {
            int e = rc < 0 ? -rc : got[j] < 0 ? (int)-got[j] : got[j] != (int64_t)lens[j] ? EIO : 0;
            if (e) {
                errno = e;
                results[at[j]] = SFS_EIO;
            }
        }
    }
    return SFS_OK;
}

ssize_t sfs_source_read(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset)
{
    if (s->rbd) {
        int64_t n = sfs_rbd_pread(s->rbd, buf, len, offset);
        if (n < 0) {
            errno = (int)-n;
            return -1;
        }
        return (ssize_t)n;
    }
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

uint64_t sfs_live_count(sfs_shard_t *s)
{
    uint64_t cached = __atomic_load_n(&s->live, __ATOMIC_RELAXED);
    if (cached)
        return cached - 1;
    uint64_t live = 0;
    for (uint64_t i = 0; i < s->slots; i++)
        live += be64(slot_ptr(s, i) + SFS_KEY_SIZE) != SFS_EMPTY_OFFSET;
    __atomic_store_n(&s->live, live + 1, __ATOMIC_RELAXED);
    return live;
}

static void hex(const uint8_t key[SFS_KEY_SIZE], char out[2 * SFS_KEY_SIZE + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < SFS_KEY_SIZE; i++) {
        out[2 * i] = digits[key[i] >> 4];
        out[2 * i + 1] = digits[key[i] & 15];
    }
    out[2 * SFS_KEY_SIZE] = 0;
}

uint64_t sfs_check(sfs_shard_t *s, void (*report)(void *ctx, const char *message), void *ctx,
                   uint64_t max_reports)
{
    uint64_t problems = 0, live = 0;
    char msg[512], hk[2 * SFS_KEY_SIZE + 1];
#define REPORT(...)                                                                                \
    do {                                                                                           \
        if (problems++ < max_reports && report) {                                                  \
            snprintf(msg, sizeof(msg), __VA_ARGS__);                                               \
            report(ctx, msg);                                                                      \
        }                                                                                          \
    } while (0)
    for (uint64_t i = 0; i < s->slots; i++) {
        uint8_t key[SFS_KEY_SIZE];
        uint64_t offset = sfs_slot_get(s, i, key), doff, size;
        if (offset == SFS_EMPTY_OFFSET)
            continue;
        live++;
        hex(key, hk);
        uint32_t home = sfs_slot_of(s, key);
        if (home != i)
            REPORT("slot %llu: key %s hashes to slot %u", (unsigned long long)i, hk, home);
        if (!size_field_ok(s, offset))
            REPORT("slot %llu: key %s: offset %llu is outside the objects section [%llu, %llu)",
                   (unsigned long long)i, hk, (unsigned long long)offset,
                   (unsigned long long)s->header.objects_position,
                   (unsigned long long)s->objects_end);
        else if (resolve(s, i, offset, &doff, &size) != SFS_OK)
            REPORT("slot %llu: key %s: object size %llu at offset %llu runs past the objects "
                   "section",
                   (unsigned long long)i, hk, (unsigned long long)size_at(s, i, offset),
                   (unsigned long long)offset);
    }
    if (live > s->header.objects_count)
        REPORT("%llu live slots, more than header field objects_count (%llu)",
               (unsigned long long)live, (unsigned long long)s->header.objects_count);
#undef REPORT
    return problems;
}

int sfs_pread_full(int fd, void *buf, size_t len, uint64_t offset)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t got = pread(fd, p, len, (off_t)offset);
        if (got < 0 && errno == EINTR)
            continue;
        if (got == 0) {
            errno = EIO;
            return SFS_PREAD_SHORT;
        }
        if (got < 0)
            return -1;
        p += got;
        len -= (size_t)got;
        offset += (uint64_t)got;
    }
    return 0;
}

int sfs_reopen_for_index(const sfs_shard_t *s, int *fd_out, sfs_error_t *err)
{
    const sfs_header_t *h = &s->header;
    const char *path = s->path;
    uint64_t end = h->index_position + sfs_slot_count(s) * SFS_SLOT_SIZE;
    *fd_out = -1;
    char self_fd[40];
    snprintf(self_fd, sizeof(self_fd), "/proc/self/fd/%d", s->fd);
    int fd = open(self_fd, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT)
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: reopening the shard to read its index: %s",
                        path, strerror(errno));
    uint64_t size;
    int is_blk, rc;
    sfs_error_t why;
    uint8_t raw[SFS_HEADER_END];
    if (sfs_fd_size(fd, path, &size, &is_blk, &why) != SFS_OK) {
        rc = sfs_fail(err, SFS_EIO, why.sys_errno ? why.sys_errno : ESTALE,
                      "%s (reopened to read the index)", why.message);
        goto fail;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    int got = sfs_pread_full(fd, raw, sizeof(raw), 0);
    if (got < 0) {
        int e = errno;
        rc = got == SFS_PREAD_SHORT ? sfs_fail(err, SFS_EIO, EIO, "%s: the shard shrank (short read of its header)",
                                 path)
                      : sfs_fail(err, SFS_EIO, e, "%s: reading the header: %s", path, strerror(e));
        goto fail;
    }
    const uint64_t want[7] = {h->version, h->objects_count, h->objects_position,
                              h->objects_size, h->index_position, h->index_size,
                              h->hash_position};
    int same = memcmp(raw, SFS_MAGIC, sizeof(SFS_MAGIC) - 1) == 0;
    for (int i = 0; i < 7; i++)
        same &= be64(raw + SFS_MAGIC_SIZE + 8 * i) == want[i];
    if (!same) {
        rc = sfs_fail(err, SFS_EIO, ESTALE, "%s: is no longer the opened shard (its header "
                      "changed): reopen it", path);
        goto fail;
    }
    if (size < end) {
        rc = sfs_fail(err, SFS_EIO, EIO, "%s: the shard shrank: %llu bytes, its index ends at "
                      "byte %llu", path, (unsigned long long)size, (unsigned long long)end);
        goto fail;
    }
    posix_fadvise(fd, (off_t)h->index_position, (off_t)(end - h->index_position),
                  POSIX_FADV_SEQUENTIAL);
    *fd_out = fd;
    return SFS_OK;
fail:
    close(fd);
    return rc;
}

int sfs_pwrite_all(int fd, const void *buf, size_t len, uint64_t offset)
{
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = pwrite(fd, p, len, (off_t)offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += n;
        len -= (size_t)n;
        offset += (uint64_t)n;
    }
    return 0;
}

int sfs_delete(sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], sfs_error_t *err)
{
    if (!s->writable || s->rbd)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: opened read-only", s->path);
    uint64_t doff, size;
    uint32_t slot;
    int rc = sfs_lookup_slot(s, key, &slot, &doff, &size);
    if (rc == SFS_ENOTFOUND)
        return sfs_fail(err, rc, 0, "%s: key not found", s->path);
    if (rc != SFS_OK)
        return sfs_fail(err, rc, 0, "%s: the key's slot points outside the objects section",
                        s->path);
    /* Order matters for an interrupted delete (see docs/format.md):
     * 1. the object's bytes become zeros (its size field still valid);
     * 2. its slot becomes the empty marker;
     * 3. its size field becomes zero. Each step leaves a valid shard. */
    static const uint8_t zeros[65536];
    uint64_t left = size, at = doff;
    while (left) {
        size_t chunk = left < sizeof(zeros) ? (size_t)left : sizeof(zeros);
        if (sfs_pwrite_all(s->fd, zeros, chunk, at) < 0)
            goto io;
        left -= chunk;
        at += chunk;
    }
    if (fdatasync(s->fd) < 0 && errno != EINVAL)
        goto io;
    uint8_t empty[SFS_SLOT_SIZE] = {0};
    put_be64(empty + SFS_KEY_SIZE, SFS_EMPTY_OFFSET);
    if (sfs_pwrite_all(s->fd, empty, sizeof(empty),
                   s->header.index_position + (uint64_t)slot * SFS_SLOT_SIZE) < 0)
        goto io;
    if (sfs_pwrite_all(s->fd, zeros, SFS_SIZE_FIELD_SIZE, doff - SFS_SIZE_FIELD_SIZE) < 0)
        goto io;
    if (fdatasync(s->fd) < 0 && errno != EINVAL)
        goto io;
    __atomic_store_n(&s->live, 0, __ATOMIC_RELAXED);
    return SFS_OK;
io:
    return sfs_fail(err, SFS_EIO, errno, "%s: %s", s->path, strerror(errno));
}
