/*
 * ll_resolve.h — the one resolver of a mount's objects: what a name
 * stands for and what an inode names, over one snapshot of the shard set
 * (ll_snapshot.h), in C, with no Python and no lock.
 *
 * A served shard the snapshot does not hold open is opened by the
 * snapshot's pool (ll_pool.h), in C; only when that open fails (the file
 * changed, or cannot be opened) does the resolver say LL_NEED_OPEN.
 *
 * Both front ends use it: the request path answering the kernel alone
 * (ll_fast.c, the GIL not held) and the Python handlers
 * (shardfs.fuse.handlers.ShardFS, through the Resolver type of py_resolve.c)
 * for the requests C leaves them. What it cannot do itself it says: a
 * candidate shard is not open in the process (LL_NEED_OPEN: the handlers open
 * it, within the bound on open shards, and ask again), or a shard cannot
 * be read (LL_FAILED: the handlers log it and answer EIO).
 *
 * Names (the layout's rules, ll_names.h): a 64-hex key in the root or in
 * the leaf of its prefix; in MOUNT/sha1 and MOUNT/sha1_git 40 hex digits;
 * in the root a content SWHID (swh:1:cnt:<sha1_git>). Every object found
 * by another hash is hashed again before it is answered (sfs_hash_find).
 * Inodes: (shard number + 1) << 32 | slot; the slot is read at every
 * resolution, so a takedown is seen at once.
 *
 * A candidate the snapshot does not hold open is asked through its lookup
 * record (lookup_pack.h), when the pool has one: names, keys and
 * attributes are then answered without the shard (found.shard NULL); only
 * a read opens it.
 */
#ifndef SHARDFS_LL_RESOLVE_H
#define SHARDFS_LL_RESOLVE_H

#include "ll_snapshot.h"

#pragma GCC visibility push(hidden)

/* Bytes of an object read ahead when it is looked up: the READ that
 * follows asks for up to 128 KiB of it. */
#define LL_PREFETCH_BYTES (128 * 1024)

enum ll_resolution {
    LL_FOUND,      /* an object: `found` says where */
    LL_ABSENT,     /* no such object (a lookup: a negative entry; an inode: ENOENT) */
    LL_STALE,      /* an inode of a shard no longer served (ESTALE: the kernel looks the name up again) */
    LL_NEED_OPEN,  /* shard found.number must be opened here first, then ask again */
    LL_FAILED,     /* shard found.number cannot be read (corrupt slot, file shrank: found.status) */
    LL_NOT_OBJECT, /* not an object's name or inode (directories, "..", database objects) */
};

typedef struct {
    uint64_t ino;         /* the object's inode */
    uint32_t number;      /* its shard number (LL_FOUND, LL_NEED_OPEN, LL_FAILED) */
    uint32_t slot;
    uint64_t offset;      /* byte offset of its first byte in the shard */
    uint64_t size;        /* bytes */
    int64_t mtime_ns;     /* its shard's mtime */
    int status;           /* LL_FAILED: the SFS_* status */
    sfs_shard_t *shard;   /* LL_FOUND: its shard, valid while the snapshot is held and
                           * until ll_found_release; NULL when a lookup record answered
                           * (names, keys, LL_INODE_ATTR: the shard is not open here) */
    sfs_shard_t *held;    /* a shard the snapshot's pool opened for this answer (a reference) */
    ll_pool_t *pool;      /* the snapshot's pool, when a record answered an inode (found.shard NULL): read
                           * through it (ll_resolve_read), while the snapshot is held */
    size_t probed;        /* shard indexes (or hash indexes) asked */
    int by_hash;          /* found by sha1 or sha1_git: probed counts hash index probes */
    /* the first LL_PROBED_MAX shard numbers asked (their use, for the
     * recency of the bounded set of open shards) */
    uint32_t probed_numbers[8];
} ll_found_t;
#define LL_PROBED_MAX 8

/* Let go of what an answer holds (a shard opened for it by the snapshot's
 * pool): after each ll_resolve_* call, before the snapshot is released. */
static inline void ll_found_release(ll_found_t *found)
{
    sfs_close(found->held);
    found->held = NULL;
}

/* Look `name` (NUL-terminated, as the kernel hands it) up in directory
 * `parent`. LL_FOUND (the object of the lowest-numbered shard holding it),
 * LL_ABSENT, LL_NEED_OPEN, LL_FAILED (when no other candidate holds the key),
 * LL_NOT_OBJECT (not a key, digest or SWHID name in a directory where
 * objects are found, or `parent` is no directory of the layout). Only
 * shards numbered `start` or more are asked: after opening the shard of an
 * LL_NEED_OPEN, ask again from its number (the ones before it were asked). */
enum ll_resolution ll_resolve_name(ll_snapshot_t *snap, uint64_t parent, const char *name, uint64_t start,
                                   ll_found_t *found);

/* The object of `key` (32 bytes) in the lowest-numbered shard holding it
 * among those numbered [start, below): LL_FOUND, LL_ABSENT, LL_NEED_OPEN,
 * LL_FAILED, as ll_resolve_name (the Python API's ShardSet.find, and the
 * duplicate checks of listings). */
enum ll_resolution ll_resolve_key(ll_snapshot_t *snap, const uint8_t key[SFS_KEY_SIZE], uint64_t start,
                                  uint64_t below, ll_found_t *found);

/* The object whose digest of `kind` (0: sha1, 1: sha1_git) is `digest`
 * (20 bytes), through the hash indexes of the shards numbered `start` or
 * more (each candidate hashed again before it is answered): as
 * ll_resolve_name (the Python API's HashSet.find). LL_ABSENT when the
 * snapshot has no names by that hash. */
enum ll_resolution ll_resolve_digest(ll_snapshot_t *snap, int kind, const uint8_t digest[SFS_LL_DIGEST_SIZE],
                                     uint64_t start, ll_found_t *found);

/* What ll_resolve_inode is asked for. */
enum {
    LL_INODE_ATTR = 0,  /* its size and mtime (and bytes: ll_resolve_read), its shard served; from the shard's
                         * lookup record when it is not open here (found.shard NULL) */
    LL_INODE_READ = 1,  /* its bytes (ll_resolve_read: by offset when a record answered, found.shard NULL);
                         * a removed shard still open here is read, for files opened before its removal */
};

/* The object inode `ino` names, its slot read now, for `how` (LL_INODE_*).
 * LL_FOUND, LL_ABSENT (an empty or deleted slot, past the index), LL_STALE
 * (its shard is not served: removed, replaced or never known), LL_NEED_OPEN,
 * LL_FAILED, LL_NOT_OBJECT (a directory or database inode). */
enum ll_resolution ll_resolve_inode(ll_snapshot_t *snap, uint64_t ino, int how, ll_found_t *found);

/* Bytes [offset, offset + n) of the object `found` (LL_FOUND), into buf:
 * SFS_OK, or the status of sfs_read (SFS_EIO, SFS_EGONE: the file shrank);
 * for an object a record answered, read by offset through the pool
 * (ll_pool_read), else from its shard opened by the pool, whose own slot
 * then decides: SFS_ENOTFOUND when it no longer holds that object (deleted
 * since), SFS_ESTALE when the file is gone from its name or is another. */
int ll_resolve_read(const ll_found_t *found, uint64_t offset, void *buf, size_t n);

#pragma GCC visibility pop

#endif
