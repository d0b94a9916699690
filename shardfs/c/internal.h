/* internal.h — helpers shared by the C core's files; not part of the API. */
#ifndef SHARDFS_INTERNAL_H
#define SHARDFS_INTERNAL_H

#include "shard.h"

#include <endian.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

/* CLOCK_MONOTONIC in nanoseconds (the vDSO: no system call, ~25 ns); how
 * the batch paths tell a copy from the page cache from a device wait. */
static inline uint64_t sfs_now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* Fixed-width integers in files, read or written at any alignment: the
 * Read Shard's are big-endian (docs/format.md), shardfs's own files
 * (sidecars, global index levels) little-endian. */
static inline uint64_t be64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return be64toh(v);
}

static inline uint32_t get_le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

static inline uint64_t get_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static inline void put_le32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, 4);
}

static inline void put_le64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, 8);
}

/* Fill *err (if not NULL) with status, errno and a formatted message;
 * returns status. */
int sfs_fail(sfs_error_t *err, int status, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Size in bytes of the regular file or block device open on fd; *is_blk is
 * set for a block device. SFS_EINVAL for any other kind of file. */
int sfs_fd_size(int fd, const char *path, uint64_t *size, int *is_blk, sfs_error_t *err);

/* The reference count of an open object of the core (a shard, a sidecar,
 * a global index level, a hash index): `extra` counts the holders beyond
 * the one that opened it (0 after open, the struct being calloc'ed). Each
 * sfs_*_ref() adds a holder; each sfs_*_close() lets one go and frees the
 * object when it was the last. Atomic: a mount's request path (ll.h) lets
 * go of what an old snapshot held on whichever thread ends its last
 * request. */
static inline void sfs_ref_take(int *extra)
{
    __atomic_add_fetch(extra, 1, __ATOMIC_RELAXED);
}

/* Let one holder go: 1 when it was the last (free the object now). */
static inline int sfs_ref_drop(int *extra)
{
    return __atomic_fetch_sub(extra, 1, __ATOMIC_ACQ_REL) == 0;
}

/* Read exactly `len` bytes at `offset`, retrying on EINTR and short reads.
 * 0; SFS_PREAD_SHORT (errno EIO) when the file ends first (it shrank);
 * -1 with errno set when a read fails (EIO there is the device's error). */
#define SFS_PREAD_SHORT (-2)
int sfs_pread_full(int fd, void *buf, size_t len, uint64_t offset);

/* Open the file of `shard` again to read its index with pread (sidecar and
 * global index builds; never through the mapping, so a shrinking shard
 * cannot raise SIGBUS): through /proc/self/fd/<sfs_fd(shard)>, a file
 * description of our own of the very file sfs_open() mapped even if its
 * path now names another file (the path itself where /proc is missing).
 * Checks that it still holds the opened shard: a regular file or block
 * device at least as long as the index's end, whose 88-byte header is the
 * one sfs_open() validated; then asks for sequential read-ahead over the
 * index. *fd is the new descriptor (the caller closes it). SFS_OK, or
 * SFS_EIO with errno ESTALE (another shard there now), EIO (it shrank) or
 * the system's; nothing left open on error. */
int sfs_reopen_for_index(const sfs_shard_t *shard, int *fd, sfs_error_t *err);

/* A descriptor to read the index of `shard` with sfs_index_read: for an
 * index of at most SFS_SMALL_INDEX bytes in the shard's own file (no
 * slot_entry kind), the shard's own descriptor (*owned = 0: not to be
 * closed; one pread reads it all, no read-ahead to ask for, and a file
 * shrunk since gives a short read), else sfs_reopen_for_index's (*owned =
 * 1). A mount opening 100,000 small shards at start saves an open of
 * /proc/self/fd/N and a check per shard. Errors as sfs_reopen_for_index. */
#define SFS_SMALL_INDEX (64u * 1024u)
int sfs_index_fd(const sfs_shard_t *shard, int *fd, int *owned, sfs_error_t *err);

/* Slots [first, first + count) of the shard's index, 40 bytes each as a
 * Read Shard stores them (key, then the size field's offset, big-endian;
 * SFS_EMPTY_OFFSET for an empty slot), into buf: read with pread from
 * `fd` (sfs_reopen_for_index) at the index's offset, or, for a kind with
 * an index of its own (kind.h, slot_entry), built from its entries (an
 * empty slot then has a zero key). Results as sfs_pread_full. */
int sfs_index_read(const sfs_shard_t *shard, int fd, uint64_t first, uint64_t count, uint8_t *buf);

/* The digests of `hash` (1 sha1, 2 sha1_git) the shard's source's own
 * index gives (kind.h, own_digests): SFS_ENOTFOUND when it gives none. */
int sfs_own_digests(const sfs_shard_t *shard, int hash, void (*emit)(void *ctx, const uint8_t *digest, uint32_t slot),
                    void *ctx);

/* The (offset, length) byte ranges of the shard's source that identify it,
 * for a kind that says which (kind.h, identity_ranges): how many were
 * filled (<= max); 0 for a Read Shard (sidecar.py probes it itself). */
size_t sfs_identity_ranges(const sfs_shard_t *shard, uint64_t *offsets, uint64_t *lengths, size_t max);

/* Read up to `len` bytes at `offset` of the shard's bytes, as its kind
 * reads them (kind.h, source_read): through `fd` (a descriptor of the
 * shard's file, e.g. from sfs_reopen_for_index) for a file, from the image
 * for an rbd: source. Bytes read (fewer only at the end), or -1 with errno
 * set. */
ssize_t sfs_source_read(const sfs_shard_t *shard, int fd, void *buf, size_t len, uint64_t offset);

/* pwrite all `len` bytes at `offset`, retrying on EINTR and short writes.
 * 0, or -1 with errno set (ENOSPC when the device takes no more bytes). */
int sfs_pwrite_all(int fd, const void *buf, size_t len, uint64_t offset);

/* output.c: files that appear complete or not at all. */

/* Create the output file for `path`, empty, with permissions `mode`:
 * unnamed (O_TMPFILE) in the directory of `path`, *tmp_path = NULL; where
 * the file system lacks O_TMPFILE, a named .<name>.tmp-XXXXXX (mkostemp)
 * in *tmp_path (malloc'ed), which the caller unlinks and frees on error.
 * SFS_OK, or SFS_EIO (errno in err: ENOENT, EACCES...) / SFS_ENOMEM. */
int sfs_output_create(const char *path, mode_t mode, int *fd, char **tmp_path, sfs_error_t *err);

/* Publish the complete, synced output open on fd at `path`: an unnamed
 * file is linked at `path` when nothing is there, else linked under a
 * temporary name (set in *tmp_path) and renamed over `path`, as a named
 * one is. 0, or -1 with errno (a name left in *tmp_path is the caller's
 * to unlink and free). Call sfs_sync_directory(path) after. */
int sfs_output_publish(int fd, char **tmp_path, const char *path);

/* Give up an output not published: its temporary name (if any) removed
 * and freed, fd closed (-1: none). */
void sfs_output_discard(int fd, char **tmp_path);

/* fsync the directory holding `path` (best effort: a rename is durable). */
void sfs_sync_directory(const char *path);

#endif
