#!/usr/bin/env bash
# The CPU-scale reproduction grid (make reproduce): heads, rescorers, alpha tuning, lattice methods on >= 6 tasks,
# oracle, analyses, Spec-Bench speed, then every table from the result files. Replay, oracle and speed run with
# --resume (finished examples are kept, so an interrupted run continues where it stopped, and a larger LIMIT extends
# an earlier run); they refuse to mix results made with other heads or settings: FRESH=1 starts the grid over.
# Override: LIMIT=50 THREADS=2 MODEL=... FRESH=1 bash scripts/reproduce.sh
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BPDBENCH:-.venv/bin/bpdbench}
LIMIT=${LIMIT:-50}
THREADS=${THREADS:-2}
MODEL=${MODEL:-qwen2.5-coder-0.5b}
TASKS=${TASKS:-"xsum samsum cnn_dailymail squad lambada mt_bench"}
CACHE=${BPDBENCH_CACHE:-$HOME/.cache/bpdbench}
METHODS="bpd,neural-m,ngram4,16best-0gram,16best-ngram4,oracle:k=16,medusa,bpd:heads=1,bpd:heads=2,bpd:heads=3,bpd:heads=4,bpd:heads=5,bpd:heads=6,bpd:heads=7"

step() { echo "== $* ($(date +%H:%M:%S))"; }
if [ "${FRESH:-0}" = 1 ]; then rm -rf results/replay results/oracle results/analysis results/speed/spec_bench results/alpha.json; fi
SECONDS=0
[ -f "$CACHE/heads/$MODEL-quick/config.json" ] || { step heads; $B train-heads --model "$MODEL" --profile quick --threads "$THREADS"; }
[ -f "$CACHE/rescorers/ngram2-$MODEL/ngram2.bin" ] || { step ngram2; $B train-rescorer ngram --order 2 --model "$MODEL"; }
[ -f "$CACHE/rescorers/ngram4-$MODEL/ngram4.bin" ] || { step ngram4; $B train-rescorer ngram --order 4 --model "$MODEL"; }
[ -f "$CACHE/rescorers/neural-m-$MODEL/config.json" ] || { step neural-m; $B train-rescorer neural --size m --model "$MODEL" --minutes 15; }
for t in $TASKS; do
  for r in ngram4 16best-ngram4 neural-m; do
    grep -q "\"$MODEL/$t/$r\"" results/alpha.json 2>/dev/null || { step "tune $t $r"; $B tune --task "$t" --rescorer "$r" --model "$MODEL" --limit 8 --max-new-tokens 64 --threads "$THREADS"; }
  done
  step "replay $t"; $B replay --task "$t" --model "$MODEL" --limit "$LIMIT" --threads "$THREADS" --methods "$METHODS" --resume
  step "oracle $t"; $B oracle --task "$t" --model "$MODEL" --limit "$LIMIT" --threads "$THREADS" --resume
  [ -f "results/analysis/$t/entropy.csv" ] || { step "analyze $t"; $B analyze --task "$t" --model "$MODEL" --limit "$LIMIT" --threads "$THREADS"; }
done
step speed; { $B speed --task spec_bench --per-category 2 --repeats 2 --max-new-tokens 64 --threads "$THREADS" --methods ar,bpd,16best-ngram4,medusa,pld,hf-greedy,hf-pld,hf-assisted --resume; }
step tables
$B tables
echo "== reproduce finished in $((SECONDS / 60)) min"
