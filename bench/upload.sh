#!/bin/sh
# Runs the "upload" benchmark; see bench/README.md. Prints a table of outbox vs its peer.
exec python3 "$(dirname "$0")/lib/upload.py" "$@"
