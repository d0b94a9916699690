/*
 * guard.h — turn SIGBUS from a shrunken shard or sidecar into an error.
 *
 * Shards and sidecars are read through read-only shared mappings. When the
 * file shrinks while mapped (truncated, or replaced in place by a shorter
 * one), touching a page past its new end raises SIGBUS, which would kill the
 * whole process (the FUSE daemon and every mount it serves). The C core
 * does not catch it; the Python extension (py_module.h includes this file
 * for module.c and every py_*.c) runs every call that touches a mapping
 * inside SFS_GUARDED:
 *
 *     SFS_GUARDED(rc = SFS_EGONE, rc = sfs_lookup(shard, key, &off, &size));
 *
 * runs the second argument; if it raises SIGBUS, execution resumes in the
 * first argument instead (the faulting call is abandoned: it must not hold
 * locks or own memory at that point; the read paths do not). A function of
 * the core that must own memory while it touches a mapping (hash_large in
 * hashindex.c: a 1 MiB buffer) allocates it before an SFS_GUARDED of its
 * own and frees it after, on both paths, then hands the fault on to the
 * caller's guard with sfs_guard_pass_on.
 *
 * How: a per-thread pointer to a sigjmp_buf, set for the duration of the
 * guarded call; a process-wide SIGBUS handler (sigaction, SA_SIGINFO |
 * SA_NODEFER, installed by sfs_guard_install) siglongjmps to it. A
 * SIGBUS outside a guarded call is passed on to the handler that was there
 * before (Python's faulthandler, or the default action: the process dies as
 * it would have). sigsetjmp(env, 0) saves no signal mask (no system call):
 * the guard costs a few nanoseconds; SA_NODEFER keeps SIGBUS unblocked
 * after the jump (and the handler puts back the mask of the faulting
 * thread, should a sanitizer's wrapper have blocked more: guard.c). The
 * per-thread pointer and the handler are defined once,
 * in guard.c, for every file of the extension: a guarded call in any of
 * them is caught by the one handler installed.
 */
#ifndef SHARDFS_GUARD_H
#define SHARDFS_GUARD_H

#include <setjmp.h>
#include <signal.h>
#include <stddef.h>
#include <string.h>

/* Status of a guarded call that hit SIGBUS: bytes of a mapped file are
 * gone (the file shrank under the mapping). Not an sfs_status: only the
 * guard produces it. */
#define SFS_EGONE (-100)

/* The sigjmp_buf of the guarded call running on this thread, or NULL
 * (guard.c). Hidden: not exported from the shared object. */
extern __thread sigjmp_buf *sfs_guard_env __attribute__((visibility("hidden")));

/* Install the SIGBUS handler unless it is the current one (called with the
 * GIL held, so no race): at import and at every shard or sidecar open, so
 * that a handler installed later (faulthandler.enable()) is chained behind
 * ours instead of replacing it. Returns 0, or -1 with errno set
 * (guard.c). */
int sfs_guard_install(void) __attribute__((visibility("hidden")));

#define SFS_GUARDED(on_fault, ...)                                                                 \
    do {                                                                                           \
        sigjmp_buf sfs_guard_here_;                                                                \
        sigjmp_buf *volatile sfs_guard_outer_ = sfs_guard_env;                                     \
        if (sigsetjmp(sfs_guard_here_, 0) == 0) {                                                  \
            sfs_guard_env = &sfs_guard_here_;                                                      \
            __VA_ARGS__;                                                                           \
            sfs_guard_env = sfs_guard_outer_;                                                      \
        } else {                                                                                   \
            sfs_guard_env = sfs_guard_outer_;                                                      \
            on_fault;                                                                              \
        }                                                                                          \
    } while (0)

/* Hand a SIGBUS caught by an inner SFS_GUARDED (whose on_fault released
 * what its frame owned) on to the guarded call around it, as the handler
 * would have: jumps there; returns only when there is none. */
static inline void sfs_guard_pass_on(void)
{
    sigjmp_buf *env = sfs_guard_env;
    if (env) {
        sfs_guard_env = NULL;
        siglongjmp(*env, 1);
    }
}

#endif
