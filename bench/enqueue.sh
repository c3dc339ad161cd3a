#!/bin/sh
# Runs the "enqueue" benchmark; see bench/README.md. Prints a table of outbox vs its peer.
exec python3 "$(dirname "$0")/lib/enqueue.py" "$@"
