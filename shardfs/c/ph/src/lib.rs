//! sfs-ph — C access to the lookup of `ph::fmph::GOFunction` (ph 0.10.0).
//!
//! What it is: ph itself behind the C API of shardfs/c/ph.h (a static
//! library, libsfs_ph.a), kept only as the test oracle of shardfs/c/gof.c,
//! the C port of the lookup that shardfs builds with (no Rust needed
//! there). Its tests check this wrapper against ph and against an
//! independent re-implementation, and write the fixtures (ph's answers)
//! that tests/c/test_ph.c checks gof.c against. This file only adds the
//! glue: a size check of the bytes before ph parses them (the rules gof.c
//! follows too), and catch_unwind around every exported function so that
//! no panic crosses the C ABI.
//!
//! License: the `ph` crate (https://crates.io/crates/ph, Piotr Beling,
//! https://github.com/beling/bsuccinct-rs) and its dependencies are
//! "MIT OR Apache-2.0"; they are linked into libsfs_ph.a, which is under the
//! same terms.
//!
//! Where the facts come from:
//! - swh-mosaic 0.7.0, src/reader.rs: `load_index` reads the bytes of the
//!   Map element with `GOFunction::read(&mut slice)` (a `GOFunction` with its
//!   default type parameters) and `find_index_entry(key: &[u8])` calls
//!   `self.mph.get(key)`, i.e. `get::<[u8]>`. src/creator.rs builds the
//!   function with `GOFunction::new` over `bytes::Bytes` keys (hashed as
//!   `[u8]`, bytes 1.x `impl Hash for Bytes`) and writes it with `write`.
//! - ph 0.10.0, src/fmph/gofunction.rs (`write`, `read_with_hasher`,
//!   `get_stats`), src/seeds.rs (`TwoToPowerBitsStatic`), src/utils.rs
//!   (`read_bits`), binout 0.3.2 (`VByte`, `AsIs`), seedable_hash 0.2.3
//!   (`BuildDefaultSeededHasher`, `Seedable`).
//!
//! Serialized form of the default `GOFunction` (group size 16 bits, seed
//! size 4 bits), as `GOFunction::write` writes it; integers little-endian:
//!
//! ```text
//!   u8      bits per group = 16
//!   VByte   L, the number of levels, then L VBytes: each level's size in
//!           groups (s_i >= 4, a multiple of 4, when written by ph)
//!   u64     fingerprint array: ceil(16 * G / 64) words, G = sum of s_i
//!   u8      bits per seed = 4
//!   u64     group seeds: ceil(4 * G / 64) words (4 bits per group)
//! ```
//!
//! VByte is binout's u64 encoding: LEB128 (7 bits per byte, low first, high
//! bit = "more") for up to 8 bytes, then a 9th byte holding bits 56..63 as
//! is. No length prefix precedes either word array: their sizes follow from
//! G. Total: 2 + |VBytes| + 8 * (ceil(G/4) + ceil(G/16)) bytes.
//!
//! The hash: ph's `Cargo.toml` asks for seedable_hash with default features
//! off, and nothing in swh-mosaic's dependency tree turns a hasher feature on,
//! so `BuildDefaultSeededHasher` is `Seedable<BuildHasherDefault<
//! std::collections::hash_map::DefaultHasher>>`: the hash of a key at level
//! l is std's DefaultHasher (SipHash-1-3, keys 0, 0, as of Rust 1.95) fed
//! with `l` as a native-endian u64, then the key as `[u8]` hashes itself
//! (its length as a native-endian usize, then its bytes). The tests pin
//! this with an independent SipHash-1-3 and a compile-time type check.
//! std documents DefaultHasher's algorithm as unspecified: a future Rust
//! could change it and with it every MOSAIC index (ours and swh-mosaic's
//! alike); 64-bit little-endian hosts only give the same hashes.

use std::panic::{catch_unwind, AssertUnwindSafe};

use ph::fmph::GOFunction;
use ph::GetSize;

/// The opaque handle of ph.h (`sfs_gof_t`).
pub struct SfsGof {
    f: GOFunction,
}

/// Bits per group of the default GOFunction (`TwoToPowerBitsStatic<4>`).
const GROUP_BITS: u8 = 16;
/// Bits per group seed of the default GOFunction (`TwoToPowerBitsStatic<2>`).
const SEED_BITS: u8 = 4;

/// binout 0.3.2's `vbyte_read(input, 8 * 7)`: the u64 VByte at `*pos`.
fn read_vbyte(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut result = 0u64;
    let mut shift = 0u32;
    while shift < 56 {
        let b = *buf.get(*pos)?;
        *pos += 1;
        result |= ((b & 0x7F) as u64) << shift;
        if b < 128 {
            return Some(result);
        }
        shift += 7;
    }
    let b = *buf.get(*pos)?;
    *pos += 1;
    Some(result | ((b as u64) << 56))
}

/// Bytes remaining after `pos` must hold `n` more: Some(pos + n) or None.
fn take(buf: &[u8], pos: usize, n: usize) -> Option<usize> {
    let end = pos.checked_add(n)?;
    (end <= buf.len()).then_some(end)
}

/// Walks the serialized function in `buf` without allocating and returns
/// the number of bytes `GOFunction::read` will consume, or None when the
/// bytes cannot be a default GOFunction that fits in `buf`: a group size
/// other than 16 or seed size other than 4 (ph rejects them too), a level
/// count or array that does not fit in what remains of `buf` (ph would
/// `Vec::with_capacity` it first: an unbounded allocation), a level of 0
/// groups (never written by ph; `get` would read one group past the seeds
/// and the array, unchecked, at the end of such a level) or a total that
/// overflows.
///
/// After it, ph's own reader allocates at most: level sizes 8 * L bytes
/// (L <= len), the fingerprint array and seeds (<= len bytes), the rank
/// structure (about 1/32 of the array): under 10 * len bytes in all.
fn validated_size(buf: &[u8]) -> Option<usize> {
    let mut pos = 0usize;
    if *buf.first()? != GROUP_BITS {
        return None;
    }
    pos += 1;
    let levels = read_vbyte(buf, &mut pos)?;
    // each level size takes at least one byte
    if levels > (buf.len() - pos) as u64 {
        return None;
    }
    let mut groups = 0usize;
    for _ in 0..levels {
        let s = read_vbyte(buf, &mut pos)?;
        if s == 0 {
            return None;
        }
        groups = groups.checked_add(usize::try_from(s).ok()?)?;
    }
    // array: read_bits(16 * G) = ceil(16G / 64) u64 words
    let array_words = groups.div_ceil(64 / GROUP_BITS as usize);
    pos = take(buf, pos, array_words.checked_mul(8)?)?;
    if *buf.get(pos)? != SEED_BITS {
        return None;
    }
    pos += 1;
    // seeds: read_bits(4 * G) = ceil(4G / 64) u64 words
    let seed_words = groups.div_ceil(64 / SEED_BITS as usize);
    pos = take(buf, pos, seed_words.checked_mul(8)?)?;
    Some(pos)
}

/// Parse `buf` (checked first, then `GOFunction::read`); returns the
/// function and the bytes it took.
fn read_gof(buf: &[u8]) -> Option<(GOFunction, usize)> {
    let size = validated_size(buf)?;
    let mut input = &buf[..size];
    let f = GOFunction::read(&mut input).ok()?;
    // ph must have consumed exactly what the walk above counted
    if !input.is_empty() {
        return None;
    }
    Some((f, size))
}

/// See ph.h. Never reads past `buf[len)`; NULL on malformed or truncated
/// bytes, NULL buf with len > 0, or a panic inside ph.
///
/// # Safety
/// `buf` must be readable for `len` bytes (or `len` == 0); `used` NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn sfs_gof_read(buf: *const u8, len: usize, used: *mut usize) -> *mut SfsGof {
    if buf.is_null() && len != 0 {
        return std::ptr::null_mut();
    }
    let bytes: &[u8] = if len == 0 { &[] } else { std::slice::from_raw_parts(buf, len) };
    match catch_unwind(AssertUnwindSafe(|| read_gof(bytes))) {
        Ok(Some((f, size))) => {
            if !used.is_null() {
                *used = size;
            }
            Box::into_raw(Box::new(SfsGof { f }))
        }
        _ => std::ptr::null_mut(),
    }
}

/// See ph.h: `f.get(key)` with key: `&[u8]`, as swh-mosaic's
/// find_index_entry; the value in [0, n) or -1 for None (and for NULL f,
/// NULL key with len > 0, or a panic).
///
/// # Safety
/// `f` NULL or from sfs_gof_read and not freed; `key` readable for `len`
/// bytes (or `len` == 0).
#[no_mangle]
pub unsafe extern "C" fn sfs_gof_get(f: *const SfsGof, key: *const u8, len: usize) -> i64 {
    if f.is_null() || (key.is_null() && len != 0) {
        return -1;
    }
    let key: &[u8] = if len == 0 { &[] } else { std::slice::from_raw_parts(key, len) };
    let f = &*f;
    match catch_unwind(AssertUnwindSafe(|| f.f.get(key))) {
        Ok(Some(v)) => i64::try_from(v).unwrap_or(-1),
        _ => -1,
    }
}

/// See ph.h. NULL accepted.
///
/// # Safety
/// `f` NULL or from sfs_gof_read and not yet freed.
#[no_mangle]
pub unsafe extern "C" fn sfs_gof_free(f: *mut SfsGof) {
    if !f.is_null() {
        // dropping frees boxed slices only; a panic here is not possible in
        // practice, but it must not unwind into C either
        let b = Box::from_raw(f);
        let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
    }
}

/// See ph.h: bytes of memory held by the handle (GetSize of the function,
/// struct included); 0 for NULL.
///
/// # Safety
/// `f` NULL or from sfs_gof_read and not freed.
#[no_mangle]
pub unsafe extern "C" fn sfs_gof_size_bytes(f: *const SfsGof) -> u64 {
    if f.is_null() {
        return 0;
    }
    let f = &*f;
    catch_unwind(AssertUnwindSafe(|| f.f.size_bytes() as u64)).unwrap_or(0)
}

#[cfg(test)]
mod tests;
