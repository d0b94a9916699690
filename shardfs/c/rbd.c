/*
 * rbd.c — librbd access for rbd: shard sources (see rbd.h). One librados
 * client per process (remade after fork), an I/O context per pool, a
 * lazily opened read-only image per handle.
 */
#define _GNU_SOURCE
#include "rbd.h"
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef SFS_HAVE_RBD
#include <dlfcn.h>
#include <rados/librados.h>
#include <rbd/librbd.h>

/* librados and librbd are loaded (dlopen) at the first use of an rbd:
 * source, not with the extension: loading them costs ~46 ms and ~19 MB of
 * resident memory (measured here), which every shardfs process would pay
 * otherwise. Each function below is called through its pointer. */
#define LIBRBD_FUNCTIONS(X)                                                                        \
    X(rados, rados_create) X(rados, rados_conf_read_file) X(rados, rados_conf_parse_env)           \
    X(rados, rados_conf_set) X(rados, rados_connect) X(rados, rados_shutdown)                      \
    X(rados, rados_ioctx_create) X(rbd, rbd_open_read_only) X(rbd, rbd_close) X(rbd, rbd_get_size) \
    X(rbd, rbd_read) X(rbd, rbd_aio_create_completion) X(rbd, rbd_aio_read)                        \
    X(rbd, rbd_aio_wait_for_complete) X(rbd, rbd_aio_get_return_value) X(rbd, rbd_aio_release)     \
    X(rbd, rbd_aio_is_complete) X(rbd, rbd_list2) X(rbd, rbd_image_spec_list_cleanup)

static struct {
#define FIELD(lib, name) __typeof__(&name) name;
    LIBRBD_FUNCTIONS(FIELD)
#undef FIELD
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static char lib_error[256]; /* "" once loaded */

static void load_libraries(void)
{
    void *rados = dlopen("librados.so.2", RTLD_NOW | RTLD_LOCAL);
    void *rbd = rados ? dlopen("librbd.so.1", RTLD_NOW | RTLD_LOCAL) : NULL;
    if (!rados || !rbd) {
        snprintf(lib_error, sizeof(lib_error), "cannot load %s (install librbd1): %s",
                 rados ? "librbd.so.1" : "librados.so.2", dlerror());
        return;
    }
#define LOAD(which, name)                                                                          \
    if (!(lib.name = (__typeof__(lib.name))dlsym(which, #name))) {                                \
        snprintf(lib_error, sizeof(lib_error), "%s: no symbol %s", #which, #name);                 \
        return;                                                                                    \
    }
    LIBRBD_FUNCTIONS(LOAD)
#undef LOAD
}

/* Load librados and librbd once: SFS_OK, or SFS_EIO naming what is missing. */
static int need_libraries(const char *name, sfs_error_t *err)
{
    pthread_once(&lib_once, load_libraries);
    return lib_error[0] ? sfs_fail(err, SFS_EIO, ENOSYS, "rbd:%s: %s", name, lib_error) : SFS_OK;
}

#define rados_create lib.rados_create
#define rados_conf_read_file lib.rados_conf_read_file
#define rados_conf_parse_env lib.rados_conf_parse_env
#define rados_conf_set lib.rados_conf_set
#define rados_connect lib.rados_connect
#define rados_shutdown lib.rados_shutdown
#define rados_ioctx_create lib.rados_ioctx_create
#define rbd_open_read_only lib.rbd_open_read_only
#define rbd_close lib.rbd_close
#define rbd_get_size lib.rbd_get_size
#define rbd_read lib.rbd_read
#define rbd_aio_create_completion lib.rbd_aio_create_completion
#define rbd_aio_read lib.rbd_aio_read
#define rbd_aio_wait_for_complete lib.rbd_aio_wait_for_complete
#define rbd_aio_get_return_value lib.rbd_aio_get_return_value
#define rbd_aio_release lib.rbd_aio_release
#define rbd_aio_is_complete lib.rbd_aio_is_complete
#define rbd_list2 lib.rbd_list2
#define rbd_image_spec_list_cleanup lib.rbd_image_spec_list_cleanup
#endif

#define MISSING "this shardfs was built without librbd: install librbd-dev (Debian) and reinstall shardfs"

static pthread_mutex_t config_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char *conf, *id, *cache_dir;
    unsigned timeout;
    int isolate;
} config = {NULL, NULL, NULL, SFS_RBD_DEFAULT_TIMEOUT, 0};

int sfs_rbd_built(void)
{
#ifdef SFS_HAVE_RBD
    return 1;
#else
    return 0;
#endif
}

static int replace(char **slot, const char *value)
{
    char *copy = NULL;
    if (value && !(copy = strdup(value)))
        return -1;
    free(*slot);
    *slot = copy;
    return 0;
}

#ifdef SFS_HAVE_RBD
static void set_max_images(size_t n);
#endif

int sfs_rbd_configure(const char *conf, const char *id, const char *cache_dir, unsigned timeout,
                      int isolate, size_t max_images, sfs_error_t *err)
{
#ifdef SFS_HAVE_RBD
    set_max_images(max_images ? max_images : SFS_RBD_MAX_IMAGES);
#endif
    pthread_mutex_lock(&config_lock);
    int bad = replace(&config.conf, conf) | replace(&config.id, id) |
              replace(&config.cache_dir, cache_dir);
    config.timeout = timeout ? timeout : SFS_RBD_DEFAULT_TIMEOUT;
    config.isolate = isolate;
    pthread_mutex_unlock(&config_lock);
    return bad ? sfs_fail(err, SFS_ENOMEM, ENOMEM, "rbd: out of memory") : SFS_OK;
}

const char *sfs_rbd_cache_dir(void) { return config.cache_dir; }

int sfs_is_rbd_source(const char *source)
{
    return strncmp(source, SFS_RBD_PREFIX, sizeof(SFS_RBD_PREFIX) - 1) == 0;
}

int sfs_rbd_parse(const char *source, char pool[SFS_RBD_NAME_MAX], char image[SFS_RBD_NAME_MAX],
                  sfs_error_t *err)
{
    const char *spec = source + sizeof(SFS_RBD_PREFIX) - 1;
    const char *slash = sfs_is_rbd_source(source) ? strchr(spec, '/') : NULL;
    if (!slash || slash == spec || !slash[1] || strchr(slash + 1, '/') || strchr(spec, '@') ||
        (size_t)(slash - spec) >= SFS_RBD_NAME_MAX || strlen(slash + 1) >= SFS_RBD_NAME_MAX)
        return sfs_fail(err, SFS_EINVAL, 0, "%s: not an RBD source: expected rbd:POOL/IMAGE", source);
    memcpy(pool, spec, (size_t)(slash - spec));
    pool[slash - spec] = 0;
    strcpy(image, slash + 1);
    return SFS_OK;
}

/* Run fn in a child (isolate) or here. The child sends its sfs_error_t,
 * then an optional block (list). */
typedef struct {
    int (*fn)(void *arg, sfs_error_t *err);
    void *arg;
    char **blob;
    size_t *blob_size;
} job_t;

static int write_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read up to n bytes from a pipe: the bytes read (fewer at its end). */
static size_t read_all(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)p + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    return got;
}

static int run_job(job_t *job, sfs_error_t *err)
{
    if (!config.isolate)
        return job->fn(job->arg, err);
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) < 0)
        return sfs_fail(err, SFS_EIO, errno, "rbd: pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return sfs_fail(err, SFS_EIO, errno, "rbd: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        close(fds[0]);
        sfs_error_t e = {0};
        e.status = job->fn(job->arg, &e);
        uint64_t n = job->blob && e.status == SFS_OK ? *job->blob_size : 0;
        if (write_all(fds[1], &e, sizeof(e)) == 0 && write_all(fds[1], &n, sizeof(n)) == 0 && n)
            write_all(fds[1], *job->blob, (size_t)n);
        _exit(0); /* no atexit handlers, no librados shutdown: the process ends */
    }
    close(fds[1]);
    sfs_error_t e;
    uint64_t n = 0;
    char *block = NULL;
    int rc;
    if (read_all(fds[0], &e, sizeof(e)) != sizeof(e)) {
        rc = sfs_fail(err, SFS_EIO, EIO, "rbd: the helper process died before answering");
    } else {
        rc = e.status;
        if (err)
            *err = e;
        if (rc == SFS_OK && job->blob) {
            if (read_all(fds[0], &n, sizeof(n)) != sizeof(n) || !(block = malloc(n ? n : 1)) ||
                read_all(fds[0], block, (size_t)n) != (size_t)n) {
                free(block);
                rc = sfs_fail(err, SFS_EIO, EIO, "rbd: the helper process's answer was cut short");
            } else {
                *job->blob = block;
                *job->blob_size = n;
            }
        }
    }
    close(fds[0]);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return rc;
}

int sfs_rbd_isolated(int (*fn)(void *arg, sfs_error_t *err), void *arg, sfs_error_t *err)
{
    job_t job = {fn, arg, NULL, NULL};
    return run_job(&job, err);
}

#ifndef SFS_HAVE_RBD

struct sfs_rbd {
    int unused;
};

int sfs_rbd_new(const char *pool, const char *image, const uint8_t *expect, size_t expect_len,
                sfs_rbd_t **out, sfs_error_t *err)
{
    *out = NULL;
    return sfs_fail(err, SFS_EINVAL, 0, "rbd:%s/%s: " MISSING, pool, image);
}

int sfs_rbd_connect(sfs_rbd_t *r, uint64_t *size, sfs_error_t *err)
{
    return sfs_fail(err, SFS_EINVAL, 0, "rbd: " MISSING);
}

int64_t sfs_rbd_pread(sfs_rbd_t *r, void *buf, size_t len, uint64_t off) { return -ENOSYS; }

int sfs_rbd_pread_many(sfs_rbd_t *r, size_t n, const uint64_t *offs, const size_t *lens,
                       void *const *bufs, int64_t *results)
{
    return -ENOSYS;
}

void sfs_rbd_prefetch(sfs_rbd_t *r, uint64_t off, size_t len) {}

size_t sfs_rbd_open_images(void) { return 0; }

const char *sfs_rbd_error(const sfs_rbd_t *r) { return MISSING; }

void sfs_rbd_close(sfs_rbd_t *r) { free(r); }

int sfs_rbd_list(const char *pool, char **names, size_t *size, sfs_error_t *err)
{
    *names = NULL;
    *size = 0;
    return sfs_fail(err, SFS_EINVAL, 0, "rbd:%s: " MISSING, pool);
}

#else

/* ------------------------------------------------------------ the client */

typedef struct pool_io {
    struct pool_io *next;
    char name[SFS_RBD_NAME_MAX];
    rados_ioctx_t io;
} pool_io_t;

static pthread_mutex_t client_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    pid_t pid;        /* the process that made `cluster`; 0 = none */
    rados_t cluster;
    pool_io_t *pools;
    int error;        /* errno of the last failed connection */
} client;

static int client_error(sfs_error_t *err, int e, const char *what, const char *name)
{
    const char *why = e == ETIMEDOUT ? "the cluster did not answer in time (timeout)"
                      : e == EACCES || e == EPERM ? "the client was refused (check ceph_id and its key)"
                      : e == ENOENT && !strcmp(what, "reading the configuration") ? "no such file"
                      : strerror(e);
    return sfs_fail(err, SFS_EIO, e, "%s%s: %s: %s", SFS_RBD_PREFIX, name, what, why);
}

/* The I/O context of `pool` in this process, connecting first. Called with
 * client_lock held. */
static int pool_io(const char *pool, rados_ioctx_t *io, sfs_error_t *err)
{
    int loaded = need_libraries(pool, err);
    if (loaded != SFS_OK)
        return loaded;
    pid_t self = getpid();
    if (client.pid != self) {
        /* none yet, or inherited through fork(): the parent's threads are
         * gone, so its handles are dropped (not shut down) */
        client.pid = 0;
        client.pools = NULL;
        pthread_mutex_lock(&config_lock);
        char timeout[16];
        snprintf(timeout, sizeof(timeout), "%u", config.timeout);
        rados_t c = NULL;
        int rc = rados_create(&c, config.id);
        if (rc == 0 && config.conf)
            rc = rados_conf_read_file(c, config.conf);
        else if (rc == 0)
            rados_conf_read_file(c, NULL); /* the default search; none found is fine when
                                            * $CEPH_ARGS or the environment gives mon_host */
        pthread_mutex_unlock(&config_lock);
        if (rc < 0) {
            if (c)
                rados_shutdown(c);
            return client_error(err, -rc, "reading the configuration", pool);
        }
        rados_conf_parse_env(c, NULL);
        static const char *const options[] = {"rados_osd_op_timeout", "rados_mon_op_timeout",
                                              "client_mount_timeout"};
        for (size_t i = 0; i < sizeof(options) / sizeof(*options); i++)
            rados_conf_set(c, options[i], timeout);
        /* the kernel's page cache (through the mount) is the cache: no
         * per-image cache of librbd's own (32 MiB each by default) */
        rados_conf_set(c, "rbd_cache", "false");
        rados_conf_set(c, "admin_socket", "");
        rados_conf_set(c, "log_to_stderr", "false");
        rados_conf_set(c, "err_to_stderr", "false");
        if ((rc = rados_connect(c)) < 0) {
            rados_shutdown(c);
            return client_error(err, -rc, "connecting to the cluster", pool);
        }
        client.cluster = c;
        client.pid = self;
    }
    for (pool_io_t *p = client.pools; p; p = p->next)
        if (!strcmp(p->name, pool)) {
            *io = p->io;
            return SFS_OK;
        }
    pool_io_t *p = calloc(1, sizeof(*p));
    if (!p)
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "rbd:%s: out of memory", pool);
    snprintf(p->name, sizeof(p->name), "%s", pool);
    int rc = rados_ioctx_create(client.cluster, pool, &p->io);
    if (rc < 0) {
        free(p);
        if (rc == -ENOENT)
            return sfs_fail(err, SFS_EIO, ENOENT, "rbd:%s: no such pool", pool);
        return client_error(err, -rc, "opening the pool", pool);
    }
    p->next = client.pools;
    client.pools = p;
    *io = p->io;
    return SFS_OK;
}

/* ------------------------------------------------------------ an image */

/* A read started ahead (sfs_rbd_prefetch), kept until a read within its
 * range takes it, or until evicted once complete. */
typedef struct {
    uint64_t off;
    size_t len;       /* 0: the entry is free */
    char *buf;
    rbd_completion_t done;
    uint64_t stamp;   /* for eviction: the oldest complete one goes first */
} ahead_t;

struct sfs_rbd {
    char pool[SFS_RBD_NAME_MAX], image[SFS_RBD_NAME_MAX];
    uint8_t *expect;
    size_t expect_len;
    pthread_mutex_t lock;
    pid_t pid;        /* the process `img` was opened in; 0 = not open */
    rbd_image_t img;
    uint64_t size;
    char error[512];
    pthread_mutex_t ahead_lock;
    ahead_t ahead[SFS_RBD_AHEAD];
    uint64_t ahead_clock;
    /* the process's open images, most recently used first (handles) */
    sfs_rbd_t *prev, *next;
    int listed;       /* in the list (its image open) */
    int users;        /* reads using the image now: never closed then */
    int closing;      /* chosen to be closed (handles.max reached) */
};

/* Open images of this process, at most `max` (beyond, the least recently
 * used one nobody reads is closed: ~330 KiB of librbd state each). All
 * fields, and each image's pid, listed, users and closing, under `lock`. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t idle;  /* an image's users fell to 0 */
    pid_t pid;            /* the process the list belongs to */
    sfs_rbd_t *head, *tail;
    size_t open, max;
} handles = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, NULL, NULL, 0, SFS_RBD_MAX_IMAGES};

static void set_max_images(size_t n)
{
    pthread_mutex_lock(&handles.lock);
    handles.max = n;
    pthread_mutex_unlock(&handles.lock);
}

size_t sfs_rbd_open_images(void)
{
    pthread_mutex_lock(&handles.lock);
    size_t n = handles.pid == getpid() ? handles.open : 0;
    pthread_mutex_unlock(&handles.lock);
    return n;
}

/* handles.lock held: the list of this process (one from before fork() is
 * forgotten: its images are not open here). */
static void handles_here(void)
{
    pid_t self = getpid();
    if (handles.pid == self)
        return;
    for (sfs_rbd_t *r = handles.head, *next; r; r = next) {
        next = r->next;
        r->prev = r->next = NULL;
        r->listed = r->users = r->closing = 0;
    }
    handles.head = handles.tail = NULL;
    handles.open = 0;
    handles.pid = self;
}

static void unlink_handle(sfs_rbd_t *r)
{
    if (!r->listed)
        return;
    if (r->prev)
        r->prev->next = r->next;
    else
        handles.head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        handles.tail = r->prev;
    r->prev = r->next = NULL;
    r->listed = 0;
    handles.open--;
}

static void push_handle(sfs_rbd_t *r)
{
    r->prev = NULL;
    r->next = handles.head;
    if (handles.head)
        handles.head->prev = r;
    handles.head = r;
    if (!handles.tail)
        handles.tail = r;
    r->listed = 1;
    handles.open++;
}

/* One user fewer (handles.lock held). */
static void unuse(sfs_rbd_t *r)
{
    if (r->users > 0 && --r->users == 0)
        pthread_cond_broadcast(&handles.idle);
}

static void release(sfs_rbd_t *r)
{
    pthread_mutex_lock(&handles.lock);
    unuse(r);
    pthread_mutex_unlock(&handles.lock);
}

/* Wait for r's reads ahead and free them (r->lock held). */
static void drain_ahead(sfs_rbd_t *r)
{
    pthread_mutex_lock(&r->ahead_lock);
    for (int i = 0; i < SFS_RBD_AHEAD; i++)
        if (r->ahead[i].len) { /* librbd writes into the buffer until done */
            rbd_aio_wait_for_complete(r->ahead[i].done);
            rbd_aio_release(r->ahead[i].done);
            free(r->ahead[i].buf);
            r->ahead[i].len = 0;
        }
    pthread_mutex_unlock(&r->ahead_lock);
}

/* Close r's image if it was chosen to be (r->lock held). */
static void close_if_chosen(sfs_rbd_t *r)
{
    pthread_mutex_lock(&handles.lock);
    int chosen = r->closing && r->pid == handles.pid;
    r->closing = 0;
    if (chosen)
        r->pid = 0;
    pthread_mutex_unlock(&handles.lock);
    if (chosen) {
        drain_ahead(r);
        rbd_close(r->img);
    }
}

int sfs_rbd_new(const char *pool, const char *image, const uint8_t *expect, size_t expect_len,
                sfs_rbd_t **out, sfs_error_t *err)
{
    sfs_rbd_t *r = calloc(1, sizeof(*r));
    if (!r || (expect_len && !(r->expect = malloc(expect_len)))) {
        free(r);
        *out = NULL;
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "rbd:%s/%s: out of memory", pool, image);
    }
    snprintf(r->pool, sizeof(r->pool), "%s", pool);
    snprintf(r->image, sizeof(r->image), "%s", image);
    if (expect_len)
        memcpy(r->expect, expect, expect_len);
    r->expect_len = expect_len;
    pthread_mutex_init(&r->lock, NULL);
    pthread_mutex_init(&r->ahead_lock, NULL);
    *out = r;
    return SFS_OK;
}

/* Open the image in this process (r->lock held). */
static int open_image(sfs_rbd_t *r, sfs_error_t *err)
{
    pid_t self = getpid();
    close_if_chosen(r);
    pthread_mutex_lock(&handles.lock);
    handles_here();
    int here = r->pid == self;
    if (!here && r->pid) { /* a handle from before fork() is not used (nor closed) */
        r->pid = 0;
        memset(r->ahead, 0, sizeof(r->ahead)); /* nor its reads ahead (buffers leaked) */
    }
    pthread_mutex_unlock(&handles.lock);
    if (here)
        return SFS_OK;
    rados_ioctx_t io;
    pthread_mutex_lock(&client_lock);
    int rc = pool_io(r->pool, &io, err);
    pthread_mutex_unlock(&client_lock);
    if (rc != SFS_OK)
        return rc;
    char name[2 * SFS_RBD_NAME_MAX + 8];
    snprintf(name, sizeof(name), "%s/%s", r->pool, r->image);
    rbd_image_t img;
    int e = rbd_open_read_only(io, r->image, &img, NULL);
    if (e < 0)
        return e == -ENOENT ? sfs_fail(err, SFS_EIO, ENOENT, "rbd:%s: no such image", name)
                            : client_error(err, -e, "opening the image", name);
    uint64_t size = 0;
    if ((e = rbd_get_size(img, &size)) < 0) {
        rbd_close(img);
        return client_error(err, -e, "reading the image's size", name);
    }
    if (r->expect_len) {
        uint8_t *head = malloc(r->expect_len);
        ssize_t got = head ? rbd_read(img, 0, r->expect_len, (char *)head) : -ENOMEM;
        int same = got == (ssize_t)r->expect_len && !memcmp(head, r->expect, r->expect_len);
        free(head);
        if (!same) {
            rbd_close(img);
            if (got < 0)
                return client_error(err, (int)-got, "reading the header", name);
            return sfs_fail(err, SFS_EIO, ESTALE,
                            "rbd:%s: the image no longer holds the shard of its local copy "
                            "(its header changed): remove the copy from the cache directory",
                            name);
        }
    }
    r->img = img;
    r->size = size;
    r->error[0] = 0;
    pthread_mutex_lock(&handles.lock);
    r->pid = self;
    pthread_mutex_unlock(&handles.lock);
    return SFS_OK;
}

int sfs_rbd_connect(sfs_rbd_t *r, uint64_t *size, sfs_error_t *err)
{
    pthread_mutex_lock(&r->lock);
    int rc = open_image(r, err);
    if (rc == SFS_OK && size)
        *size = r->size;
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static void prefetch_in(sfs_rbd_t *r, rbd_image_t img, uint64_t off, size_t len);

/* Images chosen to be closed by one ready() at most. */
#define CLOSE_BATCH 8

/* The image opened in this process and in use by the caller (release()
 * it), or NULL (errno-like code in *e). Opening one beyond handles.max
 * closes the least recently used ones nobody reads. */
static rbd_image_t ready(sfs_rbd_t *r, int *e)
{
    pthread_mutex_lock(&handles.lock);
    handles_here();
    if (r->pid == handles.pid && r->listed && !r->closing) {
        r->users++;
        if (handles.head != r) { /* most recently used first */
            unlink_handle(r);
            push_handle(r);
        }
        pthread_mutex_unlock(&handles.lock);
        return r->img;
    }
    pthread_mutex_unlock(&handles.lock);
    pthread_mutex_lock(&r->lock);
    sfs_error_t err;
    int rc = open_image(r, &err);
    sfs_rbd_t *victims[CLOSE_BATCH];
    size_t nv = 0;
    rbd_image_t img = NULL;
    if (rc != SFS_OK) {
        snprintf(r->error, sizeof(r->error), "%s", err.message);
        *e = err.sys_errno ? err.sys_errno : EIO;
    } else {
        img = r->img;
        pthread_mutex_lock(&handles.lock);
        r->users++;
        if (!r->listed)
            push_handle(r);
        size_t excess = handles.open > handles.max ? handles.open - handles.max : 0;
        for (sfs_rbd_t *v = handles.tail; v && nv < excess && nv < CLOSE_BATCH; v = v->prev)
            if (v != r && !v->users && !v->closing) {
                v->closing = 1;
                v->users++; /* held until closed: sfs_rbd_close waits */
                victims[nv++] = v;
            }
        for (size_t i = 0; i < nv; i++)
            unlink_handle(victims[i]);
        pthread_mutex_unlock(&handles.lock);
    }
    pthread_mutex_unlock(&r->lock);
    for (size_t i = 0; i < nv; i++) {
        pthread_mutex_lock(&victims[i]->lock);
        close_if_chosen(victims[i]);
        pthread_mutex_unlock(&victims[i]->lock);
        release(victims[i]);
    }
    return img;
}

void sfs_rbd_prefetch(sfs_rbd_t *r, uint64_t off, size_t len)
{
    int e;
    rbd_image_t img = ready(r, &e);
    if (!img)
        return;
    if (len && off < r->size)
        prefetch_in(r, img, off, len);
    release(r);
}

/* sfs_rbd_prefetch on the image `img` in use. */
static void prefetch_in(sfs_rbd_t *r, rbd_image_t img, uint64_t off, size_t len)
{
    if (len > SFS_RBD_AHEAD_MAX)
        len = SFS_RBD_AHEAD_MAX;
    if (len > r->size - off)
        len = (size_t)(r->size - off);
    pthread_mutex_lock(&r->ahead_lock);
    ahead_t *slot = NULL;
    for (int i = 0; i < SFS_RBD_AHEAD; i++) {
        ahead_t *a = &r->ahead[i];
        if (a->len && a->off <= off && off + len <= a->off + a->len)
            goto out; /* asked already */
        if (!a->len) {
            if (!slot || slot->len)
                slot = a;
        } else if ((!slot || (slot->len && a->stamp < slot->stamp)) && rbd_aio_is_complete(a->done)) {
            slot = a; /* the oldest complete read nobody took */
        }
    }
    if (!slot)
        goto out; /* every entry in flight: this one is read when asked */
    if (slot->len) {
        rbd_aio_release(slot->done);
        free(slot->buf);
        slot->len = 0;
    }
    if (!(slot->buf = malloc(len)))
        goto out;
    if (rbd_aio_create_completion(NULL, NULL, &slot->done) < 0) {
        free(slot->buf);
        goto out;
    }
    if (rbd_aio_read(img, off, len, slot->buf, slot->done) < 0) {
        rbd_aio_release(slot->done);
        free(slot->buf);
        goto out;
    }
    slot->off = off;
    slot->len = len;
    slot->stamp = ++r->ahead_clock;
out:
    pthread_mutex_unlock(&r->ahead_lock);
}

/* Take the read ahead covering [off, off + len): its bytes copied to buf
 * once complete. 1 when it answered (*got: bytes or -errno), else 0. */
static int take_ahead(sfs_rbd_t *r, void *buf, size_t len, uint64_t off, int64_t *got)
{
    ahead_t a = {0};
    pthread_mutex_lock(&r->ahead_lock);
    for (int i = 0; i < SFS_RBD_AHEAD; i++) {
        ahead_t *x = &r->ahead[i];
        if (x->len && x->off <= off && off + len <= x->off + x->len) {
            a = *x;
            x->len = 0;
            break;
        }
    }
    pthread_mutex_unlock(&r->ahead_lock);
    if (!a.len)
        return 0;
    rbd_aio_wait_for_complete(a.done);
    ssize_t n = rbd_aio_get_return_value(a.done);
    rbd_aio_release(a.done);
    if (n >= 0 && (size_t)n >= off - a.off + len)
        memcpy(buf, a.buf + (off - a.off), len);
    free(a.buf);
    if (n < 0) {
        *got = n;
        return 1;
    }
    if ((size_t)n < off - a.off + len)
        return 0; /* short: read it again below */
    *got = (int64_t)len;
    return 1;
}

/* sfs_rbd_pread on the image `img` in use. */
static int64_t pread_in(sfs_rbd_t *r, rbd_image_t img, void *buf, size_t len, uint64_t off)
{
    if (off >= r->size) /* librbd refuses reads past the end (EINVAL) */
        return 0;
    if (len > r->size - off)
        len = (size_t)(r->size - off);
    int64_t got;
    if (take_ahead(r, buf, len, off, &got))
        return got;
    size_t done = 0;
    while (done < len) {
        ssize_t n = rbd_read(img, off + done, len - done, (char *)buf + done);
        if (n < 0)
            return n;
        if (n == 0)
            break;
        done += (size_t)n;
    }
    return (int64_t)done;
}

int64_t sfs_rbd_pread(sfs_rbd_t *r, void *buf, size_t len, uint64_t off)
{
    int e = EIO;
    rbd_image_t img = ready(r, &e);
    if (!img)
        return -e;
    int64_t got = pread_in(r, img, buf, len, off);
    release(r);
    return got;
}

int sfs_rbd_pread_many(sfs_rbd_t *r, size_t n, const uint64_t *offs, const size_t *lens,
                       void *const *bufs, int64_t *results)
{
    int e = EIO;
    rbd_image_t img = ready(r, &e);
    if (!img)
        return -e;
    rbd_completion_t *c = calloc(n ? n : 1, sizeof(*c));
    if (!c) {
        release(r);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        results[i] = -EIO;
        if (offs[i] > r->size || lens[i] > r->size - offs[i]) {
            results[i] = -EINVAL; /* past the image's end */
            c[i] = NULL;
            continue;
        }
        if (rbd_aio_create_completion(NULL, NULL, &c[i]) < 0) {
            c[i] = NULL;
            continue;
        }
        int rc = rbd_aio_read(img, offs[i], lens[i], bufs[i], c[i]);
        if (rc < 0) {
            results[i] = rc;
            rbd_aio_release(c[i]);
            c[i] = NULL;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (!c[i])
            continue;
        rbd_aio_wait_for_complete(c[i]);
        results[i] = rbd_aio_get_return_value(c[i]);
        rbd_aio_release(c[i]);
    }
    free(c);
    release(r);
    return 0;
}

const char *sfs_rbd_error(const sfs_rbd_t *r) { return r->error; }

void sfs_rbd_close(sfs_rbd_t *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&handles.lock);
    handles_here();
    while (r->users) /* an image being closed by another thread's ready() */
        pthread_cond_wait(&handles.idle, &handles.lock);
    unlink_handle(r);
    int open_here = r->pid == handles.pid;
    r->pid = 0;
    pthread_mutex_unlock(&handles.lock);
    if (open_here) {
        drain_ahead(r);
        rbd_close(r->img);
    }
    pthread_mutex_destroy(&r->lock);
    pthread_mutex_destroy(&r->ahead_lock);
    free(r->expect);
    free(r);
}

/* ------------------------------------------------------------ listing */

typedef struct {
    const char *pool;
    char **names;
    size_t *size;
} list_t;

static int list_pool(void *arg, sfs_error_t *err)
{
    list_t *l = arg;
    rados_ioctx_t io;
    pthread_mutex_lock(&client_lock);
    int rc = pool_io(l->pool, &io, err);
    pthread_mutex_unlock(&client_lock);
    if (rc != SFS_OK)
        return rc;
    size_t max = 64, want = 0;
    rbd_image_spec_t *specs = NULL;
    int e;
    for (;;) {
        specs = calloc(max, sizeof(*specs));
        if (!specs)
            return sfs_fail(err, SFS_ENOMEM, ENOMEM, "rbd:%s: out of memory", l->pool);
        want = max;
        e = rbd_list2(io, specs, &want);
        if (e != -ERANGE)
            break;
        free(specs);
        max = want > max ? want : 2 * max;
    }
    if (e < 0) {
        free(specs);
        return client_error(err, -e, "listing the pool", l->pool);
    }
    size_t total = 0, n = want < max ? want : max; /* rbd_list2 sets the count */
    for (size_t i = 0; i < n; i++)
        total += strlen(specs[i].name) + 1;
    char *block = malloc(total ? total : 1), *at = block;
    if (!block) {
        rbd_image_spec_list_cleanup(specs, n);
        free(specs);
        return sfs_fail(err, SFS_ENOMEM, ENOMEM, "rbd:%s: out of memory", l->pool);
    }
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(specs[i].name) + 1;
        memcpy(at, specs[i].name, len);
        at += len;
    }
    rbd_image_spec_list_cleanup(specs, n);
    free(specs);
    *l->names = block;
    *l->size = total;
    return SFS_OK;
}

int sfs_rbd_list(const char *pool, char **names, size_t *size, sfs_error_t *err)
{
    *names = NULL;
    *size = 0;
    list_t l = {pool, names, size};
    job_t job = {list_pool, &l, names, size};
    return run_job(&job, err);
}

#endif
