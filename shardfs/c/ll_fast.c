/*
 * ll_fast.c — LOOKUP, GETATTR and READ of a mount answered in C alone
 * (ll.h), with the GIL not held, and the objects pushed ahead of readers.
 *
 * What a request needs is read from one immutable snapshot of the
 * process's shard set (ll_snapshot.h), built after each Python handler
 * (shardfs.fuse.handlers.ShardFS.fast_state, ll_fast_refresh) and
 * published by one atomic pointer exchange: the shards open in the
 * process by number with their mtimes, the global index levels and their
 * maps, the per-shard filters, the hash indexes, the layout, the shard
 * table sequence the handlers applied. A request takes a reference on the
 * snapshot, never a lock, and reads it while it waits for the device; the
 * handlers publish a new one meanwhile without waiting for it.
 *
 * A request goes to Python instead (returns 0) when: the mount follows a
 * winery database (hidden keys, objects only in PostgreSQL: no snapshot);
 * the coordinator published a shard table the handlers have not applied
 * yet (they apply it first: an inode never names an object of a table the
 * process has not seen, the rule of shardfs.fuse.shared); a candidate shard
 * is not open in the process (the handlers open it, within the bound on
 * open shards); the inode's shard is not served (removed: the handlers know
 * what may still be read); a slot or size field is corrupt or the file
 * shrank (the handlers log it and answer EIO); the name is not a
 * 64-character key (".", "..", fan-out directories).
 */
#include "ll.h"
#include "ll_names.h"
#include "ll_snapshot.h"
#include "ll_resolve.h"
#include "ll_guarded.h"

#include <stdlib.h>

/* Objects pushed ahead of a read in listing order, and the most slots
 * between two reads that still count as in order (the reads of pushed
 * objects never reach the mount: the next read comes after them). */
#define AHEAD_SLOTS 32
#define AHEAD_GAP 16
/* Objects larger than this are not pushed ahead. */
#define AHEAD_MAX_SIZE (128 * 1024)
/* Streams of reads in order followed at once, per process. */
#define AHEAD_STREAMS 8
/* Sidecars kept open per process for streams in key order. */
#define AHEAD_SIDECARS 4

struct ll_fast {
    ll_current_t current;     /* the published snapshot (ll_snapshot.h) */
    PyObject *state;          /* the fast_state() tuple it was built from (strong reference), or NULL */
    uint64_t generation;      /* sfs_table_generation it was built at */
    const volatile int64_t *seq; /* the published sequence (shared memory), or NULL */
    int64_t *stats;           /* [5]: lookups, index probes, objects pushed ahead,
                                 pushes refused, hash index probes (shared memory) */
    int64_t own_stats[5];
    /* Streams of reads in listing order (ll_fast_push_ahead), under
     * ahead_lock: several readers (find | xargs -P4) read several parts of
     * a listing at once. */
    pthread_mutex_t ahead_lock;
    struct ahead_stream {
        uint64_t used;     /* when last matched (a counter): the oldest is replaced */
        uint64_t born;     /* when it began (a counter): which stream this is */
        int streak;        /* reads in order in a row */
        int by_key;        /* key order (rsync, fan-out listings), else slot order */
        uint32_t shard;    /* shard number */
        uint64_t last;     /* slot, or top 64 key bits, of the last object read */
        uint64_t until;    /* last slot, or sidecar position, pushed ahead */
        uint64_t reach;    /* last slot, or top 64 key bits, pushed ahead */
    } ahead[AHEAD_STREAMS];
    uint64_t ahead_clock;
    /* Sidecars opened for key order (their slots sorted by key), under
     * ahead_lock; closed when a new snapshot is published. */
    struct ahead_sidecar {
        uint32_t shard;
        sfs_sidecar_t *sc;
        uint64_t used;
    } sidecars[AHEAD_SIDECARS];
};

struct ll_fast *ll_fast_new(const volatile int64_t *seq, int64_t *stats)
{
    struct ll_fast *f = PyMem_Calloc(1, sizeof(*f));
    if (!f) {
        PyErr_NoMemory();
        return NULL;
    }
    f->seq = seq;
    f->stats = stats ? stats : f->own_stats;
    pthread_mutex_init(&f->ahead_lock, NULL);
    return f;
}

static void close_ahead_sidecars(struct ll_fast *f)
{
    pthread_mutex_lock(&f->ahead_lock);
    for (int i = 0; i < AHEAD_SIDECARS; i++) {
        sfs_sidecar_close(f->sidecars[i].sc);
        f->sidecars[i].sc = NULL;
        f->sidecars[i].used = 0;
    }
    pthread_mutex_unlock(&f->ahead_lock);
}

/* After the loop ended: no request runs any more. */
void ll_fast_free(struct ll_fast *f)
{
    if (!f)
        return;
    ll_snapshot_publish(&f->current, NULL);
    Py_CLEAR(f->state);
    close_ahead_sidecars(f);
    pthread_mutex_destroy(&f->ahead_lock);
    PyMem_Free(f);
}

/* Fold the marks of use the requests left in the current snapshot into
 * the open shards' recency marks (OpenShards.touched), under the GIL. */
static void fold_used(struct ll_fast *f)
{
    if (!f->state || f->state == Py_None)
        return;
    ll_snapshot_t *snap = ll_snapshot_acquire(&f->current);
    OpenShards *open = (OpenShards *)PyTuple_GET_ITEM(f->state, 0);
    for (size_t i = 0; snap && i < snap->nshards; i++)
        if (__atomic_exchange_n(&snap->used[i], 0, __ATOMIC_RELAXED) && (Py_ssize_t)i < open->cap)
            open->used[i] = 1;
    ll_snapshot_release(snap);
}

/* Take the handlers' state again (under the GIL, the handlers' lock
 * held): fs.fast_state() -> None (nothing is answered here) or the tuple
 * ll_snapshot_build reads. A new snapshot is built and published only
 * when the tuple or what it holds changed (sfs_table_generation). Errors
 * are reported (sys.unraisablehook) and leave no snapshot published:
 * every request goes to the handlers until the next refresh. */
void ll_fast_refresh(struct ll_fast *f, PyObject *fs)
{
    if (!f)
        return;
    fold_used(f);
    PyObject *st = PyObject_CallMethod(fs, "fast_state", NULL);
    if (st && st == f->state && f->generation == sfs_table_generation) {
        Py_DECREF(st);
        return;
    }
    ll_snapshot_t *snap = NULL;
    if (!st || (st != Py_None && !(PyTuple_Check(st) && PyTuple_GET_SIZE(st) > 0 && (snap = ll_snapshot_build(st))))) {
        if (st && !PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "fast_state() must return None or a tuple");
        PyErr_WriteUnraisable(fs);
        Py_CLEAR(st);
    }
    f->generation = sfs_table_generation;
    ll_snapshot_publish(&f->current, snap);
    Py_XSETREF(f->state, st);
    close_ahead_sidecars(f); /* shard numbers may name other shards now */
}

/* -------------------------------------------------------------- requests */

/* A reference on the snapshot if the fast path may answer now (one is
 * published and the handlers applied the coordinator's latest table), else
 * NULL: the request goes to the handlers. */
static ll_snapshot_t *fast_begin(struct ll_fast *f)
{
    if (!f)
        return NULL;
    ll_snapshot_t *snap = ll_snapshot_acquire(&f->current);
    if (snap && (!f->seq || __atomic_load_n(f->seq, __ATOMIC_ACQUIRE) == snap->applied))
        return snap;
    ll_snapshot_release(snap);
    return NULL;
}

static void count_lookup(struct ll_fast *f, const ll_found_t *found)
{
    if (found->by_hash) {
        __atomic_fetch_add(&f->stats[4], (int64_t)found->probed, __ATOMIC_RELAXED);
    } else {
        __atomic_fetch_add(&f->stats[0], 1, __ATOMIC_RELAXED);
        __atomic_fetch_add(&f->stats[1], (int64_t)found->probed, __ATOMIC_RELAXED);
    }
}

static void fast_entry(Session *s, const ll_found_t *found, struct fuse_entry_param *e)
{
    memset(e, 0, sizeof(*e));
    e->entry_timeout = e->attr_timeout = s->entry_timeout; /* negative unless found */
    if (!found)
        return;
    e->ino = found->ino;
    ll_fill_attr(s, &e->attr, found->ino, 0, found->size, found->mtime_ns);
    e->entry_timeout = e->attr_timeout = s->cache_timeout;
}

int ll_fast_lookup(Session *s, fuse_req_t req, fuse_ino_t parent, const char *name)
{
    ll_snapshot_t *snap = fast_begin(s->fast);
    if (!snap)
        return 0;
    ll_found_t found;
    enum ll_resolution res = ll_resolve_name(snap, parent, name, 0, &found);
    int replied = res == LL_FOUND || res == LL_ABSENT;
    if (replied) {
        struct fuse_entry_param e;
        if (res == LL_FOUND) /* the READ that follows asks for up to 128 KiB of it: start it now */
            sfs_prefetch(found.shard, found.offset, found.size < LL_PREFETCH_BYTES ? found.size : LL_PREFETCH_BYTES);
        fast_entry(s, res == LL_FOUND ? &found : NULL, &e);
        count_lookup(s->fast, &found);
        fuse_reply_entry(req, &e);
    }
    ll_snapshot_release(snap);
    return replied;
}

int ll_fast_getattr(Session *s, fuse_req_t req, fuse_ino_t ino)
{
    ll_snapshot_t *snap = fast_begin(s->fast);
    if (!snap)
        return 0;
    struct stat st;
    uint64_t prefix;
    ll_found_t found;
    int replied = 1;
    if (sfs_ll_split_dir(&snap->layout, ino, &prefix) >= 0) {
        ll_fill_attr(s, &st, ino, 1, 0, snap->dir_time_ns);
        fuse_reply_attr(req, &st, s->cache_timeout);
    } else {
        switch (ll_resolve_inode(snap, ino, 0, &found)) {
        case LL_FOUND:
            ll_fill_attr(s, &st, ino, 0, found.size, found.mtime_ns);
            fuse_reply_attr(req, &st, s->cache_timeout);
            break;
        case LL_ABSENT:
            fuse_reply_err(req, ENOENT);
            break;
        case LL_STALE:
            fuse_reply_err(req, ESTALE);
            break;
        default:
            replied = 0;
        }
    }
    ll_snapshot_release(snap);
    return replied;
}

int ll_fast_read(Session *s, fuse_req_t req, fuse_ino_t ino, size_t want, off_t offset)
{
    ll_snapshot_t *snap = offset < 0 ? NULL : fast_begin(s->fast);
    if (!snap)
        return 0;
    ll_found_t found;
    int replied = 1;
    switch (ll_resolve_inode(snap, ino, 1, &found)) {
    case LL_FOUND: {
        size_t n = sfs_ll_read_length(found.size, (uint64_t)offset, want);
        char *buf = n ? malloc(n) : NULL;
        int rc = n && !buf ? SFS_ENOMEM : ll_resolve_read(&found, (uint64_t)offset, buf, n);
        if (rc == SFS_OK)
            fuse_reply_buf(req, buf, n);
        else if (rc == SFS_ENOMEM)
            fuse_reply_err(req, ENOMEM);
        else if (rc == SFS_EIO && (sfs_kind_flags(found.shard) & SFS_KIND_REMOTE))
            /* the cluster failed or timed out (rbd.h): asking it again
             * from the Python handler would double the wait */
            fuse_reply_err(req, EIO);
        else
            replied = 0; /* the handlers log it */
        free(buf);
        break;
    }
    case LL_ABSENT:
        fuse_reply_err(req, ENOENT);
        break;
    case LL_STALE:
        fuse_reply_err(req, ESTALE);
        break;
    default:
        replied = 0;
    }
    ll_snapshot_release(snap);
    return replied;
}

/* TEST ONLY, never set in production: $SHARDFS_TEST_PUSH_DELAY_MS, read
 * once per process (at its first push), makes every push sleep that many
 * milliseconds between reading the object's bytes and storing them, so
 * that a test can land a takedown in that window
 * (tests/test_workers.py, test_takedown_during_a_push_leaves_no_bytes). */
static unsigned push_delay_ms;
static pthread_once_t push_delay_once = PTHREAD_ONCE_INIT;

static void push_delay_read(void)
{
    const char *v = getenv("SHARDFS_TEST_PUSH_DELAY_MS");
    long ms = v ? strtol(v, NULL, 10) : 0;
    push_delay_ms = ms > 0 && ms <= 60000 ? (unsigned)ms : 0;
}

/* Push bytes [0, n) of the object at `off` in `shard` (`size` bytes, as
 * its slot was resolved) into the kernel's page cache for inode `ino`
 * (FUSE_NOTIFY_STORE): 0, or -1 when not done (unreadable, or the kernel
 * refused: e.g. ENOENT, an inode it does not have).
 *
 * A takedown (shardfs delete: bytes zeroed and slot emptied on disk, then
 * the inode invalidated by the coordinator) landing between the slot's
 * resolution and the store would leave the old or zeroed bytes in the
 * pages just invalidated, for a file already open (a mapping's page fault
 * asks nothing). So the slot is read again after the store: when it is no
 * longer the same object, the inode's pages and attributes are invalidated
 * here. Either this reading sees the takedown, or the takedown is written
 * after it and the coordinator's invalidation comes after the store. */
static int push(Session *s, sfs_shard_t *shard, fuse_ino_t ino, uint64_t off, uint64_t size, uint64_t n)
{
    if (n == 0)
        return -1;
    pthread_once(&push_delay_once, push_delay_read);
    int stored = -1;
    char *buf = malloc((size_t)n);
    if (buf && g_read(shard, off, buf, (size_t)n) == SFS_OK) {
        if (push_delay_ms) {
            struct timespec t = {push_delay_ms / 1000, (long)(push_delay_ms % 1000) * 1000000L};
            while (nanosleep(&t, &t) < 0 && errno == EINTR)
                ;
        }
        struct fuse_bufvec bv = FUSE_BUFVEC_INIT((size_t)n);
        bv.buf[0].mem = buf;
        stored = fuse_lowlevel_notify_store(s->se, ino, 0, &bv, 0) == 0 ? 0 : -1;
        uint32_t number, slot;
        uint64_t now_off, now_size;
        if (!sfs_ll_object_inode(ino, &number, &slot) || slot >= sfs_slot_count(shard) ||
            g_slot_object(shard, slot, &now_off, &now_size) != SFS_OK || now_off != off || now_size != size)
            fuse_lowlevel_notify_inval_inode(s->se, ino, 0, 0); /* ENOENT: the kernel has no such inode */
    }
    free(buf);
    return stored;
}

int ll_fast_store(Session *s, fuse_ino_t ino, size_t want)
{
    ll_snapshot_t *snap = fast_begin(s->fast);
    ll_found_t found;
    /* Not for an object in an RBD image: this ioctl comes at every open by
     * CPython, cached or not, and a push reads the object again from the
     * cluster; its READ, if its pages are not cached, takes the read the
     * LOOKUP started (rbd.h). */
    int stored = snap && ll_resolve_inode(snap, ino, 0, &found) == LL_FOUND && !(sfs_kind_flags(found.shard) & SFS_KIND_REMOTE)
                     ? push(s, found.shard, ino, found.offset, found.size, found.size < want ? found.size : want)
                     : -1;
    ll_snapshot_release(snap);
    return stored;
}


/* The position of `slot` (whose key is `key`) among sidecar `sc`'s
 * entries (sorted by key), and the slots of the next `max` entries into
 * out: how many (0 when not found). */
static __attribute__((noinline)) size_t g_next_by_key(const sfs_sidecar_t *sc, const uint8_t *key, uint32_t slot,
                                                      size_t max, uint64_t *pos, uint32_t *out)
{
    size_t n = 0;
    SFS_GUARDED(n = 0, {
        uint64_t b, e;
        unsigned bits = sfs_sidecar_prefix_bits(sc) + 32;
        sfs_sidecar_range(sc, key, bits < 8 * SFS_KEY_SIZE ? bits : 8 * SFS_KEY_SIZE, &b, &e);
        for (uint64_t j = b; j < e; j++) {
            uint32_t at;
            if (sfs_sidecar_slots(sc, j, j + 1, &at) == 1 && at == slot) {
                *pos = j;
                n = (size_t)sfs_sidecar_slots(sc, *pos + 1, *pos + 1 + max, out);
                break;
            }
        }
    });
    return n;
}

/* The sidecar of shard `number` for key order (its slots sorted by key),
 * held by a reference the caller lets go (sfs_sidecar_close); NULL when it
 * has none. At most AHEAD_SIDECARS are kept open, under ahead_lock; one
 * not kept is opened with no lock held. */
static sfs_sidecar_t *ahead_sidecar(struct ll_fast *f, const ll_snapshot_t *snap, uint32_t number,
                                    uint64_t slot_count)
{
    sfs_sidecar_t *sc = NULL;
    pthread_mutex_lock(&f->ahead_lock);
    for (int i = 0; i < AHEAD_SIDECARS && !sc; i++)
        if (f->sidecars[i].sc && f->sidecars[i].shard == number) {
            f->sidecars[i].used = ++f->ahead_clock;
            sc = sfs_sidecar_ref(f->sidecars[i].sc);
        }
    pthread_mutex_unlock(&f->ahead_lock);
    if (sc || number >= snap->nshards || !snap->orders[number].path)
        return sc;
    sfs_error_t err;
    if (sfs_sidecar_open(snap->orders[number].path, snap->orders[number].identity, slot_count, &sc, &err) != SFS_OK)
        return NULL;
    pthread_mutex_lock(&f->ahead_lock);
    struct ahead_sidecar *oldest = &f->sidecars[0];
    for (int i = 1; i < AHEAD_SIDECARS; i++)
        if (f->sidecars[i].used < oldest->used)
            oldest = &f->sidecars[i];
    sfs_sidecar_t *was = oldest->sc;
    oldest->sc = sfs_sidecar_ref(sc);
    oldest->shard = number;
    oldest->used = ++f->ahead_clock;
    pthread_mutex_unlock(&f->ahead_lock);
    sfs_sidecar_close(was);
    return sc;
}

/* The stream of `by_key` order that a read at `at` of shard `number`
 * continues (after its last read, and at most AHEAD_GAP `unit`s past it,
 * or, once it pushed, AHEAD_SLOTS + AHEAD_GAP past what it pushed: the
 * read after a push comes past the pushed objects, and past what other
 * workers pushed for the same reader), else the oldest, replaced by a new
 * one; returns it with its streak counted. Under ahead_lock. */
static uint64_t sat_mul(uint64_t a, uint64_t b)
{
    return b && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

static struct ahead_stream *ahead_follow(struct ll_fast *f, int by_key, uint32_t number, uint64_t at, uint64_t unit)
{
    struct ahead_stream *st = NULL, *oldest = &f->ahead[0];
    for (int i = 0; i < AHEAD_STREAMS && !st; i++) {
        struct ahead_stream *a = &f->ahead[i];
        /* past a push, the next read may also come past what the other
         * workers pushed for the same reader: up to a window more */
        uint64_t edge = a->reach > a->last ? a->reach : a->last;
        uint64_t room = a->reach > a->last ? sat_mul(unit, AHEAD_SLOTS + AHEAD_GAP) : sat_mul(unit, AHEAD_GAP);
        if (a->used && a->by_key == by_key && a->shard == number && at > a->last && (at <= edge || at - edge <= room))
            st = a;
        else if (a->used < oldest->used)
            oldest = a;
    }
    if (st) {
        st->streak++;
    } else { /* a new stream, in place of the oldest */
        st = oldest;
        st->streak = 0;
        st->by_key = by_key;
        st->shard = number;
        st->until = st->reach = 0;
        st->born = ++f->ahead_clock;
    }
    st->used = ++f->ahead_clock;
    st->last = at;
    return st;
}

static uint64_t top64(const uint8_t *key)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | key[i];
    return v;
}

void ll_fast_push_ahead(Session *s, fuse_ino_t ino)
{
    struct ll_fast *f = s->fast;
    uint32_t number, slot;
    if (!f || !sfs_ll_object_inode(ino, &number, &slot))
        return;
    ll_snapshot_t *snap = NULL;
    if (__atomic_add_fetch(&s->storing, 1, __ATOMIC_ACQ_REL) > s->store_max)
        goto done; /* see ll_ioctl: a thread must stay free to serve READs */
    if (!(snap = fast_begin(f)))
        goto done;
    int64_t mtime;
    sfs_shard_t *shard = ll_snapshot_shard(snap, number, &mtime);
    if (!shard)
        goto done;
    uint64_t count = sfs_slot_count(shard);
    uint8_t key[SFS_KEY_SIZE];
    int keyed = g_slot_key(shard, slot, key) == SFS_OK;
    /* Two reads in order in a row before a push: one alone happens by
     * chance in a small shard read at random. Slot order is the flat
     * root's listing order (tar, find | xargs); key order is sorted names
     * (rsync, fan-out listings). A read is in order when it comes after
     * the stream's last and at most AHEAD_GAP slots (in key order: times
     * the mean distance between the shard's keys) past the farther of that
     * read and what was pushed: a sparse reader (every 40th name, say) is not
     * pushed 32 objects it will not read. */
    uint32_t slots[AHEAD_SLOTS];
    size_t n = 0;
    int by_key = 0;
    struct ahead_stream *stream = NULL; /* the key-order stream to push for, */
    uint64_t born = 0;                  /* unless replaced meanwhile */
    pthread_mutex_lock(&f->ahead_lock);
    struct ahead_stream *st = ahead_follow(f, 0, number, slot, 1);
    /* push when less than half a window is left ahead (or what was pushed
     * is no window ahead of this read: another part of the shard) */
    if (st->streak >= 2 && (st->until < (uint64_t)slot + AHEAD_SLOTS / 2 || st->until > (uint64_t)slot + AHEAD_SLOTS)) {
        uint64_t from = st->until > slot && st->until <= (uint64_t)slot + AHEAD_SLOTS ? st->until + 1 : (uint64_t)slot + 1;
        for (uint64_t j = from; j <= (uint64_t)slot + AHEAD_SLOTS && j < count; j++)
            slots[n++] = (uint32_t)j;
        st->until = st->reach = (uint64_t)slot + AHEAD_SLOTS;
    } else if (keyed && st->streak == 0 && count) {
        uint64_t mean = UINT64_MAX / count; /* between two keys of the shard, in top 64 bits */
        struct ahead_stream *ks = ahead_follow(f, 1, number, top64(key), mean);
        if (ks->streak >= 2) {
            by_key = 1;
            stream = ks;
            born = ks->born;
        }
    }
    pthread_mutex_unlock(&f->ahead_lock);
    if (by_key) {
        /* the next slots in key order, read from the sidecar with no lock
         * held (it may wait for the device), then the stream updated */
        sfs_sidecar_t *sc = ahead_sidecar(f, snap, number, count);
        uint64_t pos = 0;
        uint32_t next[AHEAD_SLOTS];
        size_t got = sc ? g_next_by_key(sc, key, slot, AHEAD_SLOTS, &pos, next) : 0;
        sfs_sidecar_close(sc);
        uint8_t far[SFS_KEY_SIZE];
        int far_ok = got && g_slot_key(shard, next[got - 1], far) == SFS_OK;
        pthread_mutex_lock(&f->ahead_lock);
        struct ahead_stream *ks = stream->born == born ? stream : NULL;
        /* positions after what this stream pushed already */
        size_t skip = ks && ks->until > pos && ks->until <= pos + AHEAD_SLOTS ? (size_t)(ks->until - pos) : 0;
        if (ks && got > skip && (ks->until < pos + AHEAD_SLOTS / 2 || skip == 0)) {
            for (size_t i = skip; i < got; i++)
                slots[n++] = next[i];
            ks->until = pos + got;
            if (far_ok)
                ks->reach = top64(far);
        }
        pthread_mutex_unlock(&f->ahead_lock);
    }
    uint64_t offs[AHEAD_SLOTS], sizes[AHEAD_SLOTS];
    /* Ask for every object's bytes at once (the device serves them in
     * parallel), then push them in order: the reader wants the first next. */
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < count && g_slot_object(shard, slots[i], &offs[i], &sizes[i]) == SFS_OK && sizes[i] > 0 &&
            sizes[i] <= AHEAD_MAX_SIZE)
            sfs_prefetch(shard, offs[i], sizes[i]);
        else
            offs[i] = UINT64_MAX;
    }
    for (size_t i = 0; i < n; i++)
        if (offs[i] != UINT64_MAX) {
            /* refused: the kernel dropped the inode (it keeps a listed
             * name's inode only while memory allows); its read READs */
            int refused = push(s, shard, sfs_ll_object_ino(number, slots[i]), offs[i], sizes[i], sizes[i]) != 0;
            __atomic_fetch_add(&f->stats[refused ? 3 : 2], 1, __ATOMIC_RELAXED);
        }
done:
    ll_snapshot_release(snap);
    __atomic_sub_fetch(&s->storing, 1, __ATOMIC_ACQ_REL);
}

int ll_fast_is_dir(Session *s, fuse_ino_t ino)
{
    /* The layout and the hash directories are the mount's, the same in
     * every snapshot: one taken before the latest shard table tells too. */
    ll_snapshot_t *snap = s->fast ? ll_snapshot_acquire(&s->fast->current) : NULL;
    if (!snap)
        return -1;
    uint64_t prefix;
    int dir = sfs_ll_split_dir(&snap->layout, ino, &prefix) >= 0 || ino == snap->hashes[0].dir_ino ||
              ino == snap->hashes[1].dir_ino;
    ll_snapshot_release(snap);
    return dir;
}
