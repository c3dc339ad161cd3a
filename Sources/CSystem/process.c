#define _GNU_SOURCE
#include "csystem_spawn.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Watching, signalling and reaping the children csystem_spawn started; the small calls the
   Swift side cannot make directly (variadic, errno-returning or macro-based). */

extern char **environ;

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

int csystem_proc_peek_exit(int pid, int *exit_code, int *term_signal) {
    siginfo_t info;
    memset(&info, 0, sizeof info);
    int r;
    do {
        r = waitid(P_PID, (id_t)pid, &info, WEXITED | WNOHANG | WNOWAIT);
    } while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    if (info.si_pid == 0) return 0;
    *exit_code = info.si_code == CLD_EXITED ? info.si_status : -1;
    *term_signal = info.si_code == CLD_EXITED ? -1 : info.si_status;
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

int csystem_proc_group_has_others(int pgid) {
    DIR *proc = opendir("/proc");
    if (proc == NULL) return -1;
    int found = 0;
    struct dirent *d;
    while (!found && (d = readdir(proc)) != NULL) {
        char *end;
        long pid = strtol(d->d_name, &end, 10);
        if (*end != 0 || pid <= 0 || pid == pgid) continue;
        char path[64];
        char buf[1024];
        snprintf(path, sizeof path, "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue; /* gone meanwhile */
        ssize_t n;
        do {
            n = read(fd, buf, sizeof buf - 1);
        } while (n < 0 && errno == EINTR);
        close(fd);
        if (n <= 0) continue;
        buf[n] = 0;
        /* After comm's last ')': the state (field 3), the parent (4), the group (5). */
        char *p = strrchr(buf, ')');
        char state;
        int parent, group;
        if (p == NULL || sscanf(p + 1, " %c %d %d", &state, &parent, &group) != 3) continue;
        if (group == pgid && state != 'Z' && state != 'X') found = 1;
    }
    closedir(proc);
    return found;
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
    if (fd >= 0) close(fd);
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

static atomic_int plugin_waits;
static atomic_int stop_pending;
static atomic_int stop_held;
static atomic_int stop_deferred;

static void end_now(int sig) {
    signal(sig, SIG_DFL);
    raise(sig);
}

static void stop_guard(int sig) {
    /* Recorded first: a wait that ends meanwhile sees it in csystem_plugin_wait_end. */
    int none = 0;
    atomic_compare_exchange_strong(&stop_pending, &none, sig);
    if (atomic_load(&plugin_waits) == 0 && atomic_load(&stop_held) == 0 && atomic_load(&stop_deferred) == 0) end_now(sig);
}

int csystem_signal_ignored(int sig) {
    struct sigaction now;
    return sigaction(sig, NULL, &now) == 0 && now.sa_handler == SIG_IGN;
}

void csystem_stop_guard_install(void) {
    static const int ending[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT};
    for (size_t i = 0; i < sizeof ending / sizeof ending[0]; i++) {
        /* A signal the parent set to be ignored (a background job's SIGINT, nohup's SIGHUP) stays ignored. */
        if (csystem_signal_ignored(ending[i])) continue;
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_handler = stop_guard;
        sigemptyset(&action.sa_mask);
        sigaction(ending[i], &action, NULL);
    }
}

void csystem_plugin_wait_begin(void) { atomic_fetch_add(&plugin_waits, 1); }

void csystem_plugin_wait_end(void) {
    if (atomic_fetch_sub(&plugin_waits, 1) != 1) return;
    int sig = atomic_load(&stop_pending);
    if (sig != 0 && atomic_load(&stop_held) == 0 && atomic_load(&stop_deferred) == 0) end_now(sig);
}

void csystem_stop_hold(void) { atomic_store(&stop_held, 1); }

void csystem_stop_defer(void) { atomic_store(&stop_deferred, 1); }

void csystem_stop_release(void) {
    atomic_store(&stop_held, 0);
    atomic_store(&stop_deferred, 0);
    int sig = atomic_load(&stop_pending);
    if (sig != 0 && atomic_load(&plugin_waits) == 0) end_now(sig);
}

int csystem_stop_pending(void) { return atomic_load(&stop_pending); }
