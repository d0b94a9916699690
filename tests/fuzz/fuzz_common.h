/*
 * fuzz_common.h — shared by the fuzz harnesses (tests/fuzz/fuzz_*.c).
 *
 * The library opens files by path, so each input is written to one
 * memfd (created once, rewritten for every input) and opened as
 * /proc/self/fd/N: no disk, no file left behind, the same code paths as a
 * regular file (fstat says S_ISREG, mmap works), or to an unlinked file on
 * disk for the paths that need preadv2(RWF_NOWAIT) (fuzz_disk_path).
 *
 * FUZZ_ASSERT checks an invariant the API documents: a failure aborts, so
 * libFuzzer (or the replay driver) reports it like a crash.
 */
#ifndef SHARDFS_FUZZ_COMMON_H
#define SHARDFS_FUZZ_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FUZZ_ASSERT(cond)                                                                          \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__);   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static int fuzz_fd = -1, fuzz_disk_fd = -1;
static char fuzz_path[64], fuzz_disk_path_buf[64];

/* Overwrite in place, then cut to size: no page is freed and allocated
 * again for every input (cheaper than truncating to 0 first). */
static inline void fuzz_write(int fd, const uint8_t *data, size_t size)
{
    size_t done = 0;
    while (done < size) {
        ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            perror("pwrite");
            abort();
        }
        done += (size_t)n;
    }
    if (ftruncate(fd, (off_t)size) < 0) {
        perror("ftruncate");
        abort();
    }
}

/* Write the input to the memfd; returns its /proc/self/fd path. */
static inline const char *fuzz_input_path(const uint8_t *data, size_t size)
{
    if (fuzz_fd < 0) {
        fuzz_fd = memfd_create("shardfs-fuzz", MFD_CLOEXEC);
        if (fuzz_fd < 0) {
            perror("memfd_create");
            abort();
        }
        snprintf(fuzz_path, sizeof(fuzz_path), "/proc/self/fd/%d", fuzz_fd);
    }
    fuzz_write(fuzz_fd, data, size);
    return fuzz_path;
}

/* The same in an unlinked file of $FUZZ_TMPDIR (default /var/tmp): on a
 * disk file system preadv2(RWF_NOWAIT) works (tmpfs, and so a memfd,
 * answers EOPNOTSUPP here), so the _nowait paths past the page-cache read
 * run. The bytes stay in the page cache; nothing is synced. Falls back to
 * the memfd when no file can be made there. */
static inline const char *fuzz_disk_path(const uint8_t *data, size_t size)
{
    if (fuzz_disk_fd == -1) {
        const char *dir = getenv("FUZZ_TMPDIR");
        char tmpl[4096];
        snprintf(tmpl, sizeof(tmpl), "%s/shardfs-fuzz-XXXXXX", dir && *dir ? dir : "/var/tmp");
        fuzz_disk_fd = mkostemp(tmpl, O_CLOEXEC);
        if (fuzz_disk_fd >= 0) {
            unlink(tmpl);
            snprintf(fuzz_disk_path_buf, sizeof(fuzz_disk_path_buf), "/proc/self/fd/%d",
                     fuzz_disk_fd);
        } else {
            fuzz_disk_fd = -2; /* do not try again */
        }
    }
    if (fuzz_disk_fd < 0)
        return fuzz_input_path(data, size);
    fuzz_write(fuzz_disk_fd, data, size);
    return fuzz_disk_path_buf;
}

static inline uint64_t fuzz_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline uint32_t fuzz_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#endif
