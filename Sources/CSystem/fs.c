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

static int pwrite_all(int fd, const char *p, size_t n, int64_t at) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, n, (off_t)at);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
        at += w;
    }
    return 0;
}

/* Copies the bytes of `in` in [from, to) to the same offsets of `out`: 0, 1 when `in` ended
   before `to` (it shrank), or -errno. copy_file_range may return short counts, 0 before EOF,
   EXDEV or EOPNOTSUPP: on anything but bytes it gives way to pread/pwrite for good. */
static int copy_span(int in, int out, int64_t from, int64_t to, int *use_range, int *source_failed) {
    int64_t at = from;
    while (at < to) {
        /* A stop asked while moves wait to be undone: the copy is given up at once. */
        if (csystem_stop_pending() != 0) return -EINTR;
        size_t want = to - at > (1 << 30) ? (size_t)1 << 30 : (size_t)(to - at);
        if (*use_range) {
            loff_t a = at, b = at;
            ssize_t n = copy_file_range(in, &a, out, &b, want, 0);
            if (n > 0) {
                at += n;
                continue;
            }
            if (n < 0 && errno == EINTR) continue;
            *use_range = 0;
            continue;
        }
        char buf[1 << 16];
        ssize_t r = pread(in, buf, want < sizeof buf ? want : sizeof buf, (off_t)at);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (source_failed) *source_failed = 1;
            return -errno;
        }
        if (r == 0) return 1;
        int rc = pwrite_all(out, buf, (size_t)r, at);
        if (rc != 0) return rc;
        at += r;
    }
    return 0;
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
    /* With a limit, no more than that: a file that grows while it is copied is seen to have
       grown without copying all it grew by. */
    int64_t end = limit >= 0 ? limit : INT64_MAX;
    int rc = 0, use_range = 1, holes = 1;
    int64_t at = 0;
    /* Span by span of data: a sparse file's holes stay holes in the copy (a disk image of
       100 GiB with 1 GiB written takes 1 GiB in the store, not 100). */
    while (at < end) {
        int64_t from = at, to = end;
        if (holes) {
            off_t data = lseek(in, (off_t)at, SEEK_DATA);
            if (data < 0 && errno == ENXIO) break; /* nothing but a hole from here to the end */
            off_t hole = data < 0 ? -1 : lseek(in, data, SEEK_HOLE);
            if (data < 0 || hole < 0) {
                holes = 0; /* a filesystem that cannot tell: all of it is data */
            } else {
                from = data;
                to = hole < end ? hole : end;
            }
        }
        if (from >= end) break;
        int r = copy_span(in, out, from, to, &use_range, source_failed);
        if (r < 0) rc = r;
        if (r != 0) break;
        at = to;
    }
    /* A hole at the end is a length, not bytes: the copy takes the source's (up to the limit). */
    if (rc == 0) {
        struct stat now, copied;
        if (fstat(in, &now) != 0 || fstat(out, &copied) != 0) {
            rc = -errno;
        } else {
            int64_t size = now.st_size < end ? now.st_size : end;
            if (copied.st_size < size && ftruncate(out, (off_t)size) != 0) rc = -errno;
        }
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
