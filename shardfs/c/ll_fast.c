/*
 * ll_fast.c — LOOKUP, GETATTR and READ of a mount answered in C alone
 * (ll.h), with the GIL not held.
 *
 * What a request needs is read from the process's shard set as the Python
 * handlers left it (shardfs.fuse.handlers.ShardFS.fast_state): the shards
 * open in the process (OpenShards, by number), the global index levels and
 * their maps (level shard index -> shard number), the per-shard filters
 * (SidecarSet), each shard's mtime, the layout. Those objects change only
 * while a handler runs, and a handler runs only with the table lock held
 * for writing (py_enter in py_ll_ops.c); a request answered here holds it
 * for reading. After each handler the snapshot is taken again (ll_fast_refresh,
 * under the GIL), so the answer here is the one the handlers would give.
 *
 * A request goes to Python instead (returns 0) when: the mount follows a
 * winery database (hidden keys, objects only in PostgreSQL); the
 * coordinator published a shard table this process has not applied yet
 * (the handlers apply it first: an inode never names an object of a table
 * the process has not seen); a candidate shard is not open in the process
 * (the handlers open it, within the bound on open shards); the inode's
 * shard is not served (removed: the handlers know what may still be read);
 * a slot or size field is corrupt or the file shrank (the handlers log it
 * and answer EIO); the name is not a 64-character key (".", "..",
 * fan-out directories).
 */
#include "ll.h"
#include "ll_names.h"

#include <stdlib.h>

/* Bytes of an object read ahead when it is looked up: the READ that
 * follows asks for up to 128 KiB of it. */
#define PREFETCH_BYTES (128 * 1024)

struct ll_fast {
    pthread_rwlock_t lock;
    PyObject *state;          /* the last fast_state() tuple (strong reference), or NULL */
    int enabled;
    OpenShards *open;         /* borrowed from `state` */
    SidecarSet *filters;      /* borrowed from `state`, NULL when none */
    Py_ssize_t nlevels;
    sfs_gindex_t **levels;    /* [nlevels] */
    Py_buffer *views;         /* [nlevels] maps, then [nlevels] mtimes */
    const int64_t *mtimes;    /* [nmtimes]: shard number -> mtime in ns, -1 when not served */
    size_t nmtimes;
    sfs_ll_layout_t layout;
    int64_t dir_time_ns;
    int64_t applied;          /* the shard table sequence the handlers applied */
    const volatile int64_t *seq; /* the published sequence (shared memory), or NULL */
    int64_t *stats;           /* [2]: lookups, index probes (shared memory) */
    int64_t own_stats[2];
};

static void fast_release_views(struct ll_fast *f)
{
    for (Py_ssize_t i = 0; f->views && i <= f->nlevels; i++)
        if (f->views[i].obj)
            PyBuffer_Release(&f->views[i]);
    PyMem_Free(f->views);
    PyMem_Free(f->levels);
    f->views = NULL;
    f->levels = NULL;
    f->nlevels = 0;
    f->mtimes = NULL;
    f->nmtimes = 0;
    f->enabled = 0;
}

struct ll_fast *ll_fast_new(const volatile int64_t *seq, int64_t *stats)
{
    struct ll_fast *f = PyMem_Calloc(1, sizeof(*f));
    if (!f) {
        PyErr_NoMemory();
        return NULL;
    }
    /* writers first: a handler waiting for the lock is not starved by a
     * stream of requests answered here */
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&f->lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    f->seq = seq;
    f->stats = stats ? stats : f->own_stats;
    return f;
}

void ll_fast_free(struct ll_fast *f)
{
    if (!f)
        return;
    fast_release_views(f);
    Py_CLEAR(f->state);
    pthread_rwlock_destroy(&f->lock);
    PyMem_Free(f);
}

void ll_fast_write_lock(struct ll_fast *f)
{
    if (f)
        pthread_rwlock_wrlock(&f->lock);
}

void ll_fast_write_unlock(struct ll_fast *f)
{
    if (f)
        pthread_rwlock_unlock(&f->lock);
}

/* Take the handlers' state again (under the GIL and the write lock):
 * fs.fast_state() -> None (nothing is answered here) or (open_shards,
 * filters, levels, maps, mtimes, prefix_lengths, dir_time_ns, applied).
 * The same tuple as last time costs one call. Errors are reported and
 * leave the fast path off until the next refresh. */
void ll_fast_refresh(struct ll_fast *f, PyObject *fs)
{
    if (!f)
        return;
    PyObject *st = PyObject_CallMethod(fs, "fast_state", NULL);
    if (!st) {
        PyErr_WriteUnraisable(fs);
        fast_release_views(f);
        Py_CLEAR(f->state);
        return;
    }
    if (st == f->state) {
        Py_DECREF(st);
        if (f->enabled && f->filters && f->filters->dirty && sidecar_set_pack(f->filters) < 0) {
            PyErr_WriteUnraisable(fs);
            f->enabled = 0;
        }
        return;
    }
    fast_release_views(f);
    Py_XSETREF(f->state, st);
    if (st == Py_None)
        return;
    PyObject *open, *filters, *levels, *maps, *mtimes, *prefixes;
    long long dir_time_ns, applied;
    if (!PyArg_ParseTuple(st, "O!OO!O!OO!LL", &OpenShardsType, &open, &filters, &PyTuple_Type, &levels,
                          &PyTuple_Type, &maps, &mtimes, &PyTuple_Type, &prefixes, &dir_time_ns, &applied))
        goto fail;
    Py_ssize_t n = PyTuple_GET_SIZE(levels), depth = PyTuple_GET_SIZE(prefixes);
    if (PyTuple_GET_SIZE(maps) != n || depth > SFS_LL_MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "fast_state(): levels and maps differ, or too deep a layout");
        goto fail;
    }
    if (filters != Py_None && !PyObject_TypeCheck(filters, &SidecarSetType)) {
        PyErr_SetString(PyExc_TypeError, "fast_state(): filters must be a SidecarSet or None");
        goto fail;
    }
    f->levels = PyMem_Calloc((size_t)n + 1, sizeof(*f->levels));
    f->views = PyMem_Calloc((size_t)n + 1, sizeof(*f->views));
    if (!f->levels || !f->views) {
        PyErr_NoMemory();
        goto fail;
    }
    f->nlevels = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *lv = PyTuple_GET_ITEM(levels, i);
        if (!PyObject_TypeCheck(lv, &GlobalIndexType) || !gindex_ready((GlobalIndex *)lv)) {
            PyErr_SetString(PyExc_TypeError, "fast_state(): levels must be open GlobalIndex objects");
            goto fail;
        }
        f->levels[i] = ((GlobalIndex *)lv)->g;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(maps, i), &f->views[i], PyBUF_SIMPLE) < 0)
            goto fail;
    }
    if (PyObject_GetBuffer(mtimes, &f->views[n], PyBUF_SIMPLE) < 0)
        goto fail;
    f->mtimes = f->views[n].buf;
    f->nmtimes = (size_t)f->views[n].len / sizeof(int64_t);
    int nhex[SFS_LL_MAX_DEPTH];
    for (Py_ssize_t d = 0; d < depth; d++) {
        nhex[d] = _PyLong_AsInt(PyTuple_GET_ITEM(prefixes, d));
        if (nhex[d] == -1 && PyErr_Occurred())
            goto fail;
    }
    if (sfs_ll_layout_init(&f->layout, nhex, (int)depth) < 0) {
        PyErr_SetString(PyExc_ValueError, "fast_state(): prefix lengths must grow, 1..7 hex digits");
        goto fail;
    }
    f->open = (OpenShards *)open;
    f->filters = filters == Py_None ? NULL : (SidecarSet *)filters;
    if (f->filters && f->filters->dirty && sidecar_set_pack(f->filters) < 0)
        goto fail;
    f->dir_time_ns = dir_time_ns;
    f->applied = applied;
    f->enabled = 1;
    return;
fail:
    PyErr_WriteUnraisable(fs);
    fast_release_views(f);
}

/* ------------------------------------------------------------ guarded */

/* The core's calls that read a mapping, each in a frame of its own under
 * SFS_GUARDED (guard.h: a file that shrank answers SFS_EGONE instead of
 * SIGBUS), so that no variable of the caller lives across the sigsetjmp. */

static __attribute__((noinline)) int g_gindex_lookup(const sfs_gindex_t *g, const uint8_t *key, uint32_t *out,
                                                     size_t cap, size_t *found)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, *found = sfs_gindex_lookup(g, key, out, cap));
    return rc;
}

static __attribute__((noinline)) int g_candidates(sfs_sidecar_t *const *sc, size_t count, const uint8_t *key,
                                                  uint32_t *out, size_t *found)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, *found = sfs_sidecar_candidates(sc, count, key, out, count));
    return rc;
}

static __attribute__((noinline)) int g_lookup_slot(const sfs_shard_t *shard, const uint8_t *key, uint32_t *slot,
                                                   uint64_t *off, uint64_t *size)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_slot(shard, key, slot, off, size));
    return rc;
}

static __attribute__((noinline)) int g_slot_object(const sfs_shard_t *shard, uint64_t slot, uint64_t *off,
                                                   uint64_t *size)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_slot_object(shard, slot, NULL, off, size));
    return rc;
}

static __attribute__((noinline)) int g_read(const sfs_shard_t *shard, uint64_t offset, void *dst, size_t n)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_read(shard, offset, dst, n));
    return rc;
}

/* -------------------------------------------------------------- lookup */

/* Whether the fast path may answer now (taking the read lock: release it
 * with fast_end when 1 is returned). */
static int fast_begin(struct ll_fast *f)
{
    if (!f)
        return 0;
    pthread_rwlock_rdlock(&f->lock);
    if (f->enabled && (!f->seq || __atomic_load_n(f->seq, __ATOMIC_ACQUIRE) == f->applied))
        return 1;
    pthread_rwlock_unlock(&f->lock);
    return 0;
}

static void fast_end(struct ll_fast *f)
{
    pthread_rwlock_unlock(&f->lock);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Candidate shard numbers of `key`, sorted and distinct, into c[0..*n)
 * (at most cap). Returns 0, or -1 when they do not fit or an index or
 * filter cannot be read (the handlers then answer). */
static int fast_candidates(struct ll_fast *f, const uint8_t key[SFS_KEY_SIZE], int64_t *c, size_t cap, size_t *n)
{
    size_t k = 0;
    for (Py_ssize_t i = 0; i < f->nlevels; i++) {
        uint32_t out[LOOKUP_STACK];
        size_t found = 0;
        if (g_gindex_lookup(f->levels[i], key, out, LOOKUP_STACK, &found) != SFS_OK || found > LOOKUP_STACK)
            return -1;
        const int64_t *map = f->views[i].buf;
        size_t nmap = (size_t)f->views[i].len / sizeof(int64_t);
        for (size_t j = 0; j < found; j++) {
            if (out[j] >= nmap || map[out[j]] < 0)
                continue;
            if (k == cap)
                return -1;
            c[k++] = map[out[j]];
        }
    }
    SidecarSet *set = f->filters;
    if (set && set->nactive) {
        if (set->dirty)
            return -1;
        size_t count = (size_t)set->nactive;
        uint32_t stack[256], *out = count <= 256 ? stack : malloc(count * sizeof(uint32_t));
        if (!out)
            return -1;
        size_t found = 0;
        int rc = g_candidates(set->packed, count, key, out, &found);
        for (size_t j = 0; rc == SFS_OK && j < found && j < count; j++) {
            if (k == cap) {
                rc = -1;
                break;
            }
            c[k++] = set->numbers[out[j]];
        }
        if (out != stack)
            free(out);
        if (rc != SFS_OK)
            return -1;
    }
    qsort(c, k, sizeof(int64_t), cmp_i64);
    size_t u = 0;
    for (size_t j = 0; j < k; j++)
        if (u == 0 || c[u - 1] != c[j])
            c[u++] = c[j];
    *n = u;
    return 0;
}

int ll_fast_lookup(Session *s, fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct ll_fast *f = s->fast;
    if (strnlen(name, SFS_LL_NAME_SIZE + 1) != SFS_LL_NAME_SIZE || !fast_begin(f))
        return 0;
    int replied = 0;
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    e.entry_timeout = e.attr_timeout = s->entry_timeout; /* negative unless found */
    uint8_t key[SFS_KEY_SIZE];
    uint64_t prefix = 0;
    int depth = sfs_ll_split_dir(&f->layout, parent, &prefix);
    if (depth < 0)
        goto out; /* not a directory: the handlers say ENOTDIR */
    if (sfs_ll_object_name(&f->layout, depth, prefix, name, key) == 0) {
        fuse_reply_entry(req, &e);
        replied = 1;
        goto out;
    }
    int64_t cand[LOOKUP_STACK];
    size_t n = 0;
    if (fast_candidates(f, key, cand, LOOKUP_STACK, &n) < 0)
        goto out;
    OpenShards *open = f->open;
    size_t probed = 0;
    for (size_t j = 0; j < n; j++) {
        int64_t number = cand[j];
        if (number >= open->cap || !open->entries[number].reader || (size_t)number >= f->nmtimes ||
            f->mtimes[number] < 0)
            goto out; /* not open here: the handlers open it */
        sfs_shard_t *shard = open->entries[number].shard;
        uint32_t slot = 0;
        uint64_t off = 0, size = 0;
        int rc = g_lookup_slot(shard, key, &slot, &off, &size);
        probed++;
        open->used[number] = 1;
        if (rc == SFS_ENOTFOUND)
            continue;
        if (rc != SFS_OK)
            goto out; /* corrupt, or the file shrank: the handlers say so */
        /* the READ that follows asks for up to 128 KiB of it: start it now */
        sfs_prefetch(shard, off, size < PREFETCH_BYTES ? size : PREFETCH_BYTES);
        e.ino = ((uint64_t)(number + 1) << SFS_LL_OBJECT_SHIFT) | slot;
        ll_fill_attr(s, &e.attr, e.ino, 0, size, f->mtimes[number]);
        e.entry_timeout = e.attr_timeout = s->cache_timeout;
        break;
    }
    __atomic_fetch_add(&f->stats[0], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&f->stats[1], (int64_t)probed, __ATOMIC_RELAXED);
    fuse_reply_entry(req, &e);
    replied = 1;
out:
    fast_end(f);
    return replied;
}

/* --------------------------------------------------------- by inode */

/* The object inode `ino` names: its shard (open here) and slot. 0 when
 * the handlers must answer. */
static int fast_object(struct ll_fast *f, uint64_t ino, sfs_shard_t **shard, uint32_t *number, uint32_t *slot)
{
    OpenShards *open = f->open;
    if (!sfs_ll_object_inode(ino, number, slot) || *number >= open->cap || !open->entries[*number].reader ||
        *number >= f->nmtimes || f->mtimes[*number] < 0)
        return 0;
    *shard = open->entries[*number].shard;
    open->used[*number] = 1;
    return 1;
}

/* Resolve the slot now (a takedown is seen at once): SFS_OK,
 * SFS_ENOTFOUND (empty, deleted, past the index), else the handlers. */
static int fast_slot(sfs_shard_t *shard, uint32_t slot, uint64_t *off, uint64_t *size)
{
    if (slot >= sfs_slot_count(shard))
        return SFS_ENOTFOUND;
    return g_slot_object(shard, slot, off, size);
}

int ll_fast_getattr(Session *s, fuse_req_t req, fuse_ino_t ino)
{
    struct ll_fast *f = s->fast;
    if (!fast_begin(f))
        return 0;
    int replied = 0;
    struct stat st;
    uint64_t prefix, off, size;
    uint32_t number, slot;
    sfs_shard_t *shard;
    if (sfs_ll_split_dir(&f->layout, ino, &prefix) >= 0) {
        ll_fill_attr(s, &st, ino, 1, 0, f->dir_time_ns);
        fuse_reply_attr(req, &st, s->cache_timeout);
        replied = 1;
    } else if (fast_object(f, ino, &shard, &number, &slot)) {
        int rc = fast_slot(shard, slot, &off, &size);
        if (rc == SFS_ENOTFOUND) {
            fuse_reply_err(req, ENOENT);
            replied = 1;
        } else if (rc == SFS_OK) {
            ll_fill_attr(s, &st, ino, 0, size, f->mtimes[number]);
            fuse_reply_attr(req, &st, s->cache_timeout);
            replied = 1;
        }
    }
    fast_end(f);
    return replied;
}

int ll_fast_read(Session *s, fuse_req_t req, fuse_ino_t ino, size_t want, off_t offset)
{
    struct ll_fast *f = s->fast;
    if (offset < 0 || !fast_begin(f))
        return 0;
    int replied = 0;
    uint64_t off, size;
    uint32_t number, slot;
    sfs_shard_t *shard;
    if (fast_object(f, ino, &shard, &number, &slot)) {
        int rc = fast_slot(shard, slot, &off, &size);
        if (rc == SFS_ENOTFOUND) {
            fuse_reply_err(req, ENOENT);
            replied = 1;
        } else if (rc == SFS_OK) {
            uint64_t at = (uint64_t)offset;
            size_t n = sfs_ll_read_length(size, at, want);
            char *buf = n ? malloc(n) : NULL;
            if (n && !buf) {
                fuse_reply_err(req, ENOMEM);
                replied = 1;
            } else {
                if (n)
                    rc = g_read(shard, off + at, buf, n);
                if (rc == SFS_OK) {
                    fuse_reply_buf(req, buf, n);
                    replied = 1;
                }
                free(buf);
            }
        }
    }
    fast_end(f);
    return replied;
}
