//! Tests of the C entry points (called as C would, through raw pointers),
//! against ph's own `GOFunction::get` and against `reference_get`, an
//! independent re-implementation of the lookup from the serialized bytes
//! (SipHash-1-3 included) that pins down what the bytes and hash are.
//!
//! `c_fixtures` also writes target/fixtures/*.bin for tests/c/test_ph.c,
//! which checks shardfs/c/gof.c (the C port of the lookup that shardfs
//! builds with) against ph's answers: format at `record`.

use super::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::collections::HashSet;
use std::hash::BuildHasherDefault;
use std::ptr;

// ---------------------------------------------------------------------------
// Allocation accounting: per thread, the largest single request and the sum
// of all requests, so that a test can bound what one sfs_gof_read call
// allocated. A single request over 1 GiB returns NULL (the process aborts
// with "memory allocation failed"): a loud failure instead of swapping.

struct Tracking;

thread_local! {
    static LARGEST: Cell<usize> = const { Cell::new(0) };
    static TOTAL: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) -> bool {
    let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
    let _ = TOTAL.try_with(|c| c.set(c.get().saturating_add(size)));
    size <= 1 << 30
}

unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if note(l.size()) { System.alloc(l) } else { ptr::null_mut() }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        if note(l.size()) { System.alloc_zeroed(l) } else { ptr::null_mut() }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        if note(new_size) { System.realloc(p, l, new_size) } else { ptr::null_mut() }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        System.dealloc(p, l)
    }
}

#[global_allocator]
static ALLOC: Tracking = Tracking;

/// Run `f`, returning its result and (largest request, total requested).
fn measured<R>(f: impl FnOnce() -> R) -> (R, usize, usize) {
    LARGEST.with(|c| c.set(0));
    TOTAL.with(|c| c.set(0));
    let r = f();
    (r, LARGEST.with(|c| c.get()), TOTAL.with(|c| c.get()))
}

// ---------------------------------------------------------------------------

/// splitmix64: deterministic keys without a rand dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn distinct_keys(rng: &mut Rng, n: usize, len: usize) -> Vec<Vec<u8>> {
    let mut seen = HashSet::new();
    let mut keys = Vec::with_capacity(n);
    while keys.len() < n {
        let k = rng.bytes(len);
        if seen.insert(k.clone()) {
            keys.push(k);
        }
    }
    keys
}

/// A GOFunction over `keys` (hashed as [u8], as swh-mosaic's Bytes keys)
/// and its serialized bytes.
fn build(keys: &[Vec<u8>]) -> (GOFunction, Vec<u8>) {
    let f = GOFunction::from_slice(keys);
    let mut bytes = Vec::new();
    f.write(&mut bytes).unwrap();
    assert_eq!(bytes.len(), f.write_bytes());
    (f, bytes)
}

/// sfs_gof_read as C calls it: Some((handle, used)) or None for NULL.
fn c_read(buf: &[u8]) -> Option<(*mut SfsGof, usize)> {
    let mut used = usize::MAX;
    let h = unsafe { sfs_gof_read(buf.as_ptr(), buf.len(), &mut used) };
    if h.is_null() {
        assert_eq!(used, usize::MAX, "used written on failure");
        None
    } else {
        assert!(used <= buf.len());
        Some((h, used))
    }
}

fn c_get(h: *const SfsGof, key: &[u8]) -> i64 {
    unsafe { sfs_gof_get(h, key.as_ptr(), key.len()) }
}

// ---------------------------------------------------------------------------
// The independent reference: SipHash-1-3 and the FMPHGO lookup.

fn siphash13(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let (mut v0, mut v1, mut v2, mut v3) = (
        k0 ^ 0x736f6d6570736575,
        k1 ^ 0x646f72616e646f6d,
        k0 ^ 0x6c7967656e657261,
        k1 ^ 0x7465646279746573,
    );
    macro_rules! round {
        () => {
            v0 = v0.wrapping_add(v1); v1 = v1.rotate_left(13); v1 ^= v0; v0 = v0.rotate_left(32);
            v2 = v2.wrapping_add(v3); v3 = v3.rotate_left(16); v3 ^= v2;
            v0 = v0.wrapping_add(v3); v3 = v3.rotate_left(21); v3 ^= v0;
            v2 = v2.wrapping_add(v1); v1 = v1.rotate_left(17); v1 ^= v2; v2 = v2.rotate_left(32);
        };
    }
    let mut chunks = msg.chunks_exact(8);
    for c in &mut chunks {
        let m = u64::from_le_bytes(c.try_into().unwrap());
        v3 ^= m;
        round!();
        v0 ^= m;
    }
    let mut last = (msg.len() as u64 & 0xff) << 56;
    for (i, b) in chunks.remainder().iter().enumerate() {
        last |= (*b as u64) << (8 * i);
    }
    v3 ^= last;
    round!();
    v0 ^= last;
    v2 ^= 0xff;
    round!();
    round!();
    round!();
    v0 ^ v1 ^ v2 ^ v3
}

/// ph's hash of `key` (a [u8]) at `level`: DefaultHasher (SipHash-1-3,
/// keys 0, 0) over level as u64, len as usize, then the key's bytes.
fn reference_hash(key: &[u8], level: u64) -> u64 {
    let mut msg = Vec::with_capacity(16 + key.len());
    msg.extend_from_slice(&level.to_ne_bytes());
    msg.extend_from_slice(&key.len().to_ne_bytes());
    msg.extend_from_slice(key);
    siphash13(0, 0, &msg)
}

/// GOFunction::get re-done from the serialized bytes (the layout in the
/// lib.rs header), for a function accepted by validated_size.
fn reference_get(bytes: &[u8], key: &[u8]) -> Option<u64> {
    let mut pos = 1;
    let levels = read_vbyte(bytes, &mut pos).unwrap() as usize;
    let sizes: Vec<usize> = (0..levels).map(|_| read_vbyte(bytes, &mut pos).unwrap() as usize).collect();
    let g: usize = sizes.iter().sum();
    let words = |at: usize, n: usize| -> Vec<u64> {
        (0..n).map(|i| u64::from_le_bytes(bytes[at + 8 * i..at + 8 * i + 8].try_into().unwrap())).collect()
    };
    let array = words(pos, g.div_ceil(4));
    let seeds = words(pos + 8 * array.len() + 1, g.div_ceil(16));
    let mut before = 0usize;
    for (level, &size) in sizes.iter().enumerate() {
        let hash = reference_hash(key, level as u64);
        let group = before + ((hash as u128 * size as u128) >> 64) as usize;
        let seed = (seeds[group / 16] >> ((group % 16) * 4)) & 15;
        let mut x = (hash as u32) ^ seed as u32; // mix32
        x = (x ^ (x >> 16)).wrapping_mul(0x21f0aaad);
        x = (x ^ (x >> 15)).wrapping_mul(0xd35a2d97);
        x ^= x >> 15;
        let bit = 16 * group + (x & 15) as usize;
        if array[bit / 64] >> (bit % 64) & 1 == 1 {
            let below: u32 = array[..bit / 64].iter().map(|w| w.count_ones()).sum();
            let partial = (array[bit / 64] & ((1u64 << (bit % 64)) - 1)).count_ones();
            return Some((below + partial) as u64);
        }
        before += size;
    }
    None
}

// The hasher swh-mosaic's files use: checked at compile time, so that a
// feature turned on by accident (wyhash, gxhash... in seedable_hash) breaks
// the build instead of every lookup.
const _: fn() -> ph::BuildDefaultSeededHasher = || {
    ph::seedable_hash::Seedable(BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default())
};

#[test]
fn hash_is_siphash13_of_level_len_key() {
    use ph::BuildSeededHasher;
    let h = ph::BuildDefaultSeededHasher::default();
    let mut rng = Rng(7);
    for len in [0usize, 1, 7, 8, 9, 20, 32, 100] {
        for level in [0u64, 1, 2, 63, 1 << 40] {
            let key = rng.bytes(len);
            let k: &[u8] = &key;
            assert_eq!(h.hash_one(k, level), reference_hash(k, level), "len {len} level {level}");
        }
    }
    // std's DefaultHasher is SipHash-1-3 with keys 0, 0 (unspecified by
    // std: this fails first if a toolchain changes it)...
    for len in [0usize, 3, 8, 15, 16, 17, 64] {
        let msg = rng.bytes(len);
        let mut d = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hasher::write(&mut d, &msg);
        assert_eq!(std::hash::Hasher::finish(&d), siphash13(0, 0, &msg), "len {len}");
    }
    // ...and golden values (rustc 1.95's std, confirmed by a separate
    // Python SipHash-1-3): the hash of the 20-byte key 00 01 .. 13 at
    // levels 0 and 1
    let key: Vec<u8> = (0u8..20).collect();
    assert_eq!(h.hash_one(key.as_slice(), 0), GOLDEN[0]);
    assert_eq!(h.hash_one(key.as_slice(), 1), GOLDEN[1]);
}

const GOLDEN: [u64; 2] = [9860465872086675384, 1626979832736295600];

/// Every key of `keys` through C gives ph's value and the reference's, the
/// values are a permutation of 0..n; `others` (not in the set) agree too.
fn check_function(f: &GOFunction, bytes: &[u8], keys: &[Vec<u8>], others: &[Vec<u8>]) {
    let mut buf = bytes.to_vec();
    buf.extend_from_slice(b"trailing bytes not part of the function");
    let (h, used) = c_read(&buf).expect("valid function rejected");
    assert_eq!(used, bytes.len());
    let mut seen = vec![false; keys.len()];
    for k in keys {
        let v = c_get(h, k);
        assert_eq!(Some(v as u64), f.get(k.as_slice()), "C and ph differ");
        assert_eq!(reference_get(bytes, k), Some(v as u64), "reference differs");
        assert!(v >= 0 && (v as usize) < keys.len(), "value {v} out of range");
        assert!(!seen[v as usize], "value {v} twice");
        seen[v as usize] = true;
    }
    for k in others {
        let v = c_get(h, k);
        assert_eq!(f.get(k.as_slice()).map(|x| x as i64).unwrap_or(-1), v);
        assert_eq!(reference_get(bytes, k).map(|x| x as i64).unwrap_or(-1), v);
        assert!(v < keys.len() as i64);
    }
    let size = unsafe { sfs_gof_size_bytes(h) };
    assert!(size as usize + 8 >= bytes.len(), "size_bytes {size} < {}", bytes.len());
    unsafe { sfs_gof_free(h) };
}

#[test]
fn round_trip_20_and_32_byte_keys() {
    let mut rng = Rng(1);
    for len in [20usize, 32] {
        for n in [1usize, 2, 1000, 100_000] {
            let keys = distinct_keys(&mut rng, n, len);
            let others = distinct_keys(&mut rng, 2000, len);
            let (f, bytes) = build(&keys);
            check_function(&f, &bytes, &keys, &others);
        }
    }
}

#[test]
fn empty_function() {
    let (f, bytes) = build(&[]);
    assert_eq!(bytes, [16, 0, 4]);
    check_function(&f, &bytes, &[], &[vec![1, 2, 3]]);
    let (h, _) = c_read(&bytes).unwrap();
    assert_eq!(unsafe { sfs_gof_get(h, ptr::null(), 0) }, -1);
    unsafe { sfs_gof_free(h) };
}

#[test]
fn null_arguments() {
    unsafe {
        assert!(sfs_gof_read(ptr::null(), 10, ptr::null_mut()).is_null());
        assert!(sfs_gof_read(ptr::null(), 0, ptr::null_mut()).is_null());
        assert_eq!(sfs_gof_get(ptr::null(), b"x".as_ptr(), 1), -1);
        assert_eq!(sfs_gof_size_bytes(ptr::null()), 0);
        sfs_gof_free(ptr::null_mut());
        // used may be NULL
        let h = sfs_gof_read([16u8, 0, 4].as_ptr(), 3, ptr::null_mut());
        assert!(!h.is_null());
        assert_eq!(sfs_gof_get(h, ptr::null(), 5), -1);
        sfs_gof_free(h);
    }
}

/// Every proper prefix of `bytes` is rejected, allocating nothing.
fn check_prefixes(bytes: &[u8]) {
    for cut in 0..bytes.len() {
        let prefix = bytes[..cut].to_vec(); // exactly `cut` bytes
        let (r, largest, _) = measured(|| c_read(&prefix));
        assert!(r.is_none(), "prefix of {cut} of {} bytes accepted", bytes.len());
        assert_eq!(largest, 0, "prefix of {cut}: allocated {largest}");
    }
}

#[test]
fn truncated_small_every_prefix() {
    let mut rng = Rng(2);
    for n in [1usize, 2, 37, 1000] {
        let (_, bytes) = build(&distinct_keys(&mut rng, n, 20));
        check_prefixes(&bytes);
    }
}

#[test]
fn truncated_large_every_prefix() {
    let mut rng = Rng(3);
    let (_, bytes) = build(&distinct_keys(&mut rng, 100_000, 32));
    check_prefixes(&bytes);
}

/// Parse `buf` through C; when accepted, look up a few keys (values must be
/// in [0, ones)); in any case bound what the read allocated.
fn parse_anything(buf: &[u8], rng: &mut Rng) {
    let (r, largest, total) = measured(|| c_read(buf));
    let bound = 10 * buf.len() + 4096;
    assert!(largest <= bound && total <= bound, "{} bytes: largest {largest} total {total}", buf.len());
    if let Some((h, used)) = r {
        let n = unsafe { (*h).f.len() } as i64;
        assert_eq!(validated_size(buf), Some(used));
        for _ in 0..20 {
            let len = rng.below(40);
            let v = c_get(h, &rng.bytes(len));
            assert!(v == -1 || (0..n).contains(&v), "value {v} with {n} ones");
        }
        unsafe { sfs_gof_free(h) };
    }
}

#[test]
fn random_garbage() {
    let mut rng = Rng(4);
    let mut accepted = 0;
    for i in 0..30_000 {
        let len = rng.below(600);
        let mut buf = rng.bytes(len);
        // steer most buffers past the first checks
        if i % 3 != 0 && len > 0 {
            buf[0] = 16;
        }
        if i % 3 == 2 && len > 2 {
            buf[1] = rng.below(4) as u8; // few levels
        }
        parse_anything(&buf, &mut rng);
        accepted += validated_size(&buf).is_some() as usize;
    }
    eprintln!("random_garbage: {accepted} of 30000 buffers parse");
}

#[test]
fn flipped_bits_and_bytes() {
    let mut rng = Rng(5);
    let keys = distinct_keys(&mut rng, 3000, 20);
    let (_, bytes) = build(&keys);
    for _ in 0..5000 {
        let mut buf = bytes.clone();
        for _ in 0..1 + rng.below(3) {
            let i = rng.below(buf.len());
            if rng.below(2) == 0 {
                buf[i] ^= 1 << rng.below(8);
            } else {
                buf[i] = rng.next() as u8;
            }
        }
        parse_anything(&buf, &mut rng);
        let cut = rng.below(buf.len());
        parse_anything(&buf[..cut], &mut rng);
    }
}

#[test]
fn crafted_headers() {
    let mut rng = Rng(6);
    let max9 = [0xFFu8; 9]; // VByte of u64::MAX
    let cases: Vec<Vec<u8>> = vec![
        // a level count of 2^64-1, 2^40, 2^20 (ph: Vec::with_capacity of it)
        [&[16u8][..], &max9, &[4]].concat(),
        vec![16, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 4],
        vec![16, 0x80, 0x80, 0x40, 1, 1, 1, 4],
        // one level of 2^64-1 groups, of 2^40 groups (the array would be
        // 2^41 bytes), of 2^20 groups in a short buffer
        [&[16u8, 1][..], &max9, &[4]].concat(),
        vec![16, 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 4],
        [&[16u8, 1, 0x80, 0x80, 0x40][..], &[0u8; 100], &[4]].concat(),
        // group counts whose sum overflows
        [&[16u8, 2][..], &max9, &max9, &[0u8; 64]].concat(),
        // a level of 0 groups: ph's reader accepts it, get would then read
        // one group past the end (unchecked); refused here
        vec![16, 1, 0, 4],
        [&[16u8, 2, 4, 0][..], &[0xFFu8; 8], &[4], &[0xFFu8; 8]].concat(),
        // wrong group size, wrong seed size, missing seed size
        vec![8, 0, 4],
        vec![32, 0, 4],
        vec![16, 0, 8],
        vec![16, 0],
        // arrays one byte short
        [&[16u8, 1, 4][..], &[0xFFu8; 8], &[4], &[0u8; 7]].concat(),
        [&[16u8, 1, 4][..], &[0xFFu8; 7]].concat(),
    ];
    for (i, c) in cases.iter().enumerate() {
        let (r, largest, _) = measured(|| c_read(c));
        assert!(r.is_none(), "case {i} accepted");
        assert_eq!(largest, 0, "case {i} allocated {largest}");
        parse_anything(c, &mut rng);
    }
    // ph's own reader takes the 0-group level: the reason for the check
    assert!(<GOFunction>::read(&mut &[16u8, 1, 0, 4][..]).is_ok());
    // the smallest well-formed one-level function: 4 groups, all bits set
    let ok = [&[16u8, 1, 4][..], &[0xFFu8; 8], &[4], &[0u8; 8]].concat();
    let (h, used) = c_read(&ok).unwrap();
    assert_eq!(used, ok.len());
    unsafe { sfs_gof_free(h) };
}

#[test]
fn concurrent_lookups_on_one_handle() {
    let mut rng = Rng(8);
    let keys = distinct_keys(&mut rng, 50_000, 32);
    let (f, bytes) = build(&keys);
    let (h, _) = c_read(&bytes).unwrap();
    let expected: Vec<i64> = keys.iter().map(|k| f.get(k.as_slice()).unwrap() as i64).collect();
    let hp = h as usize; // raw pointers are not Send; C does not care
    std::thread::scope(|s| {
        for t in 0..8 {
            let (keys, expected) = (&keys, &expected);
            s.spawn(move || {
                for i in (t..keys.len()).chain(0..t) {
                    assert_eq!(c_get(hp as *const SfsGof, &keys[i]), expected[i]);
                }
            });
        }
    });
    unsafe { sfs_gof_free(h) };
}

// ---------------------------------------------------------------------------
// Fixtures for tests/c/test_ph.c, which checks shardfs/c/gof.c (the C port
// of the lookup) against ph. A fixture file is a sequence of records, all
// integers little-endian:
//
//   u8   kind: 0 = a function as ph wrote it (the first `members` keys are
//        its key set, their values a permutation of 0..members);
//        1 = any other buffer (damaged, truncated, random)
//   u64  buf_len, then buf_len bytes (the buffer given to sfs_gof_read)
//   i64  used: the bytes the function takes (validated_size), or -1 when
//        sfs_gof_read must refuse the buffer
//   u32  members, u32 total
//   total times: u32 key_len, key_len bytes
//   total times: i64 ph's get of the key (-1 for None); only meaningful
//        when used >= 0

fn record(out: &mut Vec<u8>, kind: u8, buf: &[u8], members: usize, keys: &[Vec<u8>]) {
    let used = validated_size(buf);
    let expected: Vec<i64> = match read_gof(buf) {
        Some((f, size)) => {
            assert_eq!(Some(size), used);
            let (h, c_used) = c_read(buf).expect("validated buffer refused");
            assert_eq!(c_used, size);
            let v: Vec<i64> = keys.iter().map(|k| f.get(k.as_slice()).map(|v| v as i64).unwrap_or(-1)).collect();
            for (k, &e) in keys.iter().zip(&v) {
                assert_eq!(c_get(h, k), e);
                // (reference_get is O(n) per key: not for the 1M-key bench)
                if kind == 0 && keys.len() <= 200_000 {
                    assert_eq!(reference_get(buf, k).map(|x| x as i64).unwrap_or(-1), e);
                }
            }
            unsafe { sfs_gof_free(h) };
            v
        }
        None => {
            assert!(used.is_none() && c_read(buf).is_none());
            vec![-1; keys.len()]
        }
    };
    out.push(kind);
    out.extend_from_slice(&(buf.len() as u64).to_le_bytes());
    out.extend_from_slice(buf);
    out.extend_from_slice(&used.map(|u| u as i64).unwrap_or(-1).to_le_bytes());
    out.extend_from_slice(&(members as u32).to_le_bytes());
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for k in keys {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
    }
    for v in expected {
        out.extend_from_slice(&v.to_le_bytes());
    }
}

fn save(path: &std::path::Path, out: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, out).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target").join("fixtures")
}

/// A function over `members` (kind 0), queried with the members then `others`.
fn function_record(members: &[Vec<u8>], others: &[Vec<u8>]) -> Vec<u8> {
    let (f, bytes) = build(members);
    let all: Vec<Vec<u8>> = members.iter().chain(others).cloned().collect();
    check_function(&f, &bytes, members, others);
    let mut out = Vec::new();
    record(&mut out, 0, &bytes, members.len(), &all);
    out
}

/// Keys of assorted lengths, each length's keys distinct from the others'.
fn keys_of_lengths(rng: &mut Rng, lengths: &[(usize, usize)]) -> Vec<Vec<u8>> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    for &(len, count) in lengths {
        let mut made = 0;
        while made < count {
            let k = rng.bytes(len);
            if seen.insert(k.clone()) {
                keys.push(k);
                made += 1;
            }
        }
    }
    keys
}

#[test]
fn c_fixtures() {
    let dir = fixture_dir();
    let mut rng = Rng(9);
    // 20- and 32-byte keys (sha1 / sha1_git, sha256 / blake2s256), with
    // 2000 (5000 for the largest) keys that are not members
    for len in [20usize, 32] {
        for n in [1usize, 2, 1000, 100_000] {
            let others = if n >= 100_000 { 5000 } else { 2000 };
            let keys = distinct_keys(&mut rng, n + others, len);
            let out = function_record(&keys[..n], &keys[n..]);
            save(&dir.join(format!("keys{len}-n{n}.bin")), &out);
        }
    }
    // keys of several lengths in one function (the length is hashed too):
    // the empty key, 1, 7, 8, 9, 15, 16, 17, 64 and 100 bytes; the others
    // are the remaining 1-byte keys and random keys of 1..=100 bytes
    let members = [&[vec![]][..], &keys_of_lengths(
        &mut rng,
        &[(1, 100), (7, 1000), (8, 50), (9, 50), (15, 50), (16, 50), (17, 50), (64, 1000), (100, 20)],
    )]
    .concat();
    let member_set: HashSet<&Vec<u8>> = members.iter().collect();
    let mut others: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).filter(|k| !member_set.contains(k)).collect();
    while others.len() < 3000 {
        let len = 1 + rng.below(100);
        let k = rng.bytes(len);
        if !member_set.contains(&k) && !others.contains(&k) {
            others.push(k);
        }
    }
    save(&dir.join("mixed-lengths.bin"), &function_record(&members, &others));
    // a function of the empty key only; of no key at all
    let others: Vec<Vec<u8>> = (1..=64).map(|len| rng.bytes(len)).collect();
    save(&dir.join("empty-key.bin"), &function_record(&[vec![]], &others));
    save(&dir.join("no-key.bin"), &function_record(&[], &others));

    // kind 1: damaged and random buffers, each with 20 keys of 0..40 bytes
    // (ph's answers when the buffer is accepted)
    let mut out = Vec::new();
    let probe = |rng: &mut Rng| -> Vec<Vec<u8>> {
        (0..20).map(|_| {
            let len = rng.below(41);
            rng.bytes(len)
        }).collect()
    };
    let keys = distinct_keys(&mut rng, 3000, 20);
    let (_, bytes) = build(&keys);
    let mut accepted = 0;
    for i in 0..3000 {
        let mut buf = bytes.clone();
        for _ in 0..1 + rng.below(3) {
            let j = rng.below(buf.len());
            if rng.below(2) == 0 {
                buf[j] ^= 1 << rng.below(8);
            } else {
                buf[j] = rng.next() as u8;
            }
        }
        if i % 2 == 1 {
            buf.truncate(rng.below(buf.len() + 1));
        }
        // probe with members too: a damaged level or seed changes them
        let mut k = probe(&mut rng);
        k.extend((0..10).map(|_| keys[rng.below(keys.len())].clone()));
        accepted += validated_size(&buf).is_some() as usize;
        record(&mut out, 1, &buf, 0, &k);
    }
    for i in 0..3000 {
        let len = rng.below(600);
        let mut buf = rng.bytes(len);
        if i % 3 != 0 && len > 0 {
            buf[0] = 16;
        }
        if i % 3 == 2 && len > 2 {
            buf[1] = rng.below(4) as u8;
        }
        accepted += validated_size(&buf).is_some() as usize;
        let k = probe(&mut rng);
        record(&mut out, 1, &buf, 0, &k);
    }
    let max9 = [0xFFu8; 9];
    for c in [
        [&[16u8][..], &max9, &[4]].concat(),
        [&[16u8, 1][..], &max9, &[4]].concat(),
        [&[16u8, 2][..], &max9, &max9, &[0u8; 64]].concat(),
        vec![16, 1, 0, 4],
        vec![16, 0, 4],
        vec![16, 0, 4, 99],
        vec![16, 0],
        vec![8, 0, 4],
        [&[16u8, 1, 4][..], &[0xFFu8; 8], &[4], &[0u8; 8]].concat(),
        [&[16u8, 1, 4][..], &[0xFFu8; 8], &[4], &[0u8; 7]].concat(),
        // 9-byte VByte of 5 (bits 56..63 = 0): still one level of 5 groups
        [&[16u8, 1, 0x85, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0][..], &[0xA5u8; 16], &[4], &[0x3Cu8; 8]].concat(),
        // three levels of 1 group each, every bit set
        [&[16u8, 3, 1, 1, 1][..], &[0xFFu8; 8], &[4], &[0x5Au8; 8]].concat(),
    ] {
        let k = probe(&mut rng);
        accepted += validated_size(&c).is_some() as usize;
        record(&mut out, 1, &c, 0, &k);
    }
    eprintln!("c_fixtures: {accepted} of the damaged/random buffers parse");
    save(&dir.join("damaged.bin"), &out);
}

/// The speed comparison with tests/c/test_ph.c --bench: writes
/// target/bench/keys32-n1000000.bin (one kind-0 record, 1,000,000 32-byte
/// keys, all members) and times 1,000,000 lookups of those keys, in file
/// order, from one contiguous buffer, through ph's `get` and through the
/// wrapper's sfs_gof_get (best of 5 passes after one warm-up). Run alone:
///   cargo test --release --manifest-path shardfs/c/ph/Cargo.toml -- \
///       --ignored --nocapture --test-threads=1 bench_1m
#[test]
#[ignore]
fn bench_1m() {
    let mut rng = Rng(10);
    let keys = distinct_keys(&mut rng, 1_000_000, 32);
    let (f, bytes) = build(&keys);
    let mut out = Vec::new();
    record(&mut out, 0, &bytes, keys.len(), &keys);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/keys32-n1000000.bin");
    save(&path, &out);
    let (h, _) = c_read(&bytes).unwrap();
    // the keys back to back, as test_ph.c holds them (the file's bytes), so
    // that neither side pays a pointer chase per key
    let flat: Vec<u8> = keys.concat();
    let time = |what: &str, get: &dyn Fn(&[u8]) -> i64| {
        let mut best = f64::MAX;
        let mut sum = 0i64;
        for pass in 0..6 {
            let t = std::time::Instant::now();
            for k in flat.chunks_exact(32) {
                sum = sum.wrapping_add(get(std::hint::black_box(k)));
            }
            let ns = t.elapsed().as_nanos() as f64 / keys.len() as f64;
            if pass > 0 {
                best = best.min(ns);
            }
        }
        eprintln!("bench_1m: {what}: {best:.1} ns/lookup (checksum {sum})");
    };
    time("ph GOFunction::get", &|k| f.get(k).map(|v| v as i64).unwrap_or(-1));
    time("Rust sfs_gof_get", &|k| c_get(h, k));
    eprintln!("bench_1m: {} bytes, written to {}", bytes.len(), path.display());
    unsafe { sfs_gof_free(h) };
}
