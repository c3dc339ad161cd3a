#include "csystem_random.h"

#include <errno.h>
#include <sys/random.h>

int csystem_random(void *buffer, size_t count) {
    size_t filled = 0;
    while (filled < count) {
        ssize_t n = getrandom((char *)buffer + filled, count - filled, 0);
        if (n > 0) {
            filled += (size_t)n;
        } else if (n < 0 && errno != EINTR) {
            return -errno;
        }
    }
    return 0;
}
