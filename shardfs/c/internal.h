/* internal.h — helpers shared by shard.c and writer.c; not part of the API. */
#ifndef SHARDFS_INTERNAL_H
#define SHARDFS_INTERNAL_H

#include "shard.h"

/* Fill *err (if not NULL) with status, errno and a formatted message;
 * returns status. */
int sfs_fail(sfs_error_t *err, int status, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Size in bytes of the regular file or block device open on fd; *is_blk is
 * set for a block device. SFS_EINVAL for any other kind of file. */
int sfs_fd_size(int fd, const char *path, uint64_t *size, int *is_blk, sfs_error_t *err);

/* pwrite all `len` bytes at `offset`, retrying on EINTR and short writes.
 * 0, or -1 with errno set (ENOSPC when the device takes no more bytes). */
int sfs_pwrite_all(int fd, const void *buf, size_t len, uint64_t offset);

#endif
