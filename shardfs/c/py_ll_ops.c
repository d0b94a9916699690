/*
 * py_ll_ops.c — the FUSE operations of a mount (ll.h): one function per
 * request, each replying itself.
 *
 * Answered in C with the GIL not held: OPEN (ENOSYS: the kernel's no-open
 * mode, see ll.h; EROFS for a write access), OPENDIR and RELEASEDIR (no
 * handle: a listing's position says where it resumes), IOCTL (ENOTTY:
 * CPython's open() asks every file whether it is a terminal, and the
 * kernel forwards each such ioctl; the object's first bytes are pushed
 * into the page cache first, see ll_ioctl), FORGET (inodes carry their location:
 * nothing to forget), FLUSH and RELEASE (never sent in no-open mode),
 * GETXATTR of a name the inode does not have (ENODATA) and LISTXATTR of a
 * directory other than the root (none; see ll_getxattr, ll_listxattr), and
 * every write (EROFS). LOOKUP, GETATTR and READ try ll_fast.c first.
 *
 * The rest calls the Python handlers (shardfs.fuse.handlers.ShardFS) under
 * the session's py_lock, then the GIL (always in that order: a thread
 * holding the GIL never waits for py_lock). A handler returns plain values
 * (see each call) or raises an exception whose `errno` attribute is the
 * answer; any other exception is reported (sys.unraisablehook) and answered
 * EIO.
 */
#include "ll.h"
#include "ll_names.h"

#include <sys/stat.h>

/* ------------------------------------------------------------ calling Python */

/* Run a handler: the lock of handlers (one at a time: the shard set is
 * used by one thread at a time), then the GIL. */
static PyGILState_STATE py_enter(Session *s)
{
    pthread_mutex_lock(&s->py_lock);
    return PyGILState_Ensure();
}

/* After a handler: ll_fast.c takes the shard set as the handler left it. */
static void py_leave(Session *s, PyGILState_STATE gs)
{
    ll_fast_refresh(s->fast, s->fs);
    PyGILState_Release(gs);
    pthread_mutex_unlock(&s->py_lock);
}

/* The errno a handler's exception stands for (cleared); EIO, reported,
 * for an exception without one. Under the GIL. */
static int py_errno(Session *s)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    int err = EIO;
    PyObject *e = value ? PyObject_GetAttrString(value, "errno") : NULL;
    if (e && PyLong_Check(e)) {
        long v = PyLong_AsLong(e);
        if (v > 0 && v < 4096)
            err = (int)v;
        Py_DECREF(e);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        PyErr_Clear();
        return err;
    }
    Py_XDECREF(e);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    PyErr_WriteUnraisable(s->fs);
    return EIO;
}

/* (ino, is_dir, size, time_ns) -> struct stat. Returns 0, or -1 with an
 * exception set. */
static int attr_from(Session *s, PyObject *t, struct stat *st)
{
    unsigned long long ino, size;
    long long time_ns;
    int is_dir;
    if (!PyArg_ParseTuple(t, "KpKL", &ino, &is_dir, &size, &time_ns))
        return -1;
    ll_fill_attr(s, st, ino, is_dir, size, time_ns);
    return 0;
}

static void reply_entry_from(Session *s, fuse_req_t req, PyObject *r)
{
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    if (r == Py_None) { /* no such name: cached for entry_timeout */
        e.entry_timeout = s->entry_timeout;
        e.attr_timeout = s->entry_timeout;
        fuse_reply_entry(req, &e);
        return;
    }
    if (attr_from(s, r, &e.attr) < 0) {
        fuse_reply_err(req, py_errno(s));
        return;
    }
    e.ino = e.attr.st_ino;
    e.entry_timeout = e.attr_timeout = s->cache_timeout;
    fuse_reply_entry(req, &e);
}

/* ---------------------------------------------------------------- names */

static void ll_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_LOOKUP);
    if (ll_fast_lookup(s, req, parent, name))
        return;
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "lookup", "Ky", (unsigned long long)parent, name);
    if (!r)
        fuse_reply_err(req, py_errno(s));
    else
        reply_entry_from(s, req, r);
    Py_XDECREF(r);
    py_leave(s, gs);
}

static void ll_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
    ll_count(fuse_req_userdata(req), LL_FORGET);
    fuse_reply_none(req);
}

static void ll_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
    ll_count(fuse_req_userdata(req), LL_FORGET);
    fuse_reply_none(req);
}

static void ll_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_GETATTR);
    if (ll_fast_getattr(s, req, ino))
        return;
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "getattr", "K", (unsigned long long)ino);
    struct stat st;
    if (!r || attr_from(s, r, &st) < 0)
        fuse_reply_err(req, py_errno(s));
    else
        fuse_reply_attr(req, &st, s->cache_timeout);
    Py_XDECREF(r);
    py_leave(s, gs);
}

/* ---------------------------------------------------------------- files */

static void ll_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_OPEN);
    if ((fi->flags & O_ACCMODE) != O_RDONLY || (fi->flags & (O_TRUNC | O_APPEND | O_CREAT)))
        fuse_reply_err(req, EROFS);
    else
        fuse_reply_err(req, ENOSYS); /* no-open from now on (ll.h) */
}

static void ll_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_READ);
    if (ll_fast_read(s, req, ino, size, off)) {
        ll_done();
        if (off == 0) /* after the answer: this read waits for nothing more */
            ll_fast_push_ahead(s, ino);
        return;
    }
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "read", "KLn", (unsigned long long)ino, (long long)off,
                                      (Py_ssize_t)size);
    if (!r) {
        fuse_reply_err(req, py_errno(s));
    } else if (!PyBytes_Check(r)) {
        PyErr_SetString(PyExc_TypeError, "read() must return bytes");
        fuse_reply_err(req, py_errno(s));
    } else {
        Py_ssize_t n = PyBytes_GET_SIZE(r);
        fuse_reply_buf(req, PyBytes_AS_STRING(r), (size_t)n < size ? (size_t)n : size);
    }
    Py_XDECREF(r);
    py_leave(s, gs);
}

static void ll_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ll_count(fuse_req_userdata(req), LL_FLUSH);
    fuse_reply_err(req, ENOSYS); /* never asked again */
}

static void ll_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ll_count(fuse_req_userdata(req), LL_RELEASE);
    fuse_reply_err(req, 0);
}

static void ll_ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void *arg, struct fuse_file_info *fi,
                     unsigned flags, const void *in_buf, size_t in_bufsz, size_t out_bufsz)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_IOCTL);
    /* An ioctl comes from an open file, and CPython's open() sends one
     * (TCGETS) before every read: push the object's first bytes into the
     * kernel's page cache now, before the answer, so that the read that
     * follows finds them and sends no READ (the IOCTL takes the READ's
     * round trip). A push waits for the page locks of the object's pages;
     * a page is locked while a READ of it is in flight, which some thread
     * must serve: at most store_max (threads - 1) threads of a process
     * push at once, so one is always free to serve it. */
    if (__atomic_add_fetch(&s->storing, 1, __ATOMIC_ACQ_REL) <= s->store_max)
        ll_fast_store(s, ino, LL_STORE_BYTES);
    __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
    fuse_reply_err(req, ENOTTY);
}

/* ---------------------------------------------------------- directories */

static void ll_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_OPENDIR);
    fi->fh = 0;
    fuse_reply_open(req, fi);
}

static void ll_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    ll_count(fuse_req_userdata(req), LL_RELEASEDIR);
    fuse_reply_err(req, 0);
}

/* DirBuffer: the reply of one READDIRPLUS, filled by the handler through
 * add(); valid only while the handler runs. */
typedef struct {
    PyObject_HEAD
    Session *s;
    fuse_req_t req;
    char *buf;
    size_t size, used;
} DirBuffer;

/* add(name: bytes, ino, is_dir, size, time_ns, next_id) -> bool: append an
 * entry with its attributes (READDIRPLUS); False when the reply is full
 * (the entry is not in it: the kernel asks again from the previous
 * next_id). `next_id` is the position just after the entry. */
static PyObject *DirBuffer_add(DirBuffer *self, PyObject *args)
{
    const char *name;
    Py_ssize_t len;
    unsigned long long ino, size;
    long long time_ns, next_id;
    int is_dir;
    if (!PyArg_ParseTuple(args, "y#KpKLL:add", &name, &len, &ino, &is_dir, &size, &time_ns, &next_id))
        return NULL;
    if (!self->req) {
        PyErr_SetString(PyExc_ValueError, "the READDIR this buffer answered is over");
        return NULL;
    }
    if (!sfs_ll_dirent_name(name, (size_t)len)) { /* 1..255 bytes, no '/', no NUL */
        PyErr_SetString(PyExc_ValueError, "add: not a file name");
        return NULL;
    }
    char cname[256];
    memcpy(cname, name, (size_t)len);
    cname[len] = 0;
    struct fuse_entry_param e;
    memset(&e, 0, sizeof(e));
    ll_fill_attr(self->s, &e.attr, ino, is_dir, size, time_ns);
    e.ino = ino;
    e.entry_timeout = e.attr_timeout = self->s->cache_timeout;
    /* the entry's size in the reply (its name padded to 8 bytes) is
     * libfuse's: it writes nothing when that does not fit */
    size_t need = fuse_add_direntry_plus(self->req, self->buf + self->used, self->size - self->used, cname, &e,
                                         (off_t)next_id);
    if (need > self->size - self->used)
        Py_RETURN_FALSE;
    self->used += need;
    Py_RETURN_TRUE;
}

static PyMethodDef DirBuffer_methods[] = {
    {"add", (PyCFunction)DirBuffer_add, METH_VARARGS,
     "add(name, ino, is_dir, size, time_ns, next_id) -> bool: append a directory entry; False when full."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject DirBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "shardfs._shardfs.DirBuffer",
    .tp_basicsize = sizeof(DirBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The reply of one READDIRPLUS request, filled by a handler (see add).",
    .tp_methods = DirBuffer_methods,
};

static void ll_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_READDIR);
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    PyGILState_STATE gs = py_enter(s);
    DirBuffer *db = PyObject_New(DirBuffer, &DirBufferType);
    PyObject *r = NULL;
    if (db) {
        db->s = s;
        db->req = req;
        db->buf = buf;
        db->size = size;
        db->used = 0;
        r = PyObject_CallMethod(s->fs, "readdir", "KLO", (unsigned long long)ino, (long long)off, (PyObject *)db);
    }
    if (!r)
        fuse_reply_err(req, py_errno(s));
    else
        fuse_reply_buf(req, buf, db->used);
    if (db)
        db->req = NULL;
    Py_XDECREF(r);
    Py_XDECREF(db);
    py_leave(s, gs);
    free(buf);
}

/* ------------------------------------------------------- filesystem-wide */

static void ll_statfs(fuse_req_t req, fuse_ino_t ino)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_STATFS);
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "statfs", NULL);
    unsigned long long blocks, files;
    if (!r || !PyArg_ParseTuple(r, "KK", &blocks, &files)) {
        fuse_reply_err(req, py_errno(s));
    } else {
        struct statvfs st;
        memset(&st, 0, sizeof(st));
        st.f_bsize = st.f_frsize = 4096;
        st.f_blocks = blocks;
        st.f_files = files;
        st.f_namemax = 2 * SFS_KEY_SIZE;
        fuse_reply_statfs(req, &st);
    }
    Py_XDECREF(r);
    py_leave(s, gs);
}

static void ll_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_ACCESS);
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "access", "Ki", (unsigned long long)ino, mask);
    fuse_reply_err(req, r ? 0 : py_errno(s));
    Py_XDECREF(r);
    py_leave(s, gs);
}

static void reply_xattr_value(fuse_req_t req, const char *data, size_t len, size_t size)
{
    if (size == 0)
        fuse_reply_xattr(req, len);
    else if (len > size)
        fuse_reply_err(req, ERANGE);
    else
        fuse_reply_buf(req, data, len);
}

static void ll_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_GETXATTR);
    /* ls -l, cp -a, rsync -X and the kernel ask every file for names it
     * does not have (security.selinux, system.posix_acl_access,
     * security.capability): ENODATA here, not one at a time in the
     * handlers (ENODATA, not ENOSYS, which would make the kernel stop
     * asking for any name). So are a root's name asked of another inode
     * and an object's asked of a directory (the root always; another one
     * when the snapshot tells: else the handlers say so). What is left
     * needs the handlers: the JSON of the root; the shard of an object,
     * read from its slot now (a takedown is seen at once; ENOENT, ESTALE;
     * a winery database's object has none: ENODATA). */
    enum sfs_ll_xattr x = sfs_ll_xattr_name(name);
    enum sfs_ll_inode_kind kind = ino == SFS_LL_ROOT_INODE ? SFS_LL_INODE_ROOT : SFS_LL_INODE_OTHER;
    /* whether another inode is a directory matters (and is asked) only
     * for a name it could have otherwise: an object's */
    if (kind == SFS_LL_INODE_OTHER && sfs_ll_xattr_has(x, kind) && ll_fast_is_dir(s, ino) == 1)
        kind = SFS_LL_INODE_DIR;
    if (!sfs_ll_xattr_has(x, kind)) {
        fuse_reply_err(req, ENODATA);
        return;
    }
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "getxattr", "Ky", (unsigned long long)ino, name);
    if (!r) {
        fuse_reply_err(req, py_errno(s));
    } else if (!PyBytes_Check(r)) {
        PyErr_SetString(PyExc_TypeError, "getxattr() must return bytes");
        fuse_reply_err(req, py_errno(s));
    } else {
        reply_xattr_value(req, PyBytes_AS_STRING(r), (size_t)PyBytes_GET_SIZE(r), size);
    }
    Py_XDECREF(r);
    py_leave(s, gs);
}

static void ll_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
    Session *s = fuse_req_userdata(req);
    ll_count(s, LL_LISTXATTR);
    /* cp -a and rsync -X list every directory: none but the root has a
     * name. The root's list and an object's (which checks its slot) are the
     * handlers'. */
    if (ino != SFS_LL_ROOT_INODE && ll_fast_is_dir(s, ino) == 1) {
        char names[1];
        size_t n = sfs_ll_xattr_list(SFS_LL_INODE_DIR, names, sizeof(names)); /* none */
        reply_xattr_value(req, names, n, size);
        return;
    }
    PyGILState_STATE gs = py_enter(s);
    PyObject *r = PyObject_CallMethod(s->fs, "listxattr", "K", (unsigned long long)ino);
    /* the names, each followed by a NUL */
    PyObject *items = r ? PySequence_Fast(r, "listxattr() must return a sequence of bytes") : NULL;
    char out[1024];
    size_t len = 0;
    int err = items ? 0 : -1;
    for (Py_ssize_t i = 0; !err && i < PySequence_Fast_GET_SIZE(items); i++) {
        PyObject *name = PySequence_Fast_GET_ITEM(items, i);
        if (!PyBytes_Check(name) || (size_t)PyBytes_GET_SIZE(name) + 1 > sizeof(out) - len) {
            PyErr_SetString(PyExc_ValueError, "listxattr() must return bytes names, 1 KiB in all at most");
            err = -1;
            break;
        }
        memcpy(out + len, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name) + 1);
        len += (size_t)PyBytes_GET_SIZE(name) + 1;
    }
    Py_XDECREF(items);
    if (err)
        fuse_reply_err(req, py_errno(s));
    else
        reply_xattr_value(req, out, len, size);
    Py_XDECREF(r);
    py_leave(s, gs);
}

/* ---------------------------------------------------- everything that writes */

#define EROFS_OP(kind, ...)                                  \
    {                                                        \
        ll_count(fuse_req_userdata(req), kind);              \
        fuse_reply_err(req, EROFS);                          \
    }

static void ll_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set, struct fuse_file_info *fi)
    EROFS_OP(LL_SETATTR)
static void ll_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
    EROFS_OP(LL_MKNOD)
static void ll_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) EROFS_OP(LL_MKDIR)
static void ll_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) EROFS_OP(LL_UNLINK)
static void ll_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) EROFS_OP(LL_RMDIR)
static void ll_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
    EROFS_OP(LL_SYMLINK)
static void ll_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent,
                      const char *newname, unsigned int flags) EROFS_OP(LL_RENAME)
static void ll_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
    EROFS_OP(LL_LINK)
static void ll_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi) EROFS_OP(LL_CREATE)
static void ll_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size, off_t off,
                     struct fuse_file_info *fi) EROFS_OP(LL_WRITE)
static void ll_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size,
                        int flags) EROFS_OP(LL_SETXATTR)
static void ll_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name) EROFS_OP(LL_REMOVEXATTR)

/* --------------------------------------------------------------- session */

static void ll_init(void *userdata, struct fuse_conn_info *conn)
{
    Session *s = userdata;
    /* READDIRPLUS always (the handlers list with attributes), never a
     * plain READDIR chosen by the kernel's heuristics */
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;
    /* lookups and listings of one directory in parallel (py_session.c adds
     * the flag libfuse 3.14 drops from the answer) */
    s->patch_init = (conn->capable & FUSE_CAP_PARALLEL_DIROPS) != 0;
    s->init_done = 1;
}

const struct fuse_lowlevel_ops ll_ops = {
    .init = ll_init,
    .lookup = ll_lookup,
    .forget = ll_forget,
    .forget_multi = ll_forget_multi,
    .getattr = ll_getattr,
    .open = ll_open,
    .read = ll_read,
    .flush = ll_flush,
    .release = ll_release,
    .ioctl = ll_ioctl,
    .opendir = ll_opendir,
    .readdirplus = ll_readdirplus,
    .releasedir = ll_releasedir,
    .statfs = ll_statfs,
    .access = ll_access,
    .getxattr = ll_getxattr,
    .listxattr = ll_listxattr,
    .setattr = ll_setattr,
    .mknod = ll_mknod,
    .mkdir = ll_mkdir,
    .unlink = ll_unlink,
    .rmdir = ll_rmdir,
    .symlink = ll_symlink,
    .rename = ll_rename,
    .link = ll_link,
    .create = ll_create,
    .write = ll_write,
    .setxattr = ll_setxattr,
    .removexattr = ll_removexattr,
};
