/*
 * guard.c — the state and the SIGBUS handler of the guard (guard.h),
 * one per process (the extension, the C tests).
 */
#include "guard.h"

#include <pthread.h>
#include <ucontext.h>

__thread sigjmp_buf *sfs_guard_env;
static struct sigaction sfs_guard_previous;

static void sfs_guard_on_sigbus(int sig, siginfo_t *info, void *context)
{
    sigjmp_buf *env = sfs_guard_env;
    if (env) {
        sfs_guard_env = NULL;
        /* The signal mask the thread had when it faulted, back before the
         * jump (sigsetjmp(env, 0) saved none). Without a wrapper this is
         * the mask already (SA_NODEFER, an empty sa_mask); but a runtime
         * that runs handlers from its own (ThreadSanitizer: make test-tsan)
         * installs that one with every signal blocked, and the jump would
         * leave them blocked: the thread's next SIGBUS would kill the
         * process. A system call on the fault path only. */
        if (context)
            pthread_sigmask(SIG_SETMASK, &((ucontext_t *)context)->uc_sigmask, NULL);
        siglongjmp(*env, 1);
    }
    /* Not ours: hand it to the previous handler, or restore the default
     * action and return, so that the faulting access raises it again. */
    if ((sfs_guard_previous.sa_flags & SA_SIGINFO) && sfs_guard_previous.sa_sigaction) {
        sfs_guard_previous.sa_sigaction(sig, info, context);
    } else if (sfs_guard_previous.sa_handler != SIG_DFL && sfs_guard_previous.sa_handler != SIG_IGN) {
        sfs_guard_previous.sa_handler(sig);
    } else {
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigaction(SIGBUS, &dfl, NULL);
    }
}

int sfs_guard_install(void)
{
    struct sigaction current;
    if (sigaction(SIGBUS, NULL, &current) != 0)
        return -1;
    if ((current.sa_flags & SA_SIGINFO) && current.sa_sigaction == sfs_guard_on_sigbus)
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = sfs_guard_on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, &sfs_guard_previous);
}
