/*
 * output.c — write a new file so that it appears complete or not at all,
 * for the shard writer (writer.c) and the sidecar builder (sidecar.c).
 *
 * The file is created unnamed (O_TMPFILE) in the target's directory, so a
 * process killed at any point (kill -9, power loss) leaves nothing behind;
 * where the file system lacks O_TMPFILE, it is a named .<name>.tmp-XXXXXX
 * (mkostemp), which the caller removes on error. Once written and synced
 * it is published: linked at the target when nothing is there, else linked
 * under a temporary name and renamed over the target; then the directory
 * is fsync'ed.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* "<dir>/.<name>.tmp-XXXXXX" for `path` (malloc'ed), or NULL. */
static char *temp_name(const char *path)
{
    char *copy = strdup(path), *base_copy = strdup(path);
    size_t len = strlen(path) + 32;
    char *out = malloc(len);
    if (copy && base_copy && out) {
        snprintf(out, len, "%s/.%s.tmp-XXXXXX", dirname(copy), basename(base_copy));
    } else {
        free(out);
        out = NULL;
    }
    free(copy);
    free(base_copy);
    return out;
}

int sfs_output_create(const char *path, mode_t mode, int *fd, char **tmp_path, sfs_error_t *err)
{
    *tmp_path = NULL;
#ifdef O_TMPFILE
    char *copy = strdup(path);
    if (!copy)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    *fd = open(dirname(copy), O_TMPFILE | O_RDWR | O_CLOEXEC, mode);
    free(copy);
    if (*fd >= 0)
        return SFS_OK;
    /* Not supported here (EOPNOTSUPP, EISDIR on old kernels...): a named
     * file; real errors (ENOENT, EACCES...) are reported by mkostemp. */
#endif
    *tmp_path = temp_name(path);
    if (!*tmp_path)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    *fd = mkostemp(*tmp_path, O_CLOEXEC);
    if (*fd < 0) {
        int e = errno;
        free(*tmp_path);
        *tmp_path = NULL;
        return sfs_fail(err, SFS_EIO, e, "%s: creating a temporary file in its directory: %s",
                        path, strerror(e));
    }
    if (mode != 0600 && fchmod(*fd, mode) < 0) {
        /* keep mkstemp's 0600 */
    }
    return SFS_OK;
}

/* Give the unnamed file open on fd the name `name`: linkat of
 * /proc/self/fd/N (AT_SYMLINK_FOLLOW), else of the descriptor itself
 * (AT_EMPTY_PATH: needs CAP_DAC_READ_SEARCH, but no /proc). Never replaces
 * a file: EEXIST. 0, or -1 with errno. */
static int link_unnamed(int fd, const char *name)
{
    char proc[64];
    snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0)
        return 0;
    int e = errno;
    if (e == EEXIST)
        return -1;
    if (linkat(fd, "", AT_FDCWD, name, AT_EMPTY_PATH) == 0)
        return 0;
    if (e == ENOENT || errno == EEXIST) /* no /proc: the second answer counts */
        e = errno;
    errno = e;
    return -1;
}

int sfs_output_publish(int fd, char **tmp_path, const char *path)
{
    if (!*tmp_path) {
        if (link_unnamed(fd, path) == 0)
            return 0;
        if (errno != EEXIST)
            return -1;
        static const char digits[] = "abcdefghijklmnopqrstuvwxyz0123456789";
        for (int attempt = 0; !*tmp_path; attempt++) {
            char *name = temp_name(path);
            if (!name) {
                errno = ENOMEM;
                return -1;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            uint64_t r = (uint64_t)ts.tv_nsec * 1000003u ^ (uint64_t)ts.tv_sec ^
                         (uint64_t)getpid() << 20 ^ (uint64_t)attempt * 7919u;
            char *x = name + strlen(name) - 6;
            for (int i = 0; i < 6; i++, r /= 36)
                x[i] = digits[r % 36];
            if (link_unnamed(fd, name) == 0) {
                *tmp_path = name;
                break;
            }
            int e = errno;
            free(name);
            if (e != EEXIST || attempt == 99) {
                errno = e;
                return -1;
            }
        }
    }
    if (rename(*tmp_path, path) < 0)
        return -1;
    free(*tmp_path);
    *tmp_path = NULL;
    return 0;
}

void sfs_sync_directory(const char *path)
{
    char *copy = strdup(path);
    if (!copy)
        return;
    int dfd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(copy);
}

void sfs_output_discard(int fd, char **tmp_path)
{
    if (*tmp_path) {
        unlink(*tmp_path);
        free(*tmp_path);
        *tmp_path = NULL;
    }
    if (fd >= 0)
        close(fd);
}
