/*
 * gindex.c — write, merge, open and query global index levels (format in
 * gindex.h).
 *
 * Writing is a k-way merge of sorted sources through a binary heap of one
 * cursor per source, keyed by (prefix << 24 | source): the smallest prefix
 * comes out first, and every cursor holding it is drained into a *group*
 * (the shard indices of one prefix), which is sorted, deduplicated and
 * emitted. Sources are the caller's runs (sfs_gindex_write: source i is
 * shard i) or open levels (sfs_gindex_merge: source i is level i, read with
 * pread in 64 KiB chunks, its shard indices remapped to the new table, so a
 * level's entries of one prefix may come out in any shard order: hence the
 * groups). Emitted entries go to the file through two buffered writers,
 * one at the directory's place and one at the entries', the directory
 * value of every bucket up to the entry's own written just before it; so
 * memory does not grow with the number of entries. The entry count, needed
 * first (it gives bucket_bits, hence where the entries start), is the sum
 * of the runs' distinct values for a write, and a first, counting pass of
 * the same merge for a merge (identities shared by levels may collapse
 * entries). The file is written unnamed (O_TMPFILE) and linked into place
 * when complete (output.c).
 *
 * Lookups read the mapping directly; only the header is checked at open;
 * the directory's values are clamped to [0, n] before use.
 */
#define _GNU_SOURCE
#include "gindex.h"
#include "internal.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct sfs_gindex {
    int refs;                /* holders beyond the first (internal.h) */
    /* hot: read by every lookup */
    const uint64_t *dir;     /* 2^b + 1 values, little-endian */
    const uint8_t *entries;  /* n entries of w bytes, little-endian */
    uint64_t n, s;
    unsigned b, w;
    uint64_t low_mask;       /* the bits an entry keeps: all but the top b */
    /* cold */
    const uint8_t *table;    /* s x 32 bytes */
    void *map;
    size_t map_size;
    int fd;                  /* kept for sfs_gindex_merge's preads */
    char *path;
};

#define SHARD_MASK ((UINT64_C(1) << SFS_GINDEX_SHARD_BITS) - 1)
#define PREFIX_LIMIT (UINT64_C(1) << SFS_GINDEX_PREFIX_BITS)
#define WRITE_BUFFER (1u << 20)     /* bytes per buffered writer */
#define LEVEL_CHUNK 8192u           /* entries per pread of a level: 64 KiB */
#define INDEX_CHUNK 26214u          /* slots per pread of a shard's index: ~1 MiB */
#define SMALL_SORT 24               /* insertion sort up to this many values */

uint64_t sfs_gindex_prefix(const uint8_t key[SFS_KEY_SIZE])
{
    return be64(key) >> (64 - SFS_GINDEX_PREFIX_BITS);
}

unsigned sfs_gindex_bits_for(uint64_t n)
{
    unsigned b = 0;
    while (b < SFS_GINDEX_MAX_BITS && ((uint64_t)SFS_GINDEX_BUCKET << b) < n)
        b++;
    return b;
}

unsigned sfs_gindex_entry_size(unsigned b)
{
    return (64 - b + 7) / 8;
}

uint64_t sfs_gindex_file_size(uint64_t s, unsigned b, uint64_t n)
{
    return SFS_GINDEX_HEADER_SIZE + SFS_GINDEX_IDENTITY_SIZE * s +
           8 * ((UINT64_C(1) << b) + 1) + sfs_gindex_entry_size(b) * n + SFS_GINDEX_PAD;
}

/* The low 64 - b bits of an entry's value (prefix << 24 | shard index):
 * what the file keeps; the top b bits are the entry's bucket. */
/* The reason of a failed sfs_pread_full (its result `got`, errno set). */
static const char *read_error(int got)
{
    return got == SFS_PREAD_SHORT ? "short read: the file shrank" : strerror(errno);
}

static inline uint64_t low_mask_for(unsigned b)
{
    return b ? UINT64_MAX >> b : UINT64_MAX;
}

/* The whole value of an entry of `bucket` whose kept bits are `low`. */
static inline uint64_t entry_value(uint64_t bucket, uint64_t low, unsigned b)
{
    return b ? bucket << (64 - b) | low : low;
}

/* The kept bits of the entry at p: 8 bytes loaded (the file's padding
 * makes that safe at the last entry), masked. */
static inline uint64_t load_entry(const uint8_t *p, uint64_t low_mask)
{
    return get_le64(p) & low_mask;
}

/* ---------------------------------------------------------------- sorting */

static void insertion_sort_u64(uint64_t *a, size_t m)
{
    for (size_t i = 1; i < m; i++) {
        uint64_t v = a[i];
        size_t j = i;
        for (; j > 0 && a[j - 1] > v; j--)
            a[j] = a[j - 1];
        a[j] = v;
    }
}

static int cmp_u32(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

/* Values < 2^40, ascending: LSD radix sort, 4 passes of 10 bits through
 * tmp (m values); the result ends up back in a. */
static void radix_sort40(uint64_t *a, uint64_t *tmp, size_t m)
{
    if (m <= SMALL_SORT) {
        insertion_sort_u64(a, m);
        return;
    }
    static const unsigned digit = 10, passes = 4;
    size_t count[1u << 10];
    uint64_t *src = a, *dst = tmp;
    for (unsigned pass = 0; pass < passes; pass++) {
        unsigned shift = pass * digit;
        memset(count, 0, sizeof(count));
        for (size_t i = 0; i < m; i++)
            count[(src[i] >> shift) & 1023]++;
        size_t at = 0;
        for (unsigned d = 0; d < 1024; d++) {
            size_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (size_t i = 0; i < m; i++)
            dst[count[(src[i] >> shift) & 1023]++] = src[i];
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    /* an even number of passes: src == a */
}

/* ---------------------------------------------------------------- runs of shards */

int sfs_shard_key_prefixes(const sfs_shard_t *shard, uint64_t **out, size_t *n,
                           sfs_error_t *err)
{
    *out = NULL;
    *n = 0;
    const sfs_header_t *h = sfs_header(shard);
    const char *path = sfs_path(shard);
    uint64_t slots = sfs_slot_count(shard);
    uint64_t *vals = NULL, *tmp = NULL;
    uint8_t *buf = NULL;
    int rc;

    int fd, owned;
    if ((rc = sfs_index_fd(shard, &fd, &owned, err)) != SFS_OK)
        return rc;

    /* slots <= size / 40 (checked by sfs_open): the array fits in memory
     * whenever the index does */
    vals = malloc((slots ? slots : 1) * sizeof(uint64_t));
    buf = malloc((size_t)(slots && slots < INDEX_CHUNK ? slots : INDEX_CHUNK) * SFS_SLOT_SIZE);
    if (!vals || !buf)
        goto nomem;
    size_t m = 0;
    for (uint64_t first = 0; first < slots; first += INDEX_CHUNK) {
        uint64_t c = slots - first < INDEX_CHUNK ? slots - first : INDEX_CHUNK;
        uint64_t at = h->index_position + first * SFS_SLOT_SIZE;
        int got = sfs_index_read(shard, fd, first, c, buf);
        if (got < 0) {
            int e = errno;
            rc = got == SFS_PREAD_SHORT ? sfs_fail(err, SFS_EIO, EIO, "%s: the shard shrank while its index "
                                     "was read (short read at byte %llu)", path,
                                     (unsigned long long)at)
                          : sfs_fail(err, SFS_EIO, e, "%s: reading the index at byte %llu: %s",
                                     path, (unsigned long long)at, strerror(e));
            goto done;
        }
        const uint8_t *s = buf;
        for (uint64_t i = 0; i < c; i++, s += SFS_SLOT_SIZE)
            if (be64(s + SFS_KEY_SIZE) != SFS_EMPTY_OFFSET)
                vals[m++] = sfs_gindex_prefix(s);
    }
    free(buf);
    buf = NULL;
    if (owned)
        close(fd);
    fd = -1;

    tmp = malloc((m ? m : 1) * sizeof(uint64_t));
    if (!tmp)
        goto nomem;
    radix_sort40(vals, tmp, m);
    free(tmp);
    tmp = NULL;
    size_t distinct = 0;
    for (size_t i = 0; i < m; i++)
        if (distinct == 0 || vals[i] != vals[distinct - 1])
            vals[distinct++] = vals[i];
    uint64_t *shrunk = realloc(vals, (distinct ? distinct : 1) * sizeof(uint64_t));
    if (shrunk)
        vals = shrunk;
    *out = vals;
    *n = distinct;
    vals = NULL;
    rc = SFS_OK;
    goto done;
nomem:
    rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory reading the keys of the index",
                  path);
done:
    if (fd >= 0 && owned)
        close(fd);
    free(buf);
    free(tmp);
    free(vals);
    return rc;
}

/* ---------------------------------------------------------------- output */

/* Bytes appended at `offset` of fd through a buffer. */
typedef struct {
    int fd;
    uint64_t offset; /* of buf[0] */
    uint8_t *buf;
    size_t len;
} bufw_t;

static int bufw_flush(bufw_t *w)
{
    if (w->len && sfs_pwrite_all(w->fd, w->buf, w->len, w->offset) < 0)
        return -1;
    w->offset += w->len;
    w->len = 0;
    return 0;
}

/* The low `bytes` (1..8) bytes of v, little-endian. */
static inline int bufw_put(bufw_t *w, uint64_t v, unsigned bytes)
{
    if (w->len + 8 > WRITE_BUFFER && bufw_flush(w) < 0)
        return -1;
    put_le64(w->buf + w->len, v);
    w->len += bytes;
    return 0;
}

/* Where merged entries go: counted only (a first pass), or written with
 * the directory values of the buckets up to their own. */
typedef struct {
    int counting;
    uint64_t n;        /* entries emitted so far */
    uint64_t expect;   /* entries of the file (writing) */
    unsigned b, w;     /* bucket_bits, bytes per entry */
    uint64_t next_dir; /* next directory value to write */
    bufw_t dir, ent;
} sink_t;

/* 0, -1 with errno on a write error, -2 when more than `expect` entries
 * come (the sources changed since they were counted). */
static inline int sink_emit(sink_t *k, uint64_t prefix, uint32_t shard)
{
    if (k->counting) {
        k->n++;
        return 0;
    }
    if (k->n == k->expect)
        return -2;
    uint64_t bucket = prefix >> (SFS_GINDEX_PREFIX_BITS - k->b);
    while (k->next_dir <= bucket) {
        if (bufw_put(&k->dir, k->n, 8) < 0)
            return -1;
        k->next_dir++;
    }
    if (bufw_put(&k->ent, (prefix << SFS_GINDEX_SHARD_BITS | shard) & low_mask_for(k->b), k->w) < 0)
        return -1;
    k->n++;
    return 0;
}

/* The directory's remaining values (n), the padding after the entries,
 * then both buffers flushed. */
static int sink_finish(sink_t *k)
{
    uint64_t buckets = UINT64_C(1) << k->b;
    while (k->next_dir <= buckets) {
        if (bufw_put(&k->dir, k->n, 8) < 0)
            return -1;
        k->next_dir++;
    }
    if (bufw_put(&k->ent, 0, SFS_GINDEX_PAD) < 0)
        return -1;
    return bufw_flush(&k->dir) < 0 || bufw_flush(&k->ent) < 0 ? -1 : 0;
}

/* ---------------------------------------------------------------- k-way merge */

/* A source of (prefix, shard) pairs, prefixes ascending. next(): 1 and the
 * pair, 0 at the end, or a negative sfs_status (err filled). */
typedef int (*next_fn)(void *ctx, size_t src, uint64_t *prefix, uint32_t *shard,
                       sfs_error_t *err);

/* Min-heap of u64 (prefix << 24 | source). */
static void heap_down(uint64_t *h, size_t m, size_t i)
{
    uint64_t v = h[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= m)
            break;
        if (c + 1 < m && h[c + 1] < h[c])
            c++;
        if (h[c] >= v)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
}

typedef struct {
    next_fn next;
    void *ctx;
    size_t nsources;        /* < 2^24 */
    uint64_t *heap;         /* [nsources] */
    uint32_t *pending;      /* [nsources]: the shard of each cursor's current pair */
    uint32_t *group;        /* [group_cap] */
    size_t group_cap;       /* >= the pairs of one prefix, all sources together */
} merger_t;

/* One full merge of the sources into the sink. SFS_OK, or a negative
 * status with err filled (write errors: SFS_EIO naming `path`). */
static int merge_into(merger_t *mg, sink_t *sink, const char *path, sfs_error_t *err)
{
    size_t m = 0;
    for (size_t i = 0; i < mg->nsources; i++) {
        uint64_t prefix;
        uint32_t shard;
        int got = mg->next(mg->ctx, i, &prefix, &shard, err);
        if (got < 0)
            return got;
        if (got) {
            mg->pending[i] = shard;
            mg->heap[m++] = prefix << SFS_GINDEX_SHARD_BITS | i;
        }
    }
    for (size_t i = m / 2; i-- > 0;)
        heap_down(mg->heap, m, i);
    while (m) {
        uint64_t prefix = mg->heap[0] >> SFS_GINDEX_SHARD_BITS;
        size_t g = 0;
        /* drain every cursor at this prefix */
        while (m && mg->heap[0] >> SFS_GINDEX_SHARD_BITS == prefix) {
            size_t src = (size_t)(mg->heap[0] & SHARD_MASK);
            if (g == mg->group_cap) /* cannot happen with checked sources */
                return sfs_fail(err, SFS_ECORRUPT, 0, "%s: more than %zu entries share a key "
                                "prefix", path, mg->group_cap);
            mg->group[g++] = mg->pending[src];
            uint64_t next_prefix;
            uint32_t shard;
            int got = mg->next(mg->ctx, src, &next_prefix, &shard, err);
            if (got < 0)
                return got;
            if (got) {
                mg->pending[src] = shard;
                mg->heap[0] = next_prefix << SFS_GINDEX_SHARD_BITS | src;
            } else {
                mg->heap[0] = mg->heap[--m];
            }
            if (m)
                heap_down(mg->heap, m, 0);
        }
        if (g > SMALL_SORT) {
            qsort(mg->group, g, sizeof(uint32_t), cmp_u32);
        } else {
            for (size_t i = 1; i < g; i++) {
                uint32_t v = mg->group[i];
                size_t j = i;
                for (; j > 0 && mg->group[j - 1] > v; j--)
                    mg->group[j] = mg->group[j - 1];
                mg->group[j] = v;
            }
        }
        for (size_t i = 0; i < g; i++) {
            if (i && mg->group[i] == mg->group[i - 1])
                continue;
            int rc = sink_emit(sink, prefix, mg->group[i]);
            if (rc == -2)
                return sfs_fail(err, SFS_EIO, EAGAIN, "%s: the merged levels changed between "
                                "the counting and the writing pass", path);
            if (rc < 0)
                return sfs_fail(err, SFS_EIO, errno, "%s: writing the global index: %s", path,
                                strerror(errno));
        }
    }
    return SFS_OK;
}

/* Header and shard table (s x 32 bytes at ids), then a writing pass of the
 * merge of n entries, fdatasync, publish. */
static int write_level(const char *path, const uint8_t *ids, uint64_t s, uint64_t n,
                       merger_t *mg, sfs_error_t *err)
{
    int fd = -1, rc;
    char *tmp_path = NULL;
    sink_t sink = {.expect = n, .b = sfs_gindex_bits_for(n)};
    sink.w = sfs_gindex_entry_size(sink.b);
    sink.dir.buf = malloc(WRITE_BUFFER);
    sink.ent.buf = malloc(WRITE_BUFFER);
    if (!sink.dir.buf || !sink.ent.buf) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory writing the global index",
                      path);
        goto done;
    }
    if ((rc = sfs_output_create(path, 0600, &fd, &tmp_path, err)) != SFS_OK)
        goto done;
    uint8_t header[SFS_GINDEX_HEADER_SIZE] = {0};
    memcpy(header, SFS_GINDEX_MAGIC, SFS_GINDEX_MAGIC_SIZE);
    put_le32(header + 8, SFS_GINDEX_VERSION);
    put_le32(header + 12, sink.b);
    put_le64(header + 16, n);
    put_le64(header + 24, s);
    uint64_t table = SFS_GINDEX_IDENTITY_SIZE * s;
    sink.dir.fd = sink.ent.fd = fd;
    sink.dir.offset = SFS_GINDEX_HEADER_SIZE + table;
    sink.ent.offset = sink.dir.offset + 8 * ((UINT64_C(1) << sink.b) + 1);
    if (sfs_pwrite_all(fd, header, sizeof(header), 0) < 0 ||
        (table && sfs_pwrite_all(fd, ids, (size_t)table, SFS_GINDEX_HEADER_SIZE) < 0)) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: writing the global index: %s", path,
                      strerror(errno));
        goto done;
    }
    if ((rc = merge_into(mg, &sink, path, err)) != SFS_OK)
        goto done;
    if (sink.n != n) {
        rc = sfs_fail(err, SFS_EIO, EAGAIN, "%s: the merged levels changed between the counting "
                      "and the writing pass", path);
        goto done;
    }
    if (sink_finish(&sink) < 0 || fdatasync(fd) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: writing the global index: %s", path,
                      strerror(errno));
        goto done;
    }
    if (sfs_output_publish(fd, &tmp_path, path) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: putting the global index in place: %s", path,
                      strerror(errno));
        goto done;
    }
    sfs_sync_directory(path);
    rc = SFS_OK;
done:
    if (fd >= 0)
        close(fd); /* an unnamed file not published is freed here */
    if (tmp_path) {
        unlink(tmp_path);
        free(tmp_path);
    }
    free(sink.dir.buf);
    free(sink.ent.buf);
    return rc;
}

/* ---------------------------------------------------------------- write */

typedef struct {
    const uint64_t *const *runs;
    const uint64_t *run_len;
    uint64_t *pos; /* [nruns] */
} runs_ctx;

static int next_in_run(void *ctx, size_t src, uint64_t *prefix, uint32_t *shard,
                       sfs_error_t *err)
{
    runs_ctx *r = ctx;
    uint64_t i = r->pos[src], len = r->run_len[src];
    const uint64_t *run = r->runs[src];
    while (i && i < len && run[i] == run[i - 1]) /* repeated values: once */
        i++;
    if (i >= len)
        return 0;
    *prefix = run[i];
    *shard = (uint32_t)src;
    r->pos[src] = i + 1;
    return 1;
}

int sfs_gindex_write(const char *path, const uint64_t *const *runs, const uint64_t *run_len,
                     const uint8_t (*identities)[SFS_GINDEX_IDENTITY_SIZE], size_t nruns,
                     sfs_error_t *err)
{
    if ((uint64_t)nruns > SFS_GINDEX_MAX_SHARDS)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: %zu shards, a global index holds at most 2^24",
                        path, nruns);
    /* Check the runs and count their distinct values: the entries (runs
     * are distinct shards, so no entry of one equals an entry of another). */
    uint64_t n = 0;
    for (size_t i = 0; i < nruns; i++) {
        const uint64_t *run = runs[i];
        if (run_len[i] && !run)
            return sfs_fail(err, SFS_EINVAL, 0, "%s: run %zu is NULL but has %llu values", path,
                            i, (unsigned long long)run_len[i]);
        for (uint64_t j = 0; j < run_len[i]; j++) {
            if (run[j] >= PREFIX_LIMIT)
                return sfs_fail(err, SFS_EINVAL, 0, "%s: run %zu: value %llu at position %llu "
                                "is not a 40-bit key prefix", path, i,
                                (unsigned long long)run[j], (unsigned long long)j);
            if (j && run[j] < run[j - 1])
                return sfs_fail(err, SFS_EINVAL, 0, "%s: run %zu is not sorted (position %llu)",
                                path, i, (unsigned long long)j);
            n += !j || run[j] != run[j - 1];
        }
    }
    size_t k = nruns ? nruns : 1;
    runs_ctx ctx = {runs, run_len, calloc(k, sizeof(uint64_t))};
    merger_t mg = {next_in_run, &ctx, nruns, malloc(k * sizeof(uint64_t)),
                   malloc(k * sizeof(uint32_t)), malloc(k * sizeof(uint32_t)), nruns};
    int rc;
    if (!ctx.pos || !mg.heap || !mg.pending || !mg.group)
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory writing the global index", path);
    else
        rc = write_level(path, (const uint8_t *)identities, nruns, n, &mg, err);
    free(ctx.pos);
    free(mg.heap);
    free(mg.pending);
    free(mg.group);
    return rc;
}

/* ---------------------------------------------------------------- merge */

/* One level read with pread, its shards remapped (UINT32_MAX: dropped).
 * An entry keeps the low 64 - b bits of its value; the top b bits are its
 * bucket, found by reading the directory alongside. */
typedef struct {
    const sfs_gindex_t *g;
    const uint32_t *remap; /* [s] */
    uint64_t pos;          /* entries consumed */
    uint64_t last;         /* the last entry read (pos > 0) */
    uint64_t *buf;         /* LEVEL_CHUNK entries' kept bits, host order */
    uint8_t *raw;          /* LEVEL_CHUNK * 8 bytes: entries as read */
    size_t len, at;
    uint64_t *dbuf;        /* LEVEL_CHUNK directory values, host order */
    size_t dlen, dat;
    uint64_t dnext;        /* index of the next directory value to read */
    uint64_t bucket;       /* the bucket of entry pos (UINT64_MAX: before bucket 0) */
    uint64_t bucket_end;   /* dir[bucket + 1]: its first entry past it */
} level_reader;

/* Back to the level's first entry (the counting pass done). dir[0] is
 * taken as 0: bucket 0 starts at the first entry. */
static void level_reader_rewind(level_reader *r)
{
    r->pos = r->last = 0;
    r->len = r->at = r->dlen = r->dat = 0;
    r->dnext = 1;
    r->bucket = UINT64_MAX;
    r->bucket_end = 0;
}

/* The next directory value into *v: SFS_OK, or a negative status. */
static int next_dir_value(level_reader *r, uint64_t *v, sfs_error_t *err)
{
    const sfs_gindex_t *g = r->g;
    uint64_t values = (UINT64_C(1) << g->b) + 1;
    if (r->dat == r->dlen) {
        if (r->dnext >= values)
            return sfs_fail(err, SFS_ECORRUPT, 0, "%s: corrupt global index: its directory ends "
                            "before entry %llu", g->path, (unsigned long long)r->pos);
        uint64_t left = values - r->dnext;
        size_t c = left < LEVEL_CHUNK ? (size_t)left : LEVEL_CHUNK;
        uint64_t at = SFS_GINDEX_HEADER_SIZE + SFS_GINDEX_IDENTITY_SIZE * g->s + 8 * r->dnext;
        int got = sfs_pread_full(g->fd, r->dbuf, c * 8, at);
        if (got < 0)
            return sfs_fail(err, SFS_EIO, errno, "%s: reading the directory at byte %llu: %s",
                            g->path, (unsigned long long)at, read_error(got));
        for (size_t i = 0; i < c; i++)
            r->dbuf[i] = le64toh(r->dbuf[i]);
        r->dlen = c;
        r->dat = 0;
        r->dnext += c;
    }
    *v = r->dbuf[r->dat++];
    return SFS_OK;
}

typedef struct {
    level_reader *levels;
} levels_ctx;

#define DROPPED UINT32_MAX

static int next_in_level(void *ctx, size_t src, uint64_t *prefix, uint32_t *shard,
                         sfs_error_t *err)
{
    level_reader *r = &((levels_ctx *)ctx)->levels[src];
    const sfs_gindex_t *g = r->g;
    for (;;) {
        if (r->at == r->len) {
            uint64_t left = g->n - r->pos;
            if (left == 0)
                return 0;
            size_t c = left < LEVEL_CHUNK ? (size_t)left : LEVEL_CHUNK;
            uint64_t at = sfs_gindex_file_size(g->s, g->b, r->pos) - SFS_GINDEX_PAD;
            /* the padding after the last entry is read too: 8 bytes per load */
            int got = sfs_pread_full(g->fd, r->raw, c * g->w + SFS_GINDEX_PAD, at);
            if (got < 0)
                return sfs_fail(err, SFS_EIO, errno, "%s: reading entries at byte %llu: %s",
                                g->path, (unsigned long long)at, read_error(got));
            for (size_t i = 0; i < c; i++)
                r->buf[i] = load_entry(r->raw + i * g->w, g->low_mask);
            r->len = c;
            r->at = 0;
        }
        while (r->bucket_end <= r->pos) { /* the bucket of entry pos */
            uint64_t v = 0;
            int rc = next_dir_value(r, &v, err);
            if (rc != SFS_OK)
                return rc;
            r->bucket++;
            r->bucket_end = v;
        }
        uint64_t e = entry_value(r->bucket, r->buf[r->at++], g->b);
        if (r->pos && e <= r->last)
            return sfs_fail(err, SFS_ECORRUPT, 0, "%s: corrupt global index: entry %llu is not "
                            "greater than the one before", g->path, (unsigned long long)r->pos);
        r->last = e;
        r->pos++;
        uint64_t j = e & SHARD_MASK;
        if (j >= g->s)
            return sfs_fail(err, SFS_ECORRUPT, 0, "%s: corrupt global index: entry %llu names "
                            "shard %llu of %llu", g->path, (unsigned long long)(r->pos - 1),
                            (unsigned long long)j, (unsigned long long)g->s);
        if (r->remap[j] == DROPPED)
            continue;
        *prefix = e >> SFS_GINDEX_SHARD_BITS;
        *shard = r->remap[j];
        return 1;
    }
}

/* Identities ordered for deduplication: by bytes, then by position. */
static int cmp_identity(const void *x, const void *y, void *ids)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    int c = memcmp((const uint8_t *)ids + (size_t)a * SFS_GINDEX_IDENTITY_SIZE,
                   (const uint8_t *)ids + (size_t)b * SFS_GINDEX_IDENTITY_SIZE,
                   SFS_GINDEX_IDENTITY_SIZE);
    return c ? c : (a > b) - (a < b);
}

int sfs_gindex_merge(const char *path, sfs_gindex_t *const *levels, size_t nlevels,
                     const uint8_t *const *keep_masks, sfs_error_t *err)
{
    if ((uint64_t)nlevels >= SFS_GINDEX_MAX_SHARDS)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: %zu levels to merge, at most 2^24 - 1", path,
                        nlevels);
    uint64_t total = 0;
    for (size_t i = 0; i < nlevels; i++)
        total += levels[i]->s; /* each <= 2^24 */
    if (total >= UINT32_MAX)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: %llu shards in the levels to merge, at most "
                        "2^32 - 2", path, (unsigned long long)total);
    size_t tot = (size_t)(total ? total : 1), k = nlevels ? nlevels : 1;
    uint8_t *ids = malloc(tot * SFS_GINDEX_IDENTITY_SIZE), *table = NULL;
    uint32_t *order = malloc(tot * sizeof(uint32_t)), *remap = malloc(tot * sizeof(uint32_t));
    uint64_t *first = malloc(k * sizeof(uint64_t)); /* position of level i's shard 0 */
    level_reader *readers = calloc(k, sizeof(level_reader));
    merger_t mg = {next_in_level, NULL, nlevels, malloc(k * sizeof(uint64_t)),
                   malloc(k * sizeof(uint32_t)), malloc(tot * sizeof(uint32_t)), tot};
    levels_ctx ctx = {readers};
    mg.ctx = &ctx;
    int rc;
    if (!ids || !order || !remap || !first || !readers || !mg.heap || !mg.pending || !mg.group)
        goto nomem;

    /* 1. Every level's shard table (pread), the kept positions sorted by
     * (identity, position): the first of each identity is its
     * representative, numbered in position order. */
    size_t kept = 0;
    uint64_t at = 0;
    for (size_t i = 0; i < nlevels; i++) {
        const sfs_gindex_t *g = levels[i];
        first[i] = at;
        size_t bytes = (size_t)g->s * SFS_GINDEX_IDENTITY_SIZE;
        int got = bytes ? sfs_pread_full(g->fd, ids + at * SFS_GINDEX_IDENTITY_SIZE, bytes,
                                         SFS_GINDEX_HEADER_SIZE) : 0;
        if (got < 0) {
            rc = sfs_fail(err, SFS_EIO, errno, "%s: reading the shard table: %s", g->path,
                          read_error(got));
            goto done;
        }
        const uint8_t *mask = keep_masks ? keep_masks[i] : NULL;
        for (uint64_t j = 0; j < g->s; j++, at++) {
            remap[at] = DROPPED;
            if (!mask || mask[j])
                order[kept++] = (uint32_t)at;
        }
    }
    qsort_r(order, kept, sizeof(uint32_t), cmp_identity, ids);
    /* remap[pos] = the representative's position, for now */
    for (size_t i = 0; i < kept; i++) {
        int same = i && memcmp(ids + (size_t)order[i - 1] * SFS_GINDEX_IDENTITY_SIZE,
                               ids + (size_t)order[i] * SFS_GINDEX_IDENTITY_SIZE,
                               SFS_GINDEX_IDENTITY_SIZE) == 0;
        remap[order[i]] = same ? remap[order[i - 1]] : order[i];
    }
    uint64_t s = 0;
    for (uint64_t pos = 0; pos < total; pos++) {
        if (remap[pos] == DROPPED)
            continue;
        if (remap[pos] == pos) { /* a representative: the next index */
            if (s == SFS_GINDEX_MAX_SHARDS) {
                rc = sfs_fail(err, SFS_EINVAL, 0, "%s: more than 2^24 distinct shards kept, a "
                              "global index holds at most 2^24", path);
                goto done;
            }
            order[s] = (uint32_t)pos; /* order[] is free again: new index -> position */
            remap[pos] = (uint32_t)s++;
        } else {
            remap[pos] = remap[remap[pos]]; /* the representative came first */
        }
    }
    table = malloc((size_t)(s ? s : 1) * SFS_GINDEX_IDENTITY_SIZE);
    if (!table)
        goto nomem;
    for (uint64_t j = 0; j < s; j++)
        memcpy(table + j * SFS_GINDEX_IDENTITY_SIZE,
               ids + (size_t)order[j] * SFS_GINDEX_IDENTITY_SIZE, SFS_GINDEX_IDENTITY_SIZE);
    free(ids);
    ids = NULL;

    /* 2. Count, then write. */
    for (size_t i = 0; i < nlevels; i++) {
        readers[i].g = levels[i];
        readers[i].remap = remap + first[i];
        readers[i].buf = malloc(LEVEL_CHUNK * sizeof(uint64_t));
        readers[i].raw = malloc(LEVEL_CHUNK * 8 + SFS_GINDEX_PAD);
        readers[i].dbuf = malloc(LEVEL_CHUNK * sizeof(uint64_t));
        if (!readers[i].buf || !readers[i].raw || !readers[i].dbuf)
            goto nomem;
        level_reader_rewind(&readers[i]);
    }
    sink_t counter = {.counting = 1};
    if ((rc = merge_into(&mg, &counter, path, err)) != SFS_OK)
        goto done;
    for (size_t i = 0; i < nlevels; i++)
        level_reader_rewind(&readers[i]);
    rc = write_level(path, table, s, counter.n, &mg, err);
    goto done;
nomem:
    rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory merging global index levels", path);
done:
    if (readers)
        for (size_t i = 0; i < nlevels; i++) {
            free(readers[i].buf);
            free(readers[i].raw);
            free(readers[i].dbuf);
        }
    free(readers);
    free(ids);
    free(table);
    free(order);
    free(remap);
    free(first);
    free(mg.heap);
    free(mg.pending);
    free(mg.group);
    return rc;
}

/* ---------------------------------------------------------------- open */

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)

int sfs_gindex_open(const char *path, sfs_gindex_t **out, sfs_error_t *err)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc;
    if (fd < 0)
        return sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
    sfs_gindex_t *g = NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = CORRUPT("%s: not a regular file", path);
        goto fail;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    uint64_t size = (uint64_t)st.st_size;
    if (size < SFS_GINDEX_HEADER_SIZE) {
        rc = CORRUPT("%s: truncated global index: %llu bytes, smaller than the 64-byte header",
                     path, (unsigned long long)size);
        goto fail;
    }
    uint8_t h[SFS_GINDEX_HEADER_SIZE];
    int got = sfs_pread_full(fd, h, sizeof(h), 0);
    if (got < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: reading the header: %s", path, read_error(got));
        goto fail;
    }
    if (memcmp(h, SFS_GINDEX_MAGIC, SFS_GINDEX_MAGIC_SIZE) != 0) {
        rc = CORRUPT("%s: bad magic: not a shardfs global index (expected \"SFSGIDX1\")", path);
        goto fail;
    }
    uint32_t version = get_le32(h + 8), b = get_le32(h + 12);
    uint64_t n = get_le64(h + 16), s = get_le64(h + 24);
    if (version != SFS_GINDEX_VERSION) {
        rc = CORRUPT("%s: global index version is %u, only version %d is supported", path,
                     version, SFS_GINDEX_VERSION);
        goto fail;
    }
    if (b > SFS_GINDEX_MAX_BITS) {
        rc = CORRUPT("%s: global index bucket_bits is %u, more than 32", path, b);
        goto fail;
    }
    if (s > SFS_GINDEX_MAX_SHARDS) {
        rc = CORRUPT("%s: global index shard_count is %llu, more than 2^24", path,
                     (unsigned long long)s);
        goto fail;
    }
    uint64_t fixed = sfs_gindex_file_size(s, b, 0); /* no overflow: s, b bounded */
    unsigned w = sfs_gindex_entry_size(b);
    if (size < fixed || (size - fixed) / w != n || (size - fixed) % w) {
        unsigned long long want = n <= (UINT64_MAX - fixed) / w ? fixed + w * n : 0;
        rc = CORRUPT("%s: global index is %llu bytes, its header (shard_count %llu, bucket_bits "
                     "%u, count %llu) needs exactly %llu%s", path, (unsigned long long)size,
                     (unsigned long long)s, b, (unsigned long long)n, want,
                     want ? "" : " (overflow)");
        goto fail;
    }
    if (size > SIZE_MAX) {
        rc = CORRUPT("%s: global index too large to map", path);
        goto fail;
    }
    g = calloc(1, sizeof(*g));
    if (!g || !(g->path = strdup(path))) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    madvise(m, (size_t)size, MADV_RANDOM);
    g->map = m;
    g->map_size = (size_t)size;
    g->fd = fd;
    g->n = n;
    g->s = s;
    g->b = b;
    g->w = w;
    g->low_mask = low_mask_for(b);
    g->table = (const uint8_t *)m + SFS_GINDEX_HEADER_SIZE;
    g->dir = (const uint64_t *)(g->table + SFS_GINDEX_IDENTITY_SIZE * s);
    g->entries = (const uint8_t *)(g->dir + (UINT64_C(1) << b) + 1);
    *out = g;
    return SFS_OK;
fail:
    if (g)
        free(g->path);
    free(g);
    close(fd);
    return rc;
}

sfs_gindex_t *sfs_gindex_ref(sfs_gindex_t *g)
{
    sfs_ref_take(&g->refs);
    return g;
}

void sfs_gindex_close(sfs_gindex_t *g)
{
    if (!g || !sfs_ref_drop(&g->refs))
        return;
    munmap(g->map, g->map_size);
    close(g->fd);
    free(g->path);
    free(g);
}

uint64_t sfs_gindex_count(const sfs_gindex_t *g) { return g->n; }
uint64_t sfs_gindex_shard_count(const sfs_gindex_t *g) { return g->s; }
unsigned sfs_gindex_bucket_bits(const sfs_gindex_t *g) { return g->b; }
const char *sfs_gindex_path(const sfs_gindex_t *g) { return g->path; }

const uint8_t *sfs_gindex_identity(const sfs_gindex_t *g, uint64_t j)
{
    return j < g->s ? g->table + j * SFS_GINDEX_IDENTITY_SIZE : NULL;
}

/* ---------------------------------------------------------------- lookup */

size_t sfs_gindex_lookup(const sfs_gindex_t *g, const uint8_t key[SFS_KEY_SIZE], uint32_t *out,
                         size_t max)
{
    const uint64_t prefix = sfs_gindex_prefix(key), n = g->n;
    const uint64_t bucket = prefix >> (SFS_GINDEX_PREFIX_BITS - g->b);
    uint64_t lo = le64toh(g->dir[bucket]), hi = le64toh(g->dir[bucket + 1]);
    lo = lo < n ? lo : n;
    hi = hi < n ? hi : n;
    hi = hi > lo ? hi : lo;
    const uint8_t *e = g->entries;
    const unsigned w = g->w;
    const uint64_t mask = g->low_mask;
    /* First entry >= (prefix, shard 0): a branch-free binary search. The
     * bucket's entries share their top b bits (the bucket): the kept bits
     * compare as the whole values do. */
    const uint64_t target = (prefix << SFS_GINDEX_SHARD_BITS) & mask;
    uint64_t len = hi - lo;
    while (len > 1) {
        uint64_t half = len / 2;
        __builtin_prefetch(e + (lo + half / 2) * w);
        __builtin_prefetch(e + (lo + half + half / 2) * w);
        lo = load_entry(e + (lo + half - 1) * w, mask) < target ? lo + half : lo;
        len -= half;
    }
    if (len == 1 && load_entry(e + lo * w, mask) < target)
        lo++;
    size_t found = 0;
    for (uint64_t i = lo; i < hi; i++) {
        uint64_t v = entry_value(bucket, load_entry(e + i * w, mask), g->b);
        if (v >> SFS_GINDEX_SHARD_BITS != prefix)
            break;
        uint64_t j = v & SHARD_MASK;
        if (j >= g->s)
            continue;
        if (found < max)
            out[found] = (uint32_t)j;
        found++;
    }
    return found;
}
