/*
 * ll_snapshot.c — building, publishing and freeing the request path's
 * snapshots (ll_snapshot.h).
 */
#include "ll_snapshot.h"

#include <stdlib.h>

/* The published word: the pointer in the low 48 bits (user-space addresses
 * of x86-64 and arm64 fit), the references taken since it was published
 * in the top 16. */
#define OUTER_ONE ((uint64_t)1 << 48)
#define PTR_MASK (OUTER_ONE - 1)
/* References taken moved into the snapshot's count once this many piled
 * up in the word (16 bits hold 65,535). */
#define OUTER_MOVE ((uint64_t)1 << 14)
/* A snapshot's count starts here: a release can never bring it to 0 while
 * the snapshot is published (fewer than 2^40 requests in flight). */
#define BIAS ((int64_t)1 << 40)

struct state_fields;
static ll_snapshot_t *ll_snapshot_build_fields(const struct state_fields *in);

static void free_levels(struct ll_level *levels, size_t n)
{
    for (size_t i = 0; levels && i < n; i++) {
        sfs_gindex_close(levels[i].g);
        free(levels[i].map);
    }
    free(levels);
}

static void snapshot_free(ll_snapshot_t *s)
{
    for (size_t i = 0; i < s->nshards; i++) {
        if (s->shards)
            sfs_close(s->shards[i]);
        if (s->orders)
            free(s->orders[i].path);
    }
    free(s->shards);
    free(s->mtimes);
    free(s->used);
    free(s->orders);
    free_levels(s->levels, s->nlevels);
    for (size_t j = 0; s->filters && j < s->nfilters; j++)
        sfs_sidecar_close(s->filters[j]);
    free(s->filters);
    free(s->filter_numbers);
    for (int k = 0; k < 2; k++) {
        struct ll_hash_names *h = &s->hashes[k];
        free_levels(h->levels, h->nlevels);
        for (size_t i = 0; h->indexes && i < h->nindexes; i++)
            sfs_hashindex_close(h->indexes[i]);
        free(h->indexes);
        free(h->unlevelled);
    }
    ll_pool_unref(s->pool);
    free(s);
}

void ll_snapshot_discard(ll_snapshot_t *s)
{
    if (s)
        snapshot_free(s);
}

/* ---------------------------------------------------------------- publish */

ll_snapshot_t *ll_snapshot_acquire(ll_current_t *current)
{
    uint64_t w = __atomic_add_fetch(&current->word, OUTER_ONE, __ATOMIC_ACQUIRE);
    ll_snapshot_t *s = (ll_snapshot_t *)(uintptr_t)(w & PTR_MASK);
    if (s && (w >> 48) >= OUTER_MOVE) {
        /* Move the references taken into the snapshot before the 16 bits
         * overflow. Failing (another request or a publish changed the
         * word) is fine: the next request tries again. */
        if (__atomic_compare_exchange_n(&current->word, &w, (uint64_t)(uintptr_t)s, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            __atomic_add_fetch(&s->refs, (int64_t)(w >> 48), __ATOMIC_RELAXED);
    }
    return s;
}

void ll_snapshot_release(ll_snapshot_t *s)
{
    if (s && __atomic_sub_fetch(&s->refs, 1, __ATOMIC_ACQ_REL) == 0)
        snapshot_free(s);
}

void ll_snapshot_publish(ll_current_t *current, ll_snapshot_t *snap)
{
    if (snap)
        snap->refs = BIAS;
    uint64_t old = __atomic_exchange_n(&current->word, (uint64_t)(uintptr_t)snap, __ATOMIC_ACQ_REL);
    ll_snapshot_t *s = (ll_snapshot_t *)(uintptr_t)(old & PTR_MASK);
    /* the references taken from the word will be released into the count:
     * add them, less the bias; whoever brings it to 0 frees it */
    if (s && __atomic_add_fetch(&s->refs, (int64_t)(old >> 48) - BIAS, __ATOMIC_ACQ_REL) == 0)
        snapshot_free(s);
}

/* ---------------------------------------------------------------- build */

static void *alloc_array(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        PyErr_NoMemory();
    return p;
}

/* A copy of a buffer of native int64 into *out, *n. 0, or -1 with an
 * exception. */
static int copy_i64(PyObject *obj, int64_t **out, size_t *n)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0)
        return -1;
    *n = (size_t)view.len / sizeof(int64_t);
    *out = alloc_array(*n, sizeof(int64_t));
    if (*out)
        memcpy(*out, view.buf, *n * sizeof(int64_t));
    PyBuffer_Release(&view);
    return *out ? 0 : -1;
}

/* Levels (a tuple of GlobalIndex) and their maps (a tuple of int64
 * buffers) into *out, *n, each level held. 0, or -1 with an exception. */
static int take_levels(PyObject *levels, PyObject *maps, struct ll_level **out, size_t *n)
{
    if (!PyTuple_Check(levels) || !PyTuple_Check(maps) || PyTuple_GET_SIZE(levels) != PyTuple_GET_SIZE(maps)) {
        PyErr_SetString(PyExc_TypeError, "snapshot state: levels and maps must be tuples of one length");
        return -1;
    }
    *n = (size_t)PyTuple_GET_SIZE(levels);
    if (!(*out = alloc_array(*n, sizeof(**out))))
        return -1;
    for (size_t i = 0; i < *n; i++) {
        PyObject *level = PyTuple_GET_ITEM(levels, i);
        if (!PyObject_TypeCheck(level, &GlobalIndexType)) {
            PyErr_SetString(PyExc_TypeError, "snapshot state: levels must be GlobalIndex objects");
            return -1;
        }
        if (!gindex_ready((GlobalIndex *)level))
            return -1;
        (*out)[i].g = sfs_gindex_ref(((GlobalIndex *)level)->g);
        if (copy_i64(PyTuple_GET_ITEM(maps, i), &(*out)[i].map, &(*out)[i].nmap) < 0)
            return -1;
    }
    return 0;
}

/* The names by another hash: `hashes` is None or a pair (sha1, sha1_git),
 * each None or (directory inode, levels, maps, indexes by shard number,
 * an array('q') of the unlevelled shard numbers). */
static int take_hashes(ll_snapshot_t *s, PyObject *hashes)
{
    if (hashes == Py_None)
        return 0;
    if (!PyTuple_Check(hashes) || PyTuple_GET_SIZE(hashes) != 2) {
        PyErr_SetString(PyExc_TypeError, "snapshot state: hashes must be None or a pair");
        return -1;
    }
    for (int k = 0; k < 2; k++) {
        PyObject *item = PyTuple_GET_ITEM(hashes, k), *levels, *maps, *indexes, *unlevelled;
        unsigned long long ino;
        if (item == Py_None)
            continue;
        if (!PyArg_ParseTuple(item, "KO!O!O!O", &ino, &PyTuple_Type, &levels, &PyTuple_Type, &maps, &PyTuple_Type,
                              &indexes, &unlevelled))
            return -1;
        struct ll_hash_names *h = &s->hashes[k];
        if (take_levels(levels, maps, &h->levels, &h->nlevels) < 0 ||
            copy_i64(unlevelled, &h->unlevelled, &h->nunlevelled) < 0)
            return -1;
        h->nindexes = (size_t)PyTuple_GET_SIZE(indexes);
        if (!(h->indexes = alloc_array(h->nindexes, sizeof(*h->indexes))))
            return -1;
        for (size_t i = 0; i < h->nindexes; i++) {
            PyObject *o = PyTuple_GET_ITEM(indexes, i);
            if (o == Py_None)
                continue;
            if (!PyObject_TypeCheck(o, &HashIndexType)) {
                PyErr_SetString(PyExc_TypeError, "snapshot state: hash indexes must be HashIndex or None");
                return -1;
            }
            if (((HashIndex *)o)->hx)
                h->indexes[i] = sfs_hashindex_ref(((HashIndex *)o)->hx);
        }
        h->dir_ino = ino;
    }
    return 0;
}

/* The open shards (served ones from `open`, removed ones still open from
 * `removed_open`, a tuple of (number, Reader)), their mtimes and sidecars
 * for key order. */
static int take_shards(ll_snapshot_t *s, OpenShards *open, PyObject *mtimes, PyObject *orders, PyObject *removed_open)
{
    int64_t *m;
    size_t n;
    if (copy_i64(mtimes, &m, &n) < 0)
        return -1;
    s->mtimes = m;
    s->nshards = n;
    if (!(s->shards = alloc_array(n, sizeof(*s->shards))) || !(s->used = alloc_array(n, 1)) ||
        !(s->orders = alloc_array(n, sizeof(*s->orders))))
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (m[i] >= 0 && (Py_ssize_t)i < open->cap && open->entries[i].reader)
            s->shards[i] = sfs_ref(open->entries[i].shard);
        PyObject *o = (Py_ssize_t)i < PyTuple_GET_SIZE(orders) ? PyTuple_GET_ITEM(orders, i) : Py_None;
        if (o == Py_None)
            continue;
        PyObject *path = PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 ? PyTuple_GET_ITEM(o, 0) : NULL;
        PyObject *id = path ? PyTuple_GET_ITEM(o, 1) : NULL;
        if (!path || !PyBytes_Check(path) || !PyBytes_Check(id) ||
            PyBytes_GET_SIZE(id) != SFS_SIDECAR_IDENTITY_SIZE) {
            PyErr_SetString(PyExc_TypeError, "snapshot state: orders must hold None or (path, 32-byte identity)");
            return -1;
        }
        if (!(s->orders[i].path = strdup(PyBytes_AS_STRING(path)))) {
            PyErr_NoMemory();
            return -1;
        }
        memcpy(s->orders[i].identity, PyBytes_AS_STRING(id), SFS_SIDECAR_IDENTITY_SIZE);
    }
    for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(removed_open); j++) {
        PyObject *item = PyTuple_GET_ITEM(removed_open, j);
        unsigned long long number;
        PyObject *reader;
        if (!PyArg_ParseTuple(item, "KO!:removed_open", &number, &ReaderType, &reader))
            return -1;
        if (number < n && m[number] == LL_REMOVED && !s->shards[number] && reader_ready((Reader *)reader))
            s->shards[number] = sfs_ref(((Reader *)reader)->shard);
        PyErr_Clear(); /* a closed reader: not open */
    }
    return 0;
}

/* The active entries of the filter set, each filter held. */
static int take_filters(ll_snapshot_t *s, PyObject *filters)
{
    if (filters == Py_None)
        return 0;
    if (!PyObject_TypeCheck(filters, &SidecarSetType)) {
        PyErr_SetString(PyExc_TypeError, "snapshot state: filters must be a SidecarSet or None");
        return -1;
    }
    SidecarSet *set = (SidecarSet *)filters;
    if (set->dirty && sidecar_set_pack(set) < 0)
        return -1;
    s->nfilters = (size_t)set->nactive;
    if (!(s->filters = alloc_array(s->nfilters, sizeof(*s->filters))) ||
        !(s->filter_numbers = alloc_array(s->nfilters, sizeof(uint32_t))))
        return -1;
    for (size_t j = 0; j < s->nfilters; j++) {
        s->filters[j] = set->packed[j] ? sfs_sidecar_ref(set->packed[j]) : NULL;
        s->filter_numbers[j] = set->numbers[j];
    }
    return 0;
}

/* The attributes of `state` the snapshot is built from (new references),
 * type-checked. */
struct state_fields {
    PyObject *open_shards, *filters, *levels, *maps, *states, *prefix_lengths, *dir_time_ns, *applied, *orders,
        *hashes, *removed_open, *pool;
};

static void fields_release(struct state_fields *f)
{
    PyObject **v = (PyObject **)f;
    for (size_t i = 0; i < sizeof(*f) / sizeof(PyObject *); i++)
        Py_CLEAR(v[i]);
}

static int fields_take(PyObject *state, struct state_fields *f)
{
    static const char *const names[] = {"open_shards", "filters", "levels", "maps", "states", "prefix_lengths",
                                        "dir_time_ns", "applied", "orders", "hashes", "removed_open", "pool"};
    PyObject **v = (PyObject **)f;
    memset(f, 0, sizeof(*f));
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!(v[i] = PyObject_GetAttrString(state, names[i])))
            return -1;
    if (!PyObject_TypeCheck(f->open_shards, &OpenShardsType) || !PyTuple_Check(f->levels) ||
        !PyTuple_Check(f->maps) || !PyTuple_Check(f->prefix_lengths) || !PyTuple_Check(f->orders) ||
        !PyTuple_Check(f->removed_open) || !PyLong_Check(f->dir_time_ns) || !PyLong_Check(f->applied) ||
        (f->pool != Py_None && !PyObject_TypeCheck(f->pool, &ShardPoolType))) {
        PyErr_SetString(PyExc_TypeError, "snapshot state: open_shards must be an OpenShards; levels, maps, "
                                         "prefix_lengths, orders and removed_open tuples; dir_time_ns and "
                                         "applied ints; pool a ShardPool or None");
        return -1;
    }
    return 0;
}

/* `state`: a shardfs.shardset.SnapshotState (its attributes are read). */
ll_snapshot_t *ll_snapshot_build(PyObject *state)
{
    struct state_fields in;
    if (fields_take(state, &in) < 0) {
        fields_release(&in);
        return NULL;
    }
    ll_snapshot_t *s = ll_snapshot_build_fields(&in);
    fields_release(&in);
    return s;
}

static ll_snapshot_t *ll_snapshot_build_fields(const struct state_fields *in)
{
    long long dir_time_ns = PyLong_AsLongLong(in->dir_time_ns), applied = PyLong_AsLongLong(in->applied);
    if (PyErr_Occurred())
        return NULL;
    PyObject *open = in->open_shards, *filters = in->filters, *levels = in->levels, *maps = in->maps,
             *mtimes = in->states, *prefixes = in->prefix_lengths, *orders = in->orders, *hashes = in->hashes,
             *removed_open = in->removed_open;
    ll_snapshot_t *s = alloc_array(1, sizeof(*s));
    if (!s)
        return NULL;
    if (in->pool != Py_None)
        s->pool = ll_pool_ref(((ShardPool *)in->pool)->pool);
    if ((uintptr_t)s & ~PTR_MASK) { /* never on x86-64 or arm64 user space */
        free(s);
        PyErr_SetString(PyExc_MemoryError, "snapshot allocated above 2^48");
        return NULL;
    }
    s->dir_time_ns = dir_time_ns;
    s->applied = applied;
    int nhex[SFS_LL_MAX_DEPTH];
    Py_ssize_t depth = PyTuple_GET_SIZE(prefixes);
    for (Py_ssize_t d = 0; d < depth && d < SFS_LL_MAX_DEPTH; d++) {
        nhex[d] = _PyLong_AsInt(PyTuple_GET_ITEM(prefixes, d));
        if (nhex[d] == -1 && PyErr_Occurred())
            goto fail;
    }
    if (depth > SFS_LL_MAX_DEPTH || sfs_ll_layout_init(&s->layout, nhex, (int)depth) < 0) {
        PyErr_SetString(PyExc_ValueError, "snapshot state: prefix lengths must grow, 1..7 hex digits");
        goto fail;
    }
    if (take_shards(s, (OpenShards *)open, mtimes, orders, removed_open) < 0 || take_levels(levels, maps, &s->levels, &s->nlevels) < 0 ||
        take_filters(s, filters) < 0 || take_hashes(s, hashes) < 0)
        goto fail;
    return s;
fail:
    snapshot_free(s);
    return NULL;
}
