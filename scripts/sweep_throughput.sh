#!/usr/bin/env bash
# Wall time of one grid (grids/throughput.toml: 8 real-model cells, 1 thread each) on a local Ray instance with one
# CPU (cells one at a time) and with two (two at a time), into fresh result folders under OUT, after a warm-up pass
# that fills the greedy-reference cache both passes read. Prints the ratio and checks both made the same outputs.
# Usage: OUT=/tmp/sweep-throughput bash scripts/sweep_throughput.sh   (needs 2 free cores to mean anything)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BPDBENCH:-.venv/bin/bpdbench}
OUT=${OUT:-/tmp/sweep-throughput}
rm -rf "$OUT" && mkdir -p "$OUT"
$B sweep grids/throughput.toml --results "$OUT/warm" --cpus 2 >/dev/null 2>&1
for n in 1 2; do
  echo "== --cpus $n ($(cut -d' ' -f1-3 /proc/loadavg) load before)"
  start=$(date +%s.%N)
  $B sweep grids/throughput.toml --results "$OUT/cpus$n" --cpus "$n" 2>&1 | grep -E "^\[|sweep throughput"
  echo "cpus$n wall $(echo "$(date +%s.%N) - $start" | bc) s" | tee -a "$OUT/times.txt"
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
t = dict(line.split()[0:3:2] for line in (out / "times.txt").read_text().splitlines())
print(f"speedup of 2 workers over 1: {float(t['cpus1']) / float(t['cpus2']):.2f}x")
strip = lambda p: [{k: v for k, v in json.loads(x).items() if k not in ("seconds", "ref_seconds")}
                   for x in p.read_text().splitlines()]
runs = sorted((out / "cpus1" / "runs").glob("*/examples.jsonl"))
same = all(strip(p) == strip(out / "cpus2" / p.relative_to(out / "cpus1")) for p in runs)
print(f"{len(runs)} cells, outputs identical between the two passes: {same}")
PY
