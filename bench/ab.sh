#!/bin/sh
# Interleaved A/B rounds of two outbox binaries on one runner case; see bench/README.md.
# Usage: bench/ab.sh OLD_BINARY NEW_BINARY   (AB_CASE=post|small|large, AB_ROUNDS, AB_COUNT)
exec python3 "$(dirname "$0")/lib/ab.py" "$@"
