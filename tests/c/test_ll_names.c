/*
 * test_ll_names.c — C unit tests of what the request path parses of what a
 * user controls (shardfs/c/ll_names.c; run by `make test-c`).
 *
 * The cases ll_names.h documents: layouts (flat; slicing 0:2/2:4 gives the
 * root 1, depth-1 directories 2..257, depth-2 directories 258..258+65535;
 * 0:1/1:3/3:5; seven levels of one digit, the last directory below 2^32)
 * and the lengths refused (depth outside 0..7, lengths not growing from 1,
 * above 7); every inode up to past the last directory of 0:2/2:4 split to
 * its depth and prefix, objects and database inodes no directories; names
 * (a key found at the root and in its leaf only, upper case, other
 * characters and other lengths: absent or "the caller decides"); object
 * inodes and their shard number and slot; read lengths at the edges,
 * overflow-prone ones included; names by another hash (a digest in
 * MOUNT/sha1 and MOUNT/sha1_git, a content SWHID in the root; other
 * places, lengths, cases and characters; hash directories not served);
 * extended attribute names and which inode has which, and their lists;
 * directory entry names (1..255 bytes, no '/', no NUL).
 */
#define _GNU_SOURCE
#include "ll_names.h"

#include <stdio.h>
#include <string.h>

#include "check.h"

static const char NAME[] = "abcd0123456789ef0123456789abcdef0123456789abcdef0123456789abcdef";

static void test_layouts(void)
{
    sfs_ll_layout_t l;
    int fan[] = {2, 4};
    CHECK(sfs_ll_layout_init(&l, fan, 0) == 0, "flat layout");
    CHECK(l.depth == 0, "flat depth %d", l.depth);

    CHECK(sfs_ll_layout_init(&l, fan, 2) == 0, "0:2/2:4");
    CHECK(l.depth == 2 && l.nhex[0] == 0 && l.nhex[1] == 2 && l.nhex[2] == 4, "0:2/2:4 nhex");
    CHECK(l.bases[1] == 2 && l.bases[2] == 258, "0:2/2:4 bases %llu %llu",
          (unsigned long long)l.bases[1], (unsigned long long)l.bases[2]);

    int three[] = {1, 3, 5};
    CHECK(sfs_ll_layout_init(&l, three, 3) == 0, "0:1/1:3/3:5");
    CHECK(l.bases[1] == 2 && l.bases[2] == 18 && l.bases[3] == 18 + 4096, "0:1/1:3/3:5 bases");

    int seven[] = {1, 2, 3, 4, 5, 6, 7};
    CHECK(sfs_ll_layout_init(&l, seven, 7) == 0, "seven levels");
    uint64_t end = l.bases[7] + (UINT64_C(1) << 28), prefix = 0;
    CHECK(end <= (UINT64_C(1) << 32), "last directory below 2^32: end %llu", (unsigned long long)end);
    CHECK(sfs_ll_split_dir(&l, end - 1, &prefix) == 7 && prefix == (UINT64_C(1) << 28) - 1,
          "last directory of seven levels");
    CHECK(sfs_ll_split_dir(&l, end, &prefix) == -1, "past the last directory of seven levels");

    int one7[] = {7};
    CHECK(sfs_ll_layout_init(&l, one7, 1) == 0, "one level of 7 digits");
    CHECK(sfs_ll_split_dir(&l, 2 + (UINT64_C(1) << 28) - 1, &prefix) == 1, "0:7 last directory");

    /* refused */
    int eight[] = {1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(sfs_ll_layout_init(&l, eight, 8) == -1, "depth 8");
    CHECK(sfs_ll_layout_init(&l, eight, -1) == -1, "depth -1");
    int zero[] = {0}, same[] = {2, 2}, down[] = {3, 2}, big[] = {8}, neg[] = {-1}, past[] = {2, 8};
    CHECK(sfs_ll_layout_init(&l, zero, 1) == -1, "length 0");
    CHECK(sfs_ll_layout_init(&l, neg, 1) == -1, "length -1");
    CHECK(sfs_ll_layout_init(&l, same, 2) == -1, "lengths not growing");
    CHECK(sfs_ll_layout_init(&l, down, 2) == -1, "lengths shrinking");
    CHECK(sfs_ll_layout_init(&l, big, 1) == -1, "length 8");
    CHECK(sfs_ll_layout_init(&l, past, 2) == -1, "cumulative length 8");
}

static void test_split_dir(void)
{
    sfs_ll_layout_t l;
    int fan[] = {2, 4};
    REQUIRE(sfs_ll_layout_init(&l, fan, 2) == 0, "0:2/2:4");
    struct {
        uint64_t ino;
        int depth;
        uint64_t prefix;
    } cases[] = {
        {0, -1, 0},
        {1, 0, 0},
        {2, 1, 0},
        {2 + 0xab, 1, 0xab},
        {257, 1, 0xff},
        {258, 2, 0},
        {258 + 0xabcd, 2, 0xabcd},
        {258 + 65535, 2, 0xffff},
        {258 + 65536, -1, 0},
        {(UINT64_C(1) << 32) - 1, -1, 0},
        {UINT64_C(1) << 32, -1, 0},
        {(UINT64_C(1) << 32) | 2, -1, 0},
        {(UINT64_C(1) << 32) | 258, -1, 0},
        {UINT64_C(1) << 62, -1, 0},
        {(UINT64_C(1) << 62) | 2, -1, 0},
        {UINT64_MAX, -1, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t prefix = 12345;
        int d = sfs_ll_split_dir(&l, cases[i].ino, &prefix);
        CHECK(d == cases[i].depth, "split %llu: depth %d, not %d", (unsigned long long)cases[i].ino,
              d, cases[i].depth);
        if (d >= 0)
            CHECK(prefix == cases[i].prefix, "split %llu: prefix %llu", (unsigned long long)cases[i].ino,
                  (unsigned long long)prefix);
    }
    /* every inode up to past the last directory */
    int bad = 0;
    for (uint64_t ino = 0; ino < 258 + 65536 + 100; ino++) {
        uint64_t prefix = 0;
        int d = sfs_ll_split_dir(&l, ino, &prefix);
        int want = ino == 1 ? 0 : ino >= 2 && ino < 258 ? 1 : ino >= 258 && ino < 258 + 65536 ? 2 : -1;
        uint64_t wp = want == 1 ? ino - 2 : want == 2 ? ino - 258 : 0;
        bad += d != want || (d >= 0 && prefix != wp);
    }
    CHECK(bad == 0, "%d inodes split wrong", bad);

    sfs_ll_layout_t flat;
    REQUIRE(sfs_ll_layout_init(&flat, fan, 0) == 0, "flat");
    uint64_t prefix = 7;
    CHECK(sfs_ll_split_dir(&flat, 1, &prefix) == 0 && prefix == 0, "flat root");
    CHECK(sfs_ll_split_dir(&flat, 2, &prefix) == -1, "flat: 2 is no directory");
    CHECK(sfs_ll_split_dir(&flat, 0, &prefix) == -1, "flat: 0 is no directory");

    int three[] = {1, 3, 5};
    REQUIRE(sfs_ll_layout_init(&l, three, 3) == 0, "0:1/1:3/3:5");
    CHECK(sfs_ll_split_dir(&l, 17, &prefix) == 1 && prefix == 15, "0:1/1:3/3:5 last depth-1");
    CHECK(sfs_ll_split_dir(&l, 18, &prefix) == 2 && prefix == 0, "0:1/1:3/3:5 first depth-2");
    CHECK(sfs_ll_split_dir(&l, 18 + 4095, &prefix) == 2 && prefix == 4095, "last depth-2");
    CHECK(sfs_ll_split_dir(&l, 4114, &prefix) == 3 && prefix == 0, "first depth-3");
    CHECK(sfs_ll_split_dir(&l, 4114 + 0xfffff, &prefix) == 3 && prefix == 0xfffff, "last depth-3");
    CHECK(sfs_ll_split_dir(&l, 4114 + 0x100000, &prefix) == -1, "past depth-3");
}

static void test_names(void)
{
    sfs_ll_layout_t flat, l;
    int fan[] = {2, 4};
    REQUIRE(sfs_ll_layout_init(&flat, fan, 0) == 0, "flat");
    REQUIRE(sfs_ll_layout_init(&l, fan, 2) == 0, "0:2/2:4");
    uint8_t key[SFS_KEY_SIZE], want[SFS_KEY_SIZE];
    for (int i = 0; i < SFS_KEY_SIZE; i++) {
        unsigned v;
        sscanf(NAME + 2 * i, "%2x", &v);
        want[i] = (uint8_t)v;
    }
    memset(key, 0, sizeof(key));
    CHECK(sfs_ll_object_name(&flat, 0, 0, NAME, key) == 1, "flat: a key at the root");
    CHECK(memcmp(key, want, sizeof(key)) == 0 && key[0] == 0xab && key[31] == 0xef, "key bytes");

    /* fan-out: found at the root and in its leaf, nowhere else */
    memset(key, 0, sizeof(key));
    CHECK(sfs_ll_object_name(&l, 0, 0, NAME, key) == 1, "fanout: a key at the root");
    CHECK(memcmp(key, want, sizeof(key)) == 0, "fanout root key bytes");
    memset(key, 0, sizeof(key));
    CHECK(sfs_ll_object_name(&l, 2, 0xabcd, NAME, key) == 1, "in its leaf ab/cd");
    CHECK(memcmp(key, want, sizeof(key)) == 0, "leaf key bytes");
    uint64_t prefix = 0;
    CHECK(sfs_ll_split_dir(&l, 258 + 0xabcd, &prefix) == 2 && prefix == 0xabcd, "its leaf's inode");
    CHECK(sfs_ll_object_name(&l, 2, 0xabce, NAME, key) == 0, "another leaf");
    CHECK(sfs_ll_object_name(&l, 2, 0xab, NAME, key) == 0, "leaf 00/ab");
    CHECK(sfs_ll_object_name(&l, 2, 0xabcd0, NAME, key) == 0, "a prefix past the leaves");
    CHECK(sfs_ll_object_name(&l, 1, 0xab, NAME, key) == 0, "a depth-1 directory");
    CHECK(sfs_ll_object_name(&l, 3, 0xabcd, NAME, key) == 0, "depth 3");
    CHECK(sfs_ll_object_name(&l, -1, 0, NAME, key) == 0, "depth -1");
    CHECK(sfs_ll_object_name(&flat, 1, 0, NAME, key) == 0, "flat: depth 1");

    char name[80];
    /* upper case: no object has that name, even where the prefix matches */
    strcpy(name, NAME);
    name[0] = 'A';
    CHECK(sfs_ll_object_name(&l, 2, 0xabcd, name, key) == 0, "upper case in the prefix");
    CHECK(sfs_ll_object_name(&flat, 0, 0, name, key) == 0, "upper case at the root");
    strcpy(name, NAME);
    name[63] = 'F';
    CHECK(sfs_ll_object_name(&flat, 0, 0, name, key) == 0, "upper case last");
    const char other[] = {'g', 'G', 'z', ' ', '/', '.', (char)0xff, (char)0x80, ':', '`', '@'};
    for (size_t i = 0; i < sizeof(other); i++) {
        strcpy(name, NAME);
        name[(i * 7) % 64] = other[i];
        CHECK(sfs_ll_object_name(&flat, 0, 0, name, key) == 0, "character 0x%02x",
              (unsigned char)other[i]);
    }

    /* not 64 characters: the caller decides */
    const char *short_names[] = {"", ".", "..", "ab", "abcd", "0"};
    for (size_t i = 0; i < sizeof(short_names) / sizeof(short_names[0]); i++) {
        CHECK(sfs_ll_object_name(&flat, 0, 0, short_names[i], key) == -1, "name '%s'", short_names[i]);
        CHECK(sfs_ll_object_name(&l, 1, 0, short_names[i], key) == -1, "fanout name '%s'",
              short_names[i]);
    }
    strcpy(name, NAME);
    name[63] = 0;
    CHECK(sfs_ll_object_name(&flat, 0, 0, name, key) == -1, "63 characters");
    strcpy(name, NAME);
    strcat(name, "0");
    CHECK(sfs_ll_object_name(&flat, 0, 0, name, key) == -1, "65 characters");
    strcat(name, "GG..");
    CHECK(sfs_ll_object_name(&l, 2, 0xabcd, name, key) == -1, "69 characters");
    memset(name, 'z', 64);
    name[64] = 0;
    CHECK(sfs_ll_object_name(&l, 2, 0, name, key) == 0, "64 characters, not hex");
}

static void test_object_inodes(void)
{
    struct {
        uint64_t ino;
        int ok;
        uint32_t number, slot;
    } cases[] = {
        {0, 0, 0, 0},
        {1, 0, 0, 0},
        {2, 0, 0, 0},
        {258 + 65535, 0, 0, 0},
        {(UINT64_C(1) << 32) - 1, 0, 0, 0},
        {UINT64_C(1) << 32, 1, 0, 0},
        {(UINT64_C(1) << 32) | 7, 1, 0, 7},
        {(UINT64_C(6) << 32) | 0xffffffff, 1, 5, 0xffffffff},
        {(UINT64_C(1) << 62) - 1, 1, (1u << 30) - 2, 0xffffffff},
        {UINT64_C(1) << 62, 0, 0, 0},
        {(UINT64_C(1) << 62) | (UINT64_C(3) << 48) | 9, 0, 0, 0},
        {(UINT64_C(1) << 62) | (UINT64_C(1) << 32) | 1, 0, 0, 0},
        {UINT64_C(1) << 63, 1, (1u << 31) - 1, 0},
        {(UINT64_C(1) << 63) | (UINT64_C(1) << 32) | 5, 1, 1u << 31, 5},
        {UINT64_MAX & ~SFS_LL_DB_INODE_FLAG, 1, 0xbffffffe, 0xffffffff},
        {UINT64_MAX, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint32_t number = 1234, slot = 5678;
        int ok = sfs_ll_object_inode(cases[i].ino, &number, &slot);
        CHECK(ok == cases[i].ok, "object inode %#llx: %d", (unsigned long long)cases[i].ino, ok);
        if (ok && cases[i].ok) {
            CHECK(number == cases[i].number && slot == cases[i].slot, "inode %#llx: number %u slot %u",
                  (unsigned long long)cases[i].ino, number, slot);
            CHECK((((uint64_t)number + 1) << 32 | slot) == cases[i].ino, "round trip %#llx",
                  (unsigned long long)cases[i].ino);
        }
    }
    /* round trips, and objects are no directories */
    sfs_ll_layout_t l;
    int fan[] = {2, 4};
    REQUIRE(sfs_ll_layout_init(&l, fan, 2) == 0, "0:2/2:4");
    int bad = 0;
    for (int i = 0; i < 10000; i++) {
        /* numbers below 2^30 - 1: bit 62 of the inode stays clear */
        uint32_t number = (uint32_t)(next_rand() % ((1u << 30) - 1)), slot = (uint32_t)next_rand();
        if (i < 4) { /* the corners */
            number = i % 2 ? (1u << 30) - 2 : 0;
            slot = i < 2 ? 0 : 0xffffffff;
        }
        uint64_t ino = ((uint64_t)number + 1) << 32 | slot, prefix;
        uint32_t n = 0, s = 0;
        bad += sfs_ll_object_inode(ino, &n, &s) != 1 || n != number || s != slot;
        bad += sfs_ll_split_dir(&l, ino, &prefix) != -1;
    }
    CHECK(bad == 0, "%d object inodes wrong", bad);
}

static void test_reads(void)
{
    struct {
        uint64_t size, offset;
        size_t want, n;
    } cases[] = {
        {10, 0, 4, 4},
        {10, 0, 10, 10},
        {10, 0, 11, 10},
        {10, 8, 4, 2},
        {10, 9, 4, 1},
        {10, 10, 4, 0},
        {10, 11, 4, 0},
        {10, 0, 0, 0},
        {0, 0, 0, 0},
        {0, 0, 131072, 0},
        {10, UINT64_MAX, 4, 0},
        {10, UINT64_MAX, SIZE_MAX, 0},
        {10, 1, SIZE_MAX, 9},
        {UINT64_MAX, 0, SIZE_MAX, SIZE_MAX},
        {UINT64_MAX, 1, SIZE_MAX, SIZE_MAX - 1},
        {UINT64_MAX, UINT64_MAX - 1, SIZE_MAX, 1},
        {UINT64_MAX, UINT64_MAX, SIZE_MAX, 0},
        {UINT64_C(1) << 63, (UINT64_C(1) << 63) - 5, 131072, 5},
        {UINT64_C(1) << 40, 4096, 131072, 131072},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        size_t n = sfs_ll_read_length(cases[i].size, cases[i].offset, cases[i].want);
        CHECK(n == cases[i].n, "read %zu at %llu of %llu: %zu, not %zu", cases[i].want,
              (unsigned long long)cases[i].offset, (unsigned long long)cases[i].size, n, cases[i].n);
    }
}

static const char DIGEST[] = "0123456789abcdef0123456789abcdefdeadbeef";

/* What sfs_ll_hash_name answers, and the digest bytes it wrote. */
static int hash_name(const uint64_t dirs[2], uint64_t parent, const char *name, uint8_t key[SFS_KEY_SIZE])
{
    memset(key, 0xa5, SFS_KEY_SIZE);
    return sfs_ll_hash_name(dirs, parent, name, key);
}

static int key_is_digest(const uint8_t key[SFS_KEY_SIZE])
{
    for (int i = 0; i < SFS_LL_DIGEST_SIZE; i++) {
        unsigned v;
        sscanf(DIGEST + 2 * i, "%2x", &v);
        if (key[i] != v)
            return 0;
    }
    for (int i = SFS_LL_DIGEST_SIZE; i < SFS_KEY_SIZE; i++)
        if (key[i])
            return 0;
    return 1;
}

static void test_hash_names(void)
{
    const uint64_t SHA1 = 258 + 65536, SHA1_GIT = SHA1 + 1;
    const uint64_t both[2] = {SHA1, SHA1_GIT}, none[2] = {0, 0}, only_sha1[2] = {SHA1, 0},
                   only_git[2] = {0, SHA1_GIT};
    uint8_t key[SFS_KEY_SIZE];
    char name[128];

    CHECK(hash_name(both, SHA1, DIGEST, key) == 0 && key_is_digest(key), "a sha1 in MOUNT/sha1");
    CHECK(hash_name(both, SHA1_GIT, DIGEST, key) == 1 && key_is_digest(key), "a sha1_git in MOUNT/sha1_git");
    snprintf(name, sizeof(name), "%s%s", SFS_LL_SWHID_PREFIX, DIGEST);
    CHECK(hash_name(both, SFS_LL_ROOT_INODE, name, key) == 1 && key_is_digest(key), "a SWHID in the root");
    CHECK(hash_name(only_git, SFS_LL_ROOT_INODE, name, key) == 1 && key_is_digest(key),
          "a SWHID in the root, sha1 not served");
    CHECK(hash_name(only_sha1, SFS_LL_ROOT_INODE, name, key) == -1, "a SWHID, sha1_git not served");
    CHECK(hash_name(none, SFS_LL_ROOT_INODE, name, key) == -1, "a SWHID, no hash served");
    CHECK(hash_name(both, SHA1_GIT, name, key) == -1, "a SWHID in MOUNT/sha1_git");
    CHECK(hash_name(both, SHA1, name, key) == -1, "a SWHID in MOUNT/sha1");
    CHECK(hash_name(both, 2, name, key) == -1, "a SWHID in a fan-out directory");

    /* not served, or elsewhere: not a hash name */
    CHECK(hash_name(none, SHA1, DIGEST, key) == -1, "no hash served");
    CHECK(hash_name(only_git, SHA1, DIGEST, key) == -1, "sha1 not served");
    CHECK(hash_name(only_sha1, SHA1_GIT, DIGEST, key) == -1, "sha1_git not served");
    CHECK(hash_name(both, SFS_LL_ROOT_INODE, DIGEST, key) == -1, "a digest in the root");
    CHECK(hash_name(both, 2, DIGEST, key) == -1, "a digest in a fan-out directory");
    CHECK(hash_name(both, 0, DIGEST, key) == -1, "a digest in inode 0");
    CHECK(hash_name(both, (UINT64_C(1) << 32) | SHA1, DIGEST, key) == -1, "a digest in an object");

    /* the place and length of one, not lowercase hex: absent */
    strcpy(name, DIGEST);
    name[39] = 'F';
    CHECK(hash_name(both, SHA1, name, key) == 2, "upper case in a sha1");
    CHECK(hash_name(both, SHA1_GIT, name, key) == 2, "upper case in a sha1_git");
    name[39] = 'g';
    CHECK(hash_name(both, SHA1, name, key) == 2, "'g' in a sha1");
    name[39] = '/';
    CHECK(hash_name(both, SHA1_GIT, name, key) == 2, "'/' in a sha1_git");
    snprintf(name, sizeof(name), "%s%s", SFS_LL_SWHID_PREFIX, DIGEST);
    name[SFS_LL_SWHID_PREFIX_LEN] = 'A';
    CHECK(hash_name(both, SFS_LL_ROOT_INODE, name, key) == 2, "upper case in a SWHID's digest");
    /* another prefix of that length: not a SWHID */
    const char *prefixes[] = {"swh:1:dir:", "swh:1:rev:", "SWH:1:CNT:", "swh:2:cnt:", "swh:1:cnt;", "xswh:1:cnt"};
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++) {
        snprintf(name, sizeof(name), "%s%s", prefixes[i], DIGEST);
        CHECK(hash_name(both, SFS_LL_ROOT_INODE, name, key) == -1, "prefix %s", prefixes[i]);
    }
    /* other lengths */
    strcpy(name, DIGEST);
    name[39] = 0;
    CHECK(hash_name(both, SHA1, name, key) == -1, "39 digits");
    strcpy(name, DIGEST);
    strcat(name, "0");
    CHECK(hash_name(both, SHA1, name, key) == -1, "41 digits");
    CHECK(hash_name(both, SHA1, "", key) == -1, "an empty name");
    CHECK(hash_name(both, SHA1, "..", key) == -1, "..");
    snprintf(name, sizeof(name), "%s%s", SFS_LL_SWHID_PREFIX, DIGEST);
    name[49] = 0;
    CHECK(hash_name(both, SFS_LL_ROOT_INODE, name, key) == -1, "a SWHID of 39 digits");
    snprintf(name, sizeof(name), "%s%s0", SFS_LL_SWHID_PREFIX, DIGEST);
    CHECK(hash_name(both, SFS_LL_ROOT_INODE, name, key) == -1, "a SWHID of 41 digits");
    CHECK(hash_name(both, SFS_LL_ROOT_INODE, NAME, key) == -1, "a 64-digit key in the root");
    CHECK(hash_name(both, SHA1, NAME, key) == -1, "a 64-digit key in MOUNT/sha1");

    /* one directory for both (never so in a mount): sha1 is asked first */
    const uint64_t same[2] = {SHA1, SHA1};
    CHECK(hash_name(same, SHA1, DIGEST, key) == 0, "the same directory for both");
}

static void test_xattr_names(void)
{
    struct {
        const char *name;
        enum sfs_ll_xattr x;
    } cases[] = {
        {SFS_LL_XATTR_REQUESTS, SFS_LL_XA_REQUESTS},
        {SFS_LL_XATTR_STATS, SFS_LL_XA_STATS},
        {SFS_LL_XATTR_SHARD, SFS_LL_XA_SHARD},
        {SFS_LL_XATTR_OFFSET, SFS_LL_XA_OFFSET},
        {"user.shardfs.requests", SFS_LL_XA_REQUESTS},
        {"user.shardfs.offset", SFS_LL_XA_OFFSET},
        {"", SFS_LL_XA_NONE},
        {"user.shardfs.", SFS_LL_XA_NONE},
        {"user.shardfs.stat", SFS_LL_XA_NONE},
        {"user.shardfs.statss", SFS_LL_XA_NONE},
        {"user.shardfs.Stats", SFS_LL_XA_NONE},
        {"USER.SHARDFS.STATS", SFS_LL_XA_NONE},
        {"trusted.shardfs.stats", SFS_LL_XA_NONE},
        {" user.shardfs.shard", SFS_LL_XA_NONE},
        {"security.selinux", SFS_LL_XA_NONE},
        {"system.posix_acl_access", SFS_LL_XA_NONE},
        {"security.capability", SFS_LL_XA_NONE},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        CHECK(sfs_ll_xattr_name(cases[i].name) == cases[i].x, "xattr name '%s'", cases[i].name);

    /* who has which */
    const enum sfs_ll_inode_kind kinds[] = {SFS_LL_INODE_ROOT, SFS_LL_INODE_DIR, SFS_LL_INODE_OTHER};
    const int has[5][3] = {
        /* root, directory, other */
        {0, 0, 0}, /* none */
        {1, 0, 0}, /* requests */
        {1, 0, 0}, /* stats */
        {0, 0, 1}, /* shard */
        {0, 0, 1}, /* offset */
    };
    for (int x = SFS_LL_XA_NONE; x <= SFS_LL_XA_OFFSET; x++)
        for (int k = 0; k < 3; k++)
            CHECK(sfs_ll_xattr_has((enum sfs_ll_xattr)x, kinds[k]) == has[x][k], "xattr %d of inode kind %d", x,
                  k);
    CHECK(sfs_ll_xattr_has((enum sfs_ll_xattr)99, SFS_LL_INODE_ROOT) == 0, "an attribute out of range");

    /* the lists */
    char out[128];
    static const char root[] = "user.shardfs.requests\0user.shardfs.stats";
    static const char object[] = "user.shardfs.shard\0user.shardfs.offset";
    memset(out, 'x', sizeof(out));
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_ROOT, out, sizeof(out)) == sizeof(root) &&
              memcmp(out, root, sizeof(root)) == 0,
          "the root's list");
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_OTHER, out, sizeof(out)) == sizeof(object) &&
              memcmp(out, object, sizeof(object)) == 0,
          "an object's list");
    memset(out, 'x', sizeof(out));
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_DIR, out, sizeof(out)) == 0 && out[0] == 'x', "a directory's list");
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_DIR, NULL, 0) == 0, "a directory's list, no room");
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_ROOT, out, sizeof(root)) == sizeof(root), "the root's, exactly");
    memset(out, 'x', sizeof(out));
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_ROOT, out, sizeof(root) - 1) == (size_t)-1 && out[0] == 'x',
          "the root's, one byte short");
    CHECK(sfs_ll_xattr_list(SFS_LL_INODE_OTHER, out, 0) == (size_t)-1, "an object's, no room");
    /* every listed name is one the kind has */
    for (int k = 0; k < 3; k++) {
        size_t n = sfs_ll_xattr_list(kinds[k], out, sizeof(out));
        int listed = 0;
        for (size_t at = 0; at < n; at += strlen(out + at) + 1, listed++)
            CHECK(sfs_ll_xattr_has(sfs_ll_xattr_name(out + at), kinds[k]) == 1, "listed %s", out + at);
        int want = 0;
        for (int x = SFS_LL_XA_NONE; x <= SFS_LL_XA_OFFSET; x++)
            want += has[x][k];
        CHECK(listed == want, "kind %d lists %d names, not %d", k, listed, want);
    }
}

static void test_dirent_names(void)
{
    char name[300];
    memset(name, 'a', sizeof(name));
    CHECK(sfs_ll_dirent_name(name, 0) == 0, "an empty name");
    CHECK(sfs_ll_dirent_name(name, 1) == 1, "1 byte");
    CHECK(sfs_ll_dirent_name(name, 64) == 1, "64 bytes");
    CHECK(sfs_ll_dirent_name(name, 255) == 1, "255 bytes");
    CHECK(sfs_ll_dirent_name(name, 256) == 0, "256 bytes");
    CHECK(sfs_ll_dirent_name(name, 300) == 0, "300 bytes");
    CHECK(sfs_ll_dirent_name(name, SIZE_MAX) == 0, "SIZE_MAX bytes");
    CHECK(sfs_ll_dirent_name(".", 1) == 1 && sfs_ll_dirent_name("..", 2) == 1, ". and ..");
    CHECK(sfs_ll_dirent_name("/", 1) == 0, "/");
    CHECK(sfs_ll_dirent_name("a/b", 3) == 0, "a/b");
    CHECK(sfs_ll_dirent_name("ab/", 3) == 0, "a trailing /");
    CHECK(sfs_ll_dirent_name("ab/", 2) == 1, "a / past the length");
    CHECK(sfs_ll_dirent_name("a\0b", 3) == 0, "a NUL inside");
    CHECK(sfs_ll_dirent_name("ab\0", 3) == 0, "a NUL last");
    CHECK(sfs_ll_dirent_name("\xff\x80\x01", 3) == 1, "other bytes");
    name[254] = '/';
    CHECK(sfs_ll_dirent_name(name, 255) == 0, "a / at byte 255");
    CHECK(sfs_ll_dirent_name(name, 254) == 1, "254 bytes before it");
    name[254] = 0;
    CHECK(sfs_ll_dirent_name(name, 255) == 0, "a NUL at byte 255");
}

int main(void)
{
    test_layouts();
    test_split_dir();
    test_names();
    test_object_inodes();
    test_reads();
    test_hash_names();
    test_xattr_names();
    test_dirent_names();
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
