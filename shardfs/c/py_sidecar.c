/*
 * py_sidecar.c — Sidecar, SidecarSet and build_sidecar() of shardfs._shardfs
 * (sidecar.h): a shard's prefix filter, and the filters of a set of shards.
 */
#include "py_module.h"

/* ---------------------------------------------------------------- Sidecar */

/* An unusable sidecar file (SFS_ESTALE: another shard's; SFS_ECORRUPT: damaged)
 * raises StaleSidecarError; the rest as raise_error. */
static PyObject *raise_sidecar_error(const sfs_error_t *err)
{
    if (err->status == SFS_ESTALE || err->status == SFS_ECORRUPT) {
        return raise_message(StaleSidecarError, err->message);
    }
    return raise_error(err);
}

/* The struct is in py_module.h: Reader.deleted_slots reads it too. */

static int Sidecar_init(Sidecar *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "identity", "slot_count", NULL};
    PyObject *path_obj, *ident_obj;
    unsigned long long slot_count;
    uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&OK", kwlist, PyUnicode_FSConverter, &path_obj,
                                     &ident_obj, &slot_count))
        return -1;
    if (self->users) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "the sidecar is in a SidecarSet");
        return -1;
    }
    if (get_identity(ident_obj, identity) < 0) {
        Py_DECREF(path_obj);
        return -1;
    }
    sfs_error_t err;
    sfs_sidecar_t *sc = NULL;
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    sfs_guard_install();
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = sfs_fail(&err, SFS_ECORRUPT, 0, "%s: the file shrank while it was opened", path),
                rc = sfs_sidecar_open(path, identity, slot_count, &sc, &err));
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK) {
        Py_DECREF(path_obj);
        raise_sidecar_error(&err);
        return -1;
    }
    sfs_sidecar_close(self->sc);
    self->sc = sc;
    Py_XSETREF(self->path, path_obj);
    self->closed = 0;
    return 0;
}

static void Sidecar_dealloc(Sidecar *self)
{
    sfs_sidecar_close(self->sc);
    Py_XDECREF(self->path);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Sidecar_close(Sidecar *self, PyObject *unused)
{
    self->closed = 1;
    if (self->users == 0) {
        sfs_sidecar_close(self->sc);
        self->sc = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Sidecar_may_contain(Sidecar *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!sidecar_ready(self) || get_key(arg, key) < 0)
        return NULL;
    int rc = SFS_OK, yes = 0;
    SFS_GUARDED(rc = SFS_EGONE, yes = sfs_sidecar_may_contain(self->sc, key));
    if (rc == SFS_EGONE)
        return gone(PyBytes_AS_STRING(self->path));
    return PyBool_FromLong(yes);
}

/* range(prefix, prefix_bits) -> (begin, end) */
static PyObject *Sidecar_range(Sidecar *self, PyObject *args)
{
    Py_buffer prefix;
    unsigned int bits;
    if (!sidecar_ready(self) || !PyArg_ParseTuple(args, "y*I", &prefix, &bits))
        return NULL;
    if ((uint64_t)bits > 8 * (uint64_t)prefix.len) {
        PyErr_Format(PyExc_ValueError, "prefix_bits is %u, the prefix has only %zd bytes", bits,
                     prefix.len);
        PyBuffer_Release(&prefix);
        return NULL;
    }
    uint64_t begin = 0, end = 0;
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, sfs_sidecar_range(self->sc, prefix.buf, bits, &begin, &end));
    PyBuffer_Release(&prefix);
    if (rc == SFS_EGONE)
        return gone(PyBytes_AS_STRING(self->path));
    return Py_BuildValue("(KK)", (unsigned long long)begin, (unsigned long long)end);
}

/* slots(begin, end) -> list of int */
static PyObject *Sidecar_slots(Sidecar *self, PyObject *args)
{
    unsigned long long begin, end;
    if (!sidecar_ready(self) || !PyArg_ParseTuple(args, "KK", &begin, &end))
        return NULL;
    uint64_t n = sfs_sidecar_count(self->sc);
    if (begin > end || end > n) {
        PyErr_Format(PyExc_IndexError, "positions [%llu, %llu) outside [0, %llu]", begin, end,
                     (unsigned long long)n);
        return NULL;
    }
    PyObject *list = PyList_New((Py_ssize_t)(end - begin));
    if (!list)
        return NULL;
    uint32_t chunk[1024];
    for (uint64_t at = begin; at < end;) {
        uint64_t m = end - at < 1024 ? end - at : 1024;
        int rc = SFS_OK;
        SFS_GUARDED(rc = SFS_EGONE, sfs_sidecar_slots(self->sc, at, at + m, chunk));
        if (rc == SFS_EGONE) {
            Py_DECREF(list);
            return gone(PyBytes_AS_STRING(self->path));
        }
        for (uint64_t j = 0; j < m; j++) {
            PyObject *v = PyLong_FromUnsignedLong(chunk[j]);
            if (!v) {
                Py_DECREF(list);
                return NULL;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)(at + j - begin), v);
        }
        at += m;
    }
    return list;
}

static PyObject *Sidecar_count(Sidecar *self, void *closure)
{
    if (!sidecar_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_sidecar_count(self->sc));
}

static PyObject *Sidecar_prefix_bits(Sidecar *self, void *closure)
{
    if (!sidecar_ready(self))
        return NULL;
    return PyLong_FromUnsignedLong(sfs_sidecar_prefix_bits(self->sc));
}

static PyObject *Sidecar_slot_count(Sidecar *self, void *closure)
{
    if (!sidecar_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_sidecar_slot_count(self->sc));
}

static PyObject *Sidecar_closed(Sidecar *self, void *closure)
{
    return PyBool_FromLong(!self->sc || self->closed);
}

static PyMethodDef Sidecar_methods[] = {
    {"close", (PyCFunction)Sidecar_close, METH_NOARGS,
     "Unmap the file (at once, or when the last SidecarSet shard number holding it goes)."},
    {"may_contain", (PyCFunction)Sidecar_may_contain, METH_O,
     "may_contain(key32) -> False when the key is certainly not in the shard."},
    {"range", (PyCFunction)Sidecar_range, METH_VARARGS,
     "range(prefix, prefix_bits) -> (begin, end): positions of the entries whose key starts "
     "with the first prefix_bits bits of prefix (bytes, at least ceil(prefix_bits / 8) of them, "
     "else ValueError). Bits past the sidecar's own self.prefix_bits + 32 are ignored: the "
     "range is then a superset."},
    {"slots", (PyCFunction)Sidecar_slots, METH_VARARGS,
     "slots(begin, end) -> [slot, ...] of positions [begin, end); IndexError outside [0, count]."},
    {NULL},
};

static PyGetSetDef Sidecar_getset[] = {
    {"count", (getter)Sidecar_count, NULL, "Entries: live keys of the shard at build.", NULL},
    {"prefix_bits", (getter)Sidecar_prefix_bits, NULL, "Bits of the bucket directory (p).", NULL},
    {"slot_count", (getter)Sidecar_slot_count, NULL, "Slots of the shard it was built for.", NULL},
    {"closed", (getter)Sidecar_closed, NULL, "True after close().", NULL},
    {NULL},
};

PyTypeObject SidecarType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.Sidecar",
    .tp_basicsize = sizeof(Sidecar),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Sidecar(path, identity, slot_count): an open sidecar file (see sidecar.h). "
              "StaleSidecarError when it belongs to another shard or is damaged; OSError when "
              "it cannot be opened.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sidecar_init,
    .tp_dealloc = (destructor)Sidecar_dealloc,
    .tp_methods = Sidecar_methods,
    .tp_getset = Sidecar_getset,
};

/* build_sidecar(reader, path, identity) */
PyObject *build_sidecar(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"reader", "path", "identity", NULL};
    PyObject *reader_obj, *path_obj, *ident_obj;
    uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O&O", kwlist, &ReaderType, &reader_obj,
                                     PyUnicode_FSConverter, &path_obj, &ident_obj))
        return NULL;
    Reader *reader = (Reader *)reader_obj;
    if (!reader_ready(reader) || get_identity(ident_obj, identity) < 0) {
        Py_DECREF(path_obj);
        return NULL;
    }
    sfs_error_t err;
    int rc;
    const char *path = PyBytes_AS_STRING(path_obj);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "%s: the shard shrank while its sidecar was built",
                              sfs_path(reader->shard)),
                rc = sfs_sidecar_build(reader->shard, path, identity, &err));
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc != SFS_OK)
        return raise_sidecar_error(&err);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- SidecarSet */

/* The struct is in py_module.h: OpenShards.find reads the compact arrays. */

/* Let go of a sidecar taken out of the set (after the table lock is
 * released: this may close it and run its dealloc). */
static void release_sidecar(Sidecar *sc)
{
    if (sc) {
        if (--sc->users == 0 && sc->closed) {
            sfs_sidecar_close(sc->sc);
            sc->sc = NULL;
        }
        Py_DECREF(sc);
    }
}

static void SidecarSet_dealloc(SidecarSet *self)
{
    /* no request reads a set being deallocated: no table lock */
    for (Py_ssize_t i = 0; i < self->len; i++)
        release_sidecar((Sidecar *)self->sidecars[i]);
    PyMem_Free(self->sidecars);
    PyMem_Free(self->active);
    PyMem_Free(self->packed);
    PyMem_Free(self->numbers);
    PyMem_Free(self->out);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int number_arg(PyObject *arg, Py_ssize_t *i)
{
    *i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (*i == -1 && PyErr_Occurred())
        return -1;
    if (*i < 0 || (uint64_t)*i >= UINT32_MAX) {
        PyErr_Format(PyExc_IndexError, "shard number %zd outside [0, 2^32 - 1)", *i);
        return -1;
    }
    return 0;
}

/* set(i, sidecar_or_None) */
static PyObject *SidecarSet_set(SidecarSet *self, PyObject *args)
{
    PyObject *i_obj, *obj;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "OO", &i_obj, &obj) || number_arg(i_obj, &i) < 0)
        return NULL;
    if (obj != Py_None) {
        if (!PyObject_TypeCheck(obj, &SidecarType)) {
            PyErr_SetString(PyExc_TypeError, "set(i, x): x must be a Sidecar or None");
            return NULL;
        }
        if (!sidecar_ready((Sidecar *)obj))
            return NULL;
    }
    table_changed(); /* packed is stale from now on */
    if (grow_dense((void **)&self->sidecars, sizeof(PyObject *), &self->active, &self->cap, i, 16) < 0) {
        return NULL;
    }
    if (i >= self->len)
        self->len = i + 1;
    Sidecar *old = (Sidecar *)self->sidecars[i];
    self->sidecars[i] = NULL;
    if (obj != Py_None) {
        Py_INCREF(obj);
        ((Sidecar *)obj)->users++;
        self->sidecars[i] = obj;
    }
    self->active[i] = 1;
    self->dirty = 1;
    release_sidecar(old);
    Py_RETURN_NONE;
}

/* remove(i): inactive from now on (no-op when it is not active) */
static PyObject *SidecarSet_remove(SidecarSet *self, PyObject *arg)
{
    Py_ssize_t i;
    if (number_arg(arg, &i) < 0)
        return NULL;
    if (i < self->len && self->active[i]) {
        table_changed();
        Sidecar *old = (Sidecar *)self->sidecars[i];
        self->sidecars[i] = NULL;
        self->active[i] = 0;
        self->dirty = 1;
        release_sidecar(old);
    }
    Py_RETURN_NONE;
}

/* Rebuild the compact arrays (a request snapshot copies them, holding
 * each sidecar: ll_snapshot.c). Returns 0, or -1 with MemoryError set. */
int sidecar_set_pack(SidecarSet *self)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->len; i++)
        n += self->active[i];
    size_t want = (size_t)(n ? n : 1);
    sfs_sidecar_t **packed = PyMem_Realloc(self->packed, want * sizeof(*packed));
    if (packed)
        self->packed = packed;
    uint32_t *numbers = PyMem_Realloc(self->numbers, want * sizeof(uint32_t));
    if (numbers)
        self->numbers = numbers;
    uint32_t *out = PyMem_Realloc(self->out, want * sizeof(uint32_t));
    if (out)
        self->out = out;
    if (!packed || !numbers || !out) {
        PyErr_NoMemory();
        return -1;
    }
    n = 0;
    for (Py_ssize_t i = 0; i < self->len; i++) {
        if (!self->active[i])
            continue;
        Sidecar *sc = (Sidecar *)self->sidecars[i];
        packed[n] = sc ? sc->sc : NULL;
        numbers[n++] = (uint32_t)i;
    }
    self->nactive = n;
    self->dirty = 0;
    return 0;
}

/* candidates(key32) -> list of int */
static PyObject *SidecarSet_candidates(SidecarSet *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (get_key(arg, key) < 0 || (self->dirty && sidecar_set_pack(self) < 0))
        return NULL;
    size_t n = 0;
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, n = sfs_sidecar_candidates(self->packed, (size_t)self->nactive, key,
                                                           self->out, (size_t)self->nactive));
    if (rc == SFS_EGONE)
        return gone(SIDECAR_OF_SET);
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (size_t j = 0; j < n; j++) {
        PyObject *v = PyLong_FromUnsignedLong(self->numbers[self->out[j]]);
        if (!v) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)j, v);
    }
    return list;
}

static Py_ssize_t SidecarSet_len(SidecarSet *self)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->len; i++)
        n += self->active[i];
    return n;
}

static PyObject *SidecarSet_size(SidecarSet *self, void *closure)
{
    return PyLong_FromSsize_t(self->len);
}

static PyMethodDef SidecarSet_methods[] = {
    {"set", (PyCFunction)SidecarSet_set, METH_VARARGS,
     "set(i, sidecar_or_None): make shard number i active, filtered by the Sidecar (kept referenced) "
     "or, with None, always a candidate."},
    {"remove", (PyCFunction)SidecarSet_remove, METH_O,
     "remove(i): make shard number i inactive (never a candidate); no-op if it is not active."},
    {"candidates", (PyCFunction)SidecarSet_candidates, METH_O,
     "candidates(key32) -> [i, ...] in increasing order: the active shard numbers whose sidecar may "
     "contain the key, or that have none."},
    {NULL},
};

static PyGetSetDef SidecarSet_getset[] = {
    {"size", (getter)SidecarSet_size, NULL, "1 + the largest shard number ever set (0 when empty).",
     NULL},
    {NULL},
};

static PySequenceMethods SidecarSet_as_sequence = {
    .sq_length = (lenfunc)SidecarSet_len,
};

PyTypeObject SidecarSetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.SidecarSet",
    .tp_basicsize = sizeof(SidecarSet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SidecarSet(): shard numbers i -> Sidecar (filtered), None (always a candidate) or "
              "inactive; len() counts the active ones. Not thread-safe: use under the GIL.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)SidecarSet_dealloc,
    .tp_methods = SidecarSet_methods,
    .tp_getset = SidecarSet_getset,
    .tp_as_sequence = &SidecarSet_as_sequence,
};
