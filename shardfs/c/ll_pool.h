/*
 * ll_pool.h — the shards a process opens on demand for the resolver, in C:
 * a bounded pool, by shard number, of shards opened from their source
 * when a request needs one that the snapshot (ll_snapshot.h) does not
 * hold open, and closed, least recently used first (a clock), to stay
 * within the pool's bound. No Python and no process-wide lock on the way:
 * a present key in a shard not open costs an open, not a trip through the
 * Python handlers and a new snapshot of the whole set.
 *
 * What the pool knows of a shard number it is told once, under the GIL
 * (ll_pool_register, from shardfs.shardset.ShardSet as shards join the
 * set; ll_pool_forget as they leave): its source (a path), and what the
 * set validated when it joined — (device, inode) of the file, object
 * count and extent in bytes. An open made here is checked against them
 * and given up on any difference (a file replaced under its name, a shard
 * grown): the caller then asks the handlers, which answer ESTALE or EIO
 * and log why. A shard is validated once, when it joins the set; an open
 * here costs sfs_open (an open, an fstat, two small preads of the header
 * and the hash section's head, an mmap of the extent).
 *
 * A shard whose lookups its record answers (ll_pool_find) is read by
 * offset (ll_pool_read) through a descriptor the pool keeps instead: an
 * open and an fstat, no mapping and no perfect hash to parse.
 *
 * Bound: at most `bound` shards open in the pool (shards and descriptors), and at most `map_budget`
 * bytes mapped by them (the address space: a 100 GB shard maps 100 GB of
 * it). Each request holds a reference of its own on the shard it reads, so
 * a shard closed to make room stays open until its last request lets go
 * (at most one per request thread beyond the bound).
 *
 * Thread safety: ll_pool_get from any number of threads at once; register
 * and forget from one thread at a time (the GIL), at the same time as
 * ll_pool_get. Each entry is guarded by one of 64 mutexes, held for a
 * few loads and stores only (never across an open or a close). fork() is
 * safe at any time: the child (a mount's worker keeps its coordinator's
 * pool) makes every pool's locks anew (pthread_atfork), so it never
 * waits for a lock another thread of its parent held.
 */
#ifndef SHARDFS_LL_POOL_H
#define SHARDFS_LL_POOL_H

#include "lookup_pack.h"
#include "shard.h"

#include <stddef.h>
#include <stdint.h>

#pragma GCC visibility push(hidden)

typedef struct ll_pool ll_pool_t;

/* Largest shard number the pool holds + 1 (the global index's bound:
 * 24-bit shard positions). */
#define LL_POOL_MAX_NUMBER (1u << 24)

/* A new pool, empty, holding one reference; NULL when out of memory. */
ll_pool_t *ll_pool_new(size_t bound, uint64_t map_budget);

/* Another reference on `pool` (a snapshot holds one). */
ll_pool_t *ll_pool_ref(ll_pool_t *pool);

/* Let a reference go; the last closes every shard and frees the pool.
 * NULL is accepted. */
void ll_pool_unref(ll_pool_t *pool);

/* Change the bounds; shards past them are closed now. */
void ll_pool_set_bounds(ll_pool_t *pool, size_t bound, uint64_t map_budget);

/* Shard `number` (< LL_POOL_MAX_NUMBER) is opened from `source` (a path,
 * copied); has_ident: the file must be (dev, ino); its object count and
 * extent (bytes) must be `objects` and `extent`. `pack` (or NULL): its
 * lookups are answered from the record at byte `record` of that pack
 * (lookup_pack.h; checked by the caller: sfs_lookup_pack_attach), without
 * opening it (the pool takes a reference). Replaces what the number was
 * (closing a shard opened for it). 0, or -1 (out of memory, number out of
 * range: nothing changed). */
int ll_pool_register(ll_pool_t *pool, uint32_t number, const char *source, int has_ident, uint64_t dev,
                     uint64_t ino, uint64_t objects, uint64_t extent, sfs_lookup_pack_t *pack, uint64_t record);

/* What ll_pool_find answers for a shard whose lookups have no record. */
#define LL_POOL_NO_RECORD 1

/* Without opening shard `number`, from its record: the object of `key`
 * (32 bytes), or, key NULL, of `slot`. SFS_OK with its slot (key given),
 * the byte offset of its first byte in the shard and its size in bytes;
 * SFS_ENOTFOUND (absent, deleted, an empty slot); LL_POOL_NO_RECORD (no
 * record, or one that cannot be read: open the shard). No system call; a
 * stripe lock for a few loads. */
int ll_pool_find(ll_pool_t *pool, uint32_t number, const uint8_t *key, uint64_t slot, uint32_t *slot_out,
                 uint64_t *offset, uint64_t *size);

/* From shard `number`'s record: the object of `slot` as ll_pool_find
 * (SFS_OK, SFS_ENOTFOUND, LL_POOL_NO_RECORD), its key into key (SFS_OK
 * only), and the record's slot count into *slots (0 without a record). */
int ll_pool_slot(ll_pool_t *pool, uint32_t number, uint64_t slot, uint8_t key[SFS_KEY_SIZE], uint64_t *offset,
                 uint64_t *size, uint64_t *slots);

/* Shard `number` is no longer opened here; a shard open for it is closed
 * (once its requests in flight let go). */
void ll_pool_forget(ll_pool_t *pool, uint32_t number);

/* Shard `number`, open: a new reference (sfs_close lets it go), opened now
 * if it was not (closing others first to stay within the bounds). NULL when
 * the number is not registered, or its open failed or did not match what
 * was registered (*status: SFS_ESTALE for a mismatch, else sfs_open's). */
sfs_shard_t *ll_pool_get(ll_pool_t *pool, uint32_t number, int *status);

/* Bytes [at, at + n) of the object whose first byte is at byte
 * `data_offset` of shard `number` and whose size (its record's) is `size`,
 * into buf, read by offset through a descriptor the pool keeps for the
 * shard (opened now if it has none: an open and an fstat, no mapping),
 * its size field read too and checked against `size`. SFS_OK; SFS_ESTALE
 * (another file under its name, a size field that differs: deleted since);
 * SFS_EIO (errno: a read failed or the file ended first); SFS_ENOMEM. The
 * caller then asks the shard itself (ll_pool_get). */
int ll_pool_read(ll_pool_t *pool, uint32_t number, uint64_t data_offset, uint64_t size, uint64_t at, void *buf,
                 size_t n);

/* What the pool holds now: shards open, bytes they map, opens made since
 * it was made, and closes to make room. */
typedef struct {
    size_t open;
    uint64_t mapped;
    uint64_t opens;
    uint64_t evictions;
    size_t bound;
    uint64_t map_budget;
} ll_pool_stats_t;
void ll_pool_stats(ll_pool_t *pool, ll_pool_stats_t *out);

#pragma GCC visibility pop

#endif
