/*
 * hashindex.h — a shard's objects found by another hash than their key:
 * SHA-1 of the bytes ("sha1") or git's blob hash ("sha1_git": SHA-1 of
 * "blob <size in decimal>\0" followed by the bytes, the hash a content
 * SWHID names: swh:1:cnt:<sha1_git hex>). Source of these definitions:
 * Software Heritage's swh.model (hashutil, MultiHash) and git's object
 * format; restated in docs/hashes.md.
 *
 * A hash index is a per-shard file that maps a 20-byte digest to the slots
 * that may hold it. It is a cache like a sidecar: written whole (to a
 * temporary file, fdatasync'ed, renamed: a crash leaves the old file or the
 * new one), checked against the shard's identity and slot count at open,
 * and never trusted for an answer: every slot it gives is a candidate whose
 * object is hashed again before it is served under that digest
 * (sfs_hash_find), so a damaged file or a wrong row of an imported mapping
 * can only make an object not found, never a wrong object found.
 *
 * Format (all integers little-endian, fixed width):
 *
 *   header, 96 bytes:
 *     bytes  0..8    magic "SFSHASH1"
 *     bytes  8..12   u32 version = 1
 *     bytes 12..16   u32 kind: 1 sha1, 2 sha1_git
 *     bytes 16..24   u64 count n: entries
 *     bytes 24..32   u64 slot_count: slots of the shard's index
 *     bytes 32..36   u32 bucket_bits b
 *     bytes 36..40   u32 slot_bits S: the smallest S >= 1 with 2^S >= slot_count
 *     bytes 40..64   reserved, zero
 *     bytes 64..96   identity: 32 bytes chosen by the caller (the shard's
 *                    identity, shardfs/sidecar.py)
 *   directory   u32 dir[2^b + 1]: dir[k] = index of the first entry whose
 *               digest's top b bits are k; dir[2^b] = n
 *   entries     u64 e[n]: bits [b, b + 64 - S) of the digest (read as a
 *               big-endian bit string) in the top 64 - S bits, the slot in
 *               the low S bits; sorted ascending within each bucket.
 *
 * b = max(S - 24, the smallest b with 2^b >= n / 512), at most 32: so an
 * entry keeps at least 40 bits of its digest with its bucket (the prefix a
 * global index level needs) and a bucket holds ~512 entries. File size:
 * exactly 96 + 4 (2^b + 1) + 8 n bytes: 8 bytes per object and 4 per
 * bucket.
 *
 * Errors: SFS_OK or a negative status of shard.h with a one-line message
 * naming the file: SFS_ECORRUPT (structure), SFS_ESTALE (another shard's
 * file), SFS_EIO with errno, SFS_ENOMEM, SFS_EINVAL (bad arguments).
 * Thread safety: an open index is immutable; any number of threads may
 * look digests up at once. The file is mmap'ed (replace it by rename only).
 */
#ifndef SHARDFS_HASHINDEX_H
#define SHARDFS_HASHINDEX_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#define SFS_HX_MAGIC "SFSHASH1"
#define SFS_HX_VERSION 1
#define SFS_HX_HEADER_SIZE 96
#define SFS_HX_IDENTITY_SIZE 32
#define SFS_HX_DIGEST_SIZE 20 /* bytes of a SHA-1 digest */

enum sfs_hash_kind { SFS_HASH_SHA1 = 1, SFS_HASH_SHA1_GIT = 2 };

typedef struct sfs_hashindex sfs_hashindex_t;

/* Hash every live object of `shard` once (in the order of their bytes in
 * the file, read with pread through a descriptor of its own: a shard that
 * shrinks gives SFS_EIO, not SIGBUS) and write the index of each kind whose
 * path is not NULL: paths[0] for sha1, paths[1] for sha1_git. One thread
 * per CPU (at most 8), each hashing a contiguous part of the objects
 * section (about as many bytes each) as its own sequential stream of 4 MiB
 * reads. progress, if not NULL, is called from the calling thread after
 * about every 64 MiB with the object bytes hashed so far by all (of
 * objects_size in all); a non-zero return stops the build (SFS_EINVAL,
 * "interrupted") with nothing written. Memory: 16 bytes per live slot,
 * 16 per object and kind, 4 MiB per thread. */
int sfs_hashindex_build(const sfs_shard_t *shard, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                        const char *const paths[2], int (*progress)(void *ctx, uint64_t done),
                        void *ctx, sfs_error_t *err);

/* Write the index of `kind` at `path` from n (digest, slot) pairs: digests
 * holds 20 n bytes, slots n values < slot_count (SFS_EINVAL otherwise).
 * Pairs need not be sorted; repeated pairs are kept once. As sfs_hashindex_build
 * writes: nothing is left at `path` on error. */
int sfs_hashindex_write(const char *path, int kind, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                        uint64_t slot_count, const uint8_t *digests, const uint32_t *slots, size_t n,
                        sfs_error_t *err);

/* Open the index at `path` for the shard of `identity` and `slot_count`:
 * mmap'ed; the header and the file's size are checked (SFS_ECORRUPT), the
 * identity and slot count too (SFS_ESTALE). The directory is not read here:
 * every lookup clamps it. */
int sfs_hashindex_open(const char *path, const uint8_t identity[SFS_HX_IDENTITY_SIZE],
                       uint64_t slot_count, sfs_hashindex_t **out, sfs_error_t *err);
/* Let go: unmapped and freed when no other holder (sfs_hashindex_ref)
 * remains. NULL is accepted. */
void sfs_hashindex_close(sfs_hashindex_t *hx);
/* One more holder, let go by its own sfs_hashindex_close(). Thread-safe.
 * Returns `hx`. */
sfs_hashindex_t *sfs_hashindex_ref(sfs_hashindex_t *hx);
int sfs_hashindex_kind(const sfs_hashindex_t *hx);
uint64_t sfs_hashindex_count(const sfs_hashindex_t *hx);

/* Candidate slots of `digest`: the entries whose digest bits match (about
 * b + 64 - S >= 40 bits), in file order, the first max of them into out;
 * returns how many there are in all. Never reads outside the mapping,
 * whatever the file holds. */
size_t sfs_hashindex_lookup(const sfs_hashindex_t *hx, const uint8_t digest[SFS_HX_DIGEST_SIZE],
                            uint32_t *out, size_t max);

/* The top 40 bits of every entry's digest, sorted, distinct, into a
 * malloc'ed array (*out, *n; free() it): a run for a global index level
 * (gindex.h) over digests of this kind. SFS_ENOMEM. */
int sfs_hashindex_prefixes(const sfs_hashindex_t *hx, uint64_t **out, size_t *n, sfs_error_t *err);

/* The object of `shard` whose digest of the index's kind is `digest`:
 * candidates from the index, each hashed again until one
 * matches. SFS_OK with its slot, data offset (first byte) and size in
 * bytes; SFS_ENOTFOUND when none does; SFS_EIO... when an object cannot be
 * read. Cost: one lookup (a binary search in a bucket of ~512 entries) and
 * one read and SHA-1 of each candidate's bytes (almost always one). */
int sfs_hash_find(const sfs_shard_t *shard, const sfs_hashindex_t *hx,
                  const uint8_t digest[SFS_HX_DIGEST_SIZE], uint32_t *slot, uint64_t *data_offset,
                  uint64_t *size, sfs_error_t *err);

#endif
