/*
 * py_openshards.c — the OpenShards type of shardfs._shardfs: the shards a
 * set holds open in the process, by number, which the C resolver's
 * snapshots take (ll_snapshot.c), with the marks of their use (touched).
 */
#include "py_module.h"

/* ---------------------------------------------------------------- OpenShards */

/* Empty entry e and let its reader go (a snapshot holds its own
 * reference on the shard). */
static void release_open_entry(OpenShards *self, open_entry_t *e)
{
    Reader *r = e->reader;
    PyObject *member = e->member;
    e->shard = NULL;
    e->reader = NULL;
    e->member = NULL;
    if (!r)
        return;
    self->count--;
    Py_DECREF(member);
    reader_unhold(r);
    Py_DECREF(r);
}

static void OpenShards_clear_entries(OpenShards *self)
{
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        open_entry_t old = self->entries[i];
        table_changed();
        memset(&self->entries[i], 0, sizeof(open_entry_t));
        self->used[i] = 0;
        release_open_entry(self, &old);
    }
    self->count = 0;
}

static int OpenShards_traverse(OpenShards *self, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        Py_VISIT(self->entries[i].reader);
        Py_VISIT(self->entries[i].member);
    }
    return 0;
}

static int OpenShards_tp_clear(OpenShards *self)
{
    OpenShards_clear_entries(self);
    return 0;
}

static void OpenShards_dealloc(OpenShards *self)
{
    PyObject_GC_UnTrack(self);
    OpenShards_clear_entries(self);
    PyMem_Free(self->entries);
    PyMem_Free(self->used);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int number_arg(PyObject *obj, long long *number)
{
    *number = PyLong_AsLongLong(obj);
    if (*number == -1 && PyErr_Occurred())
        return -1;
    if (*number < 0) {
        PyErr_SetString(PyExc_ValueError, "shard numbers are >= 0");
        return -1;
    }
    return 0;
}

/* set(number, reader, member=None): hold `reader` (a Reader, or None to
 * forget the entry) and `member` for shard `number`. A number past
 * OPEN_SHARDS_MAX_NUMBER is not held (the resolver reports it as not open). */
static PyObject *OpenShards_set(OpenShards *self, PyObject *args)
{
    PyObject *num, *reader, *member = Py_None;
    long long number;
    if (!PyArg_ParseTuple(args, "OO|O:set", &num, &reader, &member) || number_arg(num, &number) < 0)
        return NULL;
    if (reader != Py_None && !PyObject_TypeCheck(reader, &ReaderType)) {
        PyErr_SetString(PyExc_TypeError, "set: reader must be a Reader or None");
        return NULL;
    }
    if (number >= OPEN_SHARDS_MAX_NUMBER) {
        Py_RETURN_NONE;
    }
    if (reader != Py_None && !reader_ready((Reader *)reader))
        return NULL;
    table_changed(); /* the next request snapshot takes the change */
    if (reader != Py_None &&
        grow_dense((void **)&self->entries, sizeof(open_entry_t), &self->used, &self->cap, number, 1024) < 0) {
        return NULL;
    }
    if (number >= self->cap) {
        Py_RETURN_NONE; /* forgetting an entry never held */
    }
    open_entry_t *e = &self->entries[number];
    open_entry_t old = *e;
    memset(e, 0, sizeof(*e)); /* never a stale member left for tp_traverse */
    if (reader != Py_None) {
        Reader *r = (Reader *)reader;
        Py_INCREF(r);
        Py_INCREF(member);
        e->shard = reader_hold(r);
        e->reader = r;
        e->member = member;
        self->count++;
    }
    self->used[number] = 0;
    release_open_entry(self, &old); /* last: a dealloc may run Python code */
    Py_RETURN_NONE;
}

/* get(number) -> the Reader held for `number`, or None. */
static PyObject *OpenShards_get(OpenShards *self, PyObject *arg)
{
    long long number;
    if (number_arg(arg, &number) < 0)
        return NULL;
    PyObject *r = number < self->cap && self->entries[number].reader ? (PyObject *)self->entries[number].reader
                                                                     : Py_None;
    Py_INCREF(r);
    return r;
}

/* touched(number) -> whether a resolver asked shard `number` since the
 * last call for it (the mark is cleared). */
static PyObject *OpenShards_touched(OpenShards *self, PyObject *arg)
{
    long long number;
    if (number_arg(arg, &number) < 0)
        return NULL;
    if (number >= self->cap || !self->used[number])
        Py_RETURN_FALSE;
    self->used[number] = 0;
    Py_RETURN_TRUE;
}

static PyObject *OpenShards_clear(OpenShards *self, PyObject *unused)
{
    OpenShards_clear_entries(self);
    Py_RETURN_NONE;
}

static Py_ssize_t OpenShards_len(OpenShards *self)
{
    return self->count;
}

static PyMethodDef OpenShards_methods[] = {
    {"set", (PyCFunction)OpenShards_set, METH_VARARGS,
     "set(number, reader, member=None): hold a Reader (None: forget) and its member for shard number"},
    {"get", (PyCFunction)OpenShards_get, METH_O, "get(number) -> the Reader held, or None"},
    {"touched", (PyCFunction)OpenShards_touched, METH_O,
     "touched(number) -> whether a resolver asked it since the last call (the mark is cleared)"},
    {"clear", (PyCFunction)OpenShards_clear, METH_NOARGS, "forget every entry"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods OpenShards_as_sequence = {
    .sq_length = (lenfunc)OpenShards_len,
};

PyTypeObject OpenShardsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardfs._shardfs.OpenShards",
    .tp_basicsize = sizeof(OpenShards),
    .tp_dealloc = (destructor)OpenShards_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)OpenShards_traverse,
    .tp_clear = (inquiry)OpenShards_tp_clear,
    .tp_doc = "OpenShards(): the open shards of a set by shard number (Reader and member), "
              "which the C resolver's snapshots take (shardfs.fuse.handlers, ShardSet.resolver)",
    .tp_methods = OpenShards_methods,
    .tp_as_sequence = &OpenShards_as_sequence,
    .tp_new = PyType_GenericNew,
};
