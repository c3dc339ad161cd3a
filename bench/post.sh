#!/bin/sh
# Runs the "post" benchmark; see bench/README.md. Prints a table of outbox vs its peer.
exec python3 "$(dirname "$0")/lib/post.py" "$@"
