/*
 * module.c — the shardfs._shardfs extension: thin Python types over shard.h.
 *
 * Reader(path, writable=False) and Writer(path); Sidecar, SidecarSet and
 * build_sidecar() over sidecar.h; GlobalIndex, key_prefixes(),
 * write_global_index() and merge_global_index() over gindex.h; OpenShards
 * (a mount's open shards by number, and a lookup over the global index
 * levels, the filters and those shards in one call). Keys are exactly 32 bytes
 * here (shardfs/shard.py normalizes hex). The GIL is released around every
 * lookup, copy, scan, write and the perfect-hash build. Errors raise the
 * exception classes of shardfs.errors (looked up at import), OSError (with
 * errno) or MemoryError.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <endian.h>
#include <errno.h>
#include <time.h>

#include "guard.h"
#include "internal.h"
#include "shard.h"
#include "sidecar.h"
#include "gindex.h"

static PyObject *ShardError, *CorruptShardError, *DuplicateKeyError, *StaleSidecarError;

static PyObject *raise_error(const sfs_error_t *err)
{
    switch (err->status) {
    case SFS_EIO: {
        /* OSError(errno, message) picks the subclass (FileNotFoundError...) */
        PyObject *args = Py_BuildValue("(is)", err->sys_errno, err->message);
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
        return NULL;
    }
    case SFS_ECORRUPT:
        PyErr_SetString(CorruptShardError, err->message);
        return NULL;
    case SFS_EDUPLICATE:
        PyErr_SetString(DuplicateKeyError, err->message);
        return NULL;
    case SFS_ENOMEM:
        return PyErr_NoMemory();
    default:
        PyErr_SetString(ShardError, err->message);
        return NULL;
    }
}

static int get_key(PyObject *obj, uint8_t key[SFS_KEY_SIZE])
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view.len != SFS_KEY_SIZE) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "a key is %d bytes, got %zd", SFS_KEY_SIZE, view.len);
        return -1;
    }
    memcpy(key, view.buf, SFS_KEY_SIZE);
    PyBuffer_Release(&view);
    return 0;
}

/* ---------------------------------------------------------------- Reader */

typedef struct {
    PyObject_HEAD
    sfs_shard_t *shard;
    Py_ssize_t users; /* holders: OpenShards entries, calls running without the GIL */
    int closed;       /* close() called; the shard stays open while users > 0 */
    int gil_free;     /* single-key calls release the GIL (see lookup_begin) */
    int fast_run;     /* calls in a row that were fast since gil_free was set */
} Reader;

/* Hold the reader's shard open (Reader.users) while its memory may be read
 * without the GIL; reader_unhold lets it go, closing it then if close()
 * was called meanwhile. Under the GIL. */
static sfs_shard_t *reader_hold(Reader *self)
{
    self->users++;
    return self->shard;
}

static void reader_unhold(Reader *self)
{
    if (--self->users == 0 && self->closed) {
        sfs_close(self->shard);
        self->shard = NULL;
    }
}

static int reader_ready(Reader *self)
{
    if (!self->shard || self->closed) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed shard");
        return 0;
    }
    return 1;
}

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

static PyObject *Reader_slot_count(Reader *self, void *closure)
{
    if (!reader_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_slot_count(self->shard));
}

static PyObject *Reader_extent(Reader *self, void *closure)
{
    if (!reader_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_extent(self->shard));
}

static PyObject *Reader_hash_size(Reader *self, void *closure)
{
    if (!reader_ready(self))
        return NULL;
    return PyLong_FromUnsignedLongLong(sfs_hash_size(self->shard));
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

/* OSError(EIO) for a call that hit SIGBUS: the file shrank under its
 * mapping (guard.h). */
static PyObject *gone(const char *path)
{
    PyObject *args = Py_BuildValue("(is)", EIO, path);
    if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *corrupt_slot(const sfs_shard_t *shard)
{
    PyErr_Format(CorruptShardError,
                 "%s: the slot of a key points outside the objects section (run shardfs check)",
                 sfs_path(shard));
    return NULL;
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
        PyObject *args = Py_BuildValue("(is)", e, sfs_path(self->shard));
        if (args) {
            PyErr_SetObject(PyExc_OSError, args);
            Py_DECREF(args);
        }
        return NULL;
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

/* A copy of a large object, or 8 copies of small ones, that took longer
 * than this plus 0.5 ns per byte copied (2 GB/s, slower than any copy
 * from the page cache) waited for the device: the rest of the batch is
 * then prefetched (its reads overlap). */
#define BATCH_SLOW_NS 20000
/* Objects whose first bytes are prefetched ahead of their copy. */
#define COPY_AHEAD 4
#define PREFETCH_BYTES 128

/* Copy each found object into dst[i] (no GIL; NULL: absent). The first
 * bytes of the object COPY_AHEAD places ahead are prefetched into the CPU
 * cache; once a copy waited for the device, every remaining object is
 * asked of the kernel instead (posix_fadvise). SFS_OK or a status. */
static int batch_copies(const sfs_shard_t *shard, const sfs_found_t *found, char *const *dst,
                        Py_ssize_t n)
{
    int cold = 0;
    uint64_t t0 = sfs_now_ns(), bytes = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!cold && i + COPY_AHEAD < n && dst[i + COPY_AHEAD]) {
            const sfs_found_t *f = &found[i + COPY_AHEAD];
            const uint8_t *p = sfs_data(shard, f->data_offset, f->size);
            if (p)
                for (uint64_t at = 0; at < f->size && at < PREFETCH_BYTES; at += 64)
                    __builtin_prefetch(p + at, 0, 0);
        }
        if (dst[i]) {
            int r = sfs_read(shard, found[i].data_offset, dst[i], (size_t)found[i].size);
            if (r != SFS_OK)
                return r;
            bytes += found[i].size;
        }
        /* timed per copy while copies are large, else per group of 8 */
        if (!cold && ((i & 7) == 7 || (dst[i] && found[i].size > SMALL_OBJECT))) {
            uint64_t t = sfs_now_ns();
            if (t - t0 > BATCH_SLOW_NS + bytes / 2) {
                cold = 1;
                for (Py_ssize_t j = i + 1; j < n; j++)
                    if (dst[j])
                        sfs_prefetch(shard, found[j].data_offset, found[j].size);
            }
            t0 = t;
            bytes = 0;
        }
    }
    return SFS_OK;
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
    sfs_found_t *found = PyMem_Malloc((n ? (size_t)n : 1) * sizeof(sfs_found_t));
    char **dst = PyMem_Malloc((n ? (size_t)n : 1) * sizeof(char *));
    PyObject *out = NULL;
    if (!keys || !found || !dst) {
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
    Py_BEGIN_ALLOW_THREADS
    SFS_GUARDED(rc = SFS_EGONE, rc = batch_copies(shard, found, dst, n));
    Py_END_ALLOW_THREADS
    if (rc != SFS_OK) {
        read_failed(self, rc);
        Py_CLEAR(out);
    }
done:
    PyMem_Free(keys);
    PyMem_Free(found);
    PyMem_Free(dst);
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
static PyObject *Reader_try_pread(Reader *self, PyObject *args)
{
    unsigned long long data_offset, size, offset, length;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "KKKK", &data_offset, &size, &offset, &length))
        return NULL;
    if (offset >= size)
        return PyBytes_FromStringAndSize(NULL, 0);
    if (length > size - offset)
        length = size - offset;
    if (length > (unsigned long long)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (!out)
        return NULL;
    int rc = sfs_read_nowait(self->shard, data_offset + offset, PyBytes_AS_STRING(out), (size_t)length);
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
    unsigned long long data_offset, size, offset, length;
    if (!reader_ready(self) || !PyArg_ParseTuple(args, "KKKK", &data_offset, &size, &offset, &length))
        return NULL;
    if (offset >= size)
        return PyBytes_FromStringAndSize(NULL, 0);
    if (length > size - offset)
        length = size - offset;
    return copy_out(self, data_offset + offset, length);
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
    SFS_GUARDED(rc = sfs_fail(&err, SFS_EIO, EIO, "%s: the file shrank under its mapping",
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
    {"delete", (PyCFunction)Reader_delete, METH_O,
     "delete(key32) -> True if deleted, False if absent (needs writable=True)."},
    {NULL},
};

static PyGetSetDef Reader_getset[] = {
    {"header", (getter)Reader_header, NULL, "The seven header fields, as a tuple of ints.", NULL},
    {"slot_count", (getter)Reader_slot_count, NULL, "Slots in the index.", NULL},
    {"extent", (getter)Reader_extent, NULL, "Bytes used by the shard (end of the hash).", NULL},
    {"hash_size", (getter)Reader_hash_size, NULL, "Bytes of the perfect hash section.", NULL},
    {"releases_gil", (getter)Reader_releases_gil, NULL,
     "True while read/locate/find release the GIL: since one of them waited (over 20 us), "
     "until 64 in a row were fast", NULL},
    {"closed", (getter)Reader_closed, NULL, "True after close().", NULL},
    {NULL},
};

static PyTypeObject ReaderType = {
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

/* ---------------------------------------------------------------- Writer */

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
    if (!writer_idle(self))
        return NULL;
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
    {"abort", (PyCFunction)Writer_abort, METH_NOARGS, "Discard the shard being written."},
    {NULL},
};

static PyGetSetDef Writer_getset[] = {
    {"count", (getter)Writer_count, NULL, "Objects added.", NULL},
    {"bytes", (getter)Writer_bytes, NULL, "Object bytes added.", NULL},
    {"closed", (getter)Writer_closed, NULL, "True after finish() or abort().", NULL},
    {NULL},
};

static PyTypeObject WriterType = {
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

/* ---------------------------------------------------------------- Sidecar */

/* An unusable sidecar file (SFS_ESTALE: another shard's; SFS_ECORRUPT: damaged)
 * raises StaleSidecarError; the rest as raise_error. */
static PyObject *raise_sidecar_error(const sfs_error_t *err)
{
    if (err->status == SFS_ESTALE || err->status == SFS_ECORRUPT) {
        PyErr_SetString(StaleSidecarError, err->message);
        return NULL;
    }
    return raise_error(err);
}

static int get_identity(PyObject *obj, uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE])
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    if (view.len != SFS_SIDECAR_IDENTITY_SIZE) {
        PyBuffer_Release(&view);
        PyErr_Format(PyExc_ValueError, "an identity is %d bytes, got %zd",
                     SFS_SIDECAR_IDENTITY_SIZE, view.len);
        return -1;
    }
    memcpy(identity, view.buf, SFS_SIDECAR_IDENTITY_SIZE);
    PyBuffer_Release(&view);
    return 0;
}

typedef struct {
    PyObject_HEAD
    sfs_sidecar_t *sc;
    Py_ssize_t users; /* SidecarSet entries holding it */
    int closed;       /* close() called; the mapping stays while users > 0 */
} Sidecar;

static PyTypeObject SidecarType;

static int sidecar_ready(Sidecar *self)
{
    if (!self->sc || self->closed) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed sidecar");
        return 0;
    }
    return 1;
}

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
    Py_DECREF(path_obj);
    if (rc != SFS_OK) {
        raise_sidecar_error(&err);
        return -1;
    }
    sfs_sidecar_close(self->sc);
    self->sc = sc;
    self->closed = 0;
    return 0;
}

static void Sidecar_dealloc(Sidecar *self)
{
    sfs_sidecar_close(self->sc);
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
        return gone("sidecar");
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
        return gone("sidecar");
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
            return gone("sidecar");
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
     "Unmap the file (at once, or when the last SidecarSet entry holding it goes)."},
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

static PyTypeObject SidecarType = {
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
static PyObject *build_sidecar(PyObject *module, PyObject *args, PyObject *kwds)
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

/* Entries 0..len-1: inactive (never a candidate), active without a filter
 * (always a candidate), or active with a Sidecar. candidates() runs over a
 * compact copy of the active entries, rebuilt after a change. For use under
 * the GIL (no lock of its own). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t len, cap;
    PyObject **sidecars;    /* [cap]: a Sidecar (strong reference) or NULL */
    unsigned char *active;  /* [cap] */
    Py_ssize_t nactive;
    int dirty;              /* the compact arrays are out of date */
    sfs_sidecar_t **packed; /* [nactive] */
    uint32_t *index;        /* [nactive]: the entry of packed[j] */
    uint32_t *out;          /* [nactive]: candidates() output */
} SidecarSet;

static void release_entry(SidecarSet *self, Py_ssize_t i)
{
    Sidecar *sc = (Sidecar *)self->sidecars[i];
    self->sidecars[i] = NULL;
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
    for (Py_ssize_t i = 0; i < self->len; i++)
        release_entry(self, i);
    PyMem_Free(self->sidecars);
    PyMem_Free(self->active);
    PyMem_Free(self->packed);
    PyMem_Free(self->index);
    PyMem_Free(self->out);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int index_arg(PyObject *arg, Py_ssize_t *i)
{
    *i = PyNumber_AsSsize_t(arg, PyExc_IndexError);
    if (*i == -1 && PyErr_Occurred())
        return -1;
    if (*i < 0 || (uint64_t)*i >= UINT32_MAX) {
        PyErr_Format(PyExc_IndexError, "index %zd outside [0, 2^32 - 1)", *i);
        return -1;
    }
    return 0;
}

/* set(i, sidecar_or_None) */
/* Grow two parallel arrays indexed by i (*items of item_size bytes each,
 * *bytes of one byte each) so that index i fits: the capacity *cap doubled
 * from `initial` as needed, the new part zeroed. 0, or -1 with MemoryError
 * set (the arrays stay valid at their old capacity). */
static int grow_dense(void **items, size_t item_size, unsigned char **bytes, Py_ssize_t *cap,
                      Py_ssize_t i, Py_ssize_t initial)
{
    if (i < *cap)
        return 0;
    Py_ssize_t want = *cap ? *cap : initial;
    while (want <= i)
        want *= 2;
    void *a = PyMem_Realloc(*items, (size_t)want * item_size);
    if (!a) {
        PyErr_NoMemory();
        return -1;
    }
    *items = a;
    unsigned char *b = PyMem_Realloc(*bytes, (size_t)want);
    if (!b) {
        PyErr_NoMemory();
        return -1;
    }
    *bytes = b;
    memset((char *)a + (size_t)*cap * item_size, 0, (size_t)(want - *cap) * item_size);
    memset(b + *cap, 0, (size_t)(want - *cap));
    *cap = want;
    return 0;
}

static PyObject *SidecarSet_set(SidecarSet *self, PyObject *args)
{
    PyObject *i_obj, *obj;
    Py_ssize_t i;
    if (!PyArg_ParseTuple(args, "OO", &i_obj, &obj) || index_arg(i_obj, &i) < 0)
        return NULL;
    if (obj != Py_None) {
        if (!PyObject_TypeCheck(obj, &SidecarType)) {
            PyErr_SetString(PyExc_TypeError, "set(i, x): x must be a Sidecar or None");
            return NULL;
        }
        if (!sidecar_ready((Sidecar *)obj))
            return NULL;
    }
    if (grow_dense((void **)&self->sidecars, sizeof(PyObject *), &self->active, &self->cap, i, 16) < 0)
        return NULL;
    if (i >= self->len)
        self->len = i + 1;
    release_entry(self, i);
    if (obj != Py_None) {
        Py_INCREF(obj);
        ((Sidecar *)obj)->users++;
        self->sidecars[i] = obj;
    }
    self->active[i] = 1;
    self->dirty = 1;
    Py_RETURN_NONE;
}

/* remove(i): inactive from now on (no-op when it is not active) */
static PyObject *SidecarSet_remove(SidecarSet *self, PyObject *arg)
{
    Py_ssize_t i;
    if (index_arg(arg, &i) < 0)
        return NULL;
    if (i < self->len && self->active[i]) {
        release_entry(self, i);
        self->active[i] = 0;
        self->dirty = 1;
    }
    Py_RETURN_NONE;
}

static int pack(SidecarSet *self)
{
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < self->len; i++)
        n += self->active[i];
    size_t want = (size_t)(n ? n : 1);
    sfs_sidecar_t **packed = PyMem_Realloc(self->packed, want * sizeof(*packed));
    if (packed)
        self->packed = packed;
    uint32_t *index = PyMem_Realloc(self->index, want * sizeof(uint32_t));
    if (index)
        self->index = index;
    uint32_t *out = PyMem_Realloc(self->out, want * sizeof(uint32_t));
    if (out)
        self->out = out;
    if (!packed || !index || !out) {
        PyErr_NoMemory();
        return -1;
    }
    n = 0;
    for (Py_ssize_t i = 0; i < self->len; i++) {
        if (!self->active[i])
            continue;
        Sidecar *sc = (Sidecar *)self->sidecars[i];
        packed[n] = sc ? sc->sc : NULL;
        index[n++] = (uint32_t)i;
    }
    self->nactive = n;
    self->dirty = 0;
    return 0;
}

/* candidates(key32) -> list of int */
static PyObject *SidecarSet_candidates(SidecarSet *self, PyObject *arg)
{
    uint8_t key[SFS_KEY_SIZE];
    if (get_key(arg, key) < 0 || (self->dirty && pack(self) < 0))
        return NULL;
    size_t n = 0;
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, n = sfs_sidecar_candidates(self->packed, (size_t)self->nactive, key,
                                                           self->out, (size_t)self->nactive));
    if (rc == SFS_EGONE)
        return gone("sidecar");
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list)
        return NULL;
    for (size_t j = 0; j < n; j++) {
        PyObject *v = PyLong_FromUnsignedLong(self->index[self->out[j]]);
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
     "set(i, sidecar_or_None): make entry i active, filtered by the Sidecar (kept referenced) "
     "or, with None, always a candidate."},
    {"remove", (PyCFunction)SidecarSet_remove, METH_O,
     "remove(i): make entry i inactive (never a candidate); no-op if it is not active."},
    {"candidates", (PyCFunction)SidecarSet_candidates, METH_O,
     "candidates(key32) -> [i, ...] in increasing order: the active entries whose sidecar may "
     "contain the key, or that have none."},
    {NULL},
};

static PyGetSetDef SidecarSet_getset[] = {
    {"size", (getter)SidecarSet_size, NULL, "1 + the largest index ever set (0 when empty).",
     NULL},
    {NULL},
};

static PySequenceMethods SidecarSet_as_sequence = {
    .sq_length = (lenfunc)SidecarSet_len,
};

static PyTypeObject SidecarSetType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.SidecarSet",
    .tp_basicsize = sizeof(SidecarSet),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SidecarSet(): entries i -> Sidecar (filtered), None (always a candidate) or "
              "inactive; len() counts the active ones. Not thread-safe: use under the GIL.",
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)SidecarSet_dealloc,
    .tp_methods = SidecarSet_methods,
    .tp_getset = SidecarSet_getset,
    .tp_as_sequence = &SidecarSet_as_sequence,
};

/* ---------------------------------------------------------------- GlobalIndex */

/* SFS_EINVAL from gindex.h (an unsorted run, a prefix >= 2^40, too many
 * shards) raises ValueError; the rest as raise_error. */
static PyObject *raise_gindex_error(const sfs_error_t *err)
{
    if (err->status == SFS_EINVAL) {
        PyErr_SetString(PyExc_ValueError, err->message);
        return NULL;
    }
    return raise_error(err);
}

typedef struct {
    PyObject_HEAD
    sfs_gindex_t *g;
    Py_ssize_t users; /* merges running over it (GIL released) */
    int closed;       /* close() called; the level stays open while users > 0 */
} GlobalIndex;

static PyTypeObject GlobalIndexType;

static int gindex_ready(GlobalIndex *self)
{
    if (!self->g || self->closed) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed global index");
        return 0;
    }
    return 1;
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
    sfs_gindex_close(self->g);
    self->g = g;
    self->closed = 0;
    return 0;
}

static void GlobalIndex_dealloc(GlobalIndex *self)
{
    sfs_gindex_close(self->g);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *GlobalIndex_close(GlobalIndex *self, PyObject *unused)
{
    self->closed = 1;
    if (self->users == 0) {
        sfs_gindex_close(self->g);
        self->g = NULL;
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

#define LOOKUP_STACK 64 /* shard indices answered without an allocation */

/* Every shard index of level g holding the key's prefix: into stack (of
 * LOOKUP_STACK), or, when more shards hold it, into a PyMem buffer (*out,
 * to be freed when != stack). Returns SFS_OK and *n, SFS_EGONE (the file
 * shrank: no exception set) or SFS_ENOMEM (MemoryError set). */
static int gindex_lookup_all(const sfs_gindex_t *g, const uint8_t key[SFS_KEY_SIZE],
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

static PyTypeObject GlobalIndexType = {
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

/* The Reader of `obj`: a Reader, or an object whose `_reader` is one
 * (shardfs.Shard). New reference, or NULL with TypeError. */
static Reader *reader_of(PyObject *obj)
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
static PyObject *key_prefixes(PyObject *module, PyObject *arg)
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
static PyObject *write_global_index(PyObject *module, PyObject *args, PyObject *kwds)
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
static PyObject *merge_global_index(PyObject *module, PyObject *args, PyObject *kwds)
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
        if (set->dirty && pack(set) < 0)
            return -1;
        size_t n = 0;
        int rc = SFS_OK;
        if (set->nactive) {
            SFS_GUARDED(rc = SFS_EGONE, n = sfs_sidecar_candidates(set->packed, (size_t)set->nactive, key,
                                                                   set->out, (size_t)set->nactive));
        }
        if (rc == SFS_EGONE) {
            gone("sidecar");
            return -1;
        }
        for (size_t j = 0; j < n; j++) {
            int64_t number = set->index[set->out[j]];
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

/* The served shards a set holds open, by shard number: for each, its Reader
 * and the caller's object for it (the mount's MountedShard), so that a key
 * is found over thousands of shards in one call that touches no Python
 * object but the few candidates' (find). Entries are a dense array indexed
 * by number, grown on demand up to OPEN_SHARDS_MAX_NUMBER (a number beyond
 * is never held: find reports it as not open). `used` marks the entries
 * find probed since `touched` last asked (the caller's recency order: a
 * second chance for the least recently used). For use under the GIL. */
#define OPEN_SHARDS_MAX_NUMBER (1 << 24)

typedef struct {
    sfs_shard_t *shard; /* reader->shard, kept open while held (Reader.users) */
    Reader *reader;     /* strong reference, or NULL */
    PyObject *member;   /* strong reference, or NULL */
} open_entry_t;

typedef struct {
    PyObject_HEAD
    open_entry_t *entries;
    unsigned char *used;
    Py_ssize_t cap, count;
    unsigned long long probes;
    /* finds probing with the GIL released: entries let go meanwhile are
     * parked in `parked` (a list of (reader, member)), released after */
    Py_ssize_t busy;
    PyObject *parked;
} OpenShards;

/* Empty entry e. Its reader is let go now, or, while a find probes
 * without the GIL (it may be reading that shard's mapping), parked still
 * held until the probe ends (release_parked). */
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
    if (self->busy) {
        if (!self->parked)
            self->parked = PyList_New(0);
        if (self->parked && PyList_Append(self->parked, (PyObject *)r) == 0) {
            Py_DECREF(r); /* the list holds it now */
            return;
        }
        /* Out of memory: leak the reader rather than free a shard that may
         * be read. */
        PyErr_Clear();
        return;
    }
    reader_unhold(r);
    Py_DECREF(r);
}

/* Let go of the parked readers once no find probes. */
static void release_parked(OpenShards *self)
{
    PyObject *parked = self->parked;
    if (self->busy || !parked)
        return;
    self->parked = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(parked); i++)
        reader_unhold((Reader *)PyList_GET_ITEM(parked, i));
    Py_DECREF(parked);
}

static void OpenShards_clear_entries(OpenShards *self)
{
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        release_open_entry(self, &self->entries[i]);
        self->used[i] = 0;
    }
    self->count = 0;
}

static int OpenShards_traverse(OpenShards *self, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < self->cap; i++) {
        Py_VISIT(self->entries[i].reader);
        Py_VISIT(self->entries[i].member);
    }
    Py_VISIT(self->parked);
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
    release_parked(self);
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
    if (reader != Py_None &&
        grow_dense((void **)&self->entries, sizeof(open_entry_t), &self->used, &self->cap, number, 1024) < 0)
        return NULL;
    if (number >= self->cap)
        Py_RETURN_NONE; /* forgetting an entry never held */
    if (reader != Py_None && !reader_ready((Reader *)reader))
        return NULL;
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
    /* The held candidates up to the first one not held. Their shards stay
     * open while the GIL is released: an entry let go meanwhile is parked
     * (busy). */
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
        held[nheld++] = e->shard;
    }
    candidates_free(&c);
    int rc = SFS_ENOTFOUND;
    size_t hit = nheld;
    uint32_t slot = 0;
    uint64_t off = 0, size = 0;
    if (nheld) {
        self->busy++;
        Py_BEGIN_ALLOW_THREADS
        for (size_t j = 0; j < nheld; j++) {
            SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup_slot(held[j], key, &slot, &off, &size));
            if (rc != SFS_ENOTFOUND) {
                hit = j;
                break;
            }
        }
        Py_END_ALLOW_THREADS
        self->busy--;
    }
    size_t probed = hit < nheld ? hit + 1 : nheld;
    if (count)
        self->probes += probed;
    for (size_t j = 0; j < probed; j++)
        self->used[numbers[j]] = 1;
    PyObject *result = NULL;
    if (hit < nheld) {
        open_entry_t *e = numbers[hit] < self->cap ? &self->entries[numbers[hit]] : NULL;
        if (rc == SFS_OK) {
            /* set() may have replaced the entry while the GIL was released:
             * the answer is only given for the shard still held (else the
             * caller asks again). */
            if (e && e->shard == held[hit])
                result = Py_BuildValue("(OkKK)", e->member, (unsigned long)slot, (unsigned long long)off,
                                       (unsigned long long)size);
            else
                result = PyLong_FromLongLong(numbers[hit]);
        } else if (rc == SFS_EGONE) {
            gone(sfs_path(held[hit]));
        } else {
            corrupt_slot(held[hit]);
        }
    } else if (missing >= 0) {
        result = PyLong_FromLongLong(missing);
    } else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
    release_parked(self);
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

static PyTypeObject OpenShardsType = {
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

static PyMethodDef module_functions[] = {
    {"build_sidecar", (PyCFunction)(void (*)(void))build_sidecar, METH_VARARGS | METH_KEYWORDS,
     "build_sidecar(reader, path, identity32): write the sidecar of an open Reader at path "
     "(temporary file, fsync, rename). OSError when it cannot be written."},
    {"key_prefixes", (PyCFunction)key_prefixes, METH_O,
     "key_prefixes(shard) -> bytes: the top 40 bits of the shard's live keys, sorted, distinct, "
     "as little-endian u64 (8 bytes each): a run for write_global_index. `shard` is a "
     "shardfs.Shard or a Reader; the index is read with pread (OSError if the file shrank)."},
    {"write_global_index", (PyCFunction)(void (*)(void))write_global_index,
     METH_VARARGS | METH_KEYWORDS,
     "write_global_index(path, runs): write a global index level at path (temporary file, "
     "fsync, rename). runs = [(identity32, prefixes), ...], one per shard, shard index i = "
     "runs[i]; prefixes is a bytes-like buffer of little-endian u64 values < 2^40, sorted "
     "ascending (key_prefixes(shard) gives one). ValueError for an unsorted run or a value "
     ">= 2^40; OSError when the file cannot be written."},
    {"merge_global_index", (PyCFunction)(void (*)(void))merge_global_index,
     METH_VARARGS | METH_KEYWORDS,
     "merge_global_index(path, levels, keep=None): merge open GlobalIndex levels into a new "
     "level at path. keep: None (keep all) or one item per level, None or an iterable of the "
     "shard indices of that level to keep (others are dropped). The new shard table holds the "
     "kept identities once each, in order of first appearance. CorruptShardError when a "
     "level's entries are damaged; OSError on I/O errors."},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_shardfs", "C core of shardfs (Read Shard format).", -1,
    module_functions, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__shardfs(void)
{
    PyObject *errors = PyImport_ImportModule("shardfs.errors");
    if (!errors)
        return NULL;
    ShardError = PyObject_GetAttrString(errors, "ShardError");
    CorruptShardError = PyObject_GetAttrString(errors, "CorruptShardError");
    DuplicateKeyError = PyObject_GetAttrString(errors, "DuplicateKeyError");
    StaleSidecarError = PyObject_GetAttrString(errors, "StaleSidecarError");
    Py_DECREF(errors);
    if (!ShardError || !CorruptShardError || !DuplicateKeyError || !StaleSidecarError)
        return NULL;
    if (sfs_guard_install() != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if (PyType_Ready(&ReaderType) < 0 || PyType_Ready(&WriterType) < 0 ||
        PyType_Ready(&SidecarType) < 0 || PyType_Ready(&SidecarSetType) < 0 ||
        PyType_Ready(&GlobalIndexType) < 0 || PyType_Ready(&OpenShardsType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&ReaderType);
    Py_INCREF(&WriterType);
    Py_INCREF(&SidecarType);
    Py_INCREF(&SidecarSetType);
    Py_INCREF(&GlobalIndexType);
    Py_INCREF(&OpenShardsType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddObject(m, "Sidecar", (PyObject *)&SidecarType) < 0 ||
        PyModule_AddObject(m, "SidecarSet", (PyObject *)&SidecarSetType) < 0 ||
        PyModule_AddObject(m, "GlobalIndex", (PyObject *)&GlobalIndexType) < 0 ||
        PyModule_AddObject(m, "OpenShards", (PyObject *)&OpenShardsType) < 0 ||
        PyModule_AddIntConstant(m, "GINDEX_PREFIX_BITS", SFS_GINDEX_PREFIX_BITS) < 0 ||
        PyModule_AddIntConstant(m, "KEY_SIZE", SFS_KEY_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", SFS_SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_END", SFS_HEADER_END) < 0 ||
        /* bytes of the big-endian u64 size field before each object */
        PyModule_AddIntConstant(m, "SIZE_FIELD_SIZE", (long)sizeof(uint64_t)) < 0 ||
        PyModule_AddIntConstant(m, "SIDECAR_IDENTITY_SIZE", SFS_SIDECAR_IDENTITY_SIZE) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
