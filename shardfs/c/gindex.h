/*
 * gindex.h — global index levels: one file that maps a key to the shards
 * that may hold it, over all the shards of a mount, at a cost that does not
 * depend on the number of shards (one directory read and a binary search in
 * a ~512-byte bucket, instead of one sidecar probe per shard).
 *
 * A *level* is one immutable file covering a set of shards. Levels are
 * written whole (sfs_gindex_write, from one sorted run of key prefixes per
 * shard) or by merging open levels (sfs_gindex_merge, which can also drop
 * shards); they are never modified in place.
 *
 * Format (all integers little-endian, fixed width):
 *
 *   header, 64 bytes:
 *     bytes  0..8    magic "SFSGIDX1"
 *     bytes  8..12   u32 version = 2
 *     bytes 12..16   u32 bucket_bits b, 0..32
 *     bytes 16..24   u64 count n: entries
 *     bytes 24..32   u64 shard_count s, at most 2^24
 *     bytes 32..64   reserved: written as zero, ignored when read
 *   shard table    s x 32 bytes: the identity of each shard (opaque here;
 *                  shardfs/sidecar.py's identity() of the shard). An entry's
 *                  shard index j names the j-th identity.
 *   directory      u64 dir[2^b + 1]: dir[k] = index of the first entry whose
 *                  key's top b bits are k (its *bucket*); dir[2^b] = n
 *   entries        n entries of w = ceil((64 - b) / 8) bytes each. An entry's
 *                  value is v = (top 40 bits of the key, read big-endian) << 24
 *                  | shard index (24 bits); the entries are sorted ascending
 *                  by v (by key prefix, ties by shard index), no duplicates.
 *                  The top b bits of v are its bucket, which the directory
 *                  gives: an entry keeps only the low 64 - b bits of v,
 *                  little-endian in w bytes (unused high bits zero).
 *   padding        8 zero bytes (a reader loads 8 bytes at any entry)
 *
 * b is the smallest value with 2^b >= n / 64 (buckets of ~64 entries, 512
 * bytes or less: one page read when cold), at most 32 (0 for n <= 64).
 * File size: exactly 64 + 32 s + 8 (2^b + 1) + w n + 8 bytes. Per entry:
 * w + 8 / 64 bytes: 7.13 from 16,384 entries (b >= 8), 6.13 from 4.2
 * million (b >= 16), 5.13 from 1.07 billion (b >= 24).
 * (Version 1 kept 8 bytes per entry: levels of version 1 are refused at
 * open and built again.)
 *
 * A key's *prefix* is its top 40 bits (bytes 0..5 read big-endian). A
 * lookup lists the shards whose entries hold the key's prefix: never a false
 * negative for a key that was live in a shard when its run was made; a false
 * positive (a shard holding another key with the same prefix) with
 * probability about (keys of that shard) / 2^40 per shard and absent key,
 * about n / 2^40 in all. Callers check the key in the shard itself (a
 * deleted key is also still listed: levels are not updated by sfs_delete).
 *
 * Errors: the functions that can fail return SFS_OK (0) or a negative
 * status of shard.h and fill sfs_error_t with a one-line message naming the
 * file. SFS_ECORRUPT: a file whose structure is wrong (see sfs_gindex_open,
 * sfs_gindex_merge); SFS_EINVAL: bad arguments (an unsorted run, a prefix >=
 * 2^40, more than 2^24 shards); SFS_EIO with errno: a system call failed;
 * SFS_ENOMEM.
 *
 * Thread safety: an open level is immutable; any number of threads may look
 * keys up in it at once, and merge it into another file meanwhile. The file
 * is mmap'ed: truncating it in place (instead of replacing it by rename, as
 * the writers do) while it is open would raise SIGBUS in a lookup (merges
 * read with pread and fail with SFS_EIO instead).
 */
#ifndef SHARDFS_GINDEX_H
#define SHARDFS_GINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SFS_GINDEX_MAGIC "SFSGIDX1"
#define SFS_GINDEX_MAGIC_SIZE 8          /* bytes, no NUL */
#define SFS_GINDEX_VERSION 2
#define SFS_GINDEX_HEADER_SIZE 64        /* bytes */
#define SFS_GINDEX_IDENTITY_SIZE 32      /* bytes per shard-table entry */
#define SFS_GINDEX_PREFIX_BITS 40        /* bits of the key kept per entry */
#define SFS_GINDEX_SHARD_BITS 24         /* bits of the shard index per entry */
#define SFS_GINDEX_MAX_SHARDS (UINT64_C(1) << SFS_GINDEX_SHARD_BITS) /* s <= 2^24 */
#define SFS_GINDEX_MAX_BITS 32           /* largest bucket_bits */
#define SFS_GINDEX_BUCKET 64             /* target entries per bucket */
#define SFS_GINDEX_PAD 8                 /* zero bytes after the entries */

typedef struct sfs_gindex sfs_gindex_t;

/* The prefix of a key: its top 40 bits (bytes 0..5, big-endian), < 2^40. */
uint64_t sfs_gindex_prefix(const uint8_t key[SFS_KEY_SIZE]);

/* bucket_bits for n entries: the smallest b with 2^b >= n / 64, at most 32. */
unsigned sfs_gindex_bits_for(uint64_t n);

/* Bytes per entry of a level of bucket_bits b: ceil((64 - b) / 8). */
unsigned sfs_gindex_entry_size(unsigned b);

/* Size in bytes of a level of s shards, bucket_bits b and n entries. */
uint64_t sfs_gindex_file_size(uint64_t s, unsigned b, uint64_t n);

/* The run of an open shard: the prefixes of its live keys (slots whose
 * offset is not SFS_EMPTY_OFFSET), sorted ascending, without duplicates
 * (two keys of a shard share their top 40 bits about n^2 / 2^41 times).
 * *out receives a malloc'ed array of *n values (free() it; a 1-element
 * allocation when *n = 0). The index is read once with pread through a
 * descriptor of its own (the shard's file reopened through
 * /proc/self/fd/<sfs_fd(shard)>, its 88-byte header checked against the
 * open shard's), never through the mapping, so a shard truncated meanwhile
 * gives SFS_EIO, not SIGBUS. Memory: 16 bytes per slot at most (the values
 * and a radix sort's buffer), then 8 per distinct prefix.
 * Returns SFS_OK; SFS_EIO with errno in err (ESTALE: the file no longer
 * holds the open shard; EIO: it shrank); SFS_ENOMEM. */
int sfs_shard_key_prefixes(const sfs_shard_t *shard, uint64_t **out, size_t *n,
                           sfs_error_t *err);

/* Write a level at `path` from nruns runs: runs[i] holds run_len[i] key
 * prefixes of shard i (values < 2^40, sorted ascending; repeated values are
 * allowed and kept once), identities[i] its identity. The shard table is
 * identities[0..nruns) as given (shard index i = run i; equal identities
 * are not merged here, sfs_gindex_merge does that). runs[i] may be NULL
 * when run_len[i] = 0.
 * The runs are merged k-way (a binary heap of nruns cursors) in two passes:
 * one to count the entries (hence b), one to write them. Memory: O(nruns)
 * plus two 1 MiB write buffers, whatever the number of entries: directory
 * and entries are streamed to their places in the file. The output is an
 * unnamed O_TMPFILE (mode 0600) in the directory of `path`, fdatasync'ed,
 * then linked onto `path` (or linked beside it and renamed over it), and
 * the directory fsync'ed (a mkostemp `.<basename>.tmp-XXXXXX` where
 * O_TMPFILE is unsupported). On error nothing is left at `path` or beside it.
 * Returns SFS_OK; SFS_EINVAL (nruns > 2^24, a prefix >= 2^40, a run not
 * sorted: the message names the run and position); SFS_EIO with errno
 * (ENOENT, EACCES, ENOSPC, EROFS...); SFS_ENOMEM. */
int sfs_gindex_write(const char *path, const uint64_t *const *runs, const uint64_t *run_len,
                     const uint8_t (*identities)[SFS_GINDEX_IDENTITY_SIZE], size_t nruns,
                     sfs_error_t *err);

/* Merge the nlevels open levels into a new level at `path`, keeping only
 * the entries whose shard is kept: shard j of level i is kept when
 * keep_masks is NULL, keep_masks[i] is NULL, or keep_masks[i][j] != 0
 * (keep_masks[i] has sfs_gindex_shard_count(levels[i]) bytes).
 * The new shard table holds the kept identities, deduplicated by identity
 * (the same shard in two levels gets one index), in order of first
 * appearance (level 0's kept shards in order, then level 1's new ones...);
 * entries are remapped to it, sorted and deduplicated. A shard whose
 * identity is kept through one level and dropped through another is kept
 * with the entries of the level that keeps it only.
 * The levels are read with pread through their own descriptors (never their
 * mappings), in 64 KiB chunks, merged k-way in two passes (count, write);
 * their entries are checked on the way: not in ascending order, or a shard
 * index >= their shard count, fails with SFS_ECORRUPT (their directories
 * are not read). Memory: O(total shards of the levels) (identities, remap
 * tables) plus 64 KiB per level and two 1 MiB write buffers. Published as
 * sfs_gindex_write does; `path` may name one of the levels (it is replaced,
 * the open level keeps its old file). nlevels = 0 writes an empty level.
 * Returns SFS_OK; SFS_EINVAL (more than 2^24 distinct kept identities);
 * SFS_ECORRUPT (a level's entries, as above); SFS_EIO with errno (a level
 * shorter than its header says: EIO; writing: ENOSPC...); SFS_ENOMEM. */
int sfs_gindex_merge(const char *path, sfs_gindex_t *const *levels, size_t nlevels,
                     const uint8_t *const *keep_masks, sfs_error_t *err);

/* Open the level at `path`: mmap'ed read-only (MADV_RANDOM); the descriptor
 * stays open (O_CLOEXEC) for sfs_gindex_merge's reads until close. Only the
 * 64-byte header is read here (opening is O(1): directory and entries are
 * not validated, every lookup clamps instead).
 * Checks: a regular file of at least 64 bytes, magic, version = 1,
 * bucket_bits <= 32, shard_count <= 2^24, the file size equal to
 * sfs_gindex_file_size(s, b, n) (else SFS_ECORRUPT). SFS_EIO (errno set,
 * ENOENT when missing) when it cannot be opened, read or mapped;
 * SFS_ENOMEM. */
int sfs_gindex_open(const char *path, sfs_gindex_t **out, sfs_error_t *err);

/* Let go: unmapped, closed and freed when no other holder
 * (sfs_gindex_ref) remains. NULL is accepted. */
void sfs_gindex_close(sfs_gindex_t *g);
/* One more holder, let go by its own sfs_gindex_close(). Thread-safe.
 * Returns `g`. */
sfs_gindex_t *sfs_gindex_ref(sfs_gindex_t *g);

uint64_t sfs_gindex_count(const sfs_gindex_t *g);       /* entries n */
uint64_t sfs_gindex_shard_count(const sfs_gindex_t *g); /* shard table entries s */
unsigned sfs_gindex_bucket_bits(const sfs_gindex_t *g); /* b */
const char *sfs_gindex_path(const sfs_gindex_t *g);     /* as given to open */

/* The 32-byte identity of shard index j (a pointer into the mapping, valid
 * until sfs_gindex_close), or NULL when j >= shard_count. */
const uint8_t *sfs_gindex_identity(const sfs_gindex_t *g, uint64_t j);

/* The shard indices whose entries hold the key's prefix (its top 40 bits),
 * in increasing order (in file order: a damaged file may give any order or
 * repeats). Writes the first max of them to out and returns how many there
 * are in all (more than max means out was too small: call again with a
 * larger one). Only indices < shard_count are listed: a damaged entry with
 * a larger one is skipped. The bucket's bounds are clamped to [0, n]
 * whatever the directory holds, so a damaged file gives wrong answers, never
 * a read outside the mapping. No allocation, no lock: thread-safe. */
size_t sfs_gindex_lookup(const sfs_gindex_t *g, const uint8_t key[SFS_KEY_SIZE], uint32_t *out,
                         size_t max);

#ifdef __cplusplus
}
#endif
#endif
