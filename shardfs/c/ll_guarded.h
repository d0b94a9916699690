/*
 * ll_guarded.h — the core's calls that read a mapping, as the request
 * path makes them (ll_resolve.c, ll_fast.c): each in a frame of its own
 * under SFS_GUARDED (guard.h: a file that shrank answers SFS_EGONE instead
 * of SIGBUS), so that no variable of the caller lives across the
 * sigsetjmp. Static: each file that includes it has its own copy.
 */
#ifndef SHARDFS_LL_GUARDED_H
#define SHARDFS_LL_GUARDED_H

#include "guard.h"
#include "gindex.h"
#include "hashindex.h"
#include "shard.h"
#include "sidecar.h"

static __attribute__((noinline, unused)) int g_gindex_lookup(const sfs_gindex_t *g, const uint8_t *key, uint32_t *out,
                                                     size_t cap, size_t *found)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, *found = sfs_gindex_lookup(g, key, out, cap));
    return rc;
}

static __attribute__((noinline, unused)) int g_candidates(sfs_sidecar_t *const *sc, size_t count, const uint8_t *key,
                                                  uint32_t *out, size_t *found)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, *found = sfs_sidecar_candidates(sc, count, key, out, count));
    return rc;
}

static __attribute__((noinline, unused)) int g_lookup_slot(const sfs_shard_t *shard, const uint8_t *key, uint32_t *slot,
                                                   uint64_t *off, uint64_t *size)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_slot(shard, key, slot, off, size));
    return rc;
}

static __attribute__((noinline, unused)) int g_slot_object(const sfs_shard_t *shard, uint64_t slot, uint64_t *off,
                                                   uint64_t *size)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_slot_object(shard, slot, NULL, off, size));
    return rc;
}

static __attribute__((noinline, unused)) int g_read(const sfs_shard_t *shard, uint64_t offset, void *dst, size_t n)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_read(shard, offset, dst, n));
    return rc;
}

static __attribute__((noinline, unused)) int g_hash_find(const sfs_shard_t *shard, const sfs_hashindex_t *hx,
                                                 const uint8_t *digest, uint32_t *slot, uint64_t *off, uint64_t *size)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_hash_find(shard, hx, digest, slot, off, size, NULL));
    return rc;
}

static __attribute__((noinline, unused)) int g_slot_key(const sfs_shard_t *shard, uint64_t slot, uint8_t *key)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_slot_get(shard, slot, key) == SFS_EMPTY_OFFSET ? SFS_ENOTFOUND : SFS_OK);
    return rc;
}

#endif
