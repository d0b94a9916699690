/*
 * rbd_read.c — the floor of a read from Ceph: one read of SIZE bytes at a
 * time (queue depth 1) through librbd, at random SIZE-aligned offsets of
 * the first SPAN bytes of an image, COUNT times, timed one by one.
 *
 *   rbd_read CEPH_CONF POOL IMAGE COUNT SIZE SPAN
 *
 * Opens the image read-only with librbd's cache off (as shardfs reads it),
 * reads once untimed (the connection's first request), then COUNT timed
 * reads. Output, one line of JSON on stdout:
 *   {"reads": N, "median_us": M, "p99_us": P, "mean_us": A}
 * Exit status 1 on any error (message on stderr).
 *
 * Build: gcc -O2 -o rbd_read bench/c/rbd_read.c -lrbd -lrados
 */
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "rbd_read: %s: %s\n", what, strerror(-rc));
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: rbd_read CEPH_CONF POOL IMAGE COUNT SIZE SPAN\n");
        return 2;
    }
    long count = atol(argv[4]);
    size_t size = (size_t)atol(argv[5]);
    uint64_t span = strtoull(argv[6], NULL, 10);
    if (count < 1 || size < 1 || span < size)
        return fail("arguments", -22);
    rados_t c;
    rados_ioctx_t io;
    rbd_image_t img;
    int rc;
    if ((rc = rados_create(&c, NULL)) < 0 || (rc = rados_conf_read_file(c, argv[1])) < 0)
        return fail("configuration", rc);
    rados_conf_set(c, "rbd_cache", "false");
    rados_conf_set(c, "admin_socket", "");
    if ((rc = rados_connect(c)) < 0)
        return fail("connect", rc);
    if ((rc = rados_ioctx_create(c, argv[2], &io)) < 0)
        return fail("pool", rc);
    if ((rc = rbd_open_read_only(io, argv[3], &img, NULL)) < 0)
        return fail("image", rc);
    char *buf = malloc(size);
    double *us = malloc(sizeof(double) * (size_t)count);
    srand(7);
    uint64_t slots = span / size;
    if ((rc = (int)rbd_read(img, 0, size, buf)) < 0)
        return fail("read", rc);
    for (long i = 0; i < count; i++) {
        uint64_t off = ((uint64_t)rand() % slots) * size;
        double t = now_us();
        ssize_t n = rbd_read(img, off, size, buf);
        us[i] = now_us() - t;
        if (n < 0)
            return fail("read", (int)n);
    }
    double sum = 0;
    for (long i = 0; i < count; i++)
        sum += us[i];
    qsort(us, (size_t)count, sizeof(double), cmp);
    printf("{\"reads\": %ld, \"median_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f}\n", count,
           us[count / 2], us[(count * 99) / 100], sum / count);
    rbd_close(img);
    rados_ioctx_destroy(io);
    rados_shutdown(c);
    free(buf);
    free(us);
    return 0;
}
