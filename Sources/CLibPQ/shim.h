#ifndef OUTBOX_CLIBPQ_SHIM_H
#define OUTBOX_CLIBPQ_SHIM_H
/* Debian installs libpq's headers under postgresql/ (libpq-dev). */
#include <postgresql/libpq-fe.h>
#endif
