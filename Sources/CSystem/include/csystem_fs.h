#ifndef OUTBOX_CSYSTEM_FS_H
#define OUTBOX_CSYSTEM_FS_H
#include <stdint.h>
#include <sys/types.h>

/* fsync of a folder (an O_DIRECTORY open); 0 or -errno. */
int csystem_fsync_dir(const char *path);
/* Try to take an exclusive flock on path (created 0600, O_CLOEXEC). Returns the fd, or -errno
   (-EWOULDBLOCK when another process holds it). The lock lives as long as the fd; the file
   locked is always the one path names when it returns. */
int csystem_lock_file(const char *path);
/* 1 when path still names the file open as fd (a lock file nobody removed or replaced). */
int csystem_lock_is_named(int fd, const char *path);
/* Copies src to dst (created O_EXCL 0600) with copy_file_range, falling back to read/write;
   fsyncs dst; at most `limit` bytes unless it is negative. 0 or -errno; *source_failed (when
   not NULL) tells whether the error was opening or reading src rather than writing dst. */
int csystem_copy_file(const char *src, const char *dst, int64_t limit, int *source_failed);
/* Size, mtime in ns and inode of a path; 0 or -errno. */
int csystem_stat(const char *path, int64_t *size, int64_t *mtime_ns, uint64_t *inode, int *is_regular);
/* fsync an existing file by path. 0 or -errno. */
int csystem_fsync_path(const char *path);
/* Write all bytes to a new file (O_EXCL, 0600), fsync it. 0 or -errno. */
int csystem_write_file(const char *path, const void *bytes, size_t count);
/* The calling process's errno value, for Swift. */
int csystem_errno(void);
/* The width in columns of the terminal `fd` is on, or 0 when it is none or does not say
   (ioctl is variadic, out of Swift's reach). */
int csystem_terminal_columns(int fd);
#endif
