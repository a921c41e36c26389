#!/usr/bin/env bash
# Shows that the CI regression check fails on a deliberately worsened baseline: copies results/baseline.json,
# lowers one block efficiency (xsum/bpd) by 0.1, well past the 0.05 tolerance, runs the same `make regress` that
# .ci/run runs against the copy, and requires it to fail. The committed baseline is never touched.
# Output: results/regress_demo.log (the failing run's log and its exit status).
set -uo pipefail
cd "$(dirname "$0")/.."
worse=$(mktemp --suffix=.json)
.venv/bin/python - "$worse" <<'PY'
import json, sys
b = json.load(open("results/baseline.json"))
b["results"]["xsum/bpd"]["block_efficiency"] -= 0.1
json.dump(b, open(sys.argv[1], "w"), indent=2)
PY
make regress BASELINE="$worse" 2>&1 | tee results/regress_demo.log
status=${PIPESTATUS[0]}
echo "make regress against the worsened baseline exited with status $status" | tee -a results/regress_demo.log
rm -f "$worse"
[ "$status" -ne 0 ] || { echo "ERROR: the worsened baseline was not caught"; exit 1; }
