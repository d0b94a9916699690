/*
 * s3.c — ranged GETs of S3 objects with libcurl (s3.h).
 */
#define _GNU_SOURCE
#include "s3.h"
#include "internal.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <dlfcn.h>

#define POOL_MAX 32 /* idle handles kept per connection */

/* libcurl is loaded (dlopen) at the first S3 source, not with the
 * extension: it brings some twenty libraries (TLS, LDAP, Kerberos, SSH...)
 * and ~6 MB of resident memory that every shardfs process, each of a
 * mount's workers included, would pay otherwise (measured here: importing
 * shardfs 14.5 MB before S3, 20.8 MB with libcurl linked: VmRSS after
 * `python -c "import shardfs"`). Each function
 * below is called through its pointer; only the headers are needed to
 * build (libcurl4-openssl-dev). */
#define LIBCURL_FUNCTIONS(X)                                                                        \
    X(curl_global_init) X(curl_easy_init) X(curl_easy_escape) X(curl_free) X(curl_easy_cleanup)     \
    X(curl_easy_reset) X(curl_slist_append) X(curl_slist_free_all) X(curl_easy_setopt)              \
    X(curl_easy_perform) X(curl_easy_getinfo) X(curl_easy_strerror) X(curl_multi_init)              \
    X(curl_multi_add_handle) X(curl_multi_perform) X(curl_multi_poll) X(curl_multi_info_read)       \
    X(curl_multi_remove_handle) X(curl_multi_cleanup)

#undef curl_easy_setopt /* curl.h's type-checking wrappers (gcc): the pointers are called */
#undef curl_easy_getinfo

static struct {
#define FIELD(name) __typeof__(&name) name;
    LIBCURL_FUNCTIONS(FIELD)
#undef FIELD
} lib;
static char lib_error[256]; /* "" once loaded */



static struct {
    pthread_mutex_t lock;
    char *endpoint, *region, *cache_dir;
    unsigned timeout;
} config = {PTHREAD_MUTEX_INITIALIZER, NULL, NULL, NULL, 0};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_start(void)
{
    void *so = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!so) {
        snprintf(lib_error, sizeof(lib_error), "cannot load libcurl.so.4 (install libcurl4): %s", dlerror());
        return;
    }
#define LOAD(name)                                                                                 \
    if (!(lib.name = (__typeof__(lib.name))dlsym(so, #name))) {                                    \
        snprintf(lib_error, sizeof(lib_error), "libcurl.so.4: no symbol %s", #name);               \
        return;                                                                                    \
    }
    LIBCURL_FUNCTIONS(LOAD)
#undef LOAD
    lib.curl_global_init(CURL_GLOBAL_DEFAULT);
}

struct sfs_s3 {
    char *source, *bucket, *key, *url, *userpwd, *sigv4, *token_header;
    char etag[SFS_S3_ETAG_MAX];
    long timeout_ms;
    pthread_mutex_t lock; /* the pool, etag, error */
    CURL *idle[POOL_MAX];
    int nidle;
    pid_t pid; /* the process whose connections the idle handles hold */
    char error[256];
};

/* From here on, libcurl's functions are its pointers (curl_start). */
#define curl_global_init lib.curl_global_init
#define curl_easy_init lib.curl_easy_init
#define curl_easy_escape lib.curl_easy_escape
#define curl_free lib.curl_free
#define curl_easy_cleanup lib.curl_easy_cleanup
#define curl_easy_reset lib.curl_easy_reset
#define curl_slist_append lib.curl_slist_append
#define curl_slist_free_all lib.curl_slist_free_all
#define curl_easy_setopt lib.curl_easy_setopt
#define curl_easy_perform lib.curl_easy_perform
#define curl_easy_getinfo lib.curl_easy_getinfo
#define curl_easy_strerror lib.curl_easy_strerror
#define curl_multi_init lib.curl_multi_init
#define curl_multi_add_handle lib.curl_multi_add_handle
#define curl_multi_perform lib.curl_multi_perform
#define curl_multi_poll lib.curl_multi_poll
#define curl_multi_info_read lib.curl_multi_info_read
#define curl_multi_remove_handle lib.curl_multi_remove_handle
#define curl_multi_cleanup lib.curl_multi_cleanup

int sfs_is_s3_source(const char *source) { return strncmp(source, SFS_S3_PREFIX, strlen(SFS_S3_PREFIX)) == 0; }

static int replace(char **slot, const char *value)
{
    if (!value)
        return 0;
    char *copy = strdup(value);
    if (!copy)
        return -1;
    free(*slot);
    *slot = copy;
    return 0;
}

int sfs_s3_configure(const char *endpoint, const char *region, unsigned timeout, const char *cache_dir)
{
    pthread_mutex_lock(&config.lock);
    int rc = replace(&config.endpoint, endpoint) | replace(&config.region, region) | replace(&config.cache_dir, cache_dir);
    if (timeout)
        config.timeout = timeout;
    pthread_mutex_unlock(&config.lock);
    return rc ? SFS_ENOMEM : SFS_OK;
}

const char *sfs_s3_cache_dir(void) { return config.cache_dir; }

static const char *env(const char *a, const char *b)
{
    const char *v = getenv(a);
    if ((!v || !*v) && b)
        v = getenv(b);
    return v && *v ? v : NULL;
}

static int truthy(const char *v) { return v && (!strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes")); }

int sfs_s3_new(const char *source, sfs_s3_t **out, sfs_error_t *err)
{
    *out = NULL;
    pthread_once(&curl_once, curl_start);
    if (lib_error[0])
        return sfs_fail(err, SFS_EIO, ENOSYS, "%s: %s", source, lib_error);
    const char *rest = sfs_is_s3_source(source) ? source + strlen(SFS_S3_PREFIX) : NULL;
    const char *slash = rest ? strchr(rest, '/') : NULL;
    if (!slash || slash == rest || !slash[1])
        return sfs_fail(err, SFS_EINVAL, 0, "%s: not an S3 source: write s3://BUCKET/KEY", source);
    sfs_s3_t *s = calloc(1, sizeof(*s));
    if (!s)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", source);
    pthread_mutex_init(&s->lock, NULL);
    s->pid = getpid();
    s->source = strdup(source);
    s->bucket = strndup(rest, (size_t)(slash - rest));
    s->key = strdup(slash + 1);
    if (!s->source || !s->bucket || !s->key) {
        sfs_s3_close(s);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", source);
    }
    pthread_mutex_lock(&config.lock);
    const char *endpoint = config.endpoint ? config.endpoint : env("AWS_ENDPOINT_URL", "AWS_ENDPOINT");
    const char *region = config.region ? config.region : env("AWS_REGION", "AWS_DEFAULT_REGION");
    unsigned timeout = config.timeout ? config.timeout : SFS_S3_DEFAULT_TIMEOUT;
    if (!region)
        region = "us-east-1";
    char host[300];
    if (!endpoint) {
        snprintf(host, sizeof(host), "https://s3.%s.amazonaws.com", region);
        endpoint = host;
    }
    CURL *c = curl_easy_init();
    char *escaped = c ? curl_easy_escape(c, s->key, 0) : NULL;
    if (escaped) /* keep the key's slashes: path-style ENDPOINT/BUCKET/KEY */
        for (char *p; (p = strstr(escaped, "%2F"));) {
            *p = '/';
            memmove(p + 1, p + 3, strlen(p + 3) + 1);
        }
    size_t n = strlen(endpoint) + strlen(s->bucket) + (escaped ? strlen(escaped) : 0) + 3;
    if ((s->url = malloc(n)))
        snprintf(s->url, n, "%s%s%s/%s", endpoint, endpoint[strlen(endpoint) - 1] == '/' ? "" : "/", s->bucket,
                 escaped ? escaped : "");
    curl_free(escaped);
    if (c)
        curl_easy_cleanup(c);
    const char *id = getenv("AWS_ACCESS_KEY_ID"), *secret = getenv("AWS_SECRET_ACCESS_KEY");
    const char *token = getenv("AWS_SESSION_TOKEN");
    int sign = id && *id && secret && !truthy(getenv("AWS_SKIP_SIGNATURE"));
    if (sign) {
        if (asprintf(&s->userpwd, "%s:%s", id, secret) < 0)
            s->userpwd = NULL;
        if (asprintf(&s->sigv4, "aws:amz:%s:s3", region) < 0)
            s->sigv4 = NULL;
        if (token && *token && asprintf(&s->token_header, "x-amz-security-token: %s", token) < 0)
            s->token_header = NULL;
    }
    pthread_mutex_unlock(&config.lock);
    s->timeout_ms = (long)timeout * 1000;
    if (!s->url || !escaped || (sign && (!s->userpwd || !s->sigv4))) {
        sfs_s3_close(s);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", source);
    }
    *out = s;
    return SFS_OK;
}

void sfs_s3_close(sfs_s3_t *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->nidle; i++)
        curl_easy_cleanup(s->idle[i]);
    pthread_mutex_destroy(&s->lock);
    free(s->source);
    free(s->bucket);
    free(s->key);
    free(s->url);
    free(s->userpwd);
    free(s->sigv4);
    free(s->token_header);
    free(s);
}

const char *sfs_s3_bucket(const sfs_s3_t *s) { return s->bucket; }
const char *sfs_s3_key(const sfs_s3_t *s) { return s->key; }

void sfs_s3_expect(sfs_s3_t *s, const char *etag)
{
    pthread_mutex_lock(&s->lock);
    snprintf(s->etag, sizeof(s->etag), "%s", etag);
    pthread_mutex_unlock(&s->lock);
}

const char *sfs_s3_error(sfs_s3_t *s) { return s->error; }

static void set_error(sfs_s3_t *s, const char *fmt, const char *what, long code)
{
    pthread_mutex_lock(&s->lock);
    snprintf(s->error, sizeof(s->error), fmt, s->source, what, code);
    pthread_mutex_unlock(&s->lock);
}

/* ---------------------------------------------------------------- requests */

typedef struct {
    uint8_t *buf;
    size_t cap, len;
    char etag[SFS_S3_ETAG_MAX];
    struct curl_slist *headers;
    int done;
    uint64_t skip; /* body bytes to drop first: the range's offset when the server sent it all (200) */
    uint64_t off;  /* the range's first byte */
} transfer_t;

static size_t on_body(char *data, size_t one, size_t n, void *arg)
{
    transfer_t *t = arg;
    size_t all = n;
    if (t->skip) { /* a whole object for a range: its bytes before the range dropped */
        size_t drop = n < t->skip ? n : (size_t)t->skip;
        t->skip -= drop;
        data += drop;
        n -= drop;
    }
    size_t take = n < t->cap - t->len ? n : t->cap - t->len;
    if (take)
        memcpy(t->buf + t->len, data, take);
    t->len += take;
    return all; /* more than asked (a server ignoring Range): dropped */
}

static size_t on_header(char *data, size_t one, size_t n, void *arg)
{
    transfer_t *t = arg;
    if (n > 12 && !strncmp(data, "HTTP/", 5)) { /* a status line: 200 to a range is the whole object */
        const char *sp = memchr(data, ' ', n);
        t->skip = sp && atoi(sp + 1) == 200 ? t->off : 0;
        t->len = 0;
    } else if (n > 5 && !strncasecmp(data, "ETag:", 5)) {
        const char *v = data + 5;
        size_t len = n - 5;
        while (len && (*v == ' ' || *v == '\t'))
            v++, len--;
        while (len && (v[len - 1] == '\r' || v[len - 1] == '\n' || v[len - 1] == ' '))
            len--;
        if (len < sizeof(t->etag)) {
            memcpy(t->etag, v, len);
            t->etag[len] = 0;
        }
    }
    return n;
}

static CURL *take(sfs_s3_t *s)
{
    pthread_mutex_lock(&s->lock);
    if (s->pid != getpid()) {
        /* a child of the process that made them (a mount's workers are
         * forked after the shards are opened): their kept-alive sockets
         * are the parent's too, and two processes talking on one socket
         * would read each other's answers. Closed here (the parent's
         * descriptors stay open), never used. */
        for (int i = 0; i < s->nidle; i++)
            curl_easy_cleanup(s->idle[i]);
        s->nidle = 0;
        s->pid = getpid();
    }
    CURL *c = s->nidle ? s->idle[--s->nidle] : NULL;
    pthread_mutex_unlock(&s->lock);
    if (!c)
        c = curl_easy_init();
    return c;
}

static void give(sfs_s3_t *s, CURL *c)
{
    pthread_mutex_lock(&s->lock);
    if (s->nidle < POOL_MAX) {
        s->idle[s->nidle++] = c;
        c = NULL;
    }
    pthread_mutex_unlock(&s->lock);
    if (c)
        curl_easy_cleanup(c);
}

/* Set up handle c for a GET of [off, off + len) (len 0: a HEAD) into t. */
static int prepare(sfs_s3_t *s, CURL *c, transfer_t *t, uint64_t off, size_t len)
{
    char range[64], match[SFS_S3_ETAG_MAX + 16];
    curl_easy_reset(c);
    t->headers = NULL;
    t->off = off;
    pthread_mutex_lock(&s->lock);
    int expect = s->etag[0] != 0;
    if (expect)
        snprintf(match, sizeof(match), "If-Match: %s", s->etag);
    pthread_mutex_unlock(&s->lock);
    if (expect)
        t->headers = curl_slist_append(t->headers, match);
    if (s->token_header)
        t->headers = curl_slist_append(t->headers, s->token_header);
    if (s->userpwd) /* signed with the empty body's SHA-256 (radosgw refuses a signature without it) */
        t->headers = curl_slist_append(
            t->headers, "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    curl_easy_setopt(c, CURLOPT_URL, s->url);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, s->timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, s->timeout_ms);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, t);
    if (s->userpwd) {
        curl_easy_setopt(c, CURLOPT_USERPWD, s->userpwd);
        curl_easy_setopt(c, CURLOPT_AWS_SIGV4, s->sigv4);
    }
    if (len == 0) {
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else {
        snprintf(range, sizeof(range), "%llu-%llu", (unsigned long long)off, (unsigned long long)(off + len - 1));
        curl_easy_setopt(c, CURLOPT_RANGE, range);
    }
    if (t->headers)
        curl_easy_setopt(c, CURLOPT_HTTPHEADER, t->headers);
    return 0;
}

/* The result of a finished transfer: bytes (>= 0) or -errno. */
static int64_t finish(sfs_s3_t *s, CURL *c, transfer_t *t, CURLcode rc, int head)
{
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_slist_free_all(t->headers);
    t->headers = NULL;
    t->done = 1;
    if (rc != CURLE_OK) {
        set_error(s, "%s: %s (HTTP %ld)", curl_easy_strerror(rc), code);
        return rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : rc == CURLE_COULDNT_CONNECT ? -ECONNREFUSED : -EIO;
    }
    if (code == 200 || code == 206)
        return head ? 0 : (int64_t)t->len;
    if (code == 416)
        return 0; /* past the end */
    set_error(s, "%s: the server answered %sHTTP %ld", code == 412 ? "(replaced under its key) " : "", code);
    return code == 404 ? -ENOENT : code == 403 ? -EACCES : code == 412 ? -ESTALE : -EIO;
}

int sfs_s3_head(sfs_s3_t *s, uint64_t *size, char etag[SFS_S3_ETAG_MAX], sfs_error_t *err)
{
    CURL *c = take(s);
    if (!c)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "%s: out of memory", s->source);
    transfer_t t = {0};
    prepare(s, c, &t, 0, 0);
    CURLcode rc = curl_easy_perform(c);
    int64_t got = finish(s, c, &t, rc, 1);
    curl_off_t length = -1;
    curl_easy_getinfo(c, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &length);
    give(s, c);
    if (got < 0)
        return sfs_fail(err, SFS_EIO, (int)-got, "%s", s->error);
    if (length < 0 || !t.etag[0])
        return sfs_fail(err, SFS_EIO, EIO, "%s: the server gave no %s", s->source, length < 0 ? "size" : "ETag");
    *size = (uint64_t)length;
    memcpy(etag, t.etag, SFS_S3_ETAG_MAX);
    return SFS_OK;
}

int64_t sfs_s3_pread(sfs_s3_t *s, void *buf, size_t len, uint64_t off)
{
    if (len == 0)
        return 0;
    CURL *c = take(s);
    if (!c)
        return -ENOMEM;
    transfer_t t = {.buf = buf, .cap = len};
    prepare(s, c, &t, off, len);
    int64_t got = finish(s, c, &t, curl_easy_perform(c), 0);
    give(s, c);
    return got;
}

int sfs_s3_pread_many(sfs_s3_t *s, size_t n, const uint64_t *offs, const size_t *lens, void *const *bufs,
                      int64_t *got)
{
    enum { FLIGHT = 32 }; /* GETs in flight at once */
    CURLM *multi = curl_multi_init();
    if (!multi)
        return -ENOMEM;
    for (size_t base = 0; base < n; base += FLIGHT) {
        size_t k = n - base < FLIGHT ? n - base : FLIGHT;
        CURL *handles[FLIGHT];
        transfer_t t[FLIGHT];
        for (size_t i = 0; i < k; i++) {
            handles[i] = NULL;
            got[base + i] = 0;
            if (!lens[base + i])
                continue;
            if (!(handles[i] = take(s))) {
                got[base + i] = -ENOMEM;
                continue;
            }
            t[i] = (transfer_t){.buf = bufs[base + i], .cap = lens[base + i]};
            prepare(s, handles[i], &t[i], offs[base + i], lens[base + i]);
            curl_easy_setopt(handles[i], CURLOPT_PRIVATE, (char *)&t[i]);
            curl_multi_add_handle(multi, handles[i]);
        }
        int running = 1;
        while (running) {
            if (curl_multi_perform(multi, &running) != CURLM_OK)
                break;
            if (running)
                curl_multi_poll(multi, NULL, 0, 1000, NULL);
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(multi, &left)))
            if (msg->msg == CURLMSG_DONE)
                for (size_t i = 0; i < k; i++)
                    if (handles[i] == msg->easy_handle)
                        got[base + i] = finish(s, handles[i], &t[i], msg->data.result, 0);
        for (size_t i = 0; i < k; i++)
            if (handles[i]) {
                curl_multi_remove_handle(multi, handles[i]);
                if (!t[i].done) { /* never finished */
                    curl_slist_free_all(t[i].headers);
                    got[base + i] = -EIO;
                }
                give(s, handles[i]);
            }
    }
    curl_multi_cleanup(multi);
    return 0;
}

/* `in` with every byte outside [A-Za-z0-9._-] written %XX, into out. */
static int name_part(const char *in, char *out, size_t cap)
{
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)in; *p; p++) {
        int plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
                    *p == '.' || *p == '_' || *p == '-';
        if (n + 4 >= cap)
            return -1;
        n += (size_t)(plain ? snprintf(out + n, cap - n, "%c", *p) : snprintf(out + n, cap - n, "%%%02X", *p));
    }
    out[n] = 0;
    return 0;
}

int sfs_s3_copy_path(const sfs_s3_t *s, const char *cache, const char *etag, uint64_t size, const char *suffix,
                     char *out, size_t cap, sfs_error_t *err)
{
    char bucket[600], key[1500], tag[400];
    if (name_part(s->bucket, bucket, sizeof(bucket)) < 0 || name_part(s->key, key, sizeof(key)) < 0 ||
        name_part(etag, tag, sizeof(tag)) < 0 ||
        (size_t)snprintf(out, cap, "%s/s3/%s/%s.%s-%llu.%s", cache, bucket, key, tag, (unsigned long long)size,
                         suffix) >= cap)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: its name is too long for a local copy's path", s->source);
    return SFS_OK;
}

int sfs_s3_open_object(const char *source, sfs_s3_t **out, uint64_t *size, char etag[SFS_S3_ETAG_MAX],
                       const char **cache, sfs_error_t *err)
{
    int rc = sfs_s3_new(source, out, err);
    if (rc != SFS_OK)
        return rc;
    if (!(*cache = sfs_s3_cache_dir()))
        return sfs_fail(err, SFS_EINVAL, 0, "%s: no cache directory for its local copy", source);
    if ((rc = sfs_s3_head(*out, size, etag, err)) != SFS_OK)
        return rc;
    sfs_s3_expect(*out, etag);
    return SFS_OK;
}

static int64_t ops_pread(void *conn, void *buf, size_t len, uint64_t off) { return sfs_s3_pread(conn, buf, len, off); }

static int ops_pread_many(void *conn, size_t n, const uint64_t *offs, const size_t *lens, void *const *bufs,
                          int64_t *got)
{
    return sfs_s3_pread_many(conn, n, offs, lens, bufs, got);
}

const sfs_remote_ops_t sfs_s3_ops = {ops_pread, ops_pread_many};
