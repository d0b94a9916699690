/*
 * rbd.h — Read Shards kept in Ceph RBD images, read through librbd.
 *
 * A shard source "rbd:POOL/IMAGE" names an RBD image whose first bytes are
 * a Read Shard (written by `rbd import` of a shard file, or by winery's rbd
 * pools); the image may be larger than the shard (the extent comes from the
 * header, as for block devices).
 *
 * How kind_rbd.c (the "rbd" kind of shard source, kind.h) uses this
 * file: sfs_open() of such a source maps a local copy of the shard's
 * header, index and hash sections (a sparse file in the cache directory:
 * its objects section is a hole), plus a table of every slot's object
 * size, so that a lookup never reads the cluster; only the bytes of
 * objects are read from the image (sfs_read -> sfs_rbd_pread).
 * See docs/ceph.md for the copy's format and costs.
 *
 * Connections: one librados client per process, made at the first read (or
 * copy) in that process and remade after fork(): librados's threads do not
 * survive a fork, so a handle inherited from the parent is never used.
 * With `isolate` set (sfs_rbd_configure), the work that needs the cluster
 * before the first read — building a local copy, listing a pool — runs in
 * a child process, so a process that forks workers afterwards (the mount's
 * coordinator) never starts librados's threads itself.
 *
 * Timeouts (librbd's own options, seconds): rados_osd_op_timeout and
 * rados_mon_op_timeout and client_mount_timeout are all set to the
 * configured timeout, so a read of a stopped cluster fails with ETIMEDOUT
 * (SFS_EIO) instead of waiting for ever.
 *
 * Built only with librbd (SFS_HAVE_RBD, set by setup.py when
 * <rbd/librbd.h> exists): without it every function below fails with
 * SFS_EINVAL and a message naming the package to install.
 *
 * Errors: SFS_OK (0) or a negative sfs_status of shard.h; sfs_error_t gets
 * one line naming the source ("rbd:POOL/IMAGE") and the cause.
 */
#ifndef SHARDFS_RBD_H
#define SHARDFS_RBD_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SFS_RBD_PREFIX "rbd:"
#define SFS_RBD_NAME_MAX 256         /* bytes of a pool or image name, NUL included */
#define SFS_RBD_DEFAULT_TIMEOUT 30   /* seconds */

typedef struct sfs_rbd sfs_rbd_t;

/* 1 when this build has librbd, else 0. */
int sfs_rbd_built(void);

/* Process-wide settings, taken by the next connection (a connection made
 * before keeps its own): `conf` a ceph.conf path (NULL: librados's default
 * search, $CEPH_CONF then /etc/ceph/ceph.conf), `id` the client name without
 * "client." (NULL: "admin"), `cache_dir` where local copies live (must be
 * set before sfs_open of an rbd: source), `timeout` in seconds (0: the
 * default, 30), `isolate` as described above, `max_images` (0: the
 * default) below. SFS_OK or SFS_ENOMEM. */
int sfs_rbd_configure(const char *conf, const char *id, const char *cache_dir,
                      unsigned timeout, int isolate, size_t max_images, sfs_error_t *err);

/* Images a process keeps open at most (sfs_rbd_configure's max_images,
 * 0: this): opening one more closes the least recently used one that no
 * read is using (each costs ~330 KiB of librbd state; reopening one costs
 * an rbd_open, a few ms, and a read of its header). */
#define SFS_RBD_MAX_IMAGES 1024

/* Images open in this process now. */
size_t sfs_rbd_open_images(void);

/* The cache directory set by sfs_rbd_configure, or NULL. */
const char *sfs_rbd_cache_dir(void);

/* 1 when `source` starts with "rbd:". */
int sfs_is_rbd_source(const char *source);

/* Split "rbd:POOL/IMAGE" into pool and image (each < SFS_RBD_NAME_MAX bytes,
 * neither empty, no further '/', no '@'). SFS_OK or SFS_EINVAL. */
int sfs_rbd_parse(const char *source, char pool[SFS_RBD_NAME_MAX], char image[SFS_RBD_NAME_MAX],
                  sfs_error_t *err);

/* A handle on image `image` of `pool` that connects lazily. `expect`: when
 * not NULL, the first `expect_len` bytes the image must start with (checked
 * at each connection; a mismatch makes every read fail with ESTALE).
 * SFS_OK or SFS_ENOMEM; nothing is connected yet. */
int sfs_rbd_new(const char *pool, const char *image, const uint8_t *expect, size_t expect_len,
                sfs_rbd_t **out, sfs_error_t *err);

/* Connect now (in this process) and give the image's size in bytes.
 * SFS_EIO with errno ENOENT (no such pool or image), ETIMEDOUT (cluster
 * unreachable), EACCES/EPERM (client refused), ESTALE (image no longer
 * starts with `expect`), or librados's. */
int sfs_rbd_connect(sfs_rbd_t *r, uint64_t *size, sfs_error_t *err);

/* Read up to `len` bytes at byte `off` of the image into buf (connecting
 * first if needed). Returns the bytes read (fewer only at the image's end)
 * or -errno (ETIMEDOUT past the timeout, ESTALE, EIO...). Thread-safe. */
int64_t sfs_rbd_pread(sfs_rbd_t *r, void *buf, size_t len, uint64_t off);

/* Read n ranges at once (asynchronous reads, all in flight together):
 * range i is lens[i] bytes at offs[i] into bufs[i]; results[i] gets the
 * bytes read or -errno. Returns 0, or -errno when nothing could be asked. */
int sfs_rbd_pread_many(sfs_rbd_t *r, size_t n, const uint64_t *offs, const size_t *lens,
                       void *const *bufs, int64_t *results);

/* Start reading [off, off + min(len, SFS_RBD_AHEAD_MAX)) now, without
 * waiting (asynchronous read): the next sfs_rbd_pread within that range
 * takes its bytes instead of asking the cluster (a mount's LOOKUP starts
 * the read the READ that follows needs). At most SFS_RBD_AHEAD reads are
 * kept per image: when all are in flight the request is dropped; a
 * complete one nobody took is evicted, oldest first. Best effort: errors
 * are left to the read that takes it. */
#define SFS_RBD_AHEAD 32
#define SFS_RBD_AHEAD_MAX (128 * 1024) /* bytes */
void sfs_rbd_prefetch(sfs_rbd_t *r, uint64_t off, size_t len);

/* The last connection error message of `r` ("" when none). */
const char *sfs_rbd_error(const sfs_rbd_t *r);

void sfs_rbd_close(sfs_rbd_t *r);

/* Names of the images of `pool`, NUL-separated in one malloc'ed block
 * (*names, *size bytes; the caller frees it), in the order librbd lists
 * them. Runs in a child process when `isolate` is set. */
int sfs_rbd_list(const char *pool, char **names, size_t *size, sfs_error_t *err);

/* Run fn(arg, err) in a child process when `isolate` is set (its status
 * and message come back through a pipe), else here. */
int sfs_rbd_isolated(int (*fn)(void *arg, sfs_error_t *err), void *arg, sfs_error_t *err);

#ifdef __cplusplus
}
#endif

#endif
