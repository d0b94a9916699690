/* fuse_null: the floor of the kernel's FUSE transport. A low-level libfuse3
 * server that does no work: any 64-character name is a regular file of
 * FUSE_NULL_SIZE bytes (zeros) whose inode comes from the name's last 16
 * hex digits; OPEN of a file is answered ENOSYS (no-open mode, as shardfs),
 * IOCTL ENOTTY, READ with zeros. The serving CPU per object of this server
 * is what two FUSE round trips cost before any lookup or read is done.
 *
 * Usage: fuse_null [-s] MOUNTPOINT   (-s: one thread; default: libfuse's
 * multi-threaded loop, clone_fd, at most 4 threads). Unmount with
 * fusermount3 -u. Build: gcc -O2 fuse_null.c $(pkg-config --cflags --libs fuse3) */
#define FUSE_USE_VERSION 34
#include <fuse_lowlevel.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define FUSE_NULL_SIZE 1024
static char zeros[FUSE_NULL_SIZE];

static void fill(fuse_ino_t ino, struct stat *st)
{
    memset(st, 0, sizeof *st);
    st->st_ino = ino;
    st->st_nlink = 1;
    st->st_mode = ino == FUSE_ROOT_ID ? S_IFDIR | 0555 : S_IFREG | 0444;
    st->st_size = ino == FUSE_ROOT_ID ? 0 : FUSE_NULL_SIZE;
}

static void null_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    struct fuse_entry_param e;
    (void)parent;
    if (strlen(name) != 64) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    memset(&e, 0, sizeof e);
    e.ino = strtoull(name + 48, NULL, 16) | 2; /* never the root (1) */
    e.generation = 1;
    e.attr_timeout = e.entry_timeout = 3600;
    fill(e.ino, &e.attr);
    fuse_reply_entry(req, &e);
}

static void null_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    struct stat st;
    (void)fi;
    fill(ino, &st);
    fuse_reply_attr(req, &st, 3600);
}

static void null_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    if (ino == FUSE_ROOT_ID)
        fuse_reply_open(req, fi);
    else
        fuse_reply_err(req, ENOSYS);
}

static void null_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    (void)ino;
    (void)fi;
    if (off >= FUSE_NULL_SIZE)
        size = 0;
    else if (size > (size_t)(FUSE_NULL_SIZE - off))
        size = FUSE_NULL_SIZE - off;
    fuse_reply_buf(req, zeros, size);
}

static void null_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
                       struct fuse_file_info *fi, unsigned flags, const void *in,
                       size_t in_size, size_t out_size)
{
    (void)ino, (void)cmd, (void)arg, (void)fi, (void)flags, (void)in, (void)in_size, (void)out_size;
    fuse_reply_err(req, ENOTTY);
}

static const struct fuse_lowlevel_ops ops = {
    .lookup = null_lookup, .getattr = null_getattr, .open = null_open,
    .read = null_read, .ioctl = null_ioctl,
};

int main(int argc, char **argv)
{
    struct fuse_args args = FUSE_ARGS_INIT(argc, argv);
    struct fuse_cmdline_opts opts;
    struct fuse_session *se;
    int ret = 1;

    if (fuse_parse_cmdline(&args, &opts) != 0 || !opts.mountpoint)
        return 2;
    se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    if (!se || fuse_set_signal_handlers(se) != 0 || fuse_session_mount(se, opts.mountpoint) != 0)
        return 1;
    fuse_daemonize(opts.foreground);
    if (opts.singlethread) {
        ret = fuse_session_loop(se);
    } else {
        struct fuse_loop_config *cfg = fuse_loop_cfg_create();
        fuse_loop_cfg_set_clone_fd(cfg, 1);
        fuse_loop_cfg_set_max_threads(cfg, 4);
        ret = fuse_session_loop_mt(se, cfg);
        fuse_loop_cfg_destroy(cfg);
    }
    fuse_session_unmount(se);
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    free(opts.mountpoint);
    fuse_opt_free_args(&args);
    return ret ? 1 : 0;
}
