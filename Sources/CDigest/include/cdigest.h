#ifndef OUTBOX_CDIGEST_H
#define OUTBOX_CDIGEST_H

#include <stddef.h>
#include <stdint.h>

/* 1 when the CPU has the SHA extensions (SHA-NI) and SSE4.1, so that
   cdigest_sha256_blocks may be called; 0 otherwise. */
int cdigest_sha256_hardware(void);

/* Compresses `blocks` 64-byte blocks at `data` into the SHA-256 state `state`
   (h0..h7, as FIPS 180-4 names them), with the SHA-NI instructions. */
void cdigest_sha256_blocks(uint32_t state[8], const uint8_t *data, size_t blocks);

/* SHA-256 digests of `count` byte ranges [starts[i], ends[i]) of the open file `fd`, read
   with pread on up to `threads` threads, 32 bytes each into `out`. Returns 0; the errno of
   the first failed read (EIO when the file is shorter); or -1 when the CPU has no SHA-NI. */
int cdigest_sha256_file_ranges(int fd, const int64_t *starts, const int64_t *ends, size_t count,
                               uint8_t *out, int threads);

#endif
