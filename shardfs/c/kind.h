/*
 * kind.h — kinds of shard source: one table of operations per kind.
 *
 * A shard is opened from a source: a path (a regular file or a block
 * device: the "file" kind, kind_file.c) or "rbd:POOL/IMAGE" (the "rbd"
 * kind, kind_rbd.c: a Ceph RBD image read through librbd, rbd.h).
 * sfs_open() chooses the kind once, the first of sfs_kinds[] whose
 * claims() accepts the source (the file kind, last, takes any; it hands a
 * file that starts with EBML's magic to the "mosaic" kind, kind_mosaic.c:
 * a MOSAIC file is recognized by its content, not by its name), and from
 * then on every call that depends on where bytes come from goes through
 * the shard's table (shard->kind). Nothing outside a kind's own file tests
 * which kind a shard is: a caller that must behave differently asks for a
 * capability (sfs_kind_flags(), shard.h). A new kind is one file defining
 * one sfs_kind_t, one line in sfs_kinds[] (shard.c), and its file in the
 * sources of setup.py and the Makefile.
 *
 * What every kind provides, so that the lookups are common code (shard.c:
 * sfs_lookup*, sfs_slot_*, sfs_lookup_batch, sfs_check, sfs_live_count)
 * and never call a kind for the hash or the index: once open() returns
 * SFS_OK, the header, index and hash sections are mapped in local memory
 * at their own byte offsets of the shard (`map`, `map_size` bytes: the
 * shard itself, or a local copy), `fd` is a descriptor of what is mapped
 * (posix_fadvise and preadv2(RWF_NOWAIT) of the index go through it), and
 * `header`, `slots`, `objects_end`, `extent`, `file_size` and `chd` are
 * set. What differs between kinds, and is an operation below: where an
 * object's size comes from (its size field in the shard, or a table of
 * the kind's own) and where an object's bytes come from.
 *
 * Terms, as in shard.h: a key is 32 bytes; a slot is an index entry, 0 to
 * slots - 1; offsets are absolute byte offsets in the shard; an object's
 * size field (8 bytes, big-endian) is at the offset its slot stores, its
 * bytes follow it.
 *
 * Checked before any operation is called (shard.c), so a kind does not
 * check them again: an object range [offset, offset + length) lies inside
 * the objects section (in_objects); a size field's offset lies inside it
 * with its 8 bytes (size_field_ok); a slot is < slots. An object size an
 * operation gives is checked afterwards (it must end inside the objects
 * section, else SFS_ECORRUPT), so a kind may return any value it read.
 *
 * Thread safety: after open() returns and until close(), any number of
 * threads call the other operations at once on the same shard, with no
 * lock taken by shard.c: an operation takes its own locks if it needs any
 * (rbd.c does for its connection), and never changes the common fields
 * below (except `no_nowait`, atomically: sfs_page_cache_read). open() and
 * close() run on one thread, with no other call on that shard.
 *
 * Errors are sfs_status values (shard.h); a kind's open fills *err with a
 * one-line message naming the source, as sfs_open() documents.
 *
 * SIGBUS: an operation that reads the mapping (the file kind's object
 * sizes, data and reads) may fault when the file shrinks under it; the
 * Python binding runs the calls under SFS_GUARDED (guard.h), which
 * abandons the operation: no operation holds a lock or owns memory while
 * it touches the mapping.
 */
#ifndef SHARDFS_KIND_H
#define SHARDFS_KIND_H

#include "chd.h"
#include "shard.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct sfs_kind sfs_kind_t;

/* An open shard: the fields every kind shares, then the kind's own state.
 * The first ones, through `chd`, are what a lookup reads (in that order,
 * so that they share as few cache lines as can be: sfs_prefetch_reader). */
struct sfs_shard {
    const sfs_kind_t *kind; /* chosen at open, never changes */
    int refs;             /* holders beyond the first (internal.h) */
    int fd;               /* what is mapped: the shard, or a kind's local copy; -1 before open */
    int writable;         /* opened for sfs_delete (a kind that cannot refuses it at open) */
    int no_nowait;        /* preadv2(RWF_NOWAIT) unsupported on fd (sfs_page_cache_read) */
    char *path;           /* the source, as given to sfs_open */
    sfs_header_t header;
    uint64_t file_size;   /* bytes of the file, device or image */
    uint64_t extent;      /* bytes used by the shard: the end of its hash section */
    uint64_t slots;       /* index_size / 40 */
    uint64_t objects_end; /* objects_position + objects_size */
    const uint8_t *map;   /* map_size bytes: at least [0, 88) and [index_position, extent) */
    sfs_chd_t chd;        /* the perfect hash, parsed from the mapping */
    uint64_t live;        /* cached live count + 1; 0 = not counted yet */
    uint64_t map_size;    /* bytes mapped (munmap'ed by sfs_close) */
    unsigned flags;       /* SFS_KIND_* of this source, set by open(), beside kind->flags */
    /* kind->state_size bytes of the kind's own, zeroed before open
     * (sfs_kind_state) */
    _Alignas(16) unsigned char state[];
};

/* The kind's own state of shard `s` (kind->state_size bytes). */
static inline void *sfs_kind_state(const sfs_shard_t *s) { return (void *)s->state; }

/* One kind of shard source. The operations marked optional may be NULL:
 * shard.c then does what is written after "NULL:". No operation is called
 * on a shard whose open() failed, except close(). */
struct sfs_kind {
    /* Short name: "file", "rbd" (sfs_kind_name). */
    const char *name;

    /* SFS_KIND_* of shard.h: what callers may count on (sfs_kind_flags). */
    unsigned flags;

    /* Bytes of state the kind keeps per shard (sfs_kind_state), 0 for
     * none; zeroed before open(). */
    size_t state_size;

    /* 1 when `source` (sfs_open's path) names a shard of this kind, else
     * 0. Looks at the string only. */
    int (*claims)(const char *source);

    /* Open s->path: fills in the common fields (see above), validating as
     * sfs_open() documents (sfs_validate_header, sfs_chd_parse), and the
     * kind's state. s->writable is set: a kind whose bytes sfs_delete
     * cannot write through s->fd refuses it with SFS_EINVAL. Returns
     * SFS_OK, or SFS_ECORRUPT / SFS_EIO / SFS_EINVAL / SFS_ENOMEM with
     * *err filled; what it set up is then released by sfs_close (the
     * common fields, and close() for the state). */
    int (*open)(sfs_shard_t *s, sfs_error_t *err);

    /* Optional. Release the kind's state (not `map` nor `fd`: sfs_close
     * does). Also called after a failed open(): accepts a state left
     * partly set up (zeroed fields untouched). NULL: nothing to release. */
    void (*close)(sfs_shard_t *s);

    /* The size in bytes of the object of `slot`, whose size field is at
     * byte `offset` (inside the objects section). Never fails: the value
     * is checked by the caller. The hot path of every lookup. */
    uint64_t (*object_size)(const sfs_shard_t *s, uint64_t slot, uint64_t offset);

    /* Optional. object_size from this host's page cache only (preadv2
     * RWF_NOWAIT: sfs_page_cache_read), for sfs_lookup_nowait and
     * sfs_slot_object_nowait. SFS_OK with *size set, or SFS_EAGAIN when
     * the bytes are not cached. NULL: always SFS_EAGAIN. */
    int (*object_size_nowait)(const sfs_shard_t *s, uint64_t slot, uint64_t offset, uint64_t *size);

    /* Optional. A hint from sfs_lookup_batch: object_size(s, slot, offset)
     * is called about 8 keys later; start loading what it reads (into the
     * CPU cache; `cold` set: the batch found the device slow, so into the
     * page cache, posix_fadvise). Returns at once, never fails. NULL:
     * nothing. */
    void (*prefetch_size)(const sfs_shard_t *s, uint64_t slot, uint64_t offset, int cold);

    /* Optional. A pointer to the `length` bytes at byte `offset` (an
     * object range) in memory, valid until sfs_close, or NULL when they
     * are not mapped. NULL: sfs_data gives NULL (callers then sfs_read). */
    const uint8_t *(*data)(const sfs_shard_t *s, uint64_t offset, uint64_t length);

    /* Copy the `length` bytes at byte `offset` (an object range) into dst.
     * SFS_OK, or SFS_EIO with errno set (EIO when the source ended first:
     * it shrank; ETIMEDOUT, ESTALE... for a remote source). The hot path
     * of every read. */
    int (*read)(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length);

    /* Optional. read() from this host's page cache only: SFS_OK, or
     * SFS_EAGAIN unless every byte is cached (without waiting). NULL:
     * SFS_EAGAIN for length > 0, SFS_OK for 0 (bytes never cached here). */
    int (*read_nowait)(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length);

    /* Optional. n reads: range i is lengths[i] bytes at offsets[i] into
     * dsts[i], to be done when results[i] is SFS_OK on entry (its range
     * lies inside the objects section), skipped otherwise (SFS_EINVAL).
     * Sets results[i] of each range it reads to SFS_OK or SFS_EIO, and
     * errno, when one failed, to the first failed range's errno. All n
     * are attempted whatever fails. NULL: read() of each range in turn. */
    void (*read_batch)(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                       void *const *dsts, int *results);

    /* Optional. A hint (sfs_prefetch): the object bytes [offset, offset +
     * length), length > 0, will be read soon; start fetching them without
     * waiting. Best effort, never fails. NULL: nothing. */
    void (*prefetch)(const sfs_shard_t *s, uint64_t offset, uint64_t length);

    /* Read up to `len` bytes at byte `offset` of the shard, any section
     * (sfs_source_read, for index builds that stream a whole shard):
     * through `fd` (a descriptor of the shard's file from
     * sfs_reopen_for_index) when the kind's bytes are in that file, else
     * from the kind's own source. The bytes read (fewer only at the
     * end), or -1 with errno set. */
    ssize_t (*source_read)(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset);

    /* Optional, the three together: a kind whose keys are found by an
     * index of its own rather than by a mapped Read Shard index and CHD
     * hash (the mosaic kind). Then `map`, `chd` and the index and hash
     * sections of `header` are not used by the lookups: `header` holds a
     * Read Shard view of the source (objects_position 88, each slot's
     * size field at a byte offset of the kind's choosing inside the
     * objects section, index_position = objects_end, no hash section).
     * find: SFS_OK with *slot and *offset (of the object's size field, as
     * a slot stores it) for a live key; SFS_ENOTFOUND when absent or
     * deleted; SFS_ECORRUPT. slot_of: the slot `key` hashes to (its
     * perfect hash value), or a value >= slots when the index says no key
     * has one. slot_entry: slot's key into key_out (may be NULL) and its
     * size field's offset, or SFS_EMPTY_OFFSET for a deleted, empty or
     * unreadable entry (sfs_slot_get). NULL: the Read Shard index in `map`. */
    int (*find)(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot, uint64_t *offset);
    uint64_t (*slot_of)(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE]);
    uint64_t (*slot_entry)(const sfs_shard_t *s, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE]);

    /* Optional. For a source whose own index gives each object's digest
     * of `hash` (1: sha1, 2: sha1_git: enum sfs_hash_kind, hashindex.h), a
     * MOSAIC file with such an index: emit(ctx, digest, slot) for every
     * live object of the source's own index (20-byte digest, the slot
     * find gives its key), reading no object; SFS_OK, SFS_ENOTFOUND when
     * it has no such index, SFS_ENOMEM. A hash index is then built from
     * them instead of by hashing every object (sfs_hashindex_build).
     * NULL: none. */
    int (*own_digests)(const sfs_shard_t *s, int hash, void (*emit)(void *ctx, const uint8_t *digest, uint32_t slot),
                       void *ctx);

    /* Optional. The byte ranges of the source that identify it (the
     * sidecar's identity, shardfs/sidecar.py): what no deletion changes.
     * Fills up to `max` (offset, length) pairs, returns how many. NULL:
     * the Read Shard's header, hash and index probes (sidecar.py). */
    size_t (*identity_ranges)(const sfs_shard_t *s, uint64_t *offsets, uint64_t *lengths, size_t max);

    /* Optional. The one-line message of the source's last connection
     * error ("" when none), valid until the next call on the shard.
     * NULL: sfs_source_error gives NULL (a source with no connection). */
    const char *(*source_error)(const sfs_shard_t *s);
};

/* The kinds, in the order sfs_open() asks them to claim a source; the
 * file kind, which claims any, last. */
extern const sfs_kind_t sfs_kind_rbd;    /* kind_rbd.c */
extern const sfs_kind_t sfs_kind_s3;     /* kind_s3.c: "s3://BUCKET/KEY" */
extern const sfs_kind_t sfs_kind_file;   /* kind_file.c */
extern const sfs_kind_t sfs_kind_mosaic; /* kind_mosaic.c: a file whose first bytes are EBML's
                                          * magic, handed over by the file kind (SFS_EKIND) */

/* What a kind's open() returns, internally, when the source is of another
 * kind it recognized by its content: the file and s3 kinds, for a MOSAIC
 * file (the mosaic kind reads one in a file or in S3);
 * sfs_open() then opens it with that kind. Never returned by sfs_open(). */
#define SFS_EKIND (-100)

/* Helpers of shard.c for the kinds' open(). */

/* Validate the 88 bytes of a header against s->file_size: sets
 * s->header, s->slots and s->objects_end. SFS_OK or SFS_ECORRUPT with a
 * message naming s->path and the field. */
int sfs_validate_header(sfs_shard_t *s, const uint8_t raw[SFS_HEADER_END], sfs_error_t *err);

/* Copy `length` bytes at byte `offset` of s->fd from the page cache only
 * (preadv2 RWF_NOWAIT): SFS_OK, or SFS_EAGAIN when a byte is not cached
 * or the kernel cannot tell (then never asked again for this shard). */
int sfs_page_cache_read(const sfs_shard_t *s, void *dst, size_t length, uint64_t offset);

#endif
