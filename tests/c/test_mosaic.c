/*
 * test_mosaic.c — C tests of the MOSAIC reader (shardfs/c/mosaic.h)
 * against files written by Software Heritage's own writer and manifests
 * made by its own reader (tests/mosaic_fixtures.py, swh.mosaic 0.6.1).
 *
 *   test_mosaic [FIXTURE_DIR]
 *
 * Without FIXTURE_DIR, the fixtures are made in a temporary directory by
 * `$MOSAIC_PYTHON tests/mosaic_fixtures.py DIR` ($MOSAIC_PYTHON defaults to
 * .venv/bin/python; run from the repository's top directory).
 *
 * For every NAME.mosaic with its NAME.mosaic.manifest: the header fields
 * (compression, counters, comments, indexes in order); every key of every
 * object looked up in every index, all giving the same object; every object
 * read whole (its length and SHA-256 against the manifest) and at random
 * offsets and lengths (against the whole read), through a context and
 * without one; deleted and absent keys not found; every slot of every
 * index walked (the live ones are exactly the manifest's keys, their
 * number the reference's); sfs_mosaic_check clean, except for the stale
 * Tile CRC-32s that swh.mosaic's deletion leaves (mosaic.h), which are all
 * it may report there. Then concurrent readers on one file, and damage:
 * every byte of the small files flipped in turn (open, lookups, reads and
 * check must give clean errors: strictly SFS_ECORRUPT at open for
 * ContainerMetaData and the Maps, and from check for entries and objects),
 * every truncation of the small files and many of a large one (SFS_ECORRUPT
 * at open), GOFunction bytes changed with the MapContainer's CRC-32 made
 * right again, hand-made refusals (DocTypeReadVersion 2, another DocType,
 * an unknown CompressionMethod, EndOfTilesOffset past the end), an unknown
 * index description (skipped), an entry pointing outside the tiles, and a
 * raw file declared zstd. Run it once under -fsanitize=address,undefined:
 * none of this may read outside the mapping.
 */
#define _GNU_SOURCE
#include "mosaic.h"
#include "internal.h"
#include "kind.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "check.h"

#define MAX_INDEXES 4
#define MAX_COMMENTS 8

typedef struct {
    uint8_t keys[MAX_INDEXES][32]; /* zero-padded past the key size */
    uint64_t length;
    uint8_t sha[32];
} obj_t;

typedef struct {
    int index; /* in the manifest's order */
    uint8_t key[32];
} absent_t;

typedef struct {
    char file[64];
    char compression[16];
    uint64_t objects_counter, total_size;
    char *comments[MAX_COMMENTS];
    size_t n_comments;
    int n_indexes;
    char index_names[MAX_INDEXES][16];
    size_t key_sizes[MAX_INDEXES];
    uint64_t live[MAX_INDEXES];
    obj_t *objs, *dels;
    size_t n_objs, n_dels;
    absent_t *absent;
    size_t n_absent;
} manifest_t;

static const char *fixtures;

/* ---------------------------------------------------------------- helpers */

static int unhex(const char *s, uint8_t *out, size_t max)
{
    size_t n = strlen(s);
    if (n % 2 || n / 2 > max)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    return (int)(n / 2);
}

static void sha256(const void *data, size_t n, uint8_t out[32])
{
    unsigned len = 32;
    EVP_Digest(data, n, out, &len, EVP_sha256(), NULL);
}

static void *grow(void *p, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return p;
    *cap = *cap ? 2 * *cap : 64;
    p = realloc(p, *cap * size);
    if (!p)
        abort();
    return p;
}

static int load_manifest(const char *path, manifest_t *mf)
{
    memset(mf, 0, sizeof(*mf));
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char *line = NULL;
    size_t cap = 0, cap_objs = 0, cap_dels = 0, cap_absent = 0;
    while (getline(&line, &cap, f) > 0) {
        line[strcspn(line, "\n")] = 0;
        char *save, *word = strtok_r(line, " ", &save);
        if (!word)
            continue;
        if (!strcmp(word, "file")) {
            snprintf(mf->file, sizeof(mf->file), "%s", strtok_r(NULL, " ", &save));
        } else if (!strcmp(word, "compression")) {
            snprintf(mf->compression, sizeof(mf->compression), "%s", strtok_r(NULL, " ", &save));
        } else if (!strcmp(word, "objects_counter")) {
            mf->objects_counter = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
        } else if (!strcmp(word, "objects_total_size")) {
            mf->total_size = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
        } else if (!strcmp(word, "comment") && mf->n_comments < MAX_COMMENTS) {
            char *hex = strtok_r(NULL, " ", &save);
            char *c = calloc(1, hex ? strlen(hex) / 2 + 1 : 1);
            if (hex)
                unhex(hex, (uint8_t *)c, strlen(hex) / 2);
            mf->comments[mf->n_comments++] = c;
        } else if (!strcmp(word, "indexes")) {
            char *name;
            while ((name = strtok_r(NULL, " ", &save)) && mf->n_indexes < MAX_INDEXES) {
                snprintf(mf->index_names[mf->n_indexes], 16, "%s", name);
                int kind = sfs_mosaic_kind_of(name);
                mf->key_sizes[mf->n_indexes++] = kind == SFS_MOSAIC_SHA1 ||
                                                         kind == SFS_MOSAIC_SHA1_GIT ? 20 : 32;
            }
        } else if (!strcmp(word, "live")) {
            char *name = strtok_r(NULL, " ", &save);
            for (int i = 0; i < mf->n_indexes; i++)
                if (!strcmp(name, mf->index_names[i]))
                    mf->live[i] = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
        } else if (!strcmp(word, "O") || !strcmp(word, "D")) {
            int del = word[0] == 'D';
            obj_t *o;
            if (del) {
                mf->dels = grow(mf->dels, mf->n_dels, &cap_dels, sizeof(obj_t));
                o = &mf->dels[mf->n_dels++];
            } else {
                mf->objs = grow(mf->objs, mf->n_objs, &cap_objs, sizeof(obj_t));
                o = &mf->objs[mf->n_objs++];
            }
            memset(o, 0, sizeof(*o));
            for (int i = 0; i < mf->n_indexes; i++)
                unhex(strtok_r(NULL, " ", &save), o->keys[i], 32);
            if (!del) {
                o->length = strtoull(strtok_r(NULL, " ", &save), NULL, 10);
                unhex(strtok_r(NULL, " ", &save), o->sha, 32);
            }
        } else if (!strcmp(word, "A")) {
            char *name = strtok_r(NULL, " ", &save), *hex = strtok_r(NULL, " ", &save);
            mf->absent = grow(mf->absent, mf->n_absent, &cap_absent, sizeof(absent_t));
            absent_t *a = &mf->absent[mf->n_absent++];
            memset(a, 0, sizeof(*a));
            a->index = -1;
            for (int i = 0; i < mf->n_indexes; i++)
                if (!strcmp(name, mf->index_names[i]))
                    a->index = i;
            unhex(hex, a->key, 32);
        }
    }
    free(line);
    fclose(f);
    return mf->file[0] ? 0 : -1;
}

static void free_manifest(manifest_t *mf)
{
    for (size_t i = 0; i < mf->n_comments; i++)
        free(mf->comments[i]);
    free(mf->objs);
    free(mf->dels);
    free(mf->absent);
}

/* The index number in the open file of the manifest's index i. */
static int file_index(const sfs_mosaic_t *m, const manifest_t *mf, int i)
{
    return sfs_mosaic_find_index(m, sfs_mosaic_kind_of(mf->index_names[i]));
}

static int one_line(const sfs_error_t *err)
{
    return err->message[0] && !strchr(err->message, '\n');
}

static uint8_t *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static int write_file(const char *path, const uint8_t *buf, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return -1;
    ssize_t w = write(fd, buf, n);
    close(fd);
    return w == (ssize_t)n ? 0 : -1;
}

/* ---------------------------------------------------------------- EBML, for crafting */

/* The element at pos in buf: its data offset and size; 0, or -1. */
static int el_at(const uint8_t *buf, size_t n, size_t pos, uint32_t *id, size_t *data,
                 uint64_t *size)
{
    if (pos >= n)
        return -1;
    uint8_t b = buf[pos];
    unsigned w = b >= 0x80 ? 1 : b >= 0x40 ? 2 : b >= 0x20 ? 3 : b >= 0x10 ? 4 : 0;
    if (!w || pos + w >= n)
        return -1;
    uint32_t x = 0;
    for (unsigned i = 0; i < w; i++)
        x = x << 8 | buf[pos + i];
    size_t at = pos + w;
    if (buf[at] == 0)
        return -1;
    unsigned len = (unsigned)__builtin_clz(buf[at]) - 23;
    if (at + len > n)
        return -1;
    uint64_t s = buf[at] & (0xFFu >> len);
    for (unsigned i = 1; i < len; i++)
        s = s << 8 | buf[at + i];
    *id = x;
    *data = at + len;
    *size = s;
    return 0;
}

/* The first child of the master at `pos` with ID `want`: its position, or 0. */
static size_t child(const uint8_t *buf, size_t n, size_t pos, uint32_t want)
{
    uint32_t id;
    size_t data, cd;
    uint64_t size, cs;
    if (el_at(buf, n, pos, &id, &data, &size) < 0)
        return 0;
    for (size_t at = data; at < data + size; at = cd + cs) {
        if (el_at(buf, n, at, &id, &cd, &cs) < 0)
            return 0;
        if (id == want)
            return at;
    }
    return 0;
}

/* Make the CRC-32 of the master element at `pos` right again. */
static void fix_crc(uint8_t *buf, size_t n, size_t pos)
{
    uint32_t id;
    size_t data;
    uint64_t size;
    if (el_at(buf, n, pos, &id, &data, &size) < 0)
        return;
    uLong crc = crc32(0L, buf + data + 6, (uInt)(size - 6));
    for (int i = 0; i < 4; i++)
        buf[data + 2 + i] = (uint8_t)(crc >> (8 * i));
}

/* ---------------------------------------------------------------- reading */

/* Read the object at pos whole and at random ranges; compare with o. */
static void check_object(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t pos,
                         const obj_t *o, const char *file, int *frame_sizes_known)
{
    sfs_error_t err;
    uint64_t size = 0;
    int exact = -1;
    int rc = sfs_mosaic_object_size(m, ctx, pos, &size, &exact, &err);
    CHECK(rc == SFS_OK && size == o->length, "%s: object at %llu: size rc %d %llu, expected %llu: "
          "%s", file, (unsigned long long)pos, rc, (unsigned long long)size,
          (unsigned long long)o->length, rc ? err.message : "");
    if (rc == SFS_OK && exact == 0)
        *frame_sizes_known += 1;
    uint8_t *buf = malloc(o->length + 17);
    size_t got = 12345;
    rc = sfs_mosaic_read(m, ctx, pos, 0, buf, o->length + 17, &got, &err);
    REQUIRE(rc == SFS_OK && got == o->length, "%s: object at %llu: read rc %d got %zu, expected "
            "%llu: %s", file, (unsigned long long)pos, rc, got, (unsigned long long)o->length,
            rc ? err.message : "");
    uint8_t sha[32];
    sha256(buf, got, sha);
    CHECK(!memcmp(sha, o->sha, 32), "%s: object at %llu: SHA-256 differs", file,
          (unsigned long long)pos);
    uint8_t *part = malloc(o->length + 17);
    for (int r = 0; r < 4; r++) {
        uint64_t off = next_rand() % (o->length + 1);
        size_t len = (size_t)(next_rand() % (o->length - off + 9));
        if (r == 0) { /* a short piece somewhere */
            len = len > 100 ? 100 : len;
        }
        size_t want = off + len <= o->length ? len : (size_t)(o->length - off);
        rc = sfs_mosaic_read(m, r % 2 ? NULL : ctx, pos, off, part, len, &got, &err);
        CHECK(rc == SFS_OK && got == want && !memcmp(part, buf + off, got),
              "%s: object at %llu: read [%llu, +%zu) rc %d got %zu want %zu", file,
              (unsigned long long)pos, (unsigned long long)off, len, rc, got, want);
    }
    rc = sfs_mosaic_read(m, ctx, pos, o->length, part, 10, &got, &err);
    CHECK(rc == SFS_OK && got == 0, "%s: read at the end: rc %d got %zu", file, rc, got);
    rc = sfs_mosaic_read(m, ctx, pos, o->length + 1000, part, 10, &got, &err);
    CHECK(rc == SFS_OK && got == 0, "%s: read past the end: rc %d got %zu", file, rc, got);
    free(part);
    free(buf);
}

typedef struct {
    uint8_t key[32];
    size_t obj;
} keyref_t;

static int cmp_keyref(const void *a, const void *b)
{
    return memcmp(((const keyref_t *)a)->key, ((const keyref_t *)b)->key, 32);
}

static void report_collect(void *ctx, uint64_t position, uint32_t id, const char *message)
{
    uint64_t *counts = ctx; /* [0]: problems, [1]: stale Tile CRC-32s */
    counts[0]++;
    if (id == SFS_MOSAIC_ID_TILE && strstr(message, "bad CRC-32 of Tile"))
        counts[1]++;
    else
        fprintf(stderr, "  check: %s\n", message);
}

static void test_file(const manifest_t *mf)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    sfs_mosaic_t *m;
    sfs_error_t err;
    int rc = sfs_mosaic_open(path, &m, &err);
    REQUIRE(rc == SFS_OK, "%s: open: %s", mf->file, err.message);
    const sfs_mosaic_info_t *info = sfs_mosaic_info(m);
    static const char *const methods[] = {"none", "zstd", "zstd.dict"};
    CHECK(!strcmp(methods[info->compression], mf->compression), "%s: compression %s, expected %s",
          mf->file, methods[info->compression], mf->compression);
    CHECK(info->objects_counter == mf->objects_counter && info->objects_total_size ==
          mf->total_size, "%s: counters %llu %llu, expected %llu %llu", mf->file,
          (unsigned long long)info->objects_counter, (unsigned long long)info->objects_total_size,
          (unsigned long long)mf->objects_counter, (unsigned long long)mf->total_size);
    CHECK(info->comments == mf->n_comments, "%s: %zu comments, expected %zu", mf->file,
          info->comments, mf->n_comments);
    for (size_t i = 0; i < mf->n_comments && i < info->comments; i++) {
        size_t len;
        const char *c = sfs_mosaic_comment(m, i, &len);
        CHECK(c && !strcmp(c, mf->comments[i]) && len == strlen(c), "%s: comment %zu is \"%s\"",
              mf->file, i, c ? c : "(null)");
    }
    CHECK(sfs_mosaic_comment(m, info->comments, NULL) == NULL, "comment past the end");
    CHECK((int)info->indexes == mf->n_indexes && info->skipped_indexes == 0,
          "%s: %zu indexes (%zu skipped), expected %d", mf->file, info->indexes,
          info->skipped_indexes, mf->n_indexes);
    for (int i = 0; i < mf->n_indexes && i < (int)info->indexes; i++) {
        const sfs_mosaic_index_info_t *x = sfs_mosaic_index(m, (size_t)i);
        CHECK(!strcmp(x->name, mf->index_names[i]) && x->key_size == mf->key_sizes[i],
              "%s: index %d is %s, expected %s", mf->file, i, x->name, mf->index_names[i]);
        CHECK(x->entry_size >= x->key_size + 4 && x->slots == mf->live[i] + mf->n_dels,
              "%s: index %s: entry size %llu, %llu slots", mf->file, x->name,
              (unsigned long long)x->entry_size, (unsigned long long)x->slots);
    }
    if (!strcmp(mf->file, "raw.mosaic"))
        printf("%s: entry sizes %llu (sha1) and %llu (sha256), offsets of %llu bytes; %llu "
               "objects, %llu keys per index\n", mf->file,
               (unsigned long long)sfs_mosaic_index(m, 0)->entry_size,
               (unsigned long long)sfs_mosaic_index(m, 2)->entry_size,
               (unsigned long long)sfs_mosaic_index(m, 0)->entry_size - 24,
               (unsigned long long)info->objects_counter,
               (unsigned long long)sfs_mosaic_index(m, 0)->slots);

    /* Every object through every index. */
    sfs_mosaic_ctx_t *ctx = sfs_mosaic_ctx_new();
    int known = 0;
    uint64_t *positions = calloc(mf->n_objs + 1, sizeof(uint64_t));
    for (size_t j = 0; j < mf->n_objs; j++) {
        const obj_t *o = &mf->objs[j];
        uint64_t pos0 = 0;
        int found = 1;
        for (int i = 0; i < mf->n_indexes; i++) {
            uint64_t slot, pos;
            rc = sfs_mosaic_lookup(m, (size_t)file_index(m, mf, i), o->keys[i], mf->key_sizes[i],
                                   &slot, &pos, &err);
            CHECK(rc == SFS_OK, "%s: object %zu not found by %s: rc %d %s", mf->file, j,
                  mf->index_names[i], rc, rc == SFS_ENOTFOUND ? "" : err.message);
            if (rc != SFS_OK) {
                found = 0;
                continue;
            }
            if (i == 0)
                pos0 = pos;
            CHECK(pos == pos0, "%s: object %zu: %s gives byte %llu, %s %llu", mf->file, j,
                  mf->index_names[i], (unsigned long long)pos, mf->index_names[0],
                  (unsigned long long)pos0);
            uint8_t key[32];
            uint64_t pos2;
            rc = sfs_mosaic_slot(m, (size_t)file_index(m, mf, i), slot, key, &pos2, &err);
            CHECK(rc == SFS_OK && pos2 == pos && !memcmp(key, o->keys[i], mf->key_sizes[i]),
                  "%s: slot %llu does not hold the key it was found at", mf->file,
                  (unsigned long long)slot);
        }
        positions[j] = pos0;
        if (found)
            check_object(m, j % 3 ? ctx : NULL, pos0, o, mf->file, &known);
    }
    if (info->compression != SFS_MOSAIC_NONE && mf->n_objs)
        printf("%s: %d of %zu objects have their decoded size in their zstd frame headers\n",
               mf->file, known, mf->n_objs);

    /* Deleted and absent keys. */
    for (size_t j = 0; j < mf->n_dels; j++)
        for (int i = 0; i < mf->n_indexes; i++) {
            uint64_t pos;
            rc = sfs_mosaic_lookup(m, (size_t)file_index(m, mf, i), mf->dels[j].keys[i],
                                   mf->key_sizes[i], NULL, &pos, &err);
            CHECK(rc == SFS_ENOTFOUND, "%s: deleted key %zu of %s: rc %d", mf->file, j,
                  mf->index_names[i], rc);
        }
    for (size_t j = 0; j < mf->n_absent; j++) {
        const absent_t *a = &mf->absent[j];
        uint64_t pos;
        rc = sfs_mosaic_lookup(m, (size_t)file_index(m, mf, a->index), a->key,
                               mf->key_sizes[a->index], NULL, &pos, &err);
        CHECK(rc == SFS_ENOTFOUND, "%s: absent key %zu of %s: rc %d", mf->file, j,
              mf->index_names[a->index], rc);
    }

    /* Bad arguments. */
    uint64_t pos;
    uint8_t zero[33] = {0};
    if (mf->n_indexes) {
        rc = sfs_mosaic_lookup(m, 0, zero, mf->key_sizes[0] + 1, NULL, &pos, &err);
        CHECK(rc == SFS_EINVAL && one_line(&err), "key of the wrong size: rc %d", rc);
        rc = sfs_mosaic_slot(m, 0, sfs_mosaic_index(m, 0)->slots, NULL, &pos, &err);
        CHECK(rc == SFS_EINVAL, "slot out of range: rc %d", rc);
    }
    rc = sfs_mosaic_lookup(m, info->indexes, zero, 20, NULL, &pos, &err);
    CHECK(rc == SFS_EINVAL, "index out of range: rc %d", rc);
    rc = sfs_mosaic_object(m, 0, NULL, NULL, &err);
    CHECK(rc == SFS_EINVAL, "object at byte 0: rc %d", rc);
    rc = sfs_mosaic_object(m, info->end_of_tiles, NULL, NULL, &err);
    CHECK(rc == SFS_EINVAL, "object at the end of tiles: rc %d", rc);
    if (mf->n_objs) { /* a position inside an object's bytes is not an Object */
        size_t got;
        uint8_t b[4];
        rc = sfs_mosaic_read(m, ctx, positions[0] + 1, 0, b, 4, &got, &err);
        CHECK(rc == SFS_ECORRUPT || rc == SFS_OK || rc == SFS_ENOTFOUND, "rc %d", rc);
    }

    /* Every slot of every index: the live keys are the manifest's. */
    for (int i = 0; i < mf->n_indexes; i++) {
        keyref_t *refs = malloc((mf->n_objs + 1) * sizeof(keyref_t));
        for (size_t j = 0; j < mf->n_objs; j++) {
            memcpy(refs[j].key, mf->objs[j].keys[i], 32);
            refs[j].obj = j;
        }
        qsort(refs, mf->n_objs, sizeof(keyref_t), cmp_keyref);
        int fi = file_index(m, mf, i);
        const sfs_mosaic_index_info_t *x = sfs_mosaic_index(m, (size_t)fi);
        uint64_t live = 0, voided = 0, unknown = 0, mismatch = 0;
        for (uint64_t s = 0; s < x->slots; s++) {
            keyref_t k = {{0}, 0};
            rc = sfs_mosaic_slot(m, (size_t)fi, s, k.key, &pos, &err);
            if (rc == SFS_ENOTFOUND) {
                voided++;
                continue;
            }
            CHECK(rc == SFS_OK, "%s: slot %llu: %s", mf->file, (unsigned long long)s, err.message);
            if (rc != SFS_OK)
                continue;
            live++;
            keyref_t *hit = bsearch(&k, refs, mf->n_objs, sizeof(keyref_t), cmp_keyref);
            if (!hit)
                unknown++;
            else if (positions[hit->obj] != pos)
                mismatch++;
        }
        CHECK(live == mf->live[i] && unknown == 0 && mismatch == 0,
              "%s: index %s: %llu live slots (reference: %llu), %llu unknown keys, %llu at "
              "another object", mf->file, x->name, (unsigned long long)live,
              (unsigned long long)mf->live[i], (unsigned long long)unknown,
              (unsigned long long)mismatch);
        CHECK(voided == mf->n_dels, "%s: index %s: %llu deleted slots, %zu deleted objects",
              mf->file, x->name, (unsigned long long)voided, mf->n_dels);
        free(refs);
    }

    /* The whole check. */
    sfs_mosaic_check_stats_t st;
    uint64_t counts[2] = {0, 0};
    rc = sfs_mosaic_check(m, report_collect, counts, &st, &err);
    if (mf->n_dels == 0) {
        CHECK(rc == SFS_OK && counts[0] == 0, "%s: check: %s", mf->file, err.message);
    } else {
        /* swh.mosaic 0.6.1 leaves the CRC-32 of a Tile holding a deleted
         * object stale (unless it is the last Tile): those only. */
        CHECK(counts[0] == counts[1] && counts[1] <= mf->n_dels &&
              (rc == SFS_OK) == (counts[0] == 0), "%s: check: %llu problems, %llu stale Tile "
              "CRC-32s: %s", mf->file, (unsigned long long)counts[0],
              (unsigned long long)counts[1], err.message);
        printf("%s: %zu objects deleted by swh.mosaic; check finds %llu Tiles (of %llu) with a "
               "stale CRC-32, first: %s\n", mf->file, mf->n_dels, (unsigned long long)counts[1],
               (unsigned long long)st.tiles, rc == SFS_OK ? "none" : err.message);
    }
    uint64_t entries = 0;
    for (size_t i = 0; i < info->indexes; i++)
        entries += sfs_mosaic_index(m, i)->slots;
    CHECK(st.objects == info->objects_counter && st.voids == mf->n_dels &&
          st.live_entries + st.voided_entries == entries &&
          st.voided_entries == mf->n_dels * (uint64_t)mf->n_indexes,
          "%s: check stats: %llu objects, %llu voids, %llu live + %llu voided entries", mf->file,
          (unsigned long long)st.objects, (unsigned long long)st.voids,
          (unsigned long long)st.live_entries, (unsigned long long)st.voided_entries);
    CHECK(st.crcs >= 1 + st.tiles + 2 * info->indexes - counts[1], "%s: %llu CRC-32s verified",
          mf->file, (unsigned long long)st.crcs);
    free(positions);
    sfs_mosaic_ctx_free(ctx);
    sfs_mosaic_close(m);
}

/* ---------------------------------------------------------------- threads */

typedef struct {
    const sfs_mosaic_t *m;
    const manifest_t *mf;
    int id;
    uint64_t ok, bad;
} worker_t;

static void *worker(void *arg)
{
    worker_t *w = arg;
    sfs_mosaic_ctx_t *ctx = w->id % 2 ? sfs_mosaic_ctx_new() : NULL;
    uint8_t *buf = malloc(200 << 10);
    for (size_t k = 0; k < w->mf->n_objs; k++) {
        size_t j = (k * 7 + (size_t)w->id * 131) % w->mf->n_objs;
        const obj_t *o = &w->mf->objs[j];
        int i = (int)((j + (size_t)w->id) % (size_t)w->mf->n_indexes);
        uint64_t pos;
        size_t got;
        sfs_error_t err;
        uint8_t sha[32];
        if (sfs_mosaic_lookup(w->m, (size_t)file_index(w->m, w->mf, i), o->keys[i],
                              w->mf->key_sizes[i], NULL, &pos, &err) != SFS_OK ||
            sfs_mosaic_read(w->m, ctx, pos, 0, buf, 200 << 10, &got, &err) != SFS_OK ||
            got != o->length) {
            w->bad++;
            continue;
        }
        sha256(buf, got, sha);
        if (memcmp(sha, o->sha, 32))
            w->bad++;
        else
            w->ok++;
    }
    free(buf);
    sfs_mosaic_ctx_free(ctx);
    return NULL;
}

static void test_threads(const manifest_t *mf)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    sfs_mosaic_t *m;
    sfs_error_t err;
    REQUIRE(sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
    enum { N = 4 };
    worker_t w[N];
    pthread_t t[N];
    for (int i = 0; i < N; i++) {
        w[i] = (worker_t){m, mf, i, 0, 0};
        pthread_create(&t[i], NULL, worker, &w[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        CHECK(w[i].bad == 0 && w[i].ok == mf->n_objs, "%s: thread %d: %llu good, %llu bad reads",
              mf->file, i, (unsigned long long)w[i].ok, (unsigned long long)w[i].bad);
    }
    sfs_mosaic_close(m);
}

/* ---------------------------------------------------------------- damage */

/* Open `path` and use everything in it; nothing may crash or read out of
 * bounds (the sanitizers tell). Returns the open's status; the check's in
 * *check_rc (1 when not run) and the IDs it reported into *ids (bits: 1
 * ContainerMetaData, 2 Tile, 4 Index or MapContainer, 8 Key, 16 other). */
static uint64_t ids_seen;

static void report_ids(void *ctx, uint64_t position, uint32_t id, const char *message)
{
    ids_seen |= id == SFS_MOSAIC_ID_METADATA ? 1
                : id == SFS_MOSAIC_ID_TILE ? 2
                : id == SFS_MOSAIC_ID_INDEX || id == SFS_MOSAIC_ID_MAP_CONTAINER ? 4
                : id == SFS_MOSAIC_ID_KEY ? 8 : 16;
    if (!message[0] || strchr(message, '\n'))
        ids_seen |= 32;
}

static uint64_t probe_found; /* keys of the manifest found by the last probe, right bytes */

static int probe(const char *path, const manifest_t *mf, int *check_rc, uint64_t *ids,
                 sfs_error_t *err)
{
    sfs_mosaic_t *m;
    probe_found = 0;
    *check_rc = 1;
    *ids = 0;
    int rc = sfs_mosaic_open(path, &m, err);
    if (rc != SFS_OK) {
        CHECK(m == NULL && one_line(err), "a failed open gives NULL and a one-line message");
        return rc;
    }
    static uint8_t buf[8192];
    sfs_error_t e;
    for (size_t j = 0; j < mf->n_objs; j++)
        for (int i = 0; i < mf->n_indexes; i++) {
            int fi = file_index(m, mf, i);
            uint64_t pos, slot;
            if (fi < 0)
                continue;
            int r = sfs_mosaic_lookup(m, (size_t)fi, mf->objs[j].keys[i], mf->key_sizes[i],
                                      &slot, &pos, &e);
            CHECK(r == SFS_OK || r == SFS_ENOTFOUND || r == SFS_ECORRUPT, "lookup rc %d", r);
            if (r == SFS_ECORRUPT)
                CHECK(one_line(&e), "lookup: one line");
            if (r != SFS_OK)
                continue;
            size_t got;
            uint64_t size;
            r = sfs_mosaic_object_size(m, NULL, pos, &size, NULL, &e);
            CHECK(r == SFS_OK || r == SFS_ENOTFOUND || r == SFS_ECORRUPT, "size rc %d", r);
            r = sfs_mosaic_read(m, NULL, pos, 0, buf, sizeof(buf), &got, &e);
            CHECK(r == SFS_OK || r == SFS_ENOTFOUND || r == SFS_ECORRUPT, "read rc %d", r);
            CHECK(r == SFS_OK || got == 0, "a failed read copies nothing");
            uint8_t sha[32];
            sha256(buf, got, sha);
            probe_found += r == SFS_OK && got == mf->objs[j].length &&
                           !memcmp(sha, mf->objs[j].sha, 32);
            if (j % 5 == 0 && r == SFS_OK)
                r = sfs_mosaic_read(m, NULL, pos, j % 7, buf, 100, &got, &e);
        }
    for (size_t i = 0; i < sfs_mosaic_info(m)->indexes; i++)
        for (uint64_t s = 0; s < sfs_mosaic_index(m, i)->slots; s++) {
            uint8_t key[32];
            uint64_t pos;
            int r = sfs_mosaic_slot(m, i, s, key, &pos, &e);
            CHECK(r == SFS_OK || r == SFS_ENOTFOUND || r == SFS_ECORRUPT, "slot rc %d", r);
        }
    ids_seen = 0;
    *check_rc = sfs_mosaic_check(m, report_ids, NULL, NULL, &e);
    *ids = ids_seen;
    CHECK(!(ids_seen & 32), "check: one-line messages");
    CHECK(*check_rc == SFS_OK || (*check_rc == SFS_ECORRUPT && one_line(&e)), "check rc %d",
          *check_rc);
    sfs_mosaic_close(m);
    return SFS_OK;
}

/* Flip every byte of the file in turn (xor a random nonzero value), in a
 * copy; the expectations depend on the region the byte is in. */
static void test_flips(const manifest_t *mf)
{
    char path[600], copy[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    snprintf(copy, sizeof(copy), "%s/flip-%s", dir, mf->file);
    size_t n;
    uint8_t *orig = read_file(path, &n);
    REQUIRE(orig && write_file(copy, orig, n) == 0, "copy %s", path);
    sfs_mosaic_t *m;
    sfs_error_t err;
    REQUIRE(sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
    sfs_mosaic_info_t info = *sfs_mosaic_info(m);
    sfs_mosaic_index_info_t ix[MAX_INDEXES];
    for (size_t i = 0; i < info.indexes; i++)
        ix[i] = *sfs_mosaic_index(m, i);
    sfs_mosaic_close(m);
    int fd = open(copy, O_WRONLY);
    REQUIRE(fd >= 0, "open %s", copy);
    uint64_t opened = 0, refused = 0, strict = 0;
    for (size_t at = 0; at < n; at++) {
        uint8_t b = orig[at] ^ (uint8_t)(1 + next_rand() % 255);
        if (pwrite(fd, &b, 1, (off_t)at) != 1)
            break;
        int check_rc;
        uint64_t ids;
        int rc = probe(copy, mf, &check_rc, &ids, &err);
        rc == SFS_OK ? opened++ : refused++;
        CHECK(rc == SFS_OK || rc == SFS_ECORRUPT, "%s: byte %zu flipped: open rc %d", mf->file,
              at, rc);
        /* Where the byte is. */
        int in_metadata = at >= info.metadata_position && at < info.tiles_position;
        /* past the first Tile's ID and size */
        int in_tiles = at >= info.tiles_position + 10 && at < info.end_of_tiles;
        int in_map = 0, in_entries = 0;
        for (size_t i = 0; i < info.indexes; i++) {
            uint64_t end = i + 1 < info.indexes ? ix[i + 1].position : info.mosaic_end;
            if (at >= end - ix[i].map_size && at < end)
                in_map = 1;
            if (at >= ix[i].unrolled_position &&
                at < ix[i].unrolled_position + ix[i].slots * ix[i].entry_size)
                in_entries = 1;
        }
        if (in_metadata || in_map) {
            strict++;
            CHECK(rc == SFS_ECORRUPT, "%s: byte %zu (%s) flipped: open rc %d", mf->file, at,
                  in_metadata ? "ContainerMetaData" : "Map", rc);
        } else if (in_entries) {
            strict++;
            CHECK(rc == SFS_OK && check_rc == SFS_ECORRUPT && (ids & 4), "%s: byte %zu (entry) "
                  "flipped: open rc %d, check rc %d, ids 0x%llx", mf->file, at, rc, check_rc,
                  (unsigned long long)ids);
        } else if (in_tiles) {
            strict++;
            CHECK(rc == SFS_OK && check_rc == SFS_ECORRUPT, "%s: byte %zu (tiles) "
                  "flipped: open rc %d, check rc %d, ids 0x%llx", mf->file, at, rc, check_rc,
                  (unsigned long long)ids);
        }
        if (pwrite(fd, orig + at, 1, (off_t)at) != 1)
            break;
    }
    close(fd);
    printf("%s: %zu bytes flipped one at a time: %llu refused at open, %llu opened "
           "(%llu with a required outcome)\n", mf->file, n, (unsigned long long)refused,
           (unsigned long long)opened, (unsigned long long)strict);
    unlink(copy);
    free(orig);
}

/* Every truncation of a small file; a sample of a large one (cut from the
 * end down, in place). */
static void test_truncations(const manifest_t *mf, int every)
{
    char path[600], copy[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    snprintf(copy, sizeof(copy), "%s/cut-%s", dir, mf->file);
    size_t n;
    uint8_t *orig = read_file(path, &n);
    REQUIRE(orig && write_file(copy, orig, n) == 0, "copy %s", path);
    uint64_t tried = 0, bad = 0;
    size_t len = n;
    while (len > 0) {
        if (every)
            len--;
        else
            len = len > 4096 ? len - 1 - (size_t)(next_rand() % (len / 20 + 1)) : len - 1;
        if (truncate(copy, (off_t)len) != 0)
            break;
        int check_rc;
        uint64_t ids;
        sfs_error_t err;
        int rc = probe(copy, mf, &check_rc, &ids, &err);
        tried++;
        if (rc != SFS_ECORRUPT) {
            bad++;
            CHECK(0, "%s truncated to %zu bytes: open rc %d", mf->file, len, rc);
        }
        if (len == n - 1 || len == 0 || len == 20)
            printf("%s truncated to %zu bytes: %s\n", mf->file, len, err.message);
    }
    printf("%s: %llu truncations, all refused at open: %s\n", mf->file,
           (unsigned long long)tried, bad ? "no" : "yes");
    unlink(copy);
    free(orig);
}

/* Write buf as a file and open it: the status, the message in err. */
static int open_crafted(const char *name, const uint8_t *buf, size_t n, sfs_mosaic_t **m,
                        sfs_error_t *err)
{
    const char *p = path_of(name);
    if (write_file(p, buf, n) != 0)
        return -1000;
    int rc = sfs_mosaic_open(p, m, err);
    return rc;
}

static void test_crafted(const manifest_t *small, const manifest_t *small_zstd)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, small->file);
    size_t n;
    uint8_t *orig = read_file(path, &n), *buf = malloc(n + 4096);
    REQUIRE(orig && buf, "read %s", path);
    sfs_mosaic_t *m;
    sfs_error_t err;
    REQUIRE(sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
    sfs_mosaic_info_t info = *sfs_mosaic_info(m);
    sfs_mosaic_index_info_t ix0 = *sfs_mosaic_index(m, 0), ix1 = *sfs_mosaic_index(m, 1);
    uint64_t obj_pos, obj_data, obj_size;
    REQUIRE(sfs_mosaic_lookup(m, 0, small->objs[0].keys[0], 20, NULL, &obj_pos, &err) == SFS_OK &&
            sfs_mosaic_object(m, obj_pos, &obj_data, &obj_size, &err) == SFS_OK, "lookup");
    sfs_mosaic_close(m);
    size_t md = (size_t)info.metadata_position;
    int rc;

    /* DocTypeReadVersion 2: refused, naming the version. */
    memcpy(buf, orig, n);
    uint8_t *v = memmem(buf, 60, "\x42\x85\x81\x01", 4);
    REQUIRE(v != NULL, "no DocTypeReadVersion 1 in the header");
    v[3] = 2;
    rc = open_crafted("v2.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_ECORRUPT && strstr(err.message, "DocTypeReadVersion is 2") && one_line(&err),
          "DocTypeReadVersion 2: rc %d: %s", rc, err.message);
    printf("refused: %s\n", err.message);
    /* Another DocType. */
    memcpy(buf, orig, n);
    v = memmem(buf, 60, "mosaic", 6);
    REQUIRE(v != NULL, "no DocType");
    v[5] = 'x';
    rc = open_crafted("doctype.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_ECORRUPT && strstr(err.message, "\"mosaix\""), "DocType: rc %d: %s", rc,
          err.message);
    /* An unknown CompressionMethod, its CRC-32 made right. */
    memcpy(buf, orig, n);
    v = memmem(buf + md, info.tiles_position - md, "\x50\x02\x84none", 6);
    REQUIRE(v != NULL, "no CompressionMethod none");
    memcpy(v + 3, "lzma", 4);
    fix_crc(buf, n, md);
    rc = open_crafted("method.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_ECORRUPT && strstr(err.message, "\"lzma\""), "method: rc %d: %s", rc,
          err.message);
    /* A raw file declared zstd: reads fail cleanly (not zstd frames). */
    memcpy(v + 3, "zstd", 4);
    fix_crc(buf, n, md);
    rc = open_crafted("declared-zstd.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_OK, "declared zstd: %s", err.message);
    if (rc == SFS_OK) {
        uint64_t fails = 0, size;
        for (size_t j = 0; j < small->n_objs; j++) {
            uint64_t pos;
            size_t got;
            uint8_t out[4096];
            if (sfs_mosaic_lookup(m, 0, small->objs[j].keys[0], 20, NULL, &pos, &err) != SFS_OK)
                continue;
            int r1 = sfs_mosaic_object_size(m, NULL, pos, &size, NULL, &err);
            int r2 = sfs_mosaic_read(m, NULL, pos, 0, out, sizeof(out), &got, &err);
            fails += small->objs[j].length > 0 && r1 == SFS_ECORRUPT && r2 == SFS_ECORRUPT;
            CHECK(r2 != SFS_ECORRUPT || one_line(&err), "one line");
        }
        uint64_t nonempty = 0;
        for (size_t j = 0; j < small->n_objs; j++)
            nonempty += small->objs[j].length > 0;
        CHECK(fails == nonempty, "declared zstd: %llu of %llu objects fail to decode",
              (unsigned long long)fails, (unsigned long long)nonempty);
        sfs_mosaic_close(m);
    }
    /* EndOfTilesOffset past the Mosaic's end. */
    memcpy(buf, orig, n);
    v = memmem(buf + md, info.tiles_position - md, "\x50\x99\x88", 3);
    REQUIRE(v != NULL, "no EndOfTilesOffset");
    memset(v + 3, 0x7F, 8);
    fix_crc(buf, n, md);
    rc = open_crafted("eot.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_ECORRUPT && strstr(err.message, "EndOfTilesOffset"), "eot: rc %d: %s", rc,
          err.message);
    /* An unknown index description: that index is skipped. */
    memcpy(buf, orig, n);
    v = memmem(buf + ix0.position, 40, "key:sha1 ", 9);
    REQUIRE(v != NULL, "no key:sha1");
    v[4] = 'S';
    rc = open_crafted("unknown-index.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_OK, "unknown index: %s", err.message);
    if (rc == SFS_OK) {
        const sfs_mosaic_info_t *in = sfs_mosaic_info(m);
        uint64_t pos;
        CHECK(in->indexes == 1 && in->skipped_indexes == 1 &&
              sfs_mosaic_find_index(m, SFS_MOSAIC_SHA1) == SFS_ENOTFOUND &&
              sfs_mosaic_lookup(m, 0, small->objs[1].keys[1], 32, NULL, &pos, &err) == SFS_OK,
              "unknown index: %zu indexes, %zu skipped", in->indexes, in->skipped_indexes);
        rc = sfs_mosaic_check(m, NULL, NULL, NULL, &err);
        CHECK(rc == SFS_ECORRUPT && strstr(err.message, "CRC-32 of Index"), "check: %s",
              err.message);
        sfs_mosaic_close(m);
    }
    /* Trailing bytes after the Mosaic element (a block device): fine. */
    memcpy(buf, orig, n);
    memset(buf + n, 0xAB, 4096);
    rc = open_crafted("trailing.mosaic", buf, n + 4096, &m, &err);
    CHECK(rc == SFS_OK && sfs_mosaic_check(m, NULL, NULL, NULL, &err) == SFS_OK,
          "trailing bytes: %s", err.message);
    if (rc == SFS_OK)
        sfs_mosaic_close(m);
    /* An object byte flipped in a raw file: read gives other bytes, check
     * names the Tile. */
    memcpy(buf, orig, n);
    buf[obj_data + obj_size / 2] ^= 0x40;
    rc = open_crafted("object.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_OK, "object flip: %s", err.message);
    if (rc == SFS_OK) {
        if (small->objs[0].length > 0) {
            uint8_t out[4096], sha[32];
            size_t got;
            rc = sfs_mosaic_read(m, NULL, obj_pos, 0, out, sizeof(out), &got, &err);
            sha256(out, got, sha);
            CHECK(rc == SFS_OK && memcmp(sha, small->objs[0].sha, 32) != 0,
                  "flipped object read");
            rc = sfs_mosaic_check(m, NULL, NULL, NULL, &err);
            CHECK(rc == SFS_ECORRUPT && strstr(err.message, "bad CRC-32 of Tile at byte"),
                  "check: %s", err.message);
            printf("object byte flipped: %s\n", err.message);
        }
        sfs_mosaic_close(m);
    }
    /* An entry's Offset pointing outside the tiles; a key byte flipped. */
    memcpy(buf, orig, n);
    size_t e0 = (size_t)ix1.unrolled_position, esz = (size_t)ix1.entry_size;
    REQUIRE(buf[e0] == 0xA0 && buf[e0 + 34] == 0xA1, "entry layout");
    memset(buf + e0 + 36, 0, esz - 36); /* Offset 0 */
    buf[e0 + esz + 2] ^= 1;             /* entry 1's key */
    rc = open_crafted("entry.mosaic", buf, n, &m, &err);
    CHECK(rc == SFS_OK, "entry: %s", err.message);
    if (rc == SFS_OK) {
        uint8_t key[32];
        uint64_t pos;
        rc = sfs_mosaic_slot(m, 1, 0, key, &pos, &err);
        CHECK(rc == SFS_ECORRUPT && strstr(err.message, "outside the tiles"), "entry 0: %s",
              err.message);
        memcpy(key, buf + e0 + 2, 32);
        rc = sfs_mosaic_lookup(m, 1, key, 32, NULL, &pos, &err);
        CHECK(rc == SFS_ECORRUPT, "lookup of entry 0's key: rc %d", rc);
        CHECK(sfs_mosaic_slot(m, 1, 1, key, &pos, &err) == SFS_OK, "entry 1");
        key[0] ^= 1;
        rc = sfs_mosaic_lookup(m, 1, key, 32, NULL, &pos, &err);
        CHECK(rc == SFS_ENOTFOUND, "lookup of entry 1's true key: rc %d", rc);
        uint64_t counts[2] = {0, 0};
        rc = sfs_mosaic_check(m, NULL, counts, NULL, &err);
        CHECK(rc == SFS_ECORRUPT, "check of entries: rc %d", rc);
        sfs_mosaic_close(m);
    }
    /* Every byte of the Maps changed, the CRC-32s of their MapContainer and
     * Index made right: sfs_gof_read refuses the GOFunction, or the lookups
     * and check give clean answers, and a clean check means every key is
     * still found (the entry check caught any key the change moved). */
    uint64_t gof_refused = 0, gof_opened = 0, gof_caught = 0;
    for (int f = 0; f < 2; f++) {
        const manifest_t *mf = f ? small_zstd : small;
        snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
        free(orig);
        orig = read_file(path, &n);
        REQUIRE(sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
        info = *sfs_mosaic_info(m);
        ix0 = *sfs_mosaic_index(m, 0);
        ix1 = *sfs_mosaic_index(m, 1);
        sfs_mosaic_close(m);
        for (int i = 0; i < 2; i++) {
            const sfs_mosaic_index_info_t *x = i ? &ix1 : &ix0;
            uint64_t end = i ? info.mosaic_end : ix1.position;
            size_t container = child(orig, n, (size_t)x->position, SFS_MOSAIC_ID_MAP_CONTAINER);
            REQUIRE(container != 0, "no MapContainer");
            for (uint64_t at = end - x->map_size; at < end; at++) {
                for (int t = 0; t < 2; t++) {
                    memcpy(buf, orig, n);
                    buf[at] = t ? (uint8_t)(buf[at] ^ (1 + next_rand() % 255)) : 0xFF;
                    fix_crc(buf, n, container);
                    fix_crc(buf, n, (size_t)x->position);
                    const char *p = path_of("gof.mosaic");
                    write_file(p, buf, n);
                    int check_rc;
                    uint64_t ids;
                    rc = probe(p, mf, &check_rc, &ids, &err);
                    CHECK(rc == SFS_OK || rc == SFS_ECORRUPT, "gof flip: rc %d", rc);
                    if (rc != SFS_OK) {
                        gof_refused++;
                        continue;
                    }
                    gof_opened++;
                    gof_caught += check_rc == SFS_ECORRUPT;
                    CHECK(check_rc == SFS_ECORRUPT ? (ids & 8) != 0
                          : probe_found == mf->n_objs * (uint64_t)mf->n_indexes,
                          "%s: Map byte %llu changed, CRCs fixed: check rc %d ids 0x%llx, %llu "
                          "keys found", mf->file, (unsigned long long)at, check_rc,
                          (unsigned long long)ids, (unsigned long long)probe_found);
                }
            }
        }
    }
    printf("GOFunction bytes changed under a right CRC-32: %llu refused by sfs_gof_read, %llu "
           "opened (%llu of them with keys moved, caught by check; the others find every "
           "key)\n", (unsigned long long)gof_refused,
           (unsigned long long)gof_opened, (unsigned long long)gof_caught);
    free(orig);
    free(buf);
}

/* Write `value` as a VINT of exactly `width` bytes at p. */
static void put_vint(uint8_t *p, unsigned width, uint64_t value)
{
    for (unsigned i = 0; i < width; i++)
        p[width - 1 - i] = (uint8_t)(value >> (8 * i));
    p[0] |= (uint8_t)(0x80 >> (width - 1));
}

/* One zstd frame of src, with or without its content size. */
static size_t frame(uint8_t *out, size_t cap, const uint8_t *src, size_t n, int content_size)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, content_size);
    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    ZSTD_outBuffer o = {out, cap, 0};
    ZSTD_inBuffer i = {src, n, 0};
    size_t left = ZSTD_compressStream2(c, &o, &i, ZSTD_e_end); /* streamed: size unknown */
    ZSTD_freeCCtx(c);
    return ZSTD_isError(left) || left ? 0 : o.pos;
}

/* Objects of several zstd frames, some without their content size (which
 * swh-mosaic never writes, but its reader decodes: a stream decoder): the
 * last object of small_zstd.mosaic is replaced by [frame of its first half,
 * with or without content size][skippable frame][frame of the rest, with
 * its XXH64 checksum], the Tile, Mosaic and EndOfTilesOffset made to fit
 * and the CRC-32s right. Sizes (decoded when a frame does not say) and
 * reads must give the object's bytes. */
static void test_frames(const manifest_t *mf)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    size_t n;
    uint8_t *orig = read_file(path, &n);
    sfs_mosaic_t *m;
    sfs_error_t err;
    REQUIRE(orig && sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
    sfs_mosaic_info_t info = *sfs_mosaic_info(m);
    /* The last Object of the last Tile. */
    size_t tile = 0, last = 0, at, data, cd;
    uint32_t id;
    uint64_t size, cs;
    for (at = (size_t)info.tiles_position; at < info.end_of_tiles; at = data + size)
        if (el_at(orig, n, at, &id, &data, &size) == 0 && id == SFS_MOSAIC_ID_TILE)
            tile = at;
        else
            break;
    REQUIRE(tile && el_at(orig, n, tile, &id, &data, &size) == 0, "no Tile");
    for (at = data; at < data + size; at = cd + cs)
        if (el_at(orig, n, at, &id, &cd, &cs) == 0 && id == SFS_MOSAIC_ID_OBJECT)
            last = at;
    /* Its key and content. */
    uint8_t key[32];
    uint64_t pos = 0;
    const obj_t *o = NULL;
    for (uint64_t s = 0; s < sfs_mosaic_index(m, 0)->slots && !o; s++)
        if (sfs_mosaic_slot(m, 0, s, key, &pos, &err) == SFS_OK && pos == last)
            for (size_t j = 0; j < mf->n_objs; j++)
                if (!memcmp(mf->objs[j].keys[0], key, 20))
                    o = &mf->objs[j];
    sfs_mosaic_close(m);
    REQUIRE(o && o->length >= 2, "the last object is not found or too short");
    uint8_t *content = malloc(o->length), *frames = malloc(2 * o->length + 256);
    size_t got;
    uint64_t old_data, old_size;
    REQUIRE(sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
    int rc = sfs_mosaic_read(m, NULL, last, 0, content, o->length, &got, &err);
    sfs_mosaic_object(m, last, &old_data, &old_size, &err);
    sfs_mosaic_close(m);
    REQUIRE(rc == SFS_OK && got == o->length, "read the last object");
    size_t old_end = (size_t)(old_data + old_size);
    for (int with_size = 0; with_size < 2; with_size++) {
        size_t half = o->length / 2, k = 0;
        k += frame(frames, 2 * o->length + 256, content, half, with_size);
        const uint8_t skippable[12] = {0x50, 0x2A, 0x4D, 0x18, 4, 0, 0, 0, 'p', 'a', 'd', '!'};
        memcpy(frames + k, skippable, sizeof(skippable));
        k += sizeof(skippable);
        k += frame(frames + k, 2 * o->length + 256 - k, content + half, o->length - half, 1);
        /* The new file: the object element rewritten with an 8-byte size. */
        size_t head = last + 1 + 8, delta = head + k - old_end; /* grows: k > old size */
        REQUIRE(head + k > old_end, "frames smaller than the object");
        uint8_t *buf = malloc(n + delta);
        memcpy(buf, orig, last);
        buf[last] = SFS_MOSAIC_ID_OBJECT;
        put_vint(buf + last + 1, 8, k);
        memcpy(buf + head, frames, k);
        memcpy(buf + head + k, orig + old_end, n - old_end);
        /* The Tile's size (same VINT width), the Mosaic's, EndOfTilesOffset. */
        el_at(orig, n, tile, &id, &data, &size);
        put_vint(buf + tile + 4, (unsigned)(data - tile - 4), size + delta);
        size_t mosaic;
        el_at(orig, n, 0, &id, &data, &size);
        mosaic = data + size;
        el_at(orig, n, mosaic, &id, &data, &size);
        put_vint(buf + mosaic + 4, 8, size + delta);
        uint8_t *eot = memmem(buf + info.metadata_position,
                              info.tiles_position - info.metadata_position, "\x50\x99\x88", 3);
        REQUIRE(eot != NULL, "no EndOfTilesOffset");
        uint64_t v = 0;
        for (int i = 0; i < 8; i++)
            v = v << 8 | eot[3 + i];
        v += delta;
        for (int i = 0; i < 8; i++)
            eot[3 + i] = (uint8_t)(v >> (56 - 8 * i));
        fix_crc(buf, n + delta, (size_t)info.metadata_position);
        fix_crc(buf, n + delta, tile);
        const char *p = path_of("frames.mosaic");
        write_file(p, buf, n + delta);
        free(buf);
        rc = sfs_mosaic_open(p, &m, &err);
        REQUIRE(rc == SFS_OK, "frames file: %s", err.message);
        uint64_t found, dsize = 0;
        int exact = -1;
        rc = sfs_mosaic_lookup(m, 0, o->keys[0], 20, NULL, &found, &err);
        CHECK(rc == SFS_OK && found == last, "lookup: rc %d", rc);
        sfs_mosaic_ctx_t *ctx = sfs_mosaic_ctx_new();
        rc = sfs_mosaic_object_size(m, with_size ? NULL : ctx, last, &dsize, &exact, &err);
        CHECK(rc == SFS_OK && dsize == o->length && exact == !with_size,
              "%d frames' sizes: rc %d size %llu exact %d: %s", with_size, rc,
              (unsigned long long)dsize, exact, rc ? err.message : "");
        check_object(m, ctx, last, o, "frames.mosaic", &exact);
        rc = sfs_mosaic_check(m, NULL, NULL, NULL, &err);
        CHECK(rc == SFS_OK, "frames file: check: %s", err.message);
        /* The checksum of the last frame: its last byte changed. */
        sfs_mosaic_close(m);
        buf = read_file(p, &got);
        buf[head + k - 1] ^= 1;
        write_file(p, buf, got);
        free(buf);
        REQUIRE(sfs_mosaic_open(p, &m, &err) == SFS_OK, "%s", err.message);
        uint8_t *out = malloc(o->length);
        rc = sfs_mosaic_read(m, ctx, last, 0, out, o->length, &got, &err);
        CHECK(rc == SFS_ECORRUPT && got == 0 && strstr(err.message, "zstd"),
              "a bad frame checksum: rc %d: %s", rc, err.message);
        if (with_size == 0)
            printf("frame checksum changed: %s\n", err.message);
        free(out);
        sfs_mosaic_ctx_free(ctx);
        sfs_mosaic_close(m);
    }
    free(content);
    free(frames);
    free(orig);
}

/* Damage in the large zstd.dict file: its ContainerMetaData (the
 * dictionary) and its Maps, at random bytes: refused at open. */
static void test_large_flips(const manifest_t *mf)
{
    char path[600], copy[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    snprintf(copy, sizeof(copy), "%s/lflip-%s", dir, mf->file);
    size_t n;
    uint8_t *orig = read_file(path, &n);
    REQUIRE(orig && write_file(copy, orig, n) == 0, "copy");
    sfs_mosaic_t *m;
    sfs_error_t err;
    REQUIRE(sfs_mosaic_open(path, &m, &err) == SFS_OK, "%s", err.message);
    sfs_mosaic_info_t info = *sfs_mosaic_info(m);
    CHECK(info.dictionary_size > 0, "dictionary");
    sfs_mosaic_index_info_t ix[MAX_INDEXES];
    for (size_t i = 0; i < info.indexes; i++)
        ix[i] = *sfs_mosaic_index(m, i);
    sfs_mosaic_close(m);
    int fd = open(copy, O_WRONLY);
    uint64_t refused = 0, tried = 0;
    for (int k = 0; k < 600; k++) {
        uint64_t at;
        if (k < 200) {
            at = info.metadata_position + next_rand() % (info.tiles_position -
                                                         info.metadata_position);
        } else {
            size_t i = (size_t)k % info.indexes;
            uint64_t end = i + 1 < info.indexes ? ix[i + 1].position : info.mosaic_end;
            at = end - 1 - next_rand() % ix[i].map_size;
        }
        uint8_t b = orig[at] ^ (uint8_t)(1 + next_rand() % 255);
        if (pwrite(fd, &b, 1, (off_t)at) != 1)
            break;
        int rc = sfs_mosaic_open(copy, &m, &err);
        tried++;
        refused += rc == SFS_ECORRUPT && one_line(&err);
        if (rc == SFS_OK)
            sfs_mosaic_close(m);
        pwrite(fd, orig + at, 1, (off_t)at);
    }
    close(fd);
    CHECK(refused == tried, "%s: %llu of %llu flips in ContainerMetaData and the Maps refused",
          mf->file, (unsigned long long)refused, (unsigned long long)tried);
    unlink(copy);
    free(orig);
}

typedef struct {
    const manifest_t *mf;
    const sfs_shard_t *s;
    int sha256, hash; /* manifest index numbers */
    size_t count, wrong;
} own_seen_t;

/* One digest of sfs_own_digests: it must be the digest of the manifest
 * object whose sha256 key the shard finds at `slot`. */
static void own_check(void *ctx, const uint8_t *digest, uint32_t slot)
{
    own_seen_t *o = ctx;
    o->count++;
    for (size_t i = 0; i < o->mf->n_objs; i++)
        if (!memcmp(o->mf->objs[i].keys[o->hash], digest, 20)) {
            uint32_t at;
            uint64_t off, size;
            if (sfs_lookup_slot(o->s, o->mf->objs[i].keys[o->sha256], &at, &off, &size) != SFS_OK || at != slot)
                o->wrong++;
            return;
        }
    o->wrong++;
}

/* The file as a shard (kind_mosaic.c): sfs_open recognizes it by its
 * content and serves it by its sha256 index as a Read Shard view: every
 * live object by key and by slot, whole and in pieces, byte-identical to
 * the manifest (swh.mosaic's reader); deleted and absent keys not found;
 * the index view (sfs_index_read) and the object view (sfs_source_read)
 * agree with the lookups; check clean; writing refused; a file without a
 * sha256 index refused in one line. */
static void test_kind(const manifest_t *mf)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/%s", fixtures, mf->file);
    int x = -1;
    for (int i = 0; i < mf->n_indexes; i++)
        if (!strcmp(mf->index_names[i], "sha256"))
            x = i;
    sfs_shard_t *s;
    sfs_error_t err;
    int rc = sfs_open(path, 0, &s, &err);
    if (x < 0) {
        CHECK(rc == SFS_EINVAL && one_line(&err) && strstr(err.message, "sha256"),
              "%s: no sha256 index: open rc %d: %s", mf->file, rc, rc ? err.message : "");
        if (rc == SFS_OK)
            sfs_close(s);
        return;
    }
    REQUIRE(rc == SFS_OK, "%s: sfs_open: %s", mf->file, err.message);
    CHECK(!strcmp(sfs_kind_name(s), "mosaic"), "%s: kind %s", mf->file, sfs_kind_name(s));
    CHECK(sfs_live_count(s) == mf->live[x], "%s: live %llu, expected %llu", mf->file,
          (unsigned long long)sfs_live_count(s), (unsigned long long)mf->live[x]);
    CHECK(sfs_check(s, NULL, NULL, 0) == 0, "%s: sfs_check found problems", mf->file);
    uint64_t slots = sfs_slot_count(s), seen = 0;
    uint8_t *bytes = malloc(1 << 20), *piece = malloc(1 << 20), key[32];
    for (size_t i = 0; i < mf->n_objs; i++) {
        const obj_t *o = &mf->objs[i];
        uint64_t off = 0, size = 0;
        uint32_t slot = UINT32_MAX;
        rc = sfs_lookup_slot(s, o->keys[x], &slot, &off, &size);
        REQUIRE(rc == SFS_OK && size == o->length && o->length <= (1 << 20), "%s: object %zu: lookup rc %d "
                "size %llu, expected %llu", mf->file, i, rc, (unsigned long long)size,
                (unsigned long long)o->length);
        CHECK(sfs_slot_of(s, o->keys[x]) == slot, "%s: object %zu: slot_of", mf->file, i);
        rc = sfs_read(s, off, bytes, size);
        uint8_t sha[32];
        sha256(bytes, size, sha);
        CHECK(rc == SFS_OK && !memcmp(sha, o->sha, 32), "%s: object %zu: read rc %d or bytes differ",
              mf->file, i, rc);
        uint64_t at = size ? next_rand() % size : 0, len = size - at;
        rc = sfs_read(s, off + at, piece, len);
        CHECK(rc == SFS_OK && !memcmp(piece, bytes + at, len), "%s: object %zu: read [%llu, +%llu)",
              mf->file, i, (unsigned long long)at, (unsigned long long)len);
        const uint8_t *p = sfs_data(s, off, size);
        CHECK(!p || !memcmp(p, bytes, size), "%s: object %zu: sfs_data bytes differ", mf->file, i);
        CHECK(!strcmp(mf->compression, "none") ? p != NULL || size == 0 : p == NULL,
              "%s: object %zu: sfs_data %p", mf->file, i, (const void *)p);
        uint64_t off2, size2;
        rc = sfs_slot_object(s, slot, key, &off2, &size2);
        CHECK(rc == SFS_OK && !memcmp(key, o->keys[x], 32) && off2 == off && size2 == size,
              "%s: object %zu: slot %u rc %d", mf->file, i, slot, rc);
        uint8_t entry[SFS_SLOT_SIZE];
        CHECK(sfs_index_read(s, -1, slot, 1, entry) == 0 && !memcmp(entry, key, 32) &&
              be64(entry + 32) == off - SFS_SIZE_FIELD_SIZE, "%s: object %zu: index view", mf->file, i);
        uint8_t view[8 + 64];
        ssize_t n = sfs_source_read(s, -1, view, sizeof(view), off - SFS_SIZE_FIELD_SIZE);
        CHECK(n == (ssize_t)(8 + (size < 64 ? size : 64)) && be64(view) == size &&
              !memcmp(view + 8, bytes, (size_t)n - 8), "%s: object %zu: object view n %zd", mf->file, i, n);
        seen++;
    }
    for (size_t i = 0; i < mf->n_dels; i++) {
        uint64_t off, size;
        uint32_t slot;
        rc = sfs_lookup_slot(s, mf->dels[i].keys[x], &slot, &off, &size);
        CHECK(rc == SFS_ENOTFOUND, "%s: deleted %zu: rc %d", mf->file, i, rc);
    }
    for (size_t i = 0; i < mf->n_absent; i++) {
        if (mf->absent[i].index != x)
            continue;
        uint64_t off, size;
        uint32_t slot;
        rc = sfs_lookup_slot(s, mf->absent[i].key, &slot, &off, &size);
        CHECK(rc == SFS_ENOTFOUND, "%s: absent %zu: rc %d", mf->file, i, rc);
    }
    /* the digests of the file's own sha1 and sha1_git indexes, by slot */
    for (int hash = 1; hash <= 2; hash++) {
        int h = -1;
        for (int i = 0; i < mf->n_indexes; i++)
            if (!strcmp(mf->index_names[i], hash == 1 ? "sha1" : "sha1_git"))
                h = i;
        own_seen_t seen_own = {mf, s, x, h, 0, 0};
        rc = sfs_own_digests(s, hash, own_check, &seen_own);
        CHECK(h < 0 ? rc == SFS_ENOTFOUND : rc == SFS_OK && seen_own.count == mf->n_objs && seen_own.wrong == 0,
              "%s: own digests %d: rc %d, %zu emitted (%zu wrong), %zu objects", mf->file, hash, rc,
              seen_own.count, seen_own.wrong, mf->n_objs);
    }
    uint64_t live = 0;
    for (uint64_t i = 0; i < slots; i++)
        live += sfs_slot_get(s, i, NULL) != SFS_EMPTY_OFFSET;
    CHECK(live == mf->live[x] && seen == mf->n_objs, "%s: %llu live slots", mf->file, (unsigned long long)live);
    CHECK(sfs_read(s, SFS_HEADER_END, piece, 4) != SFS_OK, "%s: a read of a size field's view", mf->file);
    free(bytes);
    free(piece);
    sfs_close(s);
    rc = sfs_open(path, 1, &s, &err);
    CHECK(rc == SFS_EINVAL && one_line(&err), "%s: writable open rc %d", mf->file, rc);
    if (rc == SFS_OK)
        sfs_close(s);
}

static void test_not_files(void)
{
    sfs_mosaic_t *m;
    sfs_error_t err;
    int rc = sfs_mosaic_open(path_of("missing.mosaic"), &m, &err);
    CHECK(rc == SFS_EIO && err.sys_errno == ENOENT && m == NULL, "missing: rc %d", rc);
    rc = sfs_mosaic_open(dir, &m, &err);
    CHECK(rc == SFS_EINVAL && one_line(&err), "directory: rc %d %s", rc, err.message);
    write_file(path_of("empty"), (const uint8_t *)"", 0);
    rc = sfs_mosaic_open(path_of("empty"), &m, &err);
    CHECK(rc == SFS_ECORRUPT, "empty file: rc %d", rc);
    const uint8_t junk[] = "this is not an EBML file at all";
    write_file(path_of("junk"), junk, sizeof(junk));
    rc = sfs_mosaic_open(path_of("junk"), &m, &err);
    CHECK(rc == SFS_ECORRUPT && strstr(err.message, "not a MOSAIC file"), "junk: %s",
          err.message);
    CHECK(sfs_mosaic_kind_of("sha1_git") == SFS_MOSAIC_SHA1_GIT &&
          sfs_mosaic_kind_of("md5") == -1 && !strcmp(sfs_mosaic_kind_name(3), "blake2s256") &&
          sfs_mosaic_kind_name(4) == NULL, "kind names");
}

/* ---------------------------------------------------------------- main */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int main(int argc, char **argv)
{
    if (make_test_dir("test_mosaic") < 0)
        return 1;
    static char made[300];
    if (argc > 1) {
        fixtures = argv[1];
    } else {
        const char *py = getenv("MOSAIC_PYTHON");
        snprintf(made, sizeof(made), "%s/fixtures", dir);
        char cmd[1000];
        snprintf(cmd, sizeof(cmd), "%s tests/mosaic_fixtures.py %s", py ? py : ".venv/bin/python",
                 made);
        if (system(cmd) != 0) {
            fprintf(stderr, "cannot make the fixtures: %s\n", cmd);
            return 1;
        }
        fixtures = made;
    }
    DIR *d = opendir(fixtures);
    if (!d) {
        perror(fixtures);
        return 1;
    }
    char *names[64];
    size_t count = 0;
    struct dirent *de;
    while ((de = readdir(d)) && count < 64) {
        size_t l = strlen(de->d_name);
        if (l > 9 && !strcmp(de->d_name + l - 9, ".manifest"))
            names[count++] = strdup(de->d_name);
    }
    closedir(d);
    qsort(names, count, sizeof(*names), cmp_str);
    CHECK(count >= 8, "%zu manifests in %s", count, fixtures);
    manifest_t *mfs = calloc(count + 1, sizeof(manifest_t));
    const manifest_t *small = NULL, *small_zstd = NULL, *dict = NULL, *raw = NULL;
    for (size_t i = 0; i < count; i++) {
        char p[700];
        snprintf(p, sizeof(p), "%s/%s", fixtures, names[i]);
        CHECK(load_manifest(p, &mfs[i]) == 0, "manifest %s", p);
        printf("%s: %zu objects, %zu deleted, %zu absent keys, indexes:", mfs[i].file,
               mfs[i].n_objs, mfs[i].n_dels, mfs[i].n_absent);
        for (int k = 0; k < mfs[i].n_indexes; k++)
            printf(" %s", mfs[i].index_names[k]);
        printf("\n");
        test_file(&mfs[i]);
        test_kind(&mfs[i]);
        if (!strcmp(mfs[i].file, "small.mosaic"))
            small = &mfs[i];
        if (!strcmp(mfs[i].file, "small_zstd.mosaic"))
            small_zstd = &mfs[i];
        if (!strcmp(mfs[i].file, "zstd_dict.mosaic"))
            dict = &mfs[i];
        if (!strcmp(mfs[i].file, "raw.mosaic"))
            raw = &mfs[i];
    }
    test_not_files();
    if (dict) {
        test_threads(dict);
        test_large_flips(dict);
    }
    if (small && small_zstd) {
        test_flips(small);
        test_flips(small_zstd);
        test_truncations(small, 1);
        test_truncations(small_zstd, 1);
        test_crafted(small, small_zstd);
        test_frames(small_zstd);
    }
    if (raw)
        test_truncations(raw, 0);
    CHECK(small && small_zstd && dict && raw, "the fixtures lack a file");
    for (size_t i = 0; i < count; i++) {
        free_manifest(&mfs[i]);
        free(names[i]);
    }
    free(mfs);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", dir);
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
