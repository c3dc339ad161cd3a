#!/bin/sh
# Runs the "s3" benchmark; see bench/README.md. Prints a table of outbox vs the AWS CLI and rclone.
exec python3 "$(dirname "$0")/lib/s3.py" "$@"
