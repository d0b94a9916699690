/*
 * py_resolve.c — the Resolver type of shardfs._shardfs: the request path's
 * resolver (ll_resolve.h) over a snapshot of a mount's shard set, for the
 * Python handlers (shardfs.fuse.handlers.ShardFS), which use it for every
 * object instead of a copy of their own.
 *
 * Each method answers a pair (code, value), code one of the module's
 * RESOLVE_* constants:
 *   RESOLVE_FOUND       value = (inode, size, mtime_ns, shard number, offset,
 *                       probes) (sizes and offsets in bytes; offset: the
 *                       object's first byte in its shard; probes: the
 *                       shard indexes, or hash indexes, asked); read():
 *                       value = bytes
 *   RESOLVE_ABSENT      no such object (value: the shard indexes asked)
 *   RESOLVE_STALE       an inode of a shard no longer served (value None)
 *   RESOLVE_OPEN        value = the shard number to open before asking again
 *   RESOLVE_FAILED      value = (shard number, message, corrupt): it cannot
 *                       be read (corrupt: a slot or size field points
 *                       outside the objects, else the file shrank or an
 *                       I/O error)
 *   RESOLVE_NOT_OBJECT  not an object's name or inode (value None)
 * The GIL is released while shards are read (they may wait for the device).
 */
#include "ll_resolve.h"
#include "lookup_pack.h"

typedef struct {
    PyObject_HEAD
    ll_current_t current; /* the snapshot, published here alone */
    OpenShards *open;     /* the open shards it was built from (strong reference) */
} Resolver;

/* Mark the shards an answer asked as used (OpenShards.touched: the
 * recency of the bounded set of open shards). Under the GIL. */
static void mark_used(Resolver *self, const ll_found_t *f)
{
    size_t n = f->probed < LL_PROBED_MAX ? f->probed : LL_PROBED_MAX;
    for (size_t i = 0; i < n; i++)
        if ((Py_ssize_t)f->probed_numbers[i] < self->open->cap)
            self->open->used[f->probed_numbers[i]] = 1;
}

static ll_snapshot_t *resolver_snapshot(Resolver *self)
{
    ll_snapshot_t *snap = ll_snapshot_acquire(&self->current);
    if (!snap)
        PyErr_SetString(PyExc_ValueError, "closed resolver");
    return snap;
}

static int Resolver_init(Resolver *self, PyObject *args, PyObject *kwds)
{
    PyObject *state, *open;
    if (!PyArg_ParseTuple(args, "O:Resolver", &state))
        return -1;
    ll_snapshot_t *snap = ll_snapshot_build(state);
    if (!snap || !(open = PyObject_GetAttrString(state, "open_shards"))) {
        ll_snapshot_discard(snap);
        return -1;
    }
    ll_snapshot_publish(&self->current, snap);
    Py_XSETREF(self->open, (OpenShards *)open);
    return 0;
}

static void Resolver_dealloc(Resolver *self)
{
    ll_snapshot_publish(&self->current, NULL);
    Py_XDECREF(self->open);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static const char *status_message(int status)
{
    return status == SFS_EGONE      ? GONE_REASON
           : status == SFS_ECORRUPT ? "an index slot or size field points outside the objects section"
                                    : sfs_strstatus(status);
}

/* (code, value) for a resolution other than a read's bytes. */
static PyObject *answer(enum ll_resolution res, const ll_found_t *f)
{
    switch (res) {
    case LL_FOUND:
        return Py_BuildValue("(i(KKLIKn))", (int)res, (unsigned long long)f->ino, (unsigned long long)f->size,
                             (long long)f->mtime_ns, (unsigned)f->number, (unsigned long long)f->offset,
                             (Py_ssize_t)f->probed);
    case LL_NEED_OPEN:
        return Py_BuildValue("(iI)", (int)res, (unsigned)f->number);
    case LL_FAILED:
        return Py_BuildValue("(i(IsO))", (int)res, (unsigned)f->number, status_message(f->status),
                             f->status == SFS_ECORRUPT ? Py_True : Py_False);
    case LL_ABSENT:
        return Py_BuildValue("(in)", (int)res, (Py_ssize_t)f->probed);
    default:
        return Py_BuildValue("(iO)", (int)res, Py_None);
    }
}

/* One question to the resolver (the arguments of a method below). */
struct question {
    enum { Q_NAME, Q_KEY, Q_DIGEST, Q_INODE } what;
    uint64_t a, b;     /* parent or inode, start; below (Q_KEY) */
    int kind;          /* Q_DIGEST: 0 sha1, 1 sha1_git; Q_INODE: for_read */
    const void *bytes; /* the name, key or digest */
};

/* Ask `q` of the current snapshot (GIL released) and answer (code, value). */
static PyObject *ask(Resolver *self, const struct question *q)
{
    ll_snapshot_t *snap = resolver_snapshot(self);
    if (!snap)
        return NULL;
    ll_found_t f;
    enum ll_resolution res;
    Py_BEGIN_ALLOW_THREADS
    switch (q->what) {
    case Q_NAME:
        res = ll_resolve_name(snap, q->a, q->bytes, q->b, &f);
        if (res == LL_FOUND && f.shard) /* the READ that follows asks for its first 128 KiB */
            sfs_prefetch(f.shard, f.offset, f.size < LL_PREFETCH_BYTES ? f.size : LL_PREFETCH_BYTES);
        break;
    case Q_KEY:
        res = ll_resolve_key(snap, q->bytes, q->a, q->b, &f);
        break;
    case Q_DIGEST:
        res = ll_resolve_digest(snap, q->kind, q->bytes, q->a, &f);
        break;
    default:
        res = ll_resolve_inode(snap, q->a, q->kind, &f);
    }
    Py_END_ALLOW_THREADS
    if (q->what != Q_INODE)
        mark_used(self, &f);
    PyObject *r = answer(res, &f);
    ll_found_release(&f);
    ll_snapshot_release(snap);
    return r;
}

/* lookup(parent, name: bytes, start=0) -> (code, value): `name` in
 * directory `parent`, asking shards numbered `start` or more. An object
 * found starts being read (its first 128 KiB: the READ that follows). */
static PyObject *Resolver_lookup(Resolver *self, PyObject *args)
{
    unsigned long long parent, start = 0;
    const char *name;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Ky#|K:lookup", &parent, &name, &len, &start))
        return NULL;
    if ((size_t)len != strlen(name))
        return Py_BuildValue("(iO)", (int)LL_ABSENT, Py_None); /* a NUL inside: no file has that name */
    return ask(self, &(struct question){Q_NAME, parent, start, 0, name});
}

/* find(key: 32 bytes, start=0, below=-1) -> (code, value): the object of
 * `key` in the lowest-numbered shard holding it among those numbered
 * [start, below) (below < 0: no bound). */
static PyObject *Resolver_find(Resolver *self, PyObject *args)
{
    PyObject *keyobj;
    unsigned long long start = 0;
    long long below = -1;
    uint8_t key[SFS_KEY_SIZE];
    if (!PyArg_ParseTuple(args, "O|KL:find", &keyobj, &start, &below) || get_key(keyobj, key) < 0)
        return NULL;
    return ask(self, &(struct question){Q_KEY, start, below < 0 ? UINT64_MAX : (uint64_t)below, 0, key});
}

/* find_digest(kind, digest: 20 bytes, start=0) -> (code, value): the
 * object whose sha1 (kind 0) or sha1_git (kind 1) is `digest`, in the
 * lowest-numbered shard numbered `start` or more holding it. */
static PyObject *Resolver_find_digest(Resolver *self, PyObject *args)
{
    int kind;
    const char *digest;
    Py_ssize_t len;
    unsigned long long start = 0;
    if (!PyArg_ParseTuple(args, "iy#|K:find_digest", &kind, &digest, &len, &start))
        return NULL;
    if (len != SFS_LL_DIGEST_SIZE || kind < 0 || kind > 1) {
        PyErr_SetString(PyExc_ValueError, "find_digest: kind 0 or 1 and a 20-byte digest");
        return NULL;
    }
    return ask(self, &(struct question){Q_DIGEST, start, 0, kind, digest});
}

/* inode(ino, for_read=False) -> (code, value): the object inode `ino`
 * names, its slot read now. */
static PyObject *Resolver_inode(Resolver *self, PyObject *args)
{
    unsigned long long ino;
    int for_read = 0;
    if (!PyArg_ParseTuple(args, "K|p:inode", &ino, &for_read))
        return NULL;
    return ask(self, &(struct question){Q_INODE, ino, 0, for_read, NULL});
}

/* read(ino, offset, size) -> (code, value): bytes [offset, offset + size)
 * of the object `ino` names (clipped at its end; b"" at or past it), its
 * slot read now; a shard removed but still open here is read (files
 * opened before its removal). */
static PyObject *Resolver_read(Resolver *self, PyObject *args)
{
    unsigned long long ino;
    long long offset;
    Py_ssize_t want;
    if (!PyArg_ParseTuple(args, "KLn:read", &ino, &offset, &want))
        return NULL;
    if (offset < 0 || want < 0) {
        PyErr_SetString(PyExc_ValueError, "read: negative offset or size");
        return NULL;
    }
    ll_snapshot_t *snap = resolver_snapshot(self);
    if (!snap)
        return NULL;
    ll_found_t f;
    enum ll_resolution res;
    Py_BEGIN_ALLOW_THREADS
    res = ll_resolve_inode(snap, ino, LL_INODE_READ, &f);
    Py_END_ALLOW_THREADS
    PyObject *r = NULL;
    if (res != LL_FOUND) {
        r = answer(res, &f);
    } else {
        size_t n = sfs_ll_read_length(f.size, (uint64_t)offset, (size_t)want);
        PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)n);
        int rc = SFS_OK;
        if (bytes) {
            char *buf = PyBytes_AS_STRING(bytes);
            Py_BEGIN_ALLOW_THREADS
            rc = ll_resolve_read(&f, (uint64_t)offset, buf, n);
            Py_END_ALLOW_THREADS
            if (rc == SFS_OK) {
                r = Py_BuildValue("(iN)", (int)LL_FOUND, bytes);
            } else {
                Py_DECREF(bytes);
                f.status = rc;
                /* deleted, or its file gone, since its record answered */
                r = answer(rc == SFS_ENOTFOUND ? LL_ABSENT : rc == SFS_ESTALE ? LL_STALE : LL_FAILED, &f);
            }
        }
    }
    ll_found_release(&f);
    ll_snapshot_release(snap);
    return r;
}

static PyMethodDef Resolver_methods[] = {
    {"lookup", (PyCFunction)Resolver_lookup, METH_VARARGS,
     "lookup(parent, name, start=0) -> (code, value): what `name` stands for in directory `parent`"},
    {"find", (PyCFunction)Resolver_find, METH_VARARGS,
     "find(key, start=0, below=-1) -> (code, value): the object of a 32-byte key in the lowest-numbered "
     "shard holding it among those numbered [start, below)"},
    {"find_digest", (PyCFunction)Resolver_find_digest, METH_VARARGS,
     "find_digest(kind, digest, start=0) -> (code, value): the object whose sha1 (kind 0) or sha1_git "
     "(kind 1) is the 20-byte digest, in the lowest-numbered shard numbered start or more holding it"},
    {"inode", (PyCFunction)Resolver_inode, METH_VARARGS,
     "inode(ino, for_read=False) -> (code, value): the object inode `ino` names, its slot read now"},
    {"read", (PyCFunction)Resolver_read, METH_VARARGS,
     "read(ino, offset, size) -> (code, value): the object's bytes [offset, offset + size)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ResolverType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardfs._shardfs.Resolver",
    .tp_basicsize = sizeof(Resolver),
    .tp_dealloc = (destructor)Resolver_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Resolver(state): the request path's resolver over a snapshot of a shard set "
              "(state: a shardfs.shardset.SnapshotState); see lookup, find, inode, read",
    .tp_methods = Resolver_methods,
    .tp_init = (initproc)Resolver_init,
    .tp_new = PyType_GenericNew,
};

/* ---------------------------------------------------------------- ShardPool */

static int ShardPool_init(ShardPool *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"bound", "map_budget", NULL};
    Py_ssize_t bound;
    unsigned long long budget = 1ULL << 46;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|K:ShardPool", kwlist, &bound, &budget))
        return -1;
    if (bound < 1) {
        PyErr_SetString(PyExc_ValueError, "ShardPool: bound must be >= 1");
        return -1;
    }
    if (self->pool) {
        ll_pool_set_bounds(self->pool, (size_t)bound, budget);
        return 0;
    }
    if (!(self->pool = ll_pool_new((size_t)bound, budget))) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void ShardPool_dealloc(ShardPool *self)
{
    ll_pool_unref(self->pool); /* snapshots holding it keep it */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pool_ready(ShardPool *self)
{
    if (self->pool)
        return 1;
    PyErr_SetString(PyExc_ValueError, "ShardPool not initialized");
    return 0;
}

/* register(number, source, ident, objects, extent, pack=None, record=0,
 * stamp=b"", slots=0) -> whether the pack's record is used: ident None or
 * (dev, ino). */
static PyObject *ShardPool_register(ShardPool *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"number", "source", "ident", "objects", "extent", "pack", "record", "stamp", "slots",
                             NULL};
    unsigned long long number, objects, extent, dev = 0, ino = 0, record = 0, slots = 0;
    PyObject *source, *ident, *pack_obj = Py_None;
    const char *stamp = "";
    Py_ssize_t stamp_len = 0;
    if (!pool_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "KO&OKK|OKy#K:register", kwlist, &number, PyUnicode_FSConverter,
                                     &source, &ident, &objects, &extent, &pack_obj, &record, &stamp, &stamp_len,
                                     &slots))
        return NULL;
    int has_ident = ident != Py_None;
    if ((has_ident && !PyArg_ParseTuple(ident, "KK:ident", &dev, &ino)) || number >= LL_POOL_MAX_NUMBER ||
        (pack_obj != Py_None && (!PyObject_TypeCheck(pack_obj, &LookupPackType) ||
                                 !((LookupPack *)pack_obj)->pack || stamp_len != SFS_LOOKUP_STAMP_SIZE))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "register: shard number out of range, or not an open LookupPack "
                                              "and a 32-byte stamp");
        Py_DECREF(source);
        return NULL;
    }
    sfs_lookup_pack_t *pack = pack_obj != Py_None ? ((LookupPack *)pack_obj)->pack : NULL;
    if (pack) {
        sfs_lookup_record_t r;
        int rc;
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_pack_attach(pack, record, (const uint8_t *)stamp, slots, &r));
        if (rc != SFS_OK)
            pack = NULL; /* made for another state of the shard, or damaged: the shard is opened instead */
    }
    int rc = ll_pool_register(self->pool, (uint32_t)number, PyBytes_AS_STRING(source), has_ident, dev, ino,
                              objects, extent, pack, record);
    Py_DECREF(source);
    if (rc < 0)
        return PyErr_NoMemory();
    return PyBool_FromLong(pack != NULL);
}

static PyObject *ShardPool_forget(ShardPool *self, PyObject *args)
{
    unsigned long long number;
    if (!pool_ready(self) || !PyArg_ParseTuple(args, "K:forget", &number))
        return NULL;
    if (number < LL_POOL_MAX_NUMBER) {
        Py_BEGIN_ALLOW_THREADS /* its close may unmap a large shard */
        ll_pool_forget(self->pool, (uint32_t)number);
        Py_END_ALLOW_THREADS
    }
    Py_RETURN_NONE;
}

static PyObject *ShardPool_stats(ShardPool *self, PyObject *unused)
{
    if (!pool_ready(self))
        return NULL;
    ll_pool_stats_t st;
    ll_pool_stats(self->pool, &st);
    return Py_BuildValue("{s:n,s:K,s:K,s:K,s:n,s:K}", "open", (Py_ssize_t)st.open, "mapped",
                         (unsigned long long)st.mapped, "opens", (unsigned long long)st.opens, "evictions",
                         (unsigned long long)st.evictions, "bound", (Py_ssize_t)st.bound, "map_budget",
                         (unsigned long long)st.map_budget);
}

static PyMethodDef ShardPool_methods[] = {
    {"register", (PyCFunction)(void (*)(void))ShardPool_register, METH_VARARGS | METH_KEYWORDS,
     "register(number, source, ident, objects, extent, pack=None, record=0, stamp=b'', slots=0) -> bool: shard "
     "`number` is opened from the path `source`; ident None or (st_dev, st_ino) the file must have; its object "
     "count and extent (bytes) must match. `pack` (a LookupPack): its lookups are answered from the record at "
     "byte `record` without opening it, when that record was made for `stamp` (32 bytes) and `slots`; returns "
     "whether the record is used"},
    {"forget", (PyCFunction)ShardPool_forget, METH_VARARGS,
     "forget(number): shard `number` is no longer opened here (closed once its requests let go)"},
    {"stats", (PyCFunction)ShardPool_stats, METH_NOARGS,
     "stats() -> dict: open (shards), mapped (bytes), opens, evictions (since made), bound, map_budget (bytes)"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ShardPoolType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardfs._shardfs.ShardPool",
    .tp_basicsize = sizeof(ShardPool),
    .tp_dealloc = (destructor)ShardPool_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "ShardPool(bound, map_budget=2**46): shards the resolver opens on demand, in C, at most `bound` "
              "of them and `map_budget` bytes mapped, least recently used closed first (shardfs/c/ll_pool.h)",
    .tp_methods = ShardPool_methods,
    .tp_init = (initproc)ShardPool_init,
    .tp_new = PyType_GenericNew,
};
