#!/bin/sh
# Runs the outbox benchmarks and prints a summary table; see bench/README.md.
# Usage: bench/run.sh [enqueue|post|hooks|upload|s3|pg ...]   (no name: all of them)
# OUTBOX=path uses that binary; otherwise .build/release/outbox is built first
# (BENCH_NO_BUILD=1 skips the build).
set -u
here=$(cd "$(dirname "$0")" && pwd)
all="enqueue post hooks upload s3 pg"
names=${*:-$all}
for name in $names; do
    case " $all " in
        *" $name "*) ;;
        *) echo "bench/run.sh: unknown benchmark \"$name\" (choose from: $all)" >&2; exit 64 ;;
    esac
done
if [ -z "${OUTBOX:-}" ] && [ "${BENCH_NO_BUILD:-0}" != 1 ]; then
    echo "== swift build -c release --product outbox" >&2
    (cd "$here/.." && swift build -c release --product outbox >&2) || exit 1
fi
BENCH_RESULTS=$(mktemp "${TMPDIR:-/tmp}/outbox-bench-results.XXXXXX")
export BENCH_RESULTS
trap 'rm -f "$BENCH_RESULTS"' EXIT
status=0
for name in $names; do
    echo "== $name"
    "$here/$name.sh" || { echo "bench/run.sh: $name exited $?" >&2; status=1; }
    echo
done
mkdir -p "$here/out"
python3 "$here/lib/summary.py" "$BENCH_RESULTS" | tee "$here/out/last.txt"
exit $status
