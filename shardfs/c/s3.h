/*
 * s3.h — objects of an S3 bucket read with ranged GETs (libcurl).
 *
 * A shard source "s3://BUCKET/KEY" names an object of an S3 server whose
 * bytes are a Read Shard (kind_s3.c, the "s3" kind: its header, index and
 * hash sections and every slot's size are kept in a local copy,
 * remote_copy.h, so a lookup never asks the server; an object's bytes cost
 * one ranged GET).
 *
 * Settings, from the process's environment at sfs_s3_new() (the variables
 * of the AWS command line and SDKs), overridden by sfs_s3_configure():
 *   AWS_ENDPOINT_URL (or AWS_ENDPOINT)  the server, "http[s]://HOST[:PORT]";
 *       unset: https://s3.REGION.amazonaws.com. Requests are path-style:
 *       ENDPOINT/BUCKET/KEY (what radosgw and MinIO answer).
 *   AWS_REGION (or AWS_DEFAULT_REGION)  default "us-east-1"
 *   AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY[, AWS_SESSION_TOKEN]
 *       requests are signed (AWS Signature Version 4, by libcurl's
 *       CURLOPT_AWS_SIGV4); without them, or with AWS_SKIP_SIGNATURE=true,
 *       requests are anonymous (a public bucket).
 * Each request ends within the configured timeout (default 30 s: connect
 * and transfer), failing with ETIMEDOUT: a server gone or stopped never
 * hangs a reader.
 *
 * Identity: sfs_s3_head() gives the object's size and ETag; after
 * sfs_s3_expect(), every GET carries "If-Match: ETAG", so an object
 * replaced under its key fails with ESTALE instead of giving another
 * object's bytes.
 *
 * Thread safety: any number of threads may read through one sfs_s3_t at
 * once; it keeps a pool of libcurl handles (each with its own kept-alive
 * connection, TCP_NODELAY) under a mutex held only to take or give one.
 *
 * Errors: SFS_OK (0) or a negative sfs_status of shard.h with a one-line
 * message naming the source; reads return -errno: ENOENT (no such object
 * or bucket: 404), EACCES (403), ESTALE (412: replaced), ETIMEDOUT,
 * ECONNREFUSED, EIO (any other failure; sfs_s3_error() tells which).
 */
#ifndef SHARDFS_S3_H
#define SHARDFS_S3_H

#include <stddef.h>
#include <stdint.h>

#include "remote_copy.h"
#include "shard.h"

#define SFS_S3_PREFIX "s3://"
#define SFS_S3_DEFAULT_TIMEOUT 30 /* seconds */
#define SFS_S3_ETAG_MAX 128       /* bytes of an ETag, NUL included */

typedef struct sfs_s3 sfs_s3_t;

/* sfs_s3_pread and sfs_s3_pread_many as remote_copy.h's operations (conn:
 * an sfs_s3_t): what the s3 and mosaic kinds copy and read through. */
extern const sfs_remote_ops_t sfs_s3_ops;

/* 1 when `source` starts with "s3://". */
int sfs_is_s3_source(const char *source);

/* Process-wide settings over the environment's (NULL or 0: keep): the
 * endpoint URL, the region, a timeout in seconds, the cache directory of
 * local copies. Taken by the next sfs_s3_new(). SFS_OK or SFS_ENOMEM. */
int sfs_s3_configure(const char *endpoint, const char *region, unsigned timeout, const char *cache_dir);

/* The cache directory set by sfs_s3_configure (NULL when none). */
const char *sfs_s3_cache_dir(void);

/* A connection to "s3://BUCKET/KEY" (nothing is asked of the server yet).
 * SFS_EINVAL for a malformed source, SFS_ENOMEM. */
int sfs_s3_new(const char *source, sfs_s3_t **out, sfs_error_t *err);
void sfs_s3_close(sfs_s3_t *s); /* NULL accepted */

/* The bucket and the key of the connection's source. */
const char *sfs_s3_bucket(const sfs_s3_t *s);
const char *sfs_s3_key(const sfs_s3_t *s);

/* HEAD of the object: its size in bytes and ETag (quotes included, as
 * the server gives it). SFS_OK; SFS_EIO with errno as the reads'. */
int sfs_s3_head(sfs_s3_t *s, uint64_t *size, char etag[SFS_S3_ETAG_MAX], sfs_error_t *err);

/* Every later GET asks for this ETag (If-Match). */
void sfs_s3_expect(sfs_s3_t *s, const char *etag);

/* `len` bytes at byte `off` of the object into buf (one ranged GET): the
 * bytes read (fewer only at the object's end), or -errno. */
int64_t sfs_s3_pread(sfs_s3_t *s, void *buf, size_t len, uint64_t off);

/* n ranged GETs in flight at once (libcurl's multi interface): got[i]
 * bytes or -errno each; returns 0 (or -ENOMEM when none could be asked). */
int sfs_s3_pread_many(sfs_s3_t *s, size_t n, const uint64_t *offs, const size_t *lens, void *const *bufs,
                      int64_t *got);

/* A remote kind's open: sfs_s3_new, the cache directory of local copies
 * into *cache (SFS_EINVAL when none is set), the HEAD's size and ETag, and
 * sfs_s3_expect of that ETag. *out is set (the caller closes it) whenever
 * sfs_s3_new succeeded. */
int sfs_s3_open_object(const char *source, sfs_s3_t **out, uint64_t *size, char etag[SFS_S3_ETAG_MAX],
                       const char **cache, sfs_error_t *err);

/* The path of the local copy of the connection's object as (etag, size)
 * name it: <cache>/s3/<bucket>/<key>.<ETag>-<size>.<suffix>, every byte of
 * bucket, key and ETag outside [A-Za-z0-9._-] written %XX. SFS_OK, or
 * SFS_EINVAL when longer than cap. */
int sfs_s3_copy_path(const sfs_s3_t *s, const char *cache, const char *etag, uint64_t size, const char *suffix,
                     char *out, size_t cap, sfs_error_t *err);

/* The one-line message of the connection's last failed request, "" when
 * none (valid until the next call on s). */
const char *sfs_s3_error(sfs_s3_t *s);

#endif
