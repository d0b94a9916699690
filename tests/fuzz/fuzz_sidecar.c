/*
 * fuzz_sidecar.c — libFuzzer harness for sidecar files (sidecar.c).
 *
 * The input is a whole sidecar file. It is opened with the identity and
 * slot_count its own header claims (bytes 32..64 and 24..32), so that the
 * fuzzer gets past the staleness checks, and once more with a fixed
 * identity and a wrong slot count (the SFS_ESTALE paths). When it opens,
 * every query runs on it with bounded work: may_contain on fixed keys, on
 * keys cut from the input and on keys rebuilt from its own directory and
 * fingerprints; range() at many prefix lengths; slots() over each range
 * and out of bounds; candidates() over an array mixing NULL and the
 * sidecar, longer than one internal chunk; fingerprint().
 *
 * Invariants checked (sidecar.h): 0 <= begin <= end <= count for every
 * range; slots() copies exactly end - begin values, the ones stored;
 * candidates() agrees with may_contain() entry by entry; a key rebuilt
 * from entry i of a bucket whose fingerprints are sorted is "contained";
 * for a well-formed file, range() over a rebuilt key's p + 32 bits
 * includes its entry.
 */
#include "fuzz_common.h"

#include "sidecar.h"

#define MAX_ENTRIES_PROBED 128
#define MAX_SCANNED 65536      /* directory and fingerprint words read by the harness */
#define CANDIDATES 150         /* > 2 chunks of 64 in sfs_sidecar_candidates */

static uint32_t slots_buf[1 << 16];
#define SLOTS_COPIED 64 /* per range */
#define KEYS_RANGED 8   /* rebuilt keys whose every prefix length is ranged */

/* The key whose top p bits are b and next 32 bits fp, then `tail`. */
static void make_key(uint8_t key[SFS_KEY_SIZE], unsigned p, uint64_t b, uint32_t fp, uint8_t tail)
{
    uint64_t top = (p ? b << (64 - p) : 0) | ((uint64_t)fp << 32 >> p);
    for (int i = 0; i < 8; i++)
        key[i] = (uint8_t)(top >> (56 - 8 * i));
    memset(key + 8, tail, SFS_KEY_SIZE - 8);
}

static void check_range(const sfs_sidecar_t *sc, const uint8_t *prefix, unsigned bits,
                        uint64_t *b_out, uint64_t *e_out)
{
    uint64_t n = sfs_sidecar_count(sc), b = UINT64_MAX, e = UINT64_MAX;
    sfs_sidecar_range(sc, prefix, bits, &b, &e);
    FUZZ_ASSERT(b <= e && e <= n);
    /* the first and the last slots of the range (bounded work) */
    uint64_t want = e - b < SLOTS_COPIED ? e - b : SLOTS_COPIED;
    FUZZ_ASSERT(sfs_sidecar_slots(sc, b, b + want, slots_buf) == want);
    FUZZ_ASSERT(sfs_sidecar_slots(sc, e - want, e, slots_buf) == want);
    if (b_out) {
        *b_out = b;
        *e_out = e;
    }
}

static void probe_key(const sfs_sidecar_t *sc, const uint8_t key[SFS_KEY_SIZE])
{
    int r = sfs_sidecar_may_contain(sc, key);
    FUZZ_ASSERT(r == 0 || r == 1);
    unsigned p = sfs_sidecar_prefix_bits(sc);
    unsigned bits[] = {0, 1, 7, 8, p ? p - 1 : 0, p, p + 1, p + 9, p + 31, p + 32, p + 33, 64, 200};
    for (size_t i = 0; i < sizeof(bits) / sizeof(bits[0]); i++)
        if ((bits[i] + 7) / 8 <= SFS_KEY_SIZE)
            check_range(sc, key, bits[i], NULL, NULL);
}

static void exercise(sfs_sidecar_t *sc, const uint8_t *data, size_t size)
{
    uint64_t n = sfs_sidecar_count(sc);
    unsigned p = sfs_sidecar_prefix_bits(sc);
    FUZZ_ASSERT(p <= 32 && n <= sfs_sidecar_slot_count(sc));
    FUZZ_ASSERT(size == sfs_sidecar_file_size(p, n));
    const uint8_t *dir = data + SFS_SIDECAR_HEADER_SIZE;
    const uint8_t *fps = dir + 4 * ((UINT64_C(1) << p) + 1);
    const uint8_t *slots = fps + 4 * n;

    uint8_t key[SFS_KEY_SIZE];
    static const uint8_t fixed[] = {0x00, 0xff, 0x80, 0x7f};
    for (size_t i = 0; i < sizeof(fixed); i++) {
        memset(key, fixed[i], sizeof(key));
        probe_key(sc, key);
    }
    for (size_t at = 0; at + SFS_KEY_SIZE <= size && at < 2048; at += 251)
        probe_key(sc, data + at);

    /* fingerprints and slots read back as stored */
    for (uint64_t i = 0; i < n && i < MAX_ENTRIES_PROBED; i++) {
        FUZZ_ASSERT(sfs_sidecar_fingerprint(sc, i) == fuzz_le32(fps + 4 * i));
        uint32_t one;
        FUZZ_ASSERT(sfs_sidecar_slots(sc, i, i + 1, &one) == 1);
        FUZZ_ASSERT(one == fuzz_le32(slots + 4 * i));
    }
    FUZZ_ASSERT(sfs_sidecar_fingerprint(sc, n) == 0);
    FUZZ_ASSERT(sfs_sidecar_slots(sc, n, n + 10, slots_buf) == 0);
    FUZZ_ASSERT(sfs_sidecar_slots(sc, UINT64_MAX - 1, UINT64_MAX, slots_buf) == 0);
    if (n <= sizeof(slots_buf) / sizeof(slots_buf[0]))
        FUZZ_ASSERT(sfs_sidecar_slots(sc, 0, UINT64_MAX, slots_buf) == n);

    /* keys rebuilt from the directory's buckets and their entries */
    uint64_t buckets = UINT64_C(1) << p, probed = 0, scanned = 0;
    uint8_t last[SFS_KEY_SIZE] = {0};
    for (uint64_t b = 0; b < buckets && probed < MAX_ENTRIES_PROBED && scanned < MAX_SCANNED;
         b++, scanned++) {
        uint64_t lo = fuzz_le32(dir + 4 * b), hi = fuzz_le32(dir + 4 * (b + 1));
        if (lo > hi || hi > n)
            continue; /* clamped by the library: no expectation */
        /* fingerprints sorted inside the bucket (as built): then every
         * entry's key must be found, whatever the other buckets hold */
        int sorted = 1;
        for (uint64_t i = lo; i + 1 < hi; i++, scanned++) {
            if (scanned >= MAX_SCANNED) {
                sorted = 0; /* not known: no expectation */
                break;
            }
            sorted &= fuzz_le32(fps + 4 * i) <= fuzz_le32(fps + 4 * (i + 1));
        }
        for (uint64_t i = lo; i < hi && probed < MAX_ENTRIES_PROBED; i++, probed++) {
            make_key(key, p, b, fuzz_le32(fps + 4 * i), (uint8_t)i);
            memcpy(last, key, sizeof(last));
            int r = sfs_sidecar_may_contain(sc, key);
            if (sorted)
                FUZZ_ASSERT(r == 1);
            uint64_t rb, re;
            check_range(sc, key, p + 32, &rb, &re);
            if (sorted)
                FUZZ_ASSERT(rb <= i && i < re);
            if (probed < KEYS_RANGED)
                probe_key(sc, key);
        }
    }

    /* candidates() against may_contain(), over NULL / sidecar entries */
    sfs_sidecar_t *arr[CANDIDATES];
    uint32_t out[CANDIDATES];
    static const uint8_t zero[SFS_KEY_SIZE];
    for (int k = 0; k < 3; k++) {
        /* the zero key, the input's last bytes, the last rebuilt key */
        const uint8_t *kp = k == 0 ? zero : k == 1 ? data + size - SFS_KEY_SIZE : last;
        int may = sfs_sidecar_may_contain(sc, kp);
        size_t expect = 0;
        for (int i = 0; i < CANDIDATES; i++) {
            arr[i] = (i % 3 == 1) ? NULL : sc;
            expect += arr[i] == NULL || may;
        }
        size_t got = sfs_sidecar_candidates(arr, CANDIDATES, kp, out, CANDIDATES);
        FUZZ_ASSERT(got == expect);
        size_t j = 0;
        for (int i = 0; i < CANDIDATES; i++)
            if (arr[i] == NULL || may)
                FUZZ_ASSERT(out[j++] == (uint32_t)i);
        /* a short output array: the count is still the total */
        FUZZ_ASSERT(sfs_sidecar_candidates(arr, CANDIDATES, kp, out, 3) == expect);
        FUZZ_ASSERT(sfs_sidecar_candidates(arr, 0, kp, out, 3) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_input_path(data, size);
    uint8_t ident[SFS_SIDECAR_IDENTITY_SIZE] = {0};
    uint64_t slot_count = 0;
    if (size >= SFS_SIDECAR_HEADER_SIZE) {
        memcpy(ident, data + 32, sizeof(ident));
        slot_count = fuzz_le64(data + 24);
    }
    sfs_sidecar_t *sc = (sfs_sidecar_t *)1;
    sfs_error_t err;
    memset(&err, 0, sizeof(err));

    /* another shard: stale (or corrupt, which is checked first) */
    static const uint8_t other[SFS_SIDECAR_IDENTITY_SIZE] = {0x5a};
    int rc = sfs_sidecar_open(path, other, slot_count, &sc, &err);
    if (rc == SFS_OK)
        sfs_sidecar_close(sc);
    else
        FUZZ_ASSERT(sc == NULL && (rc == SFS_ESTALE || rc == SFS_ECORRUPT) && err.message[0]);
    rc = sfs_sidecar_open(path, ident, slot_count + 1, &sc, &err);
    FUZZ_ASSERT(rc != SFS_OK);
    FUZZ_ASSERT(sc == NULL && (rc == SFS_ESTALE || rc == SFS_ECORRUPT) && err.message[0]);

    rc = sfs_sidecar_open(path, ident, slot_count, &sc, &err);
    if (rc != SFS_OK) {
        FUZZ_ASSERT(sc == NULL && rc == SFS_ECORRUPT && err.status == rc && err.message[0]);
        return 0;
    }
    FUZZ_ASSERT(sfs_sidecar_slot_count(sc) == slot_count);
    exercise(sc, data, size);
    sfs_sidecar_close(sc);
    return 0;
}
