/*
 * lookup_pack.c — packs of lookup records (format and contract:
 * lookup_pack.h).
 */
#include "lookup_pack.h"
#include "internal.h"
#include "kind.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#define CHUNK_SLOTS 65536u /* index slots read per pread while a record is written */
#define SIZE_SAMPLES 64    /* size fields read to check the gaps' sizes */

static uint64_t pad8(uint64_t n) { return (n + 7) & ~(uint64_t)7; }

/* CRC-32 (zlib's) of a record of `size` bytes at `r`, its own CRC field
 * (bytes 56..60) taken as zero. */
static uint32_t record_crc(const uint8_t *r, uint64_t size)
{
    static const uint8_t zero[4];
    uLong crc = crc32_z(0, r, 56);
    crc = crc32_z(crc, zero, 4);
    return (uint32_t)crc32_z(crc, r + 60, size - 60);
}

struct sfs_lookup_pack {
    int refs; /* holders beyond the first */
    int fd;
    const uint8_t *map;
    uint64_t size;
    uint64_t count;
    uint64_t dir; /* byte offset of the directory */
};

/* ------------------------------------------------------------- writing */

typedef struct {
    uint8_t identity[32];
    uint64_t offset;
} dir_entry_t;

struct sfs_lookup_pack_writer {
    char *path;
    char *tmp;
    int fd;
    uint64_t end; /* where the next record goes */
    dir_entry_t *dir;
    size_t count, cap;
};

int sfs_lookup_pack_create(const char *path, sfs_lookup_pack_writer_t **out, sfs_error_t *err)
{
    *out = NULL;
    sfs_lookup_pack_writer_t *w = calloc(1, sizeof(*w));
    if (!w || !(w->path = strdup(path))) {
        free(w);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    }
    w->fd = -1;
    int rc = sfs_output_create(path, 0644, &w->fd, &w->tmp, err);
    if (rc != SFS_OK) {
        free(w->path);
        free(w);
        return rc;
    }
    w->end = SFS_LOOKUP_PACK_HEADER;
    *out = w;
    return SFS_OK;
}

void sfs_lookup_pack_abort(sfs_lookup_pack_writer_t *w)
{
    if (!w)
        return;
    sfs_output_discard(w->fd, &w->tmp);
    free(w->dir);
    free(w->path);
    free(w);
}

typedef struct {
    uint64_t offset; /* of the size field */
    uint32_t slot;
} live_t;

static int by_offset(const void *a, const void *b)
{
    const live_t *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The size field at byte `at` of the shard, through fd: 0 or -1 (errno). */
static int size_field(const sfs_shard_t *s, int fd, uint64_t at, uint64_t *size)
{
    uint8_t b[SFS_SIZE_FIELD_SIZE];
    ssize_t got = sfs_source_read(s, fd, b, sizeof(b), at);
    if (got != (ssize_t)sizeof(b)) {
        if (got >= 0)
            errno = EIO;
        return -1;
    }
    *size = be64(b);
    return 0;
}

int sfs_lookup_pack_add(sfs_lookup_pack_writer_t *w, const sfs_shard_t *s, const uint8_t identity[32],
                        const uint8_t stamp[SFS_LOOKUP_STAMP_SIZE], uint64_t *record, sfs_error_t *err)
{
    const char *path = sfs_path(s);
    const sfs_header_t *h = sfs_header(s);
    if (s->kind->find)
        return sfs_fail(err, SFS_EINVAL, EINVAL, "%s: a %s shard has no Read Shard index to pack", path,
                        s->kind->name);
    uint64_t n = s->slots, dump = s->extent - h->hash_position;
    uint64_t at = w->end, dump_at = at + SFS_LOOKUP_RECORD_HEADER, index_at = dump_at + pad8(dump);
    uint64_t sizes_at = index_at + SFS_SLOT_SIZE * n, size = sizes_at + 8 * n - at;
    uint8_t *hash = NULL, *buf = NULL, *sizes = NULL;
    live_t *live = NULL;
    int fd = -1, rc = sfs_reopen_for_index(s, &fd, err);
    if (rc != SFS_OK)
        return rc;
    if (w->count == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 1024;
        dir_entry_t *d = realloc(w->dir, cap * sizeof(*d));
        if (!d)
            goto nomem;
        w->dir = d;
        w->cap = cap;
    }
    hash = calloc(1, pad8(dump) ? pad8(dump) : 8);
    buf = malloc((size_t)CHUNK_SLOTS * SFS_SLOT_SIZE);
    sizes = malloc(8 * (n ? n : 1));
    live = malloc(sizeof(*live) * (n ? n : 1));
    if (!hash || !buf || !sizes || !live)
        goto nomem;
    sfs_chd_t chd;
    char why[256];
    errno = 0;
    ssize_t got = sfs_source_read(s, fd, hash, dump, h->hash_position);
    if (got != (ssize_t)dump) {
        int e = got < 0 && errno ? errno : EIO; /* short: it shrank */
        rc = sfs_fail(err, SFS_EIO, e, "%s: reading the hash section: %s", path, strerror(e));
        goto out;
    }
    if (sfs_chd_parse(&chd, hash, dump, why, sizeof(why)) < 0) {
        rc = sfs_fail(err, SFS_ECORRUPT, 0, "%s: %s", path, why);
        goto out;
    }
    if (chd.n != n) {
        rc = sfs_fail(err, SFS_ECORRUPT, 0, "%s: the perfect hash's slot count differs from the index's", path);
        goto out;
    }
    if (sfs_pwrite_all(w->fd, hash, pad8(dump), dump_at) < 0)
        goto io;
    /* the index, each live slot checked as the lookups will use it */
    size_t m = 0;
    for (uint64_t first = 0; first < n; first += CHUNK_SLOTS) {
        uint64_t c = n - first < CHUNK_SLOTS ? n - first : CHUNK_SLOTS;
        int got = sfs_index_read(s, fd, first, c, buf);
        if (got < 0) {
            int e = got == SFS_PREAD_SHORT ? EIO : errno;
            rc = sfs_fail(err, SFS_EIO, e, "%s: reading the index at slot %llu: %s", path,
                          (unsigned long long)first, strerror(e));
            goto out;
        }
        for (uint64_t i = 0; i < c; i++) {
            const uint8_t *slot = buf + i * SFS_SLOT_SIZE;
            uint64_t off = be64(slot + SFS_KEY_SIZE);
            if (off == SFS_EMPTY_OFFSET)
                continue;
            if (off < h->objects_position || off > s->objects_end ||
                s->objects_end - off < SFS_SIZE_FIELD_SIZE || sfs_chd_search(&chd, slot, SFS_KEY_SIZE) != first + i) {
                rc = sfs_fail(err, SFS_ECORRUPT, 0, "%s: slot %llu does not hold a valid entry", path,
                              (unsigned long long)(first + i));
                goto out;
            }
            live[m++] = (live_t){off, (uint32_t)(first + i)};
        }
        if (sfs_pwrite_all(w->fd, buf, c * SFS_SLOT_SIZE, index_at + first * SFS_SLOT_SIZE) < 0)
            goto io;
    }
    /* each slot's size: the gaps between back-to-back objects, checked on
     * a sample of size fields, else every size field */
    memset(sizes, 0xff, 8 * n);
    qsort(live, m, sizeof(*live), by_offset);
    int gaps = m > SIZE_SAMPLES && live[0].offset == h->objects_position;
    for (size_t i = 0; gaps && i < m; i++) {
        uint64_t end = i + 1 < m ? live[i + 1].offset : s->objects_end;
        if (end - live[i].offset < SFS_SIZE_FIELD_SIZE)
            gaps = 0;
        else
            put_le64(sizes + 8 * (uint64_t)live[i].slot, end - live[i].offset - SFS_SIZE_FIELD_SIZE);
    }
    for (size_t j = 0; gaps && j < SIZE_SAMPLES; j++) {
        const live_t *l = &live[(uint64_t)j * m / SIZE_SAMPLES];
        uint64_t v;
        if (size_field(s, fd, l->offset, &v) < 0)
            goto read_failed;
        gaps = v == get_le64(sizes + 8 * (uint64_t)l->slot);
    }
    for (size_t i = 0; !gaps && i < m; i++) {
        uint64_t v;
        if (size_field(s, fd, live[i].offset, &v) < 0)
            goto read_failed;
        if (v > s->objects_end - live[i].offset - SFS_SIZE_FIELD_SIZE) {
            rc = sfs_fail(err, SFS_ECORRUPT, 0, "%s: the object of slot %u ends past the objects section", path,
                          live[i].slot);
            goto out;
        }
        put_le64(sizes + 8 * (uint64_t)live[i].slot, v);
    }
    if (sfs_pwrite_all(w->fd, sizes, 8 * n, sizes_at) < 0)
        goto io;
    uint8_t head[SFS_LOOKUP_RECORD_HEADER] = {0};
    memcpy(head, stamp, SFS_LOOKUP_STAMP_SIZE);
    put_le64(head + 32, n);
    put_le64(head + 40, dump);
    put_le64(head + 48, size);
    /* the CRC of the record as written: the header, then the sections
     * read back in chunks (the index was streamed) */
    uLong crc = crc32_z(0, head, sizeof(head));
    for (uint64_t done = SFS_LOOKUP_RECORD_HEADER; done < size;) {
        size_t len = size - done < (uint64_t)CHUNK_SLOTS * SFS_SLOT_SIZE ? (size_t)(size - done)
                                                                         : (size_t)CHUNK_SLOTS * SFS_SLOT_SIZE;
        if (sfs_pread_full(w->fd, buf, len, at + done) != 0)
            goto io;
        crc = crc32_z(crc, buf, len);
        done += len;
    }
    put_le32(head + 56, (uint32_t)crc);
    if (sfs_pwrite_all(w->fd, head, sizeof(head), at) < 0)
        goto io;
    memcpy(w->dir[w->count].identity, identity, 32);
    w->dir[w->count++].offset = at;
    w->end = at + size;
    *record = at;
    rc = SFS_OK;
    goto out;
read_failed:
    rc = sfs_fail(err, SFS_EIO, errno, "%s: reading a size field: %s", path, strerror(errno));
    goto out;
io:
    rc = sfs_fail(err, SFS_EIO, errno, "%s: writing %s: %s", path, w->path, strerror(errno));
    goto out;
nomem:
    rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
out:
    close(fd);
    free(hash);
    free(buf);
    free(sizes);
    free(live);
    return rc;
}

int sfs_lookup_pack_copy(sfs_lookup_pack_writer_t *w, const sfs_lookup_pack_t *from, uint64_t record,
                         const uint8_t identity[32], uint64_t *out, sfs_error_t *err)
{
    sfs_lookup_record_t r;
    if (sfs_lookup_pack_view(from, record, &r) != SFS_OK)
        return sfs_fail(err, SFS_ECORRUPT, 0, "%s: no whole lookup record at byte %llu", w->path,
                        (unsigned long long)record);
    if (w->count == w->cap) {
        size_t cap = w->cap ? 2 * w->cap : 1024;
        dir_entry_t *d = realloc(w->dir, cap * sizeof(*d));
        if (!d)
            return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
        w->dir = d;
        w->cap = cap;
    }
    uint64_t size = get_le64(from->map + record + 48);
    if (sfs_pwrite_all(w->fd, from->map + record, size, w->end) < 0)
        return sfs_fail(err, SFS_EIO, errno, "writing %s: %s", w->path, strerror(errno));
    memcpy(w->dir[w->count].identity, identity, 32);
    w->dir[w->count++].offset = w->end;
    *out = w->end;
    w->end += size;
    return SFS_OK;
}

static int by_identity(const void *a, const void *b)
{
    return memcmp(((const dir_entry_t *)a)->identity, ((const dir_entry_t *)b)->identity, 32);
}

int sfs_lookup_pack_commit(sfs_lookup_pack_writer_t *w, sfs_error_t *err)
{
    int rc = SFS_OK;
    uint8_t *dir = NULL;
    qsort(w->dir, w->count, sizeof(*w->dir), by_identity);
    size_t keep = 0; /* the same shard added twice: its first record */
    for (size_t i = 0; i < w->count; i++)
        if (keep == 0 || memcmp(w->dir[keep - 1].identity, w->dir[i].identity, 32))
            w->dir[keep++] = w->dir[i];
    if (!(dir = malloc(SFS_LOOKUP_DIR_ENTRY * (keep ? keep : 1)))) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
        goto out;
    }
    for (size_t i = 0; i < keep; i++) {
        memcpy(dir + SFS_LOOKUP_DIR_ENTRY * i, w->dir[i].identity, 32);
        put_le64(dir + SFS_LOOKUP_DIR_ENTRY * i + 32, w->dir[i].offset);
    }
    uint8_t head[SFS_LOOKUP_PACK_HEADER] = {0};
    memcpy(head, SFS_LOOKUP_PACK_MAGIC, 8);
    put_le32(head + 8, SFS_LOOKUP_PACK_VERSION);
    put_le64(head + 16, keep);
    put_le64(head + 24, w->end);
    if (sfs_pwrite_all(w->fd, dir, SFS_LOOKUP_DIR_ENTRY * keep, w->end) < 0 ||
        ftruncate(w->fd, (off_t)(w->end + SFS_LOOKUP_DIR_ENTRY * keep)) < 0 ||
        sfs_pwrite_all(w->fd, head, sizeof(head), 0) < 0 || fdatasync(w->fd) < 0 ||
        sfs_output_publish(w->fd, &w->tmp, w->path) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "writing %s: %s", w->path, strerror(errno));
        goto out;
    }
    sfs_sync_directory(w->path);
out:
    free(dir);
    sfs_lookup_pack_abort(w); /* published: only the descriptor and memory are let go */
    return rc;
}

/* ------------------------------------------------------------- reading */

int sfs_lookup_pack_open(const char *path, sfs_lookup_pack_t **out, sfs_error_t *err)
{
    *out = NULL;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0 && (errno == EACCES || errno == EROFS))
        fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    struct stat st;
    uint8_t head[SFS_LOOKUP_PACK_HEADER];
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        return sfs_fail(err, SFS_EIO, e, "%s: %s", path, strerror(e));
    }
    uint64_t size = (uint64_t)st.st_size, count, dir;
    if (!S_ISREG(st.st_mode) || size < SFS_LOOKUP_PACK_HEADER || sfs_pread_full(fd, head, sizeof(head), 0) != 0 ||
        memcmp(head, SFS_LOOKUP_PACK_MAGIC, 8) || get_le32(head + 8) != SFS_LOOKUP_PACK_VERSION ||
        (count = get_le64(head + 16)) > size / SFS_LOOKUP_DIR_ENTRY || (dir = get_le64(head + 24)) < SFS_LOOKUP_PACK_HEADER ||
        dir > size || size - dir != SFS_LOOKUP_DIR_ENTRY * count) {
        close(fd);
        return sfs_fail(err, SFS_ECORRUPT, 0, "%s: not a whole lookup pack (header, size or directory)", path);
    }
    const uint8_t *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        close(fd);
        return sfs_fail(err, SFS_EIO, e, "%s: mmap: %s", path, strerror(e));
    }
    madvise((void *)map, size, MADV_RANDOM);
    for (uint64_t i = 0; i < count; i++) { /* sorted identities, records inside the records' area */
        const uint8_t *e = map + dir + SFS_LOOKUP_DIR_ENTRY * i;
        uint64_t at = get_le64(e + 32);
        if ((i && memcmp(e - SFS_LOOKUP_DIR_ENTRY, e, 32) >= 0) || at < SFS_LOOKUP_PACK_HEADER || at % 8 ||
            at > dir || dir - at < SFS_LOOKUP_RECORD_HEADER) {
            munmap((void *)map, size);
            close(fd);
            return sfs_fail(err, SFS_ECORRUPT, 0, "%s: directory entry %llu is wrong", path, (unsigned long long)i);
        }
    }
    sfs_lookup_pack_t *p = calloc(1, sizeof(*p));
    if (!p) {
        munmap((void *)map, size);
        close(fd);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    }
    *p = (sfs_lookup_pack_t){0, fd, map, size, count, dir};
    *out = p;
    return SFS_OK;
}

sfs_lookup_pack_t *sfs_lookup_pack_ref(sfs_lookup_pack_t *p)
{
    __atomic_fetch_add(&p->refs, 1, __ATOMIC_RELAXED);
    return p;
}

void sfs_lookup_pack_close(sfs_lookup_pack_t *p)
{
    if (!p || !sfs_ref_drop(&p->refs))
        return;
    munmap((void *)p->map, p->size);
    close(p->fd);
    free(p);
}

uint64_t sfs_lookup_pack_count(const sfs_lookup_pack_t *p) { return p->count; }

int64_t sfs_lookup_pack_record(const sfs_lookup_pack_t *p, const uint8_t identity[32])
{
    uint64_t lo = 0, hi = p->count;
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        const uint8_t *e = p->map + p->dir + SFS_LOOKUP_DIR_ENTRY * mid;
        int c = memcmp(e, identity, 32);
        if (c == 0)
            return (int64_t)get_le64(e + 32);
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int sfs_lookup_pack_view(const sfs_lookup_pack_t *p, uint64_t record, sfs_lookup_record_t *out)
{
    memset(out, 0, sizeof(*out));
    if (record < SFS_LOOKUP_PACK_HEADER || record > p->dir || p->dir - record < SFS_LOOKUP_RECORD_HEADER)
        return SFS_ECORRUPT;
    const uint8_t *head = p->map + record;
    uint64_t n = get_le64(head + 32), dump = get_le64(head + 40), size = get_le64(head + 48);
    uint64_t room = p->dir - record;
    /* every length against the room left, so that no sum overflows */
    if (size > room || dump > room || pad8(dump) > room - SFS_LOOKUP_RECORD_HEADER ||
        n > (room - SFS_LOOKUP_RECORD_HEADER - pad8(dump)) / (SFS_SLOT_SIZE + 8) ||
        size != SFS_LOOKUP_RECORD_HEADER + pad8(dump) + (SFS_SLOT_SIZE + 8) * n)
        return SFS_ECORRUPT;
    const uint8_t *dump_at = head + SFS_LOOKUP_RECORD_HEADER;
    if (sfs_chd_parse_trusted(&out->chd, dump_at, dump) < 0 || out->chd.n != n)
        return SFS_ECORRUPT;
    out->index = dump_at + pad8(dump);
    out->sizes = out->index + SFS_SLOT_SIZE * n;
    out->slots = n;
    out->offset = record;
    return SFS_OK;
}

int sfs_lookup_pack_attach(const sfs_lookup_pack_t *p, uint64_t record, const uint8_t stamp[SFS_LOOKUP_STAMP_SIZE],
                           uint64_t slots, sfs_lookup_record_t *out)
{
    int rc = sfs_lookup_pack_view(p, record, out);
    if (rc != SFS_OK)
        return rc;
    if (memcmp(p->map + record, stamp, SFS_LOOKUP_STAMP_SIZE) || out->slots != slots)
        return SFS_ESTALE;
    const uint8_t *head = p->map + record;
    if (record_crc(head, get_le64(head + 48)) != get_le32(head + 56))
        return SFS_ECORRUPT;
    return SFS_OK;
}

int sfs_lookup_record_slot(const sfs_lookup_record_t *r, uint64_t slot, uint64_t *offset, uint64_t *size)
{
    if (slot >= r->slots)
        return SFS_ENOTFOUND;
    uint64_t at = be64(r->index + SFS_SLOT_SIZE * slot + SFS_KEY_SIZE);
    uint64_t n = get_le64(r->sizes + 8 * slot);
    if (at == SFS_EMPTY_OFFSET || n == UINT64_MAX || at > UINT64_MAX - SFS_SIZE_FIELD_SIZE)
        return SFS_ENOTFOUND;
    *offset = at + SFS_SIZE_FIELD_SIZE;
    *size = n;
    return SFS_OK;
}

int sfs_lookup_record_find(const sfs_lookup_record_t *r, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                           uint64_t *offset, uint64_t *size)
{
    uint32_t s = sfs_chd_search(&r->chd, key, SFS_KEY_SIZE);
    if (s == SFS_CHD_FAIL || s >= r->slots || memcmp(r->index + SFS_SLOT_SIZE * (uint64_t)s, key, SFS_KEY_SIZE))
        return SFS_ENOTFOUND;
    *slot = s;
    return sfs_lookup_record_slot(r, s, offset, size);
}

int sfs_lookup_pack_delete(sfs_lookup_pack_t *p, uint64_t record, uint64_t slot, sfs_error_t *err)
{
    if (record < SFS_LOOKUP_PACK_HEADER || record > p->dir || p->dir - record < SFS_LOOKUP_RECORD_HEADER)
        return sfs_fail(err, SFS_EINVAL, EINVAL, "no lookup record at byte %llu", (unsigned long long)record);
    const uint8_t *head = p->map + record;
    uint64_t n = get_le64(head + 32), dump = get_le64(head + 40);
    uint64_t room = p->dir - record - SFS_LOOKUP_RECORD_HEADER;
    if (slot >= n || pad8(dump) > room || n > (room - pad8(dump)) / (SFS_SLOT_SIZE + 8))
        return sfs_fail(err, SFS_EINVAL, EINVAL, "no slot %llu in the lookup record at byte %llu",
                        (unsigned long long)slot, (unsigned long long)record);
    uint64_t index_at = record + SFS_LOOKUP_RECORD_HEADER + pad8(dump);
    uint8_t empty[8];
    memset(empty, 0xff, sizeof(empty));
    /* the offset first: a lookup that reads the slot between the two
     * writes finds it empty already */
    if (sfs_pwrite_all(p->fd, empty, 8, index_at + SFS_SLOT_SIZE * slot + SFS_KEY_SIZE) < 0 ||
        sfs_pwrite_all(p->fd, empty, 8, index_at + SFS_SLOT_SIZE * n + 8 * slot) < 0)
        return sfs_fail(err, SFS_EIO, errno, "emptying slot %llu of a lookup record: %s", (unsigned long long)slot,
                        strerror(errno));
    /* its CRC anew (a process attaching it between the writes finds it
     * damaged and opens the shard instead) */
    uint64_t size = get_le64(head + 48);
    uint8_t crc[4];
    if (size <= p->dir - record) {
        put_le32(crc, record_crc(head, size));
        if (sfs_pwrite_all(p->fd, crc, 4, record + 56) < 0)
            return sfs_fail(err, SFS_EIO, errno, "updating a lookup record's CRC: %s", strerror(errno));
    }
    return SFS_OK;
}
