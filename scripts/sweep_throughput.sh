#!/usr/bin/env bash
# Wall time of one grid of 8 single-thread cells on a local Ray instance with one CPU (cells one at a time) and with
# two (two at a time), into fresh result folders under OUT, after a warm-up pass that fills the greedy-reference
# cache both timed passes read (so they do the same work). Prints the ratio and checks both made the same outputs.
# The grid is grids/throughput.toml: 8 run cells of the 0.5B model (3 examples x 64 tokens each). The tests' tiny model
# is no use here: its cells take under a second, so Ray's worker start-up is all a pass would measure.
# Usage: OUT=/tmp/sweep-throughput bash scripts/sweep_throughput.sh   (needs 2 free cores to mean much)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BPDBENCH:-.venv/bin/bpdbench}
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-/tmp/sweep-throughput}
rm -rf "$OUT" && mkdir -p "$OUT"
GRID=grids/throughput.toml
if [ "${WARM:-1}" = 1 ]; then $B sweep "$GRID" --results "$OUT/warm" --cpus 2 >/dev/null 2>&1; fi   # WARM=0: cache is warm
for n in 1 2; do
  echo "== --cpus $n (load average before: $(cut -d' ' -f1-3 /proc/loadavg))"
  start=$(date +%s.%N)
  $B sweep "$GRID" --results "$OUT/cpus$n" --cpus "$n" 2>&1 | grep -E "^\[|^sweep throughput"
  echo "cpus$n wall $(echo "$(date +%s.%N) - $start" | bc) s" | tee -a "$OUT/times.txt"
done
$PY - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
t = dict(line.split()[0:3:2] for line in (out / "times.txt").read_text().splitlines())
print(f"2 workers vs 1: {float(t['cpus1']) / float(t['cpus2']):.2f}x faster")
strip = lambda p: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "ref_seconds")}
                   for x in p.read_text().splitlines()]
runs = sorted((out / "cpus1" / "runs").glob("*/examples.jsonl"))
same = all(strip(p) == strip(out / "cpus2" / p.relative_to(out / "cpus1")) for p in runs)
tokens = sum(r["new_tokens"] for p in runs for r in strip(p))
print(f"{len(runs)} cells, {tokens} tokens; outputs identical between the two passes: {same}")
PY
