/*
 * fuzz_ll_names.c — libFuzzer harness for what the request path parses of
 * what the kernel hands it (ll_names.c): directory layouts, inode numbers,
 * names looked up (keys, digests by another hash, content SWHIDs), hex,
 * read ranges, extended attribute names, directory entry names.
 *
 * Input format (bytes past the end read as 0):
 *   byte 0     the layout's depth and how its lengths are read:
 *              bit 6 set: depth = {-1, 8, 9, 15, 16, INT_MAX, INT_MIN, -8}[b & 7]
 *              (refused), else depth = b & 7; bit 7 set: bytes 1..7 are the
 *              cumulative hex lengths as signed bytes, else each adds b % 4
 *              to the previous one (0 does not grow: refused; past 7: refused)
 *   bytes 1..7 the cumulative hex lengths nhex[0..7)
 *   then up to MAX_OPS operations, each a tag byte (tag % 8) and its bytes:
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
 *     5 HASH    dsel, psel, mode, len, [two u32 if dsel & 8], [u64 if
 *               psel % 8 == 7], then the name's bytes (see do_hash): the
 *               hash directories served (dsel & 3: both at 2^32 - 3 and
 *               2^32 - 2, sha1 only, sha1_git only, none; & 4: one for
 *               both; & 8: two raw u32 instead), the parent (psel % 8: the
 *               root, the sha1 or sha1_git directory, a neighbour of one,
 *               a fan-out directory, 0, 2^32 - 2, a raw u64), the name
 *               (mode & 3: raw bytes (len % 64), 40 hex digits of bytes,
 *               "swh:1:cnt:" then 40 hex digits, another 10-byte prefix
 *               (len % 6) then 40 hex digits; mode & 4: one character
 *               upper-cased, & 8: one byte poked (NUL included), & 16: the
 *               last dropped, & 32: one added); then sfs_ll_parse_hex of
 *               its first (mode >> 6) * 32 + len % 33 characters
 *     6 XATTR   mode, sel, len, then bytes: a name raw (mode & 3 == 0: len
 *               % 48 bytes) or one of the four shardfs names (sel % 4); &
 *               4: a byte poked (NUL: cut short), & 8: one appended, & 16:
 *               one's case flipped, & 32: the last dropped; then the size
 *               of a LISTXATTR buffer (% 129)
 *     7 DIRENT  u16 length (% 300), mode, then bytes: a directory entry
 *               name raw, or lowercase hex; a '/' or a NUL poked at u16
 *               positions (% length); also checked one byte shorter and
 *               one longer
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
 *    offset): never above want nor size - offset;
 *  - sfs_ll_hash_name: 0 only for exactly 40 lowercase hex digits in the
 *    sha1 directory (served); 1 only for them in the sha1_git directory
 *    or "swh:1:cnt:" and them in the root (sha1_git served); the digest
 *    re-encodes to the name's digits and key[20..32) is zero; 2 exactly
 *    for such a length and place that is not all lowercase hex; -1 for
 *    everything else; never read past the name's NUL; a layout's
 *    directories are never the hash directories' inodes (2^32 - 3, 2^32 - 2);
 *  - sfs_ll_parse_hex: 0 exactly when the first ndigits & ~1 characters
 *    are lowercase hex, and then the bytes re-encode to them; never read
 *    past the first character that is not hex (a NUL included);
 *  - sfs_ll_xattr_name: a name is classified as a shardfs name only when it
 *    is one of the four exact strings; sfs_ll_xattr_has gives the root
 *    only the root's two, an object (or an inode not known to be a
 *    directory) only the object's two, a directory none; the decision of
 *    ll_getxattr (py_ll_ops.c) built from them, for every answer of
 *    ll_fast_is_dir (-1, 0, 1), is the one it made before they existed;
 *    sfs_ll_xattr_list lists exactly the names a kind has, each NUL-ended,
 *    and leaves a buffer too small untouched;
 *  - sfs_ll_dirent_name: 1 exactly for 1..255 bytes without '/' nor NUL
 *    (exact-size heap copy: no read past the length).
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

/* ----------------------------------------------------- names by another hash */

/* The inodes of MOUNT/sha1 and MOUNT/sha1_git (shardfs/fuse/layout.py). */
#define HASH_DIR_SHA1 ((UINT64_C(1) << 32) - 3)
#define HASH_DIR_SHA1_GIT ((UINT64_C(1) << 32) - 2)
#define DIGEST_HEX SFS_LL_DIGEST_NAME_SIZE

static int all_lower_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (lower_hex_value(s[i]) < 0)
            return 0;
    return 1;
}

static int ref_hash_name(const uint64_t dirs[2], uint64_t parent, const char *name)
{
    size_t len = strlen(name);
    const size_t swhid = SFS_LL_SWHID_PREFIX_LEN + DIGEST_HEX;
    if (dirs[0] && parent == dirs[0] && len == DIGEST_HEX)
        return all_lower_hex(name, DIGEST_HEX) ? 0 : 2;
    if (dirs[1] && parent == dirs[1] && len == DIGEST_HEX)
        return all_lower_hex(name, DIGEST_HEX) ? 1 : 2;
    if (dirs[1] && parent == SFS_LL_ROOT_INODE && len == swhid &&
        memcmp(name, "swh:1:cnt:", SFS_LL_SWHID_PREFIX_LEN) == 0)
        return all_lower_hex(name + SFS_LL_SWHID_PREFIX_LEN, DIGEST_HEX) ? 1 : 2;
    return -1;
}

static void check_hash_name(const uint64_t dirs[2], uint64_t parent, const char *buf)
{
    size_t len = strlen(buf);
    char *name = malloc(len + 1); /* exact size: a read past the NUL is caught */
    FUZZ_ASSERT(name);
    memcpy(name, buf, len + 1);
    uint8_t key[SFS_KEY_SIZE];
    memset(key, 0xa5, sizeof(key));
    int r = sfs_ll_hash_name(dirs, parent, name, key);
    int want = ref_hash_name(dirs, parent, name);
    FUZZ_ASSERT(r == want);
    FUZZ_ASSERT(r >= -1 && r <= 2);
    if (r == 0 || r == 1) {
        /* exactly 40 lowercase hex digits, in the right directory */
        const char *hex = len == DIGEST_HEX ? name : name + SFS_LL_SWHID_PREFIX_LEN;
        if (len == DIGEST_HEX)
            FUZZ_ASSERT(dirs[r] && parent == dirs[r] && (r == 0 || dirs[0] != parent));
        else
            FUZZ_ASSERT(r == 1 && dirs[1] && parent == SFS_LL_ROOT_INODE &&
                        len == SFS_LL_SWHID_PREFIX_LEN + DIGEST_HEX &&
                        memcmp(name, SFS_LL_SWHID_PREFIX, SFS_LL_SWHID_PREFIX_LEN) == 0);
        FUZZ_ASSERT(all_lower_hex(hex, DIGEST_HEX));
        char again[DIGEST_HEX + 1];
        for (int i = 0; i < SFS_LL_DIGEST_SIZE; i++)
            snprintf(again + 2 * i, 3, "%02x", key[i]);
        FUZZ_ASSERT(memcmp(again, hex, DIGEST_HEX) == 0);
        for (int i = SFS_LL_DIGEST_SIZE; i < SFS_KEY_SIZE; i++)
            FUZZ_ASSERT(key[i] == 0);
    } else if (r == 2) {
        for (int i = SFS_LL_DIGEST_SIZE; i < SFS_KEY_SIZE; i++)
            FUZZ_ASSERT(key[i] == 0);
    } else {
        for (int i = 0; i < SFS_KEY_SIZE; i++)
            FUZZ_ASSERT(key[i] == 0xa5); /* untouched */
    }
    /* a 64-character key name is never a hash name, and the reverse */
    if (r >= 0)
        FUZZ_ASSERT(strnlen(name, SFS_LL_NAME_SIZE + 1) != SFS_LL_NAME_SIZE);
    free(name);
}

/* sfs_ll_parse_hex of the first `ndigits` characters of `buf` (NUL-ended). */
static void check_parse_hex(const char *buf, size_t ndigits)
{
    size_t len = strlen(buf);
    char *hex = malloc(len + 1);
    FUZZ_ASSERT(hex);
    memcpy(hex, buf, len + 1);
    uint8_t out[64];
    memset(out, 0xa5, sizeof(out));
    FUZZ_ASSERT(ndigits / 2 <= sizeof(out));
    int r = sfs_ll_parse_hex(hex, ndigits, out);
    size_t even = ndigits & ~(size_t)1;
    /* the reference: every one of the first `even` characters lowercase
     * hex (a NUL before them is not) */
    int want = even <= len && all_lower_hex(hex, even);
    FUZZ_ASSERT(r == (want ? 0 : -1));
    if (r == 0) {
        char again[129];
        for (size_t i = 0; i < even / 2; i++)
            snprintf(again + 2 * i, 3, "%02x", out[i]);
        FUZZ_ASSERT(memcmp(again, hex, even) == 0);
        for (size_t i = even / 2; i < sizeof(out); i++)
            FUZZ_ASSERT(out[i] == 0xa5); /* nothing past ndigits / 2 bytes */
    }
    free(hex);
}

static void do_hash(cursor_t *c)
{
    uint8_t dsel = take8(c), psel = take8(c), mode = take8(c), len = take8(c);
    uint64_t dirs[2] = {HASH_DIR_SHA1, HASH_DIR_SHA1_GIT};
    if (dsel & 8) {
        dirs[0] = take_le(c, 4);
        dirs[1] = take_le(c, 4);
    }
    switch (dsel & 3) {
    case 1:
        dirs[1] = 0;
        break;
    case 2:
        dirs[0] = 0;
        break;
    case 3:
        dirs[0] = dirs[1] = 0;
        break;
    }
    if (dsel & 4)
        dirs[1] = dirs[0]; /* one directory for both */
    uint64_t parent;
    switch (psel % 8) {
    case 0:
        parent = SFS_LL_ROOT_INODE;
        break;
    case 1:
        parent = dirs[0];
        break;
    case 2:
        parent = dirs[1];
        break;
    case 3:
        parent = (psel & 0x80 ? dirs[1] : dirs[0]) + (psel & 0x40 ? 1 : -1);
        break;
    case 4:
        parent = R.depth ? R.base[R.depth] : 2; /* a fan-out directory */
        break;
    case 5:
        parent = 0;
        break;
    case 6:
        parent = HASH_DIR_SHA1_GIT;
        break;
    default:
        parent = take_le(c, 8);
        break;
    }
    char buf[NAME_BUF];
    memset(buf, 0, sizeof(buf));
    size_t chars;
    switch (mode & 3) {
    case 0: /* raw bytes */
        chars = len % 64u;
        for (size_t i = 0; i < chars; i++)
            buf[i] = (char)take8(c);
        break;
    case 1: /* a digest's 40 hex digits */
        chars = DIGEST_HEX;
        for (size_t i = 0; i < chars; i += 2) {
            uint8_t b = take8(c);
            buf[i] = LOWER_HEX[b >> 4];
            buf[i + 1] = LOWER_HEX[b & 15];
        }
        break;
    default: { /* a SWHID, or another 10-byte prefix, and 40 hex digits */
        static const char *const prefixes[] = {SFS_LL_SWHID_PREFIX, "swh:1:dir:", "swh:1:rev:",
                                               "SWH:1:CNT:", "swh:1:cnt;", "swh:2:cnt:"};
        const char *p = (mode & 3) == 2 ? SFS_LL_SWHID_PREFIX : prefixes[len % 6];
        memcpy(buf, p, SFS_LL_SWHID_PREFIX_LEN);
        chars = SFS_LL_SWHID_PREFIX_LEN + DIGEST_HEX;
        for (size_t i = SFS_LL_SWHID_PREFIX_LEN; i < chars; i += 2) {
            uint8_t b = take8(c);
            buf[i] = LOWER_HEX[b >> 4];
            buf[i + 1] = LOWER_HEX[b & 15];
        }
        break;
    }
    }
    if ((mode & 4) && chars) {
        size_t at = take8(c) % chars;
        if (buf[at] >= 'a' && buf[at] <= 'z')
            buf[at] = (char)(buf[at] - 'a' + 'A');
    }
    if (mode & 8) {
        size_t at = take8(c) % (chars + 1);
        buf[at] = (char)take8(c); /* a NUL inside, or one more character */
    }
    if ((mode & 16) && chars)
        buf[chars - 1] = 0; /* one short */
    if (mode & 32)
        buf[strlen(buf)] = LOWER_HEX[len & 15]; /* one more */
    buf[NAME_BUF - 1] = 0;
    check_hash_name(dirs, parent, buf);
    /* the same name where each kind of name is looked up */
    const uint64_t served[2] = {HASH_DIR_SHA1, HASH_DIR_SHA1_GIT};
    check_hash_name(served, SFS_LL_ROOT_INODE, buf);
    check_hash_name(served, HASH_DIR_SHA1, buf);
    check_hash_name(served, HASH_DIR_SHA1_GIT, buf);
    /* and its hex: as many digits as asked, at most 128 */
    size_t ndigits = (size_t)(mode >> 6) * 32 + len % 33u;
    check_parse_hex(buf, ndigits);
    if (chars > SFS_LL_SWHID_PREFIX_LEN)
        check_parse_hex(buf + SFS_LL_SWHID_PREFIX_LEN, DIGEST_HEX);
}

/* ------------------------------------------------- extended attribute names */

static const char *const XATTR_NAMES[4] = {SFS_LL_XATTR_REQUESTS, SFS_LL_XATTR_STATS, SFS_LL_XATTR_SHARD,
                                           SFS_LL_XATTR_OFFSET};

/* What ll_getxattr answered before sfs_ll_xattr_* (py_ll_ops.c at the
 * time): 1 for ENODATA, 0 when the handlers are called. */
static int old_getxattr_enodata(const char *name, int root, int is_dir)
{
    int kind_root = strcmp(name, "user.shardfs.requests") == 0 || strcmp(name, "user.shardfs.stats") == 0;
    int kind_object = strcmp(name, "user.shardfs.shard") == 0 || strcmp(name, "user.shardfs.offset") == 0;
    return (!kind_root && !kind_object) || (kind_root && !root) || (kind_object && (root || is_dir == 1));
}

/* The same decision as ll_getxattr makes it now; *asked: whether it asked
 * ll_fast_is_dir (answering `is_dir`). */
static int new_getxattr_enodata(const char *name, int root, int is_dir, int *asked)
{
    enum sfs_ll_xattr x = sfs_ll_xattr_name(name);
    enum sfs_ll_inode_kind kind = root ? SFS_LL_INODE_ROOT : SFS_LL_INODE_OTHER;
    *asked = 0;
    if (kind == SFS_LL_INODE_OTHER && sfs_ll_xattr_has(x, kind) && (*asked = 1, is_dir == 1))
        kind = SFS_LL_INODE_DIR;
    return !sfs_ll_xattr_has(x, kind);
}

static void check_xattr_name(const char *buf, size_t list_size)
{
    size_t len = strlen(buf);
    char *name = malloc(len + 1);
    FUZZ_ASSERT(name);
    memcpy(name, buf, len + 1);
    enum sfs_ll_xattr x = sfs_ll_xattr_name(name);
    int want = SFS_LL_XA_NONE;
    for (int i = 0; i < 4; i++)
        if (strcmp(name, XATTR_NAMES[i]) == 0)
            want = SFS_LL_XA_REQUESTS + i;
    FUZZ_ASSERT((int)x == want);
    if (x != SFS_LL_XA_NONE)
        FUZZ_ASSERT(strcmp(name, XATTR_NAMES[x - SFS_LL_XA_REQUESTS]) == 0);
    const enum sfs_ll_inode_kind kinds[3] = {SFS_LL_INODE_ROOT, SFS_LL_INODE_DIR, SFS_LL_INODE_OTHER};
    for (int k = 0; k < 3; k++) {
        int has = sfs_ll_xattr_has(x, kinds[k]);
        int root_name = x == SFS_LL_XA_REQUESTS || x == SFS_LL_XA_STATS;
        int object_name = x == SFS_LL_XA_SHARD || x == SFS_LL_XA_OFFSET;
        FUZZ_ASSERT(has == (kinds[k] == SFS_LL_INODE_ROOT ? root_name
                            : kinds[k] == SFS_LL_INODE_OTHER ? object_name : 0));
        /* listed exactly when had */
        char out[128];
        size_t n = sfs_ll_xattr_list(kinds[k], out, sizeof(out));
        FUZZ_ASSERT(n != (size_t)-1 && n <= sizeof(out) && (n == 0 || out[n - 1] == 0));
        int listed = 0;
        for (size_t at = 0; at < n; at += strlen(out + at) + 1)
            listed |= strcmp(out + at, name) == 0;
        FUZZ_ASSERT(listed == has);
        /* into a buffer of the size asked: whole, or untouched */
        char small[128];
        size_t size = list_size % (sizeof(small) + 1);
        memset(small, 0x5a, sizeof(small));
        size_t m = sfs_ll_xattr_list(kinds[k], size ? small : NULL, size);
        if (n <= size) {
            FUZZ_ASSERT(m == n && (n == 0 || memcmp(small, out, n) == 0));
            for (size_t i = n; i < sizeof(small); i++)
                FUZZ_ASSERT(small[i] == 0x5a);
        } else {
            FUZZ_ASSERT(m == (size_t)-1);
            for (size_t i = 0; i < sizeof(small); i++)
                FUZZ_ASSERT(small[i] == 0x5a);
        }
    }
    /* ll_getxattr's decision, for the root and another inode, whatever
     * ll_fast_is_dir answers; it asks only for an object's name */
    for (int root = 0; root < 2; root++)
        for (int is_dir = -1; is_dir <= 1; is_dir++) {
            int asked;
            FUZZ_ASSERT(new_getxattr_enodata(name, root, is_dir, &asked) == old_getxattr_enodata(name, root, is_dir));
            FUZZ_ASSERT(asked == (!root && (x == SFS_LL_XA_SHARD || x == SFS_LL_XA_OFFSET)));
        }
    free(name);
}

static void do_xattr(cursor_t *c)
{
    uint8_t mode = take8(c), sel = take8(c), len = take8(c);
    char buf[NAME_BUF];
    memset(buf, 0, sizeof(buf));
    if ((mode & 3) == 0) {
        size_t n = len % 48u;
        for (size_t i = 0; i < n; i++)
            buf[i] = (char)take8(c);
    } else {
        strcpy(buf, XATTR_NAMES[sel % 4]);
    }
    size_t n = strlen(buf);
    if (mode & 4) {
        size_t at = take8(c) % (n + 1);
        buf[at] = (char)take8(c); /* NUL: cut short */
    }
    n = strlen(buf);
    if (mode & 8)
        buf[n++] = (char)take8(c); /* one more (a NUL: the same name) */
    if ((mode & 16) && n) {
        size_t at = take8(c) % n;
        if (buf[at] >= 'a' && buf[at] <= 'z')
            buf[at] = (char)(buf[at] - 'a' + 'A');
        else if (buf[at] >= 'A' && buf[at] <= 'Z')
            buf[at] = (char)(buf[at] - 'A' + 'a');
    }
    n = strlen(buf);
    if ((mode & 32) && n)
        buf[n - 1] = 0;
    buf[NAME_BUF - 1] = 0;
    check_xattr_name(buf, take8(c));
}

/* ------------------------------------------------------ directory entries */

static void check_dirent(const char *buf, size_t len)
{
    char *name = malloc(len ? len : 1); /* exact size, not NUL-ended */
    FUZZ_ASSERT(name);
    memcpy(name, buf, len);
    int r = sfs_ll_dirent_name(name, len);
    int want = len >= 1 && len <= 255;
    for (size_t i = 0; want && i < len; i++)
        want = name[i] != '/' && name[i] != 0;
    FUZZ_ASSERT(r == want);
    if (r)
        FUZZ_ASSERT(len <= SFS_LL_DIRENT_NAME_MAX && len < 256); /* fits py_ll_ops.c's cname[256] with its NUL */
    free(name);
}

static void do_dirent(cursor_t *c)
{
    size_t len = (size_t)take_le(c, 2) % 300u;
    uint8_t mode = take8(c);
    char buf[300];
    memset(buf, 'x', sizeof(buf));
    if (mode & 1) {
        for (size_t i = 0; i < len; i++)
            buf[i] = (char)take8(c);
    } else {
        for (size_t i = 0; i < len; i++)
            buf[i] = LOWER_HEX[(i * 7 + mode) % 16];
    }
    if ((mode & 2) && len)
        buf[take_le(c, 2) % len] = '/';
    if ((mode & 4) && len)
        buf[take_le(c, 2) % len] = 0;
    check_dirent(buf, len);
    /* the names the handlers list: keys, fan-out children, their edges */
    if (len)
        check_dirent(buf, len - 1);
    check_dirent(buf, len < 299 ? len + 1 : len);
}

/* Fixed checks of every input: the four names and their neighbours, the
 * hash directories no directory of the layout. */
static void check_fixed(void)
{
    for (int i = 0; i < 4; i++) {
        char buf[64];
        strcpy(buf, XATTR_NAMES[i]);
        check_xattr_name(buf, 128);
        buf[strlen(buf) - 1] = 0;
        check_xattr_name(buf, 0);
    }
    check_xattr_name("", 1);
    check_xattr_name("security.selinux", 40);
    uint64_t prefix;
    FUZZ_ASSERT(sfs_ll_split_dir(&L, HASH_DIR_SHA1, &prefix) == -1);
    FUZZ_ASSERT(sfs_ll_split_dir(&L, HASH_DIR_SHA1_GIT, &prefix) == -1);
    uint32_t number, slot;
    FUZZ_ASSERT(sfs_ll_object_inode(HASH_DIR_SHA1, &number, &slot) == 0);
    FUZZ_ASSERT(sfs_ll_object_inode(HASH_DIR_SHA1_GIT, &number, &slot) == 0);
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
    check_fixed();

    uint64_t e[MAX_EDGES];
    size_t ne = edges(e);
    for (int op = 0; op < MAX_OPS && c.at < c.n; op++) {
        switch (take8(&c) % 8) {
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
        case 4:
            do_read(&c);
            break;
        case 5:
            do_hash(&c);
            break;
        case 6:
            do_xattr(&c);
            break;
        default:
            do_dirent(&c);
            break;
        }
    }
    return 0;
}
