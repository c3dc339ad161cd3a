#ifndef OUTBOX_CLIBPQ_SHIM_H
#define OUTBOX_CLIBPQ_SHIM_H
/* libpq's types and constants only (Debian installs the header under postgresql/ with
   libpq-dev): nothing links libpq. The store opens libpq.so.5 with dlopen when a
   postgres:// store is used, so every other command starts without its 22 libraries. */
#include <postgresql/libpq-fe.h>
#endif
