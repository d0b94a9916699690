/*
 * chd.h — evaluate a CHD_PH perfect hash function straight from its cmph_dump
 * bytes, with every length and position checked against the buffer.
 *
 * Why not cmph_load(): it copies the function to the heap and trusts every
 * length in the dump, so a corrupt shard could make it allocate without bound
 * or read out of bounds. Here the dump is parsed in place (mmap'ed), checked
 * completely once, and each query is bounds-checked again; cmph itself is used
 * only to build the function (writer.c), and tests compare both evaluators.
 *
 * Layout of the dump (cmph 2.0.2, chd_ph.c, cmph_structs.c, hash.c,
 * compressed_seq.c, select.c; all integers are little-endian u32 as written
 * by x86-64 hosts):
 *
 *   "chd_ph\0"                          algorithm name
 *   size                                number of slots (n)
 *   hl_len, "jenkins\0" seed            hash state (hl_len = 12)
 *   cs_len, compressed sequence:        the displacement of each bucket
 *       cs_n (= nbuckets), rem_r, total_length,
 *       sel_len, select: sel_n (= cs_n), sel_m, bits[(sel_n+sel_m+31)/32],
 *                        select_table[sel_n/128 + 1]
 *       length_rems[(cs_n*rem_r+31)/32], store[(total_length+31)/32]
 *   n, nbuckets
 *
 * Query of a 32-byte key (chd_ph_search): (h0,h1,h2) = jenkins(seed, key);
 * g = h0 % nbuckets, f = h1 % n, h = h2 % (n-1) + 1; d = displacement(g);
 * slot = (f + h * (d % n) + d / n) % n.
 */
#ifndef SHARDFS_CHD_H
#define SHARDFS_CHD_H

#include <stddef.h>
#include <stdint.h>

#define SFS_CHD_FAIL UINT32_MAX

typedef struct sfs_chd {
    uint32_t seed;         /* jenkins seed */
    uint32_t n;            /* slots (bins), >= 2 */
    uint32_t nbuckets;     /* buckets, >= 1 */
    uint32_t rem_r;        /* bits of each length remainder, <= 31 */
    uint32_t total_length; /* bits in store */
    uint64_t nbits;        /* bits in the select bit vector: sel_n + sel_m */
    const uint8_t *bits;   /* select bit vector, bit i = byte i/8, bit i%8 */
    uint64_t bits_bytes;
    const uint8_t *select_table; /* u32 LE: position of one number 128*j */
    const uint8_t *length_rems;  /* u32 LE words */
    uint64_t length_rems_words;
    const uint8_t *store;        /* u32 LE words */
    uint64_t store_words;
    uint64_t dump_size;          /* bytes of the whole dump */
} sfs_chd_t;

/* Bytes of the dump whose first `avail` bytes are at buf (avail >= 31 needed):
 * 39 + cs_len. Returns 0 when the prefix is not a CHD_PH dump. */
uint64_t sfs_chd_dump_size(const uint8_t *buf, uint64_t avail);

/* Parse and fully validate the dump in buf[0..len). On failure returns -1 and
 * writes a reason into why (no allocation, no read outside buf). */
int sfs_chd_parse(sfs_chd_t *chd, const uint8_t *buf, uint64_t len, char *why, size_t why_size);

/* Parse the dump in buf[0..len) without the O(buckets) check of its
 * displacement codes (check_codes): O(1), for a dump parsed in full once
 * already (a shardfs lookup pack's copy, lookup_pack.h). Every query stays
 * inside buf whatever the codes hold; a wrong code gives a wrong slot or
 * SFS_CHD_FAIL. 0, or -1 when the frame or sequence lengths are wrong. */
int sfs_chd_parse_trusted(sfs_chd_t *chd, const uint8_t *buf, uint64_t len);

/* Slot of a key in [0, n), or SFS_CHD_FAIL if the structure proves
 * inconsistent for this query (impossible after a successful parse). */
uint32_t sfs_chd_search(const sfs_chd_t *chd, const uint8_t *key, uint32_t keylen);

/* cmph's jenkins hash vector (Bob Jenkins' 1996 hash, seeded) of a key:
 * the evaluator's and the builder's, inline because it is most of a query
 * and a good part of a build. Key bytes are taken as unsigned (cmph 2.0.2
 * as built by Debian loads each with a zero extension; tests/c compare
 * every slot with cmph_search). */
#define SFS_JENKINS_MIX(a, b, c)                                                                   \
    do {                                                                                           \
        a -= b; a -= c; a ^= (c >> 13);                                                            \
        b -= c; b -= a; b ^= (a << 8);                                                             \
        c -= a; c -= b; c ^= (b >> 13);                                                            \
        a -= b; a -= c; a ^= (c >> 12);                                                            \
        b -= c; b -= a; b ^= (a << 16);                                                            \
        c -= a; c -= b; c ^= (b >> 5);                                                             \
        a -= b; a -= c; a ^= (c >> 3);                                                             \
        b -= c; b -= a; b ^= (a << 10);                                                            \
        c -= a; c -= b; c ^= (b >> 15);                                                            \
    } while (0)
#define SFS_JENKINS_BYTE(i) ((uint32_t)k[i])

static inline void sfs_chd_jenkins(uint32_t seed, const uint8_t *k, uint32_t keylen,
                                   uint32_t out[3])
{
#define B_ SFS_JENKINS_BYTE
    uint32_t a = 0x9e3779b9, b = 0x9e3779b9, c = seed;
    uint32_t len = keylen;

    while (len >= 12) {
        a += B_(0) + (B_(1) << 8) + (B_(2) << 16) + (B_(3) << 24);
        b += B_(4) + (B_(5) << 8) + (B_(6) << 16) + (B_(7) << 24);
        c += B_(8) + (B_(9) << 8) + (B_(10) << 16) + (B_(11) << 24);
        SFS_JENKINS_MIX(a, b, c);
        k += 12;
        len -= 12;
    }
    c += keylen;
    switch (len) { /* every case falls through */
    case 11: c += B_(10) << 24; /* fall through */
    case 10: c += B_(9) << 16;  /* fall through */
    case 9: c += B_(8) << 8;    /* fall through */
    case 8: b += B_(7) << 24;   /* fall through */
    case 7: b += B_(6) << 16;   /* fall through */
    case 6: b += B_(5) << 8;    /* fall through */
    case 5: b += B_(4);         /* fall through */
    case 4: a += B_(3) << 24;   /* fall through */
    case 3: a += B_(2) << 16;   /* fall through */
    case 2: a += B_(1) << 8;    /* fall through */
    case 1: a += B_(0);         /* fall through */
    default: break;
    }
    SFS_JENKINS_MIX(a, b, c);
    out[0] = a;
    out[1] = b;
    out[2] = c;
#undef B_
}

/* ----------------------------------------------------------------- build
 * chd_build.c: a CHD_PH function over a key set, written as cmph_dump()
 * bytes without cmph (shapes, encoding, seeds and errors: its header). */

#define SFS_CHD_MAX_KEYS 4000000000u /* n = keys / 0.99 + ... must fit a u32 */

enum {
    SFS_CHD_BUILD_OK = 0,
    SFS_CHD_BUILD_NOMEM = -1,  /* an allocation failed */
    SFS_CHD_BUILD_EINVAL = -2, /* 0 keys, or more than SFS_CHD_MAX_KEYS */
    SFS_CHD_BUILD_FAILED = -3, /* no seed worked (duplicate keys?) */
};

/* Key i (0 <= i < nkeys) of the set: keylen bytes, valid until the next call. */
typedef const uint8_t *(*sfs_chd_key_fn)(void *ctx, uint32_t i);

typedef struct sfs_chd_build_opts {
    uint32_t first_seed; /* index in the seed sequence of the first seed tried (0) */
    uint32_t max_seeds;  /* seeds tried before SFS_CHD_BUILD_FAILED (0: 100) */
} sfs_chd_build_opts_t;

typedef struct sfs_chd_built {
    uint8_t *dump;        /* malloc'ed; the caller frees it */
    size_t dump_len;      /* bytes */
    uint32_t seed;        /* the jenkins seed of the function */
    uint32_t seeds_tried; /* 1 when the first seed worked */
    uint32_t n, nbuckets; /* slots and buckets */
} sfs_chd_built_t;

/* Build over nkeys distinct keys; opts may be NULL. Returns SFS_CHD_BUILD_*,
 * with a sentence in why on failure (nothing to free then). */
int sfs_chd_build(sfs_chd_key_fn key_at, void *ctx, uint64_t nkeys, uint32_t keylen,
                  const sfs_chd_build_opts_t *opts, sfs_chd_built_t *out, char *why,
                  size_t why_size);

/* Slots (n) and buckets of the function sfs_chd_build makes over nkeys keys
 * (as cmph 2.0.2 sizes them for load factor 0.99 and b = 2). -1 if nkeys
 * is out of range. */
int sfs_chd_build_shape(uint64_t nkeys, uint32_t *n, uint32_t *nbuckets);

/* Seed number k of the builder's sequence. */
uint32_t sfs_chd_build_seed(uint32_t k);

#endif
