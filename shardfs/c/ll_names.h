/*
 * ll_names.h — what the request path (ll.h) parses of what the kernel
 * hands it and a user controls: names looked up (keys, digests, content
 * SWHIDs), inode numbers, read ranges, extended attribute names, and the
 * names of the directory entries it writes into a READDIRPLUS reply. Pure
 * functions, no I/O, no Python and no libfuse, so that
 * tests/fuzz/fuzz_ll_names.c can run them on any input.
 *
 * (READDIR offsets are not parsed in C: py_ll_ops.c hands the kernel's
 * offset to the handlers as it is, and the positions of listings are
 * computed in Python: shardfs/fuse/handlers.py, tested by
 * tests/test_listing_positions.py.)
 *
 * Inode numbers (shardfs/fuse/layout.py, docs/format.md): 1 is the root; a
 * fan-out directory at depth d (1..depth) spelling the hex prefix P is
 * bases[d] + P, bases[1] = 2, bases[d+1] = bases[d] + 16^nhex[d] (nhex[d]:
 * the hex digits a directory at depth d spells, at most 7, so that every
 * directory inode is below 2^32); an object is (shard number + 1) << 32 |
 * slot; an object read from a winery database has bit 62 set.
 */
#ifndef SHARDFS_LL_NAMES_H
#define SHARDFS_LL_NAMES_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#define SFS_LL_MAX_DEPTH 7
#define SFS_LL_ROOT_INODE 1
#define SFS_LL_OBJECT_SHIFT 32
#define SFS_LL_DB_INODE_FLAG (UINT64_C(1) << 62)
/* Bytes of an object's name: its key in lowercase hex. */
#define SFS_LL_NAME_SIZE (2 * SFS_KEY_SIZE)
/* A content SWHID, the name of an object by its sha1_git in the root:
 * this prefix, then 40 lowercase hex digits (swh.model's CoreSWHID). */
#define SFS_LL_SWHID_PREFIX "swh:1:cnt:"
#define SFS_LL_SWHID_PREFIX_LEN 10
/* Bytes of a digest by another hash (sha1, sha1_git), and of its name: 40
 * lowercase hex digits, in MOUNT/sha1 or MOUNT/sha1_git. */
#define SFS_LL_DIGEST_SIZE 20
#define SFS_LL_DIGEST_NAME_SIZE (2 * SFS_LL_DIGEST_SIZE)
/* The longest name of a directory entry (NAME_MAX). */
#define SFS_LL_DIRENT_NAME_MAX 255

/* The extended attributes of a mount (ll.h): the root's two (JSON), an
 * object's two (its shard's path, the offset of its first byte). */
#define SFS_LL_XATTR_REQUESTS "user.shardfs.requests"
#define SFS_LL_XATTR_STATS "user.shardfs.stats"
#define SFS_LL_XATTR_SHARD "user.shardfs.shard"
#define SFS_LL_XATTR_OFFSET "user.shardfs.offset"

/* Which of them a name is (sfs_ll_xattr_name). */
enum sfs_ll_xattr { SFS_LL_XA_NONE, SFS_LL_XA_REQUESTS, SFS_LL_XA_STATS, SFS_LL_XA_SHARD, SFS_LL_XA_OFFSET };

/* The inode an extended attribute is asked of: the root, another
 * directory (known to be one), or anything else (an object, or an inode
 * the request path cannot tell is a directory: the handlers check). */
enum sfs_ll_inode_kind { SFS_LL_INODE_ROOT, SFS_LL_INODE_DIR, SFS_LL_INODE_OTHER };

typedef struct {
    int depth;                          /* fan-out levels below the root (0: flat) */
    int nhex[SFS_LL_MAX_DEPTH + 1];     /* nhex[d]: hex digits spelled at depth d; nhex[0] = 0 */
    uint64_t bases[SFS_LL_MAX_DEPTH + 1];
} sfs_ll_layout_t;

/* Fill `l` for `depth` levels whose cumulative hex lengths are nhex[0..depth)
 * (e.g. slicing 0:2/2:4 gives {2, 4}). Returns 0, or -1 when depth is not
 * 0..SFS_LL_MAX_DEPTH or the lengths do not grow from 1 to at most 7. */
int sfs_ll_layout_init(sfs_ll_layout_t *l, const int *nhex, int depth);

/* The depth (0 for the root) of directory inode `ino`, with the prefix it
 * spells in *prefix; -1 when `ino` is no directory. */
int sfs_ll_split_dir(const sfs_ll_layout_t *l, uint64_t ino, uint64_t *prefix);

/* What name `name` (NUL-terminated) looked up in the directory at `depth`
 * spelling `prefix` stands for:
 *   1  an object key, in key[]: 64 lowercase hex digits, in a directory
 *      where objects live (the root, or a leaf whose prefix it starts with);
 *   0  no object can have that name there (a 64-character name that is not
 *      lowercase hex, or that belongs to another directory): absent;
 *  -1  not a 64-character name ("." , "..", a fan-out directory): the
 *      caller decides. */
int sfs_ll_object_name(const sfs_ll_layout_t *l, int depth, uint64_t prefix, const char *name,
                       uint8_t key[SFS_KEY_SIZE]);

/* Parse `ndigits` (even) lowercase hex digits at `hex` into ndigits / 2
 * bytes at out: 0, or -1 at the first character that is not one (out is
 * then partly written). */
int sfs_ll_parse_hex(const char *hex, size_t ndigits, uint8_t *out);

/* The inode of slot `slot` of shard `number`: (number + 1) << 32 | slot. */
static inline uint64_t sfs_ll_object_ino(uint32_t number, uint32_t slot)
{
    return ((uint64_t)number + 1) << SFS_LL_OBJECT_SHIFT | slot;
}

/* The shard number and slot of an object inode: 1, or 0 when `ino` names
 * no object in a shard (a directory, a database object). */
int sfs_ll_object_inode(uint64_t ino, uint32_t *number, uint32_t *slot);

/* Bytes a READ of `want` bytes at byte `offset` of an object of `size`
 * bytes returns: 0 at or past its end, else min(want, size - offset). */
size_t sfs_ll_read_length(uint64_t size, uint64_t offset, size_t want);

/* What name `name` (NUL-terminated, as the kernel hands it) looked up in
 * directory `parent` is as a name by another hash, `dirs` being the
 * inodes of MOUNT/sha1 and MOUNT/sha1_git (0: not served):
 *   0  a sha1: 40 lowercase hex digits in dirs[0];
 *   1  a sha1_git: 40 lowercase hex digits in dirs[1], or in the root
 *      SFS_LL_SWHID_PREFIX and 40 lowercase hex digits when dirs[1] is
 *      served;
 *      (0 and 1: the digest in key[0..20), key[20..32) zeroed)
 *   2  a name of such a length in such a place that is not lowercase hex
 *      (no object has it: absent; key is then zeroed, partly written);
 *  -1  none of these (the caller decides). */
int sfs_ll_hash_name(const uint64_t dirs[2], uint64_t parent, const char *name, uint8_t key[SFS_KEY_SIZE]);

/* Which of the mount's extended attributes `name` (NUL-terminated) is:
 * exactly one of the four names, else SFS_LL_XA_NONE. */
enum sfs_ll_xattr sfs_ll_xattr_name(const char *name);

/* Whether an inode of `kind` may have attribute `x`: 1 (the handlers
 * answer: the root's two on the root, an object's two on anything else
 * that is not known to be a directory), or 0 (ENODATA, answered in C:
 * SFS_LL_XA_NONE, a root's name on another inode, an object's on a
 * directory). */
int sfs_ll_xattr_has(enum sfs_ll_xattr x, enum sfs_ll_inode_kind kind);

/* The names an inode of `kind` may have (those sfs_ll_xattr_has accepts),
 * each followed by a NUL, as LISTXATTR answers them, into out[0..size):
 * the bytes they take (none for a directory), or (size_t)-1 when they do
 * not fit (out is then untouched). */
size_t sfs_ll_xattr_list(enum sfs_ll_inode_kind kind, char *out, size_t size);

/* Whether the `len` bytes at `name` (not NUL-terminated) may be the name
 * of a directory entry: 1 to SFS_LL_DIRENT_NAME_MAX bytes, no '/', no
 * NUL: 1, else 0. */
int sfs_ll_dirent_name(const char *name, size_t len);

#endif
