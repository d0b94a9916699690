/*
 * s3_get.c — the floor of a cold object in S3: one ranged GET per line of
 * a list ("OFFSET LENGTH"), one libcurl handle kept alive (TCP_NODELAY),
 * signed by libcurl (SigV4) as shardfs's s3.c signs; prints
 * {"seconds": S, "gets": N, "bytes": B} in JSON.
 *
 *   s3_get URL LISTFILE   (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION)
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static size_t got_bytes;

static size_t body(char *data, size_t one, size_t n, void *arg)
{
    got_bytes += n;
    return n;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: s3_get URL LISTFILE\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "r");
    if (!f) {
        perror(argv[2]);
        return 1;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    const char *region = getenv("AWS_REGION") ? getenv("AWS_REGION") : "us-east-1";
    char userpwd[512], sigv4[128], range[64];
    struct curl_slist *headers = NULL;
    curl_easy_setopt(c, CURLOPT_URL, argv[1]);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, body);
    if (id && secret) {
        snprintf(userpwd, sizeof(userpwd), "%s:%s", id, secret);
        snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:s3", region);
        curl_easy_setopt(c, CURLOPT_USERPWD, userpwd);
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4);
        headers = curl_slist_append(headers, "x-amz-content-sha256: "
                                             "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    }
    unsigned long long off, len;
    size_t gets = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (fscanf(f, "%llu %llu", &off, &len) == 2) {
        snprintf(range, sizeof(range), "%llu-%llu", off, off + len - 1);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        CURLcode rc = curl_easy_perform(c);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        if (rc != CURLE_OK || code != 206) {
            fprintf(stderr, "GET %s: %s, HTTP %ld\n", range, curl_easy_strerror(rc), code);
            return 1;
        }
        gets++;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("{\"seconds\": %.6f, \"gets\": %zu, \"bytes\": %zu}\n",
           (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9, gets, got_bytes);
    curl_slist_free_all(headers);
    curl_easy_cleanup(c);
    curl_global_cleanup();
    return 0;
}
