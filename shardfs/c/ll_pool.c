/*
 * ll_pool.c — shards opened on demand for the resolver (ll_pool.h).
 */
#include "ll_pool.h"
#include "guard.h"
#include "kind.h"
#include "lookup_pack.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include "internal.h"

#define STRIPES 64
#define CHUNK_BITS 12
#define CHUNK (1u << CHUNK_BITS)
#define NCHUNKS (LL_POOL_MAX_NUMBER / CHUNK)

/* One shard number. `source`, the ident fields, `gen`, `state` and
 * `shard` change under the entry's stripe lock; `shard` and `used` are
 * also read without it, as hints, by the clock. */
struct entry {
    char *source;
    uint64_t dev, ino, objects, extent;
    uint32_t gen;      /* changes at each register and forget */
    uint8_t state;     /* 1: registered */
    uint8_t has_ident;
    uint8_t used;      /* the clock's mark: read since the hand last passed */
    sfs_shard_t *shard; /* open here, the pool's reference, or NULL */
    sfs_lookup_pack_t *pack; /* where its lookups are answered without it (a reference), or NULL */
    uint64_t record;         /* its record's byte offset in `pack` */
    struct ll_fd *fd;        /* the file open here for reads by offset (the pool's reference), or NULL */
};

/* A descriptor of a shard's file, read by offset (a recorded shard: no
 * mapping, no perfect hash to parse): closed when its last holder lets go. */
struct ll_fd {
    int fd;
    int refs; /* holders: the pool while it keeps it, each read in flight */
};

static void fd_release(struct ll_fd *h)
{
    if (h && __atomic_sub_fetch(&h->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        close(h->fd);
        free(h);
    }
}

struct ll_pool {
    struct ll_pool *prev, *next; /* the process's pools (fork handlers) */
    int refs;
    pthread_mutex_t stripes[STRIPES];
    pthread_mutex_t evicting; /* one clock hand at a time */
    struct entry *chunks[NCHUNKS];
    uint32_t top;    /* highest number registered + 1 */
    uint32_t hand;   /* the clock's next entry (under `evicting`) */
    size_t open;     /* shards open, and opens under way (each reserved its room first) */
    uint64_t mapped; /* bytes mapped by the shards open */
    uint64_t opens, evictions;
    size_t bound;
    uint64_t map_budget;
};

static struct entry *entry_of(ll_pool_t *p, uint32_t number)
{
    if (number >= LL_POOL_MAX_NUMBER)
        return NULL;
    struct entry *c = __atomic_load_n(&p->chunks[number >> CHUNK_BITS], __ATOMIC_ACQUIRE);
    return c ? &c[number & (CHUNK - 1)] : NULL;
}

static pthread_mutex_t *stripe_of(ll_pool_t *p, uint32_t number) { return &p->stripes[number % STRIPES]; }

/* The pools of the process, so that a fork never leaves the child a lock
 * another thread held (a mount forks its workers, which keep its pool):
 * the child makes every pool's locks anew. What a thread was changing
 * under one at that moment is at worst a count off by one shard (the
 * critical sections are a few stores), never a dangling pointer: shards
 * are closed, and sources freed, outside them. */
static pthread_mutex_t pools_lock = PTHREAD_MUTEX_INITIALIZER;
static ll_pool_t *pools;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void fork_prepare(void) { pthread_mutex_lock(&pools_lock); }

static void fork_parent(void) { pthread_mutex_unlock(&pools_lock); }

static void fork_child(void)
{
    for (ll_pool_t *p = pools; p; p = p->next) {
        for (int i = 0; i < STRIPES; i++)
            pthread_mutex_init(&p->stripes[i], NULL);
        pthread_mutex_init(&p->evicting, NULL);
    }
    pthread_mutex_unlock(&pools_lock);
}

static void fork_handlers(void) { pthread_atfork(fork_prepare, fork_parent, fork_child); }

ll_pool_t *ll_pool_new(size_t bound, uint64_t map_budget)
{
    pthread_once(&fork_once, fork_handlers);
    ll_pool_t *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->refs = 1;
    for (int i = 0; i < STRIPES; i++)
        pthread_mutex_init(&p->stripes[i], NULL);
    pthread_mutex_init(&p->evicting, NULL);
    p->bound = bound ? bound : 1;
    p->map_budget = map_budget;
    pthread_mutex_lock(&pools_lock);
    p->next = pools;
    if (pools)
        pools->prev = p;
    pools = p;
    pthread_mutex_unlock(&pools_lock);
    return p;
}

ll_pool_t *ll_pool_ref(ll_pool_t *p)
{
    __atomic_add_fetch(&p->refs, 1, __ATOMIC_RELAXED);
    return p;
}

/* Take entry e's shard out of the pool (the entry's stripe held); the
 * caller closes it after unlocking. */
static sfs_shard_t *take_shard(ll_pool_t *p, struct entry *e)
{
    sfs_shard_t *s = e->shard;
    if (s) {
        __atomic_store_n(&e->shard, NULL, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&p->mapped, s->map_size, __ATOMIC_RELAXED);
    }
    return s;
}

/* Take entry e's descriptor out of the pool (stripe held); the caller
 * lets it go (fd_release) after unlocking. */
static struct ll_fd *take_fd(ll_pool_t *p, struct entry *e)
{
    struct ll_fd *h = e->fd;
    if (h) {
        __atomic_store_n(&e->fd, NULL, __ATOMIC_RELAXED);
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
    }
    return h;
}

void ll_pool_unref(ll_pool_t *p)
{
    if (!p || __atomic_sub_fetch(&p->refs, 1, __ATOMIC_ACQ_REL) != 0)
        return;
    pthread_mutex_lock(&pools_lock);
    if (p->prev)
        p->prev->next = p->next;
    else
        pools = p->next;
    if (p->next)
        p->next->prev = p->prev;
    pthread_mutex_unlock(&pools_lock);
    for (size_t c = 0; c < NCHUNKS; c++) {
        struct entry *chunk = p->chunks[c];
        for (size_t i = 0; chunk && i < CHUNK; i++) {
            sfs_close(chunk[i].shard);
            fd_release(chunk[i].fd);
            sfs_lookup_pack_close(chunk[i].pack);
            free(chunk[i].source);
        }
        free(chunk);
    }
    for (int i = 0; i < STRIPES; i++)
        pthread_mutex_destroy(&p->stripes[i]);
    pthread_mutex_destroy(&p->evicting);
    free(p);
}

/* Close one shard the clock finds unused since the hand last passed it
 * (a second pass takes any). 1 when one was closed, 0 when none is open. */
static int evict_one(ll_pool_t *p)
{
    pthread_mutex_lock(&p->evicting);
    uint32_t top = __atomic_load_n(&p->top, __ATOMIC_ACQUIRE);
    sfs_shard_t *victim = NULL;
    struct ll_fd *victim_fd = NULL;
    for (uint64_t step = 0; top && step < 2 * (uint64_t)top; step++) {
        uint32_t number = p->hand < top ? p->hand : 0;
        p->hand = number + 1;
        struct entry *e = entry_of(p, number);
        if (!e) { /* no chunk: skip it whole */
            p->hand = (number | (CHUNK - 1)) + 1;
            continue;
        }
        if (!__atomic_load_n(&e->shard, __ATOMIC_RELAXED) && !__atomic_load_n(&e->fd, __ATOMIC_RELAXED))
            continue;
        if (__atomic_load_n(&e->used, __ATOMIC_RELAXED)) {
            __atomic_store_n(&e->used, 0, __ATOMIC_RELAXED);
            continue;
        }
        pthread_mutex_t *m = stripe_of(p, number);
        pthread_mutex_lock(m);
        victim = take_shard(p, e);
        victim_fd = take_fd(p, e);
        pthread_mutex_unlock(m);
        if (!victim && !victim_fd)
            continue;
        break;
    }
    int evicted = victim || victim_fd;
    if (evicted)
        __atomic_add_fetch(&p->evictions, 1, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&p->evicting);
    sfs_close(victim); /* its requests in flight keep it until they let go */
    fd_release(victim_fd);
    return evicted;
}

/* Close shards until the pool holds at most `bound` (counting the rooms
 * reserved) and maps at most its budget. */
static void make_room(ll_pool_t *p)
{
    while ((__atomic_load_n(&p->open, __ATOMIC_RELAXED) > __atomic_load_n(&p->bound, __ATOMIC_RELAXED) ||
            __atomic_load_n(&p->mapped, __ATOMIC_RELAXED) > __atomic_load_n(&p->map_budget, __ATOMIC_RELAXED)) &&
           evict_one(p))
        ;
}

void ll_pool_set_bounds(ll_pool_t *p, size_t bound, uint64_t map_budget)
{
    __atomic_store_n(&p->bound, bound ? bound : 1, __ATOMIC_RELAXED);
    __atomic_store_n(&p->map_budget, map_budget, __ATOMIC_RELAXED);
    make_room(p);
}

int ll_pool_register(ll_pool_t *p, uint32_t number, const char *source, int has_ident, uint64_t dev,
                     uint64_t ino, uint64_t objects, uint64_t extent, sfs_lookup_pack_t *pack, uint64_t record)
{
    if (number >= LL_POOL_MAX_NUMBER)
        return -1;
    struct entry **slot = &p->chunks[number >> CHUNK_BITS];
    if (!*slot) { /* one writer: no other thread allocates chunks */
        struct entry *c = calloc(CHUNK, sizeof(struct entry));
        if (!c)
            return -1;
        __atomic_store_n(slot, c, __ATOMIC_RELEASE);
    }
    char *copy = strdup(source);
    if (!copy)
        return -1;
    struct entry *e = entry_of(p, number);
    pthread_mutex_t *m = stripe_of(p, number);
    if (pack)
        sfs_lookup_pack_ref(pack);
    pthread_mutex_lock(m);
    char *old = e->source;
    sfs_lookup_pack_t *old_pack = e->pack;
    sfs_shard_t *victim = take_shard(p, e);
    struct ll_fd *victim_fd = take_fd(p, e);
    e->pack = pack;
    e->record = record;
    e->source = copy;
    e->has_ident = has_ident != 0;
    e->dev = dev;
    e->ino = ino;
    e->objects = objects;
    e->extent = extent;
    e->gen++;
    e->state = 1;
    pthread_mutex_unlock(m);
    free(old);
    sfs_lookup_pack_close(old_pack);
    sfs_close(victim);
    fd_release(victim_fd);
    if (number + 1 > __atomic_load_n(&p->top, __ATOMIC_RELAXED))
        __atomic_store_n(&p->top, number + 1, __ATOMIC_RELEASE);
    return 0;
}

void ll_pool_forget(ll_pool_t *p, uint32_t number)
{
    struct entry *e = entry_of(p, number);
    if (!e)
        return;
    pthread_mutex_t *m = stripe_of(p, number);
    pthread_mutex_lock(m);
    char *old = e->source;
    sfs_lookup_pack_t *old_pack = e->pack;
    sfs_shard_t *victim = take_shard(p, e);
    struct ll_fd *victim_fd = take_fd(p, e);
    e->source = NULL;
    e->pack = NULL;
    e->gen++;
    e->state = 0;
    pthread_mutex_unlock(m);
    free(old);
    sfs_lookup_pack_close(old_pack);
    sfs_close(victim);
    fd_release(victim_fd);
}

/* sfs_open under SFS_GUARDED (guard.h): a file that shrinks while its hash
 * section is parsed gives SFS_EGONE, not SIGBUS (what that open had set
 * up is then lost: a descriptor and a mapping, once). */
static __attribute__((noinline)) int guarded_open(const char *source, sfs_shard_t **out, sfs_error_t *err)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = sfs_open(source, 0, out, err));
    return rc;
}

/* Whether the open shard s is the one registered: (dev, ino) when known,
 * the object count and the extent. */
static int matches(const sfs_shard_t *s, int has_ident, uint64_t dev, uint64_t ino, uint64_t objects,
                   uint64_t extent)
{
    if (s->header.objects_count != objects || s->extent != extent)
        return 0;
    if (!has_ident)
        return 1;
    struct stat st;
    return fstat(s->fd, &st) == 0 && (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;
}

/* Entry `number`, registered, with its stripe *m locked; NULL (nothing
 * locked) when it is not registered. */
static struct entry *lock_entry(ll_pool_t *p, uint32_t number, pthread_mutex_t **m)
{
    struct entry *e = entry_of(p, number);
    if (!e)
        return NULL;
    *m = stripe_of(p, number);
    pthread_mutex_lock(*m);
    if (!e->state) {
        pthread_mutex_unlock(*m);
        return NULL;
    }
    return e;
}

/* The clock's mark: entry e was used since the hand last passed. */
static void mark_used(struct entry *e)
{
    if (!__atomic_load_n(&e->used, __ATOMIC_RELAXED))
        __atomic_store_n(&e->used, 1, __ATOMIC_RELAXED);
}

/* What an open of entry e checks, copied under its stripe lock. */
struct opening {
    char *source; /* malloc'ed: the caller frees it */
    uint32_t gen;
    int has_ident;
    uint64_t dev, ino, objects, extent;
};

/* Copy into *o what opening entry e needs, unlock its stripe m, and
 * reserve the room of one more open (closing others to make it). 0, or -1
 * when out of memory (unlocked, nothing reserved). */
static int begin_open(ll_pool_t *p, struct entry *e, pthread_mutex_t *m, struct opening *o)
{
    *o = (struct opening){strdup(e->source), e->gen, e->has_ident, e->dev, e->ino, e->objects, e->extent};
    pthread_mutex_unlock(m);
    if (!o->source)
        return -1;
    __atomic_add_fetch(&p->open, 1, __ATOMIC_RELAXED); /* its room, made before it opens */
    make_room(p);
    return 0;
}

sfs_shard_t *ll_pool_get(ll_pool_t *p, uint32_t number, int *status)
{
    *status = SFS_ESTALE;
    pthread_mutex_t *m;
    struct entry *e = lock_entry(p, number, &m);
    if (!e)
        return NULL;
    if (e->shard) {
        sfs_shard_t *s = sfs_ref(e->shard);
        pthread_mutex_unlock(m);
        mark_used(e);
        *status = SFS_OK;
        return s;
    }
    struct opening o;
    if (begin_open(p, e, m, &o) < 0) {
        *status = SFS_ENOMEM;
        return NULL;
    }
    char *source = o.source;
    uint32_t gen = o.gen;
    int has_ident = o.has_ident;
    uint64_t dev = o.dev, ino = o.ino, objects = o.objects, extent = o.extent;
    sfs_shard_t *s = NULL, *spare = NULL, *out = NULL;
    sfs_error_t err;
    int rc = guarded_open(source, &s, &err);
    free(source);
    if (rc == SFS_OK && !matches(s, has_ident, dev, ino, objects, extent)) {
        rc = SFS_ESTALE;
        spare = s;
    }
    pthread_mutex_lock(m);
    if (rc != SFS_OK) {
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
    } else if (e->gen != gen || !e->state) { /* forgotten or replaced meanwhile */
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
        spare = s;
        rc = SFS_ESTALE;
    } else if (e->shard) { /* another request opened it first */
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
        spare = s;
        out = sfs_ref(e->shard);
    } else {
        __atomic_add_fetch(&p->mapped, s->map_size, __ATOMIC_RELAXED);
        __atomic_store_n(&e->shard, s, __ATOMIC_RELAXED);
        __atomic_store_n(&e->used, 1, __ATOMIC_RELAXED);
        out = sfs_ref(s);
    }
    pthread_mutex_unlock(m);
    sfs_close(spare);
    if (rc == SFS_OK)
        __atomic_add_fetch(&p->opens, 1, __ATOMIC_RELAXED);
    *status = rc;
    return out;
}

/* The record of shard `number`: its pack (a new reference) and offset, or
 * NULL. */
static sfs_lookup_pack_t *record_of(ll_pool_t *p, uint32_t number, uint64_t *record)
{
    struct entry *e = entry_of(p, number);
    if (!e || !__atomic_load_n(&e->pack, __ATOMIC_RELAXED))
        return NULL;
    pthread_mutex_t *m = stripe_of(p, number);
    pthread_mutex_lock(m);
    sfs_lookup_pack_t *pack = e->state && e->pack ? sfs_lookup_pack_ref(e->pack) : NULL;
    *record = e->record;
    pthread_mutex_unlock(m);
    return pack;
}

/* What ll_pool_find asks of a record: the object of `key`; else (key
 * NULL) of `slot`, and, key_out given, its key; *slots the record's slot
 * count. */
static int find_in(const sfs_lookup_pack_t *pack, uint64_t record, const uint8_t *key, uint64_t slot,
                   uint32_t *slot_out, uint64_t *offset, uint64_t *size, uint8_t *key_out, uint64_t *slots)
{
    sfs_lookup_record_t r;
    int rc = sfs_lookup_pack_view(pack, record, &r);
    if (rc != SFS_OK)
        return rc;
    *slots = r.slots;
    if (key)
        return sfs_lookup_record_find(&r, key, slot_out, offset, size);
    rc = sfs_lookup_record_slot(&r, slot, offset, size);
    if (rc == SFS_OK && key_out)
        memcpy(key_out, r.index + SFS_SLOT_SIZE * slot, SFS_KEY_SIZE);
    return rc;
}

/* find_in under SFS_GUARDED: a pack that shrank gives SFS_EGONE (its
 * reference is then lost, once), not SIGBUS. */
static __attribute__((noinline)) int guarded_find(const sfs_lookup_pack_t *pack, uint64_t record, const uint8_t *key,
                                                  uint64_t slot, uint32_t *slot_out, uint64_t *offset, uint64_t *size,
                                                  uint8_t *key_out, uint64_t *slots)
{
    int rc = SFS_OK;
    SFS_GUARDED(rc = SFS_EGONE, rc = find_in(pack, record, key, slot, slot_out, offset, size, key_out, slots));
    return rc;
}

static int pool_find(ll_pool_t *p, uint32_t number, const uint8_t *key, uint64_t slot, uint32_t *slot_out,
                     uint64_t *offset, uint64_t *size, uint8_t *key_out, uint64_t *slots)
{
    uint64_t record;
    sfs_lookup_pack_t *pack = record_of(p, number, &record);
    if (!pack)
        return LL_POOL_NO_RECORD;
    int rc = guarded_find(pack, record, key, slot, slot_out, offset, size, key_out, slots);
    sfs_lookup_pack_close(pack);
    return rc == SFS_OK || rc == SFS_ENOTFOUND ? rc : LL_POOL_NO_RECORD;
}

int ll_pool_find(ll_pool_t *p, uint32_t number, const uint8_t *key, uint64_t slot, uint32_t *slot_out,
                 uint64_t *offset, uint64_t *size)
{
    uint64_t slots;
    return pool_find(p, number, key, slot, slot_out, offset, size, NULL, &slots);
}

int ll_pool_slot(ll_pool_t *p, uint32_t number, uint64_t slot, uint8_t key[SFS_KEY_SIZE], uint64_t *offset,
                 uint64_t *size, uint64_t *slots)
{
    *slots = 0;
    return pool_find(p, number, NULL, slot, NULL, offset, size, key, slots);
}

/* The descriptor of shard `number` for reads by offset: a new hold
 * (fd_release), opened now if the pool has none (closing others first to
 * stay within the bound), checked against what was registered: (dev, ino)
 * and a file reaching the registered extent. NULL with *status. */
static struct ll_fd *fd_get(ll_pool_t *p, uint32_t number, int *status)
{
    *status = SFS_ESTALE;
    pthread_mutex_t *m;
    struct entry *e = lock_entry(p, number, &m);
    if (!e)
        return NULL;
    if (e->fd) {
        struct ll_fd *h = e->fd;
        __atomic_add_fetch(&h->refs, 1, __ATOMIC_RELAXED);
        pthread_mutex_unlock(m);
        mark_used(e);
        *status = SFS_OK;
        return h;
    }
    struct opening o;
    struct ll_fd *h = malloc(sizeof(*h));
    if (!h) {
        pthread_mutex_unlock(m);
        *status = SFS_ENOMEM;
        return NULL;
    }
    if (begin_open(p, e, m, &o) < 0) {
        free(h);
        *status = SFS_ENOMEM;
        return NULL;
    }
    char *source = o.source;
    uint32_t gen = o.gen;
    int has_ident = o.has_ident;
    uint64_t dev = o.dev, ino = o.ino, extent = o.extent;
    struct stat st;
    h->fd = open(source, O_RDONLY | O_CLOEXEC);
    int open_errno = errno;
    h->refs = 2; /* the pool's, ours */
    free(source);
    int rc = SFS_OK;
    if (h->fd < 0)
        rc = open_errno == ENOENT ? SFS_ESTALE : SFS_EIO; /* gone from under its name: removed */
    else if (fstat(h->fd, &st) < 0 || (has_ident && ((uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino)) ||
             (S_ISREG(st.st_mode) && (uint64_t)st.st_size < extent))
        rc = SFS_ESTALE; /* another file under its name, or it shrank */
    struct ll_fd *spare = NULL, *out = NULL;
    pthread_mutex_lock(m);
    if (rc != SFS_OK || e->gen != gen || !e->state) {
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
        spare = h;
        if (rc == SFS_OK)
            rc = SFS_ESTALE;
    } else if (e->fd) { /* another read opened it first */
        __atomic_sub_fetch(&p->open, 1, __ATOMIC_RELAXED);
        spare = h;
        out = e->fd;
        __atomic_add_fetch(&out->refs, 1, __ATOMIC_RELAXED);
    } else {
        e->fd = out = h;
        __atomic_store_n(&e->used, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(m);
    if (spare) {
        if (spare->fd >= 0)
            close(spare->fd);
        free(spare);
    }
    if (out == h)
        __atomic_add_fetch(&p->opens, 1, __ATOMIC_RELAXED);
    *status = rc;
    return out;
}

int ll_pool_read(ll_pool_t *p, uint32_t number, uint64_t data_offset, uint64_t size, uint64_t at, void *buf,
                 size_t n)
{
    int status;
    struct ll_fd *h = fd_get(p, number, &status);
    if (!h)
        return status;
    uint8_t field[SFS_SIZE_FIELD_SIZE];
    struct iovec iov[2] = {{field, sizeof(field)}, {buf, n}};
    uint64_t from = data_offset - SFS_SIZE_FIELD_SIZE + at;
    if (at) { /* past the object's start: its size field is read on its own */
        iov[0].iov_len = 0;
        from = data_offset + at;
    }
    size_t want = iov[0].iov_len + n, got = 0;
    int rc = SFS_OK;
    while (got < want) {
        struct iovec rest[2];
        int k = 0;
        size_t skip = got;
        for (int i = 0; i < 2; i++) {
            if (skip >= iov[i].iov_len) {
                skip -= iov[i].iov_len;
                continue;
            }
            rest[k].iov_base = (char *)iov[i].iov_base + skip;
            rest[k++].iov_len = iov[i].iov_len - skip;
            skip = 0;
        }
        ssize_t r = preadv(h->fd, rest, k, (off_t)(from + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = SFS_EIO; /* an error, or the file ended first: it shrank */
            break;
        }
        got += (size_t)r;
    }
    if (rc == SFS_OK && at && pread(h->fd, field, sizeof(field), (off_t)(data_offset - SFS_SIZE_FIELD_SIZE)) !=
                                   (ssize_t)sizeof(field))
        rc = SFS_EIO;
    /* a size field that is not the record's: the object was deleted (its
     * size field zeroed) or the file changed: the caller asks the shard */
    if (rc == SFS_OK && be64(field) != size)
        rc = SFS_ESTALE;
    fd_release(h);
    return rc;
}

void ll_pool_stats(ll_pool_t *p, ll_pool_stats_t *out)
{
    out->open = __atomic_load_n(&p->open, __ATOMIC_RELAXED);
    out->mapped = __atomic_load_n(&p->mapped, __ATOMIC_RELAXED);
    out->opens = __atomic_load_n(&p->opens, __ATOMIC_RELAXED);
    out->evictions = __atomic_load_n(&p->evictions, __ATOMIC_RELAXED);
    out->bound = __atomic_load_n(&p->bound, __ATOMIC_RELAXED);
    out->map_budget = __atomic_load_n(&p->map_budget, __ATOMIC_RELAXED);
}
