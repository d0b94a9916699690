/*
 * probe.c — validate many Read Shards at once (probe.h).
 */
#include "probe.h"

#include "gindex.h"
#include "guard.h"
#include "internal.h"

#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char IDENTITY_TAG[] = "shardfs sidecar identity v1"; /* + its NUL: 28 bytes */

static int read_at(int fd, uint8_t *dst, uint64_t length, uint64_t offset, const char *path,
                   sfs_error_t *err)
{
    uint64_t done = 0;
    while (done < length) {
        ssize_t got = pread(fd, dst + done, length - done, (off_t)(offset + done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return sfs_fail(err, SFS_EIO, errno, "%s: cannot read %llu bytes at %llu: %s", path,
                            (unsigned long long)length, (unsigned long long)offset, strerror(errno));
        if (got == 0)
            return sfs_fail(err, SFS_EIO, EIO, "%s: short read of %llu bytes at %llu (file truncated?)",
                            path, (unsigned long long)length, (unsigned long long)offset);
        done += (uint64_t)got;
    }
    return SFS_OK;
}

int sfs_identity(const sfs_shard_t *shard, uint8_t out[SFS_IDENTITY_SIZE], sfs_error_t *err)
{
    const char *path = sfs_path(shard);
    if (strcmp(sfs_kind_name(shard), "file") != 0)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: not a Read Shard (%s): its identity covers other bytes",
                        path, sfs_kind_name(shard));
    const sfs_header_t *h = sfs_header(shard);
    uint64_t probe_hash = sfs_hash_size(shard) < SFS_IDENTITY_PROBE ? sfs_hash_size(shard) : SFS_IDENTITY_PROBE;
    uint64_t probe_index = h->index_size < SFS_IDENTITY_PROBE ? h->index_size : SFS_IDENTITY_PROBE;
    uint8_t buf[sizeof IDENTITY_TAG + SFS_HEADER_END + 8 + 3 * SFS_IDENTITY_PROBE];
    uint8_t *p = buf;
    int fd = sfs_fd(shard), rc;
    memcpy(p, IDENTITY_TAG, sizeof IDENTITY_TAG);
    p += sizeof IDENTITY_TAG;
    if ((rc = read_at(fd, p, SFS_HEADER_END, 0, path, err)) != SFS_OK)
        return rc;
    p += SFS_HEADER_END;
    uint64_t slots = sfs_slot_count(shard);
    for (int i = 0; i < 8; i++)
        *p++ = (uint8_t)(slots >> (8 * i));
    if ((rc = read_at(fd, p, probe_hash, h->hash_position, path, err)) != SFS_OK)
        return rc;
    p += probe_hash;
    if ((rc = read_at(fd, p, probe_index, h->index_position, path, err)) != SFS_OK)
        return rc;
    p += probe_index;
    if ((rc = read_at(fd, p, probe_index, h->index_position + h->index_size - probe_index, path, err)) != SFS_OK)
        return rc;
    p += probe_index;
    unsigned int len = 0;
    if (!EVP_Digest(buf, (size_t)(p - buf), out, &len, EVP_sha256(), NULL) || len != SFS_IDENTITY_SIZE)
        return sfs_fail(err, SFS_ENOMEM, 0, "%s: SHA-256 failed (OpenSSL)", path);
    return SFS_OK;
}

static void probe_one(const char *path, sfs_probe_t *p, uint64_t *budget_left)
{
    sfs_shard_t *shard = NULL;
    int rc;
    memset(p, 0, sizeof *p);
    SFS_GUARDED(rc = sfs_fail(&p->err, SFS_EIO, EIO, "%s: the file shrank while it was opened", path),
                rc = sfs_open(path, 0, &shard, &p->err));
    if (rc != SFS_OK) {
        p->status = rc;
        return;
    }
    struct stat st;
    if (fstat(sfs_fd(shard), &st) != 0) {
        rc = sfs_fail(&p->err, SFS_EIO, errno, "%s: fstat: %s", path, strerror(errno));
    } else if ((rc = sfs_identity(shard, p->identity, &p->err)) == SFS_OK) {
        p->dev = (uint64_t)st.st_dev;
        p->ino = (uint64_t)st.st_ino;
        p->rdev = (uint64_t)st.st_rdev;
        p->mode = (uint64_t)st.st_mode;
        p->size = (uint64_t)st.st_size;
        p->mtime_sec = (int64_t)st.st_mtim.tv_sec;
        p->mtime_nsec = (int64_t)st.st_mtim.tv_nsec;
        p->ctime_sec = (int64_t)st.st_ctim.tv_sec;
        p->ctime_nsec = (int64_t)st.st_ctim.tv_nsec;
        p->objects_count = sfs_header(shard)->objects_count;
        p->slot_count = sfs_slot_count(shard);
        p->extent = sfs_extent(shard);
        sfs_error_t perr;
        if (*budget_left >= p->slot_count) {
            if (sfs_shard_key_prefixes(shard, &p->prefixes, &p->prefix_count, &perr) == SFS_OK) {
                *budget_left -= p->slot_count;
            } else {
                p->prefixes = NULL; /* the caller takes them itself (and meets the error) */
                p->prefix_count = 0;
            }
        }
    }
    p->status = rc;
    sfs_close(shard);
}

void sfs_probe_many(const char *const *paths, size_t n, sfs_probe_t *out, uint64_t prefix_budget)
{
    for (size_t i = 0; i < n; i++)
        probe_one(paths[i], &out[i], &prefix_budget);
}
