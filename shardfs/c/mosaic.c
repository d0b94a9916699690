/*
 * mosaic.c — open, validate and read MOSAIC files (format and contract in
 * mosaic.h).
 *
 * The whole file is mapped read-only. Every element is read through
 * el_read(), which checks that the element's ID, size and data lie inside
 * the range its parent allows (the file, the Mosaic element, a Tile, an
 * Index, an entry) before anything of it is used: a truncated or damaged
 * file gives SFS_ECORRUPT with the element's position, never a read outside
 * the mapping. Open reads the header, ContainerMetaData and the Index
 * elements (not their entries); an entry or an object is checked when a
 * lookup, slot or read reaches it. The GOFunctions (ph.h) and the zstd
 * dictionary are built once at open and only read afterwards, so lookups
 * and reads take no lock; zstd decoding uses a context that belongs to the
 * caller or to the call.
 */
#define _GNU_SOURCE
#include "mosaic.h"
#include "internal.h"
#include "ph.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#define ID_EBML_VERSION 0x4286u
#define ID_EBML_READ_VERSION 0x42F7u
#define ID_EBML_MAX_ID_LENGTH 0x42F2u
#define ID_EBML_MAX_SIZE_LENGTH 0x42F3u
#define ID_DOCTYPE 0x4282u
#define ID_DOCTYPE_VERSION 0x4287u
#define ID_DOCTYPE_READ_VERSION 0x4285u
#define ID_OBJECTS_COUNTER 0x5000u
#define ID_OBJECTS_TOTAL_SIZE 0x5001u
#define ID_COMPRESSION_METHOD 0x5002u
#define ID_COMPRESSION_DATA 0x5003u
#define ID_COMMENT 0x5004u
#define ID_END_OF_TILES 0x5099u
#define ID_IDX_DESCRIPTION 0x6001u
#define ID_IDX_UNROLLED 0x6002u
#define ID_IDX_ENTRY_SIZE 0x6003u
#define ID_MAP 0x6005u
#define ID_GO_TO_CONFLICTS 0xA2u

#define CRC32_ELEMENT_SIZE 6 /* 0xBF, size 0x84, 4 bytes */
#define MAX_ENTRY_OVERHEAD 26 /* Key: 1 + 8 (size VINT); Offset: 1 + 8 + 8 */

#define CORRUPT(...) sfs_fail(err, SFS_ECORRUPT, 0, __VA_ARGS__)
#define ULL(x) ((unsigned long long)(x))

/* IdxDescription::description() of swh-mosaic 0.7.0 (src/lib.rs), by kind. */
static const struct {
    const char *name;
    const char *description;
    size_t key_size;
} kinds[SFS_MOSAIC_KEY_KINDS] = {
    {"sha1",
     "key:sha1 pkg:cargo/ph@0.10.0 swh:1:dir:795095368f036f42adebcb75782a61494940e9b8 "
     "ph::fmph::GOFunction",
     20},
    {"sha1_git",
     "key:sha1_git pkg:cargo/ph@0.10.0 swh:1:dir:795095368f036f42adebcb75782a61494940e9b8 "
     "ph::fmph::GOFunction",
     20},
    {"sha256",
     "key:sha256 pkg:cargo/ph@0.10.0 swh:1:dir:795095368f036f42adebcb75782a61494940e9b8 "
     "ph::fmph::GOFunction",
     32},
    {"blake2s256",
     "key:blake2s256 pkg:cargo/ph@0.10.0 swh:1:dir:795095368f036f42adebcb75782a61494940e9b8 "
     "ph::fmph::GOFunction",
     32},
};

typedef struct mosaic_index {
    sfs_mosaic_index_info_t info;
    sfs_gof_t *gof;
} mosaic_index_t;

struct sfs_mosaic {
    /* hot: read by every lookup and read */
    const uint8_t *map;
    sfs_mosaic_info_t info;
    mosaic_index_t index[SFS_MOSAIC_KEY_KINDS];
    ZSTD_DDict *ddict; /* "zstd.dict" */
    /* cold */
    size_t map_size;
    char *path;
    char **comments;
    size_t *comment_len;
    int metadata_only; /* sfs_mosaic_layout: the indexes are not read */
};

struct sfs_mosaic_ctx {
    ZSTD_DCtx *dctx;
    uint8_t *scratch;
    size_t scratch_size;
};

/* ---------------------------------------------------------------- EBML */

/* One element: ID at `pos`, data [data, end). */
typedef struct {
    uint32_t id;
    uint64_t pos, data, size, end;
} el_t;

enum {
    EL_OK = 0,
    EL_TRUNCATED,  /* the ID or the size VINT runs past the limit */
    EL_BAD_ID,     /* a leading byte that begins no ID of 1 to 4 bytes */
    EL_BAD_VINT,   /* a size VINT of more than 8 bytes (first byte 0) */
    EL_PAST_LIMIT, /* the data runs past the limit */
};

static const char *el_why(int rc)
{
    switch (rc) {
    case EL_TRUNCATED: return "its ID or size runs past the end of its parent (truncated?)";
    case EL_BAD_ID: return "not an element ID of 1 to 4 bytes";
    case EL_BAD_VINT: return "its size is not a VINT of 1 to 8 bytes";
    case EL_PAST_LIMIT: return "its data runs past the end of its parent (truncated?)";
    default: return "bad element";
    }
}

/* Read the element at `pos`, which must lie whole in [pos, limit). On
 * EL_PAST_LIMIT, e's id, pos, data and size are set nevertheless. */
static int el_read(const uint8_t *map, uint64_t pos, uint64_t limit, el_t *e)
{
    if (pos >= limit)
        return EL_TRUNCATED;
    uint8_t b = map[pos];
    unsigned width = b >= 0x80 ? 1 : b >= 0x40 ? 2 : b >= 0x20 ? 3 : b >= 0x10 ? 4 : 0;
    if (width == 0)
        return EL_BAD_ID;
    if (limit - pos < width + 1)
        return EL_TRUNCATED;
    uint32_t id = 0;
    for (unsigned i = 0; i < width; i++)
        id = id << 8 | map[pos + i];
    uint64_t at = pos + width;
    uint8_t first = map[at];
    if (first == 0)
        return EL_BAD_VINT;
    unsigned len = (unsigned)__builtin_clz((unsigned)first) - 23; /* 1..8 */
    if (limit - at < len)
        return EL_TRUNCATED;
    uint64_t size = first & (0xFFu >> len);
    for (unsigned i = 1; i < len; i++)
        size = size << 8 | map[at + i];
    at += len;
    e->id = id;
    e->pos = pos;
    e->data = at;
    e->size = size;
    if (size > limit - at) {
        e->end = UINT64_MAX; /* the ID, position and size are set, for messages */
        return EL_PAST_LIMIT;
    }
    e->end = at + size;
    return EL_OK;
}

/* An unsigned integer element of at most 8 bytes. */
static int el_uint(const uint8_t *map, const el_t *e, uint64_t *v)
{
    if (e->size > 8)
        return -1;
    uint64_t x = 0;
    for (uint64_t i = 0; i < e->size; i++)
        x = x << 8 | map[e->data + i];
    *v = x;
    return 0;
}

/* A string element's length without its trailing NULs. */
static size_t el_strlen(const uint8_t *map, const el_t *e)
{
    size_t n = (size_t)e->size;
    while (n > 0 && map[e->data + n - 1] == 0)
        n--;
    return n;
}

/* The string element equals s. */
static int el_streq(const uint8_t *map, const el_t *e, const char *s)
{
    size_t n = el_strlen(map, e);
    return n == strlen(s) && memcmp(map + e->data, s, n) == 0;
}

/* Printable, one-line copy of at most 60 bytes of a string element, for
 * messages. */
static const char *el_show(const uint8_t *map, const el_t *e, char out[72])
{
    size_t n = el_strlen(map, e), k = 0;
    for (size_t i = 0; i < n && k < 60; i++) {
        uint8_t c = map[e->data + i];
        out[k++] = c >= 0x20 && c < 0x7F ? (char)c : '?';
    }
    if (n > 60) {
        memcpy(out + k, "...", 3);
        k += 3;
    }
    out[k] = 0;
    return out;
}

static const char *id_name(uint32_t id)
{
    switch (id) {
    case SFS_MOSAIC_ID_METADATA: return "ContainerMetaData";
    case SFS_MOSAIC_ID_TILE: return "Tile";
    case SFS_MOSAIC_ID_INDEX: return "Index";
    case SFS_MOSAIC_ID_MAP_CONTAINER: return "MapContainer";
    case SFS_MOSAIC_ID_OBJECT: return "Object";
    case SFS_MOSAIC_ID_KEY: return "Key";
    default: return "element";
    }
}

/* The CRC-32 stored in the master element `e` (its first child must be a
 * CRC-32 element of 4 bytes) against the crc32 of the rest of its data.
 * 0 when they match; 1 when they differ (stored and computed set); -1 when
 * there is no CRC-32 element first. */
static int crc_verify(const uint8_t *map, const el_t *e, uint32_t *stored, uint32_t *computed)
{
    el_t c;
    if (el_read(map, e->data, e->end, &c) != EL_OK || c.id != SFS_MOSAIC_ID_CRC32 || c.size != 4)
        return -1;
    *stored = get_le32(map + c.data);
    uLong crc = crc32_z(0L, Z_NULL, 0);
    crc = crc32_z(crc, map + c.end, (z_size_t)(e->end - c.end));
    *computed = (uint32_t)crc;
    return *stored == *computed ? 0 : 1;
}

/* crc_verify as an error of open. */
static int crc_check_open(const sfs_mosaic_t *m, const el_t *e, sfs_error_t *err)
{
    uint32_t stored = 0, computed = 0;
    int rc = crc_verify(m->map, e, &stored, &computed);
    if (rc < 0)
        return CORRUPT("%s: %s at byte %llu does not start with a CRC-32 element", m->path,
                       id_name(e->id), ULL(e->pos));
    if (rc > 0)
        return CORRUPT("%s: bad CRC-32 of %s at byte %llu (stored 0x%08x, computed 0x%08x)",
                       m->path, id_name(e->id), ULL(e->pos), stored, computed);
    return SFS_OK;
}

/* ---------------------------------------------------------------- open */

static int parse_header(sfs_mosaic_t *m, el_t *header, sfs_error_t *err)
{
    const uint8_t *map = m->map;
    const char *p = m->path;
    int rc = el_read(map, 0, m->info.file_size, header);
    if (rc != EL_OK && rc != EL_PAST_LIMIT)
        return CORRUPT("%s: not a MOSAIC file: no EBML element at byte 0 (%s)", p, el_why(rc));
    if (header->id != SFS_MOSAIC_ID_EBML)
        return CORRUPT("%s: not a MOSAIC file: no EBML header at byte 0 (ID 0x%x)", p, header->id);
    if (rc != EL_OK)
        return CORRUPT("%s: truncated: the EBML header at byte 0 runs past the end of the file "
                       "(%llu bytes)", p, ULL(m->info.file_size));
    /* RFC 8794 defaults, for the elements a header leaves out. */
    uint64_t read_version = 1, max_id = 4, max_size = 8;
    m->info.doctype_version = m->info.doctype_read_version = 1;
    int doctype = 0;
    char shown[72];
    for (uint64_t at = header->data; at < header->end;) {
        el_t e;
        if ((rc = el_read(map, at, header->end, &e)) != EL_OK)
            return CORRUPT("%s: EBML header: element at byte %llu: %s", p, ULL(at), el_why(rc));
        at = e.end;
        uint64_t *field = NULL;
        switch (e.id) {
        case ID_EBML_READ_VERSION: field = &read_version; break;
        case ID_EBML_MAX_ID_LENGTH: field = &max_id; break;
        case ID_EBML_MAX_SIZE_LENGTH: field = &max_size; break;
        case ID_DOCTYPE_VERSION: field = &m->info.doctype_version; break;
        case ID_DOCTYPE_READ_VERSION: field = &m->info.doctype_read_version; break;
        case ID_DOCTYPE:
            if (!el_streq(map, &e, "mosaic"))
                return CORRUPT("%s: not a MOSAIC file: EBML DocType is \"%s\", not \"mosaic\"", p,
                               el_show(map, &e, shown));
            doctype = 1;
            continue;
        default: continue;
        }
        if (el_uint(map, &e, field) < 0)
            return CORRUPT("%s: EBML header: element 0x%x at byte %llu is an integer of %llu "
                           "bytes (at most 8)", p, e.id, ULL(e.pos), ULL(e.size));
    }
    if (!doctype)
        return CORRUPT("%s: not a MOSAIC file: the EBML header has no DocType", p);
    if (read_version > 1)
        return CORRUPT("%s: EBMLReadVersion is %llu: this reader reads EBML version 1 only", p,
                       ULL(read_version));
    if (max_id > 4 || max_size > 8)
        return CORRUPT("%s: EBMLMaxIDLength %llu, EBMLMaxSizeLength %llu: this reader reads IDs "
                       "of up to 4 bytes and sizes of up to 8", p, ULL(max_id), ULL(max_size));
    if (m->info.doctype_read_version > SFS_MOSAIC_READ_VERSION)
        return CORRUPT("%s: MOSAIC DocTypeReadVersion is %llu: this reader reads version %d only "
                       "(DocTypeVersion %llu)", p, ULL(m->info.doctype_read_version),
                       SFS_MOSAIC_READ_VERSION, ULL(m->info.doctype_version));
    return SFS_OK;
}

static int parse_metadata(sfs_mosaic_t *m, const el_t *md, sfs_error_t *err)
{
    const uint8_t *map = m->map;
    const char *p = m->path;
    int rc = crc_check_open(m, md, err);
    if (rc != SFS_OK)
        return rc;
    m->info.metadata_position = md->pos;
    int have_counter = 0, have_total = 0, have_eot = 0;
    el_t data = {0};
    char shown[72];
    size_t n_comments = 0;
    for (int pass = 0; pass < 2; pass++) { /* 0: count the Comments; 1: copy them */
        for (uint64_t at = md->data + CRC32_ELEMENT_SIZE; at < md->end;) {
            el_t e;
            if ((rc = el_read(map, at, md->end, &e)) != EL_OK)
                return CORRUPT("%s: ContainerMetaData: element at byte %llu: %s", p, ULL(at),
                               el_why(rc));
            at = e.end;
            uint64_t *field = NULL;
            switch (e.id) {
            case ID_OBJECTS_COUNTER: field = &m->info.objects_counter; have_counter = 1; break;
            case ID_OBJECTS_TOTAL_SIZE: field = &m->info.objects_total_size; have_total = 1; break;
            case ID_END_OF_TILES: field = &m->info.end_of_tiles; have_eot = 1; break;
            case ID_COMPRESSION_METHOD:
                if (el_streq(map, &e, "none"))
                    m->info.compression = SFS_MOSAIC_NONE;
                else if (el_streq(map, &e, "zstd"))
                    m->info.compression = SFS_MOSAIC_ZSTD;
                else if (el_streq(map, &e, "zstd.dict"))
                    m->info.compression = SFS_MOSAIC_ZSTD_DICT;
                else
                    return CORRUPT("%s: unknown CompressionMethod \"%s\" at byte %llu (none, zstd "
                                   "or zstd.dict)", p, el_show(map, &e, shown), ULL(e.pos));
                continue; /* absent: the schema's default, "none" */
            case ID_COMPRESSION_DATA: data = e; continue;
            case ID_COMMENT:
                if (pass == 1) {
                    size_t n = el_strlen(map, &e);
                    char *c = malloc(n + 1);
                    if (!c)
                        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", p);
                    memcpy(c, map + e.data, n);
                    c[n] = 0;
                    m->comments[n_comments] = c;
                    m->comment_len[n_comments] = n;
                }
                n_comments++;
                continue;
            default: continue;
            }
            if (el_uint(map, &e, field) < 0)
                return CORRUPT("%s: ContainerMetaData: integer element 0x%x at byte %llu has %llu "
                               "bytes (at most 8)", p, e.id, ULL(e.pos), ULL(e.size));
        }
        if (pass == 0) {
            m->info.comments = n_comments;
            if (n_comments) {
                m->comments = calloc(n_comments, sizeof(*m->comments));
                m->comment_len = calloc(n_comments, sizeof(*m->comment_len));
                if (!m->comments || !m->comment_len)
                    return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", p);
            }
            n_comments = 0;
        }
    }
    if (!have_counter || !have_total || !have_eot)
        return CORRUPT("%s: ContainerMetaData at byte %llu lacks %s", p, ULL(md->pos),
                       !have_counter ? "ObjectsCounter"
                       : !have_total ? "ObjectsTotalSize" : "EndOfTilesOffset");
    m->info.tiles_position = md->end;
    if (m->info.end_of_tiles < m->info.tiles_position || m->info.end_of_tiles > m->info.mosaic_end)
        return CORRUPT("%s: EndOfTilesOffset is %llu, outside [%llu, %llu] (end of "
                       "ContainerMetaData, end of the Mosaic element)", p,
                       ULL(m->info.end_of_tiles), ULL(m->info.tiles_position),
                       ULL(m->info.mosaic_end));
    if (m->info.compression == SFS_MOSAIC_ZSTD_DICT) {
        if (data.size == 0)
            return CORRUPT("%s: CompressionMethod is zstd.dict but ContainerMetaData holds no "
                           "CompressionData (dictionary)", p);
        m->ddict = ZSTD_createDDict(map + data.data, (size_t)data.size);
        if (!m->ddict)
            return CORRUPT("%s: CompressionData at byte %llu (%llu bytes) is not a zstd "
                           "dictionary", p, ULL(data.pos), ULL(data.size));
        m->info.dictionary_size = data.size;
    }
    return SFS_OK;
}

/* The Index element `ix`: added to m->index when of a known kind not seen
 * yet, else counted as skipped. */
static int parse_index(sfs_mosaic_t *m, const el_t *ix, sfs_error_t *err)
{
    const uint8_t *map = m->map;
    const char *p = m->path;
    el_t desc = {0}, unrolled = {0}, container = {0};
    uint64_t entry_size = 0;
    int have_desc = 0, have_unrolled = 0, have_size = 0, have_container = 0, rc;
    for (uint64_t at = ix->data; at < ix->end;) {
        el_t e;
        if ((rc = el_read(map, at, ix->end, &e)) != EL_OK)
            return CORRUPT("%s: Index at byte %llu: element at byte %llu: %s", p, ULL(ix->pos),
                           ULL(at), el_why(rc));
        at = e.end;
        switch (e.id) {
        case ID_IDX_DESCRIPTION:
            if (!have_desc)
                desc = e;
            have_desc = 1;
            break;
        case ID_IDX_UNROLLED:
            if (!have_unrolled)
                unrolled = e;
            have_unrolled = 1;
            break;
        case ID_IDX_ENTRY_SIZE:
            if (el_uint(map, &e, &entry_size) < 0)
                return CORRUPT("%s: IdxUnrolledEntrySize at byte %llu has %llu bytes (at most 8)",
                               p, ULL(e.pos), ULL(e.size));
            have_size = 1;
            break;
        case SFS_MOSAIC_ID_MAP_CONTAINER:
            if (!have_container)
                container = e;
            have_container = 1;
            break;
        }
    }
    if (!have_desc)
        return CORRUPT("%s: Index at byte %llu has no IdxDescription", p, ULL(ix->pos));
    int kind = -1;
    for (int k = 0; k < SFS_MOSAIC_KEY_KINDS; k++)
        if (el_streq(map, &desc, kinds[k].description))
            kind = k;
    if (kind < 0 || sfs_mosaic_find_index(m, kind) >= 0) {
        m->info.skipped_indexes++;
        return SFS_OK;
    }
    const char *name = kinds[kind].name;
    if (!have_unrolled || !have_size || !have_container)
        return CORRUPT("%s: Index %s at byte %llu has no %s", p, name, ULL(ix->pos),
                       !have_unrolled ? "IdxUnrolled"
                       : !have_size ? "IdxUnrolledEntrySize" : "MapContainer");
    size_t key_size = kinds[kind].key_size;
    if (entry_size < key_size + 4 || entry_size > key_size + MAX_ENTRY_OVERHEAD)
        return CORRUPT("%s: Index %s at byte %llu: IdxUnrolledEntrySize is %llu, outside [%zu, "
                       "%zu] for %zu-byte keys", p, name, ULL(ix->pos), ULL(entry_size),
                       key_size + 4, key_size + MAX_ENTRY_OVERHEAD, key_size);
    if (unrolled.size % entry_size != 0)
        return CORRUPT("%s: Index %s at byte %llu: IdxUnrolled holds %llu bytes, not a multiple "
                       "of IdxUnrolledEntrySize %llu", p, name, ULL(ix->pos), ULL(unrolled.size),
                       ULL(entry_size));
    if ((rc = crc_check_open(m, &container, err)) != SFS_OK)
        return rc;
    el_t mp = {0};
    int have_map = 0;
    for (uint64_t at = container.data + CRC32_ELEMENT_SIZE; at < container.end;) {
        el_t e;
        if ((rc = el_read(map, at, container.end, &e)) != EL_OK)
            return CORRUPT("%s: MapContainer at byte %llu: element at byte %llu: %s", p,
                           ULL(container.pos), ULL(at), el_why(rc));
        at = e.end;
        if (e.id == ID_MAP && !have_map) {
            mp = e;
            have_map = 1;
        }
    }
    if (!have_map)
        return CORRUPT("%s: MapContainer at byte %llu (index %s) has no Map", p,
                       ULL(container.pos), name);
    size_t used = 0;
    sfs_gof_t *gof = sfs_gof_read(map + mp.data, (size_t)mp.size, &used);
    if (!gof)
        return CORRUPT("%s: the Map of index %s at byte %llu (%llu bytes) is not a "
                       "ph::fmph::GOFunction", p, name, ULL(mp.pos), ULL(mp.size));
    if (used != mp.size) {
        sfs_gof_free(gof);
        return CORRUPT("%s: the Map of index %s at byte %llu holds %llu bytes, its GOFunction "
                       "%zu", p, name, ULL(mp.pos), ULL(mp.size), used);
    }
    mosaic_index_t *x = &m->index[m->info.indexes++];
    x->gof = gof;
    x->info.kind = kind;
    x->info.name = name;
    x->info.key_size = key_size;
    x->info.entry_size = entry_size;
    x->info.slots = unrolled.size / entry_size;
    x->info.position = ix->pos;
    x->info.unrolled_position = unrolled.data;
    x->info.map_size = mp.size;
    x->info.map_position = mp.data;
    return SFS_OK;
}

static int parse(sfs_mosaic_t *m, sfs_error_t *err)
{
    const uint8_t *map = m->map;
    const char *p = m->path;
    uint64_t size = m->info.file_size;
    el_t header, mosaic, e;
    int rc = parse_header(m, &header, err);
    if (rc != SFS_OK)
        return rc;
    /* The Mosaic element: the first top-level one of its ID. */
    uint64_t at = header.end;
    for (;;) {
        if (at >= size)
            return CORRUPT("%s: truncated: no Mosaic element after the EBML header (%llu bytes)",
                           p, ULL(size));
        rc = el_read(map, at, size, &mosaic);
        if (rc == EL_PAST_LIMIT && mosaic.id == SFS_MOSAIC_ID_MOSAIC)
            break;
        if (rc != EL_OK)
            return CORRUPT("%s: element at byte %llu: %s", p, ULL(at), el_why(rc));
        if (mosaic.id == SFS_MOSAIC_ID_MOSAIC)
            break;
        at = mosaic.end;
    }
    if (rc != EL_OK)
        return CORRUPT("%s: truncated: the Mosaic element at byte %llu needs %llu bytes of data "
                       "from byte %llu, the file has %llu bytes", p, ULL(at), ULL(mosaic.size),
                       ULL(mosaic.data), ULL(size));
    m->info.mosaic_end = mosaic.end;
    /* ContainerMetaData: the first child of its ID. */
    for (at = mosaic.data;; at = e.end) {
        if (at >= mosaic.end)
            return CORRUPT("%s: the Mosaic element at byte %llu has no ContainerMetaData", p,
                           ULL(mosaic.pos));
        if ((rc = el_read(map, at, mosaic.end, &e)) != EL_OK)
            return CORRUPT("%s: element at byte %llu: %s", p, ULL(at), el_why(rc));
        if (e.id == SFS_MOSAIC_ID_METADATA)
            break;
    }
    if ((rc = parse_metadata(m, &e, err)) != SFS_OK || m->metadata_only)
        return rc;
    /* Every element after the tiles; the Indexes among them. */
    for (at = m->info.end_of_tiles; at < mosaic.end; at = e.end) {
        if ((rc = el_read(map, at, mosaic.end, &e)) != EL_OK)
            return CORRUPT("%s: element at byte %llu (after the tiles): %s", p, ULL(at),
                           el_why(rc));
        if (e.id == SFS_MOSAIC_ID_INDEX && (rc = parse_index(m, &e, err)) != SFS_OK)
            return rc;
    }
    return SFS_OK;
}

static int open_file(const char *path, int metadata_only, sfs_mosaic_t **out, sfs_error_t *err)
{
    *out = NULL;
    sfs_mosaic_t *m = calloc(1, sizeof(*m));
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", path);
    }
    m->metadata_only = metadata_only;
    /* O_NONBLOCK: opening a FIFO must not wait for a writer (its type is
     * refused right after). */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK), rc, is_blk;
    if (fd < 0) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t size;
    if ((rc = sfs_fd_size(fd, path, &size, &is_blk, err)) != SFS_OK)
        goto fail;
    m->info.file_size = size;
    if (size == 0) {
        rc = CORRUPT("%s: empty file, not a MOSAIC file", path);
        goto fail;
    }
    if (size > SIZE_MAX) {
        rc = sfs_fail(err, SFS_EINVAL, EFBIG, "%s: %llu bytes, more than this process can map",
                      path, ULL(size));
        goto fail;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        rc = sfs_fail(err, SFS_EIO, errno, "%s: mmap: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;
    m->map = map;
    m->map_size = (size_t)size;
    madvise(map, m->map_size, MADV_RANDOM);
    if ((rc = parse(m, err)) != SFS_OK)
        goto fail;
    /* The index entries are small (40 bytes for sha256) and every lookup
     * reads one: let page faults there read around (the kernel stops when
     * it does not pay), so a file's entries are soon cached in large reads.
     * The objects stay MADV_RANDOM: one page fault, one page read. */
    for (int k = 0; k < SFS_MOSAIC_KEY_KINDS; k++) {
        const sfs_mosaic_index_info_t *ix = &m->index[k].info;
        if (!m->index[k].gof || !ix->slots)
            continue;
        uint64_t at = ix->unrolled_position & ~(uint64_t)4095;
        uint64_t end = ix->unrolled_position + ix->slots * ix->entry_size;
        madvise((void *)(m->map + at), (size_t)(end - at), MADV_NORMAL);
    }
    *out = m;
    return SFS_OK;
fail:
    if (fd >= 0)
        close(fd);
    sfs_mosaic_close(m);
    return rc;
}

int sfs_mosaic_open(const char *path, sfs_mosaic_t **out, sfs_error_t *err)
{
    return open_file(path, 0, out, err);
}

int sfs_mosaic_layout(const char *path, uint64_t *tiles_position, uint64_t *end_of_tiles, sfs_error_t *err)
{
    sfs_mosaic_t *m;
    int rc = open_file(path, 1, &m, err);
    if (rc == SFS_OK) {
        *tiles_position = m->info.tiles_position;
        *end_of_tiles = m->info.end_of_tiles;
        sfs_mosaic_close(m);
    }
    return rc;
}

void sfs_mosaic_close(sfs_mosaic_t *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->info.indexes; i++)
        sfs_gof_free(m->index[i].gof);
    ZSTD_freeDDict(m->ddict);
    for (size_t i = 0; m->comments && i < m->info.comments; i++)
        free(m->comments[i]);
    free(m->comments);
    free(m->comment_len);
    if (m->map)
        munmap((void *)m->map, m->map_size);
    free(m->path);
    free(m);
}

const char *sfs_mosaic_path(const sfs_mosaic_t *m) { return m->path; }
const sfs_mosaic_info_t *sfs_mosaic_info(const sfs_mosaic_t *m) { return &m->info; }

const char *sfs_mosaic_comment(const sfs_mosaic_t *m, size_t i, size_t *len)
{
    if (i >= m->info.comments)
        return NULL;
    if (len)
        *len = m->comment_len[i];
    return m->comments[i];
}

const sfs_mosaic_index_info_t *sfs_mosaic_index(const sfs_mosaic_t *m, size_t i)
{
    return i < m->info.indexes ? &m->index[i].info : NULL;
}

int sfs_mosaic_find_index(const sfs_mosaic_t *m, int kind)
{
    for (size_t i = 0; i < m->info.indexes; i++)
        if (m->index[i].info.kind == kind)
            return (int)i;
    return SFS_ENOTFOUND;
}

const char *sfs_mosaic_kind_name(int kind)
{
    return kind >= 0 && kind < SFS_MOSAIC_KEY_KINDS ? kinds[kind].name : NULL;
}

int sfs_mosaic_kind_of(const char *name)
{
    for (int k = 0; k < SFS_MOSAIC_KEY_KINDS; k++)
        if (strcmp(name, kinds[k].name) == 0)
            return k;
    return -1;
}

/* ---------------------------------------------------------------- entries */

/* Entry `slot` of index x: SFS_OK with its key (a pointer into the map) and
 * object position, SFS_ENOTFOUND when deleted, SFS_ECORRUPT. */
static int entry_read(const sfs_mosaic_t *m, const mosaic_index_t *x, uint64_t slot,
                      const uint8_t **key, uint64_t *object, sfs_error_t *err)
{
    const uint8_t *map = m->map;
    uint64_t base = x->info.unrolled_position + slot * x->info.entry_size;
    uint64_t end = base + x->info.entry_size;
    el_t k, o;
    if (map[base] == SFS_MOSAIC_ID_VOID)
        return SFS_ENOTFOUND;
    int rc = el_read(map, base, end, &k);
    if (rc != EL_OK || k.id != SFS_MOSAIC_ID_KEY || k.size != x->info.key_size)
        return CORRUPT("%s: entry %llu of index %s (byte %llu) does not start with a Key of %zu "
                       "bytes", m->path, ULL(slot), x->info.name, ULL(base), x->info.key_size);
    if ((rc = el_read(map, k.end, end, &o)) != EL_OK)
        return CORRUPT("%s: entry %llu of index %s (byte %llu): element after the Key: %s",
                       m->path, ULL(slot), x->info.name, ULL(base), el_why(rc));
    if (o.id == SFS_MOSAIC_ID_VOID) /* half deleted: the Offset is gone */
        return SFS_ENOTFOUND;
    if (o.id == ID_GO_TO_CONFLICTS)
        return CORRUPT("%s: entry %llu of index %s (byte %llu) uses GoToConflicts (a key of "
                       "several objects), which this reader does not support", m->path,
                       ULL(slot), x->info.name, ULL(base));
    uint64_t pos;
    if (o.id != SFS_MOSAIC_ID_OFFSET || el_uint(map, &o, &pos) < 0)
        return CORRUPT("%s: entry %llu of index %s (byte %llu): no Offset of at most 8 bytes "
                       "after the Key", m->path, ULL(slot), x->info.name, ULL(base));
    if (pos < m->info.tiles_position || pos >= m->info.end_of_tiles)
        return CORRUPT("%s: entry %llu of index %s (byte %llu) gives object position %llu, "
                       "outside the tiles [%llu, %llu)", m->path, ULL(slot), x->info.name,
                       ULL(base), ULL(pos), ULL(m->info.tiles_position),
                       ULL(m->info.end_of_tiles));
    *key = map + k.data;
    *object = pos;
    return SFS_OK;
}

int sfs_mosaic_lookup(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len,
                      uint64_t *slot, uint64_t *object, sfs_error_t *err)
{
    return sfs_mosaic_lookup_at(m, index, key, key_len, sfs_mosaic_slot_of(m, index, key, key_len), slot, object,
                                err);
}

void sfs_mosaic_cache_ahead(const sfs_mosaic_t *m, uint64_t pos)
{
    if (pos < m->map_size)
        __builtin_prefetch(m->map + pos);
}

int sfs_mosaic_lookup_at(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len, int64_t v,
                         uint64_t *slot, uint64_t *object, sfs_error_t *err)
{
    if (index >= m->info.indexes)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: no index %zu (the file has %zu)", m->path, index,
                        m->info.indexes);
    const mosaic_index_t *x = &m->index[index];
    if (key_len != x->info.key_size)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: a key of index %s has %zu bytes, not %zu",
                        m->path, x->info.name, x->info.key_size, key_len);
    if (x->info.slots == 0)
        return SFS_ENOTFOUND;
    if (v < 0)
        return SFS_ENOTFOUND;
    if ((uint64_t)v >= x->info.slots)
        return CORRUPT("%s: the Map of index %s gives entry %lld, the index has %llu", m->path,
                       x->info.name, (long long)v, ULL(x->info.slots));
    const uint8_t *stored;
    uint64_t pos;
    int rc = entry_read(m, x, (uint64_t)v, &stored, &pos, err);
    if (rc != SFS_OK)
        return rc;
    if (memcmp(stored, key, key_len) != 0)
        return SFS_ENOTFOUND;
    if (slot)
        *slot = (uint64_t)v;
    *object = pos;
    return SFS_OK;
}

int64_t sfs_mosaic_slot_of(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len)
{
    if (index >= m->info.indexes || key_len != m->index[index].info.key_size || m->index[index].info.slots == 0)
        return -1;
    return sfs_gof_get(m->index[index].gof, key, key_len);
}

int sfs_mosaic_slot(const sfs_mosaic_t *m, size_t index, uint64_t slot, uint8_t *key_out,
                    uint64_t *object, sfs_error_t *err)
{
    if (index >= m->info.indexes)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: no index %zu (the file has %zu)", m->path, index,
                        m->info.indexes);
    const mosaic_index_t *x = &m->index[index];
    if (slot >= x->info.slots)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: no entry %llu in index %s (%llu entries)",
                        m->path, ULL(slot), x->info.name, ULL(x->info.slots));
    const uint8_t *stored;
    uint64_t pos;
    int rc = entry_read(m, x, slot, &stored, &pos, err);
    if (rc != SFS_OK)
        return rc;
    if (key_out)
        memcpy(key_out, stored, x->info.key_size);
    if (object)
        *object = pos;
    return SFS_OK;
}

/* ---------------------------------------------------------------- objects */

int sfs_mosaic_object(const sfs_mosaic_t *m, uint64_t object, uint64_t *data,
                      uint64_t *stored_size, sfs_error_t *err)
{
    if (object < m->info.tiles_position || object >= m->info.end_of_tiles)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: byte %llu is outside the tiles [%llu, %llu)",
                        m->path, ULL(object), ULL(m->info.tiles_position),
                        ULL(m->info.end_of_tiles));
    el_t e;
    int rc = el_read(m->map, object, m->info.end_of_tiles, &e);
    if (rc == EL_OK && e.id == SFS_MOSAIC_ID_VOID)
        return SFS_ENOTFOUND;
    if (rc != EL_OK)
        return CORRUPT("%s: object at byte %llu: %s", m->path, ULL(object), el_why(rc));
    if (e.id != SFS_MOSAIC_ID_OBJECT)
        return CORRUPT("%s: no Object element at byte %llu (ID 0x%x)", m->path, ULL(object), e.id);
    if (data)
        *data = e.data;
    if (stored_size)
        *stored_size = e.size;
    return SFS_OK;
}

/* Bytes asked per madvise(MADV_WILLNEED): the kernel reads at most its
 * read-ahead size per call (force_page_cache_ra: max(io_pages, ra_pages),
 * 128 KiB by default) and drops the rest of a longer range. */
#define WILL_NEED_STEP (128u << 10)

/* madvise(MADV_WILLNEED) of [pos, pos + len) of the mapping, clipped to
 * it, WILL_NEED_STEP bytes per call: every read is started, none waited
 * for. */
static void will_need(const sfs_mosaic_t *m, uint64_t pos, uint64_t len)
{
    if (pos >= m->map_size)
        return;
    if (len > m->map_size - pos)
        len = m->map_size - pos;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)(m->map + pos) & ~(page - 1), end = (uintptr_t)(m->map + pos + len);
    for (uintptr_t at = start; at < end; at += WILL_NEED_STEP)
        madvise((void *)at, end - at < WILL_NEED_STEP ? end - at : WILL_NEED_STEP, MADV_WILLNEED);
}

void sfs_mosaic_prefetch_entry(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len)
{
    if (index >= m->info.indexes)
        return;
    const mosaic_index_t *x = &m->index[index];
    if (key_len != x->info.key_size || x->info.slots == 0)
        return;
    int64_t v = sfs_gof_get(x->gof, key, key_len);
    if (v >= 0 && (uint64_t)v < x->info.slots)
        will_need(m, x->info.unrolled_position + (uint64_t)v * x->info.entry_size, x->info.entry_size);
}

/* 1 when the page holding byte `pos` of the mapping is cached (or cannot
 * be told), else 0. */
static int page_cached(const sfs_mosaic_t *m, uint64_t pos)
{
    if (pos >= m->map_size)
        return 1;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t at = (uintptr_t)(m->map + pos) & ~(page - 1);
    unsigned char in = 0;
    return mincore((void *)at, page, &in) != 0 || (in & 1);
}

int sfs_mosaic_object_cached(const sfs_mosaic_t *m, uint64_t object)
{
    return page_cached(m, object);
}

int sfs_mosaic_entry_cached(const sfs_mosaic_t *m, size_t index, const uint8_t *key, size_t key_len)
{
    if (index >= m->info.indexes)
        return 1;
    const mosaic_index_t *x = &m->index[index];
    if (key_len != x->info.key_size || x->info.slots == 0)
        return 1;
    int64_t v = sfs_gof_get(x->gof, key, key_len);
    if (v < 0 || (uint64_t)v >= x->info.slots)
        return 1;
    return page_cached(m, x->info.unrolled_position + (uint64_t)v * x->info.entry_size);
}

void sfs_mosaic_prefetch_object(const sfs_mosaic_t *m, uint64_t object, uint64_t bytes)
{
    if (object >= m->info.tiles_position && object < m->info.end_of_tiles)
        will_need(m, object, bytes < m->info.end_of_tiles - object ? bytes : m->info.end_of_tiles - object);
}

const uint8_t *sfs_mosaic_stored(const sfs_mosaic_t *m, uint64_t object, uint64_t *stored_size,
                                 int *status)
{
    uint64_t data;
    int rc = sfs_mosaic_object(m, object, &data, stored_size, NULL);
    if (status)
        *status = rc;
    return rc == SFS_OK ? m->map + data : NULL;
}

sfs_mosaic_ctx_t *sfs_mosaic_ctx_new(void)
{
    sfs_mosaic_ctx_t *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->scratch_size = ZSTD_DStreamOutSize();
    c->dctx = ZSTD_createDCtx();
    c->scratch = malloc(c->scratch_size);
    if (!c->dctx || !c->scratch) {
        sfs_mosaic_ctx_free(c);
        return NULL;
    }
    return c;
}

void sfs_mosaic_ctx_free(sfs_mosaic_ctx_t *c)
{
    if (!c)
        return;
    ZSTD_freeDCtx(c->dctx);
    free(c->scratch);
    free(c);
}

/* Decode the zstd frames src[0, n): skip the first `offset` bytes of the
 * output, copy the next ones into dst[0, length) and stop when it is full.
 * *got: the bytes copied. With dst NULL, decode everything and count it
 * into *got (length ignored). */
static int zstd_decode(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *c, uint64_t object,
                       const uint8_t *src, size_t n, uint64_t offset, uint8_t *dst, size_t length,
                       uint64_t *got, sfs_error_t *err)
{
    *got = 0;
    if (n == 0) /* no frame: an empty object */
        return SFS_OK;
    size_t rc = ZSTD_DCtx_reset(c->dctx, ZSTD_reset_session_and_parameters);
    if (!ZSTD_isError(rc) && m->ddict)
        rc = ZSTD_DCtx_refDDict(c->dctx, m->ddict);
    if (ZSTD_isError(rc))
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: zstd context: %s", m->path,
                        ZSTD_getErrorName(rc));
    ZSTD_inBuffer in = {src, n, 0};
    uint64_t produced = 0; /* decoded bytes so far */
    while (dst == NULL || produced < offset || produced - offset < length) {
        ZSTD_outBuffer out;
        int skipping = dst == NULL || produced < offset;
        if (skipping) {
            uint64_t want = dst == NULL ? c->scratch_size : offset - produced;
            out = (ZSTD_outBuffer){c->scratch, want < c->scratch_size ? (size_t)want
                                                                      : c->scratch_size, 0};
        } else {
            uint64_t done = produced - offset;
            out = (ZSTD_outBuffer){dst + done, length - (size_t)done, 0};
        }
        size_t in_before = in.pos;
        /* 0: a frame was decoded and flushed whole; else a hint (more to come) */
        size_t left = ZSTD_decompressStream(c->dctx, &out, &in);
        if (ZSTD_isError(left))
            return CORRUPT("%s: object at byte %llu: zstd: %s (after %llu decoded bytes)", m->path,
                           ULL(object), ZSTD_getErrorName(left), ULL(produced + out.pos));
        produced += out.pos;
        if (in.pos == in.size && left == 0)
            break; /* every frame decoded and flushed */
        if (out.pos == 0 && in.pos == in_before) /* no progress: input missing */
            return CORRUPT("%s: object at byte %llu: truncated zstd frame (after %llu decoded "
                           "bytes)", m->path, ULL(object), ULL(produced));
    }
    if (dst == NULL)
        *got = produced;
    else
        *got = produced > offset ? produced - offset : 0;
    return SFS_OK;
}

/* Run zstd_decode with c, or with a context made for the call. */
static int zstd_decode_ctx(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *c, uint64_t object,
                           const uint8_t *src, size_t n, uint64_t offset, uint8_t *dst,
                           size_t length, uint64_t *got, sfs_error_t *err)
{
    sfs_mosaic_ctx_t *own = NULL;
    if (!c && !(c = own = sfs_mosaic_ctx_new()))
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory (zstd context)", m->path);
    int rc = zstd_decode(m, c, object, src, n, offset, dst, length, got, err);
    sfs_mosaic_ctx_free(own);
    return rc;
}

/* The sum of the content sizes of the zstd frames src[0, n) (skippable
 * frames count 0): ZSTD_findDecompressedSize, with the stable API only.
 * ZSTD_CONTENTSIZE_UNKNOWN when a frame does not say, ZSTD_CONTENTSIZE_ERROR
 * for bytes that are not frames or a sum past 2^64. */
static unsigned long long frames_content_size(const uint8_t *src, size_t n)
{
    unsigned long long total = 0;
    int unknown = 0;
    while (n > 0) {
        unsigned long long size = ZSTD_getFrameContentSize(src, n);
        if (size == ZSTD_CONTENTSIZE_ERROR)
            return ZSTD_CONTENTSIZE_ERROR;
        size_t frame = ZSTD_findFrameCompressedSize(src, n);
        if (ZSTD_isError(frame) || frame == 0 || frame > n)
            return ZSTD_CONTENTSIZE_ERROR;
        if (size == ZSTD_CONTENTSIZE_UNKNOWN)
            unknown = 1;
        else if (size > ZSTD_CONTENTSIZE_ERROR - 1 - total)
            return ZSTD_CONTENTSIZE_ERROR;
        else
            total += size;
        src += frame;
        n -= frame;
    }
    return unknown ? ZSTD_CONTENTSIZE_UNKNOWN : total;
}

int sfs_mosaic_object_size(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t object,
                           uint64_t *size, int *exact, sfs_error_t *err)
{
    uint64_t data, stored;
    int rc = sfs_mosaic_object(m, object, &data, &stored, err);
    if (rc != SFS_OK)
        return rc;
    if (m->info.compression == SFS_MOSAIC_NONE || stored == 0) {
        *size = stored;
        if (exact)
            *exact = 1;
        return SFS_OK;
    }
    if (stored > 4096)
        /* the frames' block headers and checksums lie across the object:
         * one read of it all instead of a page fault per header (the
         * mapping is MADV_RANDOM), which the read of its bytes needs next */
        will_need(m, data, stored);
    unsigned long long declared = frames_content_size(m->map + data, (size_t)stored);
    if (declared == ZSTD_CONTENTSIZE_ERROR)
        return CORRUPT("%s: object at byte %llu: its %llu bytes are not zstd frames", m->path,
                       ULL(object), ULL(stored));
    if (declared != ZSTD_CONTENTSIZE_UNKNOWN) {
        *size = declared;
        if (exact)
            *exact = 0;
        return SFS_OK;
    }
    if ((rc = zstd_decode_ctx(m, ctx, object, m->map + data, (size_t)stored, 0, NULL, 0, size,
                              err)) != SFS_OK)
        return rc;
    if (exact)
        *exact = 1;
    return SFS_OK;
}

int sfs_mosaic_declared_size(const sfs_mosaic_t *m, uint64_t object, uint64_t *size, sfs_error_t *err)
{
    uint64_t data, stored;
    int rc = sfs_mosaic_object(m, object, &data, &stored, err);
    if (rc != SFS_OK)
        return rc;
    if (m->info.compression == SFS_MOSAIC_NONE || stored == 0) {
        *size = stored;
        return SFS_OK;
    }
    /* a frame header is at most 18 bytes (magic 4, descriptor 1, window 1,
     * dictionary ID up to 4, content size up to 8: RFC 8878, 3.1.1.1) */
    unsigned long long declared = ZSTD_getFrameContentSize(m->map + data, stored < 18 ? (size_t)stored : 18);
    if (declared == ZSTD_CONTENTSIZE_ERROR || declared == ZSTD_CONTENTSIZE_UNKNOWN)
        return CORRUPT("%s: object at byte %llu: its zstd frame header gives no content size", m->path, ULL(object));
    *size = declared;
    return SFS_OK;
}

int sfs_mosaic_decode(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t object, const uint8_t *stored_bytes,
                      uint64_t stored, uint64_t offset, void *dst, size_t length, size_t *got, sfs_error_t *err)
{
    *got = 0;
    if (m->info.compression == SFS_MOSAIC_NONE) {
        if (offset >= stored)
            return SFS_OK;
        size_t n = stored - offset < length ? (size_t)(stored - offset) : length;
        memcpy(dst, stored_bytes + offset, n);
        *got = n;
        return SFS_OK;
    }
    if (length == 0)
        return SFS_OK;
    uint64_t decoded;
    int rc = zstd_decode_ctx(m, ctx, object, stored_bytes, (size_t)stored, offset, dst, length, &decoded, err);
    if (rc == SFS_OK)
        *got = (size_t)decoded;
    return rc;
}

int sfs_mosaic_read(const sfs_mosaic_t *m, sfs_mosaic_ctx_t *ctx, uint64_t object,
                    uint64_t offset, void *dst, size_t length, size_t *got, sfs_error_t *err)
{
    *got = 0;
    uint64_t data, stored;
    int rc = sfs_mosaic_object(m, object, &data, &stored, err);
    return rc != SFS_OK ? rc : sfs_mosaic_decode(m, ctx, object, m->map + data, stored, offset, dst, length, got, err);
}

/* ---------------------------------------------------------------- check */

typedef struct {
    const sfs_mosaic_t *m;
    void (*report)(void *, uint64_t, uint32_t, const char *);
    void *ctx;
    sfs_error_t *err;
    uint64_t problems;
} checker_t;

static void problem(checker_t *k, uint64_t position, uint32_t id, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void problem(checker_t *k, uint64_t position, uint32_t id, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (k->problems++ == 0)
        sfs_fail(k->err, SFS_ECORRUPT, 0, "%s: %s", k->m->path, msg);
    if (k->report)
        k->report(k->ctx, position, id, msg);
}

static void check_crc(checker_t *k, const el_t *e, sfs_mosaic_check_stats_t *st)
{
    uint32_t stored = 0, computed = 0;
    int rc = crc_verify(k->m->map, e, &stored, &computed);
    if (rc < 0)
        problem(k, e->pos, e->id, "%s at byte %llu does not start with a CRC-32 element",
                id_name(e->id), ULL(e->pos));
    else if (rc > 0)
        problem(k, e->pos, e->id, "bad CRC-32 of %s at byte %llu (stored 0x%08x, computed 0x%08x)",
                id_name(e->id), ULL(e->pos), stored, computed);
    else
        st->crcs++;
}

static void check_tile(checker_t *k, const el_t *t, sfs_mosaic_check_stats_t *st)
{
    const uint8_t *map = k->m->map;
    check_crc(k, t, st);
    for (uint64_t at = t->data; at < t->end;) {
        el_t e;
        int rc = el_read(map, at, t->end, &e);
        if (rc != EL_OK) {
            problem(k, at, SFS_MOSAIC_ID_TILE, "element at byte %llu in Tile at byte %llu: %s",
                    ULL(at), ULL(t->pos), el_why(rc));
            return;
        }
        if (e.id == SFS_MOSAIC_ID_OBJECT)
            st->objects++;
        else if (e.id == SFS_MOSAIC_ID_VOID)
            st->voids++;
        else if (!(e.id == SFS_MOSAIC_ID_CRC32 && at == t->data))
            problem(k, at, e.id, "element 0x%x at byte %llu in Tile at byte %llu: neither an "
                    "Object nor a Void", e.id, ULL(at), ULL(t->pos));
        at = e.end;
    }
}

static void check_entries(checker_t *k, const mosaic_index_t *x, sfs_mosaic_check_stats_t *st)
{
    const sfs_mosaic_t *m = k->m;
    uint64_t bad = 0;
    for (uint64_t slot = 0; slot < x->info.slots; slot++) {
        const uint8_t *key;
        uint64_t pos, base = x->info.unrolled_position + slot * x->info.entry_size;
        sfs_error_t e;
        int rc = entry_read(m, x, slot, &key, &pos, &e);
        if (rc == SFS_ENOTFOUND) {
            st->voided_entries++;
            continue;
        }
        if (rc == SFS_OK) {
            int64_t v = sfs_gof_get(x->gof, key, x->info.key_size);
            if (v != (int64_t)slot) {
                snprintf(e.message, sizeof(e.message), "%s: the key of entry %llu of index %s "
                         "(byte %llu) maps to entry %lld through the Map", m->path, ULL(slot),
                         x->info.name, ULL(base), (long long)v);
                rc = SFS_ECORRUPT;
            } else if ((rc = sfs_mosaic_object(m, pos, NULL, NULL, &e)) == SFS_ENOTFOUND) {
                snprintf(e.message, sizeof(e.message), "%s: entry %llu of index %s (byte %llu) "
                         "is live but its object at byte %llu was deleted", m->path, ULL(slot),
                         x->info.name, ULL(base), ULL(pos));
                rc = SFS_ECORRUPT;
            }
        }
        if (rc == SFS_OK) {
            st->live_entries++;
            continue;
        }
        if (bad++ < 16) { /* at most 16 reports of an index's entries */
            const char *msg = e.message, *colon = strstr(msg, ": ");
            problem(k, base, SFS_MOSAIC_ID_KEY, "%s", colon ? colon + 2 : msg);
        } else {
            k->problems++;
        }
    }
}

int sfs_mosaic_check(const sfs_mosaic_t *m,
                     void (*report)(void *ctx, uint64_t position, uint32_t id, const char *message),
                     void *ctx, sfs_mosaic_check_stats_t *stats, sfs_error_t *err)
{
    const uint8_t *map = m->map;
    checker_t k = {m, report, ctx, err, 0};
    sfs_mosaic_check_stats_t st = {0};
    el_t e;
    int rc;
    /* ContainerMetaData (parsed at open, so readable). */
    uint64_t limit = m->info.tiles_position;
    if (el_read(map, m->info.metadata_position, limit, &e) == EL_OK)
        check_crc(&k, &e, &st);
    /* Tiles. */
    for (uint64_t at = m->info.tiles_position; at < m->info.end_of_tiles; at = e.end) {
        if ((rc = el_read(map, at, m->info.end_of_tiles, &e)) != EL_OK) {
            problem(&k, at, 0, "element at byte %llu among the tiles: %s", ULL(at), el_why(rc));
            break;
        }
        if (e.id == SFS_MOSAIC_ID_TILE) {
            st.tiles++;
            check_tile(&k, &e, &st);
        } else if (e.id != SFS_MOSAIC_ID_VOID) {
            problem(&k, at, e.id, "element 0x%x at byte %llu among the tiles: neither a Tile nor "
                    "a Void", e.id, ULL(at));
        }
    }
    if (st.objects != m->info.objects_counter)
        problem(&k, m->info.metadata_position, SFS_MOSAIC_ID_METADATA, "ObjectsCounter is %llu but "
                "the tiles hold %llu Object elements", ULL(m->info.objects_counter),
                ULL(st.objects));
    /* Indexes, whatever their description, and their MapContainers (open
     * read them all: readable). */
    for (uint64_t at = m->info.end_of_tiles; at < m->info.mosaic_end; at = e.end) {
        if (el_read(map, at, m->info.mosaic_end, &e) != EL_OK)
            break;
        if (e.id != SFS_MOSAIC_ID_INDEX)
            continue;
        check_crc(&k, &e, &st);
        el_t c;
        for (uint64_t in = e.data; in < e.end && el_read(map, in, e.end, &c) == EL_OK; in = c.end)
            if (c.id == SFS_MOSAIC_ID_MAP_CONTAINER)
                check_crc(&k, &c, &st);
    }
    for (size_t i = 0; i < m->info.indexes; i++)
        check_entries(&k, &m->index[i], &st);
    if (stats)
        *stats = st;
    return k.problems ? SFS_ECORRUPT : SFS_OK;
}

/* ---------------------------------------------------------------- per-thread contexts */

static pthread_key_t ctx_key;
static pthread_once_t ctx_once = PTHREAD_ONCE_INIT;
static int ctx_key_ok;

static void ctx_free(void *ctx) { sfs_mosaic_ctx_free(ctx); }

static void ctx_key_make(void) { ctx_key_ok = pthread_key_create(&ctx_key, ctx_free) == 0; }

sfs_mosaic_ctx_t *sfs_mosaic_thread_ctx(const sfs_mosaic_t *m)
{
    if (m->info.compression == SFS_MOSAIC_NONE)
        return NULL;
    pthread_once(&ctx_once, ctx_key_make);
    if (!ctx_key_ok)
        return NULL;
    sfs_mosaic_ctx_t *ctx = pthread_getspecific(ctx_key);
    if (!ctx && (ctx = sfs_mosaic_ctx_new()) && pthread_setspecific(ctx_key, ctx) != 0) {
        sfs_mosaic_ctx_free(ctx);
        ctx = NULL;
    }
    return ctx;
}
