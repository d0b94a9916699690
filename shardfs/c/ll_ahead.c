/*
 * ll_ahead.c — pushes into the kernel's page cache (ll_ahead.h).
 */
#include "ll_ahead.h"
#include "ll_guarded.h"

#include <stdlib.h>
#include <time.h>

void ll_ahead_init(struct ll_ahead *a)
{
    memset(a, 0, sizeof(*a));
    pthread_mutex_init(&a->lock, NULL);
}

void ll_ahead_forget(struct ll_ahead *a)
{
    pthread_mutex_lock(&a->lock);
    sfs_sidecar_t *old[AHEAD_SIDECARS];
    for (int i = 0; i < AHEAD_SIDECARS; i++) {
        old[i] = a->sidecars[i].sc;
        a->sidecars[i].sc = NULL;
        a->sidecars[i].used = 0;
    }
    pthread_mutex_unlock(&a->lock);
    for (int i = 0; i < AHEAD_SIDECARS; i++) /* no lock held while unmapping */
        sfs_sidecar_close(old[i]);
}

void ll_ahead_destroy(struct ll_ahead *a)
{
    ll_ahead_forget(a);
    pthread_mutex_destroy(&a->lock);
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
int ll_push(Session *s, sfs_shard_t *shard, fuse_ino_t ino, uint64_t off, uint64_t size, uint64_t n)
{
    if (n == 0)
        return -1;
    char *buf = malloc((size_t)n);
    int stored = buf && g_read(shard, off, buf, (size_t)n) == SFS_OK ? ll_store(s, shard, NULL, ino, off, size, buf, 0, n)
                                                                      : -1;
    free(buf);
    return stored;
}

int ll_push_found(Session *s, const ll_found_t *f, fuse_ino_t ino, uint64_t n)
{
    if (f->shard)
        return ll_push(s, f->shard, ino, f->offset, f->size, n);
    if (n == 0)
        return -1;
    char *buf = malloc((size_t)n);
    int stored = buf && ll_resolve_read(f, 0, buf, (size_t)n) == SFS_OK
                     ? ll_store(s, NULL, f->pool, ino, f->offset, f->size, buf, 0, n)
                     : -1;
    free(buf);
    return stored;
}

/* Whether slot `slot` of shard `number` still holds the object at byte
 * `off` of `size` bytes: its shard's slot, or its record's (pool). */
static int still_there(sfs_shard_t *shard, ll_pool_t *pool, uint32_t number, uint32_t slot, uint64_t off,
                       uint64_t size)
{
    uint64_t now_off, now_size;
    if (shard)
        return slot < sfs_slot_count(shard) && g_slot_object(shard, slot, &now_off, &now_size) == SFS_OK &&
               now_off == off && now_size == size;
    return ll_pool_find(pool, number, NULL, slot, NULL, &now_off, &now_size) == SFS_OK && now_off == off &&
           now_size == size;
}

int ll_store(Session *s, sfs_shard_t *shard, ll_pool_t *pool, fuse_ino_t ino, uint64_t off, uint64_t size,
             const char *bytes, uint64_t at, uint64_t n)
{
    pthread_once(&push_delay_once, push_delay_read);
    if (push_delay_ms) {
        struct timespec t = {push_delay_ms / 1000, (long)(push_delay_ms % 1000) * 1000000L};
        while (nanosleep(&t, &t) < 0 && errno == EINTR)
            ;
    }
    struct fuse_bufvec bv = FUSE_BUFVEC_INIT((size_t)n);
    bv.buf[0].mem = (void *)bytes;
    int stored = fuse_lowlevel_notify_store(s->se, ino, (off_t)at, &bv, 0) == 0 ? 0 : -1;
    uint32_t number, slot;
    if (!sfs_ll_object_inode(ino, &number, &slot) || !still_there(shard, pool, number, slot, off, size))
        fuse_lowlevel_notify_inval_inode(s->se, ino, 0, 0); /* ENOENT: the kernel has no such inode */
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
static sfs_sidecar_t *ahead_sidecar(struct ll_ahead *a, const ll_snapshot_t *snap, uint32_t number,
                                    uint64_t slot_count)
{
    sfs_sidecar_t *sc = NULL;
    pthread_mutex_lock(&a->lock);
    for (int i = 0; i < AHEAD_SIDECARS && !sc; i++)
        if (a->sidecars[i].sc && a->sidecars[i].shard == number) {
            a->sidecars[i].used = ++a->clock;
            sc = sfs_sidecar_ref(a->sidecars[i].sc);
        }
    pthread_mutex_unlock(&a->lock);
    if (sc || number >= snap->nshards || !snap->orders[number].path)
        return sc;
    sfs_error_t err;
    if (sfs_sidecar_open(snap->orders[number].path, snap->orders[number].identity, slot_count, &sc, &err) != SFS_OK)
        return NULL;
    pthread_mutex_lock(&a->lock);
    struct ahead_sidecar *oldest = &a->sidecars[0];
    for (int i = 1; i < AHEAD_SIDECARS; i++)
        if (a->sidecars[i].used < oldest->used)
            oldest = &a->sidecars[i];
    sfs_sidecar_t *was = oldest->sc;
    oldest->sc = sfs_sidecar_ref(sc);
    oldest->shard = number;
    oldest->used = ++a->clock;
    pthread_mutex_unlock(&a->lock);
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

static struct ahead_stream *ahead_follow(struct ll_ahead *ah, int by_key, uint32_t number, uint64_t at, uint64_t unit)
{
    struct ahead_stream *st = NULL, *oldest = &ah->ahead[0];
    for (int i = 0; i < AHEAD_STREAMS && !st; i++) {
        struct ahead_stream *a = &ah->ahead[i];
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
        st->born = ++ah->clock;
    }
    st->used = ++ah->clock;
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

/* Slot `slot` of shard `number`: in `shard`, or, shard NULL, in its
 * record through `pool`: its key (key_out, may be NULL), the offset of
 * its object's first byte and its size (may be NULL). SFS_OK or another
 * status (an empty slot, no record). */
static int slot_object(sfs_shard_t *shard, ll_pool_t *pool, uint32_t number, uint32_t slot, uint8_t *key_out,
                       uint64_t *off, uint64_t *size)
{
    uint64_t o, z, slots;
    if (!shard)
        return ll_pool_slot(pool, number, slot, key_out ? key_out : (uint8_t[SFS_KEY_SIZE]){0}, off ? off : &o,
                            size ? size : &z, &slots);
    if (key_out && g_slot_key(shard, slot, key_out) != SFS_OK)
        return SFS_ENOTFOUND;
    return off ? g_slot_object(shard, slot, off, size) : SFS_OK;
}

/* ll_push of slot `slot`'s object (at byte `off`, `size` bytes), from
 * `shard`, or read by offset through `pool` (its record answered). */
static int push_one(Session *s, sfs_shard_t *shard, ll_pool_t *pool, uint32_t number, uint32_t slot, uint64_t off,
                    uint64_t size)
{
    fuse_ino_t ino = sfs_ll_object_ino(number, slot);
    if (shard)
        return ll_push(s, shard, ino, off, size, size);
    char *buf = malloc((size_t)size);
    int stored = buf && ll_pool_read(pool, number, off, size, 0, buf, (size_t)size) == SFS_OK
                     ? ll_store(s, NULL, pool, ino, off, size, buf, 0, size)
                     : -1;
    free(buf);
    return stored;
}

void ll_ahead_push(struct ll_ahead *a, Session *s, ll_snapshot_t *snap, uint32_t number, uint32_t slot,
                   int64_t *stats)
{
    int64_t mtime;
    sfs_shard_t *held = NULL; /* opened by the snapshot's pool (ll_pool.h) */
    sfs_shard_t *shard = ll_snapshot_shard(snap, number, &mtime);
    ll_pool_t *rec = NULL; /* or its record answers, and objects are read by offset */
    uint64_t count = 0;
    uint8_t key[SFS_KEY_SIZE];
    int keyed = 0;
    if (!shard && snap->pool && number < snap->nshards && snap->mtimes[number] >= 0) {
        uint64_t off, size;
        int rc = ll_pool_slot(snap->pool, number, slot, key, &off, &size, &count);
        if (rc != LL_POOL_NO_RECORD) {
            rec = snap->pool;
            keyed = rc == SFS_OK;
        } else {
            int status;
            shard = held = ll_pool_get(snap->pool, number, &status);
        }
    }
    if (!shard && !rec)
        return;
    if (shard) {
        count = sfs_slot_count(shard);
        keyed = g_slot_key(shard, slot, key) == SFS_OK;
    }
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
    pthread_mutex_lock(&a->lock);
    struct ahead_stream *st = ahead_follow(a, 0, number, slot, 1);
    /* push when less than half a window is left ahead (or what was pushed
     * is no window ahead of this read: another part of the shard) */
    if (st->streak >= 2 && (st->until < (uint64_t)slot + AHEAD_SLOTS / 2 || st->until > (uint64_t)slot + AHEAD_SLOTS)) {
        uint64_t from = st->until > slot && st->until <= (uint64_t)slot + AHEAD_SLOTS ? st->until + 1 : (uint64_t)slot + 1;
        for (uint64_t j = from; j <= (uint64_t)slot + AHEAD_SLOTS && j < count; j++)
            slots[n++] = (uint32_t)j;
        st->until = st->reach = (uint64_t)slot + AHEAD_SLOTS;
    } else if (keyed && st->streak == 0 && count) {
        uint64_t mean = UINT64_MAX / count; /* between two keys of the shard, in top 64 bits */
        struct ahead_stream *ks = ahead_follow(a, 1, number, top64(key), mean);
        if (ks->streak >= 2) {
            by_key = 1;
            stream = ks;
            born = ks->born;
        }
    }
    pthread_mutex_unlock(&a->lock);
    if (by_key) {
        /* the next slots in key order, read from the sidecar with no lock
         * held (it may wait for the device), then the stream updated */
        sfs_sidecar_t *sc = ahead_sidecar(a, snap, number, count);
        uint64_t pos = 0;
        uint32_t next[AHEAD_SLOTS];
        size_t got = sc ? g_next_by_key(sc, key, slot, AHEAD_SLOTS, &pos, next) : 0;
        sfs_sidecar_close(sc);
        uint8_t far[SFS_KEY_SIZE];
        int far_ok = got && slot_object(shard, rec, number, next[got - 1], far, NULL, NULL) == SFS_OK;
        pthread_mutex_lock(&a->lock);
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
        pthread_mutex_unlock(&a->lock);
    }
    uint64_t offs[AHEAD_SLOTS], sizes[AHEAD_SLOTS];
    /* Ask for every object's bytes at once (the device serves them in
     * parallel), then push them in order: the reader wants the first next. */
    for (size_t i = 0; i < n; i++) {
        if (slots[i] < count && slot_object(shard, rec, number, slots[i], NULL, &offs[i], &sizes[i]) == SFS_OK &&
            sizes[i] > 0 && sizes[i] <= AHEAD_MAX_SIZE) {
            if (shard)
                sfs_prefetch(shard, offs[i], sizes[i]);
        } else {
            offs[i] = UINT64_MAX;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (offs[i] != UINT64_MAX) {
            /* refused: the kernel dropped the inode (it keeps a listed
             * name's inode only while memory allows); its read READs */
            int refused = push_one(s, shard, rec, number, slots[i], offs[i], sizes[i]) != 0;
            __atomic_fetch_add(&stats[refused ? LL_STAT_PUSH_REFUSED : LL_STAT_PUSHED], 1, __ATOMIC_RELAXED);
        }
    sfs_close(held);
}

