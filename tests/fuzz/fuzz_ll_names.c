/*
 * fuzz_ll_names.c — libFuzzer harness for what the request path parses of
 * what a user controls (ll_names.c): directory layouts, inode numbers,
 * names looked up, read ranges.
 *
 * Input format (bytes past the end read as 0):
 *   byte 0     the layout's depth and how its lengths are read:
 *              bit 6 set: depth = {-1, 8, 9, 15, 16, INT_MAX, INT_MIN, -8}[b & 7]
 *              (refused), else depth = b & 7; bit 7 set: bytes 1..7 are the
 *              cumulative hex lengths as signed bytes, else each adds b % 4
 *              to the previous one (0 does not grow: refused; past 7: refused)
 *   bytes 1..7 the cumulative hex lengths nhex[0..7)
 *   then up to MAX_OPS operations, each a tag byte (tag % 5) and its bytes:
 *     0 INODE   u64 LE: an inode number
 *     1 EDGE    sel, delta: edges[sel % n] + (int8)delta, edges being 0, 1,
 *               2, 3, every base and end of the layout's depths, 2^32 - 1,
 *               2^32, 2^32 + 1, bit 62 (alone, with shard bits), bit 63,
 *               UINT64_MAX...
 *     2 OBJECT  u32 number, u32 slot: the inode (number + 1) << 32 | slot
 *     3 NAME    dsel, psel, mode, len, then the name's bytes (see do_name):
 *               raw bytes or hex of bytes, 0..96 or 62..66 characters,
 *               the directory's prefix spelled at its start or not, one
 *               character upper-cased, one byte poked (NUL included)
 *     4 READ    three (selector, u64) values: size, offset, want, each raw
 *               or an edge (0, 1, 2^63, UINT64_MAX, size +- 1,
 *               size - offset +- 1, UINT64_MAX - offset...)
 * Every input also runs a fixed sweep: the inodes 0..299 (root, every
 * directory of 0:2 and the first ones past), every edge +- 2, and 16
 * inodes spread over each depth's range.
 *
 * Invariants checked, against a reference written here (ll_names.h):
 *  - sfs_ll_layout_init returns 0 exactly when 0 <= depth <= 7 and the
 *    lengths grow strictly from >= 1 to <= 7, and then fills depth, nhex
 *    and bases as documented (bases[1] = 2, bases[d+1] = bases[d] +
 *    16^nhex[d]); the ranges [bases[d], bases[d] + 16^nhex[d]) of the
 *    depths and the root never overlap and end at or below 2^32;
 *  - sfs_ll_split_dir: 0 with prefix 0 for the root; d with prefix
 *    ino - bases[d] for every ino of depth d's range; -1 for anything else
 *    (0, object inodes, database inodes, inodes past the last range);
 *  - sfs_ll_object_inode: 0 below 2^32 and with bit 62 set, else 1 with
 *    number and slot such that ((number + 1) << 32 | slot) == ino; an
 *    inode is never both a directory and an object;
 *  - sfs_ll_object_name: -1 exactly when strnlen(name, 65) != 64; 1 only
 *    for 64 lowercase hex digits whose key re-encodes to the name, at the
 *    root, or at depth == layout depth (a leaf) when its first nhex[depth]
 *    digits spell the prefix; 0 otherwise. For a valid name the leaf
 *    bases[D] + (its first nhex[D] digits) is a directory of depth D where
 *    the name is found, and not in a neighbouring leaf nor a level above;
 *    the name is never read past its NUL (exact-size heap copy);
 *  - sfs_ll_read_length: 0 at or past the end, else min(want, size -
 *    offset) (computed here in 128 bits as min(offset + want, size) -
 *    offset): never above want nor size - offset.
 * All work is bounded: at most MAX_OPS operations, the sweep is fixed.
 */
#include "fuzz_common.h"

#include <limits.h>

#include "ll_names.h"

#define MAX_OPS 512
#define NAME_BUF 128
#define SWEEP_LOW 300

/* ------------------------------------------------------------ input cursor */

typedef struct {
    const uint8_t *p;
    size_t n, at;
} cursor_t;

static uint8_t take8(cursor_t *c) { return c->at < c->n ? c->p[c->at++] : 0; }

static uint64_t take_le(cursor_t *c, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)take8(c) << (8 * i);
    return v;
}

/* --------------------------------------------------------- the reference */

typedef struct {
    int valid, depth;
    int nhex[SFS_LL_MAX_DEPTH + 1];     /* nhex[d], d = 1..depth (nhex[0] = 0) */
    uint64_t base[SFS_LL_MAX_DEPTH + 2]; /* first inode of depth d */
    uint64_t span[SFS_LL_MAX_DEPTH + 1]; /* 16^nhex[d] */
} ref_layout_t;

static uint64_t pow16(int n)
{
    uint64_t v = 1;
    for (int i = 0; i < n; i++)
        v *= 16;
    return v;
}

static void ref_layout(ref_layout_t *r, const int *nhex, int depth)
{
    memset(r, 0, sizeof(*r));
    r->valid = depth >= 0 && depth <= SFS_LL_MAX_DEPTH;
    if (!r->valid)
        return;
    int prev = 0;
    for (int i = 0; i < depth; i++) {
        if (!(nhex[i] > prev && nhex[i] <= 7))
            r->valid = 0;
        prev = nhex[i];
    }
    if (!r->valid)
        return;
    r->depth = depth;
    uint64_t next = 2;
    for (int d = 1; d <= depth; d++) {
        r->nhex[d] = nhex[d - 1];
        r->span[d] = pow16(r->nhex[d]);
        r->base[d] = next;
        next += r->span[d];
    }
    r->base[depth + 1] = next; /* one past the last directory */
}

static int ref_split_dir(const ref_layout_t *r, uint64_t ino, uint64_t *prefix)
{
    if (ino == 1) {
        *prefix = 0;
        return 0;
    }
    for (int d = 1; d <= r->depth; d++) {
        if (ino >= r->base[d] && ino < r->base[d] + r->span[d]) {
            *prefix = ino - r->base[d];
            return d;
        }
    }
    return -1;
}

static int ref_object_inode(uint64_t ino, uint32_t *number, uint32_t *slot)
{
    if (ino < (UINT64_C(1) << 32) || (ino >> 62 & 1))
        return 0;
    *number = (uint32_t)((ino >> 32) - 1);
    *slot = (uint32_t)(ino & 0xffffffffu);
    return 1;
}

static const char LOWER_HEX[] = "0123456789abcdef";

static int lower_hex_value(char ch)
{
    const char *at = ch ? strchr(LOWER_HEX, ch) : NULL;
    return at ? (int)(at - LOWER_HEX) : -1;
}

/* Any-case hex digit value, 0 for anything else (to derive prefixes). */
static uint64_t loose_hex_value(char ch)
{
    if (ch >= 'A' && ch <= 'F')
        ch = (char)(ch - 'A' + 'a');
    int v = lower_hex_value(ch);
    return v < 0 ? 0 : (uint64_t)v;
}

/* `v` (< 16^n) spelled in n lowercase hex digits (no NUL). */
static void spell(char *out, int n, uint64_t v)
{
    for (int j = n - 1; j >= 0; j--, v /= 16)
        out[j] = LOWER_HEX[v % 16];
}

static int ref_object_name(const ref_layout_t *r, int depth, uint64_t prefix, const char *name,
                           uint8_t key[SFS_KEY_SIZE])
{
    size_t len = 0;
    while (len <= SFS_LL_NAME_SIZE && name[len])
        len++;
    if (len != SFS_LL_NAME_SIZE)
        return -1;
    for (int i = 0; i < SFS_LL_NAME_SIZE; i++)
        if (lower_hex_value(name[i]) < 0)
            return 0;
    for (int i = 0; i < SFS_KEY_SIZE; i++)
        key[i] = (uint8_t)(lower_hex_value(name[2 * i]) * 16 + lower_hex_value(name[2 * i + 1]));
    if (depth == 0)
        return 1;
    if (depth != r->depth)
        return 0;
    int n = r->nhex[depth];
    if (prefix >= r->span[depth])
        return 0;
    char want[SFS_LL_MAX_DEPTH + 1];
    spell(want, n, prefix);
    return memcmp(name, want, (size_t)n) == 0;
}

static size_t ref_read_length(uint64_t size, uint64_t offset, size_t want)
{
    unsigned __int128 end = (unsigned __int128)offset + want;
    if (end > size)
        end = size;
    return end > offset ? (size_t)(end - offset) : 0;
}

/* ------------------------------------------------------------- the checks */

static sfs_ll_layout_t L;
static ref_layout_t R;

static void check_inode(uint64_t ino)
{
    uint64_t prefix = UINT64_MAX, want_prefix = UINT64_MAX;
    if (R.valid) {
        int d = sfs_ll_split_dir(&L, ino, &prefix);
        int want = ref_split_dir(&R, ino, &want_prefix);
        FUZZ_ASSERT(d == want);
        if (d >= 0) {
            FUZZ_ASSERT(prefix == want_prefix);
            FUZZ_ASSERT(ino < (UINT64_C(1) << 32));
            if (d > 0)
                FUZZ_ASSERT(ino == L.bases[d] + prefix && prefix < pow16(L.nhex[d]));
            else
                FUZZ_ASSERT(ino == SFS_LL_ROOT_INODE && prefix == 0);
        }
        if (ino >> 32)
            FUZZ_ASSERT(d == -1);
    }
    uint32_t number = 0xdeadbeef, slot = 0xdeadbeef, wn = 0, ws = 0;
    int o = sfs_ll_object_inode(ino, &number, &slot);
    int wo = ref_object_inode(ino, &wn, &ws);
    FUZZ_ASSERT(o == wo);
    if (o) {
        FUZZ_ASSERT(number == wn && slot == ws);
        FUZZ_ASSERT((((uint64_t)number + 1) << 32 | slot) == ino);
        FUZZ_ASSERT(!(ino & SFS_LL_DB_INODE_FLAG) && ino >= (UINT64_C(1) << 32));
        if (R.valid)
            FUZZ_ASSERT(sfs_ll_split_dir(&L, ino, &prefix) == -1);
    }
}

static void check_object(uint32_t number, uint32_t slot)
{
    uint64_t ino = ((uint64_t)number + 1) << 32 | slot; /* number 2^32 - 1: wraps */
    check_inode(ino);
    uint32_t n = 0, s = 0;
    int o = sfs_ll_object_inode(ino, &n, &s);
    if (number != UINT32_MAX && !(((uint64_t)number + 1) >> 30 & 1)) {
        FUZZ_ASSERT(o == 1 && n == number && s == slot);
        if (R.valid) {
            uint64_t prefix;
            FUZZ_ASSERT(sfs_ll_split_dir(&L, ino, &prefix) == -1);
        }
    } else if (number != UINT32_MAX) {
        FUZZ_ASSERT(o == 0); /* bit 62: a database object */
    }
}

/* Edge inodes of the layout (and of the 64-bit range). */
static size_t edges(uint64_t *out)
{
    size_t k = 0;
    static const uint64_t fixed[] = {
        0, 1, 2, 3, 17, 18, 257, 258, 258 + 65535, 258 + 65536,
        (UINT64_C(1) << 32) - 1, UINT64_C(1) << 32, (UINT64_C(1) << 32) + 1, UINT64_C(1) << 33,
        UINT64_C(1) << 62, (UINT64_C(1) << 62) | (UINT64_C(1) << 32), (UINT64_C(1) << 62) - 1,
        (UINT64_C(1) << 62) + 2, UINT64_C(1) << 63, (UINT64_C(1) << 63) | (UINT64_C(1) << 32),
        UINT64_MAX, UINT64_MAX - 1, UINT64_MAX << 32, (UINT64_MAX << 32) & ~SFS_LL_DB_INODE_FLAG,
        ~SFS_LL_DB_INODE_FLAG, INT64_MAX,
    };
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        out[k++] = fixed[i];
    for (int d = 1; d <= R.depth; d++) {
        out[k++] = R.base[d];
        out[k++] = R.base[d] + R.span[d] - 1;
        out[k++] = R.base[d] + R.span[d];
        out[k++] = R.base[d] + R.span[d] / 2;
    }
    return k;
}
#define MAX_EDGES 64

/* The fixed sweep of a valid layout. */
static void check_layout(void)
{
    FUZZ_ASSERT(L.depth == R.depth && L.nhex[0] == 0 && L.bases[1] == 2);
    uint64_t prev_end = 2;
    for (int d = 1; d <= R.depth; d++) {
        FUZZ_ASSERT(L.nhex[d] == R.nhex[d] && L.nhex[d] > L.nhex[d - 1] && L.nhex[d] <= 7);
        FUZZ_ASSERT(L.bases[d] == R.base[d]);
        /* contiguous, so disjoint; the root (1) is below them all */
        FUZZ_ASSERT(L.bases[d] == prev_end && L.bases[d] > SFS_LL_ROOT_INODE);
        prev_end = L.bases[d] + pow16(L.nhex[d]);
        FUZZ_ASSERT(prev_end <= (UINT64_C(1) << 32));
    }
    /* pairwise, from the library's own numbers */
    for (int a = 1; a <= R.depth; a++)
        for (int b = a + 1; b <= R.depth; b++) {
            uint64_t ea = L.bases[a] + pow16(L.nhex[a]), eb = L.bases[b] + pow16(L.nhex[b]);
            FUZZ_ASSERT(ea <= L.bases[b] || eb <= L.bases[a]);
        }
    for (uint64_t ino = 0; ino < SWEEP_LOW; ino++)
        check_inode(ino);
    uint64_t e[MAX_EDGES];
    size_t ne = edges(e);
    for (size_t i = 0; i < ne; i++)
        for (int delta = -2; delta <= 2; delta++)
            check_inode(e[i] + (uint64_t)(int64_t)delta);
    for (int d = 1; d <= R.depth; d++)
        for (uint64_t k = 0; k < 16; k++)
            check_inode(R.base[d] + R.span[d] / 16 * k + k);
}

/* A name: the library, then the reference, then the leaf it belongs to. */
static void check_name(int depth, uint64_t prefix, const char *buf)
{
    /* an exact-size heap copy: a read past the NUL is caught by ASan */
    size_t len = strlen(buf);
    char *name = malloc(len + 1);
    FUZZ_ASSERT(name);
    memcpy(name, buf, len + 1);
    uint8_t key[SFS_KEY_SIZE], want_key[SFS_KEY_SIZE];
    int r = sfs_ll_object_name(&L, depth, prefix, name, key);
    int want = ref_object_name(&R, depth, prefix, name, want_key);
    FUZZ_ASSERT(r == want);
    FUZZ_ASSERT((r == -1) == (strnlen(name, SFS_LL_NAME_SIZE + 1) != SFS_LL_NAME_SIZE));
    if (r == 1) {
        FUZZ_ASSERT(memcmp(key, want_key, SFS_KEY_SIZE) == 0);
        char again[SFS_LL_NAME_SIZE + 1];
        for (int i = 0; i < SFS_KEY_SIZE; i++)
            snprintf(again + 2 * i, 3, "%02x", key[i]);
        FUZZ_ASSERT(memcmp(again, name, SFS_LL_NAME_SIZE + 1) == 0);
        FUZZ_ASSERT(depth == 0 || depth == L.depth);
    }
    /* a valid name: found at the root and in its leaf, nowhere else */
    if (want >= 0 && sfs_ll_object_name(&L, 0, 0, name, key) == 1 && R.depth > 0) {
        int D = R.depth, n = R.nhex[D];
        uint64_t p = 0;
        for (int j = 0; j < n; j++)
            p = p * 16 + loose_hex_value(name[j]);
        uint64_t leaf = R.base[D] + p, got = UINT64_MAX;
        FUZZ_ASSERT(sfs_ll_split_dir(&L, leaf, &got) == D && got == p);
        FUZZ_ASSERT(sfs_ll_object_name(&L, D, p, name, key) == 1);
        FUZZ_ASSERT(sfs_ll_object_name(&L, D, p ^ 1, name, key) == 0);
        if (D > 1) {
            uint64_t up = p / pow16(n - R.nhex[D - 1]);
            FUZZ_ASSERT(sfs_ll_object_name(&L, D - 1, up, name, key) == 0);
        }
    }
    free(name);
}

static const int ODD_DEPTHS[8] = {-1, 8, 9, 15, 16, INT_MAX, INT_MIN, -8};

static void do_name(cursor_t *c)
{
    uint8_t dsel = take8(c), psel = take8(c), mode = take8(c), len = take8(c);
    int depth = (dsel & 0x80) ? ODD_DEPTHS[dsel & 7] : (int)(dsel % (R.depth + 2));
    int n = depth >= 0 && depth <= R.depth ? R.nhex[depth] : 0;
    size_t chars = (mode & 2) ? 62 + len % 5u : len % 97u;
    char buf[NAME_BUF];
    memset(buf, 0, sizeof(buf));
    if (mode & 1) {
        for (size_t i = 0; i < chars; i += 2) {
            uint8_t b = take8(c);
            buf[i] = LOWER_HEX[b >> 4];
            if (i + 1 < chars)
                buf[i + 1] = LOWER_HEX[b & 15];
        }
    } else {
        for (size_t i = 0; i < chars; i++)
            buf[i] = (char)take8(c);
    }
    /* the prefix: raw, small, edges of this depth, or the name's own */
    uint64_t prefix = 0, span = pow16(n);
    switch (psel & 3) {
    case 0:
        prefix = take_le(c, 4);
        break;
    case 1:
        prefix = psel >> 2;
        break;
    case 2: {
        const uint64_t e[4] = {span - 1, span, UINT64_MAX, UINT64_C(1) << 32};
        prefix = e[(psel >> 2) & 3];
        break;
    }
    default:
        for (int j = 0; j < n && j < (int)chars; j++)
            prefix = prefix * 16 + loose_hex_value(buf[j]);
        prefix += (psel >> 2) & 1; /* or its neighbour */
        break;
    }
    /* the prefix spelled at the start (lowercase), as a matching name has */
    if ((mode & 4) && n > 0 && prefix < span) {
        spell(buf, n, prefix);
    }
    if ((mode & 8) && chars) {
        size_t at = take8(c) % chars;
        if (buf[at] >= 'a' && buf[at] <= 'z')
            buf[at] = (char)(buf[at] - 'a' + 'A');
    }
    if (mode & 16) {
        size_t at = take8(c) % (chars + 1);
        buf[at] = (char)take8(c); /* a NUL inside, or one more character */
    }
    buf[NAME_BUF - 1] = 0;
    check_name(depth, prefix, buf);
}

static uint64_t read_value(cursor_t *c, uint64_t size, uint64_t offset)
{
    uint8_t sel = take8(c);
    if (sel < 0x80)
        return take_le(c, 8);
    const uint64_t e[] = {
        0, 1, 2, 4095, 4096, 131072, (UINT64_C(1) << 32) - 1, UINT64_C(1) << 32, INT64_MAX,
        (uint64_t)INT64_MAX + 1, UINT64_MAX - 1, UINT64_MAX, (uint64_t)SIZE_MAX,
        /* relative to what is already chosen */
        size - 1, size, size + 1, size - offset - 1, size - offset, size - offset + 1,
        UINT64_MAX - offset, UINT64_MAX - offset + 1, offset + 1,
    };
    return e[sel % (sizeof(e) / sizeof(e[0]))];
}

static void check_read(uint64_t size, uint64_t offset, size_t want)
{
    size_t n = sfs_ll_read_length(size, offset, want);
    FUZZ_ASSERT(n == ref_read_length(size, offset, want));
    FUZZ_ASSERT(n <= want);
    if (offset >= size)
        FUZZ_ASSERT(n == 0);
    else
        FUZZ_ASSERT(n <= size - offset && (n == want || n == size - offset));
}

static void do_read(cursor_t *c)
{
    uint64_t size = read_value(c, 0, 0);
    uint64_t offset = read_value(c, size, 0);
    uint64_t want = read_value(c, size, offset);
    check_read(size, offset, (size_t)want);
    /* the same range one byte each way */
    check_read(size, offset + 1, (size_t)want);
    check_read(size, offset, (size_t)want + 1);
    check_read(size + 1, offset, (size_t)want);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    cursor_t c = {data, size, 0};
    uint8_t b0 = take8(&c);
    int depth = (b0 & 0x40) ? ODD_DEPTHS[b0 & 7] : (b0 & 7);
    int nhex[16] = {0};
    int prev = 0;
    for (int i = 0; i < SFS_LL_MAX_DEPTH; i++) {
        uint8_t b = take8(&c);
        nhex[i] = (b0 & 0x80) ? (int)(int8_t)b : prev + b % 4;
        prev = nhex[i];
    }
    ref_layout(&R, nhex, depth);
    int rc = sfs_ll_layout_init(&L, nhex, depth);
    FUZZ_ASSERT(rc == 0 || rc == -1);
    FUZZ_ASSERT((rc == 0) == R.valid);
    if (rc != 0) {
        /* refused: a flat layout instead, for the checks that need none */
        int none[1] = {0};
        FUZZ_ASSERT(sfs_ll_layout_init(&L, none, 0) == 0);
        ref_layout(&R, none, 0);
    }
    check_layout();

    uint64_t e[MAX_EDGES];
    size_t ne = edges(e);
    for (int op = 0; op < MAX_OPS && c.at < c.n; op++) {
        switch (take8(&c) % 5) {
        case 0:
            check_inode(take_le(&c, 8));
            break;
        case 1: {
            uint8_t sel = take8(&c);
            int8_t delta = (int8_t)take8(&c);
            check_inode(e[sel % ne] + (uint64_t)(int64_t)delta);
            break;
        }
        case 2: {
            uint32_t number = (uint32_t)take_le(&c, 4), slot = (uint32_t)take_le(&c, 4);
            check_object(number, slot);
            break;
        }
        case 3:
            do_name(&c);
            break;
        default:
            do_read(&c);
            break;
        }
    }
    return 0;
}
