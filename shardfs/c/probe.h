/*
 * probe.h — validate many Read Shards at once, for a mount's start.
 *
 * A mount of 100,000 shards opens and validates each of them once, when it
 * joins the set; what the mount keeps of it (stat fields, header counts,
 * identity, key prefixes for the global index) is all it needs afterwards:
 * the shard is closed again. sfs_probe_many does that work for a batch of
 * paths on several threads, with no Python between the system calls
 * (shardfs.shardset.ShardSet.rescan calls it through probe_shards()).
 */
#ifndef SHARDFS_PROBE_H
#define SHARDFS_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SFS_IDENTITY_SIZE 32 /* bytes: a SHA-256 digest */
#define SFS_IDENTITY_PROBE 4096 /* bytes read at each end of the hash and index sections */

/* The identity of an open Read Shard (kind "file"), 32 bytes: SHA-256 over
 * "shardfs sidecar identity v1\0", the first SFS_HEADER_END bytes of the
 * file, the slot count (u64 little-endian), the first min(4096, hash_size)
 * bytes of the hash section, the first and last min(4096, index_size)
 * bytes of the index: the definition of shardfs.sidecar.identity, which
 * this computes byte for byte. Read with pread on the shard's descriptor
 * (never the mapping): at most ~12 KiB whatever the shard's size.
 * Returns SFS_OK; SFS_EINVAL for another kind (a MOSAIC file's identity
 * covers other bytes: shardfs.sidecar.identity); SFS_EIO with errno (EIO:
 * a short read, the file shrank); SFS_ENOMEM. */
int sfs_identity(const sfs_shard_t *shard, uint8_t out[SFS_IDENTITY_SIZE], sfs_error_t *err);

/* What sfs_probe_many learnt of one path. */
typedef struct sfs_probe {
    int status;                 /* SFS_OK, or why it was not probed (err.message) */
    sfs_error_t err;
    /* fstat of the descriptor the shard was validated through */
    uint64_t dev, ino, rdev, mode, size;
    int64_t mtime_sec, mtime_nsec, ctime_sec, ctime_nsec;
    uint64_t objects_count, slot_count, extent; /* header field; slots; bytes */
    uint8_t identity[SFS_IDENTITY_SIZE];
    /* The shard's key prefixes (sfs_shard_key_prefixes: sorted, distinct,
     * < 2^40), malloc'ed, when they were taken (prefixes != NULL): free()
     * them. */
    uint64_t *prefixes;
    size_t prefix_count;
} sfs_probe_t;

/* Open each of the n paths as a Read Shard (sfs_open: the whole
 * validation), fstat it, compute its identity and, while the slot counts
 * of the shards given prefixes so far total at most prefix_budget (in
 * order: a shard that does not fit is skipped, a later smaller one may
 * fit), its key prefixes; then close it. One shard is open at a time.
 * out[i] receives what was learnt of paths[i]; status != SFS_OK when it
 * could not be opened, is not a Read Shard (a MOSAIC file: SFS_EINVAL),
 * or shrank while it was read (SFS_EIO, EIO). On one thread: with two,
 * this machine's kernel made each shard cost twice as much (the mmap and
 * munmap of sfs_open serialize on the process's memory map). */
void sfs_probe_many(const char *const *paths, size_t n, sfs_probe_t *out, uint64_t prefix_budget);

#ifdef __cplusplus
}
#endif

#endif
