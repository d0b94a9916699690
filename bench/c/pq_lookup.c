/*
 * pq_lookup.c — the one query shardfs makes for an object only in a
 * winery database (shardfs/winery.py Reader._row_query as Reader.fetch
 * renders it: the object's shard in signature2shard and its bytes from that
 * shard's write table), made from C with libpq instead of psycopg:
 * prepared once, the key a binary parameter, binary results.
 *
 *   pq_lookup CONNINFO SQL KEYFILE OUTFILE
 *
 * SQL takes $1 (the 32-byte key), $2 (first byte, 1-based) and $3 (length)
 * and returns one row (shard, bytes). KEYFILE holds one 64-hex key per
 * line. The clock runs from the first query to the last (connection and
 * PQprepare before it); then the objects' bytes are written to OUTFILE,
 * concatenated in KEYFILE's order (the caller checks them), and one JSON
 * line is printed: {"objects": N, "bytes": B, "seconds": S}. Exit status 1
 * on a connection or query error, or a key that is not present.
 *
 * Built by bench/bench_winery.py (harness.compile_c, -I`pg_config
 * --includedir` -lpq).
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int unhex(const char *s, unsigned char out[32])
{
    for (int i = 0; i < 32; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (unsigned char)v;
    }
    return 0;
}

static int fail(PGconn *conn, const char *what)
{
    fprintf(stderr, "pq_lookup: %s: %s", what, PQerrorMessage(conn));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: pq_lookup CONNINFO SQL KEYFILE OUTFILE\n");
        return 2;
    }
    FILE *f = fopen(argv[3], "r");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    size_t n = 0, cap = 1024;
    unsigned char (*keys)[32] = malloc(cap * 32);
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        if (n == cap)
            keys = realloc(keys, (cap *= 2) * 32);
        if (unhex(line, keys[n]) == 0)
            n++;
    }
    fclose(f);
    PGresult **rows = calloc(n ? n : 1, sizeof(*rows));

    PGconn *conn = PQconnectdb(argv[1]);
    if (PQstatus(conn) != CONNECTION_OK)
        return fail(conn, "connect");
    PGresult *r = PQprepare(conn, "object", argv[2], 3, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK)
        return fail(conn, "prepare");
    PQclear(r);

    const char *params[3] = {NULL, "1", "2147483647"};
    int lengths[3] = {32, 0, 0}, formats[3] = {1, 0, 0};
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        params[0] = (const char *)keys[i];
        rows[i] = PQexecPrepared(conn, "object", 3, params, lengths, formats, 1);
        if (PQresultStatus(rows[i]) != PGRES_TUPLES_OK)
            return fail(conn, "query");
        if (PQntuples(rows[i]) != 1 || PQgetisnull(rows[i], 0, 1)) {
            fprintf(stderr, "pq_lookup: key %zu: not in a write table\n", i);
            return 1;
        }
    }
    double s = now() - t0;

    FILE *out = fopen(argv[4], "wb");
    if (!out) {
        perror(argv[4]);
        return 1;
    }
    long long bytes = 0;
    for (size_t i = 0; i < n; i++) {
        int len = PQgetlength(rows[i], 0, 1);
        fwrite(PQgetvalue(rows[i], 0, 1), 1, len, out);
        bytes += len;
        PQclear(rows[i]);
    }
    if (fclose(out) != 0) {
        perror(argv[4]);
        return 1;
    }
    printf("{\"objects\": %zu, \"bytes\": %lld, \"seconds\": %.6f}\n", n, bytes, s);
    PQfinish(conn);
    free(rows);
    free(keys);
    return 0;
}
