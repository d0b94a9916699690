/*
 * py_reader.c — the Reader type of shardfs._shardfs: an open shard (shard.h).
 *
 * Reader(path, writable=False): lookups (read, locate, find, get_batch),
 * slots, scans, check, delete, the slots deleted since a sidecar was built. Its hot helpers stay static here so that
 * the compiler inlines them into their callers.
 */
#include "py_module.h"

static int Reader_init(Reader *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"path", "writable", NULL};
    PyObject *path_obj;
    int writable = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|p", kwlist, PyUnicode_FSConverter, &path_obj,
                                     &writable))
        return -1;
    if (self->users) {
        Py_DECREF(path_obj);
        PyErr_SetString(PyExc_ValueError, "the shard is held by an OpenShards");
        return -1;
    }
    sfs_error_t err;
    int rc;
    sfs_shard_t *shard = NULL;
    const char *path = PyBytes_AS_STRING(path_obj);
    sfs_guard_install();
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "%s: the file shrank while it was opened", path),
                rc = sfs_open(path, writable, &shard, &err));
    Py_END_ALLOW_THREADS
    Py_DECREF(path_obj);
    if (rc != SFS_OK) {
        raise_error(&err);
        return -1;
    }
    sfs_close(self->shard);
    self->shard = shard;
    self->closed = 0;
    return 0;
}

static void Reader_dealloc(Reader *self)
{
    sfs_close(self->shard);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Reader_close(Reader *self, PyObject *unused)
{
    self->closed = 1;
    if (!self->users) {
        sfs_close(self->shard);
        self->shard = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Reader_header(Reader *self, void *closure)
{
    if (!reader_ready(self))
        return NULL;
    const sfs_header_t *h = sfs_header(self->shard);
    return Py_BuildValue("(KKKKKKK)", (unsigned long long)h->version,
                         (unsigned long long)h->objects_count,
                         (unsigned long long)h->objects_position,
                         (unsigned long long)h->objects_size,
                         (unsigned long long)h->index_position,
                         (unsigned long long)h->index_size,
                         (unsigned long long)h->hash_position);
}

/* A getter Reader_<what> answering sfs_<what>(shard), a uint64_t, as an int. */
#define READER_U64_GETTER(what)                                                                    \
    static PyObject *Reader_##what(Reader *self, void *closure)                                    \
    {                                                                                              \
        if (!reader_ready(self))                                                                   \
            return NULL;                                                                           \
        return PyLong_FromUnsignedLongLong(sfs_##what(self->shard));                               \
    }

READER_U64_GETTER(slot_count)
READER_U64_GETTER(extent)
READER_U64_GETTER(hash_size)

static PyObject *Reader_kind(Reader *self, void *closure)
{
    if (!reader_ready(self))
        return NULL;
    return PyUnicode_FromString(sfs_kind_name(self->shard));
}

static PyObject *Reader_identity_ranges(Reader *self, void *closure)
{
    if (!reader_ready(self))
        return NULL;
    uint64_t offsets[8], lengths[8];
    size_t n = sfs_identity_ranges(self->shard, offsets, lengths, 8);
    PyObject *list = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; list && i < n; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)offsets[i], (unsigned long long)lengths[i]);
        if (!pair) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, pair);
    }
    return list;
}

static PyObject *Reader_fileno(Reader *self, PyObject *unused)
{
    if (!reader_ready(self))
        return NULL;
    return PyLong_FromLong(sfs_fd(self->shard));
}

static PyObject *Reader_releases_gil(Reader *self, void *closure)
{
    return PyBool_FromLong(self->gil_free);
}

static PyObject *Reader_closed(Reader *self, void *closure)
{
    return PyBool_FromLong(self->shard == NULL || self->closed);
}

/* How a single-key call (read, locate, find) runs. A lookup served from
 * the page cache costs about 0.2 us, less than letting the GIL go to
 * another thread and taking it back: releasing it around every lookup made
 * two threads slower together than one alone. So these calls keep the GIL
 * while the reader's recent calls were fast. Once one takes over
 * LOOKUP_SLOW_NS (it waited for the device, or lost its core), the
 * reader's calls release the GIL (holding the shard: reader_hold), so that
 * other threads run during device waits, until LOOKUP_FAST_RUN calls in a
 * row were fast again. Timing costs two vDSO clock reads (~50 ns). */
#define LOOKUP_SLOW_NS 20000
#define LOOKUP_FAST_RUN 64

typedef struct {
    PyThreadState *saved; /* the GIL was released (and the shard held) */
    uint64_t t0;
} lookup_call_t;

static void lookup_begin(Reader *self, lookup_call_t *c)
{
    c->saved = NULL;
    if (self->gil_free) {
        reader_hold(self);
        c->saved = PyEval_SaveThread();
    }
    c->t0 = sfs_now_ns();
}

/* After the lookup: the GIL taken back, the reader's mode updated. The
 * shard stays held until lookup_done, so that errors can name it. */
static void lookup_end(Reader *self, lookup_call_t *c)
{
    int slow = sfs_now_ns() - c->t0 > LOOKUP_SLOW_NS;
    if (c->saved)
        PyEval_RestoreThread(c->saved);
    if (slow) {
        self->gil_free = 1;
        self->fast_run = 0;
    } else if (self->gil_free && ++self->fast_run >= LOOKUP_FAST_RUN) {
        self->gil_free = 0;
    }
}

/* Once the call's result (or exception) is built: the shard let go. */
static PyObject *lookup_done(Reader *self, lookup_call_t *c, PyObject *result)
{
    if (c->saved)
        reader_unhold(self);
    return result;
}

static PyObject *read_failed(Reader *self, int rc);

/* What a lookup that did not give SFS_OK answers: None (a new reference)
 * for an absent key, else NULL with the exception: OSError for a file that
 * shrank or could not be read, CorruptShardError for a corrupt slot. */
static PyObject *lookup_failed(Reader *self, int rc)
{
    if (rc == SFS_ENOTFOUND)
        return Py_NewRef(Py_None);
    if (rc == SFS_EGONE || rc == SFS_EIO)
        return read_failed(self, rc);
    return corrupt_slot(self->shard);
}

/* locate(key) -> (data_offset, size) or None */
static PyObject *Reader_locate(Reader *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!reader_ready(self) || get_key(arg, key) < 0)
        return NULL;
    uint64_t off = 0, size = 0;
    int rc;
    lookup_call_t c;
    lookup_begin(self, &c);
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup(self->shard, key, &off, &size));
    lookup_end(self, &c);
    PyObject *out = rc != SFS_OK ? lookup_failed(self, rc)
                                 : Py_BuildValue("(KK)", (unsigned long long)off,
                                                 (unsigned long long)size);
    return lookup_done(self, &c, out);
}

/* The exception for a failed sfs_read (errno still set for SFS_EIO). */
static PyObject *read_failed(Reader *self, int rc)
{
    if (rc == SFS_EGONE)
        return gone(sfs_path(self->shard));
    if (rc == SFS_EIO) {
        int e = errno ? errno : EIO;
        const char *why = sfs_source_error(self->shard);
        if (why && *why) { /* an rbd: source's connection error names its cause */
            sfs_error_t err = {.status = SFS_EIO, .sys_errno = e};
            snprintf(err.message, sizeof(err.message), "%s", why);
            return raise_error(&err);
        }
        return os_error(e, sfs_path(self->shard), strerror(e));
    }
    PyErr_Format(ShardError, "%s: read outside the objects section", sfs_path(self->shard));
    return NULL;
}

static PyObject *copy_out(Reader *self, uint64_t off, uint64_t size)
{
    if (size > (uint64_t)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out)
        return NULL;
    int rc;
    sfs_shard_t *shard = reader_hold(self);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_read(shard, off, PyBytes_AS_STRING(out), (size_t)size));
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK) {
        Py_DECREF(out);
        out = read_failed(self, rc);
    }
    reader_unhold(self);
    return out;
}

/* Objects up to this size are copied to a stack buffer together with the
 * lookup (in the same GIL-released section when the GIL is released);
 * larger ones are copied by copy_out, with the GIL released. */
#define SMALL_OBJECT 16384

static PyObject *read_result(Reader *self, int rc, uint64_t off, uint64_t size, const char *small)
{
    if (rc != SFS_OK)
        return lookup_failed(self, rc);
    if (size <= SMALL_OBJECT)
        return PyBytes_FromStringAndSize(small, (Py_ssize_t)size);
    return copy_out(self, off, size);
}

/* read(key) -> bytes or None */
static PyObject *Reader_read(Reader *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!reader_ready(self) || get_key(arg, key) < 0)
        return NULL;
    uint64_t off = 0, size = 0;
    char small[SMALL_OBJECT];
    int rc;
    lookup_call_t c;
    lookup_begin(self, &c);
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup(self->shard, key, &off, &size);
                if (rc == SFS_OK && size <= SMALL_OBJECT)
                    rc = sfs_read(self->shard, off, small, (size_t)size));
    lookup_end(self, &c);
    return lookup_done(self, &c, read_result(self, rc, off, size, small));
}

/* The found objects' ranges for sfs_read_many (dst[i] not NULL: present),
 * back to back into offs, lens and bufs (n entries each); how many. */
static size_t batch_ranges(const sfs_found_t *found, char *const *dst, Py_ssize_t n, uint64_t *offs,
                           size_t *lens, void **bufs)
{
    size_t k = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (dst[i]) {
            offs[k] = found[i].data_offset;
            lens[k] = (size_t)found[i].size;
            bufs[k++] = dst[i];
        }
    return k;
}

/* The keys of a sequence, back to back (PyMem_Malloc'd, n x 32 bytes; 1
 * byte when n = 0), or NULL with an exception (ValueError for a malformed
 * key, MemoryError). */
static uint8_t *keys_of(PyObject *seq, Py_ssize_t n)
{
    uint8_t *keys = PyMem_Malloc(n ? (size_t)n * SFS_KEY_SIZE : 1);
    if (!keys)
        return (uint8_t *)PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PySequence_Fast_GET_ITEM(seq, i);
        if (PyBytes_CheckExact(k) && PyBytes_GET_SIZE(k) == SFS_KEY_SIZE)
            memcpy(keys + SFS_KEY_SIZE * i, PyBytes_AS_STRING(k), SFS_KEY_SIZE);
        else if (get_key(k, keys + SFS_KEY_SIZE * i) < 0) {
            PyMem_Free(keys);
            return NULL;
        }
    }
    return keys;
}

/* A list of n bytes objects (None where found[i] is not SFS_OK) of the
 * found sizes, uninitialised; dst[i] gets each one's buffer (NULL for
 * None). NULL with MemoryError. */
static PyObject *batch_results(const sfs_found_t *found, char **dst, Py_ssize_t n)
{
    PyObject *out = PyList_New(n);
    if (!out)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = Py_None;
        dst[i] = NULL;
        if (found[i].status == SFS_OK) {
            if (found[i].size > (uint64_t)PY_SSIZE_T_MAX) {
                Py_DECREF(out);
                return PyErr_NoMemory();
            }
            v = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)found[i].size);
            if (!v) {
                Py_DECREF(out);
                return NULL;
            }
            dst[i] = PyBytes_AS_STRING(v);
        } else {
            Py_INCREF(v);
        }
        PyList_SET_ITEM(out, i, v);
    }
    return out;
}

/* get_batch(keys) -> list of bytes or None (absent), in the order of keys
 * (a sequence of 32-byte keys). Two GIL releases per batch, whatever its
 * length: one for every lookup (sfs_lookup_batch: the lookups' cache misses
 * overlap), one for every copy (between them, the bytes objects are
 * allocated, which needs the GIL; copying straight into them spares a
 * buffer and a second copy). Once a lookup or a copy waited for the
 * device, the rest of the batch is prefetched so that its reads overlap.
 * Raises what read() raises (CorruptShardError for a corrupt slot,
 * OSError), ValueError for a malformed key, MemoryError. */
static PyObject *Reader_get_batch(Reader *self, PyObject *arg)
{
    if (!reader_ready(self))
        return NULL;
    PyObject *seq = PySequence_Fast(arg, "get_batch() takes an iterable of keys");
    if (!seq)
        return NULL;
    /* Held for the call: a close() from another thread meanwhile waits
     * for the end of it, as for an OpenShards entry. */
    sfs_shard_t *shard = reader_hold(self);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    uint8_t *keys = keys_of(seq, n);
    size_t m = n ? (size_t)n : 1;
    sfs_found_t *found = PyMem_Malloc(m * sizeof(sfs_found_t));
    char **dst = PyMem_Malloc(m * sizeof(char *));
    /* sfs_read_many's arguments, allocated here: nothing is allocated in
     * a guarded call (guard.h) */
    uint64_t *offs = PyMem_Malloc(m * sizeof(uint64_t));
    size_t *lens = PyMem_Malloc(m * sizeof(size_t));
    void **bufs = PyMem_Malloc(m * sizeof(void *));
    int *results = PyMem_Malloc(m * sizeof(int));
    PyObject *out = NULL;
    if (!keys || !found || !dst || !offs || !lens || !bufs || !results) {
        if (keys)
            PyErr_NoMemory();
        goto done;
    }
    int rc;
    size_t bad = 0;
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, (bad = sfs_lookup_batch(shard, keys, (size_t)n, found), rc = SFS_OK));
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK) {
        read_failed(self, rc);
        goto done;
    }
    if (bad) {
        corrupt_slot(shard);
        goto done;
    }
    if (!(out = batch_results(found, dst, n)))
        goto done;
    size_t k = batch_ranges(found, dst, n, offs, lens, bufs);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, (sfs_read_many(shard, k, offs, lens, bufs, results), rc = SFS_OK));
    Py_END_ALLOW_THREADS
    for (size_t j = 0; rc == SFS_OK && j < k; j++)
        rc = results[j]; /* the first failure (errno is its own: sfs_read_many) */
    if (rc != SFS_OK) {
        read_failed(self, rc);
        Py_CLEAR(out);
    }
done:
    PyMem_Free(keys);
    PyMem_Free(found);
    PyMem_Free(dst);
    PyMem_Free(offs);
    PyMem_Free(lens);
    PyMem_Free(bufs);
    PyMem_Free(results);
    Py_DECREF(seq);
    reader_unhold(self);
    return out;
}

/* find(key, nowait=False) -> (slot, data_offset, size) or None.
 * nowait: answer from the page cache only (no GIL release: it cannot block),
 * raising BlockingIOError when a byte is not cached. */
static PyObject *Reader_find(Reader *self, PyObject *args)
{
    PyObject *key_obj;
    int nowait = 0;
    uint8_t key[SFS_KEY_SIZE];
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "O|p", &key_obj, &nowait) ||
        get_key(key_obj, key) < 0)
        return NULL;
    uint64_t off = 0, size = 0;
    uint32_t slot = 0;
    int rc;
    lookup_call_t c = {NULL, 0};
    if (nowait) { /* cannot block: the GIL is kept */
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_nowait(self->shard, key, &slot, &off, &size));
        if (rc == SFS_EAGAIN) {
            PyErr_SetString(PyExc_BlockingIOError, "not in the page cache");
            return NULL;
        }
    } else {
        lookup_begin(self, &c);
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_slot(self->shard, key, &slot, &off, &size));
        lookup_end(self, &c);
    }
    PyObject *out = rc != SFS_OK ? lookup_failed(self, rc)
                                 : Py_BuildValue("(kKK)", (unsigned long)slot,
                                                 (unsigned long long)off, (unsigned long long)size);
    return lookup_done(self, &c, out);
}

/* try_pread(data_offset, size, offset, length) -> bytes from the page cache
 * only, clipped to the object; BlockingIOError when not all cached. */
/* The arguments (data_offset, size, offset, length) of pread and
 * try_pread: 1 with the range clipped to the object (*at: its absolute
 * byte offset), 0 when offset is at or past the object's end (nothing to
 * read), -1 with an exception. */
static int object_range(Reader *self, PyObject *args, uint64_t *at, uint64_t *length)
{
    unsigned long long data_offset, size, offset, len;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "KKKK", &data_offset, &size, &offset, &len))
        return -1;
    if (offset >= size)
        return 0;
    *at = data_offset + offset;
    *length = len > size - offset ? size - offset : len;
    return 1;
}

static PyObject *Reader_try_pread(Reader *self, PyObject *args)
{
    uint64_t at, length;
    int in = object_range(self, args, &at, &length);
    if (in <= 0)
        return in < 0 ? NULL : PyBytes_FromStringAndSize(NULL, 0);
    if (length > (uint64_t)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (!out)
        return NULL;
    int rc = sfs_read_nowait(self->shard, at, PyBytes_AS_STRING(out), (size_t)length);
    if (rc == SFS_OK)
        return out;
    Py_DECREF(out);
    if (rc == SFS_EAGAIN)
        PyErr_SetString(PyExc_BlockingIOError, "not in the page cache");
    else
        PyErr_Format(ShardError, "%s: read outside the objects section", sfs_path(self->shard));
    return NULL;
}

/* prefetch(data_offset, size, length): start reading the first `length`
 * bytes of an object into the page cache; returns at once. */
static PyObject *Reader_prefetch(Reader *self, PyObject *args)
{
    unsigned long long data_offset, size, length;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "KKK", &data_offset, &size, &length))
        return NULL;
    if (length > size)
        length = size;
    if (sfs_prefetch(self->shard, data_offset, length) != SFS_OK) {
        PyErr_Format(ShardError, "%s: prefetch outside the objects section", sfs_path(self->shard));
        return NULL;
    }
    Py_RETURN_NONE;
}

/* pread(data_offset, size, offset, length) -> bytes, clipped to the object */
static PyObject *Reader_pread(Reader *self, PyObject *args)
{
    uint64_t at, length;
    int in = object_range(self, args, &at, &length);
    if (in <= 0)
        return in < 0 ? NULL : PyBytes_FromStringAndSize(NULL, 0);
    return copy_out(self, at, length);
}

static PyObject *Reader_slot_of(Reader *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!reader_ready(self) || get_key(arg, key) < 0)
        return NULL;
    uint32_t slot = 0;
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, slot = sfs_slot_of(self->shard, key));
    if (rc == SFS_EGONE)
        return gone(sfs_path(self->shard));
    return PyLong_FromUnsignedLong(slot);
}

/* slot(i) -> (key, data_offset, size) for a live slot, None if empty */
static PyObject *Reader_slot(Reader *self, PyObject *args)
{
    unsigned long long slot;
    int nowait = 0;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "K|p", &slot, &nowait))
        return NULL;
    if (slot >= sfs_slot_count(self->shard)) {
        PyErr_SetString(PyExc_IndexError, "slot out of range");
        return NULL;
    }
    uint8_t key[SFS_KEY_SIZE];
    uint64_t off = 0, size = 0;
    int rc;
    SFS_GUARDED(rc = SFS_EGONE,
                rc = nowait ? sfs_slot_object_nowait(self->shard, slot, key, &off, &size)
                            : sfs_slot_object(self->shard, slot, key, &off, &size));
    if (rc == SFS_ENOTFOUND)
        Py_RETURN_NONE;
    if (rc == SFS_EGONE)
        return gone(sfs_path(self->shard));
    if (rc == SFS_EAGAIN) {
        PyErr_SetString(PyExc_BlockingIOError, "not in the page cache");
        return NULL;
    }
    if (rc != SFS_OK) {
        PyErr_Format(CorruptShardError, "%s: slot %llu points outside the objects section",
                     sfs_path(self->shard), slot);
        return NULL;
    }
    return Py_BuildValue("(y#KK)", key, (Py_ssize_t)SFS_KEY_SIZE, (unsigned long long)off,
                         (unsigned long long)size);
}

/* scan(start_slot, max_items, skip_corrupt=False)
 *   -> (list of (slot, key, data_offset, size), next_slot, skipped)
 * Live slots only, in slot order; next_slot == slot_count at the end. A slot
 * pointing outside the objects section raises CorruptShardError, or with
 * skip_corrupt is left out and counted in `skipped`. */
static PyObject *Reader_scan(Reader *self, PyObject *args)
{
    unsigned long long start, max_items;
    volatile unsigned long long skipped = 0; /* kept across the guard's longjmp */
    int skip_corrupt = 0;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "KK|p", &start, &max_items, &skip_corrupt))
        return NULL;
    uint64_t slots = sfs_slot_count(self->shard);
    PyObject *list = PyList_New(0);
    if (!list)
        return NULL;
    uint64_t i = start;
    for (; i < slots && (uint64_t)PyList_GET_SIZE(list) < max_items; i++) {
        uint8_t key[SFS_KEY_SIZE];
        uint64_t off = 0, size = 0;
        int rc;
        SFS_GUARDED(rc = SFS_EGONE, rc = sfs_slot_object(self->shard, i, key, &off, &size));
        if (rc == SFS_ENOTFOUND)
            continue;
        if (rc == SFS_EGONE) {
            Py_DECREF(list);
            return gone(sfs_path(self->shard));
        }
        if (rc != SFS_OK && skip_corrupt) {
            skipped++;
            continue;
        }
        if (rc != SFS_OK) {
            Py_DECREF(list);
            PyErr_Format(CorruptShardError, "%s: slot %llu points outside the objects section",
                         sfs_path(self->shard), (unsigned long long)i);
            return NULL;
        }
        PyObject *item = Py_BuildValue("(Ky#KK)", (unsigned long long)i, key,
                                       (Py_ssize_t)SFS_KEY_SIZE, (unsigned long long)off,
                                       (unsigned long long)size);
        if (!item || PyList_Append(list, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(list);
            return NULL;
        }
        Py_DECREF(item);
    }
    PyObject *res = Py_BuildValue("(OKK)", list, (unsigned long long)i, skipped);
    Py_DECREF(list);
    return res;
}

static PyObject *Reader_live_count(Reader *self, PyObject *unused)
{
    if (!reader_ready(self))
        return NULL;
    uint64_t n = 0;
    int rc = SFS_OK;
    sfs_shard_t *shard = reader_hold(self);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, n = sfs_live_count(shard));
    Py_END_ALLOW_THREADS
    PyObject *out = rc == SFS_EGONE ? gone(sfs_path(shard)) : PyLong_FromUnsignedLongLong(n);
    reader_unhold(self);
    return out;
}

typedef struct {
    char **messages;
    size_t count, cap;
} report_buf;

static void collect(void *ctx, const char *message)
{
    report_buf *r = ctx;
    if (r->count == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        char **m = realloc(r->messages, cap * sizeof(char *));
        if (!m)
            return;
        r->messages = m;
        r->cap = cap;
    }
    char *copy = strdup(message);
    if (copy)
        r->messages[r->count++] = copy;
}

/* check(max_reports=1000) -> (problem count, list of messages) */
static PyObject *Reader_check(Reader *self, PyObject *args)
{
    unsigned long long max_reports = 1000;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "|K", &max_reports))
        return NULL;
    report_buf r = {0};
    uint64_t problems = 0;
    int rc = SFS_OK;
    sfs_shard_t *shard = reader_hold(self);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, problems = sfs_check(shard, collect, &r, max_reports));
    Py_END_ALLOW_THREADS
    PyObject *list = rc == SFS_EGONE ? gone(sfs_path(shard)) : PyList_New(0);
    reader_unhold(self);
    for (size_t i = 0; i < r.count; i++) {
        if (list) {
            PyObject *s = PyUnicode_DecodeUTF8(r.messages[i], strlen(r.messages[i]), "replace");
            if (!s || PyList_Append(list, s) < 0)
                Py_CLEAR(list);
            Py_XDECREF(s);
        }
        free(r.messages[i]);
    }
    free(r.messages);
    if (!list)
        return NULL;
    PyObject *res = Py_BuildValue("(KO)", (unsigned long long)problems, list);
    Py_DECREF(list);
    return res;
}

/* delete(key) -> True if deleted, False if absent */
static PyObject *Reader_delete(Reader *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (!reader_ready(self) || get_key(arg, key) < 0)
        return NULL;
    sfs_error_t err;
    int rc;
    sfs_shard_t *shard = reader_hold(self);
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "%s: " GONE_REASON,
                              sfs_path(shard)),
                rc = sfs_delete(shard, key, &err));
    Py_END_ALLOW_THREADS
    reader_unhold(self);
    if (rc == SFS_ENOTFOUND)
        Py_RETURN_FALSE;
    if (rc != SFS_OK)
        return raise_error(&err);
    Py_RETURN_TRUE;
}

/* Sidecar positions per call of sfs_sidecar_deleted (its output buffer:
 * 256 KiB, whatever the sidecar's size). */
#define DELETED_CHUNK 65536

/* One call of sfs_sidecar_deleted, guarded: its status, or SFS_EGONE. A
 * function of its own, so that the guard's sigsetjmp sees none of the
 * variables of the caller's loop. */
static int deleted_chunk(const sfs_sidecar_t *sc, const sfs_shard_t *shard, uint64_t at,
                         uint64_t to, uint32_t *out, uint64_t *found)
{
    int rc;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_sidecar_deleted(sc, shard, at, to, out, found));
    return rc;
}

/* deleted_slots(sidecar, begin=0, end=None) -> [slot, ...]: the slots that
 * the sidecar lists at positions [begin, end) and that are empty in this
 * shard now (sfs_sidecar_deleted), in position order. The whole range is
 * walked without the GIL, DELETED_CHUNK positions at a time; memory: the
 * chunk's buffer and the slots found. */
static PyObject *Reader_deleted_slots(Reader *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"sidecar", "begin", "end", NULL};
    PyObject *sc_obj, *end_obj = Py_None;
    unsigned long long begin = 0, end;
    if (!reader_ready(self) || !PyArg_ParseTupleAndKeywords(args, kwds, "O!|KO", kwlist, &SidecarType,
                                                            &sc_obj, &begin, &end_obj))
        return NULL;
    Sidecar *sidecar = (Sidecar *)sc_obj;
    if (!sidecar_ready(sidecar))
        return NULL;
    uint64_t n = sfs_sidecar_count(sidecar->sc);
    if (end_obj == Py_None) {
        end = n;
    } else {
        end = PyLong_AsUnsignedLongLong(end_obj);
        if (end == (unsigned long long)-1 && PyErr_Occurred())
            return NULL;
    }
    if (begin > end || end > n) {
        PyErr_Format(PyExc_IndexError, "positions [%llu, %llu) outside [0, %llu]", begin, end,
                     (unsigned long long)n);
        return NULL;
    }
    if (sfs_sidecar_slot_count(sidecar->sc) != sfs_slot_count(self->shard)) {
        PyErr_Format(PyExc_ValueError, "%s: the sidecar lists the slots of a shard of %llu, it has %llu",
                     sfs_path(self->shard), (unsigned long long)sfs_sidecar_slot_count(sidecar->sc),
                     (unsigned long long)sfs_slot_count(self->shard));
        return NULL;
    }
    uint32_t *chunk = malloc(DELETED_CHUNK * sizeof(uint32_t)), *found = NULL;
    if (!chunk)
        return PyErr_NoMemory();
    size_t count = 0, cap = 0;
    int rc = SFS_OK;
    /* Both kept while the GIL is released (even if closed or initialised
     * again meanwhile), and the sidecar's path for the error. */
    sfs_sidecar_t *sc = sfs_sidecar_ref(sidecar->sc);
    PyObject *sc_path = Py_NewRef(sidecar->path);
    sfs_shard_t *shard = reader_hold(self);
    Py_BEGIN_ALLOW_THREADS
    for (uint64_t at = begin; at < end && rc == SFS_OK; at += DELETED_CHUNK) {
        uint64_t to = end - at < DELETED_CHUNK ? end : at + DELETED_CHUNK, got = 0;
        rc = deleted_chunk(sc, shard, at, to, chunk, &got);
        if (rc != SFS_OK || got == 0)
            continue;
        if (count + got > cap) {
            size_t grown = cap ? cap : 1024;
            while (grown < count + got)
                grown *= 2;
            uint32_t *more = realloc(found, grown * sizeof(uint32_t));
            if (!more) {
                rc = SFS_ENOMEM;
                break;
            }
            found = more;
            cap = grown;
        }
        memcpy(found + count, chunk, got * sizeof(uint32_t));
        count += got;
    }
    Py_END_ALLOW_THREADS
    free(chunk);
    sfs_sidecar_close(sc);
    PyObject *list = NULL;
    if (rc == SFS_EGONE) {
        PyObject *args = Py_BuildValue(
            "(iN)", EIO,
            PyUnicode_FromFormat("%s: the shard or its sidecar %s shrank under its mapping (SIGBUS)",
                                 sfs_path(shard), PyBytes_AS_STRING(sc_path)));
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
    } else if (rc == SFS_ENOMEM)
        PyErr_NoMemory();
    else if (rc != SFS_OK) /* SFS_EINVAL: checked above */
        PyErr_SetString(PyExc_ValueError, "the sidecar is not the shard's");
    else if ((list = PyList_New((Py_ssize_t)count)) != NULL) {
        for (size_t i = 0; i < count; i++) {
            PyObject *v = PyLong_FromUnsignedLong(found[i]);
            if (!v) {
                Py_CLEAR(list);
                break;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, v);
        }
    }
    reader_unhold(self);
    Py_DECREF(sc_path);
    free(found);
    return list;
}

static PyMethodDef Reader_methods[] = {
    {"get_batch", (PyCFunction)Reader_get_batch, METH_O,
     "get_batch(keys) -> list of bytes or None, in order: keys a sequence of 32-byte keys"},
    {"close", (PyCFunction)Reader_close, METH_NOARGS, "Unmap and close the shard."},
    {"fileno", (PyCFunction)Reader_fileno, METH_NOARGS,
     "fileno() -> the descriptor of the shard's file (ValueError when closed)."},
    {"locate", (PyCFunction)Reader_locate, METH_O,
     "locate(key32) -> (data_offset, size) in bytes, or None when absent."},
    {"read", (PyCFunction)Reader_read, METH_O, "read(key32) -> bytes, or None when absent."},
    {"pread", (PyCFunction)Reader_pread, METH_VARARGS,
     "pread(data_offset, size, offset, length) -> bytes of an object, clipped to its end."},
    {"find", (PyCFunction)Reader_find, METH_VARARGS,
     "find(key32, nowait=False) -> (slot, data_offset, size) or None; with nowait, "
     "BlockingIOError when the slot or size is not in the page cache."},
    {"try_pread", (PyCFunction)Reader_try_pread, METH_VARARGS,
     "try_pread(data_offset, size, offset, length) -> bytes from the page cache only; "
     "BlockingIOError otherwise."},
    {"prefetch", (PyCFunction)Reader_prefetch, METH_VARARGS,
     "prefetch(data_offset, size, length): start reading an object's first bytes into the "
     "page cache; returns at once."},
    {"slot_of", (PyCFunction)Reader_slot_of, METH_O, "slot_of(key32) -> slot the key hashes to."},
    {"slot", (PyCFunction)Reader_slot, METH_VARARGS,
     "slot(i, nowait=False) -> (key32, data_offset, size) for a live slot, None for an empty "
     "one; nowait: from the page cache only, else BlockingIOError."},
    {"scan", (PyCFunction)Reader_scan, METH_VARARGS,
     "scan(start_slot, max_items, skip_corrupt=False) -> "
     "([(slot, key32, data_offset, size)...], next_slot, skipped)."},
    {"live_count", (PyCFunction)Reader_live_count, METH_NOARGS, "Number of live objects."},
    {"check", (PyCFunction)Reader_check, METH_VARARGS,
     "check(max_reports=1000) -> (problem_count, [message...]): structure check."},
    {"deleted_slots", (PyCFunction)(void (*)(void))Reader_deleted_slots, METH_VARARGS | METH_KEYWORDS,
     "deleted_slots(sidecar, begin=0, end=None) -> [slot, ...]: the slots the sidecar lists at "
     "positions [begin, end) (default: all) that are empty in this shard now (taken down since "
     "it was built), in position order; without the GIL. IndexError outside [0, sidecar.count], "
     "ValueError for another shard's sidecar (a different slot count)."},
    {"delete", (PyCFunction)Reader_delete, METH_O,
     "delete(key32) -> True if deleted, False if absent (needs writable=True)."},
    {NULL},
};

static PyGetSetDef Reader_getset[] = {
    {"header", (getter)Reader_header, NULL, "The seven header fields, as a tuple of ints.", NULL},
    {"slot_count", (getter)Reader_slot_count, NULL, "Slots in the index.", NULL},
    {"extent", (getter)Reader_extent, NULL, "Bytes used by the shard (end of the hash).", NULL},
    {"hash_size", (getter)Reader_hash_size, NULL, "Bytes of the perfect hash section.", NULL},
    {"kind", (getter)Reader_kind, NULL, "The kind of source: \"file\", \"rbd\" or \"mosaic\".", NULL},
    {"identity_ranges", (getter)Reader_identity_ranges, NULL,
     "[(offset, length), ...] in bytes: what identifies the source, for a kind that says "
     "(a MOSAIC file: its EBML header and its sha256 index's perfect hash); [] for a Read Shard.",
     NULL},
    {"releases_gil", (getter)Reader_releases_gil, NULL,
     "True while read/locate/find release the GIL: since one of them waited (over 20 us), "
     "until 64 in a row were fast", NULL},
    {"closed", (getter)Reader_closed, NULL, "True after close().", NULL},
    {NULL},
};

PyTypeObject ReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.Reader",
    .tp_basicsize = sizeof(Reader),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Reader(path, writable=False): a validated, memory-mapped Read Shard.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Reader_init,
    .tp_dealloc = (destructor)Reader_dealloc,
    .tp_methods = Reader_methods,
    .tp_getset = Reader_getset,
};
