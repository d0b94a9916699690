/*
 * sidecar.c — build, open and query sidecar files (format in sidecar.h).
 *
 * Build: one sequential scan of the index (read ahead with posix_fadvise
 * WILLNEED, 32 MiB ahead), an LSD radix sort of (top 64 bits, slot) by
 * bytes (stable, so ties keep slot order; passes whose byte is the same for
 * every entry are skipped), then one sequential write.
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
#include <unistd.h>

struct sfs_sidecar {
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

static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}

static inline uint32_t get_le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t get_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

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

#define READAHEAD_DISTANCE (32u << 20) /* index bytes asked for ahead of the scan */
#define READAHEAD_STEP (1u << 20)      /* bytes per posix_fadvise: the kernel caps
                                          one WILLNEED at the device's read-ahead
                                          size (often 128 KiB to 8 MiB) */
#define WRITE_ENTRIES (1u << 18)       /* u32 per write() */

/* Sort (top, slot) pairs by top, stably: LSD radix sort by bytes between
 * (top, slot) and (tmp_top, tmp_slot). On return *top / *slot point to
 * whichever pair of arrays holds the result. */
static void radix_sort(uint64_t **top, uint32_t **slot, uint64_t **tmp_top, uint32_t **tmp_slot,
                       uint64_t n)
{
    size_t c[8][256]; /* 16 KiB */
    memset(c, 0, sizeof(c));
    const uint64_t *t = *top;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = t[i];
        for (int d = 0; d < 8; d++)
            c[d][(v >> (8 * d)) & 255]++;
    }
    for (int d = 0; d < 8; d++) {
        size_t *cd = c[d];
        if (n == 0 || cd[(t[0] >> (8 * d)) & 255] == n)
            continue; /* every entry has this byte: nothing to move */
        size_t pos = 0;
        for (int v = 0; v < 256; v++) {
            size_t k = cd[v];
            cd[v] = pos;
            pos += k;
        }
        const uint64_t *st = *top;
        const uint32_t *ss = *slot;
        uint64_t *dt = *tmp_top;
        uint32_t *ds = *tmp_slot;
        unsigned shift = 8 * (unsigned)d;
        for (uint64_t i = 0; i < n; i++) {
            uint64_t v = st[i];
            size_t at = cd[(v >> shift) & 255]++;
            dt[at] = v;
            ds[at] = ss[i];
        }
        uint64_t *x = *top;
        *top = *tmp_top;
        *tmp_top = x;
        uint32_t *y = *slot;
        *slot = *tmp_slot;
        *tmp_slot = y;
        t = *top;
    }
}

/* Write `len` bytes at *offset and advance it; -1 with errno on failure. */
static int put(int fd, const void *buf, size_t len, uint64_t *offset)
{
    if (sfs_pwrite_all(fd, buf, len, *offset) < 0)
        return -1;
    *offset += len;
    return 0;
}

int sfs_sidecar_build(const sfs_shard_t *shard, const char *path,
                      const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE], sfs_error_t *err)
{
    uint64_t slots = sfs_slot_count(shard);
    uint64_t index_position = sfs_header(shard)->index_position;
    uint64_t cap = slots ? slots : 1;
    uint64_t *top = malloc(cap * sizeof(uint64_t)), *tmp_top = NULL;
    uint32_t *slot = malloc(cap * sizeof(uint32_t)), *tmp_slot = NULL, *dir = NULL;
    uint8_t *buf = NULL;
    char *tmp_path = NULL;
    int fd = -1, rc = SFS_OK;
    if (!top || !slot)
        goto nomem;

    /* 1. Scan the index in slot order. The shard's mapping is MADV_RANDOM
     * (a fault reads one page), so the index is read ahead through a
     * descriptor of our own: 1 MiB requests kept 32 MiB ahead of the scan.
     * (If the path now names another file, the hints are merely useless.) */
    int hint_fd = open(sfs_path(shard), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    uint64_t index_size = slots * SFS_SLOT_SIZE, advised = 0, n = 0;
    for (uint64_t i = 0; i < slots; i++) {
        if (hint_fd >= 0 && i % 4096 == 0) {
            uint64_t want = i * SFS_SLOT_SIZE + READAHEAD_DISTANCE;
            for (; advised < want && advised < index_size; advised += READAHEAD_STEP)
                posix_fadvise(hint_fd, (off_t)(index_position + advised), READAHEAD_STEP,
                              POSIX_FADV_WILLNEED);
        }
        uint8_t key[SFS_KEY_SIZE];
        if (sfs_slot_get(shard, i, key) == SFS_EMPTY_OFFSET)
            continue;
        top[n] = be64(key);
        slot[n] = (uint32_t)i; /* slots <= UINT32_MAX: checked by sfs_open */
        n++;
    }
    if (hint_fd >= 0)
        close(hint_fd);

    /* 2. Sort by the top 64 bits; ties stay in slot order. */
    tmp_top = malloc((n ? n : 1) * sizeof(uint64_t));
    tmp_slot = malloc((n ? n : 1) * sizeof(uint32_t));
    if (!tmp_top || !tmp_slot)
        goto nomem;
    radix_sort(&top, &slot, &tmp_top, &tmp_slot, n);

    /* 3. Directory: dir[b] = first position of bucket b. */
    unsigned p = sfs_sidecar_bits_for(n);
    uint64_t buckets = UINT64_C(1) << p;
    dir = malloc((buckets + 1) * sizeof(uint32_t));
    buf = malloc(WRITE_ENTRIES * sizeof(uint32_t));
    size_t plen = strlen(path) + 32;
    tmp_path = malloc(plen);
    char *dcopy = strdup(path), *bcopy = strdup(path);
    if (!dir || !buf || !tmp_path || !dcopy || !bcopy) {
        free(dcopy);
        free(bcopy);
        goto nomem;
    }
    uint64_t pos = 0;
    for (uint64_t b = 0; b <= buckets; b++) {
        while (pos < n && bucket_of(top[pos], p) < b)
            pos++;
        dir[b] = htole32((uint32_t)pos);
    }

    /* 4. Write a temporary file beside `path`, then rename it over. */
    snprintf(tmp_path, plen, "%s/.%s.tmp-XXXXXX", dirname(dcopy), basename(bcopy));
    free(dcopy);
    free(bcopy);
    fd = mkostemp(tmp_path, O_CLOEXEC);
    if (fd < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: creating a temporary file in its directory: %s",
                      path, strerror(errno));
        free(tmp_path);
        tmp_path = NULL; /* nothing to remove */
        goto done;
    }
    uint8_t header[SFS_SIDECAR_HEADER_SIZE] = {0};
    memcpy(header, SFS_SIDECAR_MAGIC, SFS_SIDECAR_MAGIC_SIZE);
    put_le32(header + 8, SFS_SIDECAR_VERSION);
    put_le32(header + 12, p);
    put_le64(header + 16, n);
    put_le64(header + 24, slots);
    memcpy(header + 32, identity, SFS_SIDECAR_IDENTITY_SIZE);
    uint64_t offset = 0;
    if (put(fd, header, sizeof(header), &offset) < 0 ||
        put(fd, dir, (buckets + 1) * sizeof(uint32_t), &offset) < 0)
        goto io;
    uint32_t *out = (uint32_t *)buf;
    for (uint64_t i = 0; i < n; i += WRITE_ENTRIES) {
        size_t m = n - i < WRITE_ENTRIES ? (size_t)(n - i) : WRITE_ENTRIES;
        for (size_t j = 0; j < m; j++)
            out[j] = htole32(fingerprint_of(top[i + j], p));
        if (put(fd, out, m * sizeof(uint32_t), &offset) < 0)
            goto io;
    }
    for (uint64_t i = 0; i < n; i += WRITE_ENTRIES) {
        size_t m = n - i < WRITE_ENTRIES ? (size_t)(n - i) : WRITE_ENTRIES;
        for (size_t j = 0; j < m; j++)
            out[j] = htole32(slot[i + j]);
        if (put(fd, out, m * sizeof(uint32_t), &offset) < 0)
            goto io;
    }
    if (fdatasync(fd) < 0)
        goto io;
    int cfd = fd;
    fd = -1;
    if (close(cfd) < 0)
        goto io;
    if (rename(tmp_path, path) < 0)
        goto io;
    free(tmp_path);
    tmp_path = NULL; /* published */
    char *copy = strdup(path);
    if (copy) {
        int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(copy);
    }
    goto done;
io:
    rc = sfs_fail(err, SFS_EIO, errno, "%s: writing the sidecar: %s", path, strerror(errno));
    goto done;
nomem:
    rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory building the sidecar of %s", path,
                  sfs_path(shard));
done:
    if (fd >= 0)
        close(fd);
    if (tmp_path) {
        unlink(tmp_path);
        free(tmp_path);
    }
    free(top);
    free(slot);
    free(tmp_top);
    free(tmp_slot);
    free(dir);
    free(buf);
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

void sfs_sidecar_close(sfs_sidecar_t *sc)
{
    if (!sc)
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
