/* internal.h — helpers shared by the C core's files; not part of the API. */
#ifndef SHARDFS_INTERNAL_H
#define SHARDFS_INTERNAL_H

#include "shard.h"

#include <sys/types.h>

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

/* fsync the directory holding `path` (best effort: a rename is durable). */
void sfs_sync_directory(const char *path);

#endif
