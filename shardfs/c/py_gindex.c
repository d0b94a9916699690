/*
 * py_gindex.c — GlobalIndex, key_prefixes(), write_global_index() and
 * merge_global_index() of shardfs._shardfs (gindex.h): the global index
 * levels of a mount.
 */
#include "py_module.h"

/* ---------------------------------------------------------------- GlobalIndex */

/* SFS_EINVAL from gindex.h (an unsorted run, a prefix >= 2^40, too many
 * shards) raises ValueError; the rest as raise_error. */
static PyObject *raise_gindex_error(const sfs_error_t *err)
{
    if (err->status == SFS_EINVAL) {
        return raise_message(PyExc_ValueError, err->message);
    }
    return raise_error(err);
}

static int GlobalIndex_init(GlobalIndex *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&", kwlist, PyUnicode_FSConverter, &path_obj))
        return -1;
    if (self->users) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "the global index is being merged");
        return -1;
    }
    sfs_error_t err;
    sfs_gindex_t *g = NULL;
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    sfs_guard_install();
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_gindex_open(path, &g, &err); /* reads the header with pread: no guard needed */
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc != SFS_OK) {
        raise_gindex_error(&err);
        return -1;
    }
    table_changed(); /* the next request snapshot takes the new level */
    sfs_gindex_t *was = self->g;
    self->g = g;
    PyMem_Free(self->positions);
    self->positions = NULL;
    self->closed = 0;
    sfs_gindex_close(was);
    return 0;
}

static void GlobalIndex_dealloc(GlobalIndex *self)
{
    PyMem_Free(self->positions);
    sfs_gindex_close(self->g);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *GlobalIndex_close(GlobalIndex *self, PyObject *unused)
{
    self->closed = 1;
    if (self->users == 0) {
        table_changed(); /* snapshots hold their own reference */
        sfs_gindex_t *was = self->g;
        self->g = NULL;
        sfs_gindex_close(was);
    }
    Py_RETURN_NONE;
}

static PyObject *GlobalIndex_enter(GlobalIndex *self, PyObject *unused)
{
    if (!gindex_ready(self))
        return NULL;
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *GlobalIndex_exit(GlobalIndex *self, PyObject *args)
{
    return GlobalIndex_close(self, NULL);
}

/* gindex_lookup_all: py_module.h. */
int gindex_lookup_all(const sfs_gindex_t *g, const uint8_t key[SFS_KEY_SIZE],
                      uint32_t stack[LOOKUP_STACK], uint32_t **out, size_t *n)
{
    int rc = SFS_OK;
    volatile size_t found = 0; /* set inside the guard */
    *out = stack;
    SFS_GUARDED(rc = SFS_EGONE, found = sfs_gindex_lookup(g, key, stack, LOOKUP_STACK));
    if (rc == SFS_OK && found > LOOKUP_STACK) { /* many shards hold the prefix */
        size_t want = found;
        *out = PyMem_Malloc(want * sizeof(uint32_t));
        if (!*out) {
            *out = stack;
            PyErr_NoMemory();
            return SFS_ENOMEM;
        }
        SFS_GUARDED(rc = SFS_EGONE, found = sfs_gindex_lookup(g, key, *out, want));
        found = found < want ? found : want;
    }
    *n = found;
    return rc;
}

/* lookup(key32) -> list of shard-table indices. No GIL release: a lookup
 * reads a directory entry and one ~512-byte bucket. */
static PyObject *GlobalIndex_lookup(GlobalIndex *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!gindex_ready(self) || get_key(arg, key) < 0)
        return NULL;
    uint32_t stack[LOOKUP_STACK], *out;
    size_t n = 0;
    int rc = gindex_lookup_all(self->g, key, stack, &out, &n);
    if (rc == SFS_ENOMEM)
        return NULL;
    PyObject *list = rc == SFS_EGONE ? gone(sfs_gindex_path(self->g)) : PyList_New((Py_ssize_t)n);
    for (size_t j = 0; list && j < n; j++) {
        PyObject *v = PyLong_FromUnsignedLong(out[j]);
        if (!v) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)j, v);
    }
    if (out != stack)
        PyMem_Free(out);
    return list;
}

static PyObject *identity_bytes(GlobalIndex *self, uint64_t j)
{
    uint8_t id[SFS_GINDEX_IDENTITY_SIZE];
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE,
                memcpy(id, sfs_gindex_identity(self->g, j), SFS_GINDEX_IDENTITY_SIZE));
    if (rc == SFS_EGONE)
        return gone(sfs_gindex_path(self->g));
    return PyBytes_FromStringAndSize((const char *)id, SFS_GINDEX_IDENTITY_SIZE);
}

/* identity(j) -> bytes32 */
static PyObject *GlobalIndex_identity(GlobalIndex *self, PyObject *arg)
{
    if (!gindex_ready(self))
        return NULL;
    Py_ssize_t j = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (j == -1 && PyErr_Occurred())
        return NULL;
    uint64_t s = sfs_gindex_shard_count(self->g);
    if (j < 0 || (uint64_t)j >= s) {
        PyErr_Format(PyExc_IndexError, "shard index %zd outside [0, %llu)", j,
                     (unsigned long long)s);
        return NULL;
    }
    return identity_bytes(self, (uint64_t)j);
}

/* identities() -> list of bytes32, by shard index */
static PyObject *GlobalIndex_identities(GlobalIndex *self, PyObject *unused)
{
    if (!gindex_ready(self))
        return NULL;
    uint64_t s = sfs_gindex_shard_count(self->g);
    PyObject *list = PyList_New((Py_ssize_t)s);
    for (uint64_t j = 0; list && j < s; j++) {
        PyObject *id = identity_bytes(self, j);
        if (!id) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)j, id);
    }
    return list;
}

/* The slot of `id` in the position table: identities are SHA-256 digests,
 * so their first 8 bytes are a uniform hash. */
static uint64_t position_home(const uint8_t *id, uint64_t mask)
{
    uint64_t h;
    memcpy(&h, id, sizeof(h));
    return h & mask;
}

/* Fill self->positions: 4 bytes per slot, at least twice as many slots as
 * shards (0.5 MiB per 65,536 shards). 0, or -1 with an exception set. */
static int build_positions(GlobalIndex *self)
{
    uint64_t s = sfs_gindex_shard_count(self->g), slots = 16;
    while (slots < 2 * s)
        slots <<= 1;
    uint32_t *t = PyMem_Calloc(slots, sizeof(uint32_t));
    if (!t) {
        PyErr_NoMemory();
        return -1;
    }
    int rc = SFS_OK;
    uint64_t mask = slots - 1;
    SFS_GUARDED(rc = SFS_EGONE, for (uint64_t j = 0; j < s; j++) {
        const uint8_t *id = sfs_gindex_identity(self->g, j);
        uint64_t i = position_home(id, mask);
        while (t[i] && memcmp(sfs_gindex_identity(self->g, t[i] - 1), id, SFS_GINDEX_IDENTITY_SIZE))
            i = (i + 1) & mask;
        if (!t[i])
            t[i] = (uint32_t)(j + 1); /* an identity twice keeps its first position */
    });
    if (rc == SFS_EGONE) {
        PyMem_Free(t);
        gone(sfs_gindex_path(self->g));
        return -1;
    }
    self->positions = t;
    self->position_mask = mask;
    return 0;
}

/* position(identity32) -> j, or -1 when the shard table lacks it. */
static PyObject *GlobalIndex_position(GlobalIndex *self, PyObject *arg)
{
    if (!gindex_ready(self))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(arg, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    if (b.len != SFS_GINDEX_IDENTITY_SIZE) {
        PyBuffer_Release(&b);
        return PyErr_Format(PyExc_ValueError, "an identity is %d bytes, not %zd", SFS_GINDEX_IDENTITY_SIZE,
                            b.len);
    }
    uint8_t id[SFS_GINDEX_IDENTITY_SIZE];
    memcpy(id, b.buf, sizeof(id));
    PyBuffer_Release(&b);
    if (!self->positions && build_positions(self) < 0)
        return NULL;
    long found = -1;
    int rc = SFS_OK;
    const uint32_t *t = self->positions;
    uint64_t mask = self->position_mask;
    SFS_GUARDED(rc = SFS_EGONE, for (uint64_t i = position_home(id, mask); t[i]; i = (i + 1) & mask) {
        if (!memcmp(sfs_gindex_identity(self->g, t[i] - 1), id, SFS_GINDEX_IDENTITY_SIZE)) {
            found = (long)t[i] - 1;
            break;
        }
    });
    if (rc == SFS_EGONE)
        return gone(sfs_gindex_path(self->g));
    return PyLong_FromLong(found);
}

static PyObject *GlobalIndex_count(GlobalIndex *self, void *closure)
{
    if (!gindex_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_gindex_count(self->g));
}

static PyObject *GlobalIndex_shard_count(GlobalIndex *self, void *closure)
{
    if (!gindex_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_gindex_shard_count(self->g));
}

static PyObject *GlobalIndex_bucket_bits(GlobalIndex *self, void *closure)
{
    if (!gindex_ready(self))
        return NULL;
    return PyLong_FromUnsignedLong(sfs_gindex_bucket_bits(self->g));
}

static PyObject *GlobalIndex_closed(GlobalIndex *self, void *closure)
{
    return PyBool_FromLong(!self->g || self->closed);
}

static PyMethodDef GlobalIndex_methods[] = {
    {"lookup", (PyCFunction)GlobalIndex_lookup, METH_O,
     "lookup(key32) -> [j, ...]: the shard-table indices whose entries hold the key's top 40 "
     "bits, increasing (a superset: ~count / 2^40 false positives per absent key)."},
    {"identity", (PyCFunction)GlobalIndex_identity, METH_O,
     "identity(j) -> the 32-byte identity of shard index j; IndexError outside "
     "[0, shard_count)."},
    {"identities", (PyCFunction)GlobalIndex_identities, METH_NOARGS,
     "identities() -> [identity32, ...] by shard index."},
    {"position", (PyCFunction)GlobalIndex_position, METH_O,
     "position(identity32) -> the shard index of that identity (the first, if it is there twice), "
     "or -1 when the shard table lacks it. The first call builds a table of 8 bytes per shard "
     "(kept until the level is closed); then one hash probe. ValueError unless 32 bytes."},
    {"close", (PyCFunction)GlobalIndex_close, METH_NOARGS,
     "Unmap and close the file (at once, or when the merges reading it end)."},
    {"__enter__", (PyCFunction)GlobalIndex_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)GlobalIndex_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef GlobalIndex_getset[] = {
    {"count", (getter)GlobalIndex_count, NULL, "Entries: (key prefix, shard) pairs.", NULL},
    {"shard_count", (getter)GlobalIndex_shard_count, NULL, "Entries of the shard table.", NULL},
    {"bucket_bits", (getter)GlobalIndex_bucket_bits, NULL, "Bits of the bucket directory.",
     NULL},
    {"closed", (getter)GlobalIndex_closed, NULL, "True after close().", NULL},
    {NULL},
};

PyTypeObject GlobalIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.GlobalIndex",
    .tp_basicsize = sizeof(GlobalIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "GlobalIndex(path): an open global index level (see gindex.h): key -> the "
              "shard-table indices that may hold it. CorruptShardError when the file's header "
              "or size is wrong; OSError when it cannot be opened. A context manager.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)GlobalIndex_init,
    .tp_dealloc = (destructor)GlobalIndex_dealloc,
    .tp_methods = GlobalIndex_methods,
    .tp_getset = GlobalIndex_getset,
};

Reader *reader_of(PyObject *obj)
{
    if (PyObject_TypeCheck(obj, &ReaderType)) {
        Py_INCREF(obj);
        return (Reader *)obj;
    }
    PyObject *inner = PyObject_GetAttrString(obj, "_reader");
    if (inner && PyObject_TypeCheck(inner, &ReaderType))
        return (Reader *)inner;
    Py_XDECREF(inner);
    PyErr_Clear();
    PyErr_Format(PyExc_TypeError, "expected a shardfs.Shard or a Reader, got %s",
                 Py_TYPE(obj)->tp_name);
    return NULL;
}

/* key_prefixes(shard) -> bytes: sorted distinct u64 (little-endian) */
PyObject *key_prefixes(PyObject *module, PyObject *arg)
{
    Reader *reader = reader_of(arg);
    if (!reader)
        return NULL;
    if (!reader_ready(reader)) {
        Py_DECREF(reader);
        return NULL;
    }
    uint64_t *vals = NULL;
    size_t n = 0;
    sfs_error_t err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_shard_key_prefixes(reader->shard, &vals, &n, &err); /* pread only: no guard */
    Py_END_ALLOW_THREADS
    Py_DECREF(reader);
    if (rc != SFS_OK)
        return raise_gindex_error(&err);
    PyObject *out = n > (size_t)PY_SSIZE_T_MAX / 8
                        ? PyErr_NoMemory()
                        : PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(n * 8));
    if (out) {
        char *p = PyBytes_AS_STRING(out);
        for (size_t i = 0; i < n; i++) {
            uint64_t v = htole64(vals[i]);
            memcpy(p + 8 * i, &v, 8);
        }
    }
    free(vals);
    return out;
}

/* write_global_index(path, runs): runs = [(identity32, prefixes), ...] */
PyObject *write_global_index(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "runs", NULL};
    PyObject *path_obj, *runs_obj, *seq = NULL, *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&O", kwlist, PyUnicode_FSConverter, &path_obj,
                                     &runs_obj))
        return NULL;
    Py_ssize_t nruns = 0, held = 0;
    Py_buffer *views = NULL;
    const uint64_t **ptrs = NULL;
    uint64_t *lens = NULL, **copies = NULL;
    uint8_t(*ids)[SFS_GINDEX_IDENTITY_SIZE] = NULL;
    seq = PySequence_Fast(runs_obj, "runs must be a sequence of (identity, prefixes)");
    if (!seq)
        goto done;
    nruns = PySequence_Fast_GET_SIZE(seq);
    size_t k = (size_t)(nruns ? nruns : 1);
    views = PyMem_Calloc(k, sizeof(Py_buffer));
    ptrs = PyMem_Calloc(k, sizeof(*ptrs));
    lens = PyMem_Calloc(k, sizeof(uint64_t));
    copies = PyMem_Calloc(k, sizeof(*copies));
    ids = PyMem_Calloc(k, SFS_GINDEX_IDENTITY_SIZE);
    if (!views || !ptrs || !lens || !copies || !ids) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nruns; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i), *ident_obj, *pref_obj;
        if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
            PyErr_Format(PyExc_TypeError, "runs[%zd] must be a tuple (identity, prefixes)", i);
            goto done;
        }
        ident_obj = PyTuple_GET_ITEM(item, 0);
        pref_obj = PyTuple_GET_ITEM(item, 1);
        if (get_identity(ident_obj, ids[i]) < 0 ||
            PyObject_GetBuffer(pref_obj, &views[i], PyBUF_SIMPLE) < 0)
            goto done;
        held = i + 1;
        if (views[i].len % 8) {
            PyErr_Format(PyExc_ValueError, "runs[%zd]: the prefixes are %zd bytes, not a "
                         "multiple of 8 (little-endian u64)", i, views[i].len);
            goto done;
        }
        lens[i] = (uint64_t)views[i].len / 8;
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if ((uintptr_t)views[i].buf % _Alignof(uint64_t) == 0) {
            ptrs[i] = views[i].buf;
            continue;
        }
#endif
        /* unaligned, or a big-endian host: a converted copy */
        copies[i] = PyMem_Malloc(lens[i] ? lens[i] * 8 : 1);
        if (!copies[i]) {
            PyErr_NoMemory();
            goto done;
        }
        for (uint64_t j = 0; j < lens[i]; j++) {
            uint64_t v;
            memcpy(&v, (const char *)views[i].buf + 8 * j, 8);
            copies[i][j] = le64toh(v);
        }
        ptrs[i] = copies[i];
    }
    sfs_error_t err;
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_gindex_write(path, ptrs, lens, (const uint8_t(*)[SFS_GINDEX_IDENTITY_SIZE])ids,
                          (size_t)nruns, &err);
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK)
        raise_gindex_error(&err);
    else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    for (Py_ssize_t i = 0; i < held; i++) {
        PyBuffer_Release(&views[i]);
        if (copies)
            PyMem_Free(copies[i]);
    }
    PyMem_Free(views);
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    PyMem_Free(copies);
    PyMem_Free(ids);
    Py_XDECREF(seq);
    Py_DECREF(path_obj);
    return result;
}

/* The mask of shard indices in `keep` (an iterable of ints) for a level of
 * s shards: PyMem_Calloc'ed, or NULL with an exception. */
static uint8_t *keep_mask(PyObject *keep, uint64_t s, Py_ssize_t level)
{
    uint8_t *mask = PyMem_Calloc(s ? (size_t)s : 1, 1);
    if (!mask)
        return (uint8_t *)PyErr_NoMemory();
    PyObject *it = PyObject_GetIter(keep), *item;
    if (!it) {
        PyMem_Free(mask);
        return NULL;
    }
    while ((item = PyIter_Next(it))) {
        Py_ssize_t j = PyNumber_AsSsize_t(item, PyExc_IndexError);
        Py_DECREF(item);
        if (j == -1 && PyErr_Occurred())
            break;
        if (j < 0 || (uint64_t)j >= s) {
            PyErr_Format(PyExc_IndexError, "keep[%zd]: shard index %zd outside [0, %llu)", level,
                         j, (unsigned long long)s);
            break;
        }
        mask[j] = 1;
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        PyMem_Free(mask);
        return NULL;
    }
    return mask;
}

/* merge_global_index(path, levels, keep=None) */
PyObject *merge_global_index(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "levels", "keep", NULL};
    PyObject *path_obj, *levels_obj, *keep_obj = Py_None, *levels = NULL, *keeps = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&O|O", kwlist, PyUnicode_FSConverter,
                                     &path_obj, &levels_obj, &keep_obj))
        return NULL;
    Py_ssize_t n = 0, used = 0;
    GlobalIndex **items = NULL;
    sfs_gindex_t **gs = NULL;
    uint8_t **masks = NULL;
    levels = PySequence_Fast(levels_obj, "levels must be a sequence of GlobalIndex");
    if (!levels)
        goto done;
    n = PySequence_Fast_GET_SIZE(levels);
    if (keep_obj != Py_None) {
        keeps = PySequence_Fast(keep_obj, "keep must be None or a sequence of sets of indices");
        if (!keeps)
            goto done;
        if (PySequence_Fast_GET_SIZE(keeps) != n) {
            PyErr_Format(PyExc_ValueError, "keep has %zd items, levels %zd",
                         PySequence_Fast_GET_SIZE(keeps), n);
            goto done;
        }
    }
    size_t k = (size_t)(n ? n : 1);
    items = PyMem_Calloc(k, sizeof(*items));
    gs = PyMem_Calloc(k, sizeof(*gs));
    masks = PyMem_Calloc(k, sizeof(*masks));
    if (!items || !gs || !masks) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *obj = PySequence_Fast_GET_ITEM(levels, i);
        if (!PyObject_TypeCheck(obj, &GlobalIndexType)) {
            PyErr_Format(PyExc_TypeError, "levels[%zd] is not a GlobalIndex", i);
            goto done;
        }
        if (!gindex_ready((GlobalIndex *)obj))
            goto done;
        PyObject *keep = keeps ? PySequence_Fast_GET_ITEM(keeps, i) : Py_None;
        if (keep != Py_None &&
            !(masks[i] = keep_mask(keep, sfs_gindex_shard_count(((GlobalIndex *)obj)->g), i)))
            goto done;
    }
    /* held (and kept open by close()) while the GIL is released */
    for (; used < n; used++) {
        items[used] = (GlobalIndex *)PySequence_Fast_GET_ITEM(levels, used);
        Py_INCREF(items[used]);
        items[used]->users++;
        gs[used] = items[used]->g;
    }
    sfs_error_t err;
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_gindex_merge(path, gs, (size_t)n, (const uint8_t *const *)masks, &err);
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK)
        raise_gindex_error(&err);
    else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
done:
    for (Py_ssize_t i = 0; i < used; i++) {
        if (--items[i]->users == 0 && items[i]->closed) {
            sfs_gindex_close(items[i]->g);
            items[i]->g = NULL;
        }
        Py_DECREF(items[i]);
    }
    for (Py_ssize_t i = 0; masks && i < n; i++)
        PyMem_Free(masks[i]);
    PyMem_Free(items);
    PyMem_Free(gs);
    PyMem_Free(masks);
    Py_XDECREF(levels);
    Py_XDECREF(keeps);
    Py_DECREF(path_obj);
    return result;
}

