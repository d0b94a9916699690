/*
 * ll_resolve.c — names and inodes resolved over one snapshot
 * (ll_resolve.h).
 */
#include "ll_resolve.h"
#include "ll_guarded.h"

#include <stdlib.h>

/* Shard numbers gathered for one lookup: the first LOOKUP_STACK on the
 * stack, more (a key stored in many shards) in a heap buffer. */
typedef struct {
    int64_t stack[LOOKUP_STACK];
    int64_t *v;
    size_t n, cap;
} numbers_t;

static void numbers_init(numbers_t *c)
{
    c->v = c->stack;
    c->n = 0;
    c->cap = LOOKUP_STACK;
}

static void numbers_free(numbers_t *c)
{
    if (c->v != c->stack)
        free(c->v);
}

static int numbers_add(numbers_t *c, int64_t number)
{
    if (c->n == c->cap) {
        int64_t *v = malloc(2 * c->cap * sizeof(int64_t));
        if (!v)
            return -1;
        memcpy(v, c->v, c->n * sizeof(int64_t));
        numbers_free(c);
        c->v = v;
        c->cap *= 2;
    }
    c->v[c->n++] = number;
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Sort and drop repeats. */
static void numbers_sort(numbers_t *c)
{
    qsort(c->v, c->n, sizeof(int64_t), cmp_i64);
    size_t u = 0;
    for (size_t j = 0; j < c->n; j++)
        if (u == 0 || c->v[u - 1] != c->v[j])
            c->v[u++] = c->v[j];
    c->n = u;
}

/* The shard numbers the levels map `key` to (levels of keys, or of
 * digests: a digest is looked up as a key whose first 20 bytes it is).
 * SFS_OK, SFS_EGONE (a level's file shrank), SFS_ENOMEM. */
static int level_candidates(const struct ll_level *levels, size_t nlevels, const uint8_t key[SFS_KEY_SIZE],
                            numbers_t *c)
{
    for (size_t i = 0; i < nlevels; i++) {
        const struct ll_level *lv = &levels[i];
        uint32_t stack[LOOKUP_STACK], *out = stack;
        size_t cap = LOOKUP_STACK, found = 0;
        int rc = g_gindex_lookup(lv->g, key, out, cap, &found);
        if (rc == SFS_OK && found > cap) { /* more than fit: ask again with room for all */
            cap = found;
            if (!(out = malloc(cap * sizeof(uint32_t))))
                return SFS_ENOMEM;
            rc = g_gindex_lookup(lv->g, key, out, cap, &found);
        }
        for (size_t j = 0; rc == SFS_OK && j < found && j < cap; j++) {
            int64_t number = out[j] < lv->nmap ? lv->map[out[j]] : -1;
            if (number >= 0 && numbers_add(c, number) < 0)
                rc = SFS_ENOMEM;
        }
        if (out != stack)
            free(out);
        if (rc != SFS_OK)
            return rc;
    }
    return SFS_OK;
}

/* The candidate shards of `key`: from the global index levels and the
 * per-shard filters of the shards no level holds. */
static int key_candidates(const ll_snapshot_t *snap, const uint8_t key[SFS_KEY_SIZE], numbers_t *c)
{
    int rc = level_candidates(snap->levels, snap->nlevels, key, c);
    if (rc != SFS_OK || !snap->nfilters)
        return rc;
    size_t count = snap->nfilters, found = 0;
    uint32_t stack[256], *out = count <= 256 ? stack : malloc(count * sizeof(uint32_t));
    if (!out)
        return SFS_ENOMEM;
    rc = g_candidates(snap->filters, count, key, out, &found);
    for (size_t j = 0; rc == SFS_OK && j < found && j < count; j++)
        if (numbers_add(c, snap->filter_numbers[out[j]]) < 0)
            rc = SFS_ENOMEM;
    if (out != stack)
        free(out);
    return rc;
}

/* Shard `number` (served) from the snapshot, else opened by its pool and
 * held by the answer f (letting go of a shard held for an earlier
 * candidate); NULL when neither has it. */
static sfs_shard_t *shard_of(ll_snapshot_t *snap, uint32_t number, int64_t *mtime, ll_found_t *f)
{
    sfs_shard_t *shard = ll_snapshot_shard(snap, number, mtime);
    if (shard || !snap->pool || number >= snap->nshards || snap->mtimes[number] < 0)
        return shard;
    int status;
    if (!(shard = ll_pool_get(snap->pool, number, &status)))
        return NULL;
    ll_found_release(f);
    f->held = shard;
    *mtime = snap->mtimes[number];
    return shard;
}

/* Ask the candidates in number order (by key, or through their hash index
 * of `kind` when kind >= 0) for `key`. The first that holds it answers;
 * one neither open here nor opened by the pool stops the search
 * (LL_NEED_OPEN: the handlers open it);
 * one that cannot be read is told only if none after it holds the key. */
static enum ll_resolution probe(ll_snapshot_t *snap, numbers_t *c, const uint8_t key[SFS_KEY_SIZE], int kind,
                                uint64_t start, uint64_t below, ll_found_t *f)
{
    enum ll_resolution res = LL_ABSENT;
    for (size_t j = 0; j < c->n; j++) {
        uint32_t number = (uint32_t)c->v[j];
        if (number < start)
            continue;
        if (number >= below)
            break;
        int64_t mtime;
        sfs_shard_t *shard = ll_snapshot_shard(snap, number, &mtime);
        if (!shard && kind < 0 && snap->pool && number < snap->nshards && snap->mtimes[number] >= 0) {
            /* not open here: its record answers, when the pool has one */
            int rc = ll_pool_find(snap->pool, number, key, 0, &f->slot, &f->offset, &f->size);
            if (rc != LL_POOL_NO_RECORD) {
                if (f->probed < LL_PROBED_MAX)
                    f->probed_numbers[f->probed] = number;
                f->probed++;
                if (rc != SFS_OK)
                    continue;
                f->number = number;
                f->shard = NULL;
                f->mtime_ns = snap->mtimes[number];
                f->ino = sfs_ll_object_ino(number, f->slot);
                return LL_FOUND;
            }
        }
        if (!shard)
            shard = shard_of(snap, number, &mtime, f);
        if (!shard) {
            if (number < snap->nshards && snap->mtimes[number] >= 0) {
                f->number = number; /* served, not open here */
                return LL_NEED_OPEN;
            }
            continue; /* not served (removed since the levels were built) */
        }
        int rc;
        if (kind >= 0) {
            const struct ll_hash_names *h = &snap->hashes[kind];
            const sfs_hashindex_t *hx = number < h->nindexes ? h->indexes[number] : NULL;
            if (!hx)
                continue; /* not indexed by that hash (yet) */
            rc = g_hash_find(shard, hx, key, &f->slot, &f->offset, &f->size);
        } else {
            rc = g_lookup_slot(shard, key, &f->slot, &f->offset, &f->size);
        }
        if (f->probed < LL_PROBED_MAX)
            f->probed_numbers[f->probed] = number;
        f->probed++;
        if (rc == SFS_OK) {
            f->number = number;
            f->shard = shard;
            f->mtime_ns = mtime;
            f->ino = sfs_ll_object_ino(number, f->slot);
            return LL_FOUND;
        }
        if (rc != SFS_ENOTFOUND && res != LL_FAILED) {
            res = LL_FAILED; /* the file shrank, or a corrupt slot: another */
            f->number = number; /* shard may hold the key */
            f->status = rc;
        }
    }
    return res;
}

/* The object of `key` (kind -1) or of a digest (kind 0: sha1, 1:
 * sha1_git; key[0..20)) among the shards numbered [start, below). */
static enum ll_resolution resolve(ll_snapshot_t *snap, const uint8_t key[SFS_KEY_SIZE], int kind, uint64_t start,
                                  uint64_t below, ll_found_t *f)
{
    numbers_t c;
    numbers_init(&c);
    int rc = kind >= 0 ? level_candidates(snap->hashes[kind].levels, snap->hashes[kind].nlevels, key, &c)
                       : key_candidates(snap, key, &c);
    for (size_t j = 0; rc == SFS_OK && kind >= 0 && j < snap->hashes[kind].nunlevelled; j++)
        if (numbers_add(&c, snap->hashes[kind].unlevelled[j]) < 0)
            rc = SFS_ENOMEM;
    enum ll_resolution res = LL_FAILED;
    f->status = rc;
    if (rc == SFS_OK) {
        numbers_sort(&c);
        res = probe(snap, &c, key, kind, start, below, f);
    }
    numbers_free(&c);
    return res;
}

enum ll_resolution ll_resolve_key(ll_snapshot_t *snap, const uint8_t key[SFS_KEY_SIZE], uint64_t start,
                                  uint64_t below, ll_found_t *f)
{
    memset(f, 0, sizeof(*f));
    return resolve(snap, key, -1, start, below, f);
}

enum ll_resolution ll_resolve_name(ll_snapshot_t *snap, uint64_t parent, const char *name, uint64_t start,
                                   ll_found_t *f)
{
    memset(f, 0, sizeof(*f));
    size_t len = strnlen(name, SFS_LL_NAME_SIZE + 1);
    uint8_t key[SFS_KEY_SIZE];
    int kind = -1;
    if (len == SFS_LL_NAME_SIZE) {
        uint64_t prefix = 0;
        int depth = sfs_ll_split_dir(&snap->layout, parent, &prefix);
        if (depth < 0)
            return LL_NOT_OBJECT; /* an object or a hash directory: the handlers */
        if (sfs_ll_object_name(&snap->layout, depth, prefix, name, key) == 0)
            return LL_ABSENT;
    } else {
        const uint64_t dirs[2] = {snap->hashes[0].dir_ino, snap->hashes[1].dir_ino};
        kind = sfs_ll_hash_name(dirs, parent, name, key);
        if (kind < 0)
            return LL_NOT_OBJECT;
        if (kind == 2)
            return LL_ABSENT; /* not 40 lowercase hex digits */
        f->by_hash = 1;
    }
    return resolve(snap, key, kind, start, UINT64_MAX, f);
}

enum ll_resolution ll_resolve_digest(ll_snapshot_t *snap, int kind, const uint8_t digest[SFS_LL_DIGEST_SIZE],
                                     uint64_t start, ll_found_t *f)
{
    memset(f, 0, sizeof(*f));
    f->by_hash = 1;
    if (kind < 0 || kind > 1)
        return LL_ABSENT;
    uint8_t key[SFS_KEY_SIZE] = {0};
    memcpy(key, digest, SFS_LL_DIGEST_SIZE);
    return resolve(snap, key, kind, start, UINT64_MAX, f);
}

enum ll_resolution ll_resolve_inode(ll_snapshot_t *snap, uint64_t ino, int how, ll_found_t *f)
{
    memset(f, 0, sizeof(*f));
    uint32_t number, slot;
    if (!sfs_ll_object_inode(ino, &number, &slot))
        return LL_NOT_OBJECT;
    f->number = number;
    f->slot = slot;
    f->ino = ino;
    int64_t state = number < snap->nshards ? snap->mtimes[number] : LL_UNKNOWN;
    if (state == LL_UNKNOWN || (state == LL_REMOVED && how != LL_INODE_READ))
        return LL_STALE;
    int64_t mtime;
    sfs_shard_t *shard = ll_snapshot_shard(snap, number, &mtime);
    if (!shard && state >= 0 && snap->pool) {
        /* not open here: its record answers, when the pool has one (a
         * read is then made by offset: ll_resolve_read) */
        int rc = ll_pool_find(snap->pool, number, NULL, slot, NULL, &f->offset, &f->size);
        if (rc != LL_POOL_NO_RECORD) {
            f->mtime_ns = state;
            f->pool = snap->pool;
            return rc == SFS_OK ? LL_FOUND : LL_ABSENT;
        }
    }
    if (!shard)
        shard = state >= 0 ? shard_of(snap, number, &mtime, f) : snap->shards[number];
    if (!shard)
        return LL_NEED_OPEN;
    f->shard = shard;
    f->mtime_ns = state;
    if (slot >= sfs_slot_count(shard))
        return LL_ABSENT;
    int rc = g_slot_object(shard, slot, &f->offset, &f->size);
    if (rc == SFS_OK)
        return LL_FOUND;
    if (rc == SFS_ENOTFOUND)
        return LL_ABSENT;
    f->status = rc;
    return LL_FAILED;
}

int ll_resolve_read(const ll_found_t *f, uint64_t offset, void *buf, size_t n)
{
    if (f->shard)
        return n ? g_read(f->shard, f->offset + offset, buf, n) : SFS_OK;
    /* answered from a record: read by offset, else (a size field that
     * differs: deleted since; the file changed) the shard's own slot */
    int rc = ll_pool_read(f->pool, f->number, f->offset, f->size, offset, buf, n);
    if (rc == SFS_OK || rc == SFS_ENOMEM)
        return rc;
    int status;
    sfs_shard_t *shard = ll_pool_get(f->pool, f->number, &status);
    if (!shard)
        return rc == SFS_ESTALE ? SFS_ESTALE : status; /* removed or replaced: its name is looked up again */
    uint64_t at, size;
    rc = g_slot_object(shard, f->slot, &at, &size);
    if (rc == SFS_OK && (at != f->offset || size != f->size))
        rc = SFS_ENOTFOUND; /* another object there now */
    if (rc == SFS_OK && n)
        rc = g_read(shard, at + offset, buf, n);
    sfs_close(shard);
    return rc;
}
