/*
 * kind_mosaic.c — the "mosaic" kind (kind.h): a shard that is a Software
 * Heritage MOSAIC file (mosaic.h), served by its SHA-256 index.
 *
 * Chosen by content: the file kind hands over any file that starts with
 * EBML's magic (1A 45 DF A3). Keys are found by the file's own perfect
 * hash (the sha256 index's GOFunction, ph.h) and its entries, read live
 * from the mapping: an object deleted in place by swh's MosaicUpdater is
 * absent from the next lookup on, with no copy to refresh.
 *
 * The rest of shardfs sees a Read Shard of the same slots (kind.h, find):
 * slot i is entry i of the sha256 index, its object's "size field" at
 * byte offset 88 + i * 2^32 and its bytes 8 bytes after (a view: no such
 * bytes exist in the file). The objects section is [88, 88 + slots * 2^32),
 * the index follows it, 40 bytes per slot, as sfs_index_read gives it;
 * there is no hash section. Hence: at most 2^30 slots, and an object of
 * at most 2^32 - 8 bytes (larger ones are refused as corrupt); both far
 * above what SWH writes (50 million objects a shard, 100 MB an object).
 *
 * An object's size is its decoded size (mosaic.h: a zstd object's frame
 * headers give it); its bytes are copied from the mapping (no compression)
 * or decoded from the object's first byte (zstd: a read at offset N
 * decodes N bytes first), with one zstd context per thread. Not writable:
 * shardfs never writes MOSAIC files (swh's MosaicUpdater does).
 */
#define _GNU_SOURCE
#include "internal.h"
#include "kind.h"
#include "mosaic.h"
#include "remote_copy.h"
#include "s3.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SLOT_SHIFT 32
#define MAX_SLOTS (1ull << 30)
#define MAX_OBJECT ((1ull << SLOT_SHIFT) - SFS_SIZE_FIELD_SIZE)
/* Raw ranges up to this many bytes are copied from the mapping; longer
 * ones are read with pread (kind_file.c's MMAP_COPY_MAX). */
#define MMAP_COPY_MAX (16 * 1024)

typedef struct {
    sfs_mosaic_t *m;
    size_t index; /* the sha256 index */
    sfs_s3_t *s3; /* a file in S3: m maps its local copy, objects are read with GETs (remote_open) */
} mosaic_state_t;

static inline const mosaic_state_t *state_of(const sfs_shard_t *s) { return sfs_kind_state(s); }

static inline uint64_t size_field_of(uint64_t slot) { return SFS_HEADER_END + (slot << SLOT_SHIFT); }

/* The slot and the byte within its view [size field, object bytes) of a
 * byte offset inside the objects section. */
static inline void split(uint64_t offset, uint64_t *slot, uint64_t *within)
{
    uint64_t v = offset - SFS_HEADER_END;
    *slot = v >> SLOT_SHIFT;
    *within = v & ((1ull << SLOT_SHIFT) - 1);
}

static void cache_forget(const sfs_mosaic_t *m);
static int remote_open(sfs_shard_t *s, char *copy_path, size_t cap, sfs_error_t *err);

static int mosaic_claims(const char *source) { return 0; /* by content only: file_open */ }

static int mosaic_open(sfs_shard_t *s, sfs_error_t *err)
{
    mosaic_state_t *st = sfs_kind_state(s);
    if (s->writable)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: a MOSAIC file: shardfs does not write it (delete its "
                        "objects with swh's MosaicUpdater)", s->path);
    char copy_path[4096];
    const char *local = s->path;
    if (sfs_is_s3_source(s->path)) {
        int rc = remote_open(s, copy_path, sizeof(copy_path), err);
        if (rc != SFS_OK)
            return rc;
        local = copy_path;
        s->flags |= SFS_KIND_REMOTE;
    }
    int rc = sfs_mosaic_open(local, &st->m, err);
    if (rc != SFS_OK)
        return rc;
    const sfs_mosaic_info_t *info = sfs_mosaic_info(st->m);
    int x = sfs_mosaic_find_index(st->m, SFS_MOSAIC_SHA256);
    if (x < 0)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: a MOSAIC file without a sha256 index: shardfs serves "
                        "objects by SHA-256 (read it with shardfs get --hash)", s->path);
    st->index = (size_t)x;
    uint64_t slots = sfs_mosaic_index(st->m, st->index)->slots;
    if (slots > MAX_SLOTS)
        return sfs_fail(err, SFS_ECORRUPT, 0, "%s: %llu entries in its sha256 index, more than the "
                        "%llu a MOSAIC shard may have", s->path, (unsigned long long)slots,
                        (unsigned long long)MAX_SLOTS);
    /* the descriptor sfs_reopen_for_index and posix_fadvise use */
    s->fd = open(local, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", s->path, strerror(errno));
    sfs_header_t *h = &s->header;
    h->version = SFS_VERSION;
    h->objects_count = info->objects_counter < slots ? info->objects_counter : slots;
    h->objects_position = SFS_HEADER_END;
    h->objects_size = slots << SLOT_SHIFT;
    h->index_position = h->objects_position + h->objects_size;
    h->index_size = slots * SFS_SLOT_SIZE;
    h->hash_position = h->index_position + h->index_size;
    s->slots = slots;
    s->objects_end = h->index_position;
    s->file_size = info->file_size;
    s->extent = info->file_size;
    if (info->compression != SFS_MOSAIC_NONE)
        s->flags |= SFS_KIND_DECODES;
    return SFS_OK;
}

static void mosaic_close(sfs_shard_t *s)
{
    mosaic_state_t *st = sfs_kind_state(s);
    if (st->m)
        cache_forget(st->m);
    sfs_mosaic_close(st->m);
    st->m = NULL;
    sfs_s3_close(st->s3);
    st->s3 = NULL;
}

static int mosaic_find(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot, uint64_t *offset)
{
    const mosaic_state_t *st = state_of(s);
    uint64_t entry, object;
    int rc = sfs_mosaic_lookup(st->m, st->index, key, SFS_KEY_SIZE, &entry, &object, NULL);
    if (rc == SFS_ENOTFOUND)
        return rc;
    if (rc != SFS_OK)
        return SFS_ECORRUPT;
    *slot = (uint32_t)entry;
    *offset = size_field_of(entry);
    return SFS_OK;
}

static uint64_t mosaic_slot_of(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE])
{
    const mosaic_state_t *st = state_of(s);
    int64_t v = sfs_mosaic_slot_of(st->m, st->index, key, SFS_KEY_SIZE);
    return v < 0 ? UINT64_MAX : (uint64_t)v;
}

static uint64_t mosaic_slot_entry(const sfs_shard_t *s, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE])
{
    const mosaic_state_t *st = state_of(s);
    return sfs_mosaic_slot(st->m, st->index, slot, key_out, NULL, NULL) == SFS_OK ? size_field_of(slot)
                                                                                : SFS_EMPTY_OFFSET;
}

/* The object element of `slot`, read again from its entry (a deleted
 * one: SFS_ENOTFOUND). */
static int object_of(const mosaic_state_t *st, uint64_t slot, uint64_t *object)
{
    return sfs_mosaic_slot(st->m, st->index, slot, NULL, object, NULL);
}

static uint64_t mosaic_object_size(const sfs_shard_t *s, uint64_t slot, uint64_t offset)
{
    const mosaic_state_t *st = state_of(s);
    uint64_t object, size;
    if (object_of(st, slot, &object) != SFS_OK ||
        (st->s3 ? sfs_mosaic_declared_size(st->m, object, &size, NULL)
                : sfs_mosaic_object_size(st->m, sfs_mosaic_thread_ctx(st->m), object, &size, NULL, NULL)) != SFS_OK ||
        size > MAX_OBJECT)
        return UINT64_MAX; /* refused by the caller: SFS_ECORRUPT */
    return size;
}

static const uint8_t *mosaic_data(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    const mosaic_state_t *st = state_of(s);
    uint64_t slot, within, object, stored;
    split(offset, &slot, &within);
    if (within < SFS_SIZE_FIELD_SIZE || sfs_mosaic_info(st->m)->compression != SFS_MOSAIC_NONE || st->s3 ||
        object_of(st, slot, &object) != SFS_OK)
        return NULL;
    const uint8_t *p = sfs_mosaic_stored(st->m, object, &stored, NULL);
    within -= SFS_SIZE_FIELD_SIZE;
    return p && within <= stored && length <= stored - within ? p + within : NULL;
}

/* ---------------------------------------------------------------- a MOSAIC file in S3
 *
 * Source "s3://BUCKET/KEY" whose first bytes are EBML's magic (the s3 kind
 * hands it over: SFS_EKIND). Its local copy, in the cache directory as the
 * s3 kind's (<cache>/s3/<bucket>/<key>.<ETag>-<size>.mosaic), is a sparse
 * file as large as the object holding its bytes before the tiles (EBML
 * header, ContainerMetaData), every byte after them (the indexes), and the
 * first HEAD_BYTES of every Object element the sha256 index names (its ID,
 * size and zstd frame header): mosaic.c opens it as the file, a lookup and
 * an object's size read only it (sfs_mosaic_declared_size), and a cold
 * object costs one ranged GET of its stored bytes. Built once per ETag;
 * every GET carries If-Match (a replaced object: ESTALE). */

#define HEAD_BYTES 32            /* of each Object element: ID (1), size (<= 8), frame header (<= 18) */
#define METADATA_MAX (16u << 20) /* bytes before the tiles read at most (the zstd dictionary is there) */
#define HEAD_BATCH 256           /* element heads asked at once */

/* Build the local copy of s->path (`size` bytes) at copy_path. */
static int remote_build(const char *src, sfs_s3_t *s3, uint64_t size, const char *copy_path, sfs_error_t *err)
{
    int fd = -1, rc;
    char *tmp = NULL, self[64];
    uint8_t *buf = malloc(SFS_COPY_CHUNK);
    sfs_mosaic_t *m = NULL;
    uint64_t tiles, end;
    if (!buf)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", src);
    if ((rc = sfs_copy_directories(src, copy_path, err)) != SFS_OK ||
        (rc = sfs_output_create(copy_path, 0644, &fd, &tmp, err)) != SFS_OK)
        goto out;
    if (ftruncate(fd, (off_t)size) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: its local copy: %s", src, strerror(errno));
        goto out;
    }
    snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
    /* the metadata, then the indexes, then every object's head */
    if ((rc = sfs_copy_range(src, &sfs_s3_ops, s3, fd, 0, size < METADATA_MAX ? size : METADATA_MAX, buf, err)) != SFS_OK ||
        (rc = sfs_mosaic_layout(self, &tiles, &end, err)) != SFS_OK ||
        (rc = sfs_copy_range(src, &sfs_s3_ops, s3, fd, end > METADATA_MAX ? end : METADATA_MAX, size, buf, err)) !=
            SFS_OK ||
        (rc = sfs_mosaic_open(self, &m, err)) != SFS_OK)
        goto out;
    int x = sfs_mosaic_find_index(m, SFS_MOSAIC_SHA256);
    uint64_t slots = x < 0 ? 0 : sfs_mosaic_index(m, (size_t)x)->slots;
    uint64_t offs[HEAD_BATCH];
    size_t lens[HEAD_BATCH];
    void *bufs[HEAD_BATCH];
    int64_t got[HEAD_BATCH];
    for (uint64_t first = 0; first < slots && rc == SFS_OK; first += HEAD_BATCH) {
        size_t k = 0;
        for (uint64_t i = first; i < slots && i < first + HEAD_BATCH; i++) {
            uint64_t object;
            if (sfs_mosaic_slot(m, (size_t)x, i, NULL, &object, NULL) != SFS_OK || object < tiles || object >= end)
                continue; /* deleted (checked again at every read) */
            offs[k] = object;
            lens[k] = end - object < HEAD_BYTES ? (size_t)(end - object) : HEAD_BYTES;
            bufs[k] = buf + k * HEAD_BYTES;
            k++;
        }
        if (k && sfs_s3_pread_many(s3, k, offs, lens, bufs, got) < 0)
            rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", src);
        for (size_t j = 0; j < k && rc == SFS_OK; j++)
            if (got[j] != (int64_t)lens[j])
                rc = sfs_fail(err, SFS_EIO, got[j] < 0 ? (int)-got[j] : EIO, "%s: reading the object at byte %llu: %s",
                              src, (unsigned long long)offs[j], got[j] < 0 ? sfs_s3_error(s3) : "short read");
            else if (sfs_pwrite_all(fd, bufs[j], lens[j], offs[j]) < 0)
                rc = sfs_fail(err, SFS_EIO, errno, "%s: writing its local copy: %s", src, strerror(errno));
    }
    if (rc != SFS_OK)
        goto out;
    if (fdatasync(fd) < 0 || sfs_output_publish(fd, &tmp, copy_path) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: writing its local copy %s: %s", src, copy_path, strerror(errno));
        goto out;
    }
    sfs_sync_directory(copy_path);
out:
    sfs_mosaic_close(m);
    sfs_output_discard(fd, &tmp);
    free(buf);
    return rc;
}

/* The connection and the local copy (built when missing) of s->path, a
 * MOSAIC file in S3: its path into copy_path. */
static int remote_open(sfs_shard_t *s, char *copy_path, size_t cap, sfs_error_t *err)
{
    mosaic_state_t *st = sfs_kind_state(s);
    const char *cache;
    uint64_t size;
    char etag[SFS_S3_ETAG_MAX];
    int rc = sfs_s3_open_object(s->path, &st->s3, &size, etag, &cache, err);
    if (rc != SFS_OK || (rc = sfs_s3_copy_path(st->s3, cache, etag, size, "mosaic", copy_path, cap, err)) != SFS_OK)
        return rc;
    if (access(copy_path, F_OK) == 0)
        return SFS_OK;
    return remote_build(s->path, st->s3, size, copy_path, err);
}

/* Bytes [within, within + length) of the object at `object`: one GET of
 * its stored bytes (the part asked, for a raw file), decoded here. */
static int remote_read(const mosaic_state_t *st, uint64_t object, uint64_t within, void *dst, size_t length)
{
    uint64_t data, stored;
    size_t got = 0;
    int rc = sfs_mosaic_object(st->m, object, &data, &stored, NULL);
    if (rc != SFS_OK) {
        errno = EIO;
        return SFS_EIO;
    }
    if (sfs_mosaic_info(st->m)->compression == SFS_MOSAIC_NONE) {
        if (within > stored || length > stored - within) {
            errno = EIO;
            return SFS_EIO;
        }
        int64_t n = length ? sfs_s3_pread(st->s3, dst, length, data + within) : 0;
        if (n == (int64_t)length)
            return SFS_OK;
        errno = n < 0 ? (int)-n : EIO;
        return SFS_EIO;
    }
    uint8_t *bytes = malloc(stored ? stored : 1);
    if (!bytes) {
        errno = ENOMEM;
        return SFS_EIO;
    }
    int64_t n = stored ? sfs_s3_pread(st->s3, bytes, stored, data) : 0;
    if (n != (int64_t)stored) {
        free(bytes);
        errno = n < 0 ? (int)-n : EIO;
        return SFS_EIO;
    }
    rc = sfs_mosaic_decode(st->m, sfs_mosaic_thread_ctx(st->m), object, bytes, stored, within, dst, length, &got,
                           NULL);
    free(bytes);
    if (rc != SFS_OK || got != length) {
        errno = rc == SFS_ENOMEM ? ENOMEM : EIO;
        return SFS_EIO;
    }
    return SFS_OK;
}

/* ---------------------------------------------------------------- decoded objects
 *
 * A compressed object read in pieces (the kernel's READs of 128 KiB, the
 * reads ahead that come with them, several threads at once) would be
 * decoded from its start for each piece. The process keeps the objects
 * of more than one piece that it decoded last, whole, in this cache (at
 * most CACHE_BYTES in all): the first read of such an object decodes it
 * once; reads of it that come meanwhile wait for that decoding (a
 * condition variable) instead of starting their own. A read of such an
 * object whole goes through it too: the request path's first READ of an
 * object decodes it whole (ll_fast_read) while the kernel already asks
 * for the next pieces, which then wait for that decoding instead of
 * decoding it again. Keyed by (file,
 * object element position): an entry is only used after the object's
 * index entry was read again and is live (read_object), so a deleted
 * object is never served from it; the entries of a file go when it is
 * closed (no read runs then: kind.h). */

#define CACHE_BYTES (64ull << 20)
#define CACHE_OBJECT_MIN (128ull << 10) /* one READ's worth: decoded at once */
#define CACHE_WAIT_SECONDS 2

typedef struct decoded {
    struct decoded *next;
    const sfs_mosaic_t *m;
    uint64_t object, size, used;
    uint8_t *bytes;
    int state; /* DECODING, READY, FAILED */
    int refs;
} decoded_t;

enum { DECODING, READY, FAILED };

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cache_done = PTHREAD_COND_INITIALIZER;
static decoded_t *cache_list;
static uint64_t cache_bytes, cache_clock;

/* Unlink and free entry *at (unreferenced), under cache_lock. */
static void cache_drop(decoded_t **at)
{
    decoded_t *e = *at;
    *at = e->next;
    cache_bytes -= e->size;
    free(e->bytes);
    free(e);
}

/* Room for `size` more bytes, dropping the least recently used entries
 * no read holds; 0 when there is not enough. Under cache_lock. */
static int cache_room(uint64_t size)
{
    while (cache_bytes + size > CACHE_BYTES) {
        decoded_t **oldest = NULL;
        for (decoded_t **at = &cache_list; *at; at = &(*at)->next)
            if ((*at)->refs == 0 && (!oldest || (*at)->used < (*oldest)->used))
                oldest = at;
        if (!oldest)
            return 0;
        cache_drop(oldest);
    }
    return 1;
}

static void cache_forget(const sfs_mosaic_t *m)
{
    pthread_mutex_lock(&cache_lock);
    for (decoded_t **at = &cache_list; *at;)
        if ((*at)->m == m && (*at)->refs == 0)
            cache_drop(at);
        else
            at = &(*at)->next;
    pthread_mutex_unlock(&cache_lock);
}

/* Bytes [within, within + length) of the decoded object at `object`
 * (`size` bytes) through the cache: SFS_OK; SFS_EAGAIN when the cache
 * cannot hold it (the caller decodes it itself); else an error of
 * sfs_mosaic_read. */
static int cache_read(const sfs_mosaic_t *m, uint64_t object, uint64_t size, uint64_t within, void *dst,
                      size_t length)
{
    pthread_mutex_lock(&cache_lock);
    decoded_t *e = cache_list;
    while (e && (e->m != m || e->object != object))
        e = e->next;
    if (!e) {
        if (!cache_room(size) || !(e = calloc(1, sizeof(*e))) || !(e->bytes = malloc(size ? size : 1))) {
            if (e)
                free(e);
            pthread_mutex_unlock(&cache_lock);
            return SFS_EAGAIN;
        }
        e->m = m;
        e->object = object;
        e->size = size;
        e->state = DECODING;
        e->refs = 1;
        e->next = cache_list;
        cache_list = e;
        cache_bytes += size;
        pthread_mutex_unlock(&cache_lock);
        size_t got = 0;
        int rc = sfs_mosaic_read(m, sfs_mosaic_thread_ctx(m), object, 0, e->bytes, size, &got, NULL);
        pthread_mutex_lock(&cache_lock);
        e->state = rc == SFS_OK && got == size ? READY : FAILED;
        pthread_cond_broadcast(&cache_done);
    } else {
        /* bounded: a decoding abandoned on SIGBUS (a file cut short under
         * it: guard.h) never ends; its waiters then decode themselves */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += CACHE_WAIT_SECONDS;
        e->refs++;
        while (e->state == DECODING)
            if (pthread_cond_timedwait(&cache_done, &cache_lock, &until) == ETIMEDOUT)
                break;
    }
    e->used = ++cache_clock;
    pthread_mutex_unlock(&cache_lock);
    int rc = SFS_EAGAIN; /* a failed decoding: the caller decodes again and reports it */
    if (e->state == READY && within <= e->size && length <= e->size - within) {
        memcpy(dst, e->bytes + within, length);
        rc = SFS_OK;
    }
    pthread_mutex_lock(&cache_lock);
    e->refs--;
    if (e->state == FAILED && e->refs == 0)
        for (decoded_t **at = &cache_list; *at; at = &(*at)->next)
            if (*at == e) {
                cache_drop(at);
                break;
            }
    pthread_mutex_unlock(&cache_lock);
    return rc;
}

/* Object bytes [within, within + length) of slot's object into dst:
 * SFS_OK, or SFS_EIO with errno (EIO: deleted, damaged or shorter). */
static int read_object(const sfs_shard_t *s, uint64_t slot, uint64_t within, void *dst, size_t length)
{
    const mosaic_state_t *st = state_of(s);
    uint64_t object, data, stored;
    size_t got = 0;
    int rc = object_of(st, slot, &object);
    if (rc == SFS_OK && st->s3)
        return remote_read(st, object, within, dst, length);
    if (rc == SFS_OK && length > MMAP_COPY_MAX && sfs_mosaic_info(st->m)->compression == SFS_MOSAIC_NONE &&
        (rc = sfs_mosaic_object(st->m, object, &data, &stored, NULL)) == SFS_OK) {
        /* one device request for the range, not one per 4 KiB page fault
         * of the mapping (MADV_RANDOM), as the file kind does */
        if (within > stored || length > stored - within) {
            errno = EIO;
            return SFS_EIO;
        }
        int r = sfs_pread_full(s->fd, dst, length, data + within);
        return r == 0 ? SFS_OK : SFS_EIO; /* errno set */
    }
    uint64_t size;
    if (rc == SFS_OK && sfs_mosaic_info(st->m)->compression != SFS_MOSAIC_NONE &&
        sfs_mosaic_object(st->m, object, &data, &stored, NULL) == SFS_OK && stored > MMAP_COPY_MAX)
        /* the stored bytes asked of the device at once, not one page
         * fault at a time (MADV_RANDOM): 8 MiB decoded from a cold file
         * went from 85 to ~15 ms */
        sfs_mosaic_prefetch_object(st->m, object, data - object + stored);
    if (rc == SFS_OK && sfs_mosaic_info(st->m)->compression != SFS_MOSAIC_NONE &&
        sfs_mosaic_object_size(st->m, sfs_mosaic_thread_ctx(st->m), object, &size, NULL, NULL) == SFS_OK &&
        size > CACHE_OBJECT_MIN && size <= CACHE_BYTES / 2 &&
        cache_read(st->m, object, size, within, dst, length) == SFS_OK)
        return SFS_OK;
    if (rc == SFS_OK)
        rc = sfs_mosaic_read(st->m, sfs_mosaic_thread_ctx(st->m), object, within, dst, length, &got, NULL);
    if (rc == SFS_ENOMEM) {
        errno = ENOMEM;
        return SFS_EIO;
    }
    if (rc != SFS_OK || got != length) {
        errno = EIO;
        return SFS_EIO;
    }
    return SFS_OK;
}

static int mosaic_read(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length)
{
    uint64_t slot, within;
    split(offset, &slot, &within);
    if (within < SFS_SIZE_FIELD_SIZE) { /* not an object range (shard.c checks only the section) */
        errno = EINVAL;
        return SFS_EIO;
    }
    return read_object(s, slot, within - SFS_SIZE_FIELD_SIZE, dst, length);
}

static void mosaic_prefetch(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    const mosaic_state_t *st = state_of(s);
    uint64_t slot, within, object;
    split(offset, &slot, &within);
    if (!st->s3 && object_of(st, slot, &object) == SFS_OK)
        sfs_mosaic_prefetch_object(st->m, object, within + length);
}

/* Ranges of several objects (sfs_read_many: Shard.get_batch, index
 * builds): in S3, every GET of a group in flight at once (a zstd object's
 * stored bytes whole, decoded once arrived); in a file, one after the
 * other. */
static void mosaic_read_batch(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                              void *const *dsts, int *results)
{
    enum { BATCH = 64 };
    const mosaic_state_t *st = state_of(s);
    int first_errno = 0, zstd = sfs_mosaic_info(st->m)->compression != SFS_MOSAIC_NONE;
    for (size_t i = 0; i < n && !st->s3; i++)
        if (results[i] == SFS_OK && (results[i] = mosaic_read(s, offsets[i], dsts[i], lengths[i])) != SFS_OK &&
            !first_errno)
            first_errno = errno;
    for (size_t base = 0; base < n && st->s3; base += BATCH) {
        uint64_t offs[BATCH], within[BATCH], objects[BATCH];
        size_t lens[BATCH], at[BATCH], k = 0;
        void *bufs[BATCH];
        int64_t got[BATCH];
        for (size_t i = base; i < n && i < base + BATCH; i++) {
            uint64_t slot, w, object, data, stored;
            if (results[i] != SFS_OK || !lengths[i])
                continue;
            split(offsets[i], &slot, &w);
            if (w < SFS_SIZE_FIELD_SIZE || object_of(st, slot, &object) != SFS_OK ||
                sfs_mosaic_object(st->m, object, &data, &stored, NULL) != SFS_OK ||
                (!zstd && (w - SFS_SIZE_FIELD_SIZE > stored || lengths[i] > stored - (w - SFS_SIZE_FIELD_SIZE)))) {
                results[i] = SFS_EIO;
                first_errno = first_errno ? first_errno : EIO;
                continue;
            }
            w -= SFS_SIZE_FIELD_SIZE;
            offs[k] = zstd ? data : data + w;
            lens[k] = zstd ? (size_t)stored : lengths[i];
            bufs[k] = zstd ? malloc(stored ? stored : 1) : dsts[i];
            within[k] = w;
            objects[k] = object;
            at[k] = i;
            if (!bufs[k]) {
                results[i] = SFS_EIO;
                first_errno = first_errno ? first_errno : ENOMEM;
                continue;
            }
            k++;
        }
        if (k && sfs_s3_pread_many(st->s3, k, offs, lens, bufs, got) < 0)
            for (size_t j = 0; j < k; j++)
                got[j] = -ENOMEM;
        for (size_t j = 0; j < k; j++) {
            size_t i = at[j], decoded = 0;
            int e = got[j] < 0 ? (int)-got[j] : got[j] != (int64_t)lens[j] ? EIO : 0;
            if (!e && zstd &&
                (sfs_mosaic_decode(st->m, sfs_mosaic_thread_ctx(st->m), objects[j], bufs[j], lens[j], within[j], dsts[i],
                                   lengths[i], &decoded, NULL) != SFS_OK ||
                 decoded != lengths[i]))
                e = EIO;
            if (zstd)
                free(bufs[j]);
            if (e) {
                results[i] = SFS_EIO;
                first_errno = first_errno ? first_errno : e;
            }
        }
    }
    if (first_errno)
        errno = first_errno;
}

/* The view (kind.h): from inside one slot's size field and object, up to
 * the object's end (fewer bytes than asked: the next call starts at the
 * next slot's size field, as a forward-only reader asks, hashindex.c). */
static ssize_t mosaic_source_read(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset)
{
    if (offset < SFS_HEADER_END || offset >= s->objects_end) {
        errno = EINVAL;
        return -1;
    }
    uint64_t slot, within;
    split(offset, &slot, &within);
    uint64_t size = mosaic_object_size(s, slot, 0);
    if (size == UINT64_MAX) {
        errno = EIO;
        return -1;
    }
    uint8_t *out = buf;
    size_t done = 0;
    if (within < SFS_SIZE_FIELD_SIZE) {
        uint8_t field[SFS_SIZE_FIELD_SIZE];
        for (int i = 0; i < SFS_SIZE_FIELD_SIZE; i++)
            field[i] = (uint8_t)(size >> (8 * (SFS_SIZE_FIELD_SIZE - 1 - i)));
        size_t n = SFS_SIZE_FIELD_SIZE - (size_t)within;
        n = n < len ? n : len;
        memcpy(out, field + within, n);
        done = n;
        within = SFS_SIZE_FIELD_SIZE;
    }
    uint64_t at = within - SFS_SIZE_FIELD_SIZE;
    if (done < len && at < size) {
        size_t n = len - done < size - at ? len - done : (size_t)(size - at);
        if (read_object(s, slot, at, out + done, n) != SFS_OK)
            return -1;
        done += n;
    }
    return (ssize_t)done;
}

typedef struct {
    uint64_t object;
    uint32_t slot;
} placed_t;

static int by_object(const void *a, const void *b)
{
    uint64_t x = ((const placed_t *)a)->object, y = ((const placed_t *)b)->object;
    return x < y ? -1 : x > y;
}

/* The file's own sha1 or sha1_git index, mapped to sha256 slots through
 * the object each entry names (both entries name the same Object element). */
static int mosaic_own_digests(const sfs_shard_t *s, int hash, void (*emit)(void *ctx, const uint8_t *digest, uint32_t slot),
                              void *ctx)
{
    const mosaic_state_t *st = state_of(s);
    int x = sfs_mosaic_find_index(st->m, hash == 1 ? SFS_MOSAIC_SHA1 : hash == 2 ? SFS_MOSAIC_SHA1_GIT : -1);
    if (x < 0)
        return SFS_ENOTFOUND;
    uint64_t n = 0, own = sfs_mosaic_index(st->m, (size_t)x)->slots;
    placed_t *placed = malloc((s->slots ? s->slots : 1) * sizeof(*placed));
    if (!placed)
        return SFS_ENOMEM;
    for (uint64_t i = 0; i < s->slots; i++)
        if (sfs_mosaic_slot(st->m, st->index, i, NULL, &placed[n].object, NULL) == SFS_OK)
            placed[n++].slot = (uint32_t)i;
    qsort(placed, n, sizeof(*placed), by_object);
    uint8_t digest[20];
    for (uint64_t i = 0; i < own; i++) {
        placed_t want;
        if (sfs_mosaic_slot(st->m, (size_t)x, i, digest, &want.object, NULL) != SFS_OK)
            continue; /* deleted */
        const placed_t *at = bsearch(&want, placed, n, sizeof(*placed), by_object);
        if (at)
            emit(ctx, digest, at->slot);
    }
    free(placed);
    return SFS_OK;
}

/* The sha256 index's GOFunction and the EBML header: no deletion changes
 * them (updater: Void elements over objects and entries, new CRC-32s and
 * counters), a copy of the file has them. */
static size_t mosaic_identity_ranges(const sfs_shard_t *s, uint64_t *offsets, uint64_t *lengths, size_t max)
{
    const mosaic_state_t *st = state_of(s);
    const sfs_mosaic_info_t *info = sfs_mosaic_info(st->m);
    const sfs_mosaic_index_info_t *x = sfs_mosaic_index(st->m, st->index);
    uint64_t probe = 4096;
    size_t n = 0;
    if (n < max) {
        offsets[n] = 0;
        lengths[n++] = info->metadata_position < probe ? info->metadata_position : probe;
    }
    if (n < max) {
        offsets[n] = x->map_position;
        lengths[n++] = x->map_size < probe ? x->map_size : probe;
    }
    if (n < max && x->map_size > probe) {
        offsets[n] = x->map_position + x->map_size - probe;
        lengths[n++] = probe;
    }
    return n;
}

const sfs_kind_t sfs_kind_mosaic = {
    .name = "mosaic",
    .flags = 0,
    .state_size = sizeof(mosaic_state_t),
    .claims = mosaic_claims,
    .open = mosaic_open,
    .close = mosaic_close,
    .object_size = mosaic_object_size,
    .data = mosaic_data,
    .read = mosaic_read,
    .read_batch = mosaic_read_batch,
    .prefetch = mosaic_prefetch,
    .source_read = mosaic_source_read,
    .find = mosaic_find,
    .slot_of = mosaic_slot_of,
    .slot_entry = mosaic_slot_entry,
    .identity_ranges = mosaic_identity_ranges,
    .own_digests = mosaic_own_digests,
};
