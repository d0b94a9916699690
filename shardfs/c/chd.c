/*
 * chd.c — in-place, bounds-checked evaluation of a cmph CHD_PH dump.
 * See chd.h for the layout and the query.
 */
#include "chd.h"

#include <stdio.h>
#include <string.h>

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---------------------------------------------------------------- select */

/* 64 bits of the bit vector starting at byte `byte` (zero past the end). */
static inline uint64_t bits64(const sfs_chd_t *c, uint64_t byte)
{
    uint64_t w = 0;
    if (byte + 8 <= c->bits_bytes) {
        memcpy(&w, c->bits + byte, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
        w = __builtin_bswap64(w);
#endif
    } else {
        for (uint64_t i = 0; byte + i < c->bits_bytes && i < 8; i++)
            w |= (uint64_t)c->bits[byte + i] << (8 * i);
    }
    return w;
}

/* Position of the `skip`-th one bit (0-based) at or after bit `pos`, or
 * UINT64_MAX if there is none below nbits. */
static uint64_t next_ones(const sfs_chd_t *c, uint64_t pos, uint32_t skip)
{
    uint64_t byte = (pos >> 3);
    uint64_t w = bits64(c, byte) & (~(uint64_t)0 << (pos & 7));
    for (;;) {
        uint32_t ones = (uint32_t)__builtin_popcountll(w);
        if (skip < ones) {
            while (skip--)
                w &= w - 1;
            uint64_t at = byte * 8 + (uint64_t)__builtin_ctzll(w);
            return at < c->nbits ? at : UINT64_MAX;
        }
        skip -= ones;
        byte += 8;
        if (byte * 8 >= c->nbits)
            return UINT64_MAX;
        w = bits64(c, byte);
    }
}

/* Position of one number k (0-based), k < nbuckets. */
static inline uint64_t select1(const sfs_chd_t *c, uint32_t k)
{
    uint64_t base = le32(c->select_table + 4 * (uint64_t)(k >> 7));
    return next_ones(c, base, k & 127);
}

/* Bits [pos, pos+len) of a LE u32 word array, len <= 32; caller bounds. */
static inline uint32_t get_bits(const uint8_t *words, uint64_t pos, uint32_t len)
{
    if (len == 0)
        return 0;
    uint64_t word = pos >> 5;
    uint32_t shift = (uint32_t)(pos & 31);
    uint64_t v = le32(words + 4 * word) >> shift;
    if (shift + len > 32)
        v |= (uint64_t)le32(words + 4 * (word + 1)) << (32 - shift);
    return (uint32_t)(v & ((len == 32) ? 0xffffffffu : ((1u << len) - 1)));
}

/* End (exclusive, in bits of store) of the code of bucket i, given the
 * position of one number i in the select vector. */
static inline uint64_t code_end(const sfs_chd_t *c, uint32_t i, uint64_t one_pos)
{
    uint64_t high = one_pos - i; /* zeros before it */
    uint64_t rem = get_bits(c->length_rems, (uint64_t)i * c->rem_r, c->rem_r);
    return (high << c->rem_r) + rem;
}

/* Displacement of bucket g, or UINT64_MAX when inconsistent. */
static uint64_t displacement(const sfs_chd_t *c, uint32_t g)
{
    uint64_t start = 0, end, pos;
    if (g == 0) {
        pos = select1(c, 0);
        if (pos == UINT64_MAX)
            return UINT64_MAX;
    } else {
        uint64_t prev = select1(c, g - 1);
        if (prev == UINT64_MAX)
            return UINT64_MAX;
        start = code_end(c, g - 1, prev);
        pos = next_ones(c, prev + 1, 0);
        if (pos == UINT64_MAX)
            return UINT64_MAX;
    }
    end = code_end(c, g, pos);
    if (end < start || end > c->total_length || end - start > 31)
        return UINT64_MAX;
    uint32_t len = (uint32_t)(end - start);
    if (len == 0)
        return 0;
    return (uint64_t)get_bits(c->store, start, len) + ((1u << len) - 1);
}

uint32_t sfs_chd_search(const sfs_chd_t *c, const uint8_t *key, uint32_t keylen)
{
    uint32_t hl[3];
    sfs_chd_jenkins(c->seed, key, keylen, hl);
    uint32_t g = hl[0] % c->nbuckets;
    uint32_t f = hl[1] % c->n;
    uint32_t h = hl[2] % (c->n - 1) + 1;
    uint64_t d = displacement(c, g);
    if (d == UINT64_MAX)
        return SFS_CHD_FAIL;
    uint32_t disp = (uint32_t)d;
    uint32_t probe0 = disp % c->n, probe1 = disp / c->n;
    return (uint32_t)((f + (uint64_t)h * probe0 + probe1) % c->n);
}

/* ----------------------------------------------------------------- parse */

#define ALGO "chd_ph"
#define ALGO_LEN 7 /* with its NUL */
#define HASHNAME "jenkins"
#define HL_LEN 12  /* "jenkins\0" + seed */

uint64_t sfs_chd_dump_size(const uint8_t *buf, uint64_t avail)
{
    /* name(7) size(4) hl_len(4) hl(12) cs_len(4) = 31 */
    if (avail < 31 || memcmp(buf, ALGO, ALGO_LEN) != 0 || le32(buf + 11) != HL_LEN)
        return 0;
    return 31 + (uint64_t)le32(buf + 27) + 8;
}

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        snprintf(why, why_size, __VA_ARGS__);                                                      \
        return -1;                                                                                 \
    } while (0)

/* The fields around the compressed sequence: algorithm name, slot count,
 * hash state and seed, the sequence's length, n and nbuckets. Sets seed,
 * n, nbuckets and dump_size; the sequence is the next *cs_len bytes at 31. */
static int parse_frame(sfs_chd_t *c, const uint8_t *buf, uint64_t len, uint64_t *cs_len,
                       char *why, size_t why_size)
{
    if (len < 31)
        FAIL("hash section is %llu bytes, too short for a CHD_PH function", (unsigned long long)len);
    if (memcmp(buf, ALGO, ALGO_LEN) != 0)
        FAIL("hash section does not start with the algorithm name \"chd_ph\"");
    uint32_t size = le32(buf + 7);
    if (le32(buf + 11) != HL_LEN || memcmp(buf + 15, HASHNAME, sizeof(HASHNAME)) != 0)
        FAIL("hash section: hash state is not a 12-byte jenkins state");
    c->seed = le32(buf + 23);
    *cs_len = le32(buf + 27);
    uint64_t total = 31 + *cs_len + 8;
    if (total > len)
        FAIL("hash section: compressed sequence length %llu runs past the end of the file",
             (unsigned long long)*cs_len);
    if (*cs_len < 24)
        FAIL("hash section: compressed sequence length %llu too short",
             (unsigned long long)*cs_len);
    uint32_t n = le32(buf + 31 + *cs_len), nbuckets = le32(buf + 31 + *cs_len + 4);
    if (n != size)
        FAIL("hash section: slot counts disagree (%u and %u)", size, n);
    if (n < 2)
        FAIL("hash section: %u slots, at least 2 expected", n);
    c->n = n;
    c->nbuckets = nbuckets;
    c->dump_size = total;
    return 0;
}

/* The compressed sequence's own fields and the sizes of its parts (select
 * structure, length remainders, store) against its length; sets the rest
 * of c. */
static int parse_sequence(sfs_chd_t *c, const uint8_t *cs, uint64_t cs_len, char *why,
                          size_t why_size)
{
    uint32_t cs_n = le32(cs), rem_r = le32(cs + 4), total_length = le32(cs + 8);
    uint64_t sel_len = le32(cs + 12);
    if (c->nbuckets == 0 || cs_n != c->nbuckets)
        FAIL("hash section: bucket counts disagree (%u and %u)", cs_n, c->nbuckets);
    if (rem_r > 31)
        FAIL("hash section: remainder width %u bits, at most 31 expected", rem_r);
    if (16 + sel_len > cs_len || sel_len < 8)
        FAIL("hash section: select structure length %llu does not fit", (unsigned long long)sel_len);
    const uint8_t *sel = cs + 16;
    uint32_t sel_n = le32(sel), sel_m = le32(sel + 4);
    if (sel_n != cs_n)
        FAIL("hash section: select structure holds %u values, %u expected", sel_n, cs_n);
    if (sel_m != (total_length >> rem_r))
        FAIL("hash section: select range %u disagrees with total length %u", sel_m, total_length);
    uint64_t nbits = (uint64_t)sel_n + sel_m;
    uint64_t vec_bytes = ((nbits + 31) >> 5) * 4;
    uint64_t table_bytes = ((uint64_t)(sel_n >> 7) + 1) * 4;
    if (sel_len != 8 + vec_bytes + table_bytes)
        FAIL("hash section: select structure is %llu bytes, %llu expected",
             (unsigned long long)sel_len, (unsigned long long)(8 + vec_bytes + table_bytes));
    uint64_t lr_words = ((uint64_t)cs_n * rem_r + 31) >> 5;
    uint64_t store_words = ((uint64_t)total_length + 31) >> 5;
    if (cs_len != 16 + sel_len + 4 * lr_words + 4 * store_words)
        FAIL("hash section: compressed sequence is %llu bytes, %llu expected",
             (unsigned long long)cs_len,
             (unsigned long long)(16 + sel_len + 4 * lr_words + 4 * store_words));

    c->rem_r = rem_r;
    c->total_length = total_length;
    c->nbits = nbits;
    c->bits = sel + 8;
    c->bits_bytes = vec_bytes;
    c->select_table = sel + 8 + vec_bytes;
    c->length_rems = cs + 16 + sel_len;
    c->length_rems_words = lr_words;
    c->store = c->length_rems + 4 * lr_words;
    c->store_words = store_words;
    return 0;
}

/* The select vector must hold exactly nbuckets ones below nbits, and the
 * select table must give the position of every 128th one: then every
 * query stays inside the vector. The code of every bucket must end at or
 * after the previous one's end, at most 31 bits later and inside the
 * store: then displacement() cannot fail, and every key maps to a slot (as
 * shard.h promises for sfs_slot_of). One pass, 64 bits at a time. */
static int check_codes(const sfs_chd_t *c, char *why, size_t why_size)
{
    const uint64_t nbits = c->nbits, sel_n = c->nbuckets;
    uint64_t ones = 0, prev_end = 0;
    for (uint64_t byte = 0; byte * 8 < nbits; byte += 8) {
        uint64_t w = bits64(c, byte);
        uint64_t valid = nbits - byte * 8;
        if (valid < 64)
            w &= ((uint64_t)1 << valid) - 1;
        while (w) {
            uint64_t at = byte * 8 + (uint64_t)__builtin_ctzll(w);
            if (ones < sel_n) {
                if ((ones & 127) == 0 && le32(c->select_table + 4 * (ones >> 7)) != at)
                    FAIL("hash section: select table entry %llu is wrong",
                         (unsigned long long)(ones >> 7));
                uint64_t end = code_end(c, (uint32_t)ones, at);
                if (end < prev_end || end - prev_end > 31 || end > c->total_length)
                    FAIL("hash section: the displacement code of bucket %llu is inconsistent",
                         (unsigned long long)ones);
                prev_end = end;
            }
            ones++;
            w &= w - 1;
        }
    }
    if (ones != sel_n)
        FAIL("hash section: select vector holds %llu ones, %u expected", (unsigned long long)ones,
             (uint32_t)sel_n);
    return 0;
}

int sfs_chd_parse(sfs_chd_t *c, const uint8_t *buf, uint64_t len, char *why, size_t why_size)
{
    uint64_t cs_len;
    memset(c, 0, sizeof(*c));
    if (parse_frame(c, buf, len, &cs_len, why, why_size) < 0 ||
        parse_sequence(c, buf + 31, cs_len, why, why_size) < 0 ||
        check_codes(c, why, why_size) < 0)
        return -1;
    return 0;
}

int sfs_chd_parse_trusted(sfs_chd_t *c, const uint8_t *buf, uint64_t len)
{
    char why[8];
    uint64_t cs_len;
    memset(c, 0, sizeof(*c));
    if (parse_frame(c, buf, len, &cs_len, why, sizeof(why)) < 0 ||
        parse_sequence(c, buf + 31, cs_len, why, sizeof(why)) < 0)
        return -1;
    return 0;
}
