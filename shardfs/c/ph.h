/*
 * ph.h — the minimal perfect hash function of a Software Heritage MOSAIC
 * index: ph::fmph::GOFunction of the Rust crate ph 0.10.0 (FMPHGO, P.
 * Beling, "Fingerprinting-based minimal perfect hashing revisited", ACM
 * JEA 2023), read and evaluated in C by shardfs/c/gof.c (no Rust at build
 * or run time). gof.c says where each step of the lookup and of the hash
 * comes from in ph 0.10.0, seedable_hash 0.2.3, binout 0.3.2 and Rust's
 * std; the Rust crate shardfs/c/ph/ (ph itself behind this same API) is
 * kept only as the test oracle: its tests write the fixtures that
 * tests/c/test_ph.c checks gof.c against.
 *
 * Source of the facts: swh-mosaic 0.7.0, src/reader.rs (load_index parses
 * the Map element's bytes with `GOFunction::read`, the type with its default
 * parameters; find_index_entry(key: &[u8]) calls `mph.get(key)`) and
 * src/creator.rs (GOFunction::new over the index's keys, then `write`);
 * ph 0.10.0, src/fmph/gofunction.rs (GOFunction::write, read_with_hasher,
 * get_stats). The format (all integers little-endian):
 *
 *   u8     bits per group = 16
 *   VByte  L = number of levels, then L VBytes: level sizes in groups s_i
 *          (G = sum of s_i); VByte = LEB128 for up to 8 bytes, then a 9th
 *          byte holding bits 56..63 as is
 *   u64    ceil(G / 4) words: the fingerprint array, 16 bits per group
 *   u8     bits per seed = 4
 *   u64    ceil(G / 16) words: the group seeds, 4 bits per group
 *
 * The hash is Rust std's DefaultHasher (SipHash-1-3, keys 0, 0) over the
 * level number as a u64, the key's length as a u64, then the key's bytes,
 * all little-endian: ph's default hasher when no hasher feature of the
 * seedable_hash crate is enabled, as in swh-mosaic's build. Rust leaves
 * DefaultHasher's algorithm unspecified: gof.c computes SipHash-1-3 itself
 * (the hash of the files swh-mosaic wrote with Rust 1.x on 64-bit
 * little-endian hosts, whatever the host of gof.c); the oracle crate's
 * tests pin the Rust side (golden values), so that a toolchain that
 * changed it, and with it the files written from then on, fails there.
 *
 * Values: for a key of the set the function was built from, a distinct
 * value in [0, n), n = that set's size (the key's entry in the index). For
 * any other key, either "none" (-1) or some value in [0, n): the caller
 * must compare the key stored at that entry, as swh-mosaic does.
 *
 * Errors: no function reports why; sfs_gof_read returns NULL on any bad
 * input and when malloc fails, sfs_gof_get -1. sfs_gof_read checks every
 * size against `len` before it allocates anything, then makes one
 * allocation of at most 4 * len + 128 bytes (1.1 times the function's
 * size for one of 100000 keys).
 *
 * Thread safety: a handle is immutable after sfs_gof_read; any number of
 * threads may call sfs_gof_get and sfs_gof_size_bytes on it at once (no
 * lock, no allocation). sfs_gof_free must follow every other use.
 *
 * Linking: compile shardfs/c/gof.c with the rest of the C core (C11 with
 * GNU builtins: __builtin_popcountll; unsigned __int128 where the compiler
 * has it, else a 64x64 multiply in 32-bit halves); no library. Written
 * for any host, 32- or 64-bit, either byte order; tested on x86-64 only.
 */
#ifndef SHARDFS_PH_H
#define SHARDFS_PH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A GOFunction read from its serialized bytes (opaque; gof.c). */
typedef struct sfs_gof sfs_gof_t;

/* Parse a GOFunction from buf[0..len), as GOFunction::write wrote it (what
 * a MOSAIC Map element holds). Bytes past the function are ignored: on
 * success *used (when `used` is not NULL) receives the number of bytes the
 * function took, at most len (a Map element's size, when nothing trails).
 * Never reads outside buf[0..len); the bytes are copied, buf may be freed
 * or unmapped afterwards.
 * Returns a handle for sfs_gof_get, to release with sfs_gof_free; NULL (and
 * *used untouched) when the bytes are truncated or malformed: a group size
 * other than 16 or seed size other than 4, a level count, level size or
 * array that does not fit in len, a level of 0 groups (never written by ph,
 * and one that ph's own reader accepts but would read out of bounds on), a
 * sum that overflows; for buf NULL or len 0; when malloc fails. Memory:
 * about 2.2 bits per key of the set (the serialized size) plus 1/10 of it
 * for the rank structure (sfs_gof_size_bytes); O(len) time. */
sfs_gof_t *sfs_gof_read(const uint8_t *buf, size_t len, size_t *used);

/* The value of the key key[0..len): ph's `f.get(key)` with key as `&[u8]`,
 * exactly as swh-mosaic's find_index_entry (a MOSAIC key is a 20-byte sha1
 * or sha1_git, or a 32-byte sha256 or blake2s256, in binary). Returns the
 * value in [0, n), or -1 when the function finds no level for the key (a
 * key not in the set; a key of the set always has a value), and -1 for a
 * NULL f or a NULL key with len > 0. Cost: one SipHash-1-3 of 16 + len
 * bytes per level visited (1.7 levels on average for a key of the set),
 * a few random reads in the function's arrays; no allocation (a key not in
 * the set may visit every level: L hashes, L being whatever a damaged
 * function says, up to len / 3.5, as in ph). About 47 ns
 * for a 32-byte key of a 1M-key function (gcc -O2, one x86-64 core; ph's
 * own get: 74 ns). */
int64_t sfs_gof_get(const sfs_gof_t *f, const uint8_t *key, size_t len);

/* Release the handle. NULL is accepted. */
void sfs_gof_free(sfs_gof_t *f);

/* Bytes of memory held by the handle (its one allocation: arrays, level
 * sizes, rank structure and the struct itself), for information output;
 * 0 for NULL. */
uint64_t sfs_gof_size_bytes(const sfs_gof_t *f);

#ifdef __cplusplus
}
#endif
#endif
