#ifndef OUTBOX_CSYSTEM_SPAWN_H
#define OUTBOX_CSYSTEM_SPAWN_H
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/types.h>

/* A spawned child: its pid (also its process-group id), a pidfd (-1 if the kernel has none),
   the parent ends of its stdin/stdout/stderr pipes (O_CLOEXEC | O_NONBLOCK), and its start
   time as /proc/PID/stat gives it (clock ticks since boot) when the clock alone tells it,
   else 0. */
typedef struct csystem_child {
    int pid;
    int pidfd;
    int stdin_fd;
    int stdout_fd;
    int stderr_fd;
    uint64_t start_time;
    /* Bytes of the input already in the stdin pipe (csystem_spawn_with_input). */
    size_t stdin_written;
} csystem_child;

/* vfork + exec of path with argv/envp (NULL-terminated) in cwd (NULL = inherit): own process
   group, empty signal mask, default PIPE/TERM/INT/CHLD/HUP/QUIT and every handled signal,
   only fds 0-2 inherited, the normal scheduling policy (SCHED_OTHER) when the spawning
   thread has another, and the umask the process had before csystem_restrict_umask.
   0 or -errno (exec and chdir failures included). */
int csystem_spawn(const char *path, char *const argv[], char *const envp[], const char *cwd,
                  csystem_child *out);
/* csystem_spawn with all of the child's input known: as much as the pipe holds is written
   before the child starts (stdin_written), and stdin_fd is -1 (closed) when that is all. */
int csystem_spawn_with_input(const char *path, char *const argv[], char *const envp[], const char *cwd,
                             const void *input, size_t input_len, csystem_child *out);

/* csystem_spawn_with_input for a child the calling thread waits for: it gets SIGKILL when
   that thread ends, so a process killed while waiting leaves no such child running. */
int csystem_spawn_dying_with_parent(const char *path, char *const argv[], char *const envp[], const char *cwd,
                                    const void *input, size_t input_len, csystem_child *out);

/* Sets this process's umask to 077 (the store's files are the user's alone) and remembers
   the umask it had before the first call: every child spawned later gets that one back. */
void csystem_restrict_umask(void);

/* Raises the soft open-files limit to the hard one (at most 1,048,576): a runner holds a
   socket for each connection and a file for each body. Children spawned later get the
   soft limit the process had before the first call (a program that uses select() expects the
   usual 1024). Returns the soft limit now in force, or -1 when it cannot be read. */
int64_t csystem_raise_open_files(void);

/* CLOCK_BOOTTIME in clock ticks, as the kernel counts a process's start time; -1 when a
   tick is not a whole number of nanoseconds (then only /proc can tell). */
int64_t csystem_boot_ticks(void);

/* Moves the calling thread to SCHED_BATCH (batch != 0: it no longer preempts other threads
   when it wakes up, and gets its share of the CPU as before) or back to SCHED_OTHER.
   0 or -errno. */
int csystem_sched_batch_self(int batch);

/* Reaps exactly this pid (never -1). Blocks unless nohang. Returns 1 when reaped (state in
   exit_code or term_signal, the other -1), 0 when nohang and still running, or -errno. */
int csystem_proc_wait(int pid, int nohang, int *exit_code, int *term_signal);
/* How `pid` ended, leaving it a zombie (WNOWAIT): 1 when it has exited, 0 when not yet,
   or -errno. */
int csystem_proc_peek_exit(int pid, int *exit_code, int *term_signal);

/* killpg(pgid, sig); 0 or -errno. */
int csystem_proc_killpg(int pgid, int sig);

/* pidfd_open(pid, 0) (always close-on-exec); fd or -errno. */
int csystem_proc_pidfd_open(int pid);

/* pidfd_send_signal: signals exactly the process the pidfd names; 0 or -errno. */
int csystem_proc_pidfd_signal(int pidfd, int sig);

/* kill(pid, sig) for a pid > 1; 0 or -errno. */
int csystem_proc_kill(int pid, int sig);

/* Start time (field 22 of /proc/PID/stat, clock ticks since boot) and process group (field 5).
   0 or -errno (-ESRCH when the process is gone). */
int csystem_proc_stat(int pid, uint64_t *start_time, int *pgid);

/* Whether a process other than `pgid` itself, not a zombie, is in process group `pgid`
   (read from /proc): 1 yes, 0 no, -1 when /proc cannot be read. */
int csystem_proc_group_has_others(int pgid);

/* Polls one fd for readability up to timeout_ms; 1 readable, 0 timeout, -errno. */
int csystem_proc_poll_readable(int fd, int timeout_ms);

/* poll(2) returning -errno (EINTR included, so the caller recomputes its timeout). */
int csystem_proc_poll(struct pollfd *fds, unsigned long count, int timeout_ms);

/* read/write/close that return -errno instead of setting errno (EINTR retried). */
ssize_t csystem_proc_read(int fd, void *buf, size_t count);
ssize_t csystem_proc_write(int fd, const void *buf, size_t count);
void csystem_proc_close(int fd);

/* Milliseconds of CLOCK_MONOTONIC (never jumps with the wall clock). */
int64_t csystem_proc_now_ms(void);

/* A signal that ends the process (SIGTERM, SIGINT, SIGHUP, SIGQUIT; those ignored from the
   start stay ignored) ends it at once, as by default, unless a plugin is being waited for
   (between csystem_plugin_wait_begin and _end): then it is recorded, the waiting loop kills
   the plugin's group (which sits in a group of its own, out of a terminal's Ctrl-C) when it
   sees csystem_stop_pending, and _end ends the process with that signal. `run` replaces the
   handlers of the first three with its own. Call once from main. */
void csystem_stop_guard_install(void);
/* From now on a stop signal is only recorded (csystem_stop_pending): what the command set out to
   store is being committed, and its exit status must say whether it was. */
void csystem_stop_hold(void);
/* From now on a stop signal is only recorded until csystem_stop_release: a user's file was
   moved into the store, or one is being copied in, and the code that sees csystem_stop_pending
   puts it back or removes the copy first. */
void csystem_stop_defer(void);
/* Ends the hold or the deferral (the commit failed, or the enqueue was stopped and undone): a
   stop signal recorded meanwhile ends the process now. */
void csystem_stop_release(void);
/* 1 when the signal's disposition is "ignore" (set so by the parent, or by us). */
int csystem_signal_ignored(int sig);
void csystem_plugin_wait_begin(void);
void csystem_plugin_wait_end(void);
/* The signal recorded while a plugin was waited for, or 0. */
int csystem_stop_pending(void);

/* signal(SIGPIPE, SIG_IGN) for the whole process; call once from main. */
void csystem_proc_ignore_sigpipe(void);

/* Blocks SIGPIPE on the calling thread; returns whether it was already blocked. */
int csystem_proc_block_sigpipe(void);

/* Undoes csystem_proc_block_sigpipe, first consuming a SIGPIPE our writes left pending. */
void csystem_proc_restore_sigpipe(int was_blocked);

/* The process's environ array (NULL-terminated). */
char **csystem_proc_environ(void);

/* access(path, X_OK) on a regular file: 1 yes, 0 no. */
int csystem_proc_is_executable(const char *path);

/* 1 when path is a directory, 0 otherwise (errno-free). */
int csystem_proc_is_directory(const char *path);

/* A non-blocking, close-on-exec eventfd for waking a poll; the fd or -errno. */
int csystem_proc_eventfd(void);
/* Makes the eventfd readable. */
void csystem_proc_eventfd_signal(int fd);
/* Reads the eventfd back to unreadable. */
void csystem_proc_eventfd_drain(int fd);

#endif
