#define _GNU_SOURCE
#include "csystem_spawn.h"
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

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

static int set_nonblocking(int fd) {
    int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return -errno;
    return 0;
}

/* Defined only in a -sanitize=thread build: there glibc's posix_spawn (a clone sharing the
   address space) corrupts ThreadSanitizer's own state, so the child is forked instead. */
extern void __tsan_init(void) __attribute__((weak));

/* fork + exec with what posix_spawn's attributes and file actions do below; the child calls
   only async-signal-safe functions, and an exec failure comes back through a pipe. */
static int spawn_forked(const char *path, char *const argv[], char *const envp[], const char *cwd, int in_fd,
                        int out_fd, int err_fd, const int *reset, size_t nreset, int reset_policy, pid_t *pid_out) {
    int report[2];
    int rc = make_pipe(report);
    if (rc != 0) return rc;
    pid_t pid = fork();
    if (pid < 0) {
        rc = -errno;
        close(report[0]);
        close(report[1]);
        return rc;
    }
    if (pid == 0) {
        int e = 0;
        struct sigaction dfl;
        memset(&dfl, 0, sizeof dfl);
        dfl.sa_handler = SIG_DFL;
        for (size_t i = 0; i < nreset; i++) sigaction(reset[i], &dfl, NULL);
        sigset_t empty;
        sigemptyset(&empty);
        sigprocmask(SIG_SETMASK, &empty, NULL);
        if (setpgid(0, 0) != 0) e = errno;
        if (!e && reset_policy) {
            struct sched_param normal = {.sched_priority = 0};
            if (sched_setscheduler(0, SCHED_OTHER, &normal) != 0) e = errno;
        }
        if (!e && dup2(in_fd, 0) < 0) e = errno;
        if (!e && out_fd >= 0 && dup2(out_fd, 1) < 0) e = errno;
        if (!e && err_fd >= 0 && dup2(err_fd, 2) < 0) e = errno;
        if (!e && cwd != NULL && chdir(cwd) != 0) e = errno;
        if (!e) {
            /* Everything from 3 is closed but the report pipe, which exec closes. */
            if (report[1] > 3) syscall(SYS_close_range, 3, report[1] - 1, 0);
            syscall(SYS_close_range, report[1] + 1, ~0U, 0);
            execve(path, argv, envp);
            e = errno;
        }
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

int csystem_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd,
                  csystem_child *out) {
    return csystem_spawn_ex(path, argv, envp, cwd, 0, out);
}

int csystem_spawn_ex(const char *path, char *const argv[], char *const envp[], const char *cwd,
                     int inherit_output, csystem_child *out) {
    int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1};
    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attr;
    int have_actions = 0, have_attr = 0;
    int rc;

    out->pid = -1;
    out->pidfd = -1;
    out->stdin_fd = out->stdout_fd = out->stderr_fd = -1;

    if ((rc = make_pipe(in_pipe)) != 0) goto fail;
    if (!inherit_output && (rc = make_pipe(out_pipe)) != 0) goto fail;
    if (!inherit_output && (rc = make_pipe(err_pipe)) != 0) goto fail;

    if ((rc = -posix_spawn_file_actions_init(&actions)) != 0) goto fail;
    have_actions = 1;
    /* dup2 clears close-on-exec on 0/1/2; everything else (runner lock, other children's
       pipes, fds opened by libraries without O_CLOEXEC) is closed, so no hook (or its
       background child) keeps the runner lock held. */
    if ((rc = -posix_spawn_file_actions_adddup2(&actions, in_pipe[0], 0)) != 0) goto fail;
    if (!inherit_output) {
        if ((rc = -posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1)) != 0) goto fail;
        if ((rc = -posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2)) != 0) goto fail;
    }
    if ((rc = -posix_spawn_file_actions_addclosefrom_np(&actions, 3)) != 0) goto fail;
    if (cwd != NULL && (rc = -posix_spawn_file_actions_addchdir_np(&actions, cwd)) != 0) goto fail;

    if ((rc = -posix_spawnattr_init(&attr)) != 0) goto fail;
    have_attr = 1;
    /* Own group (a stale hook can be killed as a group; Ctrl-C does not reach it), and no
       inherited blocked mask or ignored SIGPIPE (the runner's would break the hook). */
    sigset_t empty, defaults;
    sigemptyset(&empty);
    sigemptyset(&defaults);
    int reset[] = {SIGPIPE, SIGTERM, SIGINT, SIGCHLD, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof reset / sizeof reset[0]; i++) sigaddset(&defaults, reset[i]);
    short flags = POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    /* Hooks and plugins are spawned from threads of the runner's control thread, which runs
       as SCHED_BATCH: the child gets the normal policy back. Only then is the policy set, so
       a sandbox that refuses sched_setscheduler (where the runner stayed SCHED_OTHER) does
       not fail every spawn. */
    int policy = sched_getscheduler(0);
    int reset_policy = policy >= 0 && (policy & ~SCHED_RESET_ON_FORK) != SCHED_OTHER;
    if (reset_policy) flags |= POSIX_SPAWN_SETSCHEDULER;
    if ((rc = -posix_spawnattr_setflags(&attr, flags)) != 0) goto fail;
    if (reset_policy) {
        struct sched_param normal = {.sched_priority = 0};
        if ((rc = -posix_spawnattr_setschedpolicy(&attr, SCHED_OTHER)) != 0) goto fail;
        if ((rc = -posix_spawnattr_setschedparam(&attr, &normal)) != 0) goto fail;
    }
    if ((rc = -posix_spawnattr_setpgroup(&attr, 0)) != 0) goto fail;
    if ((rc = -posix_spawnattr_setsigmask(&attr, &empty)) != 0) goto fail;
    if ((rc = -posix_spawnattr_setsigdefault(&attr, &defaults)) != 0) goto fail;

    pid_t pid;
    if (&__tsan_init != NULL) {
        rc = spawn_forked(path, argv, envp, cwd, in_pipe[0], inherit_output ? -1 : out_pipe[1],
                          inherit_output ? -1 : err_pipe[1], reset, sizeof reset / sizeof reset[0], reset_policy, &pid);
        if (rc != 0) goto fail;
    } else if ((rc = -posix_spawn(&pid, path, &actions, &attr, argv, envp)) != 0) {
        /* glibc's posix_spawn (clone with CLONE_VFORK) reports chdir and exec failures here. */
        goto fail;
    }

    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(in_pipe[0]);
    if (!inherit_output) {
        close(out_pipe[1]);
        close(err_pipe[1]);
    }

    out->pid = pid;
    /* The child is not reaped until we waitpid(pid), so this pidfd names it even if it
       has already exited. */
    long pidfd = syscall(SYS_pidfd_open, pid, 0);
    out->pidfd = pidfd >= 0 ? (int)pidfd : -1;
    out->stdin_fd = in_pipe[1];
    out->stdout_fd = out_pipe[0];
    out->stderr_fd = err_pipe[0];
    set_nonblocking(out->stdin_fd);
    if (!inherit_output) {
        set_nonblocking(out->stdout_fd);
        set_nonblocking(out->stderr_fd);
    }
    return 0;

fail:
    if (have_actions) posix_spawn_file_actions_destroy(&actions);
    if (have_attr) posix_spawnattr_destroy(&attr);
    close_quietly(in_pipe[0]);
    close_quietly(in_pipe[1]);
    close_quietly(out_pipe[0]);
    close_quietly(out_pipe[1]);
    close_quietly(err_pipe[0]);
    close_quietly(err_pipe[1]);
    return rc;
}

int csystem_proc_wait(int pid, int nohang, int *exit_code, int *term_signal) {
    int status = 0;
    pid_t r;
    do {
        r = waitpid(pid, &status, nohang ? WNOHANG : 0);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    if (r == 0) return 0;
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    *term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : -1;
    return 1;
}

int csystem_proc_killpg(int pgid, int sig) {
    if (pgid <= 1) return -EINVAL; /* killpg(0 or 1) would hit our own group or everything */
    return killpg(pgid, sig) == 0 ? 0 : -errno;
}

int csystem_proc_pidfd_open(int pid) {
    long fd = syscall(SYS_pidfd_open, pid, 0);
    return fd >= 0 ? (int)fd : -errno;
}

int csystem_proc_stat(int pid, uint64_t *start_time, int *pgid) {
    char path[64];
    char buf[2048];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? -ESRCH : -errno;
    ssize_t n;
    do {
        n = read(fd, buf, sizeof buf - 1);
    } while (n < 0 && errno == EINTR);
    int saved = errno;
    close(fd);
    if (n < 0) return saved == ESRCH ? -ESRCH : -saved;
    buf[n] = 0;
    /* comm (field 2) may hold spaces and ')', so fields are counted after the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL) return -EINVAL;
    p++;
    int field = 2;
    int found = 0;
    while (*p != 0 && found < 2) {
        while (*p == ' ') p++;
        if (*p == 0) break;
        field++;
        char *end;
        if (field == 5) {
            *pgid = (int)strtol(p, &end, 10);
            found++;
        } else if (field == 22) {
            *start_time = strtoull(p, &end, 10);
            found++;
        }
        while (*p != 0 && *p != ' ') p++;
    }
    return found == 2 ? 0 : -EINVAL;
}

int csystem_proc_pidfd_signal(int pidfd, int sig) {
    return syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0) == 0 ? 0 : -errno;
}

int csystem_proc_kill(int pid, int sig) {
    if (pid <= 1) return -EINVAL;
    return kill(pid, sig) == 0 ? 0 : -errno;
}

int csystem_proc_poll_readable(int fd, int timeout_ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, timeout_ms);
    if (r < 0) return -errno;
    return r > 0 ? 1 : 0;
}

int csystem_proc_poll(struct pollfd *fds, unsigned long count, int timeout_ms) {
    int r = poll(fds, (nfds_t)count, timeout_ms);
    return r < 0 ? -errno : r;
}

ssize_t csystem_proc_read(int fd, void *buf, size_t count) {
    ssize_t n;
    do {
        n = read(fd, buf, count);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

ssize_t csystem_proc_write(int fd, const void *buf, size_t count) {
    ssize_t n;
    do {
        n = write(fd, buf, count);
    } while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : n;
}

void csystem_proc_close(int fd) {
    close_quietly(fd);
}

int64_t csystem_proc_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void csystem_proc_ignore_sigpipe(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
}

int csystem_proc_block_sigpipe(void) {
    sigset_t pipe_only, old;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    return sigismember(&old, SIGPIPE) == 1 ? 1 : 0;
}

void csystem_proc_restore_sigpipe(int was_blocked) {
    if (was_blocked) return;
    sigset_t pipe_only;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    /* A SIGPIPE raised by our own write is pending on this thread: consume it, so
       unblocking does not kill the process when SIGPIPE was not ignored. */
    struct timespec zero = {0, 0};
    for (;;) {
        sigset_t pending;
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE) != 1) break;
        if (sigtimedwait(&pipe_only, NULL, &zero) < 0 && errno != EINTR) break;
    }
    pthread_sigmask(SIG_UNBLOCK, &pipe_only, NULL);
}

char **csystem_proc_environ(void) {
    return environ;
}

int csystem_proc_is_executable(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    return access(path, X_OK) == 0 ? 1 : 0;
}

int csystem_proc_is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? 1 : 0;
}

int csystem_sched_batch_self(int batch) {
    struct sched_param param = {.sched_priority = 0};
    return sched_setscheduler(0, batch ? SCHED_BATCH : SCHED_OTHER, &param) == 0 ? 0 : -errno;
}

int csystem_proc_eventfd(void) {
    int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return fd >= 0 ? fd : -errno;
}

void csystem_proc_eventfd_signal(int fd) {
    uint64_t one = 1;
    ssize_t ignored = write(fd, &one, sizeof one);
    (void)ignored;
}

void csystem_proc_eventfd_drain(int fd) {
    uint64_t count;
    ssize_t ignored = read(fd, &count, sizeof count);
    (void)ignored;
}
