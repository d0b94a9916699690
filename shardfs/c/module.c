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
 *
 * This file holds the module (its functions, PyInit__shardfs, the exported
 * constants, the exception objects) and the helpers several types share;
 * each type lives in its own py_*.c file (py_module.h lists them).
 */
#include "py_module.h"
#include "rbd.h"
#include "ll.h"
#include "ll_resolve.h"

PyObject *ShardError, *CorruptShardError, *DuplicateKeyError, *StaleSidecarError;

uint64_t sfs_table_generation;

/* The helpers py_module.h declares for every type's file. */

/* A message of the C core as str: UTF-8, bytes that are not (a path's)
 * replaced, so that the error itself is raised, not a UnicodeDecodeError.
 * New reference, or NULL with an exception. */
static PyObject *text(const char *message)
{
    return PyUnicode_DecodeUTF8(message, (Py_ssize_t)strlen(message), "replace");
}

/* OSError(errnum, message), which picks the subclass (FileNotFoundError...);
 * `message` is stolen (NULL: its exception stays). Returns NULL. */
static PyObject *set_os_error(int errnum, PyObject *message)
{
    PyObject *args = Py_BuildValue("(iN)", errnum, message);
    if (args) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

PyObject *raise_message(PyObject *type, const char *message)
{
    PyObject *s = text(message);
    if (s) {
        PyErr_SetObject(type, s);
        Py_DECREF(s);
    }
    return NULL;
}

PyObject *raise_error(const sfs_error_t *err)
{
    switch (err->status) {
    case SFS_EIO:
        return set_os_error(err->sys_errno, text(err->message));
    case SFS_ECORRUPT:
        return raise_message(CorruptShardError, err->message);
    case SFS_EDUPLICATE:
        return raise_message(DuplicateKeyError, err->message);
    case SFS_ENOMEM:
        return PyErr_NoMemory();
    default:
        return raise_message(ShardError, err->message);
    }
}

PyObject *os_error(int errnum, const char *path, const char *what)
{
    return set_os_error(errnum, PyUnicode_FromFormat("%s: %s", path, what));
}

PyObject *gone(const char *path)
{
    return os_error(EIO, path, GONE_REASON);
}

PyObject *corrupt_slot(const sfs_shard_t *shard)
{
    PyErr_Format(CorruptShardError,
                 "%s: the slot of a key points outside the objects section (run shardfs check)",
                 sfs_path(shard));
    return NULL;
}

int get_identity(PyObject *obj, uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE])
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

int grow_dense(void **items, size_t item_size, unsigned char **bytes, Py_ssize_t *cap,
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

const char *const ll_kind_names[LL_KINDS] = {
    "lookup", "forget", "getattr", "open", "read", "flush", "release", "opendir", "readdir",
    "releasedir", "statfs", "access", "getxattr", "listxattr", "setattr", "mknod", "mkdir",
    "unlink", "rmdir", "symlink", "rename", "link", "create", "write", "setxattr",
    "removexattr", "ioctl", "other",
};

const char *const ll_stat_names[LL_STATS] = {"lookups", "probes", "pushed", "push_refused", "hash_probes"};

const char *const ll_io_names[LL_IO_WORDS] = {"reply_bytes", "pushed_bytes", "errors"};

/* Upper bounds of the duration buckets (ll.h), in nanoseconds: 10 µs to
 * 10 s, 1-2.5-5 steps. */
const int64_t ll_hist_bounds_ns[LL_HIST_BUCKETS - 1] = {
    10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000,
    25000000, 50000000, 100000000, 250000000, 500000000, 1000000000, 2500000000, 5000000000,
    10000000000,
};

/* A tuple of `n` names. New reference, or NULL with an exception. */
static PyObject *names_tuple(const char *const *names, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *name = PyUnicode_FromString(names[i]);
        if (!name) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, name);
    }
    return t;
}

/* object_inode(number, slot) -> the inode of slot `slot` of shard `number`. */
static PyObject *object_inode(PyObject *module, PyObject *args)
{
    unsigned int number, slot;
    if (!PyArg_ParseTuple(args, "II:object_inode", &number, &slot))
        return NULL;
    if (number >= UINT32_MAX - 1) {
        PyErr_SetString(PyExc_OverflowError, "object_inode: shard number past 2^32 - 2");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(sfs_ll_object_ino(number, slot));
}

/* split_object_inode(ino) -> (shard number, slot), or None for a directory
 * or a database object. */
static PyObject *split_object_inode(PyObject *module, PyObject *arg)
{
    unsigned long long ino = PyLong_AsUnsignedLongLong(arg);
    if (ino == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    uint32_t number, slot;
    if (!sfs_ll_object_inode(ino, &number, &slot))
        Py_RETURN_NONE;
    return Py_BuildValue("(II)", number, slot);
}

/* parse_swhid(text: str) -> the 20-byte sha1_git a content SWHID names
 * (swh:1:cnt:<40 lowercase hex>), or None: the request path's parser. */
static PyObject *parse_swhid(PyObject *module, PyObject *arg)
{
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(arg, &len);
    if (!text)
        return NULL;
    static const uint64_t dirs[2] = {0, 1}; /* SWHIDs only (in the root) */
    uint8_t key[SFS_KEY_SIZE];
    if ((size_t)len != strlen(text) || sfs_ll_hash_name(dirs, SFS_LL_ROOT_INODE, text, key) != 1)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)key, SFS_LL_DIGEST_SIZE);
}

static PyObject *table_generation(PyObject *module, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(sfs_table_generation);
}

/* HIST_BOUNDS_NS: ll_hist_bounds_ns as a tuple of ints. */
static PyObject *hist_bounds(void)
{
    PyObject *t = PyTuple_New(LL_HIST_BUCKETS - 1);
    for (int i = 0; t && i < LL_HIST_BUCKETS - 1; i++) {
        PyObject *v = PyLong_FromLongLong(ll_hist_bounds_ns[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

static PyMethodDef module_functions[] = {
    {"build_sidecar", (PyCFunction)(void (*)(void))build_sidecar, METH_VARARGS | METH_KEYWORDS,
     "build_sidecar(reader, path, identity32): write the sidecar of an open Reader at path "
     "(temporary file, fsync, rename). OSError when it cannot be written."},
    {"key_prefixes", (PyCFunction)key_prefixes, METH_O,
     "key_prefixes(shard) -> bytes: the top 40 bits of the shard's live keys, sorted, distinct, "
     "as little-endian u64 (8 bytes each): a run for write_global_index. `shard` is a "
     "shardfs.Shard or a Reader; the index is read with pread (OSError if the file shrank)."},
    {"probe_shards", (PyCFunction)(void (*)(void))probe_shards, METH_VARARGS | METH_KEYWORDS,
     "probe_shards(paths, prefix_budget=0) -> list: open, validate and close each path "
     "as a Read Shard (shardfs/c/probe.h), GIL released. Item i is None when "
     "paths[i] could not be (open it to get the error), else (st_dev, st_ino, st_rdev, st_mode, "
     "st_size, st_mtime_ns, st_ctime_ns, st_mtime, objects_count, slot_count, extent, identity32, "
     "prefixes): the fstat of the validated descriptor, header and index counts, extent in bytes, "
     "shardfs.sidecar.identity, and key_prefixes() while the shards given them (in order) total "
     "at most prefix_budget slots, else None."},
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
    {"build_hash_indexes", (PyCFunction)(void (*)(void))build_hash_indexes, METH_VARARGS | METH_KEYWORDS,
     "build_hash_indexes(reader, identity32, sha1_path=None, sha1_git_path=None, progress=None): hash "
     "every live object of the shard once (read in file order with pread) and write the hash index "
     "of each kind given a path (temporary file, fdatasync, rename). progress(bytes_hashed) is "
     "called about every 64 MiB; an exception it raises (or a signal's) stops the build, nothing "
     "written. OSError when the shard cannot be read or a file written; CorruptShardError."},
    {"write_hash_index", (PyCFunction)(void (*)(void))write_hash_index, METH_VARARGS | METH_KEYWORDS,
     "write_hash_index(path, kind, identity32, slot_count, digests, slots): write a hash index "
     "(kind 1 sha1, 2 sha1_git) from 20-byte digests (concatenated) and their slots (native u32, "
     "array('I')), in any order. ValueError for a slot >= slot_count; OSError."},
    {"s3_configure", (PyCFunction)(void (*)(void))s3_configure, METH_VARARGS | METH_KEYWORDS,
     "s3_configure(endpoint=None, region=None, timeout=0, cache_dir=None): S3 settings over the AWS_* "
     "environment variables, for the connections made after it (s3.h)."},
    {"rbd_configure", (PyCFunction)(void (*)(void))rbd_configure, METH_VARARGS | METH_KEYWORDS,
     "rbd_configure(conf=None, id=None, cache_dir=None, timeout=0, isolate=False): settings for "
     "rbd:POOL/IMAGE sources in this process (see shardfs/c/rbd.h): the ceph.conf path, the "
     "client name without 'client.', the directory of local copies, librados's op timeouts in "
     "seconds (0: 30), whether cluster work before the first read runs in a child process, and "
     "the images kept open at most (0: 1024; the least recently used idle one is closed)."},
    {"object_inode", (PyCFunction)object_inode, METH_VARARGS,
     "object_inode(number, slot) -> the inode of slot `slot` of shard number `number`: "
     "(number + 1) << 32 | slot (shardfs/c/ll_names.h)"},
    {"split_object_inode", (PyCFunction)split_object_inode, METH_O,
     "split_object_inode(ino) -> (shard number, slot) of an object inode, or None for a directory "
     "or a database object (shardfs/c/ll_names.h)"},
    {"parse_swhid", (PyCFunction)parse_swhid, METH_O,
     "parse_swhid(text) -> the 20-byte sha1_git a content SWHID (swh:1:cnt:<40 lowercase hex>) "
     "names, or None when `text` is not one (shardfs/c/ll_names.h)"},
    {"table_generation", (PyCFunction)table_generation, METH_NOARGS,
     "table_generation() -> int: changes of what a request snapshot is built from (open shards, "
     "filters, index levels, hash indexes) in this process so far."},
    {"rbd_open_images", (PyCFunction)rbd_open_images, METH_NOARGS,
     "rbd_open_images() -> int: RBD images open in this process now."},
    {"rbd_list", (PyCFunction)rbd_list, METH_O,
     "rbd_list(pool) -> [str]: the names of the RBD images of `pool`. OSError (errno ENOENT: no "
     "such pool; ETIMEDOUT: the cluster did not answer) or ShardError without librbd."},
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
        PyType_Ready(&GlobalIndexType) < 0 || PyType_Ready(&OpenShardsType) < 0 ||
        PyType_Ready(&SessionType) < 0 || PyType_Ready(&DirBufferType) < 0 ||
        PyType_Ready(&HashIndexType) < 0 || PyType_Ready(&ResolverType) < 0 ||
        PyType_Ready(&MosaicType) < 0 || PyType_Ready(&ShardPoolType) < 0 ||
        PyType_Ready(&LookupPackType) < 0 || PyType_Ready(&LookupPackWriterType) < 0)
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
    Py_INCREF(&SessionType);
    Py_INCREF(&DirBufferType);
    Py_INCREF(&ResolverType);
    Py_INCREF(&MosaicType);
    Py_INCREF(&ShardPoolType);
    Py_INCREF(&LookupPackType);
    Py_INCREF(&LookupPackWriterType);
    if (PyModule_AddObject(m, "Reader", (PyObject *)&ReaderType) < 0 ||
        PyModule_AddObject(m, "Writer", (PyObject *)&WriterType) < 0 ||
        PyModule_AddObject(m, "Sidecar", (PyObject *)&SidecarType) < 0 ||
        PyModule_AddObject(m, "SidecarSet", (PyObject *)&SidecarSetType) < 0 ||
        PyModule_AddObject(m, "GlobalIndex", (PyObject *)&GlobalIndexType) < 0 ||
        PyModule_AddObject(m, "OpenShards", (PyObject *)&OpenShardsType) < 0 ||
        PyModule_AddObject(m, "Session", (PyObject *)&SessionType) < 0 ||
        PyModule_AddObject(m, "DirBuffer", (PyObject *)&DirBufferType) < 0 ||
        PyModule_AddObject(m, "HashIndex", (PyObject *)&HashIndexType) < 0 ||
        PyModule_AddObject(m, "Resolver", (PyObject *)&ResolverType) < 0 ||
        PyModule_AddObject(m, "Mosaic", (PyObject *)&MosaicType) < 0 ||
        PyModule_AddObject(m, "ShardPool", (PyObject *)&ShardPoolType) < 0 ||
        PyModule_AddObject(m, "LookupPack", (PyObject *)&LookupPackType) < 0 ||
        PyModule_AddObject(m, "LookupPackWriter", (PyObject *)&LookupPackWriterType) < 0 ||
        PyModule_AddObject(m, "REQUEST_KINDS", names_tuple(ll_kind_names, LL_KINDS)) < 0 ||
        PyModule_AddObject(m, "STAT_WORDS", names_tuple(ll_stat_names, LL_STATS)) < 0 ||
        PyModule_AddObject(m, "IO_WORDS", names_tuple(ll_io_names, LL_IO_WORDS)) < 0 ||
        PyModule_AddObject(m, "HIST_BOUNDS_NS", hist_bounds()) < 0 ||
        PyModule_AddIntConstant(m, "SHARD_REMOVED", LL_REMOVED) < 0 ||
        PyModule_AddIntConstant(m, "SHARD_UNKNOWN", LL_UNKNOWN) < 0 ||
        PyModule_AddIntConstant(m, "RESOLVE_FOUND", LL_FOUND) < 0 ||
        PyModule_AddIntConstant(m, "RESOLVE_ABSENT", LL_ABSENT) < 0 ||
        PyModule_AddIntConstant(m, "RESOLVE_STALE", LL_STALE) < 0 ||
        PyModule_AddIntConstant(m, "RESOLVE_OPEN", LL_NEED_OPEN) < 0 ||
        PyModule_AddIntConstant(m, "RESOLVE_FAILED", LL_FAILED) < 0 ||
        PyModule_AddIntConstant(m, "RESOLVE_NOT_OBJECT", LL_NOT_OBJECT) < 0 ||
        PyModule_AddIntConstant(m, "GINDEX_PREFIX_BITS", SFS_GINDEX_PREFIX_BITS) < 0 ||
        PyModule_AddIntConstant(m, "HEADER_END", SFS_HEADER_END) < 0 ||
        PyModule_AddIntConstant(m, "KEY_SIZE", SFS_KEY_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SLOT_SIZE", SFS_SLOT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SIZE_FIELD_SIZE", SFS_SIZE_FIELD_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "RBD_BUILT", sfs_rbd_built()) < 0 ||
        PyModule_AddIntConstant(m, "SIDECAR_IDENTITY_SIZE", SFS_SIDECAR_IDENTITY_SIZE) < 0 ||
        PyModule_AddStringConstant(m, "XATTR_REQUESTS", LL_XATTR_REQUESTS) < 0 ||
        PyModule_AddStringConstant(m, "XATTR_STATS", LL_XATTR_STATS) < 0 ||
        PyModule_AddStringConstant(m, "XATTR_SHARD", LL_XATTR_SHARD) < 0 ||
        PyModule_AddStringConstant(m, "XATTR_OFFSET", LL_XATTR_OFFSET) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
