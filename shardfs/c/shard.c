/*
 * shard.c — open, validate and read Read Shards; check and delete.
 *
 * Whatever its kind of source (kind.h: a file or block device, an RBD
 * image), an open shard's header, index and hash sections are mapped in
 * local memory: lookups are plain loads from the mapping, common to every
 * kind, with no lock, no file position and no system call on the hot
 * path. An object's size and bytes come from the kind's operations. Every
 * offset and size read from the shard is checked against the section it
 * must lie in before use, here, before a kind's operation is called.
 */
#define _GNU_SOURCE
#include "shard.h"
#include "chd.h"
#include "internal.h"
#include "kind.h"

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
int sfs_validate_header(sfs_shard_t *s, const uint8_t raw[SFS_HEADER_END], sfs_error_t *err)
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

/* The kinds of source (kind.h), in the order they are asked to claim one:
 * the file kind, which claims any, last. */
static const sfs_kind_t *const sfs_kinds[] = {&sfs_kind_rbd, &sfs_kind_s3, &sfs_kind_file};

static int open_kind(const sfs_kind_t *kind, const char *path, int writable, sfs_shard_t **out, sfs_error_t *err);

int sfs_open(const char *path, int writable, sfs_shard_t **out, sfs_error_t *err)
{
    *out = NULL;
    const sfs_kind_t *kind = &sfs_kind_file;
    for (size_t i = 0; i < sizeof(sfs_kinds) / sizeof(*sfs_kinds); i++)
        if (sfs_kinds[i]->claims(path)) {
            kind = sfs_kinds[i];
            break;
        }
    int rc = open_kind(kind, path, writable, out, err);
    if (rc == SFS_EKIND) /* the file or s3 kind found a MOSAIC file */
        rc = open_kind(&sfs_kind_mosaic, path, writable, out, err);
    return rc;
}

static int open_kind(const sfs_kind_t *kind, const char *path, int writable, sfs_shard_t **out, sfs_error_t *err)
{
    sfs_shard_t *s = calloc(1, sizeof(*s) + kind->state_size);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    }
    s->kind = kind;
    s->fd = -1;
    s->writable = writable;
    int rc = kind->open(s, err);
    if (rc != SFS_OK) {
        sfs_close(s);
        return rc;
    }
    *out = s;
    return SFS_OK;
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
    if (s->kind->close)
        s->kind->close(s);
    if (s->map)
        munmap((void *)s->map, s->map_size);
    if (s->fd >= 0)
        close(s->fd);
    free(s->path);
    free(s);
}

const sfs_header_t *sfs_header(const sfs_shard_t *s) { return &s->header; }
const char *sfs_kind_name(const sfs_shard_t *s) { return s->kind->name; }
unsigned sfs_kind_flags(const sfs_shard_t *s) { return s->kind->flags | s->flags; }
const char *sfs_path(const sfs_shard_t *s) { return s->path; }
int sfs_fd(const sfs_shard_t *s) { return s->fd; }
uint64_t sfs_slot_count(const sfs_shard_t *s) { return s->slots; }
uint64_t sfs_extent(const sfs_shard_t *s) { return s->extent; }
uint64_t sfs_hash_size(const sfs_shard_t *s) { return s->chd.dump_size; }

uint32_t sfs_slot_of(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE])
{
    if (s->kind->slot_of) {
        uint64_t slot = s->kind->slot_of(s, key);
        return slot < UINT32_MAX ? (uint32_t)slot : UINT32_MAX;
    }
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
    if (s->kind->slot_entry)
        return s->kind->slot_entry(s, slot, key_out);
    const uint8_t *p = slot_ptr(s, slot);
    if (key_out)
        memcpy(key_out, p, SFS_KEY_SIZE);
    return be64(p + SFS_KEY_SIZE);
}

void sfs_prefetch_slot_entry(const sfs_shard_t *s, uint64_t slot)
{
    if (slot < s->slots && !s->kind->slot_entry)
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

/* The size of the object of slot `slot` whose size field is at `offset`
 * (size_field_ok), as the kind knows it: the field itself, or a table. */
static inline uint64_t size_at(const sfs_shard_t *s, uint64_t slot, uint64_t offset)
{
    return s->kind->object_size(s, slot, offset);
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
    if (s->kind->find) {
        uint64_t offset;
        int rc = s->kind->find(s, key, slot, &offset);
        return rc == SFS_OK ? resolve(s, *slot, offset, data_offset, size) : rc;
    }
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
    if (s->kind->find) { /* the kind's own index: one key at a time */
        for (size_t i = 0; i < n; i++) {
            found[i].status = sfs_lookup_slot(s, keys + SFS_KEY_SIZE * i, &found[i].slot, &found[i].data_offset,
                                              &found[i].size);
            if (found[i].status != SFS_OK)
                found[i].data_offset = found[i].size = 0;
            bad += found[i].status == SFS_ECORRUPT;
        }
        return bad;
    }
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
                    if (s->kind->prefetch_size && size_field_ok(s, offset))
                        s->kind->prefetch_size(s, f->slot, offset, cold);
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
int sfs_page_cache_read(const sfs_shard_t *s, void *dst, size_t length, uint64_t offset)
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
    if (!size_field_ok(s, offset))
        return SFS_ECORRUPT;
    uint64_t n = 0;
    int rc = s->kind->object_size_nowait ? s->kind->object_size_nowait(s, slot, offset, &n) : SFS_EAGAIN;
    if (rc != SFS_OK)
        return rc;
    if (!object_fits(s, offset, n))
        return SFS_ECORRUPT;
    *data_offset = offset + SFS_SIZE_FIELD_SIZE;
    *size = n;
    return SFS_OK;
}

/* The 40 bytes of slot `slot` (< s->slots) from the page cache only. */
static int slot_nowait(const sfs_shard_t *s, uint64_t slot, uint8_t raw[SFS_SLOT_SIZE])
{
    return sfs_page_cache_read(s, raw, SFS_SLOT_SIZE, s->header.index_position + slot * (uint64_t)SFS_SLOT_SIZE);
}

int sfs_lookup_nowait(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                      uint64_t *data_offset, uint64_t *size)
{
    if (s->kind->find)
        return SFS_EAGAIN;
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
    if (s->kind->slot_entry)
        return SFS_EAGAIN;
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
    if (!s->kind->read_nowait) /* object bytes are never in this host's page cache */
        return length ? SFS_EAGAIN : SFS_OK;
    return s->kind->read_nowait(s, offset, dst, length);
}

int sfs_prefetch(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    if (!in_objects(s, offset, length))
        return SFS_EINVAL;
    if (length && s->kind->prefetch)
        s->kind->prefetch(s, offset, length);
    return SFS_OK;
}

void sfs_prefetch_reader(const sfs_shard_t *s)
{
    if (!s)
        return;
    for (size_t at = 0; at < offsetof(sfs_shard_t, live); at += 64)
        __builtin_prefetch((const char *)s + at, 0, 3);
}

void sfs_prefetch_slot(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE])
{
    if (s->kind->find)
        return;
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
    if (!s->kind->data || !in_objects(s, offset, length))
        return NULL;
    return s->kind->data(s, offset, length);
}

const char *sfs_source_error(const sfs_shard_t *s)
{
    return s->kind->source_error ? s->kind->source_error(s) : NULL;
}

int sfs_read(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    if (!in_objects(s, offset, length))
        return SFS_EINVAL;
    return s->kind->read(s, offset, dst, length);
}

int sfs_read_many(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                  void *const *dsts, int *results)
{
    for (size_t i = 0; i < n; i++)
        results[i] = in_objects(s, offsets[i], lengths[i]) ? SFS_OK : SFS_EINVAL;
    if (s->kind->read_batch) {
        s->kind->read_batch(s, n, offsets, lengths, dsts, results);
        return SFS_OK;
    }
    int first_errno = 0;
    for (size_t i = 0; i < n; i++)
        if (results[i] == SFS_OK && (results[i] = s->kind->read(s, offsets[i], dsts[i], lengths[i])) != SFS_OK &&
            !first_errno)
            first_errno = errno;
    if (first_errno)
        errno = first_errno;
    return SFS_OK;
}

ssize_t sfs_source_read(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset)
{
    return s->kind->source_read(s, fd, buf, len, offset);
}

uint64_t sfs_live_count(sfs_shard_t *s)
{
    uint64_t cached = __atomic_load_n(&s->live, __ATOMIC_RELAXED);
    if (cached)
        return cached - 1;
    uint64_t live = 0;
    for (uint64_t i = 0; i < s->slots; i++)
        live += sfs_slot_get(s, i, NULL) != SFS_EMPTY_OFFSET;
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
    if (s->kind->slot_entry) { /* sfs_index_read reads the kind's index, not this descriptor */
        if ((*fd_out = fcntl(s->fd, F_DUPFD_CLOEXEC, 0)) < 0)
            return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
        return SFS_OK;
    }
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

int sfs_index_fd(const sfs_shard_t *s, int *fd, int *owned, sfs_error_t *err)
{
    if (!s->kind->slot_entry && sfs_slot_count(s) * SFS_SLOT_SIZE <= SFS_SMALL_INDEX) {
        *fd = s->fd;
        *owned = 0;
        return SFS_OK;
    }
    *owned = 1;
    return sfs_reopen_for_index(s, fd, err);
}

int sfs_index_read(const sfs_shard_t *s, int fd, uint64_t first, uint64_t count, uint8_t *buf)
{
    if (!s->kind->slot_entry)
        return sfs_pread_full(fd, buf, count * SFS_SLOT_SIZE, s->header.index_position + first * SFS_SLOT_SIZE);
    if (first > s->slots || count > s->slots - first) {
        errno = EIO;
        return SFS_PREAD_SHORT;
    }
    for (uint64_t i = 0; i < count; i++) {
        uint8_t *p = buf + i * SFS_SLOT_SIZE;
        uint64_t offset = s->kind->slot_entry(s, first + i, p);
        if (offset == SFS_EMPTY_OFFSET)
            memset(p, 0, SFS_KEY_SIZE);
        put_be64(p + SFS_KEY_SIZE, offset);
    }
    return 0;
}

int sfs_own_digests(const sfs_shard_t *s, int hash, void (*emit)(void *ctx, const uint8_t *digest, uint32_t slot),
                    void *ctx)
{
    return s->kind->own_digests ? s->kind->own_digests(s, hash, emit, ctx) : SFS_ENOTFOUND;
}

size_t sfs_identity_ranges(const sfs_shard_t *s, uint64_t *offsets, uint64_t *lengths, size_t max)
{
    return s->kind->identity_ranges ? s->kind->identity_ranges(s, offsets, lengths, max) : 0;
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
    if (!s->writable) /* a kind that cannot be written refused it at open */
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
