/*
 * py_lookup_pack.c — LookupPack and LookupPackWriter of shardfs._shardfs:
 * packs of lookup records (lookup_pack.h), which let a mount answer
 * LOOKUP and GETATTR of a shard that is not open (shardfs/lookups.py).
 */
#include "py_module.h"
#include "lookup_pack.h"

/* ------------------------------------------------------------- LookupPack */

static int LookupPack_init(LookupPack *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&", kwlist, PyUnicode_FSConverter, &path))
        return -1;
    sfs_error_t err;
    sfs_lookup_pack_t *p = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_lookup_pack_open(PyBytes_AS_STRING(path), &p, &err);
    Py_END_ALLOW_THREADS
    Py_DECREF(path);
    if (rc != SFS_OK) {
        raise_error(&err);
        return -1;
    }
    sfs_lookup_pack_close(self->pack);
    self->pack = p;
    return 0;
}

static void LookupPack_dealloc(LookupPack *self)
{
    sfs_lookup_pack_close(self->pack); /* pools holding it keep it */
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pack_ready(LookupPack *self)
{
    if (self->pack)
        return 1;
    PyErr_SetString(PyExc_ValueError, "LookupPack closed");
    return 0;
}

static int identity_arg(PyObject *obj, const uint8_t **out, Py_ssize_t size, const char *what)
{
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != size) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes expected", what, size);
        return -1;
    }
    *out = (const uint8_t *)PyBytes_AS_STRING(obj);
    return 0;
}

/* record(identity) -> byte offset of the shard's record, or -1 */
static PyObject *LookupPack_record(LookupPack *self, PyObject *arg)
{
    const uint8_t *identity;
    if (!pack_ready(self) || identity_arg(arg, &identity, 32, "record") < 0)
        return NULL;
    int64_t at;
    SFS_GUARDED(at = -1, at = sfs_lookup_pack_record(self->pack, identity));
    return PyLong_FromLongLong(at);
}

/* check(record, stamp, slots) -> None, or the reason the record cannot stand
 * for the shard: "stale" (made for another state of it), "corrupt" */
static PyObject *LookupPack_check(LookupPack *self, PyObject *args)
{
    unsigned long long record, slots;
    PyObject *stamp_obj;
    const uint8_t *stamp;
    if (!pack_ready(self) || !PyArg_ParseTuple(args, "KOK:check", &record, &stamp_obj, &slots) ||
        identity_arg(stamp_obj, &stamp, SFS_LOOKUP_STAMP_SIZE, "check") < 0)
        return NULL;
    sfs_lookup_record_t r;
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_pack_attach(self->pack, record, stamp, slots, &r));
    if (rc == SFS_OK)
        Py_RETURN_NONE;
    return PyUnicode_FromString(rc == SFS_ESTALE ? "stale" : rc == SFS_EGONE ? "shrank" : "corrupt");
}

/* find(record, key) -> (slot, offset, size) or None */
static PyObject *LookupPack_find(LookupPack *self, PyObject *args)
{
    unsigned long long record;
    PyObject *key_obj;
    const uint8_t *key;
    if (!pack_ready(self) || !PyArg_ParseTuple(args, "KO:find", &record, &key_obj) ||
        identity_arg(key_obj, &key, SFS_KEY_SIZE, "find") < 0)
        return NULL;
    sfs_lookup_record_t r;
    uint32_t slot = 0;
    uint64_t off = 0, size = 0;
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_pack_view(self->pack, record, &r);
                if (rc == SFS_OK) rc = sfs_lookup_record_find(&r, key, &slot, &off, &size));
    if (rc == SFS_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc != SFS_OK) {
        PyErr_Format(CorruptShardError, "lookup record at byte %llu: %s", record,
                     rc == SFS_EGONE ? GONE_REASON : "damaged");
        return NULL;
    }
    return Py_BuildValue("(IKK)", slot, (unsigned long long)off, (unsigned long long)size);
}

/* delete(record, slot): empty the slot in the file (a takedown) */
static PyObject *LookupPack_delete(LookupPack *self, PyObject *args)
{
    unsigned long long record, slot;
    if (!pack_ready(self) || !PyArg_ParseTuple(args, "KK:delete", &record, &slot))
        return NULL;
    sfs_error_t err;
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_pack_delete(self->pack, record, slot, &err));
    if (rc == SFS_EGONE)
        return os_error(EIO, "lookup pack", GONE_REASON);
    if (rc != SFS_OK)
        return err.status == SFS_EINVAL ? raise_message(PyExc_ValueError, err.message) : raise_error(&err);
    Py_RETURN_NONE;
}

static PyObject *LookupPack_close(LookupPack *self, PyObject *unused)
{
    sfs_lookup_pack_close(self->pack);
    self->pack = NULL;
    Py_RETURN_NONE;
}

static PyObject *LookupPack_count(LookupPack *self, void *closure)
{
    if (!pack_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_lookup_pack_count(self->pack));
}

static PyMethodDef LookupPack_methods[] = {
    {"record", (PyCFunction)LookupPack_record, METH_O,
     "record(identity: 32 bytes) -> the byte offset of that shard's record, or -1"},
    {"check", (PyCFunction)LookupPack_check, METH_VARARGS,
     "check(record, stamp: 32 bytes, slots) -> None when the record stands for a shard of that stamp and slot "
     "count, else the reason: 'stale' (made for another state of the shard), 'corrupt', 'shrank'"},
    {"find", (PyCFunction)LookupPack_find, METH_VARARGS,
     "find(record, key: 32 bytes) -> (slot, offset, size) (bytes; offset of the object's first byte in its "
     "shard) or None; CorruptShardError for a damaged record"},
    {"delete", (PyCFunction)LookupPack_delete, METH_VARARGS,
     "delete(record, slot): empty that slot in the file, seen at once by every process mapping it (a takedown); "
     "ValueError for no such record or slot, OSError when the file cannot be written"},
    {"close", (PyCFunction)LookupPack_close, METH_NOARGS, "close(): let go (pools holding it keep it)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef LookupPack_getset[] = {
    {"count", (getter)LookupPack_count, NULL, "records in the pack", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject LookupPackType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardfs._shardfs.LookupPack",
    .tp_basicsize = sizeof(LookupPack),
    .tp_dealloc = (destructor)LookupPack_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LookupPack(path): a pack of lookup records, mapped (shardfs/c/lookup_pack.h); OSError, "
              "CorruptShardError for a file that is not a whole pack",
    .tp_methods = LookupPack_methods,
    .tp_getset = LookupPack_getset,
    .tp_init = (initproc)LookupPack_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------ LookupPackWriter */

typedef struct {
    PyObject_HEAD
    sfs_lookup_pack_writer_t *w;
} LookupPackWriter;

static int LookupPackWriter_init(LookupPackWriter *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&", kwlist, PyUnicode_FSConverter, &path))
        return -1;
    sfs_error_t err;
    sfs_lookup_pack_abort(self->w);
    self->w = NULL;
    int rc = sfs_lookup_pack_create(PyBytes_AS_STRING(path), &self->w, &err);
    Py_DECREF(path);
    if (rc != SFS_OK) {
        raise_error(&err);
        return -1;
    }
    return 0;
}

static void LookupPackWriter_dealloc(LookupPackWriter *self)
{
    sfs_lookup_pack_abort(self->w);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int writer_ready(LookupPackWriter *self)
{
    if (self->w)
        return 1;
    PyErr_SetString(PyExc_ValueError, "LookupPackWriter committed or aborted");
    return 0;
}

/* add(shard, identity, stamp) -> the record's byte offset */
static PyObject *LookupPackWriter_add(LookupPackWriter *self, PyObject *args)
{
    PyObject *shard_obj, *identity_obj, *stamp_obj;
    const uint8_t *identity, *stamp;
    if (!writer_ready(self) || !PyArg_ParseTuple(args, "OOO:add", &shard_obj, &identity_obj, &stamp_obj) ||
        identity_arg(identity_obj, &identity, 32, "add: identity") < 0 ||
        identity_arg(stamp_obj, &stamp, SFS_LOOKUP_STAMP_SIZE, "add: stamp") < 0)
        return NULL;
    Reader *reader = reader_of(shard_obj);
    if (!reader)
        return NULL;
    if (!reader_ready(reader)) {
        Py_DECREF(reader);
        return NULL;
    }
    sfs_error_t err;
    uint64_t record = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_lookup_pack_add(self->w, reader->shard, identity, stamp, &record, &err); /* pread only */
    Py_END_ALLOW_THREADS
    Py_DECREF(reader);
    if (rc != SFS_OK)
        return err.status == SFS_EINVAL ? raise_message(PyExc_ValueError, err.message) : raise_error(&err);
    return PyLong_FromUnsignedLongLong(record);
}

/* copy(pack, record, identity) -> the copy's byte offset */
static PyObject *LookupPackWriter_copy(LookupPackWriter *self, PyObject *args)
{
    PyObject *pack_obj, *identity_obj;
    unsigned long long record;
    const uint8_t *identity;
    if (!writer_ready(self) || !PyArg_ParseTuple(args, "O!KO:copy", &LookupPackType, &pack_obj, &record, &identity_obj) ||
        identity_arg(identity_obj, &identity, 32, "copy: identity") < 0 || !pack_ready((LookupPack *)pack_obj))
        return NULL;
    sfs_error_t err;
    uint64_t out = 0;
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_pack_copy(self->w, ((LookupPack *)pack_obj)->pack, record, identity,
                                                          &out, &err));
    if (rc == SFS_EGONE)
        return os_error(EIO, "lookup pack", GONE_REASON);
    if (rc != SFS_OK)
        return raise_error(&err);
    return PyLong_FromUnsignedLongLong(out);
}

static PyObject *LookupPackWriter_commit(LookupPackWriter *self, PyObject *unused)
{
    if (!writer_ready(self))
        return NULL;
    sfs_error_t err;
    sfs_lookup_pack_writer_t *w = self->w;
    self->w = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_lookup_pack_commit(w, &err);
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static PyObject *LookupPackWriter_abort(LookupPackWriter *self, PyObject *unused)
{
    sfs_lookup_pack_abort(self->w);
    self->w = NULL;
    Py_RETURN_NONE;
}

static PyMethodDef LookupPackWriter_methods[] = {
    {"add", (PyCFunction)LookupPackWriter_add, METH_VARARGS,
     "add(shard, identity: 32 bytes, stamp: 32 bytes) -> the byte offset of the shard's record in the pack; "
     "ValueError (a shard kind with its own index), CorruptShardError (an inconsistent index), OSError "
     "(reading the shard, writing the pack)"},
    {"copy", (PyCFunction)LookupPackWriter_copy, METH_VARARGS,
     "copy(pack, record, identity: 32 bytes) -> the byte offset of a copy of that record of `pack` (a merge); "
     "CorruptShardError (no whole record there), OSError"},
    {"commit", (PyCFunction)LookupPackWriter_commit, METH_NOARGS,
     "commit(): write the directory, fdatasync and publish the pack at its path; OSError"},
    {"abort", (PyCFunction)LookupPackWriter_abort, METH_NOARGS, "abort(): nothing is published"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject LookupPackWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardfs._shardfs.LookupPackWriter",
    .tp_basicsize = sizeof(LookupPackWriter),
    .tp_dealloc = (destructor)LookupPackWriter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LookupPackWriter(path): a pack of lookup records being written (shardfs/c/lookup_pack.h): "
              "an unnamed file until commit(); OSError",
    .tp_methods = LookupPackWriter_methods,
    .tp_init = (initproc)LookupPackWriter_init,
    .tp_new = PyType_GenericNew,
};
