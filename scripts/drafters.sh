#!/usr/bin/env bash
# The trained drafters' results (README, "Trained drafters"): data, quick trainings, replays (chain, tree, refined)
# on mt_bench and xsum, float32 certificates, one speed run. One job at a time unless JOBS says otherwise; 1 thread
# with passive OpenMP waits (on a shared 2-core machine, spinning threads collapse: a 72 ms decode step took 3 s).
#   bash scripts/drafters.sh data|train|replay|certify|speed|tables
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
B="${BPDBENCH:-.venv/bin/bpdbench}"
PROFILE=${PROFILE:-quick}
LIMIT=${LIMIT:-20}
MEDUSA=${MEDUSA:-$HOME/.cache/bpdbench/drafters/qwen2.5-coder-0.5b-medusa-$PROFILE}
CHAIN=${CHAIN:-"eagle,hydra,hydra++,amphista,koala"}   # add koala:adv=1 after `train-drafter koala --adversarial 0.1`
TREES="eagle:tree=4,hydra:tree=4,hydra++:tree=4,amphista:tree=4,koala:tree=4"
BEST=${BEST:-hydra++}      # the drafter the paper's refiners are stacked on
REFINED="ngram4,16best-ngram4,medusa,$BEST:refine=ngram4,$BEST:refine=16best-ngram4,$BEST:refine=medusa,k=10"

case "${1:-}" in
  data) $B distill-data --profile "$PROFILE" --threads 1 ;;
  train)
    for name in medusa eagle hydra hydra++ amphista koala; do
      $B train-drafter "$name" --profile "$PROFILE" --threads 1
    done
    $B train-drafter koala --adversarial 0.1 --profile "$PROFILE" --threads 1 ;;
  replay)
    for task in mt_bench xsum; do
      $B replay --task "$task" --limit "$LIMIT" --heads-path "$MEDUSA" --heads 5 --heads-profile "$PROFILE" \
        --threads 1 --no-auto-train --methods "bpd,$CHAIN,$TREES,$REFINED" --out "results/drafters/replay/$task" --resume
    done ;;
  certify)
    for task in mt_bench xsum squad; do
      for m in ${METHODS:-eagle eagle:tree=4 hydra hydra:tree=4 hydra++ hydra++:tree=4 amphista amphista:tree=4 \
               koala koala:tree=4}; do
        $B run --task "$task" --method "$m" --limit 10 --dtype float32 --max-new-tokens 32 --threads 1 \
          --heads-profile "$PROFILE" --out "results/drafters/runs/$task-${m//[:=,]/_}-fp32-$PROFILE"
      done
    done ;;
  speed)
    $B speed --task mt_bench --limit "${SPEED_LIMIT:-5}" --max-new-tokens 64 --repeats 1 --threads 1 \
      --heads-path "$MEDUSA" --heads 5 --heads-profile "$PROFILE" \
      --methods "ar,bpd,eagle,eagle:tree=4,hydra,hydra:tree=4,hydra++,amphista,koala,hf-greedy,hf-pld,hf-assisted" \
      --out results/speed/mt_bench-drafters --resume ;;
  tables) $B tables ;;
  *) echo "usage: $0 data|train|replay|certify|speed|tables" >&2; exit 2 ;;
esac
