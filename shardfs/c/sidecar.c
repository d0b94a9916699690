/*
 * sidecar.c — build, open and query sidecar files (format in sidecar.h).
 *
 * Build, in about the memory of the result (8 bytes per live key plus the
 * directory, ~8.5 in all, and a 1 MiB buffer): the index is read twice
 * with pread() through a descriptor of our own (1 MiB per read, kept 32 MiB
 * ahead with posix_fadvise WILLNEED), never through the shard's mapping, so
 * a shard truncated meanwhile gives a short read and SFS_EIO, not SIGBUS.
 * Pass 1 counts the live slots per bucket (of the prefix bits p0 that the
 * slot count would give, p0 >= p) and so gives n, p and, by prefix sums,
 * the directory; pass 2 puts each entry, (fingerprint << 32 | slot) in one
 * u64, at its bucket's next place. Both passes digest the (key, slot) pairs
 * they see: a slot deleted in between makes them differ and the build
 * starts again (at most 3 times). Each bucket (~8 entries) is then sorted
 * by (fingerprint, slot); since bucket and fingerprint are the key's bits
 * [0, p+32), only entries sharing their fingerprint need more: the key's
 * bits up to 64, read again from the index. The result is the order of a
 * sort by (top 64 bits, slot). The file is written unnamed (O_TMPFILE) and
 * linked into place when complete (output.c).
 *
 * Queries read the mapping directly. Only the header is checked at open;
 * every directory value is clamped to [0, n] before use, so a damaged
 * directory or fingerprint array gives wrong answers, never a read outside
 * the mapping.
 */
#define _GNU_SOURCE
#include "sidecar.h"
#include "internal.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct sfs_sidecar {
    int refs;              /* holders beyond the first (internal.h) */
    /* hot: read by every query */
    const uint32_t *dir;   /* 2^p + 1 entries */
    const uint32_t *fp;    /* n entries */
    uint64_t n;
    unsigned p;
    /* cold */
    const uint32_t *slots; /* n entries */
    uint64_t slot_count;
    void *map;
    size_t map_size;
};

/* The key's top p bits (p <= 32; branch-free, 0 for p = 0). */
static inline uint64_t bucket_of(uint64_t top, unsigned p)
{
    return (top >> 1) >> (63 - p);
}

/* Bits [p, p+32) of the key. */
static inline uint32_t fingerprint_of(uint64_t top, unsigned p)
{
    return (uint32_t)((top << p) >> 32);
}

unsigned sfs_sidecar_bits_for(uint64_t n)
{
    unsigned p = 0;
    while (p < SFS_SIDECAR_MAX_BITS && ((uint64_t)SFS_SIDECAR_BUCKET << p) < n)
        p++;
    return p;
}

uint64_t sfs_sidecar_file_size(unsigned p, uint64_t n)
{
    return SFS_SIDECAR_HEADER_SIZE + 4 * ((UINT64_C(1) << p) + 1) + 8 * n;
}

/* ---------------------------------------------------------------- build */

#define CHUNK_SLOTS 26214u             /* slots per pread: 1,048,560 bytes */
#define READAHEAD_DISTANCE (32u << 20) /* index bytes asked for ahead of the scan */
#define READAHEAD_STEP (1u << 20)      /* bytes per posix_fadvise: the kernel caps
                                          one WILLNEED at the device's read-ahead
                                          size (often 128 KiB to 8 MiB) */
#define WRITE_ENTRIES (CHUNK_SLOTS * SFS_SLOT_SIZE / 4) /* u32 per write(): the read buffer */
#define BUILD_ATTEMPTS 3               /* scans when the index changes between passes */
#define SMALL_SORT 24                  /* insertion sort up to this many entries */
#define PREFETCH 32                    /* slots ahead: the scans' random accesses to the
                                          bucket counts and entries (x1.5 at 10M keys) */

/* The index as read by a build: through a descriptor of its own, never
 * through the shard's mapping. */
typedef struct {
    const sfs_shard_t *shard;
    const char *path;         /* the shard's */
    int fd;
    uint64_t position, slots; /* index_position, slot count */
    uint64_t advised;         /* index bytes [0, advised) asked for (WILLNEED) */
    uint8_t *buf;             /* CHUNK_SLOTS slots */
} index_t;

/* The error of sfs_pread_full's result `got` (< 0, errno set) for `what`
 * at `offset`: SFS_PREAD_SHORT is a file that ended first (it shrank),
 * anything else the read's own error. */
static int read_failed(const index_t *ix, const char *what, uint64_t offset, int got,
                       sfs_error_t *err)
{
    int e = errno;
    if (got == SFS_PREAD_SHORT)
        return sfs_fail(err, SFS_EIO, EIO, "%s: the shard shrank while its sidecar was built "
                        "(short read of %s at byte %llu)", ix->path, what,
                        (unsigned long long)offset);
    return sfs_fail(err, SFS_EIO, e, "%s: reading %s at byte %llu: %s", ix->path, what,
                    (unsigned long long)offset, strerror(e));
}

/* The index of `shard`, read through a descriptor of our own
 * (sfs_reopen_for_index: its own read-ahead state, the very file opened). */
static int index_open(index_t *ix, const sfs_shard_t *shard, sfs_error_t *err)
{
    ix->shard = shard;
    ix->path = sfs_path(shard);
    ix->position = sfs_header(shard)->index_position;
    ix->slots = sfs_slot_count(shard);
    ix->advised = 0;
    return sfs_reopen_for_index(shard, &ix->fd, err);
}

/* Slots [first, first + count) (count <= CHUNK_SLOTS) into ix->buf, with
 * WILLNEED hints kept READAHEAD_DISTANCE ahead (a second scan finds the
 * pages cached and the hints cost little). */
static int index_read(index_t *ix, uint64_t first, uint64_t count, sfs_error_t *err)
{
    uint64_t size = ix->slots * SFS_SLOT_SIZE, at = first * SFS_SLOT_SIZE;
    if (first == 0)
        ix->advised = 0;
    for (; ix->advised < at + READAHEAD_DISTANCE && ix->advised < size;
         ix->advised += READAHEAD_STEP)
        posix_fadvise(ix->fd, (off_t)(ix->position + ix->advised), READAHEAD_STEP,
                      POSIX_FADV_WILLNEED);
    int got = sfs_index_read(ix->shard, ix->fd, first, count, ix->buf);
    if (got < 0)
        return read_failed(ix, "the index", ix->position + at, got, err);
    return SFS_OK;
}

/* Order-independent digest of one entry: the two scans of the index must
 * see the same (top, slot) pairs. */
static inline uint64_t entry_digest(uint64_t top, uint64_t slot)
{
    uint64_t z = top + slot * UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Pass 1: live slots per bucket of `p0` bits into count[0, 2^p0), the
 * number of live slots into *n and their digest into *digest. */
static int count_pass(index_t *ix, unsigned p0, uint32_t *count, uint64_t *n, uint64_t *digest,
                      sfs_error_t *err)
{
    uint64_t live = 0, sum = 0;
    memset(count, 0, (UINT64_C(1) << p0) * sizeof(uint32_t));
    for (uint64_t first = 0; first < ix->slots; first += CHUNK_SLOTS) {
        uint64_t m = ix->slots - first < CHUNK_SLOTS ? ix->slots - first : CHUNK_SLOTS;
        int rc = index_read(ix, first, m, err);
        if (rc != SFS_OK)
            return rc;
        const uint8_t *s = ix->buf;
        for (uint64_t i = 0; i < m; i++, s += SFS_SLOT_SIZE) {
            if (i + PREFETCH < m)
                __builtin_prefetch(&count[bucket_of(be64(s + PREFETCH * SFS_SLOT_SIZE), p0)], 1);
            if (be64(s + SFS_KEY_SIZE) == SFS_EMPTY_OFFSET)
                continue;
            uint64_t top = be64(s);
            count[bucket_of(top, p0)]++;
            sum += entry_digest(top, first + i);
            live++;
        }
    }
    *n = live;
    *digest = sum;
    return SFS_OK;
}

/* Pass 2: every live slot's (fingerprint << 32 | slot) into its bucket,
 * filled from its end: end[b] is the end of bucket b on entry, its start
 * on return (when the index did not change). Returns SFS_OK and sets
 * *same when the scan saw the n entries of pass 1 (same digest). */
static int scatter_pass(index_t *ix, unsigned p, uint32_t *end, uint64_t *entries, uint64_t n,
                        uint64_t digest, int *same, sfs_error_t *err)
{
    uint64_t live = 0, sum = 0;
    int overflow = 0;
    for (uint64_t first = 0; first < ix->slots; first += CHUNK_SLOTS) {
        uint64_t m = ix->slots - first < CHUNK_SLOTS ? ix->slots - first : CHUNK_SLOTS;
        int rc = index_read(ix, first, m, err);
        if (rc != SFS_OK)
            return rc;
        const uint8_t *s = ix->buf;
        for (uint64_t i = 0; i < m; i++, s += SFS_SLOT_SIZE) {
            /* the bucket's cursor two steps ahead, its next place one */
            if (i + 2 * PREFETCH < m)
                __builtin_prefetch(&end[bucket_of(be64(s + 2 * PREFETCH * SFS_SLOT_SIZE), p)], 1);
            if (i + PREFETCH < m) {
                uint32_t at = end[bucket_of(be64(s + PREFETCH * SFS_SLOT_SIZE), p)];
                __builtin_prefetch(entries + (at ? at - 1 : 0), 1);
            }
            if (be64(s + SFS_KEY_SIZE) == SFS_EMPTY_OFFSET)
                continue;
            uint64_t top = be64(s), slot = first + i, b = bucket_of(top, p);
            sum += entry_digest(top, slot);
            live++;
            if (end[b] == 0) { /* more entries than counted: the index changed */
                overflow = 1;
                continue;
            }
            /* slot < 2^32: checked by sfs_open */
            entries[--end[b]] = (uint64_t)fingerprint_of(top, p) << 32 | slot;
        }
    }
    *same = !overflow && live == n && sum == digest;
    return SFS_OK;
}

static void insertion_sort(uint64_t *a, uint64_t m)
{
    for (uint64_t i = 1; i < m; i++) {
        uint64_t v = a[i], j = i;
        for (; j > 0 && a[j - 1] > v; j--)
            a[j] = a[j - 1];
        a[j] = v;
    }
}

static void sift_down(uint64_t *a, uint64_t root, uint64_t m)
{
    uint64_t v = a[root];
    for (;;) {
        uint64_t child = 2 * root + 1;
        if (child >= m)
            break;
        if (child + 1 < m && a[child + 1] > a[child])
            child++;
        if (a[child] <= v)
            break;
        a[root] = a[child];
        root = child;
    }
    a[root] = v;
}

/* Ascending, in place, no allocation: buckets hold ~8 entries (insertion
 * sort); a huge one (keys crafted to share their top bits) gets a heap sort. */
static void sort_u64(uint64_t *a, uint64_t m)
{
    if (m <= SMALL_SORT) {
        insertion_sort(a, m);
        return;
    }
    for (uint64_t i = m / 2; i-- > 0;)
        sift_down(a, i, m);
    for (uint64_t last = m - 1; last > 0; last--) {
        uint64_t t = a[0];
        a[0] = a[last];
        a[last] = t;
        sift_down(a, 0, last);
    }
}

/* Entries [lo, hi) of one bucket share their fingerprint, so bits [0, p+32)
 * of their keys: order them by the key's bits [p+32, 64), then slot. Those
 * bits are read again from the index (8 bytes per entry; two keys of a
 * shard agree on 32 + p bits about once per 2^32 / 8 entries). */
static int sort_ties(index_t *ix, unsigned p, uint64_t *e, uint64_t m, sfs_error_t *err)
{
    uint64_t fp = e[0] >> 32, low = (UINT64_C(1) << (32 - p)) - 1; /* p < 32 */
    for (uint64_t i = 0; i < m; i++) {
        uint32_t slot = (uint32_t)e[i];
        uint8_t entry[SFS_SLOT_SIZE];
        uint64_t at = ix->position + (uint64_t)slot * SFS_SLOT_SIZE;
        int got = sfs_index_read(ix->shard, ix->fd, slot, 1, entry);
        if (got < 0)
            return read_failed(ix, "a key", at, got, err);
        e[i] = (be64(entry) & low) << 32 | slot;
    }
    sort_u64(e, m);
    for (uint64_t i = 0; i < m; i++)
        e[i] = fp << 32 | (uint32_t)e[i];
    return SFS_OK;
}

/* Sort every bucket by (top 64 bits of the key, slot): by (fingerprint,
 * slot), then runs of equal fingerprints by sort_ties. dir[b] = start of
 * bucket b, dir[2^p] = n. */
static int sort_buckets(index_t *ix, unsigned p, const uint32_t *dir, uint64_t *e,
                        sfs_error_t *err)
{
    uint64_t buckets = UINT64_C(1) << p;
    for (uint64_t b = 0; b < buckets; b++) {
        uint64_t lo = dir[b], hi = dir[b + 1];
        sort_u64(e + lo, hi - lo);
        if (p >= 32) /* the fingerprint holds the key's bits up to 64 */
            continue;
        for (uint64_t i = lo + 1; i < hi; i++) {
            if ((e[i] ^ e[i - 1]) >> 32)
                continue;
            uint64_t run = i - 1, j = i + 1;
            while (j < hi && !((e[j] ^ e[run]) >> 32))
                j++;
            int rc = sort_ties(ix, p, e + run, j - run, err);
            if (rc != SFS_OK)
                return rc;
            i = j;
        }
    }
    return SFS_OK;
}

/* Write `len` bytes at *offset and advance it; -1 with errno on failure. */
static int put(int fd, const void *buf, size_t len, uint64_t *offset)
{
    if (sfs_pwrite_all(fd, buf, len, *offset) < 0)
        return -1;
    *offset += len;
    return 0;
}

/* Header, directory (host order in dir: converted in place), fingerprints
 * and slots of the sorted entries, through buf (WRITE_ENTRIES u32). */
static int write_sidecar(int fd, const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE], unsigned p,
                         uint64_t n, uint64_t slots, uint32_t *dir, const uint64_t *e,
                         uint32_t *buf)
{
    uint8_t header[SFS_SIDECAR_HEADER_SIZE] = {0};
    memcpy(header, SFS_SIDECAR_MAGIC, SFS_SIDECAR_MAGIC_SIZE);
    put_le32(header + 8, SFS_SIDECAR_VERSION);
    put_le32(header + 12, p);
    put_le64(header + 16, n);
    put_le64(header + 24, slots);
    memcpy(header + 32, identity, SFS_SIDECAR_IDENTITY_SIZE);
    uint64_t buckets = UINT64_C(1) << p, offset = 0;
    for (uint64_t b = 0; b <= buckets; b++)
        dir[b] = htole32(dir[b]);
    if (put(fd, header, sizeof(header), &offset) < 0 ||
        put(fd, dir, (buckets + 1) * sizeof(uint32_t), &offset) < 0)
        return -1;
    for (int part = 0; part < 2; part++) { /* fingerprints, then slots */
        unsigned shift = part ? 0 : 32;
        for (uint64_t i = 0; i < n; i += WRITE_ENTRIES) {
            size_t m = n - i < WRITE_ENTRIES ? (size_t)(n - i) : WRITE_ENTRIES;
            for (size_t j = 0; j < m; j++)
                buf[j] = htole32((uint32_t)(e[i + j] >> shift));
            if (put(fd, buf, m * sizeof(uint32_t), &offset) < 0)
                return -1;
        }
    }
    return 0;
}

/* A sidecar being built. */
typedef struct {
    const char *path;  /* the sidecar's */
    index_t ix;        /* the shard's index */
    uint32_t *dir;     /* bucket bounds, host order: 2^p + 1 once scanned */
    uint64_t *entries; /* n: fingerprint << 32 | slot, by bucket */
    uint64_t n;        /* live slots */
    unsigned p;        /* prefix bits */
} build_t;

static int out_of_memory(const build_t *b, sfs_error_t *err)
{
    return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory building the sidecar of %s",
                    b->path, b->ix.path);
}

/* Pass 1 over buckets of p0 bits (count_pass), then p from n, and the
 * counts summed into buckets of p bits (2^(p0-p) each): dir[b] = end of
 * bucket b, dir[2^p] = n. The digest of the pass in *digest. */
static int count_buckets(build_t *b, unsigned p0, uint64_t *digest, sfs_error_t *err)
{
    uint32_t *grown = realloc(b->dir, ((UINT64_C(1) << p0) + 1) * sizeof(uint32_t));
    if (!grown)
        return out_of_memory(b, err);
    b->dir = grown;
    int rc = count_pass(&b->ix, p0, b->dir, &b->n, digest, err);
    if (rc != SFS_OK)
        return rc;
    b->p = sfs_sidecar_bits_for(b->n);
    uint64_t buckets = UINT64_C(1) << b->p, group = UINT64_C(1) << (p0 - b->p), total = 0;
    for (uint64_t k = 0; k < buckets; k++) {
        uint64_t c = 0;
        for (uint64_t j = 0; j < group; j++)
            c += b->dir[k * group + j];
        total += c;
        b->dir[k] = (uint32_t)total; /* end of bucket k */
    }
    b->dir[buckets] = (uint32_t)b->n;
    if (b->p < p0 && (grown = realloc(b->dir, (buckets + 1) * sizeof(uint32_t))))
        b->dir = grown; /* many empty slots: give the rest back */
    return SFS_OK;
}

/* The live slots into b (n, p, dir as bucket starts, entries unsorted
 * within their bucket): pass 1 counts, pass 2 scatters, again while a slot
 * was deleted or rewritten between them (at most BUILD_ATTEMPTS times). */
static int scan_index(build_t *b, sfs_error_t *err)
{
    /* p0 >= p, the final prefix bits: the live slots are at most all. */
    unsigned p0 = sfs_sidecar_bits_for(b->ix.slots);
    for (int attempt = 1;; attempt++) {
        free(b->entries);
        b->entries = NULL;
        uint64_t digest = 0;
        int rc = count_buckets(b, p0, &digest, err), same = 0;
        if (rc != SFS_OK)
            return rc;
        b->entries = malloc((b->n ? b->n : 1) * sizeof(uint64_t));
        if (!b->entries)
            return out_of_memory(b, err);
        rc = scatter_pass(&b->ix, b->p, b->dir, b->entries, b->n, digest, &same, err);
        if (rc != SFS_OK || same)
            return rc;
        if (attempt == BUILD_ATTEMPTS)
            return sfs_fail(err, SFS_EIO, EAGAIN, "%s: the shard's index changed during each of "
                            "%d attempts to build its sidecar", b->ix.path, BUILD_ATTEMPTS);
    }
}

/* Write the sorted sidecar to fd, fdatasync, and publish it at b->path. */
static int write_and_publish(build_t *b, int fd, char **tmp_path,
                             const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE], sfs_error_t *err)
{
    int e;
    if (write_sidecar(fd, identity, b->p, b->n, b->ix.slots, b->dir, b->entries,
                      (uint32_t *)b->ix.buf) < 0) {
        e = errno;
        return sfs_fail(err, SFS_EIO, e, "%s: writing the sidecar: %s", b->path, strerror(e));
    }
    if (fdatasync(fd) < 0) {
        e = errno;
        return sfs_fail(err, SFS_EIO, e, "%s: writing the sidecar: fdatasync: %s", b->path,
                        strerror(e));
    }
    if (sfs_output_publish(fd, tmp_path, b->path) < 0) {
        e = errno;
        return sfs_fail(err, SFS_EIO, e, "%s: putting the sidecar in place: %s", b->path,
                        strerror(e));
    }
    sfs_sync_directory(b->path);
    return SFS_OK;
}

int sfs_sidecar_build(const sfs_shard_t *shard, const char *path,
                      const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE], sfs_error_t *err)
{
    build_t b = {.path = path, .ix = {.path = sfs_path(shard), .fd = -1}};
    char *tmp_path = NULL;
    int fd = -1;

    /* The output first: an unwritable directory fails before the scans. */
    int rc = sfs_output_create(path, 0600, &fd, &tmp_path, err);
    if (rc == SFS_OK)
        rc = index_open(&b.ix, shard, err);
    if (rc == SFS_OK && !(b.ix.buf = malloc((size_t)CHUNK_SLOTS * SFS_SLOT_SIZE)))
        rc = out_of_memory(&b, err);
    if (rc == SFS_OK)
        rc = scan_index(&b, err);
    if (rc == SFS_OK) /* each bucket by (top 64 bits, slot) */
        rc = sort_buckets(&b.ix, b.p, b.dir, b.entries, err);
    if (b.ix.fd >= 0)
        close(b.ix.fd);
    if (rc == SFS_OK)
        rc = write_and_publish(&b, fd, &tmp_path, identity, err);

    if (fd >= 0)
        close(fd); /* an unnamed file not published is freed here */
    if (tmp_path) {
        unlink(tmp_path);
        free(tmp_path);
    }
    free(b.ix.buf);
    free(b.dir);
    free(b.entries);
    return rc;
}

/* ---------------------------------------------------------------- open */

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)

int sfs_sidecar_open(const char *path, const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE],
                     uint64_t slot_count, sfs_sidecar_t **out, sfs_error_t *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc;
    if (fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = CORRUPT("%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < SFS_SIDECAR_HEADER_SIZE) {
        rc = CORRUPT("%s: truncated sidecar: %llu bytes, smaller than the 64-byte header", path,
                     (unsigned long long)size);
        goto fail;
    }
    uint8_t h[SFS_SIDECAR_HEADER_SIZE];
    ssize_t got = pread(fd, h, sizeof(h), 0);
    if (got != (ssize_t)sizeof(h)) {
        rc = sfs_fail(err, SFS_EIO, got < 0 ? errno : EIO, "%s: reading the header: %s", path,
                      got < 0 ? strerror(errno) : "short read");
        goto fail;
    }
    if (memcmp(h, SFS_SIDECAR_MAGIC, SFS_SIDECAR_MAGIC_SIZE) != 0) {
        rc = CORRUPT("%s: bad magic: not a shardfs sidecar (expected \"SFSSIDE1\")", path);
        goto fail;
    }
    uint32_t version = get_le32(h + 8), p = get_le32(h + 12);
    uint64_t n = get_le64(h + 16), slots = get_le64(h + 24);
    if (version != SFS_SIDECAR_VERSION) {
        rc = CORRUPT("%s: sidecar version is %u, only version 1 is supported", path, version);
        goto fail;
    }
    if (p > SFS_SIDECAR_MAX_BITS) {
        rc = CORRUPT("%s: sidecar prefix_bits is %u, more than 32", path, p);
        goto fail;
    }
    if (n > slots || n > UINT32_MAX) {
        rc = CORRUPT("%s: sidecar count is %llu, more than its slot_count (%llu) or 2^32 - 1",
                     path, (unsigned long long)n, (unsigned long long)slots);
        goto fail;
    }
    if (memcmp(h + 32, identity, SFS_SIDECAR_IDENTITY_SIZE) != 0) {
        rc = sfs_fail(err, SFS_ESTALE, 0, "%s: stale sidecar: built for another shard (identity "
                      "differs)", path);
        goto fail;
    }
    if (slots != slot_count) {
        rc = sfs_fail(err, SFS_ESTALE, 0, "%s: stale sidecar: built for a shard of %llu slots, "
                      "this one has %llu", path, (unsigned long long)slots,
                      (unsigned long long)slot_count);
        goto fail;
    }
    uint64_t want = sfs_sidecar_file_size(p, n);
    if (size != want) {
        rc = CORRUPT("%s: sidecar is %llu bytes, its header (prefix_bits %u, count %llu) needs "
                     "exactly %llu", path, (unsigned long long)size, p, (unsigned long long)n,
                     (unsigned long long)want);
        goto fail;
    }
    sfs_sidecar_t *sc = calloc(1, sizeof(*sc));
    if (!sc) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: mmap: %s", path, strerror(errno));
        free(sc);
        goto fail;
    }
    close(fd);
    madvise(m, (size_t)size, MADV_RANDOM);
    sc->map = m;
    sc->map_size = (size_t)size;
    sc->n = n;
    sc->p = p;
    sc->slot_count = slots;
    sc->dir = (const uint32_t *)((const uint8_t *)m + SFS_SIDECAR_HEADER_SIZE);
    sc->fp = sc->dir + (UINT64_C(1) << p) + 1;
    sc->slots = sc->fp + n;
    *out = sc;
    return SFS_OK;
fail:
    close(fd);
    return rc;
}

sfs_sidecar_t *sfs_sidecar_ref(sfs_sidecar_t *sc)
{
    sfs_ref_take(&sc->refs);
    return sc;
}

void sfs_sidecar_close(sfs_sidecar_t *sc)
{
    if (!sc || !sfs_ref_drop(&sc->refs))
        return;
    munmap(sc->map, sc->map_size);
    free(sc);
}

uint64_t sfs_sidecar_count(const sfs_sidecar_t *sc) { return sc->n; }
unsigned sfs_sidecar_prefix_bits(const sfs_sidecar_t *sc) { return sc->p; }
uint64_t sfs_sidecar_slot_count(const sfs_sidecar_t *sc) { return sc->slot_count; }

/* ---------------------------------------------------------------- queries */

/* Entries of bucket b (< 2^p), with both bounds clamped to [0, n] and
 * begin <= end whatever the directory holds. */
static inline void bucket_bounds(const sfs_sidecar_t *sc, uint64_t b, uint64_t *begin,
                                 uint64_t *end)
{
    uint64_t lo = le32toh(sc->dir[b]), hi = le32toh(sc->dir[b + 1]);
    if (lo > sc->n)
        lo = sc->n;
    if (hi > sc->n)
        hi = sc->n;
    if (hi < lo)
        hi = lo;
    *begin = lo;
    *end = hi;
}

/* First position in [lo, hi) whose fingerprint is >= t (hi if none),
 * assuming the bucket is sorted. */
static inline uint64_t lower_bound(const uint32_t *fp, uint64_t lo, uint64_t hi, uint32_t t)
{
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (le32toh(fp[mid]) < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Whether fingerprint t is in [lo, hi). A bucket of up to FIXED entries
 * (99.6% of them: ~8 on average, Poisson) is compared whole, branch-free,
 * as FIXED u32 from fp[lo] with the entries past hi masked off: a loop over
 * a bucket's actual length mispredicts its exit on almost every call, which
 * cost more than the compares. Those FIXED reads stay inside the file when
 * lo + FIXED <= 2n (the slots array follows the fingerprints). Larger
 * buckets: binary search; near the end of a tiny file: a loop. */
#define FIXED 16
typedef uint32_t u32x4 __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

static inline int has_fingerprint(const uint32_t *fp, uint64_t n, uint64_t lo, uint64_t hi,
                                  uint32_t t)
{
    uint64_t m = hi - lo;
    if (m <= FIXED && lo + FIXED <= 2 * n) {
        const uint32_t want = htole32(t), len = (uint32_t)m;
        const u32x4 tv = {want, want, want, want}, mv = {len, len, len, len};
        i32x4 any = {0, 0, 0, 0};
        for (unsigned j = 0; j < FIXED; j += 4) {
            u32x4 v;
            memcpy(&v, fp + lo + j, sizeof(v));
            const u32x4 idx = {j, j + 1, j + 2, j + 3};
            any |= (v == tv) & (idx < mv);
        }
        return (any[0] | any[1] | any[2] | any[3]) != 0;
    }
    if (m > FIXED) {
        lo = lower_bound(fp, lo, hi, t);
        return lo < hi && le32toh(fp[lo]) == t;
    }
    int found = 0;
    for (uint64_t i = lo; i < hi; i++)
        found |= le32toh(fp[i]) == t;
    return found;
}

int sfs_sidecar_may_contain(const sfs_sidecar_t *sc, const uint8_t key[SFS_KEY_SIZE])
{
    uint64_t top = be64(key), lo, hi;
    bucket_bounds(sc, bucket_of(top, sc->p), &lo, &hi);
    return has_fingerprint(sc->fp, sc->n, lo, hi, fingerprint_of(top, sc->p));
}

#define CANDIDATE_CHUNK 64 /* sidecars whose cache misses overlap */

size_t sfs_sidecar_candidates(sfs_sidecar_t *const *sidecars, size_t count,
                              const uint8_t key[SFS_KEY_SIZE], uint32_t *out, size_t max_out)
{
    uint64_t top = be64(key);
    size_t found = 0;
    uint64_t lo[CANDIDATE_CHUNK], hi[CANDIDATE_CHUNK];
    const uint32_t *at[CANDIDATE_CHUNK];
    for (size_t base = 0; base < count; base += CANDIDATE_CHUNK) {
        size_t m = count - base < CANDIDATE_CHUNK ? count - base : CANDIDATE_CHUNK;
        sfs_sidecar_t *const *sc = sidecars + base;
        /* pass 1: the structures */
        for (size_t i = 0; i < m; i++)
            if (sc[i])
                __builtin_prefetch(sc[i]);
        /* pass 2: every directory entry */
        for (size_t i = 0; i < m; i++) {
            if (!sc[i])
                continue;
            at[i] = sc[i]->dir + bucket_of(top, sc[i]->p);
            __builtin_prefetch(at[i]);
        }
        /* pass 3: every bucket's fingerprints (first and last: a bucket of
         * 8 u32 may straddle two cache lines) */
        for (size_t i = 0; i < m; i++) {
            if (!sc[i])
                continue;
            uint64_t n = sc[i]->n, a = le32toh(at[i][0]), b = le32toh(at[i][1]);
            a = a < n ? a : n;
            b = b < n ? b : n;
            lo[i] = a;
            hi[i] = b > a ? b : a;
            __builtin_prefetch(sc[i]->fp + lo[i]);
            __builtin_prefetch(sc[i]->fp + hi[i] - (hi[i] > lo[i]));
        }
        /* pass 4: compare */
        for (size_t i = 0; i < m; i++) {
            if (sc[i] && !has_fingerprint(sc[i]->fp, sc[i]->n, lo[i], hi[i],
                                          fingerprint_of(top, sc[i]->p)))
                continue;
            if (found < max_out)
                out[found] = (uint32_t)(base + i);
            found++;
        }
    }
    return found;
}

void sfs_sidecar_range(const sfs_sidecar_t *sc, const uint8_t *prefix, unsigned prefix_bits,
                       uint64_t *begin, uint64_t *end)
{
    unsigned p = sc->p;
    unsigned k = prefix_bits > p + 32 ? p + 32 : prefix_bits; /* <= 64 */
    uint64_t pfx = 0;
    for (unsigned i = 0; i < (k + 7) / 8; i++)
        pfx |= (uint64_t)prefix[i] << (56 - 8 * i);
    if (k < 64)
        pfx &= k ? ~UINT64_C(0) << (64 - k) : 0;
    if (k <= p) {
        uint64_t b0 = bucket_of(pfx, p), b1 = b0 + (UINT64_C(1) << (p - k)), lo, hi, unused;
        bucket_bounds(sc, b0, &lo, &unused);
        bucket_bounds(sc, b1 - 1, &unused, &hi);
        *begin = lo;
        *end = hi < lo ? lo : hi;
        return;
    }
    uint64_t lo, hi;
    bucket_bounds(sc, bucket_of(pfx, p), &lo, &hi);
    unsigned j = k - p; /* 1..32 fingerprint bits to match */
    uint32_t fp_lo = fingerprint_of(pfx, p);
    uint32_t fp_hi = fp_lo | (uint32_t)(UINT64_C(0xFFFFFFFF) >> j);
    *begin = lower_bound(sc->fp, lo, hi, fp_lo);
    *end = fp_hi == UINT32_MAX ? hi : lower_bound(sc->fp, *begin, hi, fp_hi + 1);
}

uint64_t sfs_sidecar_slots(const sfs_sidecar_t *sc, uint64_t begin, uint64_t end, uint32_t *out)
{
    if (end > sc->n)
        end = sc->n;
    if (begin >= end)
        return 0;
    for (uint64_t i = begin; i < end; i++)
        out[i - begin] = le32toh(sc->slots[i]);
    return end - begin;
}

uint32_t sfs_sidecar_fingerprint(const sfs_sidecar_t *sc, uint64_t i)
{
    return i < sc->n ? le32toh(sc->fp[i]) : 0;
}

/* Entries sfs_sidecar_deleted prefetches the slot of ahead of the one it reads. */
#define DELETED_AHEAD 16

int sfs_sidecar_deleted(const sfs_sidecar_t *sc, const sfs_shard_t *shard, uint64_t begin,
                        uint64_t end, uint32_t *out, uint64_t *found)
{
    *found = 0;
    uint64_t slots = sfs_slot_count(shard);
    if (sc->slot_count != slots)
        return SFS_EINVAL;
    if (end > sc->n)
        end = sc->n;
    uint64_t k = 0;
    for (uint64_t i = begin; i < end && i < begin + DELETED_AHEAD; i++)
        sfs_prefetch_slot_entry(shard, le32toh(sc->slots[i]));
    for (uint64_t i = begin; i < end; i++) {
        if (i + DELETED_AHEAD < end)
            sfs_prefetch_slot_entry(shard, le32toh(sc->slots[i + DELETED_AHEAD]));
        uint32_t slot = le32toh(sc->slots[i]);
        if (slot < slots && sfs_slot_get(shard, slot, NULL) == SFS_EMPTY_OFFSET)
            out[k++] = slot;
    }
    *found = k;
    return SFS_OK;
}
