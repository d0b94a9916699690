/*
 * kind_rbd.c — the "rbd" kind (kind.h): a shard in a Ceph RBD image,
 * source "rbd:POOL/IMAGE" (rbd.h, docs/ceph.md).
 *
 * Its header, index and hash sections, and every slot's object size, are
 * in a local copy (below) that is mapped, so that a lookup never asks the
 * cluster; only the bytes of objects are read from the image, through
 * librbd (rbd.c). Flag SFS_KIND_REMOTE: those reads cross the network.
 */
#define _GNU_SOURCE
#include "chd.h"
#include "internal.h"
#include "kind.h"
#include "rbd.h"
#include "remote_copy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The kind's state of a shard (sfs_kind_state). */
typedef struct {
    sfs_remote_state_t remote; /* first (remote_copy.h): conn is the image (sfs_rbd_t), read through librbd */
    char pool[SFS_RBD_NAME_MAX], image[SFS_RBD_NAME_MAX];
} rbd_state_t;

static inline rbd_state_t *state_of(const sfs_shard_t *s) { return sfs_kind_state(s); }

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)

/* ---------------------------------------------------------------- the local copy
 *
 * remote_copy.h: built from the image through librbd, in a child process
 * when asked (sfs_rbd_isolated). */

typedef struct {
    const char *source, *pool, *image, *copy_path;
} copy_job_t;

static int64_t copy_pread(void *conn, void *buf, size_t len, uint64_t off)
{
    return sfs_rbd_pread(conn, buf, len, off);
}

static int copy_pread_many(void *conn, size_t n, const uint64_t *offs, const size_t *lens, void *const *bufs,
                           int64_t *got)
{
    return sfs_rbd_pread_many(conn, n, offs, lens, bufs, got);
}

static const sfs_remote_ops_t rbd_copy_ops = {copy_pread, copy_pread_many};

/* Build the local copy of job->source at job->copy_path (may run in a
 * child process: sfs_rbd_isolated). */
static int build_copy(void *arg, sfs_error_t *err)
{
    copy_job_t *job = arg;
    sfs_rbd_t *r = NULL;
    uint64_t size;
    int rc;
    if ((rc = sfs_rbd_new(job->pool, job->image, NULL, 0, &r, err)) == SFS_OK &&
        (rc = sfs_rbd_connect(r, &size, err)) == SFS_OK)
        rc = sfs_copy_build(job->source, &rbd_copy_ops, r, size, job->copy_path, err);
    sfs_rbd_close(r);
    return rc;
}

/* The local copy at copy_path, then the image's connection (which checks
 * the image still has the copy's header). */
static int open_copy(sfs_shard_t *s, const char *copy_path, sfs_error_t *err)
{
    rbd_state_t *state = state_of(s);
    uint8_t raw[SFS_HEADER_END];
    int rc = sfs_copy_open(s, copy_path, &state->remote.sizes, &state->remote.sizes_offset, raw, err);
    return rc != SFS_OK ? rc
                        : sfs_rbd_new(state->pool, state->image, raw, sizeof(raw), (sfs_rbd_t **)&state->remote.conn, err);
}

/* open(): the local copy of the source, built first if needed. */
static int rbd_open(sfs_shard_t *s, sfs_error_t *err)
{
    rbd_state_t *st = state_of(s);
    const char *src = s->path, *cache = sfs_rbd_cache_dir();
    int rc = sfs_rbd_parse(src, st->pool, st->image, err);
    if (rc != SFS_OK)
        return rc;
    if (s->writable)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: RBD images are opened read-only", src);
    st->remote.ops = &rbd_copy_ops;
    if (!sfs_rbd_built())
        return sfs_rbd_new(st->pool, st->image, NULL, 0, (sfs_rbd_t **)&st->remote.conn, err);
    if (!cache)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: no cache directory for its local copy", src);
    char copy_path[4096];
    if ((size_t)snprintf(copy_path, sizeof(copy_path), "%s/rbd/%s/%s.copy", cache, st->pool,
                         st->image) >= sizeof(copy_path))
        return sfs_fail(err, SFS_EINVAL, 0, "%s: cache directory path too long", src);
    for (int attempt = 0; attempt < 2; attempt++) {
        if ((rc = open_copy(s, copy_path, err)) != SFS_ENOTFOUND)
            return rc;
        if (s->fd >= 0) {
            close(s->fd);
            s->fd = -1;
        }
        if (attempt)
            break;
        copy_job_t job = {src, st->pool, st->image, copy_path};
        if ((rc = sfs_rbd_isolated(build_copy, &job, err)) != SFS_OK)
            return rc;
    }
    return sfs_fail(err, SFS_EIO, EIO, "%s: its local copy %s is unreadable after it was built",
                    src, copy_path);
}

static void rbd_close(sfs_shard_t *s) { sfs_rbd_close(state_of(s)->remote.conn); }

/* ---------------------------------------------------------------- operations */

static int rbd_claims(const char *source) { return sfs_is_rbd_source(source); }

static void rbd_prefetch_size(const sfs_shard_t *s, uint64_t slot, uint64_t offset, int cold)
{
    const uint8_t *p = state_of(s)->remote.sizes + 8 * slot;
    __builtin_prefetch(p, 0, 0);
    __builtin_prefetch(p + 7, 0, 0);
}

/* An asynchronous read of the range's first SFS_RBD_AHEAD_MAX bytes,
 * which the next read within it takes (rbd.h). */
static void rbd_prefetch(const sfs_shard_t *s, uint64_t offset, uint64_t length)
{
    sfs_rbd_prefetch(state_of(s)->remote.conn, offset,
                     (size_t)(length < SFS_RBD_AHEAD_MAX ? length : SFS_RBD_AHEAD_MAX));
}

static const char *rbd_source_error(const sfs_shard_t *s) { return sfs_rbd_error(state_of(s)->remote.conn); }

/* Object bytes are never in this host's page cache nor mapped: no
 * read_nowait (SFS_EAGAIN), no data (NULL). */
const sfs_kind_t sfs_kind_rbd = {
    .name = "rbd",
    .flags = SFS_KIND_REMOTE,
    .state_size = sizeof(rbd_state_t),
    .claims = rbd_claims,
    .open = rbd_open,
    .close = rbd_close,
    .object_size = sfs_remote_object_size,
    .object_size_nowait = sfs_remote_object_size_nowait,
    .prefetch_size = rbd_prefetch_size,
    .read = sfs_remote_read,
    .read_batch = sfs_remote_read_batch,
    .prefetch = rbd_prefetch,
    .source_read = sfs_remote_source_read,
    .source_error = rbd_source_error,
};
