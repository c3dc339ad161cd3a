#!/bin/sh
# Counts instructions per request of outbox and curl under callgrind; see bench/README.md.
exec python3 "$(dirname "$0")/lib/callgrind.py" "$@"
