/*
 * remote_copy.h — the local copy of a shard whose bytes are read over a
 * network (the "rbd" and "s3" kinds, kind.h): its header, index and hash
 * sections and one size per slot, in a sparse file of the cache directory,
 * so that a lookup never asks the server; only objects' bytes are read
 * from the source. The file's layout is in remote_copy.c.
 *
 * Errors: SFS_OK or a negative sfs_status (shard.h) with a one-line
 * message naming the source.
 */
#ifndef SHARDFS_REMOTE_COPY_H
#define SHARDFS_REMOTE_COPY_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shard.h"

/* How the builder reads the source, through the kind's connection `conn`. */
typedef struct {
    /* `len` bytes at byte `off` into buf: the bytes read (fewer only at the
     * source's end) or -errno. */
    int64_t (*pread)(void *conn, void *buf, size_t len, uint64_t off);
    /* n such reads at once: got[i] bytes or -errno each; returns 0, or
     * -errno when none could be asked. */
    int (*pread_many)(void *conn, size_t n, const uint64_t *offs, const size_t *lens, void *const *bufs,
                      int64_t *got);
} sfs_remote_ops_t;

/* Build the local copy of the shard `src` (`size` bytes, read through
 * ops/conn) at copy_path, creating the directories above it: the header
 * validated (sfs_validate_header), the index and hash sections copied and
 * every slot checked (empty, or a key the perfect hash sends there at an
 * offset inside the objects section: a source still being written is
 * refused), each slot's object size from the gaps between the objects'
 * offsets when they lie back to back (checked on 64 size fields), else
 * read from every size field. Written whole or not at all (a temporary
 * file, fdatasync, rename). SFS_OK, SFS_ECORRUPT, SFS_EIO (errno in err),
 * SFS_ENOMEM. */
int sfs_copy_build(const char *src, const sfs_remote_ops_t *ops, void *conn, uint64_t size, const char *copy_path,
                   sfs_error_t *err);

/* Bytes per read of sfs_copy_range: buf holds at least this many. */
#define SFS_COPY_CHUNK (4u << 20)

/* Copy the source's bytes [from, to) into fd at the same offsets, through
 * ops/conn, SFS_COPY_CHUNK bytes per read into buf. SFS_OK or SFS_EIO. */
int sfs_copy_range(const char *src, const sfs_remote_ops_t *ops, void *conn, int fd, uint64_t from, uint64_t to,
                   uint8_t *buf, sfs_error_t *err);

/* Create the directories above copy_path (mode 0700). SFS_OK or SFS_EIO. */
int sfs_copy_directories(const char *src, const char *copy_path, sfs_error_t *err);

/* Open the local copy at copy_path into s (s->path the source): s->fd,
 * the mapping, the header, extent, slots, file_size and the perfect hash
 * set; *sizes the slots' sizes (u64 little-endian, in the mapping) at byte
 * *sizes_offset of the copy; raw the copy's 88 header bytes (to compare
 * with the source's). SFS_OK; SFS_ENOTFOUND when there is no whole copy
 * there (to build; s->fd may be open: the caller closes it);
 * SFS_ECORRUPT / SFS_EIO. */
int sfs_copy_open(sfs_shard_t *s, const char *copy_path, const uint8_t **sizes, uint64_t *sizes_offset,
                  uint8_t raw[SFS_HEADER_END], sfs_error_t *err);

/* The state a remote kind keeps first in its own (kind.h, state_size):
 * what the operations below need. */
typedef struct {
    const sfs_remote_ops_t *ops;
    void *conn;            /* the kind's connection */
    const uint8_t *sizes;  /* each slot's object size, u64 little-endian, in the copy's mapping */
    uint64_t sizes_offset; /* byte offset of `sizes` in the local copy */
} sfs_remote_state_t;

/* Kind operations (kind.h) common to the remote kinds: sizes from the
 * copy's table, object bytes read through ops (read: SFS_OK or SFS_EIO
 * with errno; read_batch: every range in flight at once, ops->pread_many,
 * 64 at a time; source_read: from the source, the copy's objects section
 * being a hole). */
uint64_t sfs_remote_object_size(const sfs_shard_t *s, uint64_t slot, uint64_t offset);
int sfs_remote_object_size_nowait(const sfs_shard_t *s, uint64_t slot, uint64_t offset, uint64_t *size);
int sfs_remote_read(const sfs_shard_t *s, uint64_t offset, void *dst, size_t length);
void sfs_remote_read_batch(const sfs_shard_t *s, size_t n, const uint64_t *offsets, const size_t *lengths,
                           void *const *dsts, int *results);
ssize_t sfs_remote_source_read(const sfs_shard_t *s, int fd, void *buf, size_t len, uint64_t offset);

#endif
