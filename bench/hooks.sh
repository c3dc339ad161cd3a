#!/bin/sh
# Runs the "hooks" benchmark; see bench/README.md. Prints a table of outbox vs its peer.
exec python3 "$(dirname "$0")/lib/hooks.py" "$@"
