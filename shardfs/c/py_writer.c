/*
 * py_writer.c — the Writer type of shardfs._shardfs: a shard being written
 * (shard.h: sfs_writer_open, add, finish).
 */
#include "py_module.h"
#include <unistd.h>

typedef struct {
    PyObject_HEAD
    sfs_writer_t *w;
    int busy; /* add_files runs (the GIL released): the writer is not to be touched */
} Writer;

/* 0 with ValueError while add_files runs in another thread. */
static int writer_idle(Writer *self)
{
    if (self->busy) {
        PyErr_SetString(PyExc_ValueError, "the shard writer is in use by another thread");
        return 0;
    }
    return 1;
}

static int writer_ready(Writer *self)
{
    if (!self->w) {
        PyErr_SetString(PyExc_ValueError, "the shard writer is closed");
        return 0;
    }
    return writer_idle(self);
}

static int Writer_init(Writer *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", NULL};
    PyObject *path_obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&", kwlist, PyUnicode_FSConverter, &path_obj))
        return -1;
    if (!writer_idle(self)) {
        Py_DECREF(path_obj);
        return -1;
    }
    sfs_error_t err;
    sfs_writer_t *w = NULL;
    int rc = sfs_writer_open(PyBytes_AS_STRING(path_obj), &w, &err);
    Py_DECREF(path_obj);
    if (rc != SFS_OK) {
        raise_error(&err);
        return -1;
    }
    sfs_writer_abort(self->w);
    self->w = w;
    return 0;
}

static void Writer_dealloc(Writer *self)
{
    sfs_writer_abort(self->w);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Writer_add(Writer *self, PyObject *args)
{
    PyObject *key_obj;
    Py_buffer data;
    uint8_t key[SFS_KEY_SIZE];
    if (!writer_ready(self) || !PyArg_ParseTuple(args, "Oy*", &key_obj, &data))
        return NULL;
    if (get_key(key_obj, key) < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    sfs_error_t err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_writer_add(self->w, key, data.buf, (uint64_t)data.len, &err);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&data);
    if (rc != SFS_OK)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static PyObject *Writer_add_fd(Writer *self, PyObject *args)
{
    PyObject *key_obj;
    int fd;
    unsigned long long size;
    uint8_t key[SFS_KEY_SIZE];
    if (!writer_ready(self) || !PyArg_ParseTuple(args, "OiK", &key_obj, &fd, &size))
        return NULL;
    if (get_key(key_obj, key) < 0)
        return NULL;
    sfs_error_t err;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_writer_add_fd(self->w, key, fd, size, &err);
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK)
        return raise_error(&err);
    Py_RETURN_NONE;
}

static PyObject *Writer_add_files(Writer *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"paths", "small", "threads", "exclude", NULL};
    PyObject *paths_obj, *exclude = Py_None;
    unsigned long long small;
    unsigned int threads;
    if (!writer_ready(self) ||
        !PyArg_ParseTupleAndKeywords(args, kwds, "OKI|O", kwlist, &paths_obj, &small, &threads,
                                     &exclude))
        return NULL;
    unsigned long long ex_dev = 0, ex_ino = 0;
    if (exclude != Py_None && !PyArg_ParseTuple(exclude, "KK;exclude is (st_dev, st_ino)",
                                                &ex_dev, &ex_ino))
        return NULL;
    PyObject *seq = PySequence_Fast(paths_obj, "paths must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **encoded = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    const char **paths = PyMem_Calloc(n ? n : 1, sizeof(char *));
    PyObject *result = NULL;
    if (!encoded || !paths) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &encoded[i]))
            goto out;
        paths[i] = PyBytes_AS_STRING(encoded[i]);
    }
    sfs_error_t err;
    sfs_add_files_result_t res;
    int rc;
    self->busy = 1;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_writer_add_files(self->w, paths, (size_t)n, small, threads, exclude != Py_None,
                              ex_dev, ex_ino, &res, &err);
    Py_END_ALLOW_THREADS
    self->busy = 0;
    if (rc != SFS_OK) {
        raise_error(&err);
        goto out;
    }
    PyObject *dups = PyList_New((Py_ssize_t)res.n_dups);
    for (size_t k = 0; dups && k < res.n_dups; k++) {
        PyObject *item = Py_BuildValue("(ny#)", (Py_ssize_t)res.dup_index[k],
                                       res.dup_keys + SFS_KEY_SIZE * k, (Py_ssize_t)SFS_KEY_SIZE);
        if (!item)
            Py_CLEAR(dups);
        else
            PyList_SET_ITEM(dups, (Py_ssize_t)k, item);
    }
    free(res.dup_index);
    free(res.dup_keys);
    if (dups)
        result = Py_BuildValue("(niN)", (Py_ssize_t)res.done, res.stopped, dups);
out:
    if (encoded)
        for (Py_ssize_t i = 0; i < n; i++)
            Py_XDECREF(encoded[i]);
    PyMem_Free(encoded);
    PyMem_Free(paths);
    Py_DECREF(seq);
    return result;
}

static PyObject *Writer_contains(Writer *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!writer_ready(self) || get_key(arg, key) < 0)
        return NULL;
    return PyBool_FromLong(sfs_writer_contains(self->w, key));
}

static PyObject *Writer_finish(Writer *self, PyObject *unused)
{
    if (!writer_ready(self))
        return NULL;
    sfs_writer_t *w = self->w;
    self->w = NULL;
    sfs_error_t err;
    sfs_build_stats_t st;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = sfs_writer_finish(w, &st, &err);
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK)
        return raise_error(&err);
    return Py_BuildValue("{s:d,s:d,s:d,s:d,s:K,s:s}", "hash_seconds", st.hash_seconds,
                         "check_seconds", st.check_seconds, "index_seconds", st.index_seconds,
                         "sync_seconds", st.sync_seconds, "slots", (unsigned long long)st.slots,
                         "builder", st.builder);
}

static PyObject *Writer_abort(Writer *self, PyObject *unused)
{
    /* add_files running in another thread (a Ctrl-C in the thread that
     * waited for it) ends by itself, within its batch: wait for it, so that
     * an abort on the way out of an error always discards the shard. */
    while (self->busy) {
        Py_BEGIN_ALLOW_THREADS
        usleep(1000);
        Py_END_ALLOW_THREADS
    }
    sfs_writer_abort(self->w);
    self->w = NULL;
    Py_RETURN_NONE;
}

static PyObject *Writer_count(Writer *self, void *closure)
{
    if (!writer_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_writer_count(self->w));
}

static PyObject *Writer_bytes(Writer *self, void *closure)
{
    if (!writer_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_writer_bytes(self->w));
}

static PyObject *Writer_closed(Writer *self, void *closure)
{
    return PyBool_FromLong(self->w == NULL);
}

static PyMethodDef Writer_methods[] = {
    {"add", (PyCFunction)Writer_add, METH_VARARGS, "add(key32, data): append one object."},
    {"add_fd", (PyCFunction)Writer_add_fd, METH_VARARGS,
     "add_fd(key32, fd, size): append `size` bytes read from fd."},
    {"add_files", (PyCFunction)(void (*)(void))Writer_add_files, METH_VARARGS | METH_KEYWORDS,
     "add_files(paths, small, threads, exclude=None) -> (done, stopped, [(index, key32)...]):\n"
     "add the regular files at `paths` (str, bytes or path-like), in order, keyed by SHA-256,\n"
     "read and hashed by `threads` threads with the GIL released; duplicates skipped and\n"
     "listed. Stops before a path that is a directory (stopped 1) or another non-regular\n"
     "file (stopped 2); `done` paths were consumed. Files of the shard being written and\n"
     "exclude=(st_dev, st_ino) are skipped. OSError naming the file on a read error."},
    {"contains", (PyCFunction)Writer_contains, METH_O, "contains(key32) -> bool."},
    {"finish", (PyCFunction)Writer_finish, METH_NOARGS,
     "Build the perfect hash, write index and header, fsync, rename into place; returns "
     "{hash_seconds, check_seconds, index_seconds, sync_seconds, slots, builder}."},
    {"abort", (PyCFunction)Writer_abort, METH_NOARGS,
     "Discard the shard being written; waits for an add_files running in another thread."},
    {NULL},
};

static PyGetSetDef Writer_getset[] = {
    {"count", (getter)Writer_count, NULL, "Objects added.", NULL},
    {"bytes", (getter)Writer_bytes, NULL, "Object bytes added.", NULL},
    {"closed", (getter)Writer_closed, NULL, "True after finish() or abort().", NULL},
    {NULL},
};

PyTypeObject WriterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.Writer",
    .tp_basicsize = sizeof(Writer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Writer(path): stream objects into a new Read Shard.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Writer_init,
    .tp_dealloc = (destructor)Writer_dealloc,
    .tp_methods = Writer_methods,
    .tp_getset = Writer_getset,
};
