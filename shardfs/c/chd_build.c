/*
 * chd_build.c — build a CHD_PH perfect hash function and write it as the
 * bytes cmph_dump() writes, without cmph.
 *
 * Why: at 1M keys cmph 2.0.2's builder takes ~270-300 ns per key, more than
 * a copy of a shard of tiny objects; ~70% of that is its displacement
 * search (34M probes for 1M keys, each a 64-bit division and a bitmap
 * test). This one takes well under 100 ns per key (docs/build.md: profile,
 * choices, figures). The writer still parses every dump with our
 * evaluator, loads it with cmph_load() and checks every key with
 * cmph_search() against sfs_chd_search() (writer.c), so a mistake here
 * fails a build, never a reader.
 *
 * Input: nkeys distinct keys of keylen bytes, read through key_at(ctx, i)
 * for i in [0, nkeys) (each key once per seed tried), 1 <= nkeys <=
 * SFS_CHD_MAX_KEYS. Output: a malloc'ed dump (the caller frees it) that
 * cmph_load() and sfs_chd_parse() accept, whose function maps the keys to
 * distinct slots in [0, n).
 *
 * Shapes. Slots as cmph 2.0.2 computes them for load factor 0.99 and
 * keys_per_bin 1 (chd_ph.c, chd_ph_new), so an index has as many slots as
 * with cmph's builder; buckets as cmph computes them for b = 2 (cmph's
 * cmph_config_set_b accepts 2..14; the writer used 4):
 *   n        = the smallest prime >= (u32)(nkeys / 0.99) + 1 (odd first)
 *   nbuckets = nkeys / 2 + 1
 * b = 2 rather than 4: 6x fewer probes in the search (4 keys per bucket
 * leave buckets of 3 and 4 keys to be placed when the table is 70-90% full)
 * for a dump of 2.6 bits per key instead of 2.2 (docs/build.md).
 * Per key (cmph's chd_ph_mapping; chd.c evaluates the same):
 *   (h0, h1, h2) = jenkins(seed, key) (sfs_chd_jenkins, chd.h)
 *   bucket g = h0 % nbuckets, f = h1 % n, h = h2 % (n - 1) + 1
 * Displacement of a bucket: a probe number p = d1 * n + d0 (d0 < n), every
 * key of the bucket going to slot (f + h * d0 + d1) % n; the dump stores p.
 * Buckets are placed largest first (size descending, then bucket number,
 * as cmph orders them), each at its smallest probe whose slots are all
 * free (cmph 2.0.2's place_buckets2 instead tries probe 0 for every bucket
 * of a size, then probe 1...: a different, equally valid choice), at most
 * 2^20 probes per bucket (cmph's max_probes_default).
 *
 * Encoding of the displacements (cmph's compressed_seq.c and select.c):
 *   len_i = floor(log2(d_i + 1)) (0 when d_i = 0), value_i = d_i + 1 - 2^len_i
 *   store: value_i in len_i bits at bit sum(len_<i)
 *   total_length = sum(len_i)
 *   rem_r = floor(log2(total_length / nbuckets)) as cmph, but at least 1:
 *     with 0, cmph_load() allocates no length_rems words and cmph_search()
 *     reads one past them (cmph's own dumps have rem_r 0 for tiny sets)
 *   cum_i = sum(len_<=i); length_rems: cum_i mod 2^rem_r in rem_r bits at
 *     bit i * rem_r; select over the non-decreasing cum_i >> rem_r: bit
 *     (cum_i >> rem_r) + i set in a vector of nbuckets + (total_length >>
 *     rem_r) bits; select_table[j] = the position of set bit number 128 j,
 *     (nbuckets >> 7) + 1 words (a last unused one stays 0).
 * Bit i of a bit array is bit i % 8 of byte i / 8 (little-endian u32 words
 * as cmph writes them on x86-64). The whole dump's layout is in chd.h.
 *
 * Seeds: seed k of the sequence sfs_chd_build_seed(k), from opts->first_seed
 * on (0 by default; tests start elsewhere to meet a seed that fails). A seed
 * fails when two keys of one bucket get the same (f, h) (no displacement
 * separates them; cmph's chd_ph_bucket_insert makes the same test), when a
 * bucket holds more than MAX_BUCKET keys, or when a bucket finds no free
 * probe; then the next seed is tried, up to opts->max_seeds (default 100,
 * cmph's iterations). The result depends on the keys (in order) and opts
 * only: the same keys give the same bytes.
 *
 * Memory: 20 bytes per key (bucket, f and h per key, then (f, h) grouped by
 * bucket) and 12 bytes per bucket, plus n / 8 bytes of occupancy bitmap,
 * all freed before returning; the dump is about 2.6 bits per key.
 *
 * Errors (return value; `why` gets a sentence): SFS_CHD_BUILD_NOMEM (an
 * allocation failed), SFS_CHD_BUILD_EINVAL (nkeys 0 or above
 * SFS_CHD_MAX_KEYS), SFS_CHD_BUILD_FAILED (no seed worked: duplicate keys,
 * in practice). Nothing to free after an error.
 *
 * Facts from cmph 2.0.2 (src/chd_ph.c, compressed_seq.c, select.c,
 * bitbool.h, hash.c, jenkins_hash.c, cmph_structs.c); none of its code.
 */
#include "chd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEYS_PER_BUCKET 2 /* b; docs/build.md: why 2 and not cmph's 4 */
#define LOAD_FACTOR 0.99
#define MAX_PROBES (1u << 20)
#define DEFAULT_MAX_SEEDS 100
/* A bucket larger than this fails the seed (random keys: about 4 keys per
 * bucket, rarely above 30; this bounds the quadratic twin check). */
#define MAX_BUCKET 4096

/* x % d for x < 2^64, 1 <= d < 2^32, without a division: Barrett reduction
 * with m = floor((2^64 - 1) / d) >= 2^64 / d - 1, so that the quotient
 * estimate floor(x m / 2^64) is the quotient or one short (x < 2^64). */
typedef struct {
    uint64_t m;
    uint32_t d;
} fastmod_t;

static fastmod_t fastmod_of(uint32_t d)
{
    fastmod_t f = {UINT64_MAX / d, d};
    return f;
}

static inline uint32_t fastmod(fastmod_t f, uint64_t x)
{
    uint64_t q = (uint64_t)(((unsigned __int128)x * f.m) >> 64);
    uint64_t r = x - q * f.d;
    return (uint32_t)(r >= f.d ? r - f.d : r);
}

/* Deterministic Miller-Rabin for 32-bit numbers (bases 2, 7, 61). */
static uint32_t powmod(uint32_t b, uint32_t e, uint32_t m)
{
    uint64_t r = 1, x = b % m;
    while (e) {
        if (e & 1)
            r = r * x % m;
        x = x * x % m;
        e >>= 1;
    }
    return (uint32_t)r;
}

static int is_prime(uint32_t n)
{
    if (n < 2)
        return 0;
    static const uint32_t small[] = {2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 61};
    for (size_t i = 0; i < sizeof(small) / sizeof(small[0]); i++) {
        if (n == small[i])
            return 1;
        if (n % small[i] == 0)
            return 0;
    }
    uint32_t d = n - 1, s = 0;
    while (!(d & 1)) {
        d >>= 1;
        s++;
    }
    static const uint32_t bases[] = {2, 7, 61};
    for (int i = 0; i < 3; i++) {
        uint64_t x = powmod(bases[i], d, n);
        if (x == 1 || x == n - 1)
            continue;
        uint32_t r = 1;
        for (; r < s; r++) {
            x = x * x % n;
            if (x == n - 1)
                break;
        }
        if (r == s)
            return 0;
    }
    return 1;
}

int sfs_chd_build_shape(uint64_t nkeys, uint32_t *n, uint32_t *nbuckets)
{
    if (nkeys == 0 || nkeys > SFS_CHD_MAX_KEYS)
        return -1;
    uint64_t slots = (uint64_t)((double)nkeys / LOAD_FACTOR) + 1;
    if (slots % 2 == 0)
        slots++;
    while (!is_prime((uint32_t)slots))
        slots += 2;
    *n = (uint32_t)slots;
    *nbuckets = (uint32_t)(nkeys / KEYS_PER_BUCKET) + 1;
    return 0;
}

uint32_t sfs_chd_build_seed(uint32_t k)
{
    /* Any u32 is a valid jenkins seed (cmph draws rand() % nkeys); a mixed
     * counter keeps successive seeds unrelated. */
    uint32_t x = k * 0x9e3779b9u + 0x7f4a7c15u;
    x ^= x >> 16;
    x *= 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return x;
}

/* ---------------------------------------------------------------- search */

typedef struct {
    uint32_t f, h;
} item_t;

typedef struct {
    uint32_t n, nbuckets, nkeys;
    fastmod_t mod_n, mod_n1, mod_nb;
    uint32_t *bucket_of;  /* per key */
    item_t *key_items;    /* per key, key order */
    uint32_t *first;      /* per bucket: start of its items in items, then a cursor */
    uint32_t *order;      /* buckets in placement order */
    item_t *items;        /* grouped by bucket, in placement order */
    uint32_t nonempty;    /* buckets in order[] */
    uint64_t *occupied;   /* n bits */
    uint32_t *disp;       /* per bucket */
} build_t;

static inline int test_bit(const uint64_t *b, uint32_t i) { return (b[i >> 6] >> (i & 63)) & 1; }
static inline void set_bit(uint64_t *b, uint32_t i) { b[i >> 6] |= (uint64_t)1 << (i & 63); }
static inline void clear_bit(uint64_t *b, uint32_t i) { b[i >> 6] &= ~((uint64_t)1 << (i & 63)); }

/* Hash every key with seed, group the keys by bucket, order the buckets
 * (size descending, then number). Returns the largest bucket size, or
 * UINT32_MAX when out of memory. */
static uint32_t map_keys(build_t *b, uint32_t seed, sfs_chd_key_fn key_at, void *ctx,
                         uint32_t keylen)
{
    memset(b->first, 0, (size_t)b->nbuckets * sizeof(uint32_t));
    for (uint32_t i = 0; i < b->nkeys; i++) {
        uint32_t hl[3];
        sfs_chd_jenkins(seed, key_at(ctx, i), keylen, hl);
        uint32_t g = fastmod(b->mod_nb, hl[0]);
        b->bucket_of[i] = g;
        b->key_items[i].f = fastmod(b->mod_n, hl[1]);
        b->key_items[i].h = fastmod(b->mod_n1, hl[2]) + 1;
        b->first[g]++; /* size for now */
    }
    uint32_t max_size = 0;
    for (uint32_t g = 0; g < b->nbuckets; g++)
        if (b->first[g] > max_size)
            max_size = b->first[g];
    /* Per size: where its buckets start in order[] and in items[]. */
    uint64_t *bucket_at = calloc((size_t)max_size + 2, sizeof(uint64_t));
    uint64_t *item_at = calloc((size_t)max_size + 2, sizeof(uint64_t));
    if (!bucket_at || !item_at) {
        free(bucket_at);
        free(item_at);
        return UINT32_MAX;
    }
    for (uint32_t g = 0; g < b->nbuckets; g++)
        bucket_at[b->first[g]]++;
    uint64_t nb = 0, ni = 0;
    for (uint32_t s = max_size; s >= 1; s--) {
        uint64_t count = bucket_at[s];
        bucket_at[s] = nb;
        item_at[s] = ni;
        nb += count;
        ni += count * s;
    }
    for (uint32_t g = 0; g < b->nbuckets; g++) {
        uint32_t s = b->first[g];
        if (s == 0)
            continue;
        b->order[bucket_at[s]++] = g;
        b->first[g] = (uint32_t)item_at[s];
        item_at[s] += s;
    }
    b->nonempty = (uint32_t)nb;
    free(bucket_at);
    free(item_at);
    for (uint32_t i = 0; i < b->nkeys; i++)
        b->items[b->first[b->bucket_of[i]]++] = b->key_items[i];
    return max_size;
}

/* Slot of item it at probe (d0, d1). */
static inline uint32_t slot_at(const build_t *b, item_t it, uint32_t d0, uint32_t d1)
{
    return fastmod(b->mod_n, it.f + (uint64_t)it.h * d0 + d1);
}

/* Mark the slots of items it[from..s) at probe (d0, d1) if all are free
 * (and distinct); 1 when done, else 0 with nothing marked. */
static int take_rest(build_t *b, const item_t *it, uint32_t from, uint32_t s, uint32_t d0,
                     uint32_t d1)
{
    uint32_t k = from;
    for (; k < s; k++) {
        uint32_t p = slot_at(b, it[k], d0, d1);
        if (test_bit(b->occupied, p))
            break;
        set_bit(b->occupied, p);
    }
    if (k == s)
        return 1;
    while (k-- > from)
        clear_bit(b->occupied, slot_at(b, it[k], d0, d1));
    return 0;
}

/* Place the s items of one bucket at their smallest free probe; on success
 * their slots are marked and the probe is returned, else UINT32_MAX.
 *
 * The slots of the first two items follow the probes by additions only
 * (slot + h, minus n past the end) and are tested together: at high load
 * "both free" is rare, so the loop's branch is well predicted; the other
 * items are computed only then. */
static uint32_t place(build_t *b, const item_t *it, uint32_t s)
{
    const uint32_t n = b->n;
    const uint64_t *occ = b->occupied;
    const uint32_t h0 = it[0].h, h1 = s > 1 ? it[1].h : 0;
    uint32_t d0 = 0, d1 = 0, p0 = it[0].f, p1 = s > 1 ? it[1].f : 0;
    for (uint32_t probe = 0; probe < MAX_PROBES; probe++) {
        uint64_t busy = test_bit(occ, p0);
        if (s > 1)
            busy |= test_bit(occ, p1) | (p0 == p1);
        if (!busy) {
            set_bit(b->occupied, p0);
            if (s > 1)
                set_bit(b->occupied, p1);
            if (s <= 2 || take_rest(b, it, 2, s, d0, d1))
                return probe;
            clear_bit(b->occupied, p0);
            clear_bit(b->occupied, p1);
        }
        /* next probe: d0 + 1, or d1 + 1 when d0 wraps */
        p0 += h0;
        p0 -= p0 >= n ? n : 0;
        p1 += h1;
        p1 -= p1 >= n ? n : 0;
        if (++d0 == n) {
            d0 = 0;
            if (++d1 == n)
                return UINT32_MAX;
            p0 = slot_at(b, it[0], 0, d1);
            p1 = s > 1 ? slot_at(b, it[1], 0, d1) : 0;
        }
    }
    return UINT32_MAX;
}

/* 1 when two items of the bucket have the same (f, h). */
static int has_twins(const item_t *it, uint32_t s)
{
    for (uint32_t i = 1; i < s; i++)
        for (uint32_t j = 0; j < i; j++)
            if (it[i].f == it[j].f && it[i].h == it[j].h)
                return 1;
    return 0;
}

/* 0: every bucket placed; -1: this seed fails. */
static int search(build_t *b)
{
    memset(b->occupied, 0, (((size_t)b->n + 63) / 64) * 8);
    memset(b->disp, 0, (size_t)b->nbuckets * sizeof(uint32_t));
    uint32_t at = 0;
    for (uint32_t bi = 0; bi < b->nonempty; bi++) {
        uint32_t g = b->order[bi];
        uint32_t s = b->first[g] - at; /* first[g]: the end of its items now */
        const item_t *it = b->items + at;
        if (s > MAX_BUCKET || (s > 1 && has_twins(it, s)))
            return -1;
        uint32_t probe = place(b, it, s);
        if (probe == UINT32_MAX)
            return -1;
        b->disp[g] = probe;
        at += s;
    }
    return 0;
}

/* ---------------------------------------------------------------- encode */

static inline void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* OR value (len <= 32 bits) into the bit array at bit pos (zeroed before). */
static inline void put_bits(uint8_t *bits, uint64_t pos, uint32_t value, uint32_t len)
{
    uint64_t v = (uint64_t)value << (pos & 7);
    uint32_t nbits = len + (uint32_t)(pos & 7);
    for (uint8_t *p = bits + (pos >> 3); nbits > 0; p++, v >>= 8, nbits = nbits > 8 ? nbits - 8 : 0)
        *p |= (uint8_t)v;
}

static inline uint32_t ilog2(uint32_t x) { return x > 1 ? 31 - (uint32_t)__builtin_clz(x) : 0; }

/* The dump of a function whose displacements are disp (chd.h's layout). */
static uint8_t *encode(const build_t *b, uint32_t seed, size_t *dump_len)
{
    const uint32_t nb = b->nbuckets;
    uint64_t total_length = 0;
    for (uint32_t i = 0; i < nb; i++)
        total_length += b->disp[i] ? ilog2(b->disp[i] + 1) : 0;
    /* cmph's choice, but at least 1: with rem_r = 0 cmph's loader allocates
     * no length_rems words and its queries read one past them. */
    uint32_t rem_r = ilog2((uint32_t)(total_length / nb));
    if (rem_r == 0)
        rem_r = 1;
    uint64_t sel_m = total_length >> rem_r;
    uint64_t nbits = (uint64_t)nb + sel_m;
    uint64_t vec_bytes = ((nbits + 31) >> 5) * 4;
    uint64_t table_bytes = ((uint64_t)(nb >> 7) + 1) * 4;
    uint64_t sel_len = 8 + vec_bytes + table_bytes;
    uint64_t lr_bytes = (((uint64_t)nb * rem_r + 31) >> 5) * 4;
    uint64_t store_bytes = ((total_length + 31) >> 5) * 4;
    uint64_t cs_len = 16 + sel_len + lr_bytes + store_bytes;
    uint64_t len = 7 + 4 + 4 + 12 + 4 + cs_len + 8;
    uint8_t *dump = calloc(1, len);
    if (!dump)
        return NULL;
    uint8_t *p = dump;
    memcpy(p, "chd_ph", 7), p += 7;
    put32(p, b->n), p += 4;
    put32(p, 12), p += 4;
    memcpy(p, "jenkins", 8), p += 8;
    put32(p, seed), p += 4;
    put32(p, (uint32_t)cs_len), p += 4;
    put32(p, nb);
    put32(p + 4, rem_r);
    put32(p + 8, (uint32_t)total_length);
    put32(p + 12, (uint32_t)sel_len);
    uint8_t *sel = p + 16;
    put32(sel, nb);
    put32(sel + 4, (uint32_t)sel_m);
    uint8_t *vec = sel + 8, *table = vec + vec_bytes;
    uint8_t *rems = sel + sel_len, *store = rems + lr_bytes;
    uint32_t rem_mask = (1u << rem_r) - 1;
    uint64_t cum = 0;
    for (uint32_t i = 0; i < nb; i++) {
        uint32_t d = b->disp[i];
        if (d) {
            uint32_t l = ilog2(d + 1);
            put_bits(store, cum, d + 1 - (1u << l), l);
            cum += l;
        }
        if (rem_r)
            put_bits(rems, (uint64_t)i * rem_r, (uint32_t)(cum & rem_mask), rem_r);
        uint64_t one = (cum >> rem_r) + i;
        put_bits(vec, one, 1, 1);
        if ((i & 127) == 0)
            put32(table + 4 * (uint64_t)(i >> 7), (uint32_t)one);
    }
    p += cs_len;
    put32(p, b->n);
    put32(p + 4, nb);
    *dump_len = (size_t)len;
    return dump;
}

/* ----------------------------------------------------------------- build */

static void free_build(build_t *b)
{
    free(b->bucket_of);
    free(b->key_items);
    free(b->first);
    free(b->order);
    free(b->items);
    free(b->occupied);
    free(b->disp);
}

#define FAIL(code, ...)                                                                            \
    do {                                                                                           \
        if (why_size)                                                                              \
            snprintf(why, why_size, __VA_ARGS__);                                                  \
        rc = code;                                                                                 \
        goto out;                                                                                  \
    } while (0)

int sfs_chd_build(sfs_chd_key_fn key_at, void *ctx, uint64_t nkeys, uint32_t keylen,
                  const sfs_chd_build_opts_t *opts, sfs_chd_built_t *out, char *why,
                  size_t why_size)
{
    int rc;
    build_t b = {0};
    memset(out, 0, sizeof(*out));
    if (sfs_chd_build_shape(nkeys, &b.n, &b.nbuckets) < 0)
        FAIL(SFS_CHD_BUILD_EINVAL, "cannot hash %llu keys (1 to %llu)", (unsigned long long)nkeys,
             (unsigned long long)SFS_CHD_MAX_KEYS);
    b.nkeys = (uint32_t)nkeys;
    b.mod_n = fastmod_of(b.n);
    b.mod_n1 = fastmod_of(b.n - 1);
    b.mod_nb = fastmod_of(b.nbuckets);
    b.bucket_of = malloc(nkeys * sizeof(uint32_t));
    b.key_items = malloc(nkeys * sizeof(item_t));
    b.items = malloc(nkeys * sizeof(item_t));
    b.first = malloc((size_t)b.nbuckets * sizeof(uint32_t));
    b.order = malloc((size_t)b.nbuckets * sizeof(uint32_t));
    b.disp = malloc((size_t)b.nbuckets * sizeof(uint32_t));
    b.occupied = malloc((((size_t)b.n + 63) / 64) * 8);
    if (!b.bucket_of || !b.key_items || !b.items || !b.first || !b.order || !b.disp ||
        !b.occupied)
        FAIL(SFS_CHD_BUILD_NOMEM, "out of memory for %llu keys", (unsigned long long)nkeys);
    uint32_t first = opts ? opts->first_seed : 0;
    uint32_t tries = opts && opts->max_seeds ? opts->max_seeds : DEFAULT_MAX_SEEDS;
    for (uint32_t k = 0; k < tries; k++) {
        uint32_t seed = sfs_chd_build_seed(first + k);
        uint32_t max_size = map_keys(&b, seed, key_at, ctx, keylen);
        if (max_size == UINT32_MAX)
            FAIL(SFS_CHD_BUILD_NOMEM, "out of memory for %llu keys", (unsigned long long)nkeys);
        if (search(&b) < 0)
            continue;
        out->dump = encode(&b, seed, &out->dump_len);
        if (!out->dump)
            FAIL(SFS_CHD_BUILD_NOMEM, "out of memory for the dump");
        out->seed = seed;
        out->seeds_tried = k + 1;
        out->n = b.n;
        out->nbuckets = b.nbuckets;
        rc = SFS_CHD_BUILD_OK;
        goto out;
    }
    FAIL(SFS_CHD_BUILD_FAILED, "no perfect hash over %llu keys after %u seeds (duplicate keys?)",
         (unsigned long long)nkeys, tries);
out:
    free_build(&b);
    return rc;
}
