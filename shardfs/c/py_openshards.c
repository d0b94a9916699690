/*
 * py_openshards.c — the OpenShards type of shardfs._shardfs: a mount's open
 * shards by number, and find(), a key's lookup over the global index
 * levels, the filters and those shards in one call.
 */
#include "py_module.h"

/* ---------------------------------------------------------------- candidates */

/* Shard numbers that may hold a key, gathered from the global index levels
 * and the per-shard filters: sorted, distinct, every one >= start and <
 * below (below < 0: no bound). The first LOOKUP_STACK live in `stack`;
 * more (many shards sharing a 40-bit prefix: a key stored in all of them)
 * are kept in a PyMem buffer freed by candidates_free. */
typedef struct {
    int64_t stack[LOOKUP_STACK];
    int64_t *v;
    size_t n, cap;
} candidates_t;

static void candidates_init(candidates_t *c)
{
    c->v = c->stack;
    c->n = 0;
    c->cap = LOOKUP_STACK;
}

static void candidates_free(candidates_t *c)
{
    if (c->v != c->stack)
        PyMem_Free(c->v);
    c->v = c->stack;
}

/* Append `number` unless present. Returns -1 (MemoryError set) on failure. */
static int candidates_add(candidates_t *c, int64_t number)
{
    for (size_t k = 0; k < c->n; k++)
        if (c->v[k] == number)
            return 0;
    if (c->n == c->cap) {
        size_t cap = c->cap * 2;
        int64_t *v = c->v == c->stack ? PyMem_Malloc(cap * sizeof(int64_t))
                                      : PyMem_Realloc(c->v, cap * sizeof(int64_t));
        if (!v) {
            PyErr_NoMemory();
            return -1;
        }
        if (c->v == c->stack)
            memcpy(v, c->stack, sizeof(c->stack));
        c->v = v;
        c->cap = cap;
    }
    c->v[c->n++] = number;
    return 0;
}

/* Candidates of `key` in levels (a tuple of GlobalIndex) through maps (a
 * tuple of buffers of native int64: item i maps level i's shard index to a
 * shard number, negative when not served), and in `filters` (a SidecarSet,
 * or NULL / None). Returns 0, or -1 with an exception set (TypeError,
 * ValueError for a closed level, OSError EIO when a mapping shrank). */
static int collect_candidates(PyObject *levels, PyObject *maps, PyObject *filters,
                              const uint8_t key[SFS_KEY_SIZE], int64_t start, int64_t below,
                              candidates_t *c)
{
    Py_ssize_t nlevels = PyTuple_GET_SIZE(levels);
    if (PyTuple_GET_SIZE(maps) != nlevels) {
        PyErr_SetString(PyExc_ValueError, "levels and maps differ in length");
        return -1;
    }
    for (Py_ssize_t i = 0; i < nlevels; i++) {
        PyObject *lv = PyTuple_GET_ITEM(levels, i);
        if (!PyObject_TypeCheck(lv, &GlobalIndexType)) {
            PyErr_SetString(PyExc_TypeError, "levels must be GlobalIndex objects");
            return -1;
        }
        GlobalIndex *g = (GlobalIndex *)lv;
        if (!gindex_ready(g))
            return -1;
        Py_buffer view;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(maps, i), &view, PyBUF_SIMPLE) < 0)
            return -1;
        const int64_t *map = (const int64_t *)view.buf;
        size_t nmap = (size_t)view.len / sizeof(int64_t);
        uint32_t stack[LOOKUP_STACK], *out;
        size_t n = 0;
        int rc = gindex_lookup_all(g->g, key, stack, &out, &n);
        int failed = rc != SFS_OK;
        if (rc == SFS_EGONE)
            gone(sfs_gindex_path(g->g));
        for (size_t j = 0; !failed && j < n; j++) {
            if (out[j] >= nmap)
                continue;
            int64_t number = map[out[j]];
            if (number < 0 || number < start || (below >= 0 && number >= below))
                continue;
            failed = candidates_add(c, number) < 0;
        }
        if (out != stack)
            PyMem_Free(out);
        PyBuffer_Release(&view);
        if (failed)
            return -1;
    }
    if (filters && filters != Py_None) {
        if (!PyObject_TypeCheck(filters, &SidecarSetType)) {
            PyErr_SetString(PyExc_TypeError, "filters must be a SidecarSet or None");
            return -1;
        }
        SidecarSet *set = (SidecarSet *)filters;
        if (set->dirty && sidecar_set_pack(set) < 0)
            return -1;
        size_t n = 0;
        int rc = SFS_OK;
        if (set->nactive) {
            SFS_GUARDED(rc = SFS_EGONE, n = sfs_sidecar_candidates(set->packed, (size_t)set->nactive, key,
                                                                   set->out, (size_t)set->nactive));
        }
        if (rc == SFS_EGONE) {
            gone(SIDECAR_OF_SET);
            return -1;
        }
        for (size_t j = 0; j < n; j++) {
            int64_t number = set->numbers[set->out[j]];
            if (number >= start && (below < 0 || number < below) && candidates_add(c, number) < 0)
                return -1;
        }
    }
    /* insertion sort: n is almost always 0 or 1 */
    for (size_t a = 1; a < c->n; a++) {
        int64_t v = c->v[a];
        size_t b = a;
        while (b > 0 && c->v[b - 1] > v) {
            c->v[b] = c->v[b - 1];
            b--;
        }
        c->v[b] = v;
    }
    return 0;
}

/* ---------------------------------------------------------------- OpenShards */

/* Empty entry e and let its reader go (a request snapshot or a find
 * running without the GIL holds its own reference on the shard). */
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
 * OPEN_SHARDS_MAX_NUMBER is not held (find reports it as not open). */
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

/* touched(number) -> whether find probed shard `number` since the last
 * call for it (the mark is cleared). */
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

/* find(key32, levels, maps, filters=None, start=0, below=-1, count=True)
 *   -> (member, slot, data_offset, size) | None | int
 * The first candidate shard (collect_candidates: numbers >= start and <
 * below, in increasing order) holding the key: a tuple with the member set
 * for its number; None when no candidate holds it; an int, the number of
 * the first candidate that is not held here (open it, set() it and call
 * again with start = that number; start = number + 1 to skip it). Each
 * candidate held is probed (its slot read), adding 1 to `probes` when
 * `count`. The GIL is released for the probes (they may wait for the
 * device). Raises CorruptShardError for a corrupt slot, OSError (EIO) when
 * a mapping shrank, ValueError for a closed Reader or level, TypeError for
 * bad arguments. */
#define FIND_ARGS 7
static const char *const find_names[FIND_ARGS] = {"key", "levels", "maps", "filters", "start", "below",
                                                  "count"};

/* Arguments of find by position (vectorcall: no tuple nor dict is built for
 * a call, which costs as much as an absent key's whole lookup). */
static int find_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject *out[FIND_ARGS])
{
    for (int i = 0; i < FIND_ARGS; i++)
        out[i] = NULL;
    if (nargs > FIND_ARGS) {
        PyErr_Format(PyExc_TypeError, "find() takes at most %d arguments (%zd given)", FIND_ARGS, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < FIND_ARGS && PyUnicode_CompareWithASCIIString(name, find_names[i]) != 0)
            i++;
        if (i == FIND_ARGS || out[i]) {
            PyErr_Format(PyExc_TypeError, "find() got %s argument '%U'",
                         i == FIND_ARGS ? "an unexpected" : "more than one value for", name);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (int i = 0; i < 3; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "find() missing required argument '%s'", find_names[i]);
            return -1;
        }
    if (!PyTuple_Check(out[1]) || !PyTuple_Check(out[2])) {
        PyErr_SetString(PyExc_TypeError, "find(): levels and maps must be tuples");
        return -1;
    }
    return 0;
}

static PyObject *OpenShards_find(OpenShards *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *a[FIND_ARGS];
    if (find_args(args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *keyobj = a[0], *levels = a[1], *maps = a[2], *filters = a[3] ? a[3] : Py_None;
    long long start = 0, below = -1;
    int count = 1;
    if ((a[4] && (start = PyLong_AsLongLong(a[4])) == -1 && PyErr_Occurred()) ||
        (a[5] && (below = PyLong_AsLongLong(a[5])) == -1 && PyErr_Occurred()) ||
        (a[6] && (count = PyObject_IsTrue(a[6])) < 0))
        return NULL;
    uint8_t key[SFS_KEY_SIZE];
    if (get_key(keyobj, key) < 0)
        return NULL;
    candidates_t c;
    candidates_init(&c);
    if (collect_candidates(levels, maps, filters, key, start, below, &c) < 0) {
        candidates_free(&c);
        return NULL;
    }
    /* The held candidates up to the first one not held, each shard held by
     * a reference of its own while the GIL is released. */
    sfs_shard_t *held[LOOKUP_STACK];
    int64_t numbers[LOOKUP_STACK];
    size_t nheld = 0;
    int64_t missing = -1;
    for (size_t j = 0; j < c.n; j++) {
        int64_t number = c.v[j];
        open_entry_t *e = number < self->cap ? &self->entries[number] : NULL;
        if (!e || !e->reader || nheld == LOOKUP_STACK) {
            missing = number; /* also past LOOKUP_STACK probes: the caller resumes there */
            break;
        }
        /* Start loading what the probe reads first, and the member (the
         * answer if this shard holds the key), so that their cache misses
         * overlap instead of following one another. */
        sfs_prefetch_reader(e->shard);
        __builtin_prefetch(e->member, 1, 3);
        numbers[nheld] = number;
        held[nheld++] = sfs_ref(e->shard);
    }
    candidates_free(&c);
    int rc = SFS_ENOTFOUND;
    size_t hit = nheld;
    /* the first candidate that could not be probed (its file shrank, or
     * the slot is corrupt): told only if no other candidate holds the key */
    volatile size_t failed_at = nheld;
    volatile int failed_rc = SFS_OK;
    uint32_t slot = 0;
    uint64_t off = 0, size = 0;
    if (nheld) {
        Py_BEGIN_ALLOW_THREADS
        for (size_t j = 0; j < nheld; j++) {
            SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_slot(held[j], key, &slot, &off, &size));
            if (rc == SFS_OK) {
                hit = j;
                break;
            }
            if (rc != SFS_ENOTFOUND && failed_at == nheld) {
                failed_at = j;
                failed_rc = rc;
            }
        }
        Py_END_ALLOW_THREADS
    }
    size_t probed = hit < nheld ? hit + 1 : nheld;
    if (count)
        self->probes += probed;
    for (size_t j = 0; j < probed; j++)
        self->used[numbers[j]] = 1;
    PyObject *result = NULL;
    if (hit < nheld) {
        open_entry_t *e = numbers[hit] < self->cap ? &self->entries[numbers[hit]] : NULL;
        /* set() may have replaced the entry while the GIL was released: the
         * answer is only given for the shard still held (else the caller
         * asks again). */
        if (e && e->shard == held[hit])
            result = Py_BuildValue("(OkKK)", e->member, (unsigned long)slot, (unsigned long long)off,
                                   (unsigned long long)size);
        else
            result = PyLong_FromLongLong(numbers[hit]);
    } else if (missing >= 0) {
        result = PyLong_FromLongLong(missing);
    } else if (failed_at < nheld) {
        if (failed_rc == SFS_EGONE)
            gone(sfs_path(held[failed_at]));
        else
            corrupt_slot(held[failed_at]);
    } else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
    for (size_t j = 0; j < nheld; j++)
        sfs_close(held[j]);
    return result;
}
static PyObject *OpenShards_get_probes(OpenShards *self, void *closure)
{
    return PyLong_FromUnsignedLongLong(self->probes);
}

static int OpenShards_set_probes(OpenShards *self, PyObject *value, void *closure)
{
    unsigned long long v = value ? PyLong_AsUnsignedLongLong(value) : (unsigned long long)-1;
    if (v == (unsigned long long)-1 && (!value || PyErr_Occurred())) {
        if (!value)
            PyErr_SetString(PyExc_TypeError, "probes cannot be deleted");
        return -1;
    }
    self->probes = v;
    return 0;
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
     "touched(number) -> whether find probed it since the last call (the mark is cleared)"},
    {"clear", (PyCFunction)OpenShards_clear, METH_NOARGS, "forget every entry"},
    {"find", (PyCFunction)(void (*)(void))OpenShards_find, METH_FASTCALL | METH_KEYWORDS,
     "find(key32, levels, maps, filters=None, start=0, below=-1, count=True) -> (member, slot, "
     "data_offset, size), None (no candidate holds it) or an int (the first candidate not held: "
     "set() it and call again with start=that number)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef OpenShards_getset[] = {
    {"probes", (getter)OpenShards_get_probes, (setter)OpenShards_set_probes,
     "index slots read by find (count=True calls)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
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
              "and find() over them in one call",
    .tp_methods = OpenShards_methods,
    .tp_getset = OpenShards_getset,
    .tp_as_sequence = &OpenShards_as_sequence,
    .tp_new = PyType_GenericNew,
};
