/*
 * lookup_pack.h — what a lookup needs of many shards, packed into one file
 * of the cache directory, so that LOOKUP and GETATTR are answered without
 * the shard being open: a mount of 100,000 shards keeps a few packs mapped
 * instead of 100,000 shards (a descriptor and a mapping each). Only a READ
 * opens the shard.
 *
 * A *record* holds, for one Read Shard: its perfect hash (the hash
 * section's CHD dump, as the shard stores it), its index (40 bytes per
 * slot, as the shard stores them: key, then the size field's offset,
 * big-endian) and each slot's object size. A lookup is then the shard's
 * own: slot = perfect hash of the key, the slot's key compared, its size
 * read — three reads in one mapping, no system call.
 *
 * Format (integers little-endian unless said):
 *
 *   header, 64 bytes:
 *     bytes  0..8    magic "SFSLKUP1"
 *     bytes  8..12   u32 version = 1
 *     bytes 12..16   u32 0
 *     bytes 16..24   u64 record count r
 *     bytes 24..32   u64 directory offset d (bytes from the file's start)
 *     bytes 32..64   reserved, zero
 *   records        from byte 64, each 8-byte aligned:
 *     bytes  0..32   stamp: 32 bytes chosen by the caller (what the shard
 *                    was when the record was made: shardfs/lookups.py)
 *     bytes 32..40   u64 slots n
 *     bytes 40..48   u64 dump size c (bytes of the CHD dump)
 *     bytes 48..56   u64 record size in bytes (64 + pad8(c) + 40 n + 8 n)
 *     bytes 56..60   u32 CRC-32 (zlib's) of the whole record, these 4
 *                    bytes taken as zero
 *     bytes 60..64   reserved, zero
 *     then the dump (c bytes, zero-padded to 8), the index (40 n bytes),
 *     the sizes (8 n bytes: each slot's object size; UINT64_MAX for an
 *     empty or deleted slot)
 *   directory      at byte d: r entries of 40 bytes, sorted by identity:
 *                  a shard's 32-byte identity (shardfs/sidecar.py), then
 *                  the u64 byte offset of its record
 *   file size      exactly d + 40 r
 *
 * Takedowns: sfs_lookup_pack_delete empties a slot of a record in place
 * (its offset set to SFS_EMPTY_OFFSET, its size to UINT64_MAX), through
 * the file, and writes the record's CRC anew: every process that maps
 * the pack sees it at once. A pack is
 * otherwise never changed: it is written whole under a temporary name,
 * fdatasync'ed and renamed (sfs_lookup_pack_commit).
 *
 * Trust: a pack is ours, but the cache directory may be damaged. Opening
 * checks the header, the file size and that the directory's offsets are
 * sorted records inside the file; sfs_lookup_pack_attach checks a record's
 * bounds, its perfect hash's frame and its CRC (reading the whole record:
 * 48 bytes per slot), so a damaged record is not used. A record damaged
 * after it was attached gives wrong answers (an object absent, a wrong
 * size), never a read outside the mapping. The file is mapped: truncating it in place while it is open
 * raises SIGBUS (the request path reads it under SFS_GUARDED).
 *
 * Errors: SFS_OK (0) or a negative status of shard.h, with a one-line
 * message naming the file in sfs_error_t. Thread safety: an open pack is
 * read by any number of threads at once; sfs_lookup_pack_delete writes
 * 16 bytes of one slot, which a concurrent lookup sees before or after.
 */
#ifndef SHARDFS_LOOKUP_PACK_H
#define SHARDFS_LOOKUP_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "chd.h"
#include "shard.h"

#define SFS_LOOKUP_PACK_MAGIC "SFSLKUP1"
#define SFS_LOOKUP_PACK_VERSION 1
#define SFS_LOOKUP_PACK_HEADER 64   /* bytes */
#define SFS_LOOKUP_RECORD_HEADER 64 /* bytes */
#define SFS_LOOKUP_STAMP_SIZE 32    /* bytes */
#define SFS_LOOKUP_DIR_ENTRY 40     /* bytes: identity + u64 offset */

/* ------------------------------------------------------------- writing */

typedef struct sfs_lookup_pack_writer sfs_lookup_pack_writer_t;

/* Start a pack at `path`: an unnamed file in its directory until commit.
 * SFS_OK, SFS_EIO (errno in err), SFS_ENOMEM. */
int sfs_lookup_pack_create(const char *path, sfs_lookup_pack_writer_t **out, sfs_error_t *err);

/* Append the record of the open Read Shard `shard` (not a kind with an
 * index of its own: SFS_EINVAL), under its identity and `stamp`; its
 * byte offset in the pack into *record. The index and hash sections are
 * read with pread through a descriptor of their own
 * (sfs_reopen_for_index), never through the mapping; each slot's size
 * comes from the gaps between the objects' offsets when they lie back to
 * back (checked on up to 64 size fields), else from every size field.
 * SFS_OK; SFS_ECORRUPT (a slot whose key the perfect hash does not send
 * there, an offset outside the objects section); SFS_EIO (errno: ESTALE,
 * another file under the shard's name; EIO, it shrank; ENOSPC writing);
 * SFS_ENOMEM. A failed add leaves the pack as it was. */
int sfs_lookup_pack_add(sfs_lookup_pack_writer_t *w, const sfs_shard_t *shard, const uint8_t identity[32],
                        const uint8_t stamp[SFS_LOOKUP_STAMP_SIZE], uint64_t *record, sfs_error_t *err);

/* Append a copy of the record at byte `record` of the open pack `from`
 * (a merge of packs), under `identity`; its new byte offset into *out.
 * SFS_OK; SFS_ECORRUPT (no whole record there); SFS_EIO; SFS_ENOMEM. */
struct sfs_lookup_pack;
int sfs_lookup_pack_copy(sfs_lookup_pack_writer_t *w, const struct sfs_lookup_pack *from, uint64_t record,
                         const uint8_t identity[32], uint64_t *out, sfs_error_t *err);

/* Write the directory and header, fdatasync, and publish the pack at its
 * path (replacing a file there), then free w. SFS_OK or SFS_EIO/SFS_ENOMEM
 * (nothing published; w freed either way). */
int sfs_lookup_pack_commit(sfs_lookup_pack_writer_t *w, sfs_error_t *err);

/* Give up: nothing published, w freed. NULL is accepted. */
void sfs_lookup_pack_abort(sfs_lookup_pack_writer_t *w);

/* ------------------------------------------------------------- reading */

typedef struct sfs_lookup_pack sfs_lookup_pack_t;

/* Open and map the pack at `path` (read-write when permitted, for
 * sfs_lookup_pack_delete). SFS_OK; SFS_ECORRUPT (magic, version, size,
 * directory); SFS_EIO (errno: ENOENT...); SFS_ENOMEM. */
int sfs_lookup_pack_open(const char *path, sfs_lookup_pack_t **out, sfs_error_t *err);

/* Another holder of p (let go with sfs_lookup_pack_close). */
sfs_lookup_pack_t *sfs_lookup_pack_ref(sfs_lookup_pack_t *p);

/* Let go; the last holder unmaps and closes. NULL is accepted. */
void sfs_lookup_pack_close(sfs_lookup_pack_t *p);

/* Records in the pack. */
uint64_t sfs_lookup_pack_count(const sfs_lookup_pack_t *p);

/* The byte offset of the record of the shard `identity`, or -1. */
int64_t sfs_lookup_pack_record(const sfs_lookup_pack_t *p, const uint8_t identity[32]);

/* A record made ready for lookups: its fields checked once. */
typedef struct {
    const uint8_t *index; /* 40 bytes per slot */
    const uint8_t *sizes; /* 8 bytes per slot */
    uint64_t slots;
    uint64_t offset;      /* the record's byte offset in the pack */
    sfs_chd_t chd;        /* parsed in place (sfs_chd_parse_trusted) */
} sfs_lookup_record_t;

/* Check the record at byte `record` (sfs_lookup_pack_record) for use in
 * place of a shard of `slots` slots made as `stamp`: inside the pack, the
 * same stamp and slot count, a perfect hash whose frame parses, its CRC. SFS_OK
 * with *out set (valid while p is held); SFS_ESTALE (another stamp or slot
 * count: the shard changed since, rebuild the record); SFS_ECORRUPT. */
int sfs_lookup_pack_attach(const sfs_lookup_pack_t *p, uint64_t record, const uint8_t stamp[SFS_LOOKUP_STAMP_SIZE],
                           uint64_t slots, sfs_lookup_record_t *out);

/* The record at byte `record`, its bounds and perfect hash's frame
 * checked (no stamp): SFS_OK or SFS_ECORRUPT. O(1): the request path
 * makes a view at each lookup (ll_pool.c). */
int sfs_lookup_pack_view(const sfs_lookup_pack_t *p, uint64_t record, sfs_lookup_record_t *out);

/* The object of `key` (32 bytes) in the record: SFS_OK with its slot, the
 * byte offset of its first byte in the shard (after its size field) and
 * its size in bytes; SFS_ENOTFOUND (absent, deleted). No lock, no system
 * call. */
int sfs_lookup_record_find(const sfs_lookup_record_t *r, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                           uint64_t *offset, uint64_t *size);

/* The object of `slot`: SFS_OK with offset and size as above;
 * SFS_ENOTFOUND (an empty or deleted slot, or slot >= slots). */
int sfs_lookup_record_slot(const sfs_lookup_record_t *r, uint64_t slot, uint64_t *offset, uint64_t *size);

/* Empty `slot` of the record at byte `record` in the file (a takedown):
 * SFS_OK; SFS_EINVAL (no such record or slot); SFS_EIO (errno: EBADF when
 * the pack was opened read-only). */
int sfs_lookup_pack_delete(sfs_lookup_pack_t *p, uint64_t record, uint64_t slot, sfs_error_t *err);

#endif
