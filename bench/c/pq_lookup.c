/*
 * pq_lookup.c — what an object only in a winery database costs a reader
 * that queries with libpq directly (no Python): for each key, the two
 * indexed queries shardfs makes (the shard where signature2shard says the
 * key is present, then the object's row in that shard's write table),
 * prepared, with binary parameters and results.
 *
 *   pq_lookup CONNINFO TABLE KEYFILE
 *
 * TABLE is the write shard's table (shard_<name>); KEYFILE one 64-hex key
 * per line. Prints one JSON line: {"objects": N, "bytes": B, "seconds": S,
 * "us_per_object": U}. Exit status 1 on a connection or query error, or a
 * key not found.
 *
 * Build: gcc -O2 -I$(pg_config --includedir) -o pq_lookup bench/c/pq_lookup.c -lpq
 */
#include <libpq-fe.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: pq_lookup CONNINFO TABLE KEYFILE\n");
        return 2;
    }
    PGconn *conn = PQconnectdb(argv[1]);
    if (PQstatus(conn) != CONNECTION_OK) {
        fprintf(stderr, "pq_lookup: %s", PQerrorMessage(conn));
        return 1;
    }
    char q2[512];
    char *table = PQescapeIdentifier(conn, argv[2], strlen(argv[2]));
    snprintf(q2, sizeof(q2), "SELECT content FROM %s WHERE key = $1", table);
    PQfreemem(table);
    PGresult *r = PQprepare(conn, "shard",
                            "SELECT shard FROM signature2shard WHERE signature = $1 AND state = 'present'",
                            1, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "pq_lookup: %s", PQerrorMessage(conn));
        return 1;
    }
    PQclear(r);
    r = PQprepare(conn, "content", q2, 1, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "pq_lookup: %s", PQerrorMessage(conn));
        return 1;
    }
    PQclear(r);
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
    long long bytes = 0;
    int one = 1, len = 32;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        const char *param = (const char *)keys[i];
        r = PQexecPrepared(conn, "shard", 1, &param, &len, &one, 1);
        if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
            fprintf(stderr, "pq_lookup: key %zu: not present (%s)\n", i, PQerrorMessage(conn));
            return 1;
        }
        PQclear(r);
        r = PQexecPrepared(conn, "content", 1, &param, &len, &one, 1);
        if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) != 1) {
            fprintf(stderr, "pq_lookup: key %zu: no row (%s)\n", i, PQerrorMessage(conn));
            return 1;
        }
        bytes += PQgetlength(r, 0, 0);
        PQclear(r);
    }
    double s = now() - t0;
    printf("{\"objects\": %zu, \"bytes\": %lld, \"seconds\": %.6f, \"us_per_object\": %.2f}\n", n, bytes, s,
           n ? s / n * 1e6 : 0.0);
    PQfinish(conn);
    free(keys);
    return 0;
}
