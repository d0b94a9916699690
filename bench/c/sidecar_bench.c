/*
 * sidecar_bench.c — how fast sidecars are built and queried (shardfs/c/sidecar.h).
 *
 *   sidecar_bench candidates SHARDS KEYS [--synthetic]
 *   sidecar_bench build N
 *
 * candidates: SHARDS sidecars of KEYS random keys each, all open at once;
 * then sfs_sidecar_candidates() over the whole array for 200,000 absent
 * keys and 200,000 present keys (each from a random sidecar), and the same
 * with a plain loop of sfs_sidecar_may_contain() (no prefetch) for
 * comparison. By default each sidecar is built from a real shard
 * (sfs_writer_*, then sfs_sidecar_build); --synthetic writes the sidecar
 * files directly (same format, no shard: for sizes whose shards would take
 * too long to build). Output: queries per second and ns per sidecar.
 *
 * build: one shard of N random keys (empty objects), then
 * sfs_sidecar_build() twice: once after evicting the shard from the page
 * cache (posix_fadvise DONTNEED; cold, as far as the device allows), once
 * warm. Output: seconds of each, the sidecar's size, and the memory the
 * build added at its peak: VmHWM (peak resident set, reset before each
 * build by writing 5 to /proc/self/clear_refs) minus VmRSS before, and the
 * peaks of RssAnon (heap) and RssFile (mapped file pages, e.g. an index
 * read through the shard's mapping) above their values before, sampled
 * every millisecond by a thread. Large blocks are mmap'ed (fixed
 * M_MMAP_THRESHOLD) so that a build cannot reuse heap pages left resident
 * by the shard's writer or an earlier build.
 *
 * Files go to a temporary directory under $TMPDIR (default /tmp), removed
 * at the end. Wall clock, CLOCK_MONOTONIC.
 *
 * Build: gcc -O2 -Ishardfs/c -Itests/c bench/c/sidecar_bench.c shardfs/c/shard.c \
 *            shardfs/c/chd.c shardfs/c/chd_build.c shardfs/c/writer.c shardfs/c/sidecar.c \
 *            shardfs/c/output.c -lcmph -lcrypto -lpthread
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "shard.h"
#include "sidecar.h"
#include "check.h" /* tests/c: next_rand, rand_key */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const uint8_t ident[32] = {42};

/* ------------------------------------------------------------ memory */

/* A field of /proc/self/status in KiB ("VmHWM", "RssAnon"...), -1 if absent. */
static long status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    size_t len = strlen(field);
    long v = -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, len) == 0 && line[len] == ':') {
            v = strtol(line + len + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Memory added by a build: marks taken before, peaks during. */
typedef struct {
    pthread_t thread;
    volatile int stop;
    int hwm_reset;                 /* VmHWM was reset to VmRSS at the start */
    long rss, anon, file;          /* KiB before */
    long hwm, anon_peak, file_peak; /* KiB: peaks */
} mem_t;

static void *sample(void *arg)
{
    mem_t *m = arg;
    while (!m->stop) {
        long a = status_kib("RssAnon"), f = status_kib("RssFile");
        if (a > m->anon_peak)
            m->anon_peak = a;
        if (f > m->file_peak)
            m->file_peak = f;
        usleep(1000);
    }
    return NULL;
}

static void mem_start(mem_t *m)
{
    memset(m, 0, sizeof(*m));
    malloc_trim(0); /* what earlier phases freed is not counted as resident */
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    m->hwm_reset = fd >= 0 && write(fd, "5", 1) == 1; /* VmHWM := VmRSS (Linux >= 4.0) */
    if (fd >= 0)
        close(fd);
    m->rss = status_kib("VmRSS");
    m->anon = m->anon_peak = status_kib("RssAnon");
    m->file = m->file_peak = status_kib("RssFile");
    pthread_create(&m->thread, NULL, sample, m);
}

static void mem_stop(mem_t *m)
{
    m->stop = 1;
    pthread_join(m->thread, NULL);
    m->hwm = status_kib("VmHWM");
}

static void mem_print(const mem_t *m, uint64_t n)
{
    double key = n ? (double)n : 1;
    if (m->hwm_reset)
        printf("    peak memory: +%.1f MiB resident (VmHWM - VmRSS before: %.1f B/key)\n",
               (m->hwm - m->rss) / 1024.0, (m->hwm - m->rss) * 1024.0 / key);
    printf("    sampled peaks: heap (RssAnon) +%.1f MiB (%.1f B/key), mapped file (RssFile) "
           "+%.1f MiB\n",
           (m->anon_peak - m->anon) / 1024.0, (m->anon_peak - m->anon) * 1024.0 / key,
           (m->file_peak - m->file) / 1024.0);
}

static void die(const char *what, const sfs_error_t *err)
{
    fprintf(stderr, "%s: %s\n", what, err ? err->message : "failed");
    exit(1);
}

/* A shard of n random keys (empty objects) at path; keys to keys if given. */
static sfs_shard_t *make_shard(const char *path, uint64_t n, uint8_t (*keys)[32])
{
    sfs_writer_t *w;
    sfs_error_t err;
    if (sfs_writer_open(path, &w, &err) != SFS_OK)
        die("writer", &err);
    for (uint64_t i = 0; i < n; i++) {
        uint8_t k[32];
        rand_key(k);
        if (keys)
            memcpy(keys[i], k, 32);
        if (sfs_writer_add(w, k, "", 0, &err) != SFS_OK)
            die("add", &err);
    }
    if (sfs_writer_finish(w, NULL, &err) != SFS_OK)
        die("finish", &err);
    sfs_shard_t *s;
    if (sfs_open(path, 0, &s, &err) != SFS_OK)
        die("open", &err);
    return s;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The sidecar format written directly from n keys' top 64 bits. */
static void write_synthetic(const char *path, uint8_t (*keys)[32], uint64_t n)
{
    uint64_t *top = malloc((n ? n : 1) * 8);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t v = 0;
        for (int j = 0; j < 8; j++)
            v = v << 8 | keys[i][j];
        top[i] = v;
    }
    qsort(top, n, 8, cmp_u64);
    unsigned p = sfs_sidecar_bits_for(n);
    uint8_t h[64] = {0};
    memcpy(h, SFS_SIDECAR_MAGIC, 8);
    uint32_t v32 = SFS_SIDECAR_VERSION;
    memcpy(h + 8, &v32, 4);
    memcpy(h + 12, &p, 4);
    memcpy(h + 16, &n, 8);
    memcpy(h + 24, &n, 8);
    memcpy(h + 32, ident, 32);
    FILE *f = fopen(path, "wb");
    fwrite(h, 1, 64, f);
    uint64_t pos = 0;
    for (uint64_t b = 0; b <= (1ull << p); b++) {
        while (pos < n && (p ? top[pos] >> (64 - p) : 0) < b)
            pos++;
        uint32_t d = (uint32_t)pos;
        fwrite(&d, 4, 1, f);
    }
    for (uint64_t i = 0; i < n; i++) {
        uint32_t fp = (uint32_t)((top[i] << p) >> 32);
        fwrite(&fp, 4, 1, f);
    }
    for (uint64_t i = 0; i < n; i++) {
        uint32_t s = (uint32_t)i;
        fwrite(&s, 4, 1, f);
    }
    fclose(f);
    free(top);
}

static void bench_candidates(size_t shards, uint64_t keys_per, int synthetic)
{
    sfs_sidecar_t **sc = calloc(shards, sizeof(*sc));
    uint8_t(*keys)[32] = malloc(shards * keys_per * 32);
    char path[512], spath[512];
    double t = now();
    for (size_t i = 0; i < shards; i++) {
        sfs_error_t err;
        uint8_t(*k)[32] = keys + i * keys_per;
        uint64_t slots = keys_per;
        snprintf(spath, sizeof(spath), "%s/%zu.sidecar", dir, i);
        if (synthetic) {
            for (uint64_t j = 0; j < keys_per; j++)
                rand_key(k[j]);
            write_synthetic(spath, k, keys_per);
        } else {
            snprintf(path, sizeof(path), "%s/%zu.shard", dir, i);
            sfs_shard_t *s = make_shard(path, keys_per, k);
            if (sfs_sidecar_build(s, spath, ident, &err) != SFS_OK)
                die("build", &err);
            slots = sfs_slot_count(s);
            sfs_close(s);
            unlink(path);
        }
        if (sfs_sidecar_open(spath, ident, slots, &sc[i], &err) != SFS_OK)
            die("open", &err);
    }
    printf("setup: %zu sidecars of %llu keys (%s) in %.1f s\n", shards,
           (unsigned long long)keys_per, synthetic ? "synthetic" : "from real shards", now() - t);

    /* about 2e7 sidecar probes per timed run */
    int Q = shards >= 100 ? (int)(20000000 / shards) : 200000;
    uint8_t(*q)[32] = malloc((size_t)Q * 32);
    uint32_t *out = malloc(shards * sizeof(uint32_t));
    for (int present = 0; present < 2; present++) {
        for (int i = 0; i < Q; i++) {
            if (present)
                memcpy(q[i], keys[(next_rand() % shards) * keys_per + next_rand() % keys_per], 32);
            else
                rand_key(q[i]);
        }
        for (int pass = 0; pass < 2; pass++) {
            uint64_t total = 0;
            double best = 1e9;
            for (int rep = 0; rep < 3; rep++) {
                total = 0;
                t = now();
                for (int i = 0; i < Q; i++) {
                    if (pass == 0) {
                        total += sfs_sidecar_candidates(sc, shards, q[i], out, shards);
                    } else {
                        for (size_t j = 0; j < shards; j++)
                            total += sfs_sidecar_may_contain(sc[j], q[i]);
                    }
                }
                double el = now() - t;
                if (el < best)
                    best = el;
            }
            printf("%-8s keys, %-34s %10.0f queries/s  %6.1f ns/sidecar  (%.4f candidates/query)\n",
                   present ? "present" : "absent",
                   pass == 0 ? "sfs_sidecar_candidates (prefetch):"
                             : "loop of may_contain (no prefetch):",
                   Q / best, best * 1e9 / Q / (double)shards, (double)total / Q);
        }
    }
    for (size_t i = 0; i < shards; i++) {
        sfs_sidecar_close(sc[i]);
        snprintf(spath, sizeof(spath), "%s/%zu.sidecar", dir, i);
        unlink(spath);
    }
    free(sc);
    free(keys);
    free(q);
    free(out);
}

static void bench_build(uint64_t n)
{
    char path[512], spath[512];
    snprintf(path, sizeof(path), "%s/big.shard", dir);
    snprintf(spath, sizeof(spath), "%s/big.sidecar", dir);
    double t = now();
    sfs_shard_t *s = make_shard(path, n, NULL);
    printf("shard of %llu keys built in %.1f s\n", (unsigned long long)n, now() - t);
    for (int warm = 0; warm < 2; warm++) {
        if (!warm) {
            int fd = open(path, O_RDONLY);
            fdatasync(fd);
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
        sfs_error_t err;
        mem_t mem;
        mem_start(&mem);
        t = now();
        if (sfs_sidecar_build(s, spath, ident, &err) != SFS_OK)
            die("build", &err);
        double el = now() - t;
        mem_stop(&mem);
        sfs_sidecar_t *sc;
        if (sfs_sidecar_open(spath, ident, sfs_slot_count(s), &sc, &err) != SFS_OK)
            die("open", &err);
        printf("sidecar build, %s index: %.2f s for %llu keys (%.0f ns/key), %llu bytes, p=%u\n",
               warm ? "warm" : "cold", el, (unsigned long long)n, el * 1e9 / (double)n,
               (unsigned long long)sfs_sidecar_file_size(sfs_sidecar_prefix_bits(sc), n),
               sfs_sidecar_prefix_bits(sc));
        mem_print(&mem, n);
        sfs_sidecar_close(sc);
    }
    sfs_close(s);
    unlink(path);
    unlink(spath);
}

int main(int argc, char **argv)
{
    const char *tmp = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(dir, sizeof(dir), "%s/shardfs-sidecar-bench-XXXXXX", tmp);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    /* A fixed mmap threshold: every large block is mmap'ed and unmapped on
     * free, so that a build's peak shows in the resident set instead of
     * reusing heap pages an earlier phase (or build) left resident. */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    int rc = 0;
    if (argc >= 4 && strcmp(argv[1], "candidates") == 0)
        bench_candidates(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10),
                         argc > 4 && strcmp(argv[4], "--synthetic") == 0);
    else if (argc == 3 && strcmp(argv[1], "build") == 0)
        bench_build(strtoull(argv[2], NULL, 10));
    else {
        fprintf(stderr, "usage: %s candidates SHARDS KEYS [--synthetic] | build N\n", argv[0]);
        rc = 2;
    }
    rmdir(dir);
    return rc;
}
