/*
 * py_hashindex.c — HashIndex, build_hash_indexes() and write_hash_index() of
 * shardfs._shardfs (hashindex.h): a shard's objects found by
 * sha1 or sha1_git.
 */
#include "py_module.h"

/* A damaged or another shard's index file raises StaleSidecarError (it is
 * a cache, built again); the rest as raise_error. */
static PyObject *raise_hx_error(const sfs_error_t *err)
{
    if (err->status == SFS_ESTALE || err->status == SFS_ECORRUPT)
        return raise_message(StaleSidecarError, err->message);
    return raise_error(err);
}

static int get_digest(PyObject *obj, uint8_t digest[SFS_HX_DIGEST_SIZE])
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    int ok = view.len == SFS_HX_DIGEST_SIZE;
    if (ok)
        memcpy(digest, view.buf, SFS_HX_DIGEST_SIZE);
    else
        PyErr_Format(PyExc_ValueError, "a sha1 or sha1_git digest is %d bytes, got %zd", SFS_HX_DIGEST_SIZE,
                     view.len);
    PyBuffer_Release(&view);
    return ok ? 0 : -1;
}

static int get_kind(int kind)
{
    if (kind == SFS_HASH_SHA1 || kind == SFS_HASH_SHA1_GIT)
        return 0;
    PyErr_Format(PyExc_ValueError, "hash kind must be 1 (sha1) or 2 (sha1_git), not %d", kind);
    return -1;
}

static void HashIndex_dealloc(HashIndex *self)
{
    sfs_hashindex_close(self->hx);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int HashIndex_init(HashIndex *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "identity", "slot_count", NULL};
    PyObject *path_obj, *ident_obj;
    unsigned long long slot_count;
    uint8_t identity[SFS_HX_IDENTITY_SIZE];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&OK", kwlist, PyUnicode_FSConverter, &path_obj, &ident_obj,
                                     &slot_count))
        return -1;
    if (get_identity(ident_obj, identity) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    sfs_error_t err;
    sfs_hashindex_t *hx;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_hashindex_open(PyBytes_AS_STRING(path_obj), identity, slot_count, &hx, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc != SFS_OK) {
        raise_hx_error(&err);
        return -1;
    }
    sfs_hashindex_close(self->hx);
    self->hx = hx;
    return 0;
}

static int hx_ready(HashIndex *self)
{
    if (!self->hx) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed hash index");
        return 0;
    }
    return 1;
}

static PyObject *HashIndex_close(HashIndex *self, PyObject *unused)
{
    sfs_hashindex_t *hx = self->hx;
    table_changed(); /* snapshots hold their own reference (ll_snapshot.h) */
    self->hx = NULL;
    sfs_hashindex_close(hx);
    Py_RETURN_NONE;
}

static PyObject *HashIndex_prefixes(HashIndex *self, PyObject *unused)
{
    if (!hx_ready(self))
        return NULL;
    uint64_t *v = NULL;
    size_t n = 0;
    sfs_error_t err;
    int rc;
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "hash index: " GONE_REASON),
                rc = sfs_hashindex_prefixes(self->hx, &v, &n, &err));
    if (rc != SFS_OK) {
        free(v);
        return raise_error(&err);
    }
    for (size_t i = 0; i < n; i++)
        v[i] = htole64(v[i]);
    PyObject *out = PyBytes_FromStringAndSize((const char *)v, (Py_ssize_t)(n * 8));
    free(v);
    return out;
}

static PyObject *HashIndex_find(HashIndex *self, PyObject *args)
{
    PyObject *reader_obj, *digest_obj;
    uint8_t digest[SFS_HX_DIGEST_SIZE];
    if (!PyArg_ParseTuple(args, "O!O:find", &ReaderType, &reader_obj, &digest_obj))
        return NULL;
    Reader *reader = (Reader *)reader_obj;
    if (!hx_ready(self) || !reader_ready(reader) || get_digest(digest_obj, digest) < 0)
        return NULL;
    sfs_shard_t *shard = reader_hold(reader);
    sfs_error_t err;
    uint32_t slot = 0;
    uint64_t off = 0, size = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "%s: " GONE_REASON, sfs_path(shard)),
                rc = sfs_hash_find(shard, self->hx, digest, &slot, &off, &size, &err));
    Py_END_ALLOW_THREADS
    reader_unhold(reader);
    if (rc == SFS_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc != SFS_OK)
        return raise_error(&err);
    return Py_BuildValue("(kKK)", (unsigned long)slot, (unsigned long long)off, (unsigned long long)size);
}

static PyObject *HashIndex_kind(HashIndex *self, void *c)
{
    return hx_ready(self) ? PyLong_FromLong(sfs_hashindex_kind(self->hx)) : NULL;
}

static PyObject *HashIndex_count(HashIndex *self, void *c)
{
    return hx_ready(self) ? PyLong_FromUnsignedLongLong(sfs_hashindex_count(self->hx)) : NULL;
}

static PyMethodDef HashIndex_methods[] = {
    {"close", (PyCFunction)HashIndex_close, METH_NOARGS, "Unmap the file."},
    {"find", (PyCFunction)HashIndex_find, METH_VARARGS,
     "find(reader, digest20) -> (slot, data_offset, size) or None: the object whose digest it is, "
     "every candidate hashed again. OSError when an object cannot be read."},
    {"prefixes", (PyCFunction)HashIndex_prefixes, METH_NOARGS,
     "prefixes() -> bytes: the top 40 bits of the digests, sorted, distinct, little-endian u64 "
     "(a run for write_global_index)."},
    {NULL},
};

static PyGetSetDef HashIndex_getset[] = {
    {"kind", (getter)HashIndex_kind, NULL, "1 (sha1) or 2 (sha1_git).", NULL},
    {"count", (getter)HashIndex_count, NULL, "Entries.", NULL},
    {NULL},
};

PyTypeObject HashIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.HashIndex",
    .tp_basicsize = sizeof(HashIndex),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "HashIndex(path, identity, slot_count): an open hash index file (see hashindex.h). "
              "StaleSidecarError when it belongs to another shard or is damaged; OSError when it "
              "cannot be opened.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)HashIndex_init,
    .tp_dealloc = (destructor)HashIndex_dealloc,
    .tp_methods = HashIndex_methods,
    .tp_getset = HashIndex_getset,
};

/* ---------------------------------------------------------------- functions */

typedef struct {
    PyObject *callback;
    int failed;
} progress_ctx;

static int call_progress(void *c, uint64_t done)
{
    progress_ctx *p = c;
    PyGILState_STATE gs = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(p->callback, "K", (unsigned long long)done);
    int stop = !r || PyErr_CheckSignals() < 0;
    Py_XDECREF(r);
    if (stop)
        p->failed = 1; /* the exception stays set for the caller */
    PyGILState_Release(gs);
    return stop;
}

PyObject *build_hash_indexes(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"reader", "identity", "sha1_path", "sha1_git_path", "progress", NULL};
    PyObject *reader_obj, *ident_obj, *p1 = NULL, *p2 = NULL, *progress = Py_None;
    uint8_t identity[SFS_HX_IDENTITY_SIZE];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O|O&O&O", kwlist, &ReaderType, &reader_obj, &ident_obj,
                                     PyUnicode_FSConverter, &p1, PyUnicode_FSConverter, &p2, &progress))
        return NULL;
    Reader *reader = (Reader *)reader_obj;
    PyObject *result = NULL;
    if (!reader_ready(reader) || get_identity(ident_obj, identity) < 0)
        goto out;
    const char *paths[2] = {p1 ? PyBytes_AS_STRING(p1) : NULL, p2 ? PyBytes_AS_STRING(p2) : NULL};
    progress_ctx ctx = {progress, 0};
    sfs_shard_t *shard = reader_hold(reader);
    sfs_error_t err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "%s: " GONE_REASON, sfs_path(shard)),
                rc = sfs_hashindex_build(shard, identity, paths, progress == Py_None ? NULL : call_progress,
                                         &ctx, &err));
    Py_END_ALLOW_THREADS
    reader_unhold(reader);
    if (ctx.failed && PyErr_Occurred())
        goto out;
    if (rc != SFS_OK) {
        raise_error(&err);
        goto out;
    }
    result = Py_NewRef(Py_None);
out:
    Py_XDECREF(p1);
    Py_XDECREF(p2);
    return result;
}

PyObject *write_hash_index(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "kind", "identity", "slot_count", "digests", "slots", NULL};
    PyObject *path_obj, *ident_obj;
    int kind;
    unsigned long long slot_count;
    Py_buffer digests, slots;
    uint8_t identity[SFS_HX_IDENTITY_SIZE];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&iOKy*y*", kwlist, PyUnicode_FSConverter, &path_obj, &kind,
                                     &ident_obj, &slot_count, &digests, &slots))
        return NULL;
    PyObject *result = NULL;
    size_t n = (size_t)digests.len / SFS_HX_DIGEST_SIZE;
    if (get_kind(kind) < 0 || get_identity(ident_obj, identity) < 0)
        goto out;
    if ((size_t)digests.len != n * SFS_HX_DIGEST_SIZE || (size_t)slots.len != n * 4) {
        PyErr_Format(PyExc_ValueError, "digests must hold 20 bytes and slots 4 (native u32) per entry: "
                     "%zd and %zd bytes", digests.len, slots.len);
        goto out;
    }
    sfs_error_t err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_hashindex_write(PyBytes_AS_STRING(path_obj), kind, identity, slot_count, digests.buf,
                             (const uint32_t *)slots.buf, n, &err);
    Py_END_ALLOW_THREADS
    if (rc == SFS_EINVAL)
        PyErr_SetString(PyExc_ValueError, err.message);
    else if (rc != SFS_OK)
        raise_error(&err);
    else
        result = Py_NewRef(Py_None);
out:
    Py_DECREF(path_obj);
    PyBuffer_Release(&digests);
    PyBuffer_Release(&slots);
    return result;
}

