#define _GNU_SOURCE
#include "csystem_fs.h"
#include "csystem_spawn.h"
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

int csystem_errno(void) { return errno; }

int csystem_fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int csystem_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

int csystem_lock_file(const char *path) {
    for (int tries = 0; tries < 8; tries++) {
        /* Never through a symbolic link: the holder's pid is written into the file. */
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0) return -errno;
        /* Nor a file with another name: a hard link to a user's file would be written too. */
        struct stat own;
        if (fstat(fd, &own) != 0 || own.st_nlink > 1) {
            int e = own.st_nlink > 1 ? EMLINK : errno;
            close(fd);
            return -e;
        }
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        if (csystem_lock_is_named(fd, path)) return fd;
        /* Removed or replaced between our open and our lock: a lock on a file the path no
           longer names keeps nobody out, so take the one it names now. */
        close(fd);
    }
    return -ESTALE;
}

int csystem_lock_is_named(int fd, const char *path) {
    struct stat held, named;
    if (fstat(fd, &held) != 0 || stat(path, &named) != 0) return 0;
    return held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int csystem_write_file(const char *path, const void *bytes, size_t count) {
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    int rc = write_all(fd, bytes, count);
    if (rc == 0 && fsync(fd) != 0) rc = -errno;
    close(fd);
    if (rc != 0) unlink(path);
    return rc;
}

int csystem_copy_file(const char *src, const char *dst, int64_t limit, int *source_failed) {
    /* Non-blocking, and only a regular file: a FIFO or device put in the source's place
       fails here instead of hanging the copy or reading forever. */
    if (source_failed) *source_failed = 1;
    int in = open(src, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (in < 0) return -errno;
    struct stat info;
    int checked = fstat(in, &info) != 0 ? -errno : S_ISREG(info.st_mode) ? 0 : -EINVAL;
    if (checked != 0) {
        close(in);
        return checked;
    }
    if (source_failed) *source_failed = 0;
    int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) {
        int e = errno;
        close(in);
        return -e;
    }
    int rc = 0;
    /* copy_file_range may return short counts, 0 before EOF, EXDEV or EOPNOTSUPP: loop and
       fall back to read/write on any failure. */
    int use_range = 1;
    int64_t copied = 0;
    for (;;) {
        /* A stop asked while moves wait to be undone: the copy is given up at once. */
        if (csystem_stop_pending() != 0) {
            rc = -EINTR;
            break;
        }
        /* With a limit, no more than that: a file that grows while it is copied is seen to
           have grown without copying all it grew by. */
        size_t want = 1 << 30;
        if (limit >= 0) {
            if (copied >= limit) break;
            if ((int64_t)want > limit - copied) want = (size_t)(limit - copied);
        }
        if (use_range) {
            ssize_t n = copy_file_range(in, NULL, out, NULL, want, 0);
            if (n > 0) {
                copied += n;
                continue;
            }
            if (n == 0) {
                struct stat a, b;
                if (fstat(in, &a) == 0 && fstat(out, &b) == 0 && a.st_size == b.st_size) break;
            } else if (errno == EINTR) {
                continue;
            }
            use_range = 0;
            off_t pos = lseek(out, 0, SEEK_END);
            if (pos < 0 || lseek(in, pos, SEEK_SET) < 0) { rc = -errno; break; }
            continue;
        }
        char buf[1 << 16];
        ssize_t r = read(in, buf, want < sizeof buf ? want : sizeof buf);
        if (r < 0) {
            if (errno == EINTR) continue;
            rc = -errno;
            if (source_failed) *source_failed = 1;
            break;
        }
        if (r == 0) break;
        copied += r;
        rc = write_all(out, buf, (size_t)r);
        if (rc != 0) break;
    }
    if (rc == 0 && fsync(out) != 0) rc = -errno;
    close(in);
    close(out);
    if (rc != 0) unlink(dst);
    return rc;
}

int csystem_stat(const char *path, int64_t *size, int64_t *mtime_ns, uint64_t *inode, int *is_regular) {
    struct stat st;
    if (stat(path, &st) != 0) return -errno;
    *size = (int64_t)st.st_size;
    *mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
    *inode = (uint64_t)st.st_ino;
    *is_regular = S_ISREG(st.st_mode) ? 1 : 0;
    return 0;
}

int csystem_terminal_columns(int fd) {
    struct winsize size;
    if (ioctl(fd, TIOCGWINSZ, &size) != 0) return 0;
    return size.ws_col;
}
