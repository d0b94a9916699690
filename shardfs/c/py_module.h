/*
 * py_module.h — what the files of the Python extension share (not part of
 * the C core: bench/bench_lookup.py builds its C reader from shard.c and chd.c).
 *
 * module.c holds the module (its functions' table, PyInit__shardfs, the
 * exported constants, the exception objects) and the helpers below that
 * more than one type uses; each type has its own file: py_reader.c
 * (Reader), py_writer.c (Writer), py_sidecar.c (Sidecar, SidecarSet,
 * build_sidecar), py_hashindex.c (HashIndex, build_hash_indexes,
 * write_hash_index), py_rbd.c (rbd_configure, rbd_list), py_gindex.c (GlobalIndex, key_prefixes,
 * write_global_index, merge_global_index), py_openshards.c (OpenShards),
 * py_resolve.c (Resolver), py_mosaic.c (Mosaic).
 * guard.c defines the SIGBUS guard's state (guard.h). Helpers on a hot
 * path (get_key, reader_*, gindex_ready) are static inline here, so that
 * every file can still inline them as when they were one file.
 */
#ifndef SHARDFS_PY_MODULE_H
#define SHARDFS_PY_MODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <pthread.h>

#include "guard.h"
#include "internal.h"
#include "shard.h"
#include "sidecar.h"
#include "gindex.h"
#include "hashindex.h"

/* Nothing here is exported from the shared object but PyInit__shardfs. */
#pragma GCC visibility push(hidden)

/* The exception classes of shardfs.errors (module.c, set at import). */
extern PyObject *ShardError, *CorruptShardError, *DuplicateKeyError, *StaleSidecarError;

/* Counts the changes of what a mount's request snapshot is built from
 * (ll_snapshot.h): the open shards (OpenShards.set/clear), the filters
 * (SidecarSet.set/remove), the global index levels (GlobalIndex.reopen/
 * close) and the hash indexes (HashIndex.close) each call table_changed();
 * the session builds a new snapshot after a handler when it moved. Under
 * the GIL. */
extern uint64_t sfs_table_generation;

static inline void table_changed(void)
{
    sfs_table_generation++;
}

extern PyTypeObject ReaderType, WriterType, SidecarType, SidecarSetType, GlobalIndexType,
    OpenShardsType, HashIndexType, ResolverType, MosaicType, ShardPoolType, LookupPackType,
    LookupPackWriterType;

/* ShardPool (py_resolve.c): a pool of shards the resolver opens on demand
 * (ll_pool.h). */
typedef struct {
    PyObject_HEAD
    struct ll_pool *pool;
} ShardPool;

/* LookupPack (py_lookup_pack.c): an open pack of lookup records
 * (lookup_pack.h). */
typedef struct {
    PyObject_HEAD
    struct sfs_lookup_pack *pack;
} LookupPack;

/* ---------------------------------------------------------------- errors (module.c) */

/* An exception of `type` with a message of the C core (which may hold a
 * path that is not UTF-8: such bytes are replaced). Returns NULL. */
PyObject *raise_message(PyObject *type, const char *message);

/* The exception for a failed call of the C core (err from shard.h,
 * sidecar.h, gindex.h): OSError(errno, message) for SFS_EIO,
 * CorruptShardError, DuplicateKeyError, MemoryError, else ShardError.
 * Returns NULL. */
PyObject *raise_error(const sfs_error_t *err);

/* OSError(errnum, "<path>: <what>") (the subclass for errnum). Returns
 * NULL. */
PyObject *os_error(int errnum, const char *path, const char *what);

/* Why a guarded call hit SIGBUS (guard.h: SFS_EGONE). */
#define GONE_REASON "the file shrank under its mapping (SIGBUS)"

/* OSError(EIO, "<path>: " GONE_REASON) for a call that hit SIGBUS: the
 * file at `path` shrank under its mapping. Returns NULL. */
PyObject *gone(const char *path);

/* CorruptShardError for a slot of `shard` pointing outside its objects
 * section. Returns NULL. */
PyObject *corrupt_slot(const sfs_shard_t *shard);

/* ---------------------------------------------------------------- arguments */

static inline int get_key(PyObject *obj, uint8_t key[SFS_KEY_SIZE])
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

/* A 32-byte identity (sidecar.h, gindex.h) from a bytes-like object; 0,
 * or -1 with ValueError (module.c). */
int get_identity(PyObject *obj, uint8_t identity[SFS_SIDECAR_IDENTITY_SIZE]);

/* Grow two parallel arrays indexed by i (*items of item_size bytes each,
 * *bytes of one byte each) so that index i fits: the capacity *cap doubled
 * from `initial` as needed, the new part zeroed. 0, or -1 with MemoryError
 * set (the arrays stay valid at their old capacity). */
int grow_dense(void **items, size_t item_size, unsigned char **bytes, Py_ssize_t *cap,
               Py_ssize_t i, Py_ssize_t initial);

/* ---------------------------------------------------------------- HashIndex (py_hashindex.c) */

/* An open hash index; a request snapshot holds `hx` by a reference of its
 * own (ll_snapshot.h), so close() lets this object's reference go. */
typedef struct {
    PyObject_HEAD
    sfs_hashindex_t *hx;
} HashIndex;

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
static inline sfs_shard_t *reader_hold(Reader *self)
{
    self->users++;
    return self->shard;
}

static inline void reader_unhold(Reader *self)
{
    if (--self->users == 0 && self->closed) {
        sfs_close(self->shard);
        self->shard = NULL;
    }
}

/* The Reader of `obj`: a Reader, or an object whose `_reader` is one
 * (shardfs.Shard). New reference, or NULL with TypeError (py_gindex.c). */
Reader *reader_of(PyObject *obj);

static inline int reader_ready(Reader *self)
{
    if (!self->shard || self->closed) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed shard");
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- Sidecar (py_sidecar.c) */

typedef struct {
    PyObject_HEAD
    sfs_sidecar_t *sc;
    PyObject *path;   /* bytes: the path it was opened at (for errors) */
    Py_ssize_t users; /* SidecarSet shard numbers holding it */
    int closed;       /* close() called; the mapping stays while users > 0 */
} Sidecar;

static inline int sidecar_ready(Sidecar *self)
{
    if (!self->sc || self->closed) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed sidecar");
        return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- SidecarSet (py_sidecar.c) */

/* Shard numbers 0..len-1: inactive (never a candidate), active without a
 * filter (always a candidate), or active with a Sidecar. candidates() runs
 * over a compact copy of the active shard numbers, rebuilt after a change. For use under
 * the GIL (no lock of its own). */
typedef struct {
    PyObject_HEAD
    Py_ssize_t len, cap;
    PyObject **sidecars;    /* [cap]: a Sidecar (strong reference) or NULL */
    unsigned char *active;  /* [cap] */
    Py_ssize_t nactive;
    int dirty;              /* the compact arrays are out of date */
    sfs_sidecar_t **packed; /* [nactive] */
    uint32_t *numbers;      /* [nactive]: the shard number of packed[j] */
    uint32_t *out;          /* [nactive]: candidates() output */
} SidecarSet;

/* Rebuild the compact arrays of the active entries (packed, index, out)
 * once `dirty`. 0, or -1 with MemoryError. */
int sidecar_set_pack(SidecarSet *self);

/* What SFS_EGONE names when sfs_sidecar_candidates, which reads every
 * sidecar of the set, hit SIGBUS (which one shrank is not known). */
#define SIDECAR_OF_SET "a sidecar of the set"

/* ---------------------------------------------------------------- GlobalIndex (py_gindex.c) */

typedef struct {
    PyObject_HEAD
    sfs_gindex_t *g;
    Py_ssize_t users; /* merges running over it (GIL released) */
    int closed;       /* close() called; the level stays open while users > 0 */
    uint32_t *positions; /* position(): open addressing over the shard table, slots hold j + 1
                          * (0: empty); built at the first call, PyMem */
    uint64_t position_mask; /* slots - 1 */
} GlobalIndex;

static inline int gindex_ready(GlobalIndex *self)
{
    if (!self->g || self->closed) {
        PyErr_SetString(PyExc_ValueError, "I/O operation on a closed global index");
        return 0;
    }
    return 1;
}

/* The served shards a set holds open, by shard number: for each, its Reader
 * and the caller's object for it (the mount's MountedShard). The C
 * resolver's snapshots (ll_snapshot.h) take their shards from it, so that a
 * key is found over thousands of shards in one call that touches no Python
 * object. Entries are a dense array indexed by number, grown on demand up
 * to OPEN_SHARDS_MAX_NUMBER (a number beyond is never held: the resolver
 * reports it as not open). `used` marks the entries a resolver asked since
 * `touched` last asked (the caller's recency order: a second chance for
 * the least recently used). Under the GIL only. */
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
} OpenShards;


#define LOOKUP_STACK 64 /* shard indices answered without an allocation */

/* Every shard index of level g holding the key's prefix: into stack (of
 * LOOKUP_STACK), or, when more shards hold it, into a PyMem buffer (*out,
 * to be freed when != stack). Returns SFS_OK and *n, SFS_EGONE (the file
 * shrank: no exception set) or SFS_ENOMEM (MemoryError set). */
int gindex_lookup_all(const sfs_gindex_t *g, const uint8_t key[SFS_KEY_SIZE],
                      uint32_t stack[LOOKUP_STACK], uint32_t **out, size_t *n);

/* ---------------------------------------------------------------- module functions */

/* build_sidecar (py_sidecar.c); key_prefixes, write_global_index,
 * merge_global_index (py_gindex.c): see module_functions in module.c. */
PyObject *build_sidecar(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *key_prefixes(PyObject *module, PyObject *arg);
/* build_hash_indexes, write_hash_index (py_hashindex.c). */
PyObject *build_hash_indexes(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *write_hash_index(PyObject *module, PyObject *args, PyObject *kwds);

/* rbd_configure, rbd_list (py_rbd.c). */
PyObject *rbd_configure(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *s3_configure(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *rbd_list(PyObject *module, PyObject *pool);
PyObject *rbd_open_images(PyObject *module, PyObject *unused);
PyObject *write_global_index(PyObject *module, PyObject *args, PyObject *kwds);
PyObject *merge_global_index(PyObject *module, PyObject *args, PyObject *kwds);
/* probe_shards (py_probe.c). */
PyObject *probe_shards(PyObject *module, PyObject *args, PyObject *kwds);

#pragma GCC visibility pop

#endif
