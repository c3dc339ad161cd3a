#!/bin/sh
# Runs the "pg" benchmark (several runners on one PostgreSQL store); see bench/README.md.
exec python3 "$(dirname "$0")/lib/pg.py" "$@"
