/*
 * ll_names.c — names, inode numbers, read ranges, extended attribute names
 * and directory entry names of the request path (ll_names.h).
 */
#include "ll_names.h"

#include <string.h>

#include "hashindex.h"

_Static_assert(SFS_LL_DIGEST_SIZE == SFS_HX_DIGEST_SIZE, "a digest name spells a hash index's digest");

int sfs_ll_layout_init(sfs_ll_layout_t *l, const int *nhex, int depth)
{
    memset(l, 0, sizeof(*l));
    if (depth < 0 || depth > SFS_LL_MAX_DEPTH)
        return -1;
    l->depth = depth;
    l->bases[1] = 2;
    for (int d = 1; d <= depth; d++) {
        if (nhex[d - 1] <= l->nhex[d - 1] || nhex[d - 1] > 7)
            return -1;
        l->nhex[d] = nhex[d - 1];
        if (d > 1)
            l->bases[d] = l->bases[d - 1] + (UINT64_C(1) << (4 * l->nhex[d - 1]));
    }
    return 0;
}

int sfs_ll_split_dir(const sfs_ll_layout_t *l, uint64_t ino, uint64_t *prefix)
{
    if (ino == SFS_LL_ROOT_INODE) {
        *prefix = 0;
        return 0;
    }
    if (ino < 2 || ino >> SFS_LL_OBJECT_SHIFT)
        return -1;
    for (int d = 1; d <= l->depth; d++) {
        if (ino >= l->bases[d] && ino - l->bases[d] < (UINT64_C(1) << (4 * l->nhex[d]))) {
            *prefix = ino - l->bases[d];
            return d;
        }
    }
    return -1;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    return -1;
}

int sfs_ll_parse_hex(const char *hex, size_t ndigits, uint8_t *out)
{
    for (size_t i = 0; i + 2 <= ndigits; i += 2) {
        int hi = hexval(hex[i]);
        int lo = hi < 0 ? -1 : hexval(hex[i + 1]); /* never past a NUL */
        if (lo < 0)
            return -1;
        out[i / 2] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int sfs_ll_object_name(const sfs_ll_layout_t *l, int depth, uint64_t prefix, const char *name,
                       uint8_t key[SFS_KEY_SIZE])
{
    if (strnlen(name, SFS_LL_NAME_SIZE + 1) != SFS_LL_NAME_SIZE)
        return -1;
    if (sfs_ll_parse_hex(name, SFS_LL_NAME_SIZE, key) < 0)
        return 0;
    if (depth == 0)
        return 1;
    if (depth != l->depth)
        return 0; /* objects live at the root or in the leaves */
    uint64_t have = 0;
    for (int j = 0; j < l->nhex[depth]; j++)
        have = have << 4 | (uint64_t)hexval(name[j]);
    return have == prefix;
}

int sfs_ll_object_inode(uint64_t ino, uint32_t *number, uint32_t *slot)
{
    uint64_t high = ino >> SFS_LL_OBJECT_SHIFT;
    if (!high || (ino & SFS_LL_DB_INODE_FLAG))
        return 0;
    *number = (uint32_t)(high - 1);
    *slot = (uint32_t)ino;
    return 1;
}

size_t sfs_ll_read_length(uint64_t size, uint64_t offset, size_t want)
{
    if (offset >= size)
        return 0;
    return size - offset < want ? (size_t)(size - offset) : want;
}

int sfs_ll_hash_name(const uint64_t dirs[2], uint64_t parent, const char *name, uint8_t key[SFS_KEY_SIZE])
{
    size_t len = strnlen(name, SFS_LL_SWHID_PREFIX_LEN + SFS_LL_DIGEST_NAME_SIZE + 1);
    for (int kind = 0; kind < 2; kind++) {
        const char *hex = NULL;
        if (!dirs[kind])
            continue;
        if (len == SFS_LL_DIGEST_NAME_SIZE && parent == dirs[kind])
            hex = name;
        else if (kind == 1 && len == SFS_LL_SWHID_PREFIX_LEN + SFS_LL_DIGEST_NAME_SIZE &&
                 parent == SFS_LL_ROOT_INODE && memcmp(name, SFS_LL_SWHID_PREFIX, SFS_LL_SWHID_PREFIX_LEN) == 0)
            hex = name + SFS_LL_SWHID_PREFIX_LEN;
        if (hex) {
            memset(key, 0, SFS_KEY_SIZE);
            return sfs_ll_parse_hex(hex, SFS_LL_DIGEST_NAME_SIZE, key) < 0 ? 2 : kind;
        }
    }
    return -1;
}

enum sfs_ll_xattr sfs_ll_xattr_name(const char *name)
{
    if (strcmp(name, SFS_LL_XATTR_REQUESTS) == 0)
        return SFS_LL_XA_REQUESTS;
    if (strcmp(name, SFS_LL_XATTR_STATS) == 0)
        return SFS_LL_XA_STATS;
    if (strcmp(name, SFS_LL_XATTR_SHARD) == 0)
        return SFS_LL_XA_SHARD;
    if (strcmp(name, SFS_LL_XATTR_OFFSET) == 0)
        return SFS_LL_XA_OFFSET;
    return SFS_LL_XA_NONE;
}

int sfs_ll_xattr_has(enum sfs_ll_xattr x, enum sfs_ll_inode_kind kind)
{
    switch (x) {
    case SFS_LL_XA_REQUESTS:
    case SFS_LL_XA_STATS:
        return kind == SFS_LL_INODE_ROOT;
    case SFS_LL_XA_SHARD:
    case SFS_LL_XA_OFFSET:
        return kind == SFS_LL_INODE_OTHER;
    default:
        return 0;
    }
}

size_t sfs_ll_xattr_list(enum sfs_ll_inode_kind kind, char *out, size_t size)
{
    static const char root[] = SFS_LL_XATTR_REQUESTS "\0" SFS_LL_XATTR_STATS;
    static const char object[] = SFS_LL_XATTR_SHARD "\0" SFS_LL_XATTR_OFFSET;
    const char *names = kind == SFS_LL_INODE_ROOT ? root : kind == SFS_LL_INODE_OTHER ? object : NULL;
    size_t len = kind == SFS_LL_INODE_ROOT ? sizeof(root) : kind == SFS_LL_INODE_OTHER ? sizeof(object) : 0;
    if (len > size)
        return (size_t)-1;
    if (len)
        memcpy(out, names, len); /* each name with its NUL */
    return len;
}

int sfs_ll_dirent_name(const char *name, size_t len)
{
    return len >= 1 && len <= SFS_LL_DIRENT_NAME_MAX && !memchr(name, '/', len) && !memchr(name, 0, len);
}
