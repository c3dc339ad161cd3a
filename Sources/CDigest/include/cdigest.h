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

#endif
