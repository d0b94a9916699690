/*
 * ll_snapshot.h — what a request of a mount reads: one immutable,
 * reference-counted snapshot of the process's shard set.
 *
 * The Python handlers change the shard set (shards opened, evicted,
 * added, removed; filters and index levels built; the layout), under the
 * GIL. After each handler, the session builds a snapshot of what the C
 * request path needs (ll_snapshot_build, under the GIL): the open shards
 * by number, each with its mtime, the global index levels with a copy of
 * their maps, the per-shard filters, the hash indexes, the layout. Every
 * core object in it (sfs_shard_t, sfs_gindex_t, sfs_sidecar_t,
 * sfs_hashindex_t) is held by a reference of its own (sfs_ref & co.), so
 * the snapshot never changes and never reads a Python object.
 *
 * It is published by one atomic exchange of a pointer; a request takes a
 * reference on the current snapshot (ll_snapshot_acquire: one atomic add),
 * reads it without any lock, and lets it go (ll_snapshot_release): the
 * last request on a replaced snapshot frees it, and with it lets go of the
 * mappings and descriptors only it still held, on whatever thread that
 * request ran and whatever traffic follows.
 *
 * The mechanism is a split reference count (the counter of acquisitions
 * lives in the top 16 bits of the published word, beside the pointer; the
 * releases count down in the snapshot; the publisher adds the first to the
 * second when it replaces the snapshot): no lock, no thread registration
 * (libfuse starts and ends its threads itself, which liburcu's flavours
 * would each need told), no grace-period thread to survive fork(). A
 * request holds a snapshot for one request only, so a reference count per
 * snapshot costs two atomic operations per request.
 */
#ifndef SHARDFS_LL_SNAPSHOT_H
#define SHARDFS_LL_SNAPSHOT_H

#include "py_module.h"
#include "ll_names.h"
#include "ll_pool.h"

#pragma GCC visibility push(hidden)

/* A global index level: the level and its map from the level's shard
 * index to a shard number (negative: not served), copied. */
struct ll_level {
    sfs_gindex_t *g; /* a reference */
    int64_t *map;
    size_t nmap;
};

/* The names by one other hash (sha1 or sha1_git). */
struct ll_hash_names {
    uint64_t dir_ino;             /* MOUNT/sha1 or MOUNT/sha1_git; 0: not served */
    size_t nlevels;
    struct ll_level *levels;      /* levels over the digests */
    size_t nindexes;
    sfs_hashindex_t **indexes;    /* [nindexes] by shard number: a reference or NULL */
    size_t nunlevelled;
    int64_t *unlevelled;          /* indexed shards the levels do not hold */
};

/* Where a shard's slots are listed in key order (its sidecar), for pushes
 * ahead in key order; path NULL when it has none. */
struct ll_order {
    char *path;
    uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE];
};

/* What the mtime of a shard number that is not served says: removed (no
 * longer served; open here only for files opened before, which read it)
 * or unknown to the process (never known, or forgotten). */
#define LL_REMOVED (-2)
#define LL_UNKNOWN (-1)

typedef struct ll_snapshot {
    int64_t refs;                 /* releases count down from a bias (ll_snapshot.c) */
    int64_t applied;              /* the shard table sequence the handlers applied */
    int64_t dir_time_ns;          /* the directories' mtime */
    sfs_ll_layout_t layout;
    size_t nshards;               /* shard numbers 0..nshards-1 */
    sfs_shard_t **shards;         /* [nshards]: open here (a reference), or NULL */
    int64_t *mtimes;              /* [nshards]: mtime in ns of each served shard, or LL_REMOVED, LL_UNKNOWN */
    unsigned char *used;          /* [nshards]: probed by a request (atomic; see OpenShards.touched) */
    struct ll_order *orders;      /* [nshards] */
    size_t nlevels;
    struct ll_level *levels;
    size_t nfilters;              /* the active shards of the filter set */
    sfs_sidecar_t **filters;      /* [nfilters]: a reference, or NULL (no filter: always a candidate) */
    uint32_t *filter_numbers;     /* [nfilters]: the shard number of filters[j] */
    struct ll_hash_names hashes[2]; /* [0] sha1, [1] sha1_git */
    ll_pool_t *pool;              /* where a served shard not in `shards` is opened (a reference), or NULL */
} ll_snapshot_t;

/* Build a snapshot from `state`, a shardfs.shardset.SnapshotState (its
 * attributes: open_shards, filters, levels, maps, states, prefix_lengths,
 * dir_time_ns, applied, orders, hashes, removed_open, pool; documented
 * there).
 * Under the GIL. Returns it (not published), or NULL with an exception set
 * (AttributeError, TypeError, ValueError, MemoryError). */
ll_snapshot_t *ll_snapshot_build(PyObject *state);

/* Free a snapshot that was never published. NULL is accepted. */
void ll_snapshot_discard(ll_snapshot_t *snap);

/* The published snapshot of a process: a pointer and, in its top 16 bits,
 * the references taken since it was published. */
typedef struct {
    uint64_t word;
} ll_current_t;

/* A reference on the current snapshot (NULL: none published). Any thread,
 * no lock; let it go with ll_snapshot_release. */
ll_snapshot_t *ll_snapshot_acquire(ll_current_t *current);

/* Let a reference go; the last one of a replaced snapshot frees it. NULL
 * is accepted. */
void ll_snapshot_release(ll_snapshot_t *snap);

/* Publish `snap` (NULL: none) in place of the current one, which is freed
 * once its last request ends. One publisher at a time (the handlers' lock). */
void ll_snapshot_publish(ll_current_t *current, ll_snapshot_t *snap);

/* The shard serving number `number` in `snap` and its mtime; NULL when it
 * is not open here or not served. Marks it used (recency). */
static inline sfs_shard_t *ll_snapshot_shard(ll_snapshot_t *snap, uint64_t number, int64_t *mtime)
{
    if (number >= snap->nshards || !snap->shards[number] || snap->mtimes[number] < 0)
        return NULL;
    if (!__atomic_load_n(&snap->used[number], __ATOMIC_RELAXED))
        __atomic_store_n(&snap->used[number], 1, __ATOMIC_RELAXED);
    *mtime = snap->mtimes[number];
    return snap->shards[number];
}

#pragma GCC visibility pop

#endif
