/*
 * ll_ahead.h — pushes: an object's bytes written into the kernel's page
 * cache for its inode (FUSE_NOTIFY_STORE) before it is read, so that its
 * read sends no READ: at CPython's isatty ioctl (ll_fast_store) and ahead
 * of readers that follow a listing's order (ll_fast_push_ahead; how
 * streams are followed: docs/workers.md, "Reads in listing order are
 * pushed ahead").
 */
#ifndef SHARDFS_LL_AHEAD_H
#define SHARDFS_LL_AHEAD_H

#include "ll.h"
#include "ll_resolve.h"
#include "ll_snapshot.h"

#pragma GCC visibility push(hidden)

/* Objects pushed ahead of a read in listing order, and the most slots
 * between two reads that still count as in order (the reads of pushed
 * objects never reach the mount: the next read comes after them). */
#define AHEAD_SLOTS 32
#define AHEAD_GAP 16
/* Objects larger than this are not pushed ahead. */
#define AHEAD_MAX_SIZE (128 * 1024)
/* Streams of reads in order followed at once, per process. */
#define AHEAD_STREAMS 8
/* Sidecars kept open per process for streams in key order. */
#define AHEAD_SIDECARS 4

/* The streams a process follows, and the sidecars they read. */
struct ll_ahead {
    /* Streams of reads in listing order, under `lock`: several readers
     * (find | xargs -P4) read several parts of a listing at once. */
    pthread_mutex_t lock;
    struct ahead_stream {
        uint64_t used;     /* when last matched (a counter): the oldest is replaced */
        uint64_t born;     /* when it began (a counter): which stream this is */
        int streak;        /* reads in order in a row */
        int by_key;        /* key order (rsync, fan-out listings), else slot order */
        uint32_t shard;    /* shard number */
        uint64_t last;     /* slot, or top 64 key bits, of the last object read */
        uint64_t until;    /* last slot, or sidecar position, pushed ahead */
        uint64_t reach;    /* last slot, or top 64 key bits, pushed ahead */
    } ahead[AHEAD_STREAMS];
    uint64_t clock;
    /* Sidecars opened for key order (their slots sorted by key), under
     * `lock`; closed when a new snapshot is published (ll_ahead_forget). */
    struct ahead_sidecar {
        uint32_t shard;
        sfs_sidecar_t *sc;
        uint64_t used;
    } sidecars[AHEAD_SIDECARS];
};

void ll_ahead_init(struct ll_ahead *a);
/* Close what it holds (no request runs any more). */
void ll_ahead_destroy(struct ll_ahead *a);
/* Close the sidecars kept for key order: a new snapshot may give their
 * shard numbers to other shards. */
void ll_ahead_forget(struct ll_ahead *a);

/* Push bytes [0, n) of the object at byte `off` of `shard` (`size` bytes,
 * as its slot was resolved) into the kernel's page cache for inode `ino`:
 * 0, or -1 when not done (unreadable, or the kernel refused: e.g. an inode
 * it does not have). The slot is read again after the store: a takedown
 * landing in between gets the inode invalidated (ll_ahead.c). */
int ll_push(Session *s, sfs_shard_t *shard, fuse_ino_t ino, uint64_t off, uint64_t size, uint64_t n);

/* ll_push of the object `found` answered (ll_resolve.h): from its shard,
 * or, a record having answered (found.shard NULL), read by offset through
 * the pool and checked again against the record after the store. */
int ll_push_found(Session *s, const ll_found_t *found, fuse_ino_t ino, uint64_t n);

/* Store bytes [at, at + n) of that object, already read into `bytes`
 * (bytes[0] is the object's byte `at`), into the kernel's page cache for
 * `ino`, then read the slot again as ll_push does (in `shard`, or, shard
 * NULL, in its record through `pool`): 0, or -1 when the kernel refused. */
int ll_store(Session *s, sfs_shard_t *shard, ll_pool_t *pool, fuse_ino_t ino, uint64_t off, uint64_t size,
             const char *bytes, uint64_t at, uint64_t n);

/* After a read from the start of slot `slot` of shard `number` (answered;
 * `snap` held): when the reads of this process follow the shard's slot
 * order or its key order, push the next objects of that order (each of at
 * most AHEAD_MAX_SIZE bytes), counting them in stats[LL_STAT_PUSHED] and
 * stats[LL_STAT_PUSH_REFUSED]. */
void ll_ahead_push(struct ll_ahead *a, Session *s, ll_snapshot_t *snap, uint32_t number, uint32_t slot,
                   int64_t *stats);

#pragma GCC visibility pop

#endif
