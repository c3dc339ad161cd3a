#define _GNU_SOURCE
#include "csystem_spawn.h"
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void close_quietly(int fd) {
    if (fd >= 0) close(fd);
}

/* Moves a pipe end to fd >= 3, so the child's dup2 onto 0/1/2 never overwrites another end
   (possible when the parent runs with a closed stdin/stdout). */
static int lift_fd(int *fd) {
    if (*fd >= 3) return 0;
    int moved = fcntl(*fd, F_DUPFD_CLOEXEC, 3);
    if (moved < 0) return -errno;
    close(*fd);
    *fd = moved;
    return 0;
}

static int make_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) != 0) return -errno;
    int rc = lift_fd(&fds[0]);
    if (rc == 0) rc = lift_fd(&fds[1]);
    if (rc != 0) {
        close(fds[0]);
        close(fds[1]);
    }
    return rc;
}

/* For a pipe end made here: no other status flag is set, so none needs reading first. */
static int set_nonblocking(int fd) {
    return fcntl(fd, F_SETFL, O_NONBLOCK) == 0 ? 0 : -errno;
}

int64_t csystem_boot_ticks(void) {
    static long hz;
    if (hz == 0) hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0 || 1000000000L % hz != 0) return -1;
    struct timespec ts;
    if (clock_gettime(CLOCK_BOOTTIME, &ts) != 0) return -1;
    return ((int64_t)ts.tv_sec * 1000000000L + ts.tv_nsec) / (1000000000L / hz);
}

/* The umask before csystem_restrict_umask first ran; -1 until then. */
static _Atomic int inherited_umask = -1;

void csystem_restrict_umask(void) {
    int before = (int)umask(077);
    int unset = -1;
    atomic_compare_exchange_strong(&inherited_umask, &unset, before);
}

/* The soft open-files limit before csystem_raise_open_files, for children; < 0: not raised. */
static _Atomic int64_t inherited_nofile_cur = -1;

int64_t csystem_raise_open_files(void) {
    struct rlimit now;
    if (getrlimit(RLIMIT_NOFILE, &now) != 0) return -1;
    rlim_t target = now.rlim_max;
    if (target == RLIM_INFINITY || target > (rlim_t)1 << 20) target = (rlim_t)1 << 20;
    if (target <= now.rlim_cur) return (int64_t)now.rlim_cur;
    struct rlimit raised = {.rlim_cur = target, .rlim_max = now.rlim_max};
    if (setrlimit(RLIMIT_NOFILE, &raised) != 0) return (int64_t)now.rlim_cur;
    int64_t unset = -1;
    atomic_compare_exchange_strong(&inherited_nofile_cur, &unset, (int64_t)now.rlim_cur);
    return (int64_t)target;
}

/* Defined only in a -sanitize=thread build: there a child sharing the address space (vfork)
   corrupts ThreadSanitizer's own state, so the child is forked instead. */
extern void __tsan_init(void) __attribute__((weak));

/* What child_exec does besides the usual. */
enum { SPAWN_RESET_POLICY = 1, SPAWN_DIES_WITH_PARENT = 2 };

/* Signals a hook or plugin gets at their default even when the runner ignores or handles them. */
static const int reset_signals[] = {SIGPIPE, SIGTERM, SIGINT, SIGCHLD, SIGHUP, SIGQUIT};

/* What the child does between fork and exec. It may share the parent's memory (vfork), so it
   calls only async-signal-safe functions and first takes every handler away: a signal that
   reached it would otherwise run the runner's handler on the runner's memory. Returns the
   errno of the step that failed (exec never returns on success). */
static int child_exec(const char *path, char *const argv[], char *const envp[], const char *cwd, int in_fd,
                      int out_fd, int err_fd, int flags, pid_t parent, int keep_fd) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < _NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP) continue;
        int reset = 0;
        for (size_t i = 0; i < sizeof reset_signals / sizeof reset_signals[0]; i++) reset |= reset_signals[i] == sig;
        if (!reset) {
            struct sigaction now;
            /* glibc's own signals (cancellation, setxid) answer EINVAL and are left alone. */
            if (sigaction(sig, NULL, &now) != 0) continue;
            if (now.sa_handler == SIG_DFL || now.sa_handler == SIG_IGN) continue;
        }
        sigaction(sig, &dfl, NULL);
    }
    if (setpgid(0, 0) != 0) return errno;
    /* A plugin the runner waits for dies with it: nothing would read its answer. */
    if (flags & SPAWN_DIES_WITH_PARENT) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) return errno;
        if (getppid() != parent) _exit(127);  // the parent died before the line above
    }
    /* A hook creates its files as the user's own programs do, not 0600 like the store's. */
    int mask = atomic_load(&inherited_umask);
    if (mask >= 0) umask((mode_t)mask);
    /* The soft limit back, under the hard one in force (lowered from outside, it wins);
       the hard one stays as it is. A failure leaves the raised limit: no reason to refuse the hook. */
    int64_t nofile = atomic_load(&inherited_nofile_cur);
    struct rlimit now;
    if (nofile >= 0 && getrlimit(RLIMIT_NOFILE, &now) == 0) {
        if ((rlim_t)nofile < now.rlim_max) now.rlim_cur = (rlim_t)nofile;
        else now.rlim_cur = now.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &now);
    }
    if (flags & SPAWN_RESET_POLICY) {
        struct sched_param normal = {.sched_priority = 0};
        if (sched_setscheduler(0, SCHED_OTHER, &normal) != 0) return errno;
    }
    /* dup2 leaves 0/1/2 open across exec; every other fd (runner lock, other children's
       pipes, fds opened by libraries without O_CLOEXEC) is closed, so no hook (or its
       background child) keeps the runner lock held. */
    if (dup2(in_fd, 0) < 0) return errno;
    if (dup2(out_fd, 1) < 0) return errno;
    if (dup2(err_fd, 2) < 0) return errno;
    if (cwd != NULL && chdir(cwd) != 0) return errno;
    if (keep_fd > 3) syscall(SYS_close_range, 3, keep_fd - 1, 0);
    syscall(SYS_close_range, keep_fd >= 3 ? keep_fd + 1 : 3, ~0U, 0);
    sigset_t empty;
    sigemptyset(&empty);
    sigprocmask(SIG_SETMASK, &empty, NULL);
    execve(path, argv, envp);
    return errno;
}

/* fork + exec; an exec failure comes back through a pipe. */
static int spawn_forked(const char *path, char *const argv[], char *const envp[], const char *cwd, int in_fd,
                        int out_fd, int err_fd, int flags, pid_t *pid_out) {
    int report[2];
    int rc = make_pipe(report);
    if (rc != 0) return rc;
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        rc = -errno;
        close(report[0]);
        close(report[1]);
        return rc;
    }
    if (pid == 0) {
        int e = child_exec(path, argv, envp, cwd, in_fd, out_fd, err_fd, flags, parent, report[1]);
        ssize_t ignored = write(report[1], &e, sizeof e);
        (void)ignored;
        _exit(127);
    }
    close(report[1]);
    int e = 0;
    ssize_t n;
    do {
        n = read(report[0], &e, sizeof e);
    } while (n < 0 && errno == EINTR);
    close(report[0]);
    if (n == (ssize_t)sizeof e) {
        waitpid(pid, NULL, 0);
        return -e;
    }
    *pid_out = pid;
    return 0;
}

/* vfork + exec: the child borrows this thread's stack and memory until it execs, so nothing
   is copied or mapped for it; its error comes back through memory both share. Every signal
   is blocked around it, so none runs a handler in the child before it takes them away. */
static int __attribute__((noinline)) spawn_vforked(const char *path, char *const argv[], char *const envp[],
                                                   const char *cwd, int in_fd, int out_fd, int err_fd,
                                                   int flags, pid_t *pid_out) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    volatile int child_error = 0;
    pid_t parent = getpid();
    pid_t pid = vfork();
    if (pid == 0) {
        child_error = child_exec(path, argv, envp, cwd, in_fd, out_fd, err_fd, flags, parent, -1);
        _exit(127);
    }
    int e = pid < 0 ? errno : child_error;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) return -e;
    if (e != 0) {
        waitpid(pid, NULL, 0);
        return -e;
    }
    *pid_out = pid;
    return 0;
}

static int spawn_child(const char *path, char *const argv[], char *const envp[], const char *cwd,
                       const void *input, ssize_t input_len, int dies_with_parent, csystem_child *out);

int csystem_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd,
                  csystem_child *out) {
    return spawn_child(path, argv, envp, cwd, NULL, -1, 0, out);
}

int csystem_spawn_with_input(const char *path, char *const argv[], char *const envp[], const char *cwd,
                             const void *input, size_t input_len, csystem_child *out) {
    return spawn_child(path, argv, envp, cwd, input, (ssize_t)input_len, 0, out);
}

int csystem_spawn_dying_with_parent(const char *path, char *const argv[], char *const envp[], const char *cwd,
                                    const void *input, size_t input_len, csystem_child *out) {
    return spawn_child(path, argv, envp, cwd, input, (ssize_t)input_len, 1, out);
}

/* input_len < 0: the caller feeds stdin; else input is all of it. */
static int spawn_child(const char *path, char *const argv[], char *const envp[], const char *cwd,
                       const void *input, ssize_t input_len, int dies_with_parent, csystem_child *out) {
    int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    int rc;

    out->pid = -1;
    out->pidfd = -1;
    out->stdin_fd = out->stdout_fd = out->stderr_fd = -1;
    out->start_time = 0;
    out->stdin_written = 0;

    if ((rc = make_pipe(in_pipe)) != 0) goto fail;
    if ((rc = make_pipe(out_pipe)) != 0) goto fail;
    if ((rc = make_pipe(err_pipe)) != 0) goto fail;
    if ((rc = set_nonblocking(in_pipe[1])) != 0) goto fail;
    /* The input goes into the pipe before the child starts, as far as the pipe holds it
       (64 KiB unless the system is short of pipe memory): most children then get all of
       it and its end at once, and nobody has to watch their stdin. */
    if (input_len > 0) {
        ssize_t n;
        do {
            n = write(in_pipe[1], input, (size_t)input_len);
        } while (n < 0 && errno == EINTR);
        if (n > 0) out->stdin_written = (size_t)n;
    }

    /* Hooks and plugins may be spawned while the runner's thread runs as SCHED_BATCH: the
       child gets the normal policy back. Only then is the policy set, so a sandbox that
       refuses sched_setscheduler (where the runner stayed SCHED_OTHER) does not fail every
       spawn. */
    int policy = sched_getscheduler(0);
    int flags = policy >= 0 && (policy & ~SCHED_RESET_ON_FORK) != SCHED_OTHER ? SPAWN_RESET_POLICY : 0;
    if (dies_with_parent) flags |= SPAWN_DIES_WITH_PARENT;

    /* The child's start time is read from the clock the kernel stamps it with: when no tick
       boundary passed during the spawn, it is that tick, and /proc need not be read. */
    int64_t ticks_before = csystem_boot_ticks();
    pid_t pid;
    if (&__tsan_init != NULL) {
        rc = spawn_forked(path, argv, envp, cwd, in_pipe[0], out_pipe[1], err_pipe[1], flags, &pid);
    } else {
        rc = spawn_vforked(path, argv, envp, cwd, in_pipe[0], out_pipe[1], err_pipe[1], flags, &pid);
    }
    if (rc != 0) goto fail;
    int64_t ticks_after = csystem_boot_ticks();
    out->start_time = ticks_before >= 0 && ticks_before == ticks_after ? (uint64_t)ticks_before : 0;

    close(in_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);

    out->pid = pid;
    /* The child is not reaped until we waitpid(pid), so this pidfd names it even if it
       has already exited. */
    long pidfd = syscall(SYS_pidfd_open, pid, 0);
    out->pidfd = pidfd >= 0 ? (int)pidfd : -1;
    if (input_len >= 0 && out->stdin_written == (size_t)input_len) {
        close(in_pipe[1]);
    } else {
        out->stdin_fd = in_pipe[1];
    }
    out->stdout_fd = out_pipe[0];
    out->stderr_fd = err_pipe[0];
    set_nonblocking(out->stdout_fd);
    set_nonblocking(out->stderr_fd);
    return 0;

fail:
    close_quietly(in_pipe[0]);
    close_quietly(in_pipe[1]);
    close_quietly(out_pipe[0]);
    close_quietly(out_pipe[1]);
    close_quietly(err_pipe[0]);
    close_quietly(err_pipe[1]);
    return rc;
}
