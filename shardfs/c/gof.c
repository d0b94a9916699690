/*
 * gof.c — ph::fmph::GOFunction of the Rust crate ph 0.10.0 (default type
 * parameters), read from its serialized bytes and evaluated in C: the
 * minimal perfect hash of a MOSAIC index. The API, the byte layout and the
 * contract are in ph.h; this file says where each step of the computation
 * comes from (paths relative to the crates' sources, as published on
 * crates.io; the Rust crate shardfs/c/ph/ checks this file against ph itself).
 *
 * The lookup, ph 0.10.0 src/fmph/gofunction.rs, GOFunction::get_stats:
 *
 *   groups_before = 0
 *   for level_nr in 0..L:
 *       hash  = hash_builder.hash_one(key, level_nr)            (64 bits)
 *       group = groups_before + group_nr(hash, level_size_groups)
 *       seed  = bits_per_seed.get_seed(group_seeds, group)       (4 bits)
 *       bit   = bits_per_group.bit_index_for_seed(hash, seed, group)
 *       if array bit `bit` is set: return rank(bit)   (ones before `bit`)
 *       groups_before += level_size_groups
 *   return None
 *
 * - group_nr (src/fmph/goindexing.rs) = seedable_hash 0.2.3 map64_to_64
 *   (src/map.rs): (hash * n) >> 64 in 128 bits (Lemire's multiply-shift),
 *   so the HIGH bits of the hash choose the group within the level.
 * - get_seed (src/seeds.rs, SeedSize for TwoToPowerBitsStatic<2>):
 *   (seeds[group / 16] >> ((group % 16) * 4)) & 15: group g's seed is
 *   nibble g, low nibble first, of the little-endian u64 words. `group` is
 *   the GLOBAL group number (groups_before included), both here and below.
 * - bit_index_for_seed (src/fmph/goindexing.rs, GroupSize; mul and
 *   hash_to_group of TwoToPowerBitsStatic<4>): 16 * group +
 *   (mix32((u32)hash ^ seed) & 15), mix32 being the 32-bit finalizer of
 *   that file (xor-shift 16, * 0x21f0aaad, xor-shift 15, * 0xd35a2d97,
 *   xor-shift 15), so the LOW 32 bits of the hash choose the bit within the
 *   group. (The generic GroupSize::hash_to_group is a multiply-shift
 *   instead; TwoToPowerBitsStatic overrides it with the mask used here.)
 * - rank: bitm 0.5.2 RankSelect101111::rank_unchecked (ph's ArrayWithRank),
 *   the number of ones in bits [0, bit) of the whole array, all levels
 *   together; our own structure below gives the same count.
 *
 * The hash: ph's BuildDefaultSeededHasher with no hasher feature of
 * seedable_hash 0.2.3 (src/lib.rs) is Seedable<BuildHasherDefault<
 * DefaultHasher>>; Seedable::build_hasher(seed) makes a DefaultHasher and
 * calls write_u64(seed); hash_one(key, seed) then calls key.hash(&mut h)
 * and h.finish(). With key: &[u8], Rust's `impl Hash for [T]`
 * (library/core/src/hash/mod.rs) does write_length_prefix(len) (by default
 * write_usize(len)) then hash_slice, which for u8 is write(bytes).
 * DefaultHasher (library/std/src/hash/random.rs) forwards only write and
 * write_str to core's SipHasher13, so write_u64 and write_usize are the
 * trait's defaults: write(&n.to_ne_bytes()). All writes go to one SipHash
 * stream (library/core/src/hash/sip.rs, Hasher::write buffers a partial
 * word in `tail`), so the hash is SipHash-1-3, keys (0, 0), of the message
 *
 *   level as 8 bytes LE || key length as 8 bytes LE || key bytes
 *
 * (LE and 8 bytes: a 64-bit little-endian writer, as every MOSAIC file's;
 * this code produces those hashes on any host). SipHash: J.-P. Aumasson and
 * D. J. Bernstein, "SipHash: a fast short-input PRF", INDOCRYPT 2012; the
 * 1-3 variant (1 compression round per 8-byte word, 3 finalization rounds)
 * and its details as in core::hash::sip (Sip13Rounds, Hasher::finish): the
 * last word holds the remaining 0..7 bytes and (total length mod 256) << 56;
 * finalization xors 0xff into v2.
 *
 * The rank structure (ours, not ph's): per 512-bit block of the array (8
 * words) one u64: bits 36..63 the ones before the block counted from the
 * start of its 2^28-bit superblock, bits 9..35 three 9-bit counts of the
 * ones in the block's first 2, 4 and 6 words, bits 0..8 zero; per 2^28-bit
 * superblock one u64, the ones before it. rank(i) = super + block + count
 * for the even word below i's word + popcount of one word when i's word is
 * odd + popcount of the masked word: O(1), two lookups, at most 2
 * popcounts. Size: 1/8 of the array plus 1/2^22.
 */
#include "ph.h"

#include <stdlib.h>
#include <string.h>

#define GOF_GROUP_BITS 16 /* bits per group: TwoToPowerBitsStatic<4> */
#define GOF_SEED_BITS 4   /* bits per group seed: TwoToPowerBitsStatic<2> */
#define SUPER_SHIFT 28    /* log2 of the bits per rank superblock */

struct sfs_gof {
    uint64_t levels;             /* L */
    uint64_t groups;             /* G, the sum of the level sizes */
    const uint64_t *level_sizes; /* L sizes, in groups, each >= 1 */
    const uint64_t *array;       /* ceil(G / 4) words: 16 bits per group */
    const uint64_t *seeds;       /* ceil(G / 16) words: 4 bits per group */
    const uint64_t *blocks;      /* one entry per 512 bits of the array */
    const uint64_t *supers;      /* one count per 2^28 bits of the array */
    size_t size;                 /* bytes allocated, this struct included */
    uint64_t words[];            /* everything above, in one allocation */
};

static inline uint64_t le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* ------------------------------------------------------------- SipHash-1-3 */

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

/* One SipRound (core::hash::sip, macro compress!). */
#define SIPROUND                                                                                   \
    do {                                                                                           \
        v0 += v1;                                                                                  \
        v2 += v3;                                                                                  \
        v1 = ROTL(v1, 13);                                                                         \
        v1 ^= v0;                                                                                  \
        v3 = ROTL(v3, 16);                                                                         \
        v3 ^= v2;                                                                                  \
        v0 = ROTL(v0, 32);                                                                         \
        v2 += v1;                                                                                  \
        v0 += v3;                                                                                  \
        v1 = ROTL(v1, 17);                                                                         \
        v1 ^= v2;                                                                                  \
        v3 = ROTL(v3, 21);                                                                         \
        v3 ^= v0;                                                                                  \
        v2 = ROTL(v2, 32);                                                                         \
    } while (0)

/* Absorb one 8-byte word: c = 1 round. */
#define SIPWORD(m)                                                                                 \
    do {                                                                                           \
        uint64_t m_ = (m);                                                                         \
        v3 ^= m_;                                                                                  \
        SIPROUND;                                                                                  \
        v0 ^= m_;                                                                                  \
    } while (0)

/* ph's hash of key[0..len) at `level`: SipHash-1-3 with keys (0, 0) of
 * level (u64 LE) || len (u64 LE) || key, see the top of this file. `key`
 * is not read when len is 0 (it may be NULL then). */
static inline uint64_t gof_hash(const uint8_t *key, size_t len, uint64_t level)
{
    /* the initial state for k0 = k1 = 0: "somepseudorandomlygeneratedbytes" */
    uint64_t v0 = 0x736f6d6570736575ULL, v1 = 0x646f72616e646f6dULL;
    uint64_t v2 = 0x6c7967656e657261ULL, v3 = 0x7465646279746573ULL;
    SIPWORD(level);
    SIPWORD((uint64_t)len);
    size_t i = 0;
    for (; len - i >= 8; i += 8)
        SIPWORD(le64(key + i));
    /* the last word: 0..7 remaining bytes, total length mod 256 on top */
    uint64_t b = ((uint64_t)len + 16) << 56;
    switch (len - i) {
    case 7: b |= (uint64_t)key[i + 6] << 48; /* fall through */
    case 6: b |= (uint64_t)key[i + 5] << 40; /* fall through */
    case 5: b |= (uint64_t)key[i + 4] << 32; /* fall through */
    case 4: b |= (uint64_t)key[i + 3] << 24; /* fall through */
    case 3: b |= (uint64_t)key[i + 2] << 16; /* fall through */
    case 2: b |= (uint64_t)key[i + 1] << 8;  /* fall through */
    case 1: b |= (uint64_t)key[i];           /* fall through */
    default: break;
    }
    SIPWORD(b);
    v2 ^= 0xff;
    SIPROUND; /* d = 3 rounds */
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---------------------------------------------------------------- lookup */

/* ph 0.10.0 src/fmph/goindexing.rs, mix32. */
static inline uint32_t mix32(uint32_t x)
{
    x = (x ^ (x >> 16)) * 0x21f0aaadU;
    x = (x ^ (x >> 15)) * 0xd35a2d97U;
    return x ^ (x >> 15);
}

/* seedable_hash 0.2.3 map64_to_64(hash, n): (hash * n) >> 64, < n. */
static inline uint64_t mulhi64(uint64_t a, uint64_t b)
{
#ifdef __SIZEOF_INT128__
    return (uint64_t)(((unsigned __int128)a * b) >> 64);
#else
    uint64_t al = (uint32_t)a, ah = a >> 32, bl = (uint32_t)b, bh = b >> 32;
    uint64_t ll = al * bl, lh = al * bh, hl = ah * bl, hh = ah * bh;
    uint64_t mid = (ll >> 32) + (uint32_t)lh + (uint32_t)hl;
    return hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
#endif
}

/* Ones in array bits [0, i), i < 64 * ceil(G / 4). */
static inline uint64_t rank(const sfs_gof_t *f, uint64_t i)
{
    uint64_t w = i >> 6, k = w & 7, e = f->blocks[w >> 3];
    uint64_t r = f->supers[i >> SUPER_SHIFT] + (e >> 36) + ((e >> (9 * (k >> 1))) & 0x1FF);
    if (k & 1)
        r += (uint64_t)__builtin_popcountll(f->array[w - 1]);
    return r + (uint64_t)__builtin_popcountll(f->array[w] & ((1ULL << (i & 63)) - 1));
}

int64_t sfs_gof_get(const sfs_gof_t *f, const uint8_t *key, size_t len)
{
    if (!f || (!key && len))
        return -1;
    uint64_t before = 0;
    for (uint64_t level = 0; level < f->levels; level++) {
        uint64_t size = f->level_sizes[level];
        uint64_t hash = gof_hash(key, len, level);
        /* group_nr: map64_to_64(hash, size) < size, so group < G */
        uint64_t group = before + mulhi64(hash, size);
        uint32_t seed = (uint32_t)(f->seeds[group >> 4] >> ((group & 15) << 2)) & 15;
        uint64_t bit = (group << 4) + (mix32((uint32_t)hash ^ seed) & 15);
        if (f->array[bit >> 6] >> (bit & 63) & 1)
            return (int64_t)rank(f, bit);
        before += size;
    }
    return -1;
}

/* ------------------------------------------------------------------ read */

/* binout 0.3.2 vbyte_read(input, 8 * 7) (src/lib.rs): the u64 VByte at
 * buf[*pos], *pos moved past it; -1 when it does not end before len. */
static int vbyte(const uint8_t *buf, size_t len, size_t *pos, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 56; shift += 7) {
        if (*pos >= len)
            return -1;
        uint8_t b = buf[(*pos)++];
        v |= (uint64_t)(b & 0x7F) << shift;
        if (b < 128) {
            *out = v;
            return 0;
        }
    }
    if (*pos >= len)
        return -1;
    *out = v | (uint64_t)buf[(*pos)++] << 56; /* the 9th byte, as is */
    return 0;
}

sfs_gof_t *sfs_gof_read(const uint8_t *buf, size_t len, size_t *used)
{
    if (!buf || len < 1 || buf[0] != GOF_GROUP_BITS)
        return NULL;
    /* pass 1, nothing allocated: the level count and sizes, G */
    size_t pos = 1;
    uint64_t levels, groups = 0, s;
    if (vbyte(buf, len, &pos, &levels) || levels > len - pos) /* >= 1 byte each */
        return NULL;
    size_t sizes_at = pos;
    for (uint64_t l = 0; l < levels; l++) {
        if (vbyte(buf, len, &pos, &s) || s == 0 || s > UINT64_MAX - groups)
            return NULL;
        groups += s;
    }
    /* read_bits(16 G) and read_bits(4 G): ceil(16 G / 64), ceil(4 G / 64)
     * words, computed without overflow */
    uint64_t array_words = groups / 4 + (groups % 4 != 0);
    uint64_t seed_words = groups / 16 + (groups % 16 != 0);
    if (array_words > (len - pos) / 8)
        return NULL;
    size_t array_at = pos;
    pos += (size_t)array_words * 8;
    if (pos >= len || buf[pos] != GOF_SEED_BITS)
        return NULL;
    pos++;
    if (seed_words > (len - pos) / 8)
        return NULL;
    size_t seeds_at = pos;
    pos += (size_t)seed_words * 8;

    /* pass 2: one allocation. Each count is bounded by len (levels <= len,
     * the word counts <= len / 8), so the sum cannot overflow. */
    uint64_t nblocks = array_words / 8 + (array_words % 8 != 0);
    uint64_t per_super = 1ULL << (SUPER_SHIFT - 9); /* blocks per superblock */
    uint64_t nsupers = nblocks ? nblocks / per_super + (nblocks % per_super != 0) : 1;
    uint64_t nwords = levels + array_words + seed_words + nblocks + nsupers;
    if (nwords > (SIZE_MAX - sizeof(sfs_gof_t)) / 8)
        return NULL;
    size_t size = sizeof(sfs_gof_t) + (size_t)nwords * 8;
    sfs_gof_t *f = malloc(size);
    if (!f)
        return NULL;
    uint64_t *sizes = f->words, *array = sizes + levels, *seeds = array + array_words;
    uint64_t *blocks = seeds + seed_words, *supers = blocks + nblocks;
    f->levels = levels;
    f->groups = groups;
    f->level_sizes = sizes;
    f->array = array;
    f->seeds = seeds;
    f->blocks = blocks;
    f->supers = supers;
    f->size = size;
    for (uint64_t l = 0; l < levels; l++)
        vbyte(buf, len, &sizes_at, &sizes[l]); /* checked in pass 1 */
    for (uint64_t w = 0; w < array_words; w++)
        array[w] = le64(buf + array_at + 8 * w);
    for (uint64_t w = 0; w < seed_words; w++)
        seeds[w] = le64(buf + seeds_at + 8 * w);

    /* the rank structure (see the top of this file) */
    uint64_t ones = 0;
    supers[0] = 0;
    for (uint64_t b = 0; b < nblocks; b++) {
        if (b % per_super == 0)
            supers[b / per_super] = ones;
        uint64_t e = (ones - supers[b / per_super]) << 36, c = 0;
        for (uint64_t k = 0; k < 8 && 8 * b + k < array_words; k++) {
            if (k == 2 || k == 4 || k == 6)
                e |= c << (9 * (k >> 1));
            c += (uint64_t)__builtin_popcountll(array[8 * b + k]);
        }
        blocks[b] = e;
        ones += c;
    }
    if (used)
        *used = pos;
    return f;
}

void sfs_gof_free(sfs_gof_t *f)
{
    free(f);
}

uint64_t sfs_gof_size_bytes(const sfs_gof_t *f)
{
    return f ? (uint64_t)f->size : 0;
}
