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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define BLOCK_BITS 16
#define BLOCK_ENTRIES (1u << BLOCK_BITS)
#define BUFFER_SIZE (1u << 20)
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
    w->flushed = SFS_OBJECTS_POSITION;
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
    if (append(w, &be, 8) < 0) {
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

int sfs_writer_add_fd(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], int fd, uint64_t size,
                      sfs_error_t *err)
{
    uint64_t start;
    int rc = begin_append(w, key, size, &start, err);
    if (rc != SFS_OK)
        return rc;
    uint64_t left = size;
    while (left) {
        /* Read straight into the write buffer; flush when full. */
        if (w->buf_len == BUFFER_SIZE && flush(w) < 0) {
            rc = io_fail(w, err, "writing an object");
            rollback(w, start);
            return rc;
        }
        size_t room = BUFFER_SIZE - w->buf_len;
        size_t want = left < room ? (size_t)left : room;
        ssize_t n = read(fd, w->buf + w->buf_len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            rc = sfs_fail(err, SFS_EIO, e, "%s: reading an object's source: %s", w->path,
                          n < 0 ? strerror(e) : "the file is shorter than its size (changed "
                                                "while being added?)");
            rollback(w, start);
            return rc;
        }
        w->buf_len += (size_t)n;
        left -= (uint64_t)n;
    }
    commit_object(w, key, start, size);
    return SFS_OK;
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

/* Build with cmph: the function's dump in *dump (malloc'ed), the function
 * itself in *mph. */
static int build_cmph(sfs_writer_t *w, char **dump, size_t *dump_len, cmph_t **mph,
                      sfs_error_t *err)
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
    *mph = cmph_new(config);
    cmph_config_destroy(config);
    if (!*mph)
        return sfs_fail(err, SFS_EHASH, 0, "%s: cmph could not build the perfect hash over %llu "
                        "keys", w->path, (unsigned long long)w->count);
    FILE *mem = open_memstream(dump, dump_len);
    if (!mem) {
        cmph_destroy(*mph);
        *mph = NULL;
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    }
    cmph_dump(*mph, mem);
    if (fclose(mem) != 0) {
        cmph_destroy(*mph);
        *mph = NULL;
        free(*dump);
        *dump = NULL;
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    }
    return SFS_OK;
}

/* Build with chd_build.c: *dump (malloc'ed) on success; SFS_EHASH when no
 * seed worked (the caller then tries cmph). */
static int build_ours(sfs_writer_t *w, char **dump, size_t *dump_len, sfs_error_t *err)
{
    sfs_chd_built_t built;
    char why[200];
    int rc = sfs_chd_build(key_at, w, w->count ? w->count : 1, SFS_KEY_SIZE, NULL, &built, why,
                           sizeof(why));
    if (rc == SFS_CHD_BUILD_NOMEM)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
    if (rc != SFS_CHD_BUILD_OK)
        return sfs_fail(err, SFS_EHASH, 0, "%s: %s", w->path, why);
    *dump = (char *)built.dump;
    *dump_len = built.dump_len;
    return SFS_OK;
}

/* cmph's builder instead of ours (bench/hash_bench.py's A/B, and a way out
 * should ours ever misbehave): SHARDFS_CHD_BUILDER=cmph. */
static int want_cmph_builder(void)
{
    const char *v = getenv("SHARDFS_CHD_BUILDER");
    return v && strcmp(v, "cmph") == 0;
}

static int finish(sfs_writer_t *w, sfs_build_stats_t *stats, sfs_error_t *err)
{
    double t0 = now();
    int rc;
    if (flush(w) < 0)
        return io_fail(w, err, "writing objects");
    sfs_header_t h = {0};
    h.version = SFS_VERSION;
    h.objects_count = w->count;
    h.objects_position = SFS_OBJECTS_POSITION;
    h.objects_size = w->flushed - SFS_OBJECTS_POSITION;
    h.index_position = w->flushed;

    /* The duplicate table is not needed any more: free it before the build. */
    free(w->table);
    w->table = NULL;
    w->table_cap = 0;

    double tb = now();
    char *dump = NULL;
    size_t dump_len = 0;
    cmph_t *mph = NULL;
    stats->builder = "shardfs";
    rc = SFS_EHASH;
    if (!want_cmph_builder()) {
        rc = build_ours(w, &dump, &dump_len, err);
        if (rc == SFS_ENOMEM)
            return rc;
    }
    if (rc != SFS_OK) {
        stats->builder = "cmph";
        rc = build_cmph(w, &dump, &dump_len, &mph, err);
        if (rc != SFS_OK)
            return rc;
    }
    double t1 = now();

    /* Every key is checked before anything is written: cmph (as swh-shard's
     * reader evaluates the function) and our evaluator (the one our readers
     * use) must agree on it, inside the index, and no slot may be used
     * twice. The dump is validated by our parser first, then loaded by
     * cmph. A disagreement costs a failed build, not an unreadable shard. */
    sfs_chd_t chd;
    char why[256] = "";
    uint64_t slots = 0;
    uint32_t *slot_entry = NULL;
    if (sfs_chd_parse(&chd, (const uint8_t *)dump, dump_len, why, sizeof(why)) < 0) {
        rc = sfs_fail(err, SFS_EHASH, 0, "%s: the perfect hash built (%s) cannot be read: %s",
                      w->path, stats->builder, why);
        goto out;
    }
    if (!mph) {
        FILE *mem = fmemopen(dump, dump_len, "r");
        if (!mem) {
            rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
            goto out;
        }
        mph = cmph_load(mem);
        fclose(mem);
        if (!mph) {
            rc = sfs_fail(err, SFS_EHASH, 0, "%s: cmph cannot load the perfect hash built",
                          w->path);
            goto out;
        }
    }
    slots = cmph_size(mph);
    if (chd.n != slots) {
        rc = sfs_fail(err, SFS_EHASH, 0, "%s: cmph and our parser disagree on the slot count "
                      "(%llu and %u)", w->path, (unsigned long long)slots, chd.n);
        goto out;
    }
    slot_entry = malloc(slots * sizeof(uint32_t));
    if (!slot_entry) {
        rc = sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", w->path);
        goto out;
    }
    memset(slot_entry, 0xff, slots * sizeof(uint32_t));
    for (uint64_t i = 0; i < w->count; i++) {
        const uint8_t *key = entry_at(w, i)->key;
        cmph_uint32 s = cmph_search(mph, (const char *)key, SFS_KEY_SIZE);
        if (s >= slots || slot_entry[s] != UINT32_MAX || sfs_chd_search(&chd, key, SFS_KEY_SIZE) != s) {
            rc = sfs_fail(err, SFS_EHASH, 0, "%s: perfect hash inconsistent at key %llu", w->path,
                          (unsigned long long)i);
            goto out;
        }
        slot_entry[s] = (uint32_t)i;
    }
    double t2 = now();
    h.index_size = slots * SFS_SLOT_SIZE;
    for (uint64_t s = 0; s < slots; s++) {
        uint8_t slot[SFS_SLOT_SIZE] = {0};
        uint64_t off = SFS_EMPTY_OFFSET;
        if (slot_entry[s] != UINT32_MAX) {
            const entry_t *e = entry_at(w, slot_entry[s]);
            memcpy(slot, e->key, SFS_KEY_SIZE);
            off = e->offset;
        }
        off = __builtin_bswap64(off);
        memcpy(slot + SFS_KEY_SIZE, &off, 8);
        if (append(w, slot, sizeof(slot)) < 0) {
            rc = io_fail(w, err, "writing the index");
            goto out;
        }
    }
    h.hash_position = pos(w);
    if (append(w, dump, dump_len) < 0 || flush(w) < 0) {
        rc = io_fail(w, err, "writing the hash");
        goto out;
    }
    double t3 = now();
    /* Header block last: until it is written the file has no magic. */
    uint8_t head[SFS_OBJECTS_POSITION] = {0};
    memcpy(head, SFS_MAGIC, sizeof(SFS_MAGIC) - 1);
    uint64_t fields[7] = {h.version, h.objects_count, h.objects_position, h.objects_size,
                          h.index_position, h.index_size, h.hash_position};
    for (int i = 0; i < 7; i++) {
        uint64_t v = __builtin_bswap64(fields[i]);
        memcpy(head + SFS_MAGIC_SIZE + 8 * i, &v, 8);
    }
    if (sfs_pwrite_all(w->fd, head, sizeof(head), 0) < 0) {
        rc = io_fail(w, err, "writing the header");
        goto out;
    }
    if (w->regular && ftruncate(w->fd, (off_t)w->flushed) < 0) {
        rc = io_fail(w, err, "truncating");
        goto out;
    }
    if (fdatasync(w->fd) < 0 && errno != EINVAL && errno != EROFS) {
        rc = io_fail(w, err, "fdatasync");
        goto out;
    }
    stats->hash_seconds = t1 - tb;
    stats->check_seconds = t2 - t1;
    stats->index_seconds = (tb - t0) + (t3 - t2);
    stats->sync_seconds = now() - t3;
    stats->slots = slots;
    rc = SFS_OK;
out:
    free(slot_entry);
    free(dump);
    if (mph)
        cmph_destroy(mph);
    return rc;
}

static void free_writer(sfs_writer_t *w)
{
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
