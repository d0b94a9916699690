/*
 * shard.h — the shardfs C core: Read Shards in the Software Heritage v1 layout.
 *
 * Format (source: swh-shard 2.2.1, docs/format.rst and shard.h; restated in
 * docs/format.md of this repository):
 *
 *   bytes 0..32    magic "SWHShard", NUL-padded to 32 bytes
 *   bytes 32..88   header: seven big-endian u64 — version (=1), objects_count,
 *                  objects_position, objects_size, index_position, index_size,
 *                  hash_position
 *   objects        at objects_position (512 when we write), each object is a
 *                  big-endian u64 size followed by that many bytes
 *   index          index_size / 40 slots of 40 bytes: a 32-byte key and the
 *                  big-endian u64 absolute byte offset of the object's size
 *                  field; an empty or deleted slot is 32 zero bytes + 2^64-1
 *   hash           the CHD_PH perfect hash function as written by cmph_dump()
 *                  (cmph 2.0.2, jenkins hash, load factor 0.99, b = 4)
 *
 * Every function returns SFS_OK (0) on success or a negative sfs_status; when
 * an sfs_error_t pointer is given it receives a one-line message that names
 * the file and the problem (and the header field, for a corrupt header).
 *
 * Thread safety: a reader (sfs_shard_t) is immutable after sfs_open(); any
 * number of threads may call the lookup and read functions on it at once.
 * They take no lock and never use a file position (the header, index and
 * hash are mmap'ed). A writer (sfs_writer_t) belongs to one thread at a
 * time.
 *
 * Kinds of source: a shard is read from a regular file or block device
 * (kind "file") or from a Ceph RBD image, "rbd:POOL/IMAGE" (kind "rbd",
 * rbd.h). The kind is chosen once by sfs_open() and only changes where an
 * object's size and bytes come from (kind.h, the interface a kind
 * implements); a caller that must behave differently asks for a
 * capability (sfs_kind_flags), never for a kind.
 */
#ifndef SHARDFS_SHARD_H
#define SHARDFS_SHARD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SFS_MAGIC "SWHShard"
#define SFS_MAGIC_SIZE 32           /* bytes, magic + NUL padding */
#define SFS_HEADER_END 88           /* bytes: magic + 7 x u64 */
#define SFS_OBJECTS_POSITION 512    /* where our writer puts the first object */
#define SFS_VERSION 1
#define SFS_KEY_SIZE 32             /* bytes: a SHA-256 digest */
#define SFS_SLOT_SIZE 40            /* bytes: key + u64 offset */
#define SFS_SIZE_FIELD_SIZE 8       /* bytes: the big-endian u64 size before each object */
#define SFS_EMPTY_OFFSET UINT64_MAX /* offset of an empty or deleted slot */

typedef enum sfs_status {
    SFS_OK = 0,
    SFS_ENOTFOUND = -1,  /* key absent, slot empty or deleted */
    SFS_ECORRUPT = -2,   /* the file's bytes contradict the format */
    SFS_EIO = -3,        /* a system call failed; errno is in sfs_error_t */
    SFS_EINVAL = -4,     /* bad argument (e.g. range outside an object) */
    SFS_EDUPLICATE = -5, /* writer: the key was added already */
    SFS_ENOMEM = -6,     /* allocation failed */
    SFS_ELIMIT = -7,     /* writer: a shard holds at most 2^32 - 3 objects (cmph's u32) */
    SFS_EHASH = -8,      /* writer: no perfect hash could be built, or it failed its check */
    SFS_EAGAIN = -9,     /* _nowait: the bytes are not all in the page cache */
    SFS_ESTALE = -10,    /* sidecar: built for another shard (sidecar.h) */
} sfs_status;

typedef struct sfs_error {
    int status;      /* an sfs_status */
    int sys_errno;   /* errno for SFS_EIO, else 0 */
    char message[512];
} sfs_error_t;

/* The seven header fields, in host byte order (stored big-endian). */
typedef struct sfs_header {
    uint64_t version;
    uint64_t objects_count;    /* objects written; deletes do not change it */
    uint64_t objects_position; /* byte offset of the first object */
    uint64_t objects_size;     /* bytes of the objects section */
    uint64_t index_position;   /* byte offset of slot 0 */
    uint64_t index_size;       /* bytes: number of slots * 40 */
    uint64_t hash_position;    /* byte offset of the cmph dump */
} sfs_header_t;

/* ---------------------------------------------------------------- reader */

typedef struct sfs_shard sfs_shard_t;

/* Open and validate the shard at `path`: a regular file or a block device,
 * or a source another kind claims ("rbd:POOL/IMAGE": rbd.h, docs/ceph.md).
 * Validation, before anything is used: magic, version, every position and
 * size inside the file and in order, index_size a multiple of 40, objects_count
 * <= slots, and the whole CHD_PH dump (lengths, internal sizes, select table,
 * every bucket's displacement code) inside the hash section. The extent
 * [0, end of hash) comes from the header; the file or device may be larger.
 * `writable` opens O_RDWR (for delete).
 * Returns SFS_OK and sets *out, or SFS_ECORRUPT / SFS_EIO / SFS_ENOMEM. */
int sfs_open(const char *path, int writable, sfs_shard_t **out, sfs_error_t *err);

/* Let go of the shard: unmapped and closed when no other holder (sfs_ref)
 * remains. NULL is accepted. */
void sfs_close(sfs_shard_t *shard);

/* One more holder of an open shard, each let go by its own sfs_close():
 * what a mount's request snapshot (ll.h) or a call running without the
 * GIL holds. Thread-safe. Returns `shard`. */
sfs_shard_t *sfs_ref(sfs_shard_t *shard);

const sfs_header_t *sfs_header(const sfs_shard_t *shard);
const char *sfs_path(const sfs_shard_t *shard);
/* The file descriptor the shard was opened with (O_CLOEXEC), valid until
 * sfs_close(). Another process may reopen the very same file through
 * /proc/<pid>/fd/<fd> even after it was renamed over or unlinked. */
int sfs_fd(const sfs_shard_t *shard);
uint64_t sfs_slot_count(const sfs_shard_t *shard); /* index_size / 40 */
uint64_t sfs_extent(const sfs_shard_t *shard);     /* bytes: end of the hash section */
uint64_t sfs_hash_size(const sfs_shard_t *shard);  /* bytes of the cmph dump */

/* The slot a key hashes to, in [0, slot_count). Never fails on a validated
 * shard; any 32 bytes map to some slot. */
uint32_t sfs_slot_of(const sfs_shard_t *shard, const uint8_t key[SFS_KEY_SIZE]);

/* Raw slot `slot`: copies its key to key_out (may be NULL) and returns the
 * stored object offset (SFS_EMPTY_OFFSET for an empty or deleted slot). */
uint64_t sfs_slot_get(const sfs_shard_t *shard, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE]);

/* Start loading the offset field of slot `slot` into the CPU cache
 * (__builtin_prefetch): a hint for a caller about to read many slots in an
 * order of its own (sfs_sidecar_deleted), so that their cache misses
 * overlap. Reads nothing and never fails; a slot outside [0, slot_count)
 * is ignored. */
void sfs_prefetch_slot_entry(const sfs_shard_t *shard, uint64_t slot);

/* Find `key`. On SFS_OK, *data_offset is the absolute byte offset of the
 * object's first byte (just after its size field) and *size its length in
 * bytes; both checked to lie inside the objects section. Returns SFS_ENOTFOUND
 * for an absent key, an empty or a deleted slot, SFS_ECORRUPT when the slot
 * or the size field point outside the objects section. */
int sfs_lookup(const sfs_shard_t *shard, const uint8_t key[SFS_KEY_SIZE],
               uint64_t *data_offset, uint64_t *size);

/* The answer of one key of sfs_lookup_batch. */
typedef struct sfs_found {
    uint64_t data_offset; /* SFS_OK: absolute byte offset of the object's first byte */
    uint64_t size;        /* SFS_OK: the object's length in bytes */
    uint32_t slot;        /* the key's slot (perfect hash value) */
    int status;           /* SFS_OK, SFS_ENOTFOUND or SFS_ECORRUPT, as sfs_lookup_slot */
} sfs_found_t;

/* Look up n keys (`keys`: n x 32 bytes, back to back) into found[0..n):
 * for each, the answer sfs_lookup_slot gives, faster than n calls of it.
 * The stages of consecutive lookups overlap: the slot of a key is computed
 * and prefetched (__builtin_prefetch) 8 keys before it is read, and its
 * size field 8 keys before that is resolved, so the cache misses of about
 * 16 lookups are in flight at once. When two groups of 8 lookups in a row
 * take over 20 us each (they waited for the device), the slots of the remaining keys are
 * asked of the kernel at once (posix_fadvise WILLNEED), and the size field
 * of each found key 8 keys before it is read, so their device reads
 * overlap. Returns how many keys are SFS_ECORRUPT (0 on a sound shard).
 * Touches the mapping: call under SFS_GUARDED (guard.h). */
size_t sfs_lookup_batch(const sfs_shard_t *shard, const uint8_t *keys, size_t n, sfs_found_t *found);

/* sfs_lookup that also gives the key's slot (for stable inode numbers),
 * hashing the key once. */
int sfs_lookup_slot(const sfs_shard_t *shard, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                    uint64_t *data_offset, uint64_t *size);

/* Start loading into the CPU cache the reader's own fields that a lookup
 * reads first (its header fields and perfect-hash parameters): a hint for a
 * caller about to look a key up in one of thousands of shards, so that
 * these misses overlap its other work. Reads nothing else and never fails;
 * NULL is accepted. */
void sfs_prefetch_reader(const sfs_shard_t *shard);

/* sfs_lookup that never waits for the device: the slot and the size field
 * are read with preadv2(RWF_NOWAIT), which copies from the page cache or
 * fails at once. Also gives the slot. SFS_EAGAIN when a byte is not cached
 * (or the kernel cannot tell): retry with sfs_lookup in a thread that may
 * block. Other results as sfs_lookup. */
int sfs_lookup_nowait(const sfs_shard_t *shard, const uint8_t key[SFS_KEY_SIZE], uint32_t *slot,
                      uint64_t *data_offset, uint64_t *size);

/* sfs_read from the page cache only: SFS_EAGAIN unless every byte is
 * cached (always, for a length > 0, when the kind's object bytes are never
 * cached here: an rbd: source); SFS_EINVAL outside the objects section. */
int sfs_read_nowait(const sfs_shard_t *shard, uint64_t offset, void *dst, size_t length);

/* Start reading bytes [offset, offset+length) of the objects section
 * without waiting: for a file, into the page cache (posix_fadvise
 * WILLNEED); for an rbd: source, an asynchronous read of the first 128 KiB
 * that the next sfs_read within them takes (rbd.h). Returns at once, the
 * reads complete in the background. SFS_EINVAL outside the objects
 * section. Used to overlap an object's device read with the requests that
 * precede its first read. */
int sfs_prefetch(const sfs_shard_t *shard, uint64_t offset, uint64_t length);

/* Ask the kernel to start reading the index slot of `key` into the page
 * cache (posix_fadvise WILLNEED of its 40 bytes): returns at once. Used to
 * overlap the device reads of a batch's lookups once one of them was found
 * to wait for the device. Never fails on a validated shard. */
void sfs_prefetch_slot(const sfs_shard_t *shard, const uint8_t key[SFS_KEY_SIZE]);

/* Resolve a raw slot as sfs_lookup does, without the hash (for iteration
 * and checks). SFS_ENOTFOUND for an empty slot, SFS_ECORRUPT when out of
 * bounds. */
int sfs_slot_object(const sfs_shard_t *shard, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE],
                    uint64_t *data_offset, uint64_t *size);

/* sfs_slot_object from the page cache only (preadv2 RWF_NOWAIT of the slot
 * and of the size field): SFS_EAGAIN when a byte is not cached; retry with
 * sfs_slot_object in a thread that may block. Used to open an object the
 * kernel got from a listing (its inode names a slot) without a thread. */
int sfs_slot_object_nowait(const sfs_shard_t *shard, uint64_t slot, uint8_t key_out[SFS_KEY_SIZE],
                           uint64_t *data_offset, uint64_t *size);

/* Copy `length` bytes at absolute byte `offset` of the shard into dst.
 * The range must lie inside the objects section, else SFS_EINVAL; SFS_EIO
 * (errno set) when the file cannot be read (for an rbd: source, when the
 * cluster failed or timed out: ETIMEDOUT, ESTALE...). For a file, small
 * ranges are copied from the mapping, large ones read with pread() (one
 * device request); for an rbd: source, read from the image (rbd.h). */
int sfs_read(const sfs_shard_t *shard, uint64_t offset, void *dst, size_t length);

/* Pointer to the mapped bytes at `offset` (inside the objects section, with
 * `length` bytes available), or NULL (outside it, or the kind maps no
 * object bytes: an rbd: source). Valid until sfs_close(). */
const uint8_t *sfs_data(const sfs_shard_t *shard, uint64_t offset, uint64_t length);

/* The name of the shard's kind of source (kind.h): "file" (a regular file
 * or block device) or "rbd" (an RBD image: its object bytes read from the
 * cluster, so sfs_data gives NULL, sfs_read_nowait SFS_EAGAIN, and
 * sfs_prefetch starts an asynchronous read of the range's first 128 KiB
 * that the next sfs_read within it takes: rbd.h; its index and sizes from
 * a local copy). A static string, for messages and logs: code that must
 * behave differently tests a capability (sfs_kind_flags), not the name. */
const char *sfs_kind_name(const sfs_shard_t *shard);

/* Capabilities of a kind (sfs_kind_flags). */
/* Object bytes come from a remote source over the network (kind "rbd"):
 * a read may wait up to the source's timeout, and SFS_EIO from it means
 * the source failed or timed out (reading again would wait as long
 * again: answer the error); and nothing keeps those bytes in this host's
 * page cache, so a read done only to warm a cache (a FUSE store) costs a
 * network round trip. */
#define SFS_KIND_REMOTE 0x1u
/* Object bytes are decoded (a zstd-compressed MOSAIC file): a read at
 * offset N of an object decodes its first N bytes too, so an object read
 * in several pieces costs O(size^2 / piece); read it whole once (the C
 * request path then stores the rest into the page cache: ll_fast_read). */
#define SFS_KIND_DECODES 0x2u

/* The SFS_KIND_* flags of the shard: its kind's, and those its kind set
 * for this source at open (SFS_KIND_DECODES). Never changes once open. */
unsigned sfs_kind_flags(const sfs_shard_t *shard);

/* For a source reached through a connection (an rbd: source), the one-line
 * message of its last failed connection (why reads fail: "rbd:P/I: no such
 * image", a changed header...), "" when none; NULL for a file. */
const char *sfs_source_error(const sfs_shard_t *shard);

/* n reads at once: lengths[i] bytes at offsets[i] into dsts[i]; results[i]
 * gets SFS_OK, SFS_EINVAL (outside the objects section) or SFS_EIO; errno,
 * when one failed with SFS_EIO, is the first such range's (as for
 * sfs_read). Every range is attempted whatever fails. For an rbd: source
 * all are in flight together (asynchronous librbd reads, 64 at a time);
 * for a file, sfs_read each in turn, the first bytes of the range 4 ahead
 * prefetched into the CPU cache, and once 8 copies (or one over 16 KiB)
 * took longer than 20 us plus 0.5 ns per byte (they waited for the
 * device), every remaining range asked of the kernel at once
 * (posix_fadvise WILLNEED), so that their device reads overlap. Touches
 * the mapping: call under SFS_GUARDED (guard.h). Returns SFS_OK. */
int sfs_read_many(const sfs_shard_t *shard, size_t n, const uint64_t *offsets,
                  const size_t *lengths, void *const *dsts, int *results);

/* Number of live (non-empty) slots; scans the index once, then cached. */
uint64_t sfs_live_count(sfs_shard_t *shard);

/* Structure check: every live slot's key hashes to its own slot, its offset
 * and size lie inside the objects section, and live count <= objects_count.
 * Calls report(ctx, message) for each problem (at most `max_reports` times)
 * and returns the number of problems found (0 = clean). */
uint64_t sfs_check(sfs_shard_t *shard, void (*report)(void *ctx, const char *message),
                   void *ctx, uint64_t max_reports);

/* Takedown, as the reference does it: for a found key, zero the object's
 * size field and bytes in place, then write the empty-slot marker into its
 * slot, then fdatasync. The shard must be opened writable. SFS_ENOTFOUND when
 * the key is absent. */
int sfs_delete(sfs_shard_t *shard, const uint8_t key[SFS_KEY_SIZE], sfs_error_t *err);

/* ---------------------------------------------------------------- writer */

typedef struct sfs_writer sfs_writer_t;

/* Start a shard to be published at `path`. Objects are written to a
 * temporary file in the same directory (unnamed where the file system has
 * O_TMPFILE, else `.<name>.tmp-XXXXXX`); nothing appears at `path` until
 * sfs_writer_finish() succeeds (then by link or rename). When `path` is a
 * block device, the device is written in place instead.
 * Returns SFS_OK and sets *out; else *out = NULL and nothing is left behind:
 * SFS_EIO (errno in err) when the temporary file cannot be created in the
 * directory of `path` (ENOENT, ENOTDIR, EACCES, EROFS, ENOSPC...) or the
 * block device cannot be opened for writing (EACCES, EBUSY...); SFS_ENOMEM. */
int sfs_writer_open(const char *path, sfs_writer_t **out, sfs_error_t *err);

/* Append one object. Returns SFS_OK, or one of these with nothing of the
 * object left in the shard and the writer usable (the objects added before
 * stay; add again, finish or abort):
 * SFS_EDUPLICATE when the key was added already; SFS_ELIMIT when the shard
 * holds 2^32 - 3 objects already; SFS_ENOMEM when the key table cannot
 * grow; SFS_EIO (errno in err: ENOSPC, EDQUOT, EFBIG, EIO...) when writing
 * to the file or device failed. */
int sfs_writer_add(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], const void *data,
                   uint64_t size, sfs_error_t *err);

/* Append one object of exactly `size` bytes read from file descriptor `fd`
 * at its current position, streamed through a fixed buffer. Returns as
 * sfs_writer_add, and also SFS_EIO when reading fd failed (its errno) or
 * fd ended before `size` bytes (the file shrank: errno EIO); the object is
 * rolled back then too, the writer stays usable, fd's position is wherever
 * the reads left it. */
int sfs_writer_add_fd(sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE], int fd, uint64_t size,
                      sfs_error_t *err);

/* What sfs_writer_add_files() found at paths[done] when it stopped early. */
enum sfs_file_kind {
    SFS_FILE_REGULAR = 0,   /* (not a stop: every path was consumed) */
    SFS_FILE_DIRECTORY = 1, /* a directory */
    SFS_FILE_OTHER = 2,     /* neither a regular file nor a directory (FIFO, socket, device) */
};

typedef struct sfs_add_files_result {
    size_t done;       /* paths consumed, from paths[0] on */
    int stopped;       /* an sfs_file_kind: SFS_FILE_REGULAR when done == n, else the kind
                        * of paths[done], which was not consumed */
    size_t *dup_index; /* indexes into paths of the duplicates skipped (malloc'ed, the caller
                        * frees it), their keys in dup_keys (32 bytes each) */
    uint8_t *dup_keys;
    size_t n_dups;
} sfs_add_files_result_t;

/* Add regular files by path, in the order given, each as one object keyed by
 * the SHA-256 of its content (OpenSSL); a content already in the shard is
 * skipped and listed as a duplicate. `threads` threads (1 to 64) open, fstat,
 * read and hash the files ahead of the calling thread, which appends them in
 * order; at most a window of files is in memory at once. Files of up to
 * `small` bytes are read whole into memory; larger ones are hashed, then
 * read again and streamed by the writer (memory bounded by a 1 MiB buffer
 * per thread). A file is opened without blocking (O_NONBLOCK: a FIFO does
 * not hang) and read up to its fstat size: fewer bytes is an error (it
 * shrank), more are ignored. Files that are the shard being written, or whose
 * (st_dev, st_ino) is (exclude_dev, exclude_ino) when `exclude` is set, are
 * skipped silently (not objects, not duplicates).
 *
 * Stops before paths[i] when it is not a regular file (or cannot be opened
 * for being a socket: ENXIO), with res->done = i and res->stopped its kind,
 * so that the caller walks a directory or skips it; returns SFS_OK then, as
 * when every path was consumed.
 *
 * Errors: SFS_EIO naming the file with its errno (ENOENT, EACCES, ELOOP...;
 * EIO when it shrank), or naming the shard on a write error; SFS_ENOMEM
 * (also when no reader thread can be started: pthread_create's errno,
 * EAGAIN); SFS_ELIMIT as sfs_writer_add; SFS_EINVAL when OpenSSL offers no
 * SHA-256. Then res->done is the index of the failed path (0 when none was
 * read), the objects before it stay added, the writer stays usable, and
 * res->dup_index, res->dup_keys and res->n_dups are NULL, NULL and 0 (the
 * duplicates skipped before the error are not reported). */
int sfs_writer_add_files(sfs_writer_t *w, const char *const *paths, size_t n, uint64_t small,
                         unsigned threads, int exclude, uint64_t exclude_dev, uint64_t exclude_ino,
                         sfs_add_files_result_t *res, sfs_error_t *err);

/* 1 if the key was added already, else 0. */
int sfs_writer_contains(const sfs_writer_t *w, const uint8_t key[SFS_KEY_SIZE]);
uint64_t sfs_writer_count(const sfs_writer_t *w);       /* objects added */
uint64_t sfs_writer_bytes(const sfs_writer_t *w);       /* object bytes added */

/* Where the time of sfs_writer_finish() went, in seconds (wall clock). */
typedef struct sfs_build_stats {
    double hash_seconds;  /* building the perfect hash (builder below) */
    double check_seconds; /* cmph_load + every key through cmph_search and ours */
    double index_seconds; /* last objects flushed, index and hash written */
    double sync_seconds;  /* header, fdatasync, rename, directory fsync */
    uint64_t slots;       /* slots in the index */
    const char *builder;  /* "shardfs" (chd_build.c) or "cmph" (static string) */
} sfs_build_stats_t;

/* Build the perfect hash, write index, hash and header, fdatasync, rename
 * into place and fsync the directory. Frees the writer whatever the result;
 * on failure the temporary file is removed and `path` is untouched (a block
 * device keeps what was written: its first 512 bytes, the header, are
 * written last, so an older shard's header may remain over new objects).
 * `stats` (may be NULL) receives the timings on success.
 * Errors: SFS_EIO (errno in err) when writing the last objects, the index,
 * the hash or the header, ftruncate, fdatasync (EINVAL and EROFS ignored: a
 * file that cannot be synced), linking or renaming into place (EACCES,
 * EISDIR...), close, or the in-memory stream cmph_load reads (fmemopen,
 * fclose) failed; SFS_ENOMEM; SFS_EHASH when no perfect hash could be built
 * (ours found no seed, then cmph's builder failed too: the message gives
 * both reasons) or the check of every key against cmph and our evaluator
 * failed (the message says which step: the dump unreadable by our parser,
 * refused by cmph_load, slot counts or a key's slot that disagree). */
int sfs_writer_finish(sfs_writer_t *w, sfs_build_stats_t *stats, sfs_error_t *err);

/* Discard: remove the temporary file and free the writer. NULL accepted. */
void sfs_writer_abort(sfs_writer_t *w);

/* Human-readable name of a status. */
const char *sfs_strstatus(int status);

#ifdef __cplusplus
}
#endif
#endif
