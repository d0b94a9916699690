/*
 * sidecar.h — per-shard sidecar files: a key filter and the live slots
 * sorted by key, so that a tree of thousands of shards can answer "which
 * shards may hold this key?" and "which keys start with this prefix?"
 * without touching every shard's index.
 *
 * A sidecar is a cache: built once from a shard's index, it is thrown away
 * and rebuilt whenever it does not match the shard (see sfs_sidecar_open).
 *
 * Format (all integers little-endian, fixed width; restated in
 * docs/format.md, section "Sidecar files"):
 *
 *   header, 64 bytes:
 *     bytes  0..8    magic "SFSSIDE1"
 *     bytes  8..12   u32 version = 1
 *     bytes 12..16   u32 prefix_bits p, 0..32
 *     bytes 16..24   u64 count n: live keys of the shard = entries
 *     bytes 24..32   u64 slot_count: slots of the shard's index
 *     bytes 32..64   identity: 32 bytes chosen by the caller (shardfs/sidecar.py
 *                    hashes the shard's header, hash and index ends)
 *   directory     u32 dir[2^p + 1]: dir[b] = position of the first entry
 *                 whose key's top p bits are b; dir[2^p] = n
 *   fingerprints  u32 fp[n]: bits [p, p+32) of each entry's key (the key
 *                 read as a big-endian bit string)
 *   slots         u32 slot[n]: each entry's slot in the shard's index
 *
 * Entries are sorted by the top 64 bits of their key (big-endian), ties by
 * slot. p is the smallest value with 2^p >= n/8 (buckets of ~8 entries; 0
 * for n <= 8). File size: exactly 64 + 4 * (2^p + 1) + 8 * n bytes.
 *
 * Filter: a key "may be contained" when its bucket holds its fingerprint:
 * never a false negative for a key live when the sidecar was built; a false
 * positive with probability about 8 * 2^-32 per sidecar and absent key.
 *
 * Deletes: the sidecar is not updated by sfs_delete(). After a delete its
 * answers are a superset (the deleted key may still be "contained" and its
 * slot still listed by a range), so every slot read from a sidecar must be
 * checked against the shard (sfs_slot_get() == SFS_EMPTY_OFFSET: skip it).
 *
 * Errors: the functions that can fail return SFS_OK (0) or a negative status
 * of shard.h, plus SFS_ESTALE below, and fill sfs_error_t with a one-line
 * message naming the file. A corrupt sidecar that passes sfs_sidecar_open
 * (its size and header are right but its directory or fingerprints are not)
 * can only give wrong answers: every query clamps the directory's values to
 * [0, n] and never reads outside the mapping.
 *
 * Thread safety: an open sidecar is immutable; any number of threads may
 * query it at once. The file is mmap'ed: truncating it in place (instead of
 * replacing it by rename, as sfs_sidecar_build does) while it is open would
 * raise SIGBUS in a reader.
 */
#ifndef SHARDFS_SIDECAR_H
#define SHARDFS_SIDECAR_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SFS_SIDECAR_MAGIC "SFSSIDE1"
#define SFS_SIDECAR_MAGIC_SIZE 8     /* bytes, no NUL */
#define SFS_SIDECAR_VERSION 1
#define SFS_SIDECAR_HEADER_SIZE 64   /* bytes */
#define SFS_SIDECAR_IDENTITY_SIZE 32 /* bytes */
#define SFS_SIDECAR_MAX_BITS 32      /* largest prefix_bits */
#define SFS_SIDECAR_BUCKET 8         /* target entries per bucket */

/* Errors: SFS_ESTALE (shard.h) when the sidecar was built for another
 * shard (a different identity or slot count); SFS_ECORRUPT when its own
 * structure is wrong (magic, version, prefix_bits > 32, count > slot_count,
 * file size). Both mean: this file cannot be used, rebuild it. */

typedef struct sfs_sidecar sfs_sidecar_t;

/* prefix_bits for n entries: the smallest p with 2^p >= n / 8, at most 32. */
unsigned sfs_sidecar_bits_for(uint64_t n);

/* Size in bytes of the sidecar file for prefix_bits p and n entries. */
uint64_t sfs_sidecar_file_size(unsigned p, uint64_t n);

/* Build the sidecar of `shard` at `path`, stamped with `identity`.
 * Reads the index twice with pread through a descriptor of its own (the
 * shard's file opened again through /proc/self/fd/<sfs_fd(shard)>, so the
 * very file that was opened even if its path was renamed over or removed
 * since; the path where /proc is missing; its 88-byte header checked
 * against the open shard's; never through the mapping, so a shrinking
 * shard cannot raise SIGBUS): pass 1 counts the live slots per bucket (a slot whose offset is
 * SFS_EMPTY_OFFSET, empty or deleted, is skipped) and makes the directory,
 * pass 2 places each entry in its bucket; buckets are then sorted by the top
 * 64 bits of the key, ties by slot. If the two passes disagree (a delete ran
 * meanwhile) the build starts again, at most 3 times. The output is an
 * unnamed O_TMPFILE (mode 0600) in the directory of `path`, fdatasync'ed,
 * then linked onto `path` (or linked beside it and renamed over it), and the
 * directory fsync'ed (a mkostemp `.<basename>.tmp-XXXXXX` where O_TMPFILE is
 * unsupported). Memory: about 8 bytes per live key plus the directory (0.5
 * to 1 byte per key) plus 1 MiB, freed on return.
 * Returns SFS_OK; SFS_EIO with errno in err: a missing or unwritable
 * directory, ENOSPC, EROFS...; ESTALE when the file no longer holds the
 * open shard (its header was overwritten), EIO when it shrank, EAGAIN when
 * the index kept changing; or
 * SFS_ENOMEM. On error nothing is left at `path` or beside it. */
int sfs_sidecar_build(const sfs_shard_t *shard, const char *path,
                      const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE], sfs_error_t *err);

/* Open the sidecar at `path` for the shard with `identity` and `slot_count`
 * slots. The file is mmap'ed read-only (MADV_RANDOM) and its descriptor
 * closed; only the 64-byte header is read here (opening is O(1): the
 * directory is not validated, every query clamps instead).
 * Checks, in order: size >= 64, magic, version = 1, prefix_bits <= 32 and
 * count <= the header's slot_count (else SFS_ECORRUPT); identity and
 * slot_count equal to the arguments (else SFS_ESTALE); the file size equal
 * to sfs_sidecar_file_size(p, n) (else SFS_ECORRUPT). SFS_EIO (errno set,
 * ENOENT when missing) when it cannot be opened or mapped, SFS_ENOMEM. */
int sfs_sidecar_open(const char *path, const uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE],
                     uint64_t slot_count, sfs_sidecar_t **out, sfs_error_t *err);

/* Let go: unmapped and freed when no other holder (sfs_sidecar_ref)
 * remains. NULL is accepted. */
void sfs_sidecar_close(sfs_sidecar_t *sc);
/* One more holder, let go by its own sfs_sidecar_close(). Thread-safe.
 * Returns `sc`. */
sfs_sidecar_t *sfs_sidecar_ref(sfs_sidecar_t *sc);

uint64_t sfs_sidecar_count(const sfs_sidecar_t *sc);       /* entries n (live keys at build) */
unsigned sfs_sidecar_prefix_bits(const sfs_sidecar_t *sc); /* p */
uint64_t sfs_sidecar_slot_count(const sfs_sidecar_t *sc);  /* the shard's slots */

/* 1 when the key's bucket holds the key's fingerprint (the key may be in the
 * shard), 0 when it is certainly not among the keys the sidecar was built
 * from. */
int sfs_sidecar_may_contain(const sfs_sidecar_t *sc, const uint8_t key[SFS_KEY_SIZE]);

/* The indices i in [0, count) for which sidecars[i] is NULL (no filter:
 * always a candidate) or may contain `key`, in increasing order. Writes the
 * first max_out of them to out and returns how many there are in all (more
 * than max_out means out was too small). The array is walked in chunks, in
 * passes that prefetch every directory entry, then every bucket, before
 * comparing, so that the cache misses of all sidecars overlap. */
size_t sfs_sidecar_candidates(sfs_sidecar_t *const *sidecars, size_t count,
                              const uint8_t key[SFS_KEY_SIZE], uint32_t *out, size_t max_out);

/* Positions [*begin, *end) of the entries whose key starts with the first
 * `prefix_bits` bits of `prefix` (a big-endian bit string of at least
 * ceil(prefix_bits / 8) bytes; bits past prefix_bits are ignored).
 * prefix_bits <= p uses the directory only; up to p + 32 also a binary
 * search over the bucket's fingerprints. Bits past p + 32 are ignored: the
 * range is then a superset (compare the keys). 0 <= *begin <= *end <= n. */
void sfs_sidecar_range(const sfs_sidecar_t *sc, const uint8_t *prefix, unsigned prefix_bits,
                       uint64_t *begin, uint64_t *end);

/* Copy the slots of positions [begin, end) (clamped to [0, n]) to out, in
 * host byte order; returns how many were copied. */
uint64_t sfs_sidecar_slots(const sfs_sidecar_t *sc, uint64_t begin, uint64_t end,
                           uint32_t *out);

/* Fingerprint of position i (bits [p, p+32) of its key), i < n. */
uint32_t sfs_sidecar_fingerprint(const sfs_sidecar_t *sc, uint64_t i);

/* Takedowns since the build: of the slots listed at positions [begin, end)
 * (clamped to [0, n]), those whose index slot in `shard` is now empty
 * (sfs_slot_get() == SFS_EMPTY_OFFSET: deleted since the sidecar was built,
 * as sfs_delete leaves a slot). They are written to `out`, in position
 * order (the sidecar's key order), and *found gets their number; `out` must
 * have room for every position of the range (min(end, n) - begin u32s: each
 * may be one). A listed slot outside [0, sfs_slot_count(shard)) (a damaged
 * sidecar) is not reported. Reads each listed slot's offset field in the
 * shard's mapping, in sidecar order (random in the index: the slot 16
 * entries ahead is prefetched, sfs_prefetch_slot_entry; about 15 ns an
 * entry when the index is cached); no system call, no allocation.
 * Touches both mappings: call under SFS_GUARDED (guard.h). Any number of
 * threads may call it at once (both objects are immutable).
 * Returns SFS_OK; SFS_EINVAL, with *found = 0 and nothing read, when the
 * sidecar's slot count is not the shard's (it belongs to another shard). */
int sfs_sidecar_deleted(const sfs_sidecar_t *sc, const sfs_shard_t *shard, uint64_t begin,
                        uint64_t end, uint32_t *out, uint64_t *found);

#ifdef __cplusplus
}
#endif
#endif
