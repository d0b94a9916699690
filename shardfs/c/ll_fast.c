/*
 * ll_fast.c — LOOKUP, GETATTR and READ of a mount answered in C alone
 * (ll.h), with the GIL not held, and the objects pushed ahead of readers.
 *
 * What a request needs is read from one immutable snapshot of the
 * process's shard set (ll_snapshot.h), built after each Python handler
 * (shardfs.fuse.handlers.ShardFS.fast_state, ll_fast_refresh) and
 * published by one atomic pointer exchange: the shards open in the
 * process by number with their mtimes, the global index levels and their
 * maps, the per-shard filters, the hash indexes, the layout, the shard
 * table sequence the handlers applied. A request takes a reference on the
 * snapshot, never a lock, and reads it while it waits for the device; the
 * handlers publish a new one meanwhile without waiting for it.
 *
 * A request goes to Python instead (returns 0) when: the mount follows a
 * winery database (hidden keys, objects only in PostgreSQL: no snapshot);
 * the coordinator published a shard table the handlers have not applied
 * yet (they apply it first: an inode never names an object of a table the
 * process has not seen, the rule of shardfs.fuse.shared); a candidate shard
 * is not open in the process (the handlers open it, within the bound on
 * open shards); the inode's shard is not served (removed: the handlers know
 * what may still be read); a slot or size field is corrupt or the file
 * shrank (the handlers log it and answer EIO); the name is not a
 * 64-character key (".", "..", fan-out directories).
 */
#include "ll.h"
#include "ll_names.h"
#include "ll_snapshot.h"
#include "ll_resolve.h"
#include "ll_guarded.h"
#include "ll_ahead.h"

#include <stdlib.h>

struct ll_fast {
    ll_current_t current;     /* the published snapshot (ll_snapshot.h) */
    PyObject *state;          /* the fast_state() it was built from (strong reference), or NULL */
    OpenShards *open;         /* its open_shards (strong reference), or NULL */
    uint64_t generation;      /* sfs_table_generation it was built at */
    const volatile int64_t *seq; /* the published sequence (shared memory), or NULL */
    int64_t *stats;           /* [LL_STATS] (ll.h: enum ll_stat; shared memory) */
    int64_t own_stats[LL_STATS];
    struct ll_ahead ahead;    /* pushes ahead of reads in listing order (ll_ahead.h) */
};

struct ll_fast *ll_fast_new(const volatile int64_t *seq, int64_t *stats)
{
    struct ll_fast *f = PyMem_Calloc(1, sizeof(*f));
    if (!f) {
        PyErr_NoMemory();
        return NULL;
    }
    f->seq = seq;
    f->stats = stats ? stats : f->own_stats;
    ll_ahead_init(&f->ahead);
    return f;
}

/* After the loop ended: no request runs any more. */
void ll_fast_free(struct ll_fast *f)
{
    if (!f)
        return;
    ll_snapshot_publish(&f->current, NULL);
    Py_CLEAR(f->state);
    Py_CLEAR(f->open);
    ll_ahead_destroy(&f->ahead);
    PyMem_Free(f);
}

/* Fold the marks of use the requests left in the current snapshot into
 * the open shards' recency marks (OpenShards.touched), under the GIL. */
static void fold_used(struct ll_fast *f)
{
    OpenShards *open = f->open;
    if (!open)
        return;
    ll_snapshot_t *snap = ll_snapshot_acquire(&f->current);
    for (size_t i = 0; snap && i < snap->nshards; i++)
        if (__atomic_exchange_n(&snap->used[i], 0, __ATOMIC_RELAXED) && (Py_ssize_t)i < open->cap)
            open->used[i] = 1;
    ll_snapshot_release(snap);
}

/* Take the handlers' state again (under the GIL, the handlers' lock
 * held): fs.fast_state() -> None (nothing is answered here) or the
 * SnapshotState ll_snapshot_build reads. A new snapshot is built and
 * published only when it or what it holds changed (sfs_table_generation). Errors
 * are reported (sys.unraisablehook) and leave no snapshot published:
 * every request goes to the handlers until the next refresh. */
void ll_fast_refresh(struct ll_fast *f, PyObject *fs)
{
    if (!f)
        return;
    fold_used(f);
    PyObject *st = PyObject_CallMethod(fs, "fast_state", NULL);
    if (st && st == f->state && f->generation == sfs_table_generation) {
        Py_DECREF(st);
        return;
    }
    ll_snapshot_t *snap = NULL;
    PyObject *open = NULL;
    if (!st || (st != Py_None && (!(snap = ll_snapshot_build(st)) ||
                                  !(open = PyObject_GetAttrString(st, "open_shards"))))) {
        PyErr_WriteUnraisable(fs);
        Py_CLEAR(st);
        ll_snapshot_discard(snap);
        snap = NULL;
    }
    f->generation = sfs_table_generation;
    ll_snapshot_publish(&f->current, snap);
    Py_XSETREF(f->state, st);
    Py_XSETREF(f->open, (OpenShards *)open);
    ll_ahead_forget(&f->ahead); /* shard numbers may name other shards now */
}

/* -------------------------------------------------------------- requests */

/* A reference on the snapshot if the fast path may answer now (one is
 * published and the handlers applied the coordinator's latest table), else
 * NULL: the request goes to the handlers. */
static ll_snapshot_t *fast_begin(struct ll_fast *f)
{
    if (!f)
        return NULL;
    ll_snapshot_t *snap = ll_snapshot_acquire(&f->current);
    /* `applied` is ahead of the sequence only while a new mount's first
     * table is written: the workers were forked with its shard set. */
    if (snap && (!f->seq || __atomic_load_n(f->seq, __ATOMIC_ACQUIRE) <= snap->applied))
        return snap;
    ll_snapshot_release(snap);
    return NULL;
}

static void count_lookup(struct ll_fast *f, const ll_found_t *found)
{
    if (found->by_hash) {
        __atomic_fetch_add(&f->stats[LL_STAT_HASH_PROBES], (int64_t)found->probed, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_add(&f->stats[LL_STAT_LOOKUPS], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&f->stats[LL_STAT_PROBES], (int64_t)found->probed, __ATOMIC_RELAXED);
    }
}

static void fast_entry(Session *s, const ll_found_t *found, struct fuse_entry_param *e)
{
    memset(e, 0, sizeof(*e));
    e->entry_timeout = e->attr_timeout = s->entry_timeout; /* negative unless found */
    if (!found)
        return;
    e->ino = found->ino;
    ll_fill_attr(s, &e->attr, found->ino, 0, found->size, found->mtime_ns);
    e->entry_timeout = e->attr_timeout = s->cache_timeout;
}

/* Each request below lets its snapshot go before it replies: a thread
 * preempted in or after the reply's system call must not keep the shards
 * the handlers closed meanwhile open (test_open_bound.py). */

int ll_fast_lookup(Session *s, fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ll_snapshot_t *snap = fast_begin(s->fast);
    if (!snap)
        return 0;
    ll_found_t found;
    enum ll_resolution res = ll_resolve_name(snap, parent, name, 0, &found);
    int replied = res == LL_FOUND || res == LL_ABSENT;
    struct fuse_entry_param e;
    if (replied) {
        if (res == LL_FOUND && found.shard) /* the READ that follows asks for up to 128 KiB of it: start it now */
            sfs_prefetch(found.shard, found.offset, found.size < LL_PREFETCH_BYTES ? found.size : LL_PREFETCH_BYTES);
        fast_entry(s, res == LL_FOUND ? &found : NULL, &e);
        count_lookup(s->fast, &found);
    }
    ll_found_release(&found);
    ll_snapshot_release(snap);
    if (replied)
        fuse_reply_entry(req, &e);
    return replied;
}

/* The answer to a GETATTR or READ of an inode that names no object now:
 * ENOENT (an empty or deleted slot), ESTALE (a shard no longer served);
 * 1 when replied, 0 when the handlers must answer. */
static int reply_no_object(fuse_req_t req, enum ll_resolution res)
{
    if (res != LL_ABSENT && res != LL_STALE)
        return 0;
    fuse_reply_err(req, res == LL_ABSENT ? ENOENT : ESTALE);
    return 1;
}

int ll_fast_getattr(Session *s, fuse_req_t req, fuse_ino_t ino)
{
    ll_snapshot_t *snap = fast_begin(s->fast);
    if (!snap)
        return 0;
    struct stat st;
    uint64_t prefix;
    ll_found_t found;
    enum ll_resolution res = LL_FOUND;
    if (sfs_ll_split_dir(&snap->layout, ino, &prefix) >= 0) {
        ll_fill_attr(s, &st, ino, 1, 0, snap->dir_time_ns);
    } else {
        res = ll_resolve_inode(snap, ino, LL_INODE_ATTR, &found);
        if (res == LL_FOUND)
            ll_fill_attr(s, &st, ino, 0, found.size, found.mtime_ns);
        ll_found_release(&found);
    }
    ll_snapshot_release(snap);
    if (res != LL_FOUND)
        return reply_no_object(req, res);
    fuse_reply_attr(req, &st, s->cache_timeout);
    return 1;
}

/* The first READ of an object whose bytes are decoded (SFS_KIND_DECODES)
 * decodes it whole when it is at most LL_DECODE_WHOLE_MAX bytes, answers
 * its piece and stores the rest into the page cache: the READs that follow
 * are served by the kernel instead of each decoding the object from its
 * start. Not below LL_DECODE_WHOLE_MIN: the kind decodes such an object
 * once into its own cache and answers each READ from there (kind_mosaic.c,
 * 32 MiB), and pages the kernel filled from READs read faster than pages
 * stored by a notification (the `mix` set through a mount, warm: 0.8x the
 * Read Shard with stores, 1.0x without; cold 0.68x and 0.8x). */
#define LL_DECODE_WHOLE_MIN ((32u << 20) + 1)
#define LL_DECODE_WHOLE_MAX (128u << 20)

int ll_fast_read(Session *s, fuse_req_t req, fuse_ino_t ino, size_t want, off_t offset)
{
    ll_snapshot_t *snap = offset < 0 ? NULL : fast_begin(s->fast);
    if (!snap)
        return 0;
    ll_found_t found;
    enum ll_resolution res = ll_resolve_inode(snap, ino, LL_INODE_READ, &found);
    size_t n = 0, len = 0;
    char *buf = NULL;
    int rc = SFS_OK, remote = 0;
    sfs_shard_t *whole = NULL; /* the rest of the object is stored after the reply */
    if (res == LL_FOUND) {
        n = len = sfs_ll_read_length(found.size, (uint64_t)offset, want);
        if (offset == 0 && n < found.size && found.size >= LL_DECODE_WHOLE_MIN && found.size <= LL_DECODE_WHOLE_MAX &&
            found.shard && (sfs_kind_flags(found.shard) & SFS_KIND_DECODES)) {
            /* a store waits for the locks of pages other READs are
             * answering: a thread stays free to answer them (ll_ioctl) */
            if (__atomic_add_fetch(&s->storing, 1, __ATOMIC_ACQ_REL) <= s->store_max)
                len = found.size;
            else
                __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
        }
        buf = len ? malloc(len) : NULL;
        rc = len && !buf ? SFS_ENOMEM : ll_resolve_read(&found, (uint64_t)offset, buf, len);
        remote = found.shard && (sfs_kind_flags(found.shard) & SFS_KIND_REMOTE) != 0;
        if (len > n && rc == SFS_OK)
            whole = sfs_ref(found.shard);
        else if (len > n)
            __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
    }
    ll_found_release(&found);
    ll_snapshot_release(snap);
    int replied = 1;
    if (res != LL_FOUND)
        replied = reply_no_object(req, res);
    else if (rc == SFS_OK) {
        fuse_reply_buf(req, buf, n);
        if (whole) {
            ll_store(s, whole, NULL, ino, found.offset, found.size, buf + n, n, found.size - n);
            sfs_close(whole);
            __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
        }
    }
    else if (rc == SFS_ENOMEM)
        fuse_reply_err(req, ENOMEM);
    else if (rc == SFS_ENOTFOUND)
        fuse_reply_err(req, ENOENT); /* deleted since its record answered */
    else if (rc == SFS_ESTALE)
        fuse_reply_err(req, ESTALE); /* its file is gone or replaced since its record answered */
    else if (rc == SFS_EIO && remote)
        /* the cluster failed or timed out (rbd.h): asking it again from
         * the Python handler would double the wait */
        fuse_reply_err(req, EIO);
    else
        replied = 0; /* the handlers log it */
    free(buf);
    return replied;
}

int ll_fast_store(Session *s, fuse_ino_t ino, size_t want)
{
    ll_snapshot_t *snap = fast_begin(s->fast);
    ll_found_t found;
    /* Not for an object of a remote kind (an RBD image): this ioctl comes
     * at every open by CPython, cached or not, and a push reads the object
     * again from the cluster; its READ, if its pages are not cached, takes
     * the read the LOOKUP started (rbd.h). */
    found.held = NULL;
    int stored = snap && ll_resolve_inode(snap, ino, LL_INODE_ATTR, &found) == LL_FOUND &&
                         !(found.shard && (sfs_kind_flags(found.shard) & SFS_KIND_REMOTE))
                     ? ll_push_found(s, &found, ino, found.size < want ? found.size : want)
                     : -1;
    ll_found_release(&found);
    ll_snapshot_release(snap);
    return stored;
}


void ll_fast_push_ahead(Session *s, fuse_ino_t ino)
{
    struct ll_fast *f = s->fast;
    uint32_t number, slot;
    if (!f || !sfs_ll_object_inode(ino, &number, &slot))
        return;
    /* see ll_ioctl: a thread must stay free to serve READs */
    if (__atomic_add_fetch(&s->storing, 1, __ATOMIC_ACQ_REL) <= s->store_max) {
        ll_snapshot_t *snap = fast_begin(f);
        if (snap)
            ll_ahead_push(&f->ahead, s, snap, number, slot, f->stats);
        ll_snapshot_release(snap);
    }
    __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
}

int ll_fast_is_dir(Session *s, fuse_ino_t ino)
{
    /* The layout and the hash directories are the mount's, the same in
     * every snapshot: one taken before the latest shard table tells too. */
    ll_snapshot_t *snap = s->fast ? ll_snapshot_acquire(&s->fast->current) : NULL;
    if (!snap)
        return -1;
    uint64_t prefix;
    int dir = sfs_ll_split_dir(&snap->layout, ino, &prefix) >= 0 || ino == snap->hashes[0].dir_ino ||
              ino == snap->hashes[1].dir_ino;
    ll_snapshot_release(snap);
    return dir;
}
