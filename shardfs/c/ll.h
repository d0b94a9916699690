/*
 * ll.h — the request path of a mount: libfuse3's low-level API, in C.
 *
 * A mount's FUSE connection is served by the Session type of
 * shardfs._shardfs (py_session.c: mount, INIT, the threads that serve,
 * the kernel notifications) through the operations of py_ll_ops.c. Each
 * request is parsed and answered in C, on the thread of libfuse's loop
 * that read it; what C answers alone (OPEN, OPENDIR, IOCTL, FORGET, every
 * write, GETXATTR of a name the inode does not have, LISTXATTR of a
 * directory other than the root, and LOOKUP, GETATTR and READ of objects in
 * shards open in the process: ll_fast.c) runs with the GIL not held. The
 * rest (listings, the extended attributes of LL_XATTR_*, statfs, objects of
 * a winery database, a shard set to bring up to date) calls the mount's
 * Python handlers (shardfs.fuse.handlers.ShardFS), one at a time per
 * process.
 *
 * Objects are served in the kernel's "no-open" mode: OPEN is answered
 * ENOSYS, after which the kernel sends no OPEN, FLUSH or RELEASE for the
 * mount, keeps an object's cached pages between opens, and sends READ with
 * the inode (file handle 0). A warm open + read + close then costs no
 * request at all (Linux fs/fuse/file.c, fuse_do_open: fc->no_open).
 */
#ifndef SHARDFS_LL_H
#define SHARDFS_LL_H

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "py_module.h"
#include "ll_names.h"

#pragma GCC visibility push(hidden)

/* Request kinds counted (the counters of a worker's row in the mount's
 * shared memory), exported to Python as shardfs._shardfs.REQUEST_KINDS
 * (the names of ll_kind_names, in this order: shardfs.fuse.shared). */
enum ll_kind {
    LL_LOOKUP, LL_FORGET, LL_GETATTR, LL_OPEN, LL_READ, LL_FLUSH, LL_RELEASE, LL_OPENDIR, LL_READDIR,
    LL_RELEASEDIR, LL_STATFS, LL_ACCESS, LL_GETXATTR, LL_LISTXATTR, LL_SETATTR, LL_MKNOD, LL_MKDIR,
    LL_UNLINK, LL_RMDIR, LL_SYMLINK, LL_RENAME, LL_LINK, LL_CREATE, LL_WRITE, LL_SETXATTR,
    LL_REMOVEXATTR, LL_IOCTL, LL_OTHER, LL_KINDS
};
extern const char *const ll_kind_names[LL_KINDS];

/* What the C request path counts besides requests, one word each of a
 * worker's row (written only by C, atomically), exported to Python as
 * shardfs._shardfs.STAT_WORDS (the names of ll_stat_names, in this
 * order): lookups answered, index probes, objects pushed ahead into the
 * kernel's page cache, pushes the kernel refused, hash index probes. */
enum ll_stat { LL_STAT_LOOKUPS, LL_STAT_PROBES, LL_STAT_PUSHED, LL_STAT_PUSH_REFUSED, LL_STAT_HASH_PROBES, LL_STATS };
extern const char *const ll_stat_names[LL_STATS];

/* What a worker wrote to /dev/fuse, counted where it is written (the
 * session's writev, py_session.c), one word each of the worker's row
 * (shared memory, written only by C, atomically), exported to Python as
 * shardfs._shardfs.IO_WORDS: bytes of answers after their 16-byte
 * headers (the objects' bytes of READ answers, and the entries, attributes
 * and listings of the others); bytes of objects pushed into the kernel's
 * page cache (FUSE_NOTIFY_STORE, after its headers); error answers, but
 * for the ones that are a normal answer (ENOENT: no such name, ENODATA: no
 * such attribute, ERANGE: a buffer too small for it, ENOTTY, ENOSYS:
 * no-open mode, EROFS: a write refused). */
enum ll_io { LL_IO_REPLY_BYTES, LL_IO_PUSHED_BYTES, LL_IO_ERRORS, LL_IO_WORDS };
extern const char *const ll_io_names[LL_IO_WORDS];

struct ll_fast; /* ll_fast.c: the shards C serves alone */

typedef struct {
    PyObject_HEAD
    struct fuse_session *se;
    int mounted;
    volatile int init_done;   /* the init operation ran (INIT answered) */
    PyObject *fs;             /* the Python handlers (strong reference) */
    pthread_mutex_t py_lock;  /* held while a handler runs: one at a time */
    uid_t uid;
    gid_t gid;
    double cache_timeout;     /* seconds the kernel keeps names and attributes */
    double entry_timeout;     /* seconds it keeps the absence of a name */
    int64_t *counts;          /* [LL_KINDS] requests served, by kind */
    int64_t *hist;            /* [LL_KINDS * LL_HIST_WORDS] their durations, or NULL (not timed) */
    Py_buffer hist_view;      /* the shared memory `hist` points into (obj NULL: none) */
    int64_t own_counts[LL_KINDS];
    Py_buffer counts_view;    /* the shared memory `counts` points into, if any */
    int has_counts_view;
    Py_buffer seq_view, stats_view; /* shared memory read by ll_fast.c (obj NULL: none) */
    struct ll_fast *fast;     /* NULL until serve(): every request goes to Python */
    volatile int patch_init;  /* the INIT answer being written gets FUSE_PARALLEL_DIROPS */
    int store_max;            /* threads that may push bytes at once (ll_ioctl) */
    int storing;              /* threads pushing bytes now (atomic) */
    unsigned char *init_request; /* the kernel's INIT request as read (answer_init), or NULL */
    size_t init_request_len;  /* its bytes */
    volatile int swallow_init; /* the INIT answer being written is dropped (a session adopted) */
    int64_t *io;              /* [LL_IO_WORDS] what was written (enum ll_io), or NULL */
    Py_buffer io_view;        /* the shared memory `io` points into (obj NULL: none) */
} Session;

/* The extended attributes a mount has, answered by the handlers (which
 * take these names from the module: shardfs._shardfs.XATTR_*): on the
 * root, the requests served by kind and the stats, both JSON; on an object
 * of a shard, the shard's path and the offset of the object's first byte
 * in it, decimal. Any other name, a root's name asked of another inode and
 * an object's asked of a directory are ENODATA, answered in C (which name
 * is which and who has it: sfs_ll_xattr_name, sfs_ll_xattr_has in
 * ll_names.h). */
#define LL_XATTR_REQUESTS SFS_LL_XATTR_REQUESTS
#define LL_XATTR_STATS SFS_LL_XATTR_STATS
#define LL_XATTR_SHARD SFS_LL_XATTR_SHARD
#define LL_XATTR_OFFSET SFS_LL_XATTR_OFFSET

/* Bytes of an object pushed into the kernel's page cache when an IOCTL
 * on it is answered (see py_ll_ops.c). */
#define LL_STORE_BYTES (128 * 1024)

extern PyTypeObject SessionType, DirBufferType;

/* The operations (py_ll_ops.c); their userdata is the Session. */
extern const struct fuse_lowlevel_ops ll_ops;

/* How long requests take, per kind: LL_HIST_BUCKETS counts of requests
 * whose duration is at most ll_hist_bounds_ns[b] nanoseconds (and above
 * the bound before; the last bucket: above the last bound), then the sum
 * of their durations in nanoseconds: LL_HIST_WORDS words per kind, in
 * ll_kind order (shared memory: shardfs.fuse.shared; Prometheus's
 * shardfs_request_duration_seconds: shardfs.fuse.metrics). A duration
 * runs from the start of the operation's function to its answer (ll_done)
 * or its return. Exported as shardfs._shardfs.HIST_BOUNDS_NS. */
#define LL_HIST_BUCKETS 20
#define LL_HIST_WORDS (LL_HIST_BUCKETS + 1)
extern const int64_t ll_hist_bounds_ns[LL_HIST_BUCKETS - 1];

/* A request being counted and timed (ll_count). */
typedef struct {
    Session *s; /* NULL once recorded */
    enum ll_kind kind;
    struct timespec t0;
} ll_timer_t;

static inline ll_timer_t ll_timer_begin(Session *s, enum ll_kind kind)
{
    ll_timer_t t = {s, kind, {0, 0}};
    __atomic_fetch_add(&s->counts[kind], 1, __ATOMIC_RELAXED);
    if (s->hist)
        clock_gettime(CLOCK_MONOTONIC, &t.t0);
    return t;
}

static inline void ll_timer_end(ll_timer_t *t)
{
    Session *s = t->s;
    if (!s || !s->hist)
        return;
    t->s = NULL;
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int64_t ns = (int64_t)(t1.tv_sec - t->t0.tv_sec) * 1000000000 + (t1.tv_nsec - t->t0.tv_nsec);
    int b = 0;
    while (b < LL_HIST_BUCKETS - 1 && ns > ll_hist_bounds_ns[b])
        b++;
    int64_t *words = s->hist + (size_t)t->kind * LL_HIST_WORDS;
    __atomic_fetch_add(&words[b], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&words[LL_HIST_BUCKETS], ns, __ATOMIC_RELAXED);
}

/* Count a request of `kind` and time it until ll_done() or the end of the
 * enclosing block (a declaration: once per block, at the start of each
 * operation's function). */
#define ll_count(s, kind) \
    ll_timer_t ll_timer_ __attribute__((cleanup(ll_timer_end))) = ll_timer_begin((s), (kind))
/* The request was answered: stop its clock (what the function does after
 * the answer, such as pushing the next object ahead, is not counted). */
#define ll_done() ll_timer_end(&ll_timer_)

/* Attributes of an inode as the handlers describe it: a directory (0555,
 * 2 links) or an object (0444, 1 link) of `size` bytes, times `time_ns`
 * nanoseconds since the epoch; owned by the session's uid and gid. Used
 * by py_ll_ops.c and ll_fast.c alike: defined here, so that neither
 * depends on the other for it. */
static inline void ll_fill_attr(const Session *s, struct stat *st, uint64_t ino, int is_dir, uint64_t size,
                                int64_t time_ns)
{
    memset(st, 0, sizeof(*st));
    st->st_ino = ino;
    st->st_mode = is_dir ? (S_IFDIR | 0555) : (S_IFREG | 0444);
    st->st_nlink = is_dir ? 2 : 1;
    st->st_uid = s->uid;
    st->st_gid = s->gid;
    st->st_size = (off_t)size;
    st->st_blksize = 4096;
    /* du(1) counts st_blocks: the bytes the object takes in its shard */
    st->st_blocks = (blkcnt_t)((size + 511) / 512);
    st->st_mtim.tv_sec = time_ns / 1000000000;
    st->st_mtim.tv_nsec = time_ns % 1000000000;
    st->st_atim = st->st_ctim = st->st_mtim;
}

/* ll_fast.c: LOOKUP, GETATTR and READ answered without Python. Each
 * returns 1 when it replied, 0 when the request must go to Python (a shard
 * not open in this process, a winery mount, a shard table to apply). */
int ll_fast_lookup(Session *s, fuse_req_t req, fuse_ino_t parent, const char *name);
int ll_fast_getattr(Session *s, fuse_req_t req, fuse_ino_t ino);
int ll_fast_read(Session *s, fuse_req_t req, fuse_ino_t ino, size_t size, off_t off);
/* Push the first `want` bytes of object `ino` (open here, slot read now)
 * into the kernel's page cache for it (FUSE_NOTIFY_STORE), after its
 * IOCTL was answered: 0, or -1 when not done (not an object served here,
 * empty, unreadable, or the kernel refused). */
int ll_fast_store(Session *s, fuse_ino_t ino, size_t want);
/* After a read from the start of object `ino` (answered): when the reads
 * of this process come in the shard's slot order (the flat root's listing
 * order: tar, find | xargs) or in key order (sorted names: rsync, fan-out
 * listings; the next slots from the shard's sidecar), push the next 32
 * objects of that order (each of at most 128 KiB) into the kernel's page
 * cache, so that their reads send no READ. */
void ll_fast_push_ahead(Session *s, fuse_ino_t ino);
/* Whether inode `ino` is a directory (of the layout, or MOUNT/sha1 and
 * MOUNT/sha1_git): 1 or 0; -1 when the process cannot tell without the
 * handlers (no snapshot: a winery mount, before serve(), after a refresh
 * that failed). */
int ll_fast_is_dir(Session *s, fuse_ino_t ino);

/* A fast path reading the published table sequence at `seq` (NULL: none
 * to follow) and counting lookups, index probes, objects pushed ahead,
 * pushes the kernel refused and hash index probes in stats[0..4] (NULL:
 * its own). Returns NULL with MemoryError set. Under the GIL. */
struct ll_fast *ll_fast_new(const volatile int64_t *seq, int64_t *stats);
void ll_fast_free(struct ll_fast *fast);
/* Take the handlers' state again (fs.fast_state()), under the GIL. */
void ll_fast_refresh(struct ll_fast *fast, PyObject *fs);

#pragma GCC visibility pop

#endif
