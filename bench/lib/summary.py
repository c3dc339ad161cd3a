"""Prints the summary table of bench/run.sh from the result lines the benchmarks appended."""

import datetime
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as B  # noqa: E402


def main():
    rows = []
    with open(sys.argv[1]) as fh:
        for line in fh:
            if line.strip():
                rows.append(json.loads(line))
    binary = B.outbox_binary()
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    commit = subprocess.run(["git", "-C", B.ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    print(f"== summary ({now}; {B.machine_line()}; {B.nginx_line()}; {version}, commit {commit or '?'})")
    print(B.table(rows))
    print("ratio = outbox time / peer time for the same work (> 1: outbox is slower); "
          "verdict: ok / MISS against the target (and the RSS cap where one is given).")


if __name__ == "__main__":
    main()
