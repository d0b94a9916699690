/*
 * py_mosaic.c — the Mosaic type of shardfs._shardfs: an open MOSAIC file
 * (Software Heritage's format, mosaic.h), read by the C reader.
 *
 * Mosaic(path) opens and validates the file (CorruptShardError for a file
 * that is not a MOSAIC file this reader reads, OSError when it cannot be
 * opened). Keys are bytes of the index's key size (20 for sha1 and
 * sha1_git, 32 for sha256 and blake2s256); an index is named by its kind
 * ("sha1", "sha1_git", "sha256", "blake2s256"). Objects are named by the
 * byte offset of their element in the file (`lookup`, `entry`), the same
 * object through every index. The GIL is released while the file is read
 * (it may wait for the device); every read runs under the SIGBUS guard
 * (guard.h): a file truncated under its mapping raises OSError(EIO).
 * close() from one thread while others read (their GIL released) takes
 * effect at once for new calls (ValueError) and unmaps the file when the
 * last read in flight returns.
 */
#include "py_module.h"
#include "mosaic.h"

#include <unistd.h>

typedef struct {
    PyObject_HEAD
    sfs_mosaic_t *m;       /* NULL once closed */
    int busy;              /* calls in flight that released the GIL (counted with it held) */
    sfs_mosaic_t *retired; /* closed while busy: unmapped by the last of them */
    int sha256;            /* the sha256 index's number, or -1: get's default */
} Mosaic;

/* Bytes of each object a batch asks the kernel to read ahead: most
 * objects are smaller (Software Heritage's median is about 4 KiB); the
 * rest of a larger one is read when reached. */
#define PREFETCH_OBJECT_BYTES (16 * 1024)
/* Keys of a batch whose pages are looked at (mincore) to tell a cached
 * batch from a cold one. */
#define SAMPLE 4

static int mosaic_ready(Mosaic *self)
{
    if (self->m)
        return 0;
    PyErr_SetString(PyExc_ValueError, "closed MOSAIC file");
    return -1;
}

/* The open file, held for a call that releases the GIL (let go with
 * mosaic_let_go), or NULL with ValueError when closed. */
static sfs_mosaic_t *mosaic_hold(Mosaic *self)
{
    if (mosaic_ready(self) < 0)
        return NULL;
    self->busy++;
    return self->m;
}

/* End of a held call: the last one unmaps a file closed meanwhile. */
static void mosaic_let_go(Mosaic *self)
{
    if (--self->busy == 0 && self->retired) {
        sfs_mosaic_close(self->retired);
        self->retired = NULL;
    }
}

/* The index number of kind `name`, or -1 with KeyError (no such index in
 * the file) or ValueError (no such kind). */
static int index_of(Mosaic *self, const char *name)
{
    int kind = sfs_mosaic_kind_of(name);
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "%s: not a kind of key (sha1, sha1_git, sha256, blake2s256)", name);
        return -1;
    }
    int i = sfs_mosaic_find_index(self->m, kind);
    if (i < 0) {
        PyErr_Format(PyExc_KeyError, "%s: no %s index", sfs_mosaic_path(self->m), name);
        return -1;
    }
    return i;
}

static PyObject *mosaic_error(const sfs_mosaic_t *m, int rc, const sfs_error_t *err)
{
    if (rc == SFS_EGONE)
        return gone(sfs_mosaic_path(m));
    return raise_error(err);
}

static int Mosaic_init(Mosaic *self, PyObject *args, PyObject *kwds)
{
    PyObject *pathobj;
    if (!PyArg_ParseTuple(args, "O&:Mosaic", PyUnicode_FSConverter, &pathobj))
        return -1;
    sfs_error_t err = {0};
    sfs_mosaic_t *m = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_open(PyBytes_AS_STRING(pathobj), &m, &err));
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK) {
        if (rc == SFS_EGONE)
            gone(PyBytes_AS_STRING(pathobj));
        else
            raise_error(&err);
        Py_DECREF(pathobj);
        return -1;
    }
    Py_DECREF(pathobj);
    if (self->busy) {
        sfs_mosaic_close(m);
        PyErr_SetString(PyExc_RuntimeError, "Mosaic.__init__ on a file being read");
        return -1;
    }
    sfs_mosaic_close(self->m);
    self->m = m;
    self->sha256 = sfs_mosaic_find_index(m, SFS_MOSAIC_SHA256);
    return 0;
}

static void Mosaic_dealloc(Mosaic *self)
{
    sfs_mosaic_close(self->retired); /* busy is 0: a call holds a reference */
    sfs_mosaic_close(self->m);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Mosaic_close(Mosaic *self, PyObject *unused)
{
    if (self->busy && self->m)
        self->retired = self->m; /* unmapped by the last call in flight */
    else
        sfs_mosaic_close(self->m);
    self->m = NULL;
    Py_RETURN_NONE;
}

/* info() -> dict: what the file's metadata and indexes say. */
static PyObject *Mosaic_info(Mosaic *self, PyObject *unused)
{
    if (mosaic_ready(self) < 0)
        return NULL;
    const sfs_mosaic_info_t *i = sfs_mosaic_info(self->m);
    static const char *const compressions[] = {"none", "zstd", "zstd.dict"};
    PyObject *comments = PyList_New(0), *indexes = PyList_New(0);
    for (size_t c = 0; comments && c < i->comments; c++) {
        size_t len;
        const char *text = sfs_mosaic_comment(self->m, c, &len);
        PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
        if (!s || PyList_Append(comments, s) < 0)
            Py_CLEAR(comments);
        Py_XDECREF(s);
    }
    for (size_t x = 0; indexes && x < i->indexes; x++) {
        const sfs_mosaic_index_info_t *ix = sfs_mosaic_index(self->m, x);
        PyObject *d = Py_BuildValue("{s:s,s:n,s:K,s:K,s:K,s:K}", "name", ix->name, "key_size", (Py_ssize_t)ix->key_size,
                                    "slots", (unsigned long long)ix->slots, "entry_size",
                                    (unsigned long long)ix->entry_size, "position", (unsigned long long)ix->position,
                                    "map_size", (unsigned long long)ix->map_size);
        if (!d || PyList_Append(indexes, d) < 0)
            Py_CLEAR(indexes);
        Py_XDECREF(d);
    }
    if (!comments || !indexes) {
        Py_XDECREF(comments);
        Py_XDECREF(indexes);
        return NULL;
    }
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:s,s:K,s:K,s:K,s:N,s:N,s:n}", "file_size",
                         (unsigned long long)i->file_size, "objects_counter", (unsigned long long)i->objects_counter,
                         "objects_total_size", (unsigned long long)i->objects_total_size, "tiles_position",
                         (unsigned long long)i->tiles_position, "end_of_tiles", (unsigned long long)i->end_of_tiles,
                         "compression", compressions[i->compression], "dictionary_size",
                         (unsigned long long)i->dictionary_size, "doctype_version",
                         (unsigned long long)i->doctype_version, "doctype_read_version",
                         (unsigned long long)i->doctype_read_version, "comments", comments, "indexes", indexes,
                         "skipped_indexes", (Py_ssize_t)i->skipped_indexes);
}

/* lookup(kind, key) -> the object's position (int), or None when absent
 * or deleted. */
static PyObject *Mosaic_lookup(Mosaic *self, PyObject *args)
{
    const char *name;
    Py_buffer key;
    if (mosaic_ready(self) < 0 || !PyArg_ParseTuple(args, "sy*:lookup", &name, &key))
        return NULL;
    int x = index_of(self, name);
    if (x < 0) {
        PyBuffer_Release(&key);
        return NULL;
    }
    sfs_error_t err = {0};
    uint64_t object = 0;
    int rc;
    sfs_mosaic_t *m = mosaic_hold(self);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE,
                rc = sfs_mosaic_lookup(m, (size_t)x, key.buf, (size_t)key.len, NULL, &object, &err));
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&key);
    PyObject *out = NULL;
    if (rc == SFS_ENOTFOUND)
        out = Py_NewRef(Py_None);
    else if (rc == SFS_EINVAL)
        PyErr_Format(PyExc_ValueError, "a %s key is %zu bytes", name, sfs_mosaic_index(m, (size_t)x)->key_size);
    else if (rc != SFS_OK)
        mosaic_error(m, rc, &err);
    else
        out = PyLong_FromUnsignedLongLong(object);
    mosaic_let_go(self);
    return out;
}

/* Raw objects of at most this many bytes are copied with the GIL held:
 * their pages were touched while it was released (lookup_object). */
#define COPY_WITH_GIL 4096

/* Lookup of `key` and its object's element: SFS_OK with the object's
 * position, its stored bytes (at, stored) and decoded size; the pages of
 * a raw object of at most COPY_WITH_GIL bytes touched. SFS_ENOTFOUND, or
 * an error status (err filled). Runs without the GIL, guarded. */
static int object_found(sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, const uint64_t *object, const uint8_t **at,
                        uint64_t *stored, uint64_t *size, sfs_error_t *err);

static int lookup_object(sfs_mosaic_t *m, size_t x, const uint8_t *key, size_t len, sfs_mosaic_ctx_t *ctx,
                         uint64_t *object, const uint8_t **at, uint64_t *stored, uint64_t *size, sfs_error_t *err)
{
    int rc = sfs_mosaic_lookup(m, x, key, len, NULL, object, err);
    return rc != SFS_OK ? rc : object_found(m, ctx, object, at, stored, size, err);
}

/* lookup_object's second half, for the object found at *object. */
static int object_found(sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, const uint64_t *object, const uint8_t **at,
                        uint64_t *stored, uint64_t *size, sfs_error_t *err)
{
    int rc;
    const uint8_t *p = sfs_mosaic_stored(m, *object, stored, &rc);
    if (!p) /* again, for the message */
        return rc == SFS_ENOTFOUND ? rc : sfs_mosaic_object(m, *object, NULL, NULL, err);
    *at = p;
    if (sfs_mosaic_info(m)->compression != SFS_MOSAIC_NONE)
        return sfs_mosaic_object_size(m, ctx, *object, size, NULL, err);
    *size = *stored;
    if (*stored && *stored <= COPY_WITH_GIL) {
        volatile uint8_t last = p[*stored - 1]; /* its second page, if any, read now */
        (void)last;
    }
    return SFS_OK;
}

/* One object's bytes into a new bytes object (*out, NULL when absent or
 * deleted): lookup_object with the GIL released, then the bytes copied or
 * decoded (with the GIL released unless a small raw object, already
 * cached). Returns SFS_OK or an error status (err filled); called with the
 * GIL held and the file held (mosaic_hold). */
static int get_one(sfs_mosaic_t *m, size_t x, const uint8_t *key, size_t len, sfs_mosaic_ctx_t *ctx, PyObject **out,
                   sfs_error_t *err)
{
    uint64_t object = 0, size = 0, stored = 0;
    const uint8_t *at = NULL;
    int rc;
    *out = NULL;
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, rc = lookup_object(m, x, key, len, ctx, &object, &at, &stored, &size, err));
    Py_END_ALLOW_THREADS
    if (rc == SFS_ENOTFOUND)
        return SFS_OK;
    if (rc != SFS_OK)
        return rc;
    if (size > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        return SFS_ENOMEM;
    }
    PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!bytes)
        return SFS_ENOMEM;
    char *buf = PyBytes_AS_STRING(bytes);
    size_t got = 0;
    if (sfs_mosaic_info(m)->compression == SFS_MOSAIC_NONE && size <= COPY_WITH_GIL) {
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_decode(m, ctx, object, at, stored, 0, buf, (size_t)size, &got, err));
    } else {
        Py_BEGIN_ALLOW_THREADS
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_decode(m, ctx, object, at, stored, 0, buf, (size_t)size, &got, err));
        Py_END_ALLOW_THREADS
    }
    if (rc == SFS_OK) /* deleted in place (its element voided) since it was found: not its bytes */
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_object(m, object, NULL, NULL, NULL) == SFS_ENOTFOUND
                                             ? SFS_ENOTFOUND : SFS_OK);
    if (rc == SFS_OK && got != size) {
        rc = err->status = SFS_ECORRUPT;
        snprintf(err->message, sizeof(err->message), "%s: object at byte %llu is shorter than its frame header says",
                 sfs_mosaic_path(m), (unsigned long long)object);
    }
    if (rc != SFS_OK) {
        Py_DECREF(bytes);
        return rc == SFS_ENOTFOUND ? SFS_OK : rc; /* deleted meanwhile */
    }
    *out = bytes;
    return SFS_OK;
}

/* A key of index x from a bytes-like object: its buffer (released by the
 * caller; a bytes object must outlive it), or -1 with ValueError for a
 * wrong length. */
static int get_key_of(const sfs_mosaic_t *m, size_t x, PyObject *obj, Py_buffer *view)
{
    if (PyBytes_CheckExact(obj)) { /* the common case, without the buffer protocol: `obj` outlives the view */
        view->buf = PyBytes_AS_STRING(obj);
        view->len = PyBytes_GET_SIZE(obj);
        view->obj = NULL; /* PyBuffer_Release: nothing to do */
    } else if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0)
        return -1;
    size_t want = sfs_mosaic_index(m, x)->key_size;
    if ((size_t)view->len != want) {
        PyErr_Format(PyExc_ValueError, "a %s key is %zu bytes, got %zd", sfs_mosaic_index(m, x)->name, want,
                     view->len);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* get(key, kind="sha256") -> the object's bytes, or None when absent or
 * deleted. KeyError when the file has no `kind` index. (METH_FASTCALL: a
 * call per object, where argument parsing shows.) */
static PyObject *Mosaic_get(Mosaic *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (mosaic_ready(self) < 0)
        return NULL;
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(key, kind='sha256'): one or two arguments");
        return NULL;
    }
    int x = self->sha256;
    if (nargs == 2 && args[1] != Py_None) {
        const char *name = PyUnicode_AsUTF8(args[1]);
        if (!name || (x = index_of(self, name)) < 0)
            return NULL;
    } else if (x < 0) {
        return PyErr_Format(PyExc_KeyError, "%s: no sha256 index", sfs_mosaic_path(self->m));
    }
    Py_buffer key;
    if (get_key_of(self->m, (size_t)x, args[0], &key) < 0)
        return NULL;
    sfs_error_t err = {0};
    PyObject *out;
    sfs_mosaic_t *m = mosaic_hold(self);
    int rc = get_one(m, (size_t)x, key.buf, (size_t)key.len, sfs_mosaic_thread_ctx(m), &out, &err);
    PyBuffer_Release(&key);
    if (rc != SFS_OK && !(rc == SFS_ENOMEM && PyErr_Occurred()))
        mosaic_error(m, rc, &err);
    mosaic_let_go(self);
    if (rc != SFS_OK)
        return NULL;
    if (!out)
        Py_RETURN_NONE;
    return out;
}

/* A batch's keys are found, then copied or decoded, by this many threads
 * at most (the caller's and the others, made for the batch): the reads of
 * a warm batch wait on memory, of a zstd one on the decoder. A thread per
 * BATCH_PER_THREAD keys, so a small batch makes none. */
#define BATCH_THREADS 4
#define BATCH_PER_THREAD 128
/* Keys a thread takes at a time. */
#define BATCH_CHUNK 16

/* One key of a batch: what the lookup found, then where its bytes go. */
typedef struct {
    const uint8_t *key;
    size_t len;
    uint64_t object, stored, size;
    const uint8_t *at;
    char *dst; /* its bytes object's buffer, NULL: nothing to copy */
    int rc;    /* SFS_OK, SFS_ENOTFOUND (absent or deleted), or an error */
} batch_item_t;

typedef struct {
    sfs_mosaic_t *m;
    size_t x, n;
    batch_item_t *items;
    int copy; /* 0: look the keys up; 1: copy or decode their bytes */
    size_t next;
} batch_t;

/* Look item `it` up, or copy or decode its bytes (re-checked after: an
 * object deleted in place meanwhile is SFS_ENOTFOUND); `err` for the
 * message of a failure. Without the GIL, guarded. */
static void batch_one(batch_t *b, batch_item_t *it, sfs_error_t *err)
{
    sfs_mosaic_ctx_t *ctx = sfs_mosaic_thread_ctx(b->m);
    if (!b->copy) {
        SFS_GUARDED(it->rc = SFS_EGONE, it->rc = lookup_object(b->m, b->x, it->key, it->len, ctx, &it->object,
                                                                &it->at, &it->stored, &it->size, err));
        return;
    }
    if (it->rc != SFS_OK || !it->dst)
        return;
    size_t got = 0;
    SFS_GUARDED(it->rc = SFS_EGONE,
                it->rc = sfs_mosaic_decode(b->m, ctx, it->object, it->at, it->stored, 0, it->dst, (size_t)it->size,
                                           &got, err);
                if (it->rc == SFS_OK && sfs_mosaic_object(b->m, it->object, NULL, NULL, NULL) == SFS_ENOTFOUND)
                    it->rc = SFS_ENOTFOUND);
    if (it->rc == SFS_OK && got != it->size) {
        it->rc = SFS_ECORRUPT;
        sfs_fail(err, SFS_ECORRUPT, 0, "%s: object at byte %llu is shorter than its frame header says",
                 sfs_mosaic_path(b->m), (unsigned long long)it->object);
    }
}

/* The two steps of batch_lookups for one item, guarded (a function each:
 * nothing of the caller's frame is touched after a fault). */
static int guarded_entry(batch_t *b, batch_item_t *it, int64_t v, sfs_error_t *err)
{
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_lookup_at(b->m, b->x, it->key, it->len, v, NULL, &it->object, err));
    return rc;
}

static int guarded_object(batch_t *b, sfs_mosaic_ctx_t *ctx, batch_item_t *it, sfs_error_t *err)
{
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = object_found(b->m, ctx, &it->object, &it->at, &it->stored, &it->size, err));
    return rc;
}

/* batch_one's lookups of `count` items, in three passes so that the
 * memory waits of the items overlap: every key's GOFunction evaluated and
 * its entry asked of the CPU's cache, then every entry read and its
 * object's element asked for, then every element read. */
static void batch_lookups(batch_t *b, batch_item_t *items, size_t count, sfs_error_t *err)
{
    int64_t v[BATCH_CHUNK];
    const sfs_mosaic_index_info_t *ix = sfs_mosaic_index(b->m, b->x);
    sfs_mosaic_ctx_t *ctx = sfs_mosaic_thread_ctx(b->m);
    for (size_t j = 0; j < count; j++) {
        v[j] = sfs_mosaic_slot_of(b->m, b->x, items[j].key, items[j].len);
        if (v[j] >= 0 && (uint64_t)v[j] < ix->slots)
            sfs_mosaic_cache_ahead(b->m, ix->unrolled_position + (uint64_t)v[j] * ix->entry_size);
    }
    for (size_t j = 0; j < count; j++)
        if ((items[j].rc = guarded_entry(b, &items[j], v[j], err)) == SFS_OK)
            sfs_mosaic_cache_ahead(b->m, items[j].object);
    for (size_t j = 0; j < count; j++)
        if (items[j].rc == SFS_OK)
            items[j].rc = guarded_object(b, ctx, &items[j], err);
}

static void *batch_worker(void *arg)
{
    batch_t *b = arg;
    sfs_error_t err; /* messages are made again for the failure reported */
    for (;;) {
        size_t i = __atomic_fetch_add(&b->next, BATCH_CHUNK, __ATOMIC_RELAXED);
        if (i >= b->n)
            return NULL;
        size_t count = b->n - i < BATCH_CHUNK ? b->n - i : BATCH_CHUNK;
        if (!b->copy)
            batch_lookups(b, &b->items[i], count, &err);
        else
            for (size_t j = i; j < i + count; j++)
                batch_one(b, &b->items[j], &err);
    }
}

/* Run one step of the batch over every item, on up to BATCH_THREADS
 * threads (this one included). Without the GIL. */
static void batch_run(batch_t *b, int copy)
{
    pthread_t threads[BATCH_THREADS - 1];
    size_t made = 0, want = b->n / BATCH_PER_THREAD;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (want > (size_t)(cpus > 0 ? cpus : 1))
        want = (size_t)(cpus > 0 ? cpus : 1);
    b->copy = copy;
    b->next = 0;
    while (made + 1 < want && made < BATCH_THREADS - 1 && pthread_create(&threads[made], NULL, batch_worker, b) == 0)
        made++;
    batch_worker(b);
    for (size_t t = 0; t < made; t++)
        pthread_join(threads[t], NULL);
}

/* get_batch(kind, keys) -> [bytes or None], in the order of `keys` (an
 * iterable of keys): what get() of each gives. The GIL is released twice
 * for the whole batch: once to find every key (after asking the device
 * for every entry and object at once when the first keys' pages are not
 * cached), once to copy or decode every object, on several threads; the
 * bytes objects are made in between. The first failure in key order is
 * raised. */
static PyObject *Mosaic_get_batch(Mosaic *self, PyObject *args)
{
    const char *name;
    PyObject *keys;
    if (mosaic_ready(self) < 0 || !PyArg_ParseTuple(args, "sO:get_batch", &name, &keys))
        return NULL;
    int x = index_of(self, name);
    if (x < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(keys, "get_batch: keys must be iterable");
    if (!seq)
        return NULL;
    sfs_mosaic_t *m = mosaic_hold(self); /* iterating `keys` may have closed it */
    if (!m) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject *result = PyList_New(n);
    Py_buffer *views = result ? PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer)) : NULL;
    batch_item_t *items = views ? PyMem_Calloc((size_t)(n ? n : 1), sizeof(batch_item_t)) : NULL;
    Py_ssize_t held = 0;
    if (result && !items)
        PyErr_NoMemory();
    for (; items && held < n; held++) {
        if (get_key_of(m, (size_t)x, PySequence_Fast_GET_ITEM(seq, held), &views[held]) < 0)
            break;
        items[held].key = views[held].buf;
        items[held].len = (size_t)views[held].len;
    }
    /* Each prefetch step is skipped when the first keys' pages are
     * cached: a warm batch pays no system call per key. */
    int entries_cached = 1, objects_cached = 1;
    for (Py_ssize_t i = 0; items && !PyErr_Occurred() && i < held && i < SAMPLE; i++)
        entries_cached &= sfs_mosaic_entry_cached(m, (size_t)x, items[i].key, items[i].len);
    batch_t batch = {.m = m, .x = (size_t)x, .n = (size_t)n, .items = items};
    if (items && !PyErr_Occurred()) {
        Py_BEGIN_ALLOW_THREADS
        /* every key's entry asked of the device at once, then every
         * object's first bytes (the kernel reads them in parallel): a cold
         * batch waits for two rounds of reads, not two per key */
        for (Py_ssize_t i = 0; !entries_cached && i < n; i++)
            sfs_mosaic_prefetch_entry(m, (size_t)x, items[i].key, items[i].len);
        for (volatile Py_ssize_t i = 0; i < n; i++) {
            uint64_t object;
            int rc;
            if (i >= SAMPLE && objects_cached)
                break;
            SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_lookup(m, (size_t)x, items[i].key, items[i].len, NULL,
                                                                &object, NULL));
            if (rc != SFS_OK)
                continue;
            if (i < SAMPLE)
                objects_cached &= sfs_mosaic_object_cached(m, object);
            if (!objects_cached) /* a cached object needs no prefetch */
                sfs_mosaic_prefetch_object(m, object, PREFETCH_OBJECT_BYTES);
        }
        batch_run(&batch, 0);
        Py_END_ALLOW_THREADS
    }
    sfs_error_t err = {0};
    Py_ssize_t failed = -1; /* the first key whose lookup or read failed */
    for (Py_ssize_t i = 0; items && !PyErr_Occurred() && failed < 0 && i < n; i++) {
        if (items[i].rc == SFS_OK && items[i].size > (uint64_t)PY_SSIZE_T_MAX)
            PyErr_NoMemory();
        else if (items[i].rc == SFS_OK) {
            PyObject *bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)items[i].size);
            if (!bytes)
                break;
            items[i].dst = PyBytes_AS_STRING(bytes);
            PyList_SET_ITEM(result, i, bytes);
        } else if (items[i].rc != SFS_ENOTFOUND)
            failed = i;
    }
    if (items && !PyErr_Occurred() && failed < 0) {
        Py_BEGIN_ALLOW_THREADS
        batch_run(&batch, 1);
        Py_END_ALLOW_THREADS
        for (Py_ssize_t i = 0; failed < 0 && i < n; i++)
            if (items[i].rc != SFS_OK && items[i].rc != SFS_ENOTFOUND)
                failed = i;
    }
    if (failed >= 0 && !PyErr_Occurred()) {
        /* the message, made again for that key alone */
        int copy = items[failed].dst != NULL;
        int rc = items[failed].rc;
        if (rc != SFS_EGONE) {
            items[failed].rc = SFS_OK;
            batch.copy = copy;
            batch_one(&batch, &items[failed], &err);
            if (items[failed].rc != SFS_OK && items[failed].rc != SFS_ENOTFOUND)
                rc = items[failed].rc;
            else /* it went through this time: report the first failure without its details */
                sfs_fail(&err, rc, 0, "%s: key %zd of the batch could not be %s", sfs_mosaic_path(m), failed,
                         copy ? "read" : "looked up");
        }
        mosaic_error(m, rc, &err);
    }
    for (Py_ssize_t i = 0; result && !PyErr_Occurred() && i < n; i++)
        if (!items[i].dst || items[i].rc != SFS_OK) {
            PyObject *old = PyList_GET_ITEM(result, i);
            PyList_SET_ITEM(result, i, Py_NewRef(Py_None));
            Py_XDECREF(old);
        }
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(items);
    Py_DECREF(seq);
    mosaic_let_go(self);
    if (PyErr_Occurred()) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

/* entry(kind, slot) -> (key, object position), or None for a deleted
 * entry. */
static PyObject *Mosaic_entry(Mosaic *self, PyObject *args)
{
    const char *name;
    unsigned long long slot;
    if (mosaic_ready(self) < 0 || !PyArg_ParseTuple(args, "sK:entry", &name, &slot))
        return NULL;
    int x = index_of(self, name);
    if (x < 0)
        return NULL;
    uint8_t key[SFS_MOSAIC_MAX_KEY_SIZE];
    uint64_t object = 0;
    sfs_error_t err = {0};
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_slot(self->m, (size_t)x, slot, key, &object, &err));
    if (rc == SFS_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc == SFS_EINVAL) {
        PyErr_SetString(PyExc_IndexError, "entry: slot out of range");
        return NULL;
    }
    if (rc != SFS_OK)
        return mosaic_error(self->m, rc, &err);
    return Py_BuildValue("(y#K)", (const char *)key, (Py_ssize_t)sfs_mosaic_index(self->m, (size_t)x)->key_size,
                         (unsigned long long)object);
}

/* The decoded size of the object at `object` (GIL released, guarded; the
 * file held by the caller). */
static int decoded_size(sfs_mosaic_t *m, uint64_t object, uint64_t *size, sfs_error_t *err)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_object_size(m, NULL, object, size, NULL, err));
    Py_END_ALLOW_THREADS
    return rc;
}

/* size(object) -> the decoded size of the object at `object`, bytes
 * (zstd: from its frame header), or None for a deleted object. */
static PyObject *Mosaic_size(Mosaic *self, PyObject *arg)
{
    if (mosaic_ready(self) < 0)
        return NULL;
    unsigned long long object = PyLong_AsUnsignedLongLong(arg);
    if (object == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint64_t size = 0;
    sfs_error_t err = {0};
    sfs_mosaic_t *m = mosaic_hold(self);
    int rc = decoded_size(m, object, &size, &err);
    PyObject *out = rc == SFS_ENOTFOUND ? Py_NewRef(Py_None)
                    : rc != SFS_OK      ? mosaic_error(m, rc, &err)
                                        : PyLong_FromUnsignedLongLong(size);
    mosaic_let_go(self);
    return out;
}

/* read(object, offset=0, length=-1) -> bytes [offset, offset + length) of
 * the decoded object (length < 0: to its end), or None when deleted. */
static PyObject *Mosaic_read(Mosaic *self, PyObject *args)
{
    unsigned long long object, offset = 0;
    long long length = -1;
    if (mosaic_ready(self) < 0 || !PyArg_ParseTuple(args, "K|KL:read", &object, &offset, &length))
        return NULL;
    uint64_t size = 0;
    sfs_error_t err = {0};
    sfs_mosaic_t *m = mosaic_hold(self);
    PyObject *out = NULL;
    int rc = decoded_size(m, object, &size, &err);
    if (rc == SFS_ENOTFOUND) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    if (rc != SFS_OK) {
        mosaic_error(m, rc, &err);
        goto done;
    }
    const uint64_t avail = offset >= size ? 0 : size - offset;
    const volatile uint64_t want = length >= 0 && (uint64_t)length < avail ? (uint64_t)length : avail;
    if (want > (uint64_t)PY_SSIZE_T_MAX) {
        PyErr_NoMemory();
        goto done;
    }
    if (!(out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)want)))
        goto done;
    size_t got = 0;
    char *buf = PyBytes_AS_STRING(out);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_read(m, NULL, object, offset, buf, (size_t)want, &got, &err));
    Py_END_ALLOW_THREADS
    if (rc == SFS_OK && got != want) {
        rc = SFS_ECORRUPT;
        snprintf(err.message, sizeof(err.message), "%s: object at byte %llu is shorter than its frame header says",
                 sfs_mosaic_path(m), object);
        err.status = SFS_ECORRUPT;
    }
    if (rc != SFS_OK) {
        Py_CLEAR(out);
        if (rc == SFS_ENOTFOUND)
            out = Py_NewRef(Py_None);
        else
            mosaic_error(m, rc, &err);
    }
done:
    mosaic_let_go(self);
    return out;
}

static void report_problem(void *ctx, uint64_t position, uint32_t id, const char *message)
{
    PyObject *list = ctx;
    PyObject *item = Py_BuildValue("(Ks)", (unsigned long long)position, message);
    if (!item || PyList_Append(list, item) < 0)
        PyErr_Clear(); /* a report lost: the status still says corrupt */
    Py_XDECREF(item);
}

/* check() -> (problems, stats): every CRC-32, the tiles' structure, every
 * entry of every index (sfs_mosaic_check). problems: [(byte position,
 * message)], empty when the file is sound; stats: a dict of counts. */
static PyObject *Mosaic_check(Mosaic *self, PyObject *unused)
{
    if (mosaic_ready(self) < 0)
        return NULL;
    PyObject *problems = PyList_New(0);
    if (!problems)
        return NULL;
    sfs_mosaic_check_stats_t st = {0};
    sfs_error_t err = {0};
    int rc;
    /* the GIL is kept: the report appends to a Python list */
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_mosaic_check(self->m, report_problem, problems, &st, &err));
    if (rc == SFS_EGONE) {
        Py_DECREF(problems);
        return gone(sfs_mosaic_path(self->m));
    }
    if (rc != SFS_OK && rc != SFS_ECORRUPT) {
        Py_DECREF(problems);
        return raise_error(&err);
    }
    return Py_BuildValue("(N{s:K,s:K,s:K,s:K,s:K,s:K})", problems, "tiles", (unsigned long long)st.tiles, "objects",
                         (unsigned long long)st.objects, "voids", (unsigned long long)st.voids, "crcs",
                         (unsigned long long)st.crcs, "live_entries", (unsigned long long)st.live_entries,
                         "voided_entries", (unsigned long long)st.voided_entries);
}

static PyObject *Mosaic_enter(Mosaic *self, PyObject *unused)
{
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *Mosaic_exit(Mosaic *self, PyObject *args)
{
    return Mosaic_close(self, NULL);
}

static PyObject *Mosaic_get_path(Mosaic *self, void *closure)
{
    if (mosaic_ready(self) < 0)
        return NULL;
    return PyUnicode_DecodeFSDefault(sfs_mosaic_path(self->m));
}

static PyMethodDef Mosaic_methods[] = {
    {"info", (PyCFunction)Mosaic_info, METH_NOARGS, "info() -> dict: the file's metadata and indexes"},
    {"lookup", (PyCFunction)Mosaic_lookup, METH_VARARGS,
     "lookup(kind, key) -> the object's position (byte offset of its element), or None when absent or deleted"},
    {"get", (PyCFunction)(void (*)(void))Mosaic_get, METH_FASTCALL,
     "get(key, kind='sha256') -> the object's bytes, or None when absent or deleted"},
    {"get_batch", (PyCFunction)Mosaic_get_batch, METH_VARARGS,
     "get_batch(kind, keys) -> [bytes or None], in the order of keys"},
    {"entry", (PyCFunction)Mosaic_entry, METH_VARARGS,
     "entry(kind, slot) -> (key, object position) of entry `slot` of the index, or None when deleted"},
    {"size", (PyCFunction)Mosaic_size, METH_O, "size(object) -> its decoded size in bytes, or None when deleted"},
    {"read", (PyCFunction)Mosaic_read, METH_VARARGS,
     "read(object, offset=0, length=-1) -> bytes of the decoded object, or None when deleted"},
    {"check", (PyCFunction)Mosaic_check, METH_NOARGS,
     "check() -> (problems, stats): every CRC-32, the tiles and every index entry verified"},
    {"close", (PyCFunction)Mosaic_close, METH_NOARGS, "close(): unmap the file"},
    {"__enter__", (PyCFunction)Mosaic_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Mosaic_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Mosaic_getset[] = {
    {"path", (getter)Mosaic_get_path, NULL, "the file's path", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject MosaicType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shardfs._shardfs.Mosaic",
    .tp_basicsize = sizeof(Mosaic),
    .tp_dealloc = (destructor)Mosaic_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Mosaic(path): an open MOSAIC file (Software Heritage's format), read by shardfs's C reader",
    .tp_methods = Mosaic_methods,
    .tp_getset = Mosaic_getset,
    .tp_init = (initproc)Mosaic_init,
    .tp_new = PyType_GenericNew,
};
