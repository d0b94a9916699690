/*
 * mosaic.h — read Software Heritage MOSAIC files: objects in an EBML
 * container, found by key through a minimal perfect hash per index.
 *
 * Format (source: the Rust crate swh-mosaic 0.7.0, src/ebml.rs,
 * src/creator.rs, src/writer.rs, src/reader.rs, src/backends/mod.rs,
 * src/updater.rs, src/lib.rs and schema.ebml.xml; checked against files
 * written by its Python package swh.mosaic 0.6.1, tests/mosaic_fixtures.py):
 *
 *   Every element is an ID, a size and `size` bytes of data. The ID is 1, 2,
 *   3 or 4 bytes, its width given by its leading byte as for a VINT (0x80..
 *   0xFF: 1, 0x40..: 2, 0x20..: 3, 0x10..: 4; the marker bit is kept, so
 *   IDs read as written below). The size is a VINT (RFC 8794) of 1 to 8
 *   bytes: the number of leading zero bits of the first byte + 1 gives its
 *   width, the bits after the first 1 its big-endian value. Unsigned
 *   integers are big-endian, 0 to 8 bytes; strings may be NUL-padded.
 *   Void elements (0xEC) are padding, skipped wherever they are; so are
 *   elements of an ID this reader does not know.
 *
 *   EBML header 0x1A45DFA3: EBMLReadVersion 1, EBMLMaxIDLength 4,
 *       EBMLMaxSizeLength 8, DocType "mosaic", DocTypeVersion and
 *       DocTypeReadVersion 1
 *   Mosaic 0x1C535748 (its size written as an 8-byte VINT)
 *     ContainerMetaData 0x1D535748
 *       CRC-32 0xBF: 4 bytes, crc32 (zlib's, IEEE 802.3) of the rest of the
 *           element's data, stored little-endian; the first child of every
 *           element that has one
 *       ObjectsCounter 0x5000       objects in the file (live ones: see
 *                                   deletion), written as 8 bytes
 *       ObjectsTotalSize 0x5001     bytes of their decoded contents
 *       EndOfTilesOffset 0x5099     absolute byte offset of the first element
 *                                   after the last Tile: the first Index
 *       CompressionMethod 0x5002    "none", "zstd" or "zstd.dict" (sic: a dot)
 *       CompressionData 0x5003      the zstd dictionary, for "zstd.dict"
 *       Comment 0x5004              UTF-8, any number
 *     Tile 0x1E535748, any number (~32 MB each by default)
 *       CRC-32
 *       Object 0xF0, any number: one object's bytes, stored as they are
 *           ("none") or as zstd frames of its own ("zstd": one frame as
 *           written, with its content size; "zstd.dict": compressed with
 *           the dictionary)
 *     Index 0x1F535748, one per kind of key, all after EndOfTilesOffset
 *       CRC-32
 *       IdxDescription 0x6001   "key:sha1 pkg:cargo/ph@0.10.0
 *           swh:1:dir:795095368f036f42adebcb75782a61494940e9b8
 *           ph::fmph::GOFunction", the same with key:sha1_git, key:sha256
 *           and key:blake2s256 (IdxDescription::description(); the schema's
 *           swh:1:rev:... values are not what is written). Another
 *           description: the index is skipped.
 *       IdxUnrolled 0x6002      n entries of IdxUnrolledEntrySize bytes each,
 *           entry i holding the key whose Map value is i: Key 0xA0 (the key:
 *           20 bytes for sha1 and sha1_git, 32 for sha256 and blake2s256)
 *           then Offset 0xA1 (absolute byte offset of the Object element's
 *           ID, written on the VINT width of the file's end of tiles)
 *       IdxUnrolledEntrySize 0x6003   bytes: 4 + key size + offset width
 *       MapContainer 0x6004
 *         CRC-32
 *         Map 0x6005            ph::fmph::GOFunction of the index's n keys,
 *                               as GOFunction::write wrote it (ph.h)
 *
 *   Deletion (src/updater.rs): the object's Object element and, in every
 *   index, its entry's Key and Offset elements are overwritten by Void
 *   elements of the same length (0xEC, the same size VINT, zeros); the
 *   CRC-32 of the Index elements and of ContainerMetaData are rewritten,
 *   ObjectsCounter and ObjectsTotalSize decreased. A deleted entry keeps its
 *   slot and starts with 0xEC. (swh.mosaic 0.6.1 rewrites the CRC-32 of the
 *   Tile after the one holding the object instead of that one, so a Tile
 *   holding a deleted object has a stale CRC-32 unless it is the last Tile;
 *   sfs_mosaic_check reports it as it is.)
 *
 * Errors: every function that can fail returns SFS_OK (0) or a negative
 * sfs_status of shard.h and, when given an sfs_error_t, a one-line message
 * that names the file, the element and its byte position. SFS_ECORRUPT:
 * the bytes contradict the format (a truncated file, an element running
 * past its parent or the file, a bad CRC-32 where one is checked, a
 * malformed GOFunction, an entry or object that is not where its index
 * says). No function reads outside the mapping whatever the file holds.
 *
 * Thread safety: an open file (sfs_mosaic_t) is immutable; any number of
 * threads may call the lookup, slot, object, read and check functions on it
 * at once (no lock; the GOFunctions and the zstd dictionary are read-only
 * after sfs_mosaic_open). zstd decoding needs a context: pass one
 * (sfs_mosaic_ctx_t, each used by one thread at a time) or NULL for one
 * made and freed by the call. There is no global mutable state.
 *
 * Sources: a regular file or a block device, mapped read-only (MAP_SHARED)
 * whole, its descriptor closed after open: objects MADV_RANDOM (a cold
 * page fault reads one page), index entries MADV_NORMAL (faults read
 * around). Truncating the
 * file in place while it is open raises SIGBUS in a reader that touches the
 * lost pages, as for a shard: run such calls under SFS_GUARDED (guard.h).
 */
#ifndef SHARDFS_MOSAIC_H
#define SHARDFS_MOSAIC_H

#include <stddef.h>
#include <stdint.h>

#include "shard.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element IDs, as they are written (marker bits included). */
#define SFS_MOSAIC_ID_EBML 0x1A45DFA3u
#define SFS_MOSAIC_ID_MOSAIC 0x1C535748u
#define SFS_MOSAIC_ID_METADATA 0x1D535748u /* ContainerMetaData */
#define SFS_MOSAIC_ID_TILE 0x1E535748u
#define SFS_MOSAIC_ID_INDEX 0x1F535748u
#define SFS_MOSAIC_ID_OBJECT 0xF0u
#define SFS_MOSAIC_ID_KEY 0xA0u
#define SFS_MOSAIC_ID_OFFSET 0xA1u
#define SFS_MOSAIC_ID_MAP_CONTAINER 0x6004u
#define SFS_MOSAIC_ID_CRC32 0xBFu
#define SFS_MOSAIC_ID_VOID 0xECu

#define SFS_MOSAIC_READ_VERSION 1 /* the DocTypeReadVersion this reader reads */
#define SFS_MOSAIC_MAX_KEY_SIZE 32

/* CompressionMethod. */
enum sfs_mosaic_compression {
    SFS_MOSAIC_NONE = 0,      /* "none" */
    SFS_MOSAIC_ZSTD = 1,      /* "zstd" */
    SFS_MOSAIC_ZSTD_DICT = 2, /* "zstd.dict": with the CompressionData dictionary */
};

/* Kinds of key, one index each at most. */
enum sfs_mosaic_key_kind {
    SFS_MOSAIC_SHA1 = 0,       /* "sha1": 20 bytes */
    SFS_MOSAIC_SHA1_GIT = 1,   /* "sha1_git": 20 bytes, SHA-1 of "blob <size>\0" + content */
    SFS_MOSAIC_SHA256 = 2,     /* "sha256": 32 bytes */
    SFS_MOSAIC_BLAKE2S256 = 3, /* "blake2s256": 32 bytes */
    SFS_MOSAIC_KEY_KINDS = 4,
};

/* What sfs_mosaic_open found, all validated against the file size. */
typedef struct sfs_mosaic_info {
    uint64_t file_size;          /* bytes of the file or device */
    uint64_t mosaic_end;         /* byte offset of the end of the Mosaic element (<= file_size) */
    uint64_t objects_counter;    /* ObjectsCounter */
    uint64_t objects_total_size; /* ObjectsTotalSize, bytes */
    uint64_t metadata_position;  /* byte offset of ContainerMetaData's ID */
    uint64_t tiles_position;     /* first byte after ContainerMetaData: where Tiles start */
    uint64_t end_of_tiles;       /* EndOfTilesOffset, in [tiles_position, mosaic_end] */
    int compression;             /* an sfs_mosaic_compression */
    uint64_t dictionary_size;    /* bytes of CompressionData for "zstd.dict", else 0 */
    uint64_t doctype_version;    /* DocTypeVersion */
    uint64_t doctype_read_version;
    size_t comments;             /* Comment elements */
    size_t indexes;              /* indexes of a known kind (sfs_mosaic_index) */
    size_t skipped_indexes;      /* Index elements of an unknown description or of a kind
                                  * seen before */
} sfs_mosaic_info_t;

/* One index of a known kind. */
typedef struct sfs_mosaic_index_info {
    int kind;                   /* an sfs_mosaic_key_kind */
    const char *name;           /* "sha1", "sha1_git", "sha256", "blake2s256" (static) */
    size_t key_size;            /* bytes: 20 or 32 */
    uint64_t slots;             /* entries n: IdxUnrolled's size / entry_size */
    uint64_t entry_size;        /* IdxUnrolledEntrySize, bytes */
    uint64_t position;          /* byte offset of the Index element's ID */
    uint64_t unrolled_position; /* byte offset of entry 0 */
    uint64_t map_position;      /* byte offset of the serialized GOFunction (Map's data) */
    uint64_t map_size;          /* bytes of the serialized GOFunction */
} sfs_mosaic_index_info_t;

typedef struct sfs_mosaic sfs_mosaic_t;
typedef struct sfs_mosaic_ctx sfs_mosaic_ctx_t;

/* Open and validate the MOSAIC file at `path` (a regular file or block
 * device, read-only). Parsed and checked before anything is used: the EBML
 * header (DocType "mosaic"; a DocTypeReadVersion above 1, an
 * EBMLReadVersion above 1, EBMLMaxIDLength above 4 or EBMLMaxSizeLength
 * above 8 is refused with a message naming the version); the Mosaic element
 * inside the file; ContainerMetaData, its CRC-32 checked, with every field
 * (CompressionMethod one of the three names, CompressionData present for
 * "zstd.dict" and loaded as a zstd dictionary, ZSTD_createDDict, once);
 * EndOfTilesOffset inside the Mosaic element, after ContainerMetaData;
 * every element from EndOfTilesOffset to the Mosaic's end, and in every
 * Index: its description (unknown ones skipped, and an index of a kind
 * already seen), IdxUnrolled inside the Index, IdxUnrolledEntrySize in
 * [key size + 4, key size + 26] dividing IdxUnrolled's size, the
 * MapContainer's CRC-32 and its Map read whole by sfs_gof_read (ph.h),
 * which must use all of it. Not read at open: the Tiles and the entries
 * (each is checked when used), the Index CRC-32s (sfs_mosaic_check). Cost:
 * O(size of the Maps) plus the CRC-32 of ContainerMetaData; memory: the
 * GOFunctions (~2.2 bits per key) and the dictionary.
 * Returns SFS_OK and sets *out; else *out = NULL and SFS_ECORRUPT (also for
 * a refused version), SFS_EIO (errno in err: open, fstat, mmap),
 * SFS_EINVAL (neither a regular file nor a block device) or SFS_ENOMEM. */
int sfs_mosaic_open(const char *path, sfs_mosaic_t **out, sfs_error_t *err);

/* Unmap and free. NULL is accepted. No other call may be running on it. */
void sfs_mosaic_close(sfs_mosaic_t *m);

const char *sfs_mosaic_path(const sfs_mosaic_t *m);
const sfs_mosaic_info_t *sfs_mosaic_info(const sfs_mosaic_t *m);

/* Comment i (i < info->comments), NUL-terminated with trailing NULs of the
 * element removed; its length in bytes into *len (may be NULL). NULL when i
 * is out of range. Valid until sfs_mosaic_close(). */
const char *sfs_mosaic_comment(const sfs_mosaic_t *m, size_t i, size_t *len);

/* Index i (i < info->indexes, in file order), or NULL. */
const sfs_mosaic_index_info_t *sfs_mosaic_index(const sfs_mosaic_t *m, size_t i);

/* The number i of the index of kind `kind` (sfs_mosaic_key_kind), or
 * SFS_ENOTFOUND when the file has none. */
int sfs_mosaic_find_index(const sfs_mosaic_t *m, int kind);

/* Name of a kind ("sha1"...), NULL for another value; and the kind of a
 * name, or -1. */
const char *sfs_mosaic_kind_name(int kind);
int sfs_mosaic_kind_of(const char *name);

/* Look `key` (key_len bytes) up in index `index`: the GOFunction gives an
 * entry, whose Key must equal `key`. On SFS_OK, *slot (may be NULL) is the
 * entry number and *object the byte offset of the object's element (for
 * the object functions below; checked to lie in [tiles_position,
 * end_of_tiles), not yet read). SFS_ENOTFOUND: the key is absent, or its
 * entry was deleted (voided); SFS_EINVAL: no such index or key_len is not
 * its key size; SFS_ECORRUPT: the GOFunction's value is not an entry, the
 * entry is malformed, or its Offset is outside the tiles. Cost: one
 * GOFunction evaluation (sfs_gof_get) and one entry read. */
int sfs_mosaic_lookup(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len,
                      uint64_t *slot, uint64_t *object, sfs_error_t *err);

/* The entry `key` hashes to in index `index` (its GOFunction's value,
 * which says nothing of whether the key is there), or -1 when the
 * GOFunction says no key has one, or for a bad index or key length. */
int64_t sfs_mosaic_slot_of(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len);

/* sfs_mosaic_lookup with the GOFunction's value `v` for `key` already
 * computed (sfs_mosaic_slot_of): a batch evaluates it for several keys,
 * asks the CPU for their entries (sfs_mosaic_cache_ahead), then reads
 * them, so the memory waits of several keys overlap. */
int sfs_mosaic_lookup_at(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len, int64_t v,
                         uint64_t *slot, uint64_t *object, sfs_error_t *err);

/* Ask the CPU to bring the cache line holding byte `pos` of the mapping
 * into its cache (a prefetch instruction: no wait, no fault; a page not
 * in memory is not read). Out of range: nothing. */
void sfs_mosaic_cache_ahead(const sfs_mosaic_t *m, uint64_t pos);

/* Entry `slot` (< slots) of index `index`: its key into key_out (key_size
 * bytes; may be NULL) and its object's position into *object (may be
 * NULL). SFS_ENOTFOUND for a deleted entry (starting with a Void element,
 * or a Key followed by a Void: neither has a key any more); SFS_EINVAL for
 * a slot or index out of range; SFS_ECORRUPT as sfs_mosaic_lookup. Every
 * live key of an index is found by calling it for slots 0 to slots - 1. */
int sfs_mosaic_slot(const sfs_mosaic_t *m, size_t index, uint64_t slot, uint8_t *key_out,
                    uint64_t *object, sfs_error_t *err);

/* The Object element at byte `object` (from sfs_mosaic_lookup or
 * sfs_mosaic_slot): *data (may be NULL) the byte offset of its stored
 * bytes, *stored_size (may be NULL) their number, both inside the tiles.
 * SFS_ENOTFOUND: a Void element is there (the object was deleted);
 * SFS_EINVAL: `object` is outside [tiles_position, end_of_tiles);
 * SFS_ECORRUPT: no valid Object element there, or it runs past the tiles. */
int sfs_mosaic_object(const sfs_mosaic_t *m, uint64_t object, uint64_t *data,
                      uint64_t *stored_size, sfs_error_t *err);

/* Pointer to the stored bytes of the object at `object` in the mapping
 * (*stored_size of them), or NULL (then as sfs_mosaic_object's error, in
 * *status when not NULL). Valid until sfs_mosaic_close(). */
const uint8_t *sfs_mosaic_stored(const sfs_mosaic_t *m, uint64_t object, uint64_t *stored_size,
                                 int *status);

/* Ask the kernel to start reading what a lookup of `key` in index `index`
 * will read (its entry: the perfect hash is evaluated, nothing of the file
 * is touched), or the first `bytes` bytes from the object element at
 * `object` (from a lookup): madvise(MADV_WILLNEED), which returns at once.
 * A batch of lookups then waits for one round of parallel reads instead
 * of one read per key (shardfs._shardfs.Mosaic.get_batch). Arguments out
 * of range are ignored. */
void sfs_mosaic_prefetch_entry(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len);
void sfs_mosaic_prefetch_object(const sfs_mosaic_t *m, uint64_t object, uint64_t bytes);

/* 1 when the page of the entry a lookup of `key` would read is in the
 * page cache (mincore(2); also when that cannot be told), else 0: a batch
 * whose first entries are cached skips the prefetch (its two system calls
 * per key cost more than they save on cached pages). */
int sfs_mosaic_entry_cached(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len);
/* The same for the first page of the object element at `object`. */
int sfs_mosaic_object_cached(const sfs_mosaic_t *m, uint64_t object);

/* A zstd decoding context for the calls below: a ZSTD_DCtx (~94 KiB, plus
 * a window buffer as large as the largest frame window it decoded: about
 * the largest object's size, ~290 KiB in all after a 100 KiB object) and a
 * 128 KiB scratch buffer. One thread at a time, any number of files. NULL
 * on allocation failure. */
sfs_mosaic_ctx_t *sfs_mosaic_ctx_new(void);
void sfs_mosaic_ctx_free(sfs_mosaic_ctx_t *ctx); /* NULL accepted */

/* The calling thread's context (made at its first use, freed when the
 * thread ends: making one per call costs tens of microseconds, as much as
 * decoding a small object), or NULL for a file without compression or when
 * none can be made (the calls then make their own). */
sfs_mosaic_ctx_t *sfs_mosaic_thread_ctx(const sfs_mosaic_t *m);

/* Decoded size of the object at `object`, bytes. "none": its stored size,
 * O(1). zstd: the sum of its frames' content sizes (ZSTD_getFrameContentSize
 * of each frame, stepping with ZSTD_findFrameCompressedSize: reads the
 * frame and block headers, decodes nothing) when every frame has one, as
 * swh-mosaic writes them (one frame per object, content size included);
 * else the whole object is decoded to count its bytes (O(size) time, the
 * context's buffers only), and its frames' checksums, if any, verified.
 * *exact (may be NULL) is 1 when the size was decoded, 0 when read from
 * the frame headers (then only a full sfs_mosaic_read proves it: zstd
 * checks a frame's content size when it decodes the frame's end). `ctx`
 * may be NULL (a context is made and freed when decoding is needed).
 * Errors as sfs_mosaic_object, plus SFS_ECORRUPT for bytes that are not
 * zstd frames or fail to decode, SFS_ENOMEM. */
int sfs_mosaic_object_size(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t object,
                           uint64_t *size, int *exact, sfs_error_t *err);

/* Copy bytes [offset, offset + length) of the decoded object at `object`
 * into dst, as pread does: *got receives the number copied, fewer than
 * `length` only when the object ends first (0 when offset >= its size).
 * "none": a copy from the mapping. zstd: streaming decompression
 * (ZSTD_decompressStream, with the file's dictionary for "zstd.dict") from
 * the object's first byte, discarding the output before `offset` (through
 * the context's scratch buffer) and stopping as soon as dst is full: cost
 * O(offset + length) decoding; read an object in order, whole or in large
 * pieces. A frame's content size and checksum are verified only when its
 * end is decoded (a read that reaches the object's end). Windows above
 * zstd's default limit (2^27 bytes) are refused. `ctx` may be NULL (one is
 * made and freed by the call: a few tens of microseconds). Errors as
 * sfs_mosaic_object_size (SFS_ECORRUPT for a zstd error, with zstd's
 * message); *got is then 0. */
int sfs_mosaic_read(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t object,
                    uint64_t offset, void *dst, size_t length, size_t *got, sfs_error_t *err);

/* A MOSAIC file whose tiles are not here (a local copy of a file in S3:
 * kind_mosaic.c): the object's element header and its first bytes are,
 * the rest is read by the caller.
 *
 * sfs_mosaic_layout: parse `path`'s EBML header and ContainerMetaData
 * only (as sfs_mosaic_open does, the indexes left unread) and give where
 * the tiles start and end (byte offsets). Errors as sfs_mosaic_open.
 *
 * sfs_mosaic_declared_size: the decoded size of the object at `object`
 * from its element header and its first zstd frame's header only (a raw
 * object: its stored size), where sfs_mosaic_object_size reads every
 * frame: for files written as swh-mosaic writes them, one frame per
 * object with its content size (SFS_ECORRUPT when the frame header has
 * none).
 *
 * sfs_mosaic_decode: sfs_mosaic_read from `stored` bytes the caller read
 * (the element's data: stored_bytes[0] is its first byte). */
int sfs_mosaic_layout(const char *path, uint64_t *tiles_position, uint64_t *end_of_tiles, sfs_error_t *err);
int sfs_mosaic_declared_size(const sfs_mosaic_t *m, uint64_t object, uint64_t *size, sfs_error_t *err);
int sfs_mosaic_decode(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t object, const uint8_t *stored_bytes,
                      uint64_t stored, uint64_t offset, void *dst, size_t length, size_t *got, sfs_error_t *err);

/* What sfs_mosaic_check saw. */
typedef struct sfs_mosaic_check_stats {
    uint64_t tiles;         /* Tile elements */
    uint64_t objects;       /* Object elements in them */
    uint64_t voids;         /* Void elements in them (deleted objects) */
    uint64_t crcs;          /* CRC-32 elements verified */
    uint64_t live_entries;  /* live entries, all indexes together */
    uint64_t voided_entries;
} sfs_mosaic_check_stats_t;

/* Verify the whole file: the CRC-32 of ContainerMetaData, of every Tile,
 * of every Index (its whole data: entries, entry size, MapContainer) and of
 * every MapContainer; the structure of the tiles (Tiles and Voids only,
 * each Tile's children inside it: Objects and Voids); every entry of every
 * index: deleted, or a Key of the index's size that the GOFunction maps to
 * that very entry and an Offset that names an Object element; and
 * ObjectsCounter equal to the number of Object elements. Reads every byte
 * of the Mosaic element once: O(file size). `report` (may be NULL) is
 * called for every problem with the byte position of the element at fault,
 * its ID (SFS_MOSAIC_ID_*; SFS_MOSAIC_ID_KEY for an entry) and a one-line
 * message; `stats` (may be NULL) receives the counts. Returns SFS_OK when
 * no problem was found, else SFS_ECORRUPT with the first problem's message
 * (naming the element and its byte position: "bad CRC-32 of Tile at byte
 * 4242 (stored 0x..., computed 0x...)"). A structure broken beyond
 * walking (an element running past its parent) ends the walk of that part. */
int sfs_mosaic_check(const sfs_mosaic_t *m,
                     void (*report)(void *ctx, uint64_t position, uint32_t id, const char *message),
                     void *ctx, sfs_mosaic_check_stats_t *stats, sfs_error_t *err);

#ifdef __cplusplus
}
#endif
#endif
