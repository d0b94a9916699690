/*
 * kind_s3.c — the "s3" kind (kind.h): a Read Shard that is an object of an
 * S3 bucket, source "s3://BUCKET/KEY" (s3.h, docs/s3.md).
 *
 * Its header, index and hash sections and every slot's object size are in
 * a local copy (remote_copy.h) in the cache directory, named by the
 * object's identity: <cache>/s3/<bucket>/<key>.<ETag>-<size>.copy, so a
 * lookup never asks the server and an object replaced under its key gets
 * a copy of its own. Only the bytes of objects are read from the server:
 * one ranged GET each, carrying If-Match with the copied ETag (a replaced
 * object fails with ESTALE, never gives another object's bytes). Flag
 * SFS_KIND_REMOTE: those reads cross the network. An object that starts
 * with EBML's magic is a MOSAIC file: handed to the mosaic kind
 * (SFS_EKIND), which reads it in S3 its own way (kind_mosaic.c).
 */
#define _GNU_SOURCE
#include "internal.h"
#include "kind.h"
#include "remote_copy.h"
#include "s3.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* The kind's state: remote_copy.h's, conn the S3 connection (sfs_s3_t). */
static inline sfs_remote_state_t *state_of(const sfs_shard_t *s) { return sfs_kind_state(s); }

static int s3_claims(const char *source) { return sfs_is_s3_source(source); }

static int s3_open(sfs_shard_t *s, sfs_error_t *err)
{
    sfs_remote_state_t *st = state_of(s);
    const char *src = s->path, *cache;
    if (s->writable)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: S3 objects are opened read-only", src);
    st->ops = &sfs_s3_ops;
    sfs_s3_t *s3 = NULL;
    uint64_t size;
    char etag[SFS_S3_ETAG_MAX];
    int rc = sfs_s3_open_object(src, &s3, &size, etag, &cache, err);
    st->conn = s3;
    if (rc != SFS_OK)
        return rc;
    char copy_path[4096], mosaic_path[4096];
    if ((rc = sfs_s3_copy_path(s3, cache, etag, size, "copy", copy_path, sizeof(copy_path), err)) != SFS_OK ||
        (rc = sfs_s3_copy_path(s3, cache, etag, size, "mosaic", mosaic_path, sizeof(mosaic_path), err)) != SFS_OK)
        return rc;
    if (access(mosaic_path, F_OK) == 0)
        return SFS_EKIND; /* a MOSAIC file, copied before: the mosaic kind's (kind_mosaic.c) */
    uint8_t raw[SFS_HEADER_END];
    for (int attempt = 0; attempt < 2; attempt++) {
        if ((rc = sfs_copy_open(s, copy_path, &st->sizes, &st->sizes_offset, raw, err)) != SFS_ENOTFOUND)
            return rc == SFS_OK && s->file_size != size
                       ? sfs_fail(err, SFS_ECORRUPT, 0, "%s: its local copy %s is of another size: remove it", src,
                                  copy_path)
                       : rc;
        if (s->fd >= 0) {
            close(s->fd);
            s->fd = -1;
        }
        if (attempt)
            break;
        uint8_t magic[4];
        if (size >= sizeof(magic) && sfs_s3_pread(s3, magic, sizeof(magic), 0) == (int64_t)sizeof(magic) &&
            memcmp(magic, "\x1a\x45\xdf\xa3", sizeof(magic)) == 0)
            return SFS_EKIND; /* EBML: a MOSAIC file */
        if ((rc = sfs_copy_build(src, &sfs_s3_ops, s3, size, copy_path, err)) != SFS_OK)
            return rc;
    }
    return sfs_fail(err, SFS_EIO, EIO, "%s: its local copy %s is unreadable after it was built", src, copy_path);
}

static void s3_close(sfs_shard_t *s) { sfs_s3_close(state_of(s)->conn); }

static const char *s3_source_error(const sfs_shard_t *s) { return sfs_s3_error(state_of(s)->conn); }

/* Object bytes are never in this host's page cache nor mapped: no
 * read_nowait (SFS_EAGAIN), no data (NULL). */
const sfs_kind_t sfs_kind_s3 = {
    .name = "s3",
    .flags = SFS_KIND_REMOTE,
    .state_size = sizeof(sfs_remote_state_t),
    .claims = s3_claims,
    .open = s3_open,
    .close = s3_close,
    .object_size = sfs_remote_object_size,
    .object_size_nowait = sfs_remote_object_size_nowait,
    .read = sfs_remote_read,
    .read_batch = sfs_remote_read_batch,
    .source_read = sfs_remote_source_read,
    .source_error = s3_source_error,
};
