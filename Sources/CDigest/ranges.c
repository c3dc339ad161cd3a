#include "cdigest.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Parts of one file hashed on threads entirely in C: the threads touch no Swift state, so
   nothing of the Swift runtime (lazy globals, reference counts) is shared between them. */

enum { BUFFER = 1 << 20 };

struct job {
    int fd;
    const int64_t *starts, *ends;
    size_t count;
    uint8_t *out;
    atomic_size_t next;
    atomic_int failure;
};

static void fail(struct job *job, int error) {
    int none = 0;
    atomic_compare_exchange_strong(&job->failure, &none, error);
}

/* One range: whole blocks as they are read, then FIPS 180-4's padding. */
static int hash_range(int fd, int64_t start, int64_t end, uint8_t *buffer, uint8_t digest[32]) {
    uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t fill = 0;
    int64_t offset = start;
    while (offset < end) {
        size_t want = BUFFER - fill;
        if ((int64_t)want > end - offset) want = (size_t)(end - offset);
        ssize_t got = pread(fd, buffer + fill, want, offset);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno;
        if (got == 0) return EIO; /* the file is shorter than the plan */
        fill += (size_t)got;
        offset += got;
        size_t blocks = fill / 64;
        if (blocks == 0) continue;
        cdigest_sha256_blocks(state, buffer, blocks);
        memmove(buffer, buffer + blocks * 64, fill - blocks * 64);
        fill -= blocks * 64;
    }
    uint64_t bits = (uint64_t)(end - start) * 8;
    uint8_t tail[128] = {0};
    memcpy(tail, buffer, fill);
    tail[fill] = 0x80;
    size_t length = fill + 1 + 8 <= 64 ? 64 : 128;
    for (int i = 0; i < 8; i++) tail[length - 1 - i] = (uint8_t)(bits >> (8 * i));
    cdigest_sha256_blocks(state, tail, length / 64);
    for (int i = 0; i < 8; i++) {
        digest[4 * i] = (uint8_t)(state[i] >> 24);
        digest[4 * i + 1] = (uint8_t)(state[i] >> 16);
        digest[4 * i + 2] = (uint8_t)(state[i] >> 8);
        digest[4 * i + 3] = (uint8_t)state[i];
    }
    return 0;
}

static void *worker(void *argument) {
    struct job *job = argument;
    uint8_t *buffer = malloc(BUFFER);
    if (buffer == NULL) {
        fail(job, ENOMEM);
        return NULL;
    }
    for (;;) {
        size_t i = atomic_fetch_add(&job->next, 1);
        if (i >= job->count || atomic_load(&job->failure) != 0) break;
        int error = hash_range(job->fd, job->starts[i], job->ends[i], buffer, job->out + 32 * i);
        if (error != 0) {
            fail(job, error);
            break;
        }
    }
    free(buffer);
    return NULL;
}

int cdigest_sha256_file_ranges(int fd, const int64_t *starts, const int64_t *ends, size_t count,
                               uint8_t *out, int threads) {
    if (!cdigest_sha256_hardware()) return -1;
    struct job job = {.fd = fd, .starts = starts, .ends = ends, .count = count, .out = out};
    atomic_init(&job.next, 0);
    atomic_init(&job.failure, 0);
    if (threads < 1) threads = 1;
    if ((size_t)threads > count) threads = count > 0 ? (int)count : 1;
    pthread_t helpers[threads > 1 ? threads - 1 : 1];
    int started = 0;
    for (; started < threads - 1; started++) {
        if (pthread_create(&helpers[started], NULL, worker, &job) != 0) break;
    }
    worker(&job); /* this thread works too, so a failed pthread_create only slows it down */
    for (int i = 0; i < started; i++) pthread_join(helpers[i], NULL);
    return atomic_load(&job.failure);
}
