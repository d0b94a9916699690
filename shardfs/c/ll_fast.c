/*
 * ll_fast.c — LOOKUP, GETATTR and READ of a mount answered in C alone
 * (ll.h), with the GIL not held.
 *
 * What a request needs is read from the process's shard set, which the
 * Python handlers change: the shards open in the process (OpenShards, by
 * number), the global index levels (GlobalIndex) and their maps (a level's
 * shard index -> shard number), the per-shard filters (SidecarSet); and
 * from a snapshot taken after each handler (shardfs.fuse.handlers.ShardFS.
 * fast_state, ll_fast_refresh): which objects those are, each shard
 * number's mtime, the layout, the shard table sequence the handlers
 * applied.
 *
 * Concurrency (py_module.h, sfs_table_lock): a request holds the table
 * lock for reading while it takes its pointers (candidates from the index
 * and the filters, the open shards it will probe or read), marks the open
 * shards busy (OpenShards.busy: a shard let go meanwhile is parked, not
 * closed) and releases the lock before it reads a shard, which may wait for
 * the device: a handler changing the set is never kept waiting by a slow
 * read, nor is any other request.
 *
 * A request goes to Python instead (returns 0) when: the mount follows a
 * winery database (hidden keys, objects only in PostgreSQL); the
 * coordinator published a shard table the handlers have not applied yet
 * (they apply it first: an inode never names an object of a table the
 * process has not seen, the rule of shardfs.fuse.shared); a candidate shard
 * is not open in the process (the handlers open it, within the bound on
 * open shards); the inode's shard is not served (removed: the handlers know
 * what may still be read); a filter set or an index level changed since
 * the snapshot; a slot or size field is corrupt or the file shrank (the
 * handlers log it and answer EIO); the name is not a 64-character key
 * (".", "..", fan-out directories).
 */
#include "ll.h"
#include "ll_names.h"

#include <stdlib.h>

/* Bytes of an object read ahead when it is looked up: the READ that
 * follows asks for up to 128 KiB of it. */
#define PREFETCH_BYTES (128 * 1024)

/* Objects pushed ahead of a read in listing order, and the most slots
 * between two reads that still count as in order (the reads of pushed
 * objects never reach the mount: the next read comes after them). */
#define AHEAD_SLOTS 32
#define AHEAD_GAP 16
/* Objects larger than this are not pushed ahead. */
#define AHEAD_MAX_SIZE (128 * 1024)
/* Streams of reads in order followed at once, per process. */
#define AHEAD_STREAMS 8
/* Sidecars kept open per process for streams in key order. */
#define AHEAD_SIDECARS 4

struct ll_fast {
    PyObject *state;          /* the last fast_state() tuple (strong reference), or NULL */
    int enabled;              /* state is a usable tuple */
    OpenShards *open;         /* borrowed from `state` */
    SidecarSet *filters;      /* borrowed from `state`, NULL when none */
    Py_ssize_t nlevels;
    GlobalIndex **levels;     /* [nlevels], borrowed from `state` */
    Py_buffer *views;         /* [nlevels] maps, then the mtimes */
    const int64_t *mtimes;    /* [nmtimes]: shard number -> mtime in ns, -1 when not served */
    size_t nmtimes;
    sfs_ll_layout_t layout;
    int64_t dir_time_ns;
    int64_t applied;          /* the shard table sequence the handlers applied */
    const volatile int64_t *seq; /* the published sequence (shared memory), or NULL */
    int64_t *stats;           /* [5]: lookups, index probes, objects pushed ahead,
                                 pushes refused, hash index probes (shared memory) */
    int64_t own_stats[5];
    /* Streams of reads in listing order (ll_fast_push_ahead), under
     * ahead_lock: several readers (find | xargs -P4) read several parts of
     * a listing at once. */
    pthread_mutex_t ahead_lock;
    struct ahead_stream {
        uint64_t used;     /* when last matched (a counter): the oldest is replaced */
        int streak;        /* reads in order in a row */
        int by_key;        /* key order (rsync, fan-out listings), else slot order */
        uint32_t shard;    /* shard number */
        uint64_t last;     /* slot, or top 64 key bits, of the last object read */
        uint64_t until;    /* last slot, or sidecar position, pushed ahead */
        uint64_t reach;    /* last slot, or top 64 key bits, pushed ahead */
    } ahead[AHEAD_STREAMS];
    uint64_t ahead_clock;
    /* Sidecars opened for key order (their slots sorted by key), under
     * ahead_lock; closed when the snapshot changes. */
    struct ahead_sidecar {
        uint32_t shard;
        sfs_sidecar_t *sc;
        uint64_t used;
    } sidecars[AHEAD_SIDECARS];
    PyObject *orders;         /* borrowed from `state`: per shard number, (sidecar path, identity) or None */
    /* Names by sha1 ([0]) and sha1_git ([1]) (ll_fast_hash_lookup). */
    struct fast_hash {
        uint64_t dir_ino;     /* MOUNT/sha1 or MOUNT/sha1_git; 0: not served */
        Py_ssize_t nlevels;
        GlobalIndex **levels; /* [nlevels] levels over the digests, borrowed */
        Py_buffer *views;     /* [nlevels] their maps, then the unlevelled shard numbers */
        PyObject *indexes;    /* borrowed: per shard number, a HashIndex or None */
    } hashes[2];
};

/* Forget the snapshot's views (under the table lock, or before any
 * request reads the fast path). */
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
    for (int k = 0; k < 2; k++) {
        struct fast_hash *h = &f->hashes[k];
        for (Py_ssize_t i = 0; h->views && i <= h->nlevels; i++)
            if (h->views[i].obj)
                PyBuffer_Release(&h->views[i]);
        PyMem_Free(h->views);
        PyMem_Free(h->levels);
        memset(h, 0, sizeof(*h));
    }
}

struct ll_fast *ll_fast_new(const volatile int64_t *seq, int64_t *stats)
{
    struct ll_fast *f = PyMem_Calloc(1, sizeof(*f));
    if (!f) {
        PyErr_NoMemory();
        return NULL;
    }
    f->seq = seq;
    f->stats = stats ? stats : f->own_stats;
    pthread_mutex_init(&f->ahead_lock, NULL);
    return f;
}

void ll_fast_free(struct ll_fast *f)
{
    if (!f)
        return;
    fast_release_views(f);
    Py_CLEAR(f->state);
    for (int i = 0; i < AHEAD_SIDECARS; i++)
        sfs_sidecar_close(f->sidecars[i].sc);
    pthread_mutex_destroy(&f->ahead_lock);
    PyMem_Free(f);
}

/* Build a snapshot's arrays from `st` (a fast_state() tuple) into `f`,
 * which no request reads. Returns 0, or -1 with an exception set. */
/* The global index levels (GlobalIndex objects, borrowed) and their maps
 * (buffers, held until fast_release_views) of a snapshot into *lv, *views
 * (one more view left for the caller) and *n. 0, or -1 with an exception. */
static int take_levels(PyObject *levels, PyObject *maps, GlobalIndex ***lv, Py_buffer **views, Py_ssize_t *n)
{
    *n = PyTuple_GET_SIZE(levels);
    if (PyTuple_GET_SIZE(maps) != *n) {
        PyErr_SetString(PyExc_ValueError, "fast_state(): levels and maps differ");
        return -1;
    }
    *lv = PyMem_Calloc((size_t)*n + 1, sizeof(**lv));
    *views = PyMem_Calloc((size_t)*n + 1, sizeof(**views));
    if (!*lv || !*views) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < *n; i++) {
        PyObject *level = PyTuple_GET_ITEM(levels, i);
        if (!PyObject_TypeCheck(level, &GlobalIndexType)) {
            PyErr_SetString(PyExc_TypeError, "fast_state(): levels must be GlobalIndex objects");
            return -1;
        }
        (*lv)[i] = (GlobalIndex *)level;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(maps, i), &(*views)[i], PyBUF_SIMPLE) < 0)
            return -1;
    }
    return 0;
}

/* The names by another hash of a snapshot: `hashes` is None or a pair
 * (sha1, sha1_git), each None or (directory inode, levels, maps, indexes
 * by shard number, an array('q') of the unlevelled shard numbers). */
static int fast_build_hashes(struct ll_fast *f, PyObject *hashes)
{
    if (hashes == Py_None)
        return 0;
    if (!PyTuple_Check(hashes) || PyTuple_GET_SIZE(hashes) != 2) {
        PyErr_SetString(PyExc_TypeError, "fast_state(): hashes must be None or a pair");
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *item = PyTuple_GET_ITEM(hashes, k), *levels, *maps, *indexes, *unlevelled;
        unsigned long long ino;
        if (item == Py_None)
            continue;
        if (!PyArg_ParseTuple(item, "KO!O!O!O", &ino, &PyTuple_Type, &levels, &PyTuple_Type, &maps, &PyTuple_Type,
                              &indexes, &unlevelled))
            return -1;
        struct fast_hash *h = &f->hashes[k];
        if (take_levels(levels, maps, &h->levels, &h->views, &h->nlevels) < 0 ||
            PyObject_GetBuffer(unlevelled, &h->views[h->nlevels], PyBUF_SIMPLE) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(indexes); i++) {
            PyObject *o = PyTuple_GET_ITEM(indexes, i);
            if (o != Py_None && !PyObject_TypeCheck(o, &HashIndexType)) {
                PyErr_SetString(PyExc_TypeError, "fast_state(): hash indexes must be HashIndex or None");
                return -1;
            }
        }
        h->indexes = indexes;
        h->dir_ino = ino;
    }
    return 0;
}

static int fast_build(struct ll_fast *f, PyObject *st)
{
    PyObject *open, *filters, *levels, *maps, *mtimes, *prefixes, *orders, *hashes = Py_None;
    long long dir_time_ns, applied;
    if (!PyArg_ParseTuple(st, "O!OO!O!OO!LLO!|O", &OpenShardsType, &open, &filters, &PyTuple_Type, &levels,
                          &PyTuple_Type, &maps, &mtimes, &PyTuple_Type, &prefixes, &dir_time_ns, &applied,
                          &PyTuple_Type, &orders, &hashes))
        return -1;
    if (fast_build_hashes(f, hashes) < 0)
        return -1;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(orders); i++) {
        PyObject *o = PyTuple_GET_ITEM(orders, i);
        if (o != Py_None && !(PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 && PyBytes_Check(PyTuple_GET_ITEM(o, 0)) &&
                              PyBytes_Check(PyTuple_GET_ITEM(o, 1)) &&
                              PyBytes_GET_SIZE(PyTuple_GET_ITEM(o, 1)) == SFS_SIDECAR_IDENTITY_SIZE)) {
            PyErr_SetString(PyExc_TypeError, "fast_state(): orders must hold None or (path, 32-byte identity)");
            return -1;
        }
    }
    f->orders = orders;
    Py_ssize_t depth = PyTuple_GET_SIZE(prefixes);
    if (depth > SFS_LL_MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "fast_state(): too deep a layout");
        return -1;
    }
    if (filters != Py_None && !PyObject_TypeCheck(filters, &SidecarSetType)) {
        PyErr_SetString(PyExc_TypeError, "fast_state(): filters must be a SidecarSet or None");
        return -1;
    }
    if (take_levels(levels, maps, &f->levels, &f->views, &f->nlevels) < 0)
        return -1;
    Py_ssize_t n = f->nlevels;
    if (PyObject_GetBuffer(mtimes, &f->views[n], PyBUF_SIMPLE) < 0)
        return -1;
    f->mtimes = f->views[n].buf;
    f->nmtimes = (size_t)f->views[n].len / sizeof(int64_t);
    int nhex[SFS_LL_MAX_DEPTH];
    for (Py_ssize_t d = 0; d < depth; d++) {
        nhex[d] = _PyLong_AsInt(PyTuple_GET_ITEM(prefixes, d));
        if (nhex[d] == -1 && PyErr_Occurred())
            return -1;
    }
    if (sfs_ll_layout_init(&f->layout, nhex, (int)depth) < 0) {
        PyErr_SetString(PyExc_ValueError, "fast_state(): prefix lengths must grow, 1..7 hex digits");
        return -1;
    }
    f->open = (OpenShards *)open;
    f->filters = filters == Py_None ? NULL : (SidecarSet *)filters;
    f->dir_time_ns = dir_time_ns;
    f->applied = applied;
    return 0;
}

/* Take the handlers' state again (under the GIL): fs.fast_state() -> None
 * (nothing is answered here) or (open_shards, filters, levels, maps,
 * mtimes, prefix_lengths, dir_time_ns, applied). The same tuple as last
 * time costs one call. The new snapshot is built aside, then swapped in
 * under the table lock. Errors are reported (sys.unraisablehook) and
 * leave the fast path off until the next refresh. */
void ll_fast_refresh(struct ll_fast *f, PyObject *fs)
{
    if (!f)
        return;
    if (f->enabled)
        openshards_release_parked(f->open);
    PyObject *st = PyObject_CallMethod(fs, "fast_state", NULL);
    if (st && st == f->state) {
        Py_DECREF(st);
        if (f->enabled && f->filters && f->filters->dirty && sidecar_set_pack(f->filters) < 0)
            PyErr_WriteUnraisable(fs);
        return;
    }
    struct ll_fast fresh;
    memset(&fresh, 0, sizeof(fresh));
    if (!st || (st != Py_None && fast_build(&fresh, st) < 0)) {
        PyErr_WriteUnraisable(fs);
        fast_release_views(&fresh);
        Py_CLEAR(st);
    } else {
        fresh.enabled = st != Py_None;
        if (fresh.enabled && fresh.filters && fresh.filters->dirty && sidecar_set_pack(fresh.filters) < 0) {
            PyErr_WriteUnraisable(fs);
            fresh.enabled = 0;
        }
    }
    struct ll_fast old = *f;
    table_write_lock();
    f->state = st; /* a strong reference, or NULL */
    f->enabled = fresh.enabled;
    f->open = fresh.open;
    f->filters = fresh.filters;
    f->nlevels = fresh.nlevels;
    f->levels = fresh.levels;
    f->views = fresh.views;
    f->mtimes = fresh.mtimes;
    f->nmtimes = fresh.nmtimes;
    f->layout = fresh.layout;
    f->dir_time_ns = fresh.dir_time_ns;
    f->applied = fresh.applied;
    f->orders = fresh.orders;
    memcpy(f->hashes, fresh.hashes, sizeof(f->hashes));
    table_write_unlock();
    pthread_mutex_lock(&f->ahead_lock); /* shard numbers may name other shards now */
    for (int i = 0; i < AHEAD_SIDECARS; i++) {
        sfs_sidecar_close(f->sidecars[i].sc);
        f->sidecars[i].sc = NULL;
        f->sidecars[i].used = 0;
    }
    pthread_mutex_unlock(&f->ahead_lock);
    fast_release_views(&old);
    Py_XDECREF(old.state);
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

/* -------------------------------------------------------------- requests */

/* Whether the fast path may answer now; on 1 the table lock is held for
 * reading (release it with table_read_unlock). */
static int fast_begin(struct ll_fast *f)
{
    if (!f)
        return 0;
    pthread_rwlock_rdlock(&sfs_table_lock);
    if (f->enabled && (!f->seq || __atomic_load_n(f->seq, __ATOMIC_ACQUIRE) == f->applied))
        return 1;
    pthread_rwlock_unlock(&sfs_table_lock);
    return 0;
}

static void table_read_unlock(void)
{
    pthread_rwlock_unlock(&sfs_table_lock);
}

/* Shards taken for reading outside the lock (see the file's comment). */
static void busy_add(OpenShards *open, Py_ssize_t delta)
{
    __atomic_add_fetch(&open->busy, delta, __ATOMIC_SEQ_CST);
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Candidate shard numbers of `key`, sorted and distinct, into c[0..*n)
 * (at most cap). Under the read lock. Returns 0, or -1 when they do not fit
 * or an index level or the filters cannot be read or changed since the
 * snapshot (the handlers then answer). */
static int fast_candidates(struct ll_fast *f, const uint8_t key[SFS_KEY_SIZE], int64_t *c, size_t cap, size_t *n)
{
    size_t k = 0;
    for (Py_ssize_t i = 0; i < f->nlevels; i++) {
        const GlobalIndex *lv = f->levels[i];
        if (!lv->g || lv->closed)
            return -1;
        uint32_t out[LOOKUP_STACK];
        size_t found = 0;
        if (g_gindex_lookup(lv->g, key, out, LOOKUP_STACK, &found) != SFS_OK || found > LOOKUP_STACK)
            return -1;
        const int64_t *map = f->views[i].buf;
        size_t nmap = (size_t)f->views[i].len / sizeof(int64_t);
        for (size_t j = 0; j < found; j++) {
            int64_t number = out[j] < nmap ? __atomic_load_n(&map[out[j]], __ATOMIC_RELAXED) : -1;
            if (number < 0)
                continue;
            if (k == cap)
                return -1;
            c[k++] = number;
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

/* The open shard serving shard number `number` and its mtime, under the
 * read lock: NULL when it is not open here or not served. */
static sfs_shard_t *fast_shard(struct ll_fast *f, uint32_t number, int64_t *mtime)
{
    OpenShards *open = f->open;
    if ((Py_ssize_t)number >= open->cap || !open->entries[number].reader || number >= f->nmtimes ||
        f->mtimes[number] < 0)
        return NULL;
    open->used[number] = 1; /* recency: see OpenShards.touched */
    *mtime = f->mtimes[number];
    return open->entries[number].shard;
}

static __attribute__((noinline)) int g_hash_find(const sfs_shard_t *shard, const sfs_hashindex_t *hx,
                                                 const uint8_t *digest, uint32_t *slot, uint64_t *off, uint64_t *size)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_hash_find(shard, hx, digest, slot, off, size, NULL));
    return rc;
}

#define SWHID_PREFIX "swh:1:cnt:"
#define SWHID_PREFIX_LEN 10

/* LOOKUP of a name by another hash: `hex` (40 lowercase hex digits) in
 * MOUNT/sha1 or MOUNT/sha1_git, or a content SWHID in the root (kind 1:
 * sha1_git). The levels over the digests and the unlevelled shards give
 * the candidates; each is asked through its hash index, and the object it
 * proposes is hashed again (sfs_hash_find) before it is answered, with the
 * inode of its slot. Under the table read lock, held throughout (the hash
 * indexes are unmapped under the write lock: HashIndex.close). Returns 0
 * (lock released) when the handlers must answer: no snapshot for this
 * hash, a candidate not open here or without its index, an error. */
static int fast_hash_lookup(Session *s, struct ll_fast *f, fuse_req_t req, int kind, const char *hex)
{
    struct fast_hash *h = &f->hashes[kind];
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    e.entry_timeout = e.attr_timeout = s->entry_timeout; /* negative unless found */
    uint8_t key[SFS_KEY_SIZE] = {0};
    for (int i = 0; i < 2 * SFS_HX_DIGEST_SIZE; i++) {
        char c = hex[i];
        int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (v < 0) {
            table_read_unlock();
            fuse_reply_entry(req, &e);
            return 1;
        }
        key[i / 2] = (uint8_t)(key[i / 2] << 4 | v);
    }
    int64_t cand[LOOKUP_STACK];
    size_t k = 0;
    for (Py_ssize_t i = 0; i < h->nlevels; i++) {
        const GlobalIndex *lv = h->levels[i];
        uint32_t out[LOOKUP_STACK];
        size_t found = 0;
        if (!lv->g || lv->closed || g_gindex_lookup(lv->g, key, out, LOOKUP_STACK, &found) != SFS_OK ||
            found > LOOKUP_STACK)
            goto handlers;
        const int64_t *map = h->views[i].buf;
        size_t nmap = (size_t)h->views[i].len / sizeof(int64_t);
        for (size_t j = 0; j < found; j++) {
            int64_t number = out[j] < nmap ? __atomic_load_n(&map[out[j]], __ATOMIC_RELAXED) : -1;
            if (number < 0)
                continue;
            if (k == LOOKUP_STACK)
                goto handlers;
            cand[k++] = number;
        }
    }
    const int64_t *unlevelled = h->views[h->nlevels].buf;
    size_t nun = (size_t)h->views[h->nlevels].len / sizeof(int64_t);
    for (size_t j = 0; j < nun; j++) {
        if (k == LOOKUP_STACK)
            goto handlers;
        cand[k++] = unlevelled[j];
    }
    qsort(cand, k, sizeof(int64_t), cmp_i64);
    size_t probed = 0;
    for (size_t j = 0; j < k; j++) {
        if (j && cand[j] == cand[j - 1])
            continue;
        int64_t mtime;
        sfs_shard_t *shard = fast_shard(f, (uint32_t)cand[j], &mtime);
        PyObject *o = cand[j] < PyTuple_GET_SIZE(h->indexes) ? PyTuple_GET_ITEM(h->indexes, cand[j]) : Py_None;
        const sfs_hashindex_t *hx = o != Py_None ? ((HashIndex *)o)->hx : NULL;
        if (!shard || !hx)
            goto handlers;
        uint32_t slot;
        uint64_t off, size;
        int rc = g_hash_find(shard, hx, key, &slot, &off, &size);
        probed++;
        if (rc == SFS_ENOTFOUND)
            continue;
        if (rc != SFS_OK)
            goto handlers;
        sfs_prefetch(shard, off, size < PREFETCH_BYTES ? size : PREFETCH_BYTES);
        e.ino = ((uint64_t)(cand[j] + 1) << SFS_LL_OBJECT_SHIFT) | slot;
        ll_fill_attr(s, &e.attr, e.ino, 0, size, mtime);
        e.entry_timeout = e.attr_timeout = s->cache_timeout;
        break;
    }
    table_read_unlock();
    __atomic_fetch_add(&f->stats[4], (int64_t)probed, __ATOMIC_RELAXED);
    fuse_reply_entry(req, &e);
    return 1;
handlers:
    table_read_unlock();
    return 0;
}

int ll_fast_lookup(Session *s, fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct ll_fast *f = s->fast;
    size_t len = strnlen(name, SFS_LL_NAME_SIZE + 1);
    if (len == 2 * SFS_HX_DIGEST_SIZE || len == SWHID_PREFIX_LEN + 2 * SFS_HX_DIGEST_SIZE) {
        if (!fast_begin(f))
            return 0;
        for (int kind = 0; kind < 2; kind++) {
            struct fast_hash *h = &f->hashes[kind];
            if (!h->dir_ino)
                continue;
            if (len == 2 * SFS_HX_DIGEST_SIZE && parent == h->dir_ino)
                return fast_hash_lookup(s, f, req, kind, name);
            if (kind == 1 && len > 2 * SFS_HX_DIGEST_SIZE && parent == SFS_LL_ROOT_INODE &&
                memcmp(name, SWHID_PREFIX, SWHID_PREFIX_LEN) == 0)
                return fast_hash_lookup(s, f, req, kind, name + SWHID_PREFIX_LEN);
        }
        table_read_unlock();
        return 0;
    }
    if (len != SFS_LL_NAME_SIZE || !fast_begin(f))
        return 0;
    uint8_t key[SFS_KEY_SIZE];
    uint64_t prefix = 0;
    int depth = sfs_ll_split_dir(&f->layout, parent, &prefix);
    if (depth < 0) {
        table_read_unlock();
        return 0; /* not a directory: the handlers say ENOTDIR */
    }
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    e.entry_timeout = e.attr_timeout = s->entry_timeout; /* negative unless found */
    if (sfs_ll_object_name(&f->layout, depth, prefix, name, key) == 0) {
        table_read_unlock();
        fuse_reply_entry(req, &e);
        return 1;
    }
    /* The candidates open here, in number order, up to the first that is
     * not (the handlers answer if none before it holds the key). */
    int64_t cand[LOOKUP_STACK];
    sfs_shard_t *shards[LOOKUP_STACK];
    int64_t mtimes[LOOKUP_STACK];
    size_t n = 0, nopen = 0;
    if (fast_candidates(f, key, cand, LOOKUP_STACK, &n) < 0) {
        table_read_unlock();
        return 0;
    }
    while (nopen < n && (shards[nopen] = fast_shard(f, (uint32_t)cand[nopen], &mtimes[nopen])))
        nopen++;
    OpenShards *open = f->open;
    int64_t *stats = f->stats;
    busy_add(open, 1);
    table_read_unlock();
    int replied = 0, failed = 0;
    size_t probed = 0;
    for (size_t j = 0; j < nopen && !replied; j++) {
        uint32_t slot = 0;
        uint64_t off = 0, size = 0;
        int rc = g_lookup_slot(shards[j], key, &slot, &off, &size);
        probed++;
        if (rc == SFS_ENOTFOUND)
            continue;
        if (rc != SFS_OK) {
            failed = 1; /* the file shrank, or a corrupt slot: another shard */
            continue;   /* may hold the key, else the handlers say EIO */
        }
        /* the READ that follows asks for up to 128 KiB of it: start it now */
        sfs_prefetch(shards[j], off, size < PREFETCH_BYTES ? size : PREFETCH_BYTES);
        e.ino = ((uint64_t)(cand[j] + 1) << SFS_LL_OBJECT_SHIFT) | slot;
        ll_fill_attr(s, &e.attr, e.ino, 0, size, mtimes[j]);
        e.entry_timeout = e.attr_timeout = s->cache_timeout;
        replied = 1;
    }
    busy_add(open, -1);
    if (!replied && (failed || nopen < n))
        return 0; /* a candidate to open, or an error to tell: the handlers */
    __atomic_fetch_add(&stats[0], 1, __ATOMIC_RELAXED);
    __atomic_fetch_add(&stats[1], (int64_t)probed, __ATOMIC_RELAXED);
    fuse_reply_entry(req, &e);
    return 1;
}

/* The open shard of object inode `ino` (marked busy: call busy_add(open,
 * -1) after), its slot and mtime; NULL when the handlers must answer (not
 * an object in a shard open here). Takes and releases the read lock. */
static sfs_shard_t *fast_object(struct ll_fast *f, uint64_t ino, OpenShards **open, uint32_t *slot,
                                int64_t *mtime)
{
    uint32_t number;
    if (!sfs_ll_object_inode(ino, &number, slot))
        return NULL;
    sfs_shard_t *shard = fast_shard(f, number, mtime);
    if (shard) {
        *open = f->open;
        busy_add(*open, 1);
    }
    return shard;
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
    struct stat st;
    uint64_t prefix, off, size;
    uint32_t slot;
    int64_t mtime;
    OpenShards *open = NULL;
    if (sfs_ll_split_dir(&f->layout, ino, &prefix) >= 0) {
        ll_fill_attr(s, &st, ino, 1, 0, f->dir_time_ns);
        table_read_unlock();
        fuse_reply_attr(req, &st, s->cache_timeout);
        return 1;
    }
    sfs_shard_t *shard = fast_object(f, ino, &open, &slot, &mtime);
    table_read_unlock();
    if (!shard)
        return 0;
    int rc = fast_slot(shard, slot, &off, &size);
    busy_add(open, -1);
    if (rc == SFS_ENOTFOUND) {
        fuse_reply_err(req, ENOENT);
    } else if (rc == SFS_OK) {
        ll_fill_attr(s, &st, ino, 0, size, mtime);
        fuse_reply_attr(req, &st, s->cache_timeout);
    } else {
        return 0;
    }
    return 1;
}

/* The object inode `ino` names, its slot resolved now: its shard (marked
 * busy: call busy_add(*open, -1) after), *rc the slot's status
 * (fast_slot) and *off, *size its place when SFS_OK; NULL when the
 * handlers must answer (see fast_object). */
static sfs_shard_t *fast_resolve(struct ll_fast *f, fuse_ino_t ino, OpenShards **open, int *rc, uint64_t *off,
                                 uint64_t *size)
{
    if (!fast_begin(f))
        return NULL;
    uint32_t slot;
    int64_t mtime;
    sfs_shard_t *shard = fast_object(f, ino, open, &slot, &mtime);
    table_read_unlock();
    if (shard)
        *rc = fast_slot(shard, slot, off, size);
    return shard;
}

int ll_fast_read(Session *s, fuse_req_t req, fuse_ino_t ino, size_t want, off_t offset)
{
    uint64_t off, size;
    OpenShards *open = NULL;
    int rc;
    sfs_shard_t *shard = offset < 0 ? NULL : fast_resolve(s->fast, ino, &open, &rc, &off, &size);
    if (!shard)
        return 0;
    int replied = 0;
    if (rc == SFS_ENOTFOUND) {
        fuse_reply_err(req, ENOENT);
        replied = 1;
    } else if (rc == SFS_OK) {
        size_t n = sfs_ll_read_length(size, (uint64_t)offset, want);
        char *buf = n ? malloc(n) : NULL;
        if (n && !buf) {
            fuse_reply_err(req, ENOMEM);
            replied = 1;
        } else {
            if (n)
                rc = g_read(shard, off + (uint64_t)offset, buf, n);
            if (rc == SFS_OK) {
                fuse_reply_buf(req, buf, n);
                replied = 1;
            } else if (rc == SFS_EIO && sfs_is_rbd(shard)) {
                /* the cluster failed or timed out (rbd.h): asking it again
                 * from the Python handler would double the wait */
                fuse_reply_err(req, EIO);
                replied = 1;
            }
            free(buf);
        }
    }
    busy_add(open, -1);
    return replied;
}

/* Push bytes [0, n) of the object at `off` in `shard` into the kernel's
 * page cache for inode `ino` (FUSE_NOTIFY_STORE): 0, or -1 when not done
 * (unreadable, or the kernel refused: e.g. ENOENT, an inode it does not
 * have). */
static int push(Session *s, sfs_shard_t *shard, fuse_ino_t ino, uint64_t off, uint64_t n)
{
    if (n == 0)
        return -1;
    int stored = -1;
    char *buf = malloc((size_t)n);
    if (buf && g_read(shard, off, buf, (size_t)n) == SFS_OK) {
        struct fuse_bufvec bv = FUSE_BUFVEC_INIT((size_t)n);
        bv.buf[0].mem = buf;
        stored = fuse_lowlevel_notify_store(s->se, ino, 0, &bv, 0) == 0 ? 0 : -1;
    }
    free(buf);
    return stored;
}

int ll_fast_store(Session *s, fuse_ino_t ino, size_t want)
{
    uint64_t off, size;
    OpenShards *open = NULL;
    int rc;
    sfs_shard_t *shard = fast_resolve(s->fast, ino, &open, &rc, &off, &size);
    if (!shard)
        return -1;
    /* Not for an object in an RBD image: this ioctl comes at every open by
     * CPython, cached or not, and a push reads the object again from the
     * cluster; its READ, if its pages are not cached, takes the read the
     * LOOKUP started (rbd.h). */
    int stored = rc == SFS_OK && !sfs_is_rbd(shard) ? push(s, shard, ino, off, size < want ? size : want) : -1;
    busy_add(open, -1);
    return stored;
}


static __attribute__((noinline)) int g_slot_key(const sfs_shard_t *shard, uint64_t slot, uint8_t *key)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_slot_get(shard, slot, key) == SFS_EMPTY_OFFSET ? SFS_ENOTFOUND : SFS_OK);
    return rc;
}

/* The position of `slot` (whose key is `key`) among sidecar `sc`'s
 * entries (sorted by key), and the slots of the next `max` entries into
 * out: how many (0 when not found). */
static __attribute__((noinline)) size_t g_next_by_key(const sfs_sidecar_t *sc, const uint8_t *key, uint32_t slot,
                                                      size_t max, uint64_t *pos, uint32_t *out)
{
    size_t n = 0;
    SFS_GUARDED(n = 0, {
        uint64_t b, e;
        unsigned bits = sfs_sidecar_prefix_bits(sc) + 32;
        sfs_sidecar_range(sc, key, bits < 8 * SFS_KEY_SIZE ? bits : 8 * SFS_KEY_SIZE, &b, &e);
        for (uint64_t j = b; j < e; j++) {
            uint32_t at;
            if (sfs_sidecar_slots(sc, j, j + 1, &at) == 1 && at == slot) {
                *pos = j;
                n = (size_t)sfs_sidecar_slots(sc, *pos + 1, *pos + 1 + max, out);
                break;
            }
        }
    });
    return n;
}

/* The sidecar of shard `number` for key order, opened now if needed (at
 * most AHEAD_SIDECARS kept); NULL when it has none. Under ahead_lock and
 * the table read lock (orders is the snapshot's). */
static const sfs_sidecar_t *ahead_sidecar(struct ll_fast *f, uint32_t number, uint64_t slot_count)
{
    struct ahead_sidecar *oldest = &f->sidecars[0];
    for (int i = 0; i < AHEAD_SIDECARS; i++) {
        struct ahead_sidecar *a = &f->sidecars[i];
        if (a->sc && a->shard == number) {
            a->used = ++f->ahead_clock;
            return a->sc;
        }
        if (a->used < oldest->used)
            oldest = a;
    }
    if (!f->orders || (Py_ssize_t)number >= PyTuple_GET_SIZE(f->orders))
        return NULL;
    PyObject *o = PyTuple_GET_ITEM(f->orders, number);
    if (o == Py_None)
        return NULL;
    sfs_sidecar_t *sc = NULL;
    sfs_error_t err;
    if (sfs_sidecar_open(PyBytes_AS_STRING(PyTuple_GET_ITEM(o, 0)),
                         (const uint8_t *)PyBytes_AS_STRING(PyTuple_GET_ITEM(o, 1)), slot_count, &sc, &err) != SFS_OK)
        return NULL;
    sfs_sidecar_close(oldest->sc);
    oldest->sc = sc;
    oldest->shard = number;
    oldest->used = ++f->ahead_clock;
    return sc;
}

/* The stream of `by_key` order that a read at `at` of shard `number`
 * continues (after its last read, and at most AHEAD_GAP `unit`s past it,
 * or, once it pushed, AHEAD_SLOTS + AHEAD_GAP past what it pushed: the
 * read after a push comes past the pushed objects, and past what other
 * workers pushed for the same reader), else the oldest, replaced by a new
 * one; returns it with its streak counted. Under ahead_lock. */
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static struct ahead_stream *ahead_follow(struct ll_fast *f, int by_key, uint32_t number, uint64_t at, uint64_t unit)
{
    struct ahead_stream *st = NULL, *oldest = &f->ahead[0];
    for (int i = 0; i < AHEAD_STREAMS && !st; i++) {
        struct ahead_stream *a = &f->ahead[i];
        /* past a push, the next read may also come past what the other
         * workers pushed for the same reader: up to a window more */
        uint64_t edge = a->reach > a->last ? a->reach : a->last;
        uint64_t room = a->reach > a->last ? sat_mul(unit, AHEAD_SLOTS + AHEAD_GAP) : sat_mul(unit, AHEAD_GAP);
        if (a->used && a->by_key == by_key && a->shard == number && at > a->last && (at <= edge || at - edge <= room))
            st = a;
        else if (a->used < oldest->used)
            oldest = a;
    }
    if (st) {
        st->streak++;
    } else { /* a new stream, in place of the oldest */
        st = oldest;
        st->streak = 0;
        st->by_key = by_key;
        st->shard = number;
        st->until = st->reach = 0;
    }
    st->used = ++f->ahead_clock;
    st->last = at;
    return st;
}

static uint64_t top64(const uint8_t *key)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | key[i];
    return v;
}

void ll_fast_push_ahead(Session *s, fuse_ino_t ino)
{
    struct ll_fast *f = s->fast;
    uint32_t number, slot;
    if (!f || !sfs_ll_object_inode(ino, &number, &slot))
        return;
    if (__atomic_add_fetch(&s->storing, 1, __ATOMIC_ACQ_REL) > s->store_max)
        goto done; /* see ll_ioctl: a thread must stay free to serve READs */
    if (!fast_begin(f))
        goto done;
    int64_t mtime;
    sfs_shard_t *shard = fast_shard(f, number, &mtime);
    if (!shard) {
        table_read_unlock();
        goto done;
    }
    uint64_t count = sfs_slot_count(shard);
    uint8_t key[SFS_KEY_SIZE];
    int keyed = g_slot_key(shard, slot, key) == SFS_OK;
    /* Two reads in order in a row before a push: one alone happens by
     * chance in a small shard read at random. Slot order is the flat
     * root's listing order (tar, find | xargs); key order is sorted names
     * (rsync, fan-out listings). A read is in order when it comes after
     * the stream's last and at most AHEAD_GAP slots (in key order: times
     * the mean distance between the shard's keys) past the farther of that
     * read and what was pushed: a sparse reader (every 40th name, say) is not
     * pushed 32 objects it will not read. */
    uint32_t slots[AHEAD_SLOTS];
    size_t n = 0;
    pthread_mutex_lock(&f->ahead_lock);
    struct ahead_stream *st = ahead_follow(f, 0, number, slot, 1);
    /* push when less than half a window is left ahead (or what was pushed
     * is no window ahead of this read: another part of the shard) */
    if (st->streak >= 2 && (st->until < (uint64_t)slot + AHEAD_SLOTS / 2 || st->until > (uint64_t)slot + AHEAD_SLOTS)) {
        uint64_t from = st->until > slot && st->until <= (uint64_t)slot + AHEAD_SLOTS ? st->until + 1 : (uint64_t)slot + 1;
        for (uint64_t j = from; j <= (uint64_t)slot + AHEAD_SLOTS && j < count; j++)
            slots[n++] = (uint32_t)j;
        st->until = st->reach = (uint64_t)slot + AHEAD_SLOTS;
    } else if (keyed && st->streak == 0 && count) {
        uint64_t mean = UINT64_MAX / count; /* between two keys of the shard, in top 64 bits */
        struct ahead_stream *ks = ahead_follow(f, 1, number, top64(key), mean);
        if (ks->streak >= 2) {
            const sfs_sidecar_t *sc = ahead_sidecar(f, number, count);
            uint64_t pos = 0;
            uint32_t next[AHEAD_SLOTS];
            size_t got = sc ? g_next_by_key(sc, key, slot, AHEAD_SLOTS, &pos, next) : 0;
            /* positions after what this stream pushed already */
            size_t skip = ks->until > pos && ks->until <= pos + AHEAD_SLOTS ? (size_t)(ks->until - pos) : 0;
            if (got > skip && (ks->until < pos + AHEAD_SLOTS / 2 || skip == 0)) {
                for (size_t i = skip; i < got; i++)
                    slots[n++] = next[i];
                ks->until = pos + got;
                uint8_t far[SFS_KEY_SIZE];
                if (g_slot_key(shard, next[got - 1], far) == SFS_OK)
                    ks->reach = top64(far);
            }
        }
    }
    pthread_mutex_unlock(&f->ahead_lock);
    OpenShards *open = f->open;
    if (n)
        busy_add(open, 1);
    table_read_unlock();
    if (!n)
        goto done;
    uint64_t offs[AHEAD_SLOTS], sizes[AHEAD_SLOTS];
    /* Ask for every object's bytes at once (the device serves them in
     * parallel), then push them in order: the reader wants the first next. */
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < count && g_slot_object(shard, slots[i], &offs[i], &sizes[i]) == SFS_OK && sizes[i] > 0 &&
            sizes[i] <= AHEAD_MAX_SIZE)
            sfs_prefetch(shard, offs[i], sizes[i]);
        else
            offs[i] = UINT64_MAX;
    }
    for (size_t i = 0; i < n; i++)
        if (offs[i] != UINT64_MAX) {
            /* refused: the kernel dropped the inode (it keeps a listed
             * name's inode only while memory allows); its read READs */
            int refused = push(s, shard, ((uint64_t)(number + 1) << SFS_LL_OBJECT_SHIFT) | slots[i], offs[i],
                               sizes[i]) != 0;
            __atomic_fetch_add(&f->stats[refused ? 3 : 2], 1, __ATOMIC_RELAXED);
        }
    busy_add(open, -1);
done:
    __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
}

int ll_fast_is_dir(Session *s, fuse_ino_t ino)
{
    struct ll_fast *f = s->fast;
    if (!f)
        return -1;
    uint64_t prefix;
    int dir = -1;
    /* The layout and the hash directories are the mount's, the same in
     * every snapshot: one taken before the latest shard table tells too. */
    pthread_rwlock_rdlock(&sfs_table_lock);
    if (f->enabled)
        dir = sfs_ll_split_dir(&f->layout, ino, &prefix) >= 0 || ino == f->hashes[0].dir_ino ||
              ino == f->hashes[1].dir_ino;
    table_read_unlock();
    return dir;
}
