/*
 * py_session.c — the Session type of shardfs._shardfs: one mount's FUSE
 * session on libfuse3's low-level API (ll.h).
 *
 * Its life, driven by shardfs.fuse.coordinator and shardfs.fuse.worker:
 * Session(fs, mountpoint, options, ...) mounts; answer_init() processes the
 * kernel's INIT request and nothing else (and keeps its bytes:
 * init_request()); Session(..., fd=FD, init=BYTES) adopts a connection
 * another process mounted and initialized (a coordinator restarted or
 * upgraded in place: shardfs.fuse.supervisor) by replaying that INIT
 * request into libfuse, its answer not written (libfuse answers EIO to any
 * request of a session that has not seen INIT, so the worker processes are
 * forked after it); in each worker, serve() runs libfuse's multithreaded
 * loop, each thread on its own clone of /dev/fuse (clone_fd), with the GIL
 * released, until the mount ends; the coordinator writes the kernel
 * notifications (invalidate_entry, invalidate_inode) and unmount()s.
 */
#include "ll.h"

#include <linux/fuse.h>
#include <stddef.h>
#include <sys/uio.h>
#include <unistd.h>

#include <poll.h>
#include <time.h>

static void Session_release(Session *self)
{
    if (self->se) {
        if (self->mounted)
            fuse_session_unmount(self->se);
        self->mounted = 0;
        fuse_session_destroy(self->se);
        self->se = NULL;
    }
}

static void Session_dealloc(Session *self)
{
    Session_release(self);
    ll_fast_free(self->fast);
    if (self->has_counts_view)
        PyBuffer_Release(&self->counts_view);
    if (self->seq_view.obj)
        PyBuffer_Release(&self->seq_view);
    if (self->stats_view.obj)
        PyBuffer_Release(&self->stats_view);
    if (self->hist_view.obj)
        PyBuffer_Release(&self->hist_view);
    if (self->io_view.obj)
        PyBuffer_Release(&self->io_view);
    pthread_mutex_destroy(&self->py_lock);
    free(self->init_request);
    Py_XDECREF(self->fs);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Session_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Session *self = (Session *)type->tp_alloc(type, 0);
    if (self) {
        pthread_mutex_init(&self->py_lock, NULL);
        self->counts = self->own_counts;
    }
    return (PyObject *)self;
}

/* Session(fs, mountpoint, options, uid, gid, cache_timeout, entry_timeout,
 * fd=-1, init=None): mount `mountpoint` (str) with libfuse's mount `options` (a list of str,
 * e.g. "ro", "fsname=x", "allow_other"), requests to be answered by the
 * handlers `fs`; attributes owned by uid:gid, cached `cache_timeout`
 * seconds, absent names `entry_timeout` seconds. Raises RuntimeError when
 * libfuse refuses the options or the mount (it says why on stderr).
 * With `fd` (a /dev/fuse descriptor of a mounted connection, which the
 * session owns and closes from then on) and `init` (that connection's INIT
 * request, bytes, as init_request() gave them), nothing is mounted: the
 * INIT is replayed (session_adopt) and the session serves `fd`; unmount()
 * then only ends it. ValueError when `init` is not an INIT request,
 * RuntimeError when libfuse refuses it. */
/* The session's I/O on /dev/fuse (fuse_session_custom_io): plain read and
 * writev, but for the answer to INIT, which gets FUSE_PARALLEL_DIROPS
 * when the kernel offers it. libfuse before 3.17.1 never passes that flag
 * (its do_init drops it: libfuse commit c9905341, issue #861), and
 * without it the kernel runs one LOOKUP or READDIR per directory at a
 * time: every cold open in a flat root would wait for the one before. */
/* Count what was written to /dev/fuse, from its header (ll.h, enum ll_io):
 * an answer (`unique` ≠ 0) by its length or its error, a notification
 * (`unique` 0, `error` its code) of stored bytes by their length. */
static void count_written(int64_t *io, const struct fuse_out_header *h)
{
    if (h->unique == 0) {
        size_t head = sizeof(*h) + sizeof(struct fuse_notify_store_out);
        if (h->error == FUSE_NOTIFY_STORE && h->len > head)
            __atomic_fetch_add(&io[LL_IO_PUSHED_BYTES], (int64_t)(h->len - head), __ATOMIC_RELAXED);
    } else if (h->error == 0) {
        if (h->len > sizeof(*h))
            __atomic_fetch_add(&io[LL_IO_REPLY_BYTES], (int64_t)(h->len - sizeof(*h)), __ATOMIC_RELAXED);
    } else {
        int e = -h->error;
        if (e != ENOENT && e != ENODATA && e != ENOTTY && e != ENOSYS && e != EROFS && e != ERANGE)
            __atomic_fetch_add(&io[LL_IO_ERRORS], 1, __ATOMIC_RELAXED);
    }
}

static ssize_t session_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    Session *s = userdata;
    if (s && s->swallow_init) { /* the kernel had its answer from the process that mounted */
        ssize_t len = 0;
        for (int i = 0; i < count; i++)
            len += (ssize_t)iov[i].iov_len;
        s->swallow_init = 0;
        s->patch_init = 0;
        return len;
    }
    if (s && s->patch_init && count >= 2 &&
        iov[1].iov_len >= offsetof(struct fuse_init_out, flags) + sizeof(uint32_t)) {
        struct fuse_init_out *out = iov[1].iov_base;
        out->flags |= FUSE_PARALLEL_DIROPS;
        s->patch_init = 0;
    }
    ssize_t written = writev(fd, iov, count);
    if (s && s->io && written > 0 && count >= 1 && iov[0].iov_len >= sizeof(struct fuse_out_header))
        count_written(s->io, iov[0].iov_base);
    return written;
}

static ssize_t session_read(int fd, void *buf, size_t len, void *userdata)
{
    return read(fd, buf, len);
}

/* Replay the kernel's INIT request `init` (len bytes, as answer_init read
 * it) into the session, its answer dropped: libfuse negotiates as it did
 * in the process that mounted, and serves the connection from then on.
 * 0, or -1 with an exception. */
static int session_adopt(Session *self, const char *init, Py_ssize_t len)
{
    if (len < (Py_ssize_t)(sizeof(struct fuse_in_header) + 8) ||
        ((const struct fuse_in_header *)init)->opcode != FUSE_INIT) {
        PyErr_SetString(PyExc_ValueError, "init is not a FUSE INIT request");
        return -1;
    }
    struct fuse_buf buf = {.mem = malloc((size_t)len), .size = (size_t)len};
    if (!buf.mem) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(buf.mem, init, (size_t)len);
    self->swallow_init = 1;
    fuse_session_process_buf(self->se, &buf);
    free(buf.mem);
    self->swallow_init = 0;
    if (!self->init_done) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse refused the recorded INIT request");
        return -1;
    }
    return 0;
}

static int Session_init(Session *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fs", "mountpoint", "options", "uid", "gid", "cache_timeout", "entry_timeout",
                             "fd", "init", NULL};
    PyObject *fs, *options, *mp;
    unsigned int uid, gid;
    double cache_timeout, entry_timeout;
    int adopt_fd = -1;
    const char *init = NULL;
    Py_ssize_t init_len = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO&OIIdd|iy#:Session", kwlist, &fs, PyUnicode_FSConverter, &mp,
                                     &options, &uid, &gid, &cache_timeout, &entry_timeout, &adopt_fd, &init,
                                     &init_len))
        return -1;
    if (adopt_fd >= 0 && !init) {
        Py_DECREF(mp);
        PyErr_SetString(PyExc_ValueError, "adopting a connection (fd) needs its INIT request (init)");
        return -1;
    }
    if (self->se) {
        Py_DECREF(mp);
        PyErr_SetString(PyExc_RuntimeError, "Session already initialized");
        return -1;
    }
    PyObject *seq = PySequence_Fast(options, "options must be a sequence of str");
    if (!seq) {
        Py_DECREF(mp);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    char **argv = PyMem_Calloc((size_t)(2 * n + 2), sizeof(char *));
    PyObject **keep = PyMem_Calloc((size_t)(n + 1), sizeof(PyObject *));
    int rc = -1, argc = 0;
    if (!argv || !keep) {
        PyErr_NoMemory();
        goto out;
    }
    argv[argc++] = "shardfs";
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(seq, i), &keep[i]))
            goto out;
        argv[argc++] = "-o";
        argv[argc++] = PyBytes_AS_STRING(keep[i]);
    }
    struct fuse_args fargs = FUSE_ARGS_INIT(argc, argv);
    self->uid = uid;
    self->gid = gid;
    self->cache_timeout = cache_timeout;
    self->entry_timeout = entry_timeout;
    Py_INCREF(fs);
    Py_XSETREF(self->fs, fs);
    self->se = fuse_session_new(&fargs, &ll_ops, sizeof(ll_ops), self);
    fuse_opt_free_args(&fargs);
    if (!self->se) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse refused the options");
        goto out;
    }
    static const struct fuse_custom_io io = {.writev = session_writev, .read = session_read};
    if (adopt_fd >= 0) { /* the connection is mounted and initialized: take it over */
        if (fuse_session_custom_io(self->se, &io, adopt_fd) != 0) {
            fuse_session_destroy(self->se);
            self->se = NULL;
            PyErr_SetString(PyExc_RuntimeError, "libfuse refused the session's I/O");
            goto out;
        }
        if (session_adopt(self, init, init_len) < 0) {
            fuse_session_destroy(self->se); /* closes adopt_fd: the caller gives a copy */
            self->se = NULL;
            goto out;
        }
        rc = 0;
        goto out;
    }
    int mrc;
    Py_BEGIN_ALLOW_THREADS
    mrc = fuse_session_mount(self->se, PyBytes_AS_STRING(mp));
    Py_END_ALLOW_THREADS
    if (mrc != 0) {
        fuse_session_destroy(self->se);
        self->se = NULL;
        PyErr_SetString(PyExc_RuntimeError, "libfuse could not mount");
        goto out;
    }
    self->mounted = 1;
    if (fuse_session_custom_io(self->se, &io, fuse_session_fd(self->se)) != 0) {
        PyErr_SetString(PyExc_RuntimeError, "libfuse refused the session's I/O");
        goto out;
    }
    rc = 0;
out:
    for (Py_ssize_t i = 0; keep && i < n; i++)
        Py_XDECREF(keep[i]);
    PyMem_Free(keep);
    PyMem_Free(argv);
    Py_DECREF(seq);
    Py_DECREF(mp);
    return rc;
}

static int session_ready(Session *self)
{
    if (!self->se) {
        PyErr_SetString(PyExc_ValueError, "the session is closed");
        return 0;
    }
    return 1;
}

/* fileno() -> the session's /dev/fuse descriptor. */
static PyObject *Session_fileno(Session *self, PyObject *unused)
{
    if (!session_ready(self))
        return NULL;
    return PyLong_FromLong(fuse_session_fd(self->se));
}

/* answer_init(timeout) -> bool: process the kernel's requests until INIT
 * was answered, at most `timeout` seconds; nothing after it is read (the
 * next requests wait in the kernel for the workers). False on timeout.
 * Raises OSError when the device fails. */
static PyObject *Session_answer_init(Session *self, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (!session_ready(self))
        return NULL;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct fuse_buf buf = {.mem = NULL};
    int err = 0;
    while (!self->init_done) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = timeout - ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9);
        if (left <= 0)
            break;
        struct pollfd p = {.fd = fuse_session_fd(self->se), .events = POLLIN};
        int n;
        Py_BEGIN_ALLOW_THREADS
        n = poll(&p, 1, (int)(left * 1000) + 1);
        Py_END_ALLOW_THREADS
        if (n < 0 && errno == EINTR) {
            if (PyErr_CheckSignals() < 0)
                goto fail;
            continue;
        }
        if (n < 0) {
            err = errno;
            break;
        }
        if (n == 0)
            continue;
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = fuse_session_receive_buf(self->se, &buf);
        if (r > (int)sizeof(struct fuse_in_header) && !self->init_request &&
            ((struct fuse_in_header *)buf.mem)->opcode == FUSE_INIT &&
            (self->init_request = malloc((size_t)r)) != NULL) { /* kept for processes that adopt it */
            memcpy(self->init_request, buf.mem, (size_t)r);
            self->init_request_len = (size_t)r;
        }
        if (r > 0)
            fuse_session_process_buf(self->se, &buf);
        Py_END_ALLOW_THREADS
        if (r < 0 && r != -EINTR && r != -EAGAIN) {
            err = -r;
            break;
        }
    }
    free(buf.mem);
    if (err) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyBool_FromLong(self->init_done);
fail:
    free(buf.mem);
    return NULL;
}

/* A writable, aligned buffer of at least `words` native int64 words, in
 * `view`. Returns 0, or -1 with an exception set. */
static int words_buffer(PyObject *obj, Py_buffer *view, size_t words, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_WRITABLE) < 0)
        return -1;
    if ((size_t)view->len < words * sizeof(int64_t) || ((uintptr_t)view->buf % sizeof(int64_t))) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: an aligned writable buffer of %zu int64 words", what, words);
        return -1;
    }
    return 0;
}

/* serve(threads, counts=None, seq=None, stats=None, hist=None, io=None) -> int:
 * serve requests until the mount ends, with at most `threads` threads (started
 * as requests wait for one), all reading the session's descriptor (the
 * worker's clone of the device, of which the mount's supervisor keeps a copy:
 * requests read by a dead worker can then be resent, worker.py); the
 * GIL is released. `counts`: LL_KINDS native int64 words where
 * requests are counted by kind (shared memory), else the session's own.
 * `seq`: the word where the coordinator publishes its shard table's
 * sequence (requests go to the handlers until they applied it); `stats`:
 * five words counting the lookups and index probes answered in C, the
 * objects pushed ahead, the pushes the kernel refused and the hash index
 * probes of lookups by sha1 or sha1_git (ll_fast.c); `hist`:
 * LL_KINDS * LL_HIST_WORDS words where requests' durations are counted
 * (ll.h), else they are not timed; `io`: LL_IO_WORDS words counting the
 * bytes answered and pushed and the error answers (ll.h, enum ll_io),
 * else they are not counted. Returns libfuse's status (0: unmounted). */
static PyObject *Session_serve(Session *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"threads", "counts", "seq", "stats", "hist", "io", NULL};
    int threads;
    PyObject *counts = Py_None, *seq = Py_None, *stats = Py_None, *hist = Py_None, *io = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "i|OOOOO:serve", kwlist, &threads, &counts, &seq, &stats,
                                     &hist, &io))
        return NULL;
    if (!session_ready(self))
        return NULL;
    if (threads < 1 || threads > 1024) {
        PyErr_SetString(PyExc_ValueError, "threads must be 1..1024");
        return NULL;
    }
    if (self->has_counts_view || self->fast) {
        PyErr_SetString(PyExc_RuntimeError, "serve() already called");
        return NULL;
    }
    if (counts != Py_None) {
        if (words_buffer(counts, &self->counts_view, LL_KINDS, "counts") < 0)
            return NULL;
        self->has_counts_view = 1;
        self->counts = self->counts_view.buf;
    }
    if (seq != Py_None && words_buffer(seq, &self->seq_view, 1, "seq") < 0)
        return NULL;
    if (stats != Py_None && words_buffer(stats, &self->stats_view, LL_STATS, "stats") < 0)
        return NULL;
    if (hist != Py_None) {
        if (words_buffer(hist, &self->hist_view, (size_t)LL_KINDS * LL_HIST_WORDS, "hist") < 0)
            return NULL;
        self->hist = self->hist_view.buf;
    }
    if (io != Py_None) {
        if (words_buffer(io, &self->io_view, LL_IO_WORDS, "io") < 0)
            return NULL;
        self->io = self->io_view.buf;
    }
    self->fast = ll_fast_new(self->seq_view.obj ? self->seq_view.buf : NULL,
                             self->stats_view.obj ? self->stats_view.buf : NULL);
    if (!self->fast)
        return NULL;
    ll_fast_refresh(self->fast, self->fs);
    struct fuse_loop_config *cfg = fuse_loop_cfg_create();
    if (!cfg)
        return PyErr_NoMemory();
    fuse_loop_cfg_set_clone_fd(cfg, 0);
    self->store_max = threads - 1;
    fuse_loop_cfg_set_max_threads(cfg, (unsigned)threads);
    fuse_loop_cfg_set_idle_threads(cfg, (unsigned)threads);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fuse_session_loop_mt(self->se, cfg);
    Py_END_ALLOW_THREADS
    fuse_loop_cfg_destroy(cfg);
    return PyLong_FromLong(rc);
}

static PyObject *notify_result(int rc)
{
    if (rc == 0 || rc == -ENOENT) /* ENOENT: the kernel does not know it: nothing to drop */
        Py_RETURN_NONE;
    errno = -rc;
    return PyErr_SetFromErrno(PyExc_OSError);
}

/* invalidate_entry(parent, name: bytes): make the kernel forget the name
 * `name` in directory `parent` (looked up again when next used). Raises
 * OSError on failure; a name the kernel does not know is no failure. */
static PyObject *Session_invalidate_entry(Session *self, PyObject *args)
{
    unsigned long long parent;
    const char *name;
    Py_ssize_t len;
    if (!PyArg_ParseTuple(args, "Ky#:invalidate_entry", &parent, &name, &len) || !session_ready(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fuse_lowlevel_notify_inval_entry(self->se, parent, name, (size_t)len);
    Py_END_ALLOW_THREADS
    return notify_result(rc);
}

/* invalidate_inode(ino): drop the kernel's cached attributes and pages of
 * inode `ino`. Raises OSError on failure (an unknown inode is none). */
static PyObject *Session_invalidate_inode(Session *self, PyObject *arg)
{
    unsigned long long ino = PyLong_AsUnsignedLongLong(arg);
    if ((ino == (unsigned long long)-1 && PyErr_Occurred()) || !session_ready(self))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fuse_lowlevel_notify_inval_inode(self->se, ino, 0, 0);
    Py_END_ALLOW_THREADS
    return notify_result(rc);
}

/* disown(): the session no longer unmounts when it ends (its process
 * leaves the mount to another: an upgrade in place). */
static PyObject *Session_disown(Session *self, PyObject *unused)
{
    self->mounted = 0;
    Py_RETURN_NONE;
}

/* init_request() -> bytes: the kernel's INIT request as answer_init read
 * it (header and body), for Session(..., fd=, init=) in another process;
 * None before INIT was read. */
static PyObject *Session_init_request(Session *self, PyObject *unused)
{
    if (!self->init_request)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)self->init_request, (Py_ssize_t)self->init_request_len);
}

/* unmount(): unmount (lazily, as libfuse does) and end the session; once. */
static PyObject *Session_unmount(Session *self, PyObject *unused)
{
    Session_release(self);
    Py_RETURN_NONE;
}

/* refresh(): publish a snapshot of the handlers' state as it is now
 * (ll_fast_refresh), from a handler (the handlers' lock held) or before
 * serve(): a handler that opened a shard, closing another to make room,
 * lets the snapshot of the requests answered in C go of the closed one at
 * once instead of when it returns. */
static PyObject *Session_refresh(Session *self, PyObject *unused)
{
    ll_fast_refresh(self->fast, self->fs);
    Py_RETURN_NONE;
}

/* counts() -> the LL_KINDS request counters, in REQUEST_KINDS order. */
static PyObject *Session_counts(Session *self, PyObject *unused)
{
    PyObject *out = PyList_New(LL_KINDS);
    for (int i = 0; out && i < LL_KINDS; i++)
        PyList_SET_ITEM(out, i, PyLong_FromLongLong(__atomic_load_n(&self->counts[i], __ATOMIC_RELAXED)));
    return out;
}

static PyMethodDef Session_methods[] = {
    {"fileno", (PyCFunction)Session_fileno, METH_NOARGS, "fileno() -> the session's /dev/fuse descriptor."},
    {"answer_init", (PyCFunction)Session_answer_init, METH_O,
     "answer_init(timeout) -> bool: answer the kernel's INIT request and nothing else."},
    {"serve", (PyCFunction)(void (*)(void))Session_serve, METH_VARARGS | METH_KEYWORDS,
     "serve(threads, counts=None, seq=None, stats=None, hist=None, io=None) -> int: serve requests until "
     "unmounted (GIL released)."},
    {"invalidate_entry", (PyCFunction)Session_invalidate_entry, METH_VARARGS,
     "invalidate_entry(parent, name): the kernel forgets a name."},
    {"invalidate_inode", (PyCFunction)Session_invalidate_inode, METH_O,
     "invalidate_inode(ino): the kernel drops an inode's attributes and pages."},
    {"unmount", (PyCFunction)Session_unmount, METH_NOARGS, "unmount(): unmount and end the session."},
    {"disown", (PyCFunction)Session_disown, METH_NOARGS,
     "disown(): ending the session no longer unmounts (the mount is left to another process)."},
    {"init_request", (PyCFunction)Session_init_request, METH_NOARGS,
     "init_request() -> bytes or None: the kernel's INIT request as read, for Session(..., fd=, init=)."},
    {"counts", (PyCFunction)Session_counts, METH_NOARGS, "counts() -> requests served, by kind."},
    {"refresh", (PyCFunction)Session_refresh, METH_NOARGS,
     "refresh(): publish the handlers' state to the requests answered in C now (from a handler only)."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SessionType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.Session",
    .tp_basicsize = sizeof(Session),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A mount's FUSE session on libfuse3's low-level API (see ll.h).",
    .tp_new = Session_new,
    .tp_init = (initproc)Session_init,
    .tp_dealloc = (destructor)Session_dealloc,
    .tp_methods = Session_methods,
};
