#!/usr/bin/env bash
# The trained drafters' results (README, "Trained drafters"): data, quick trainings, replays (chain, tree, refined)
# on mt_bench and xsum, float32 certificates, one speed run. One job at a time unless JOBS says otherwise; 1 thread
# with passive OpenMP waits (on a shared 2-core machine, spinning threads collapse: a 72 ms decode step took 3 s).
#   bash scripts/drafters.sh data|train|replay|replay-koala|replay-cost|certify|speed|speed-hydra|tables      (PROFILE=quick)
#   bash scripts/drafters.sh train-full|replay-full                                    (the full profile)
#   TASKS="squad lambada samsum cnn_dailymail" bash scripts/drafters.sh replay            (the other tasks)
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
    $B train-drafter koala --adversarial 0.1 --profile "$PROFILE" --threads 1
    $B train-drafter koala-hydra --profile "$PROFILE" --threads 1
    $B train-drafter koala-hydra --adversarial 0.1 --profile "$PROFILE" --threads 1 ;;
  train-full)   # what the full profile was run on here: Medusa-1 and the best quick chain drafter (60 CPU-min each)
    PROFILE=full "$0" data
    for name in medusa hydra; do $B train-drafter "$name" --profile full --threads 1; done ;;
  replay-koala)   # KOALA's variants: two layers on Medusa or Hydra heads, with and without the adversarial term
    for task in mt_bench xsum; do
      $B replay --task "$task" --limit "$LIMIT" --heads-path "$MEDUSA" --heads 5 --heads-profile "$PROFILE" \
        --threads 1 --no-auto-train --out "results/drafters/replay/$task-koala" --resume --methods \
        "bpd,koala,koala:adv=1,koala:base=hydra,koala:base=hydra,adv=1,koala:tree=4,koala:adv=1,tree=4,koala:base=hydra,tree=4,koala:base=hydra,adv=1,tree=4"
    done ;;
  replay-full)    # the full profile's drafters beside Medusa-1 heads trained on the same full data and budget
    M="$HOME/.cache/bpdbench/drafters/qwen2.5-coder-0.5b-medusa-full"
    for task in mt_bench xsum; do
      $B replay --task "$task" --limit "$LIMIT" --heads-path "$M" --heads 5 --heads-profile full \
        --threads 1 --no-auto-train --out "results/drafters/replay/$task-full" --resume --methods \
        "bpd,hydra,hydra:tree=4,ngram4,16best-ngram4,medusa,hydra:refine=ngram4,hydra:refine=16best-ngram4,hydra:refine=medusa,k=10"
    done ;;
  replay-cost)    # cheaper hydra chains (fewer depths, a smaller shortlist): what they give up in block efficiency
    for task in mt_bench xsum; do
      $B replay --task "$task" --limit "$LIMIT" --heads-path "$MEDUSA" --heads 5 --heads-profile "$PROFILE" \
        --threads 1 --no-auto-train --out "results/drafters/replay/$task-cost" --resume \
        --methods "bpd,hydra,hydra:depth=4,hydra:depth=3,hydra:shortlist=8192,hydra:shortlist=4096,hydra:depth=4,shortlist=8192"
    done ;;
  replay)
    for task in ${TASKS:-mt_bench xsum}; do
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
  speed-hydra)    # alone on the idle machine, 2 threads: the drafting cost of cheaper hydra chains, and the full profile
    env -u OMP_WAIT_POLICY OMP_NUM_THREADS=2 $B speed --task mt_bench --limit 8 --max-new-tokens 64 --repeats 2 --threads 2 \
      --methods "ar,hydra,hydra:depth=4,hydra:depth=3,hydra:shortlist=8192,hydra:profile=full,hydra:profile=full,tree=4" \
      --out results/speed/mt_bench-hydra --resume ;;
  tables) $B tables ;;
  *) echo "usage: $0 data|train|train-full|replay|replay-koala|replay-full|replay-cost|certify|speed|speed-hydra|tables" >&2; exit 2 ;;
esac
