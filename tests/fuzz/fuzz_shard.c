/*
 * fuzz_shard.c — libFuzzer harness for the Read Shard reader (shard.c, chd.c).
 *
 * The input is a whole shard file. It is opened with sfs_open(); when it
 * validates, every read-side function is called on it (bounded work per
 * input): lookups of fixed keys, of keys taken from the input and of the
 * keys stored in the index, the _nowait variants, raw slots, reads of the
 * objects found, sfs_data/sfs_prefetch at the section edges, live count,
 * check, and finally a delete of one stored key on a writable open of a
 * copy in a memfd (the read-only part uses an unlinked disk file, where
 * preadv2(RWF_NOWAIT) works).
 *
 * Besides memory safety (ASan) and undefined behaviour (UBSan), it checks
 * what shard.h promises: any key maps to a slot < slot_count on a
 * validated shard, a found object lies inside the objects section, the
 * _nowait lookup agrees with the blocking one, sfs_check() == 0 means every
 * stored key is found in its own slot, a deleted key is no longer found.
 *
 * Build: see `make fuzz` (clang -fsanitize=fuzzer,address,undefined); the
 * replay driver tests/fuzz/replay.c runs the same code with gcc or valgrind.
 */
#include "fuzz_common.h"

#include "shard.h"

/* Work bounds per input (keep executions fast). */
#define MAX_SLOTS_SCANNED 256 /* slots walked by index order, plus the last 8 */
#define READ_BUF (64 * 1024)  /* bytes of an object copied (sfs_read may pread) */
#define MAX_REPORTS 4

static uint8_t read_buf[READ_BUF + 16];

struct report_ctx {
    uint64_t calls;
};

static void report(void *ctx, const char *message)
{
    struct report_ctx *r = ctx;
    r->calls++;
    FUZZ_ASSERT(message && strlen(message) < 512);
}

/* An object found at [off, off+size) lies inside the objects section and
 * reads back the same through sfs_read, sfs_data and sfs_read_nowait. */
static void check_object(const sfs_shard_t *s, uint64_t off, uint64_t size)
{
    const sfs_header_t *h = sfs_header(s);
    FUZZ_ASSERT(off >= h->objects_position + 8);
    FUZZ_ASSERT(off <= h->objects_position + h->objects_size);
    FUZZ_ASSERT(size <= h->objects_position + h->objects_size - off);
    const uint8_t *p = sfs_data(s, off, size);
    FUZZ_ASSERT(p != NULL);
    size_t n = size < READ_BUF ? (size_t)size : READ_BUF;
    /* a length over 16 KiB takes sfs_read's pread path */
    FUZZ_ASSERT(sfs_read(s, off, read_buf, n) == SFS_OK);
    FUZZ_ASSERT(memcmp(read_buf, p, n) == 0);
    int rc = sfs_read_nowait(s, off, read_buf, n);
    FUZZ_ASSERT(rc == SFS_OK || rc == SFS_EAGAIN);
    if (rc == SFS_OK)
        FUZZ_ASSERT(memcmp(read_buf, p, n) == 0);
    FUZZ_ASSERT(sfs_prefetch(s, off, size) == SFS_OK);
}

/* Look a key up every way; returns the sfs_lookup status. */
static int probe(const sfs_shard_t *s, const uint8_t key[SFS_KEY_SIZE])
{
    uint64_t slots = sfs_slot_count(s);
    uint32_t home = sfs_slot_of(s, key);
    FUZZ_ASSERT(home < slots); /* shard.h: never fails on a validated shard */
    uint64_t off = 0, size = 0, off2 = 0, size2 = 0;
    uint32_t slot = 0, slot2 = 0;
    int rc = sfs_lookup_slot(s, key, &slot, &off, &size);
    FUZZ_ASSERT(rc == SFS_OK || rc == SFS_ENOTFOUND || rc == SFS_ECORRUPT);
    FUZZ_ASSERT(slot == home);
    uint64_t off3 = 0, size3 = 0;
    FUZZ_ASSERT(sfs_lookup(s, key, &off3, &size3) == rc);
    int rc2 = sfs_lookup_nowait(s, key, &slot2, &off2, &size2);
    FUZZ_ASSERT(slot2 == home);
    if (rc2 != SFS_EAGAIN)
        FUZZ_ASSERT(rc2 == rc);
    if (rc == SFS_OK) {
        FUZZ_ASSERT(off3 == off && size3 == size);
        if (rc2 == SFS_OK)
            FUZZ_ASSERT(off2 == off && size2 == size);
        check_object(s, off, size);
    }
    return rc;
}

static void exercise(sfs_shard_t *s, const uint8_t *data, size_t size, uint8_t live_key[32],
                     int *have_live)
{
    const sfs_header_t *h = sfs_header(s);
    uint64_t slots = sfs_slot_count(s);
    FUZZ_ASSERT(slots >= 2 && slots == h->index_size / SFS_SLOT_SIZE);
    FUZZ_ASSERT(sfs_extent(s) <= size);
    FUZZ_ASSERT(sfs_extent(s) == h->hash_position + sfs_hash_size(s));
    FUZZ_ASSERT(strcmp(sfs_path(s), fuzz_disk_fd >= 0 ? fuzz_disk_path_buf : fuzz_path) == 0);

    /* fixed keys, and keys cut from the input */
    uint8_t key[SFS_KEY_SIZE];
    static const uint8_t fixed[] = {0x00, 0xff, 0x80, 0x7f, 0x01};
    for (size_t i = 0; i < sizeof(fixed); i++) {
        memset(key, fixed[i], sizeof(key));
        probe(s, key);
    }
    for (size_t at = 0; at + SFS_KEY_SIZE <= size && at < 4096; at += 509) {
        probe(s, data + at);
    }
    probe(s, data + size - SFS_KEY_SIZE); /* size >= 88 */

    /* raw slots: the first ones and the last ones */
    uint64_t live_seen = 0;
    for (uint64_t k = 0; k < MAX_SLOTS_SCANNED + 8 && k < slots; k++) {
        uint64_t i = k < MAX_SLOTS_SCANNED ? k : slots - (k - MAX_SLOTS_SCANNED) - 1;
        if (k >= MAX_SLOTS_SCANNED && i < MAX_SLOTS_SCANNED)
            break;
        uint64_t offset = sfs_slot_get(s, i, key), off, osize;
        int rc = sfs_slot_object(s, i, key, &off, &osize);
        if (offset == SFS_EMPTY_OFFSET) {
            FUZZ_ASSERT(rc == SFS_ENOTFOUND);
            continue;
        }
        live_seen++;
        FUZZ_ASSERT(rc == SFS_OK || rc == SFS_ECORRUPT);
        if (rc == SFS_OK) {
            FUZZ_ASSERT(off == offset + 8);
            check_object(s, off, osize);
        }
        uint8_t key2[SFS_KEY_SIZE];
        uint64_t off2 = 0, osize2 = 0;
        int rc2 = sfs_slot_object_nowait(s, i, key2, &off2, &osize2);
        if (rc2 != SFS_EAGAIN) {
            FUZZ_ASSERT(rc2 == rc);
            FUZZ_ASSERT(memcmp(key2, key, SFS_KEY_SIZE) == 0);
            if (rc == SFS_OK)
                FUZZ_ASSERT(off2 == off && osize2 == osize);
        }
        int lrc = probe(s, key);
        if (lrc == SFS_OK && !*have_live) {
            memcpy(live_key, key, SFS_KEY_SIZE);
            *have_live = 1;
        }
    }
    FUZZ_ASSERT(sfs_slot_get(s, slots, key) == SFS_EMPTY_OFFSET);
    FUZZ_ASSERT(sfs_slot_get(s, UINT64_MAX, NULL) == SFS_EMPTY_OFFSET);
    uint64_t off, osize;
    FUZZ_ASSERT(sfs_slot_object(s, slots, key, &off, &osize) == SFS_EINVAL);
    FUZZ_ASSERT(sfs_slot_object_nowait(s, slots, key, &off, &osize) == SFS_EINVAL);

    /* section edges */
    uint64_t op = h->objects_position, oe = op + h->objects_size;
    FUZZ_ASSERT(sfs_data(s, op, h->objects_size) != NULL);
    FUZZ_ASSERT(sfs_data(s, oe, 0) != NULL);
    FUZZ_ASSERT(sfs_data(s, oe, 1) == NULL);
    FUZZ_ASSERT(sfs_data(s, op - 1, 1) == NULL);
    FUZZ_ASSERT(sfs_data(s, UINT64_MAX, 1) == NULL);
    FUZZ_ASSERT(sfs_data(s, op, UINT64_MAX) == NULL);
    FUZZ_ASSERT(sfs_read(s, oe, read_buf, 1) == SFS_EINVAL);
    FUZZ_ASSERT(sfs_read_nowait(s, oe, read_buf, 1) == SFS_EINVAL);
    FUZZ_ASSERT(sfs_prefetch(s, op, h->objects_size) == SFS_OK);
    FUZZ_ASSERT(sfs_prefetch(s, oe, 1) == SFS_EINVAL);
    size_t n = h->objects_size < READ_BUF ? (size_t)h->objects_size : READ_BUF;
    FUZZ_ASSERT(sfs_read(s, oe - n, read_buf, n) == SFS_OK);

    /* whole-index functions */
    uint64_t live = sfs_live_count(s);
    FUZZ_ASSERT(live <= slots && live >= live_seen);
    FUZZ_ASSERT(sfs_live_count(s) == live);
    struct report_ctx ctx = {0};
    uint64_t problems = sfs_check(s, report, &ctx, MAX_REPORTS);
    FUZZ_ASSERT(ctx.calls == (problems < MAX_REPORTS ? problems : MAX_REPORTS));
    if (problems == 0) {
        /* clean: every stored key is found, in its own slot */
        FUZZ_ASSERT(live <= h->objects_count);
        for (uint64_t i = 0; i < slots && i < MAX_SLOTS_SCANNED; i++) {
            if (sfs_slot_get(s, i, key) == SFS_EMPTY_OFFSET)
                continue;
            uint32_t slot;
            FUZZ_ASSERT(sfs_lookup_slot(s, key, &slot, &off, &osize) == SFS_OK && slot == i);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* read-only checks on a disk file (the _nowait paths work there), the
     * delete on a memfd (its fdatasync costs nothing) */
    const char *path = fuzz_disk_path(data, size);
    sfs_shard_t *s = (sfs_shard_t *)1;
    sfs_error_t err;
    memset(&err, 0, sizeof(err));
    int rc = sfs_open(path, 0, &s, &err);
    if (rc != SFS_OK) {
        FUZZ_ASSERT(s == NULL);
        FUZZ_ASSERT(rc == SFS_ECORRUPT);
        FUZZ_ASSERT(err.status == rc && err.message[0] != 0);
        FUZZ_ASSERT(strlen(err.message) < sizeof(err.message));
        return 0;
    }
    uint8_t live_key[SFS_KEY_SIZE];
    int have_live = 0;
    exercise(s, data, size, live_key, &have_live);
    sfs_close(s);

    /* delete one stored key through a writable open of the same bytes */
    if (have_live) {
        path = fuzz_input_path(data, size);
        FUZZ_ASSERT(sfs_open(path, 1, &s, &err) == SFS_OK);
        uint64_t before = sfs_live_count(s), off, osize;
        rc = sfs_delete(s, live_key, &err);
        FUZZ_ASSERT(rc == SFS_OK);
        FUZZ_ASSERT(sfs_lookup(s, live_key, &off, &osize) == SFS_ENOTFOUND);
        FUZZ_ASSERT(sfs_live_count(s) == before - 1);
        rc = sfs_delete(s, live_key, &err);
        FUZZ_ASSERT(rc == SFS_ENOTFOUND);
        sfs_close(s);
        /* the file still validates */
        FUZZ_ASSERT(sfs_open(path, 0, &s, &err) == SFS_OK);
        sfs_close(s);
    }
    return 0;
}
