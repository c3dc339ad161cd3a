#ifndef OUTBOX_CSYSTEM_RANDOM_H
#define OUTBOX_CSYSTEM_RANDOM_H

#include <stddef.h>

/* Fills `buffer` with `count` bytes from the kernel's CSPRNG (getrandom); 0, or -errno. */
int csystem_random(void *buffer, size_t count);

#endif
