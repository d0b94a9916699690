/*
 * ll_names.h — what the request path (ll.h) parses of what a user
 * controls: names looked up, inode numbers, read ranges. Pure functions,
 * no I/O and no Python, so that tests/fuzz/fuzz_ll_names.c can run them on
 * any input.
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

#endif
