#!/usr/bin/env bash
# The trained drafters (docs/trained-drafters.md): their data and trainings (reports in results/drafters/training/),
# then their results, which are grids/drafters.toml: replays, float32 certificates, the hydra speed run.
#   bash scripts/drafters.sh data|train|train-full    (PROFILE=quick; train-full: the full data, medusa and hydra)
#   bash scripts/drafters.sh results [--dry-run ...]  (= bpdbench sweep grids/drafters.toml; arguments go to sweep)
# Trainings run one at a time, 1 thread with passive OpenMP waits (on a shared 2-core machine, spinning threads
# collapse: a 72 ms decode step took 3 s).
set -euo pipefail
cd "$(dirname "$0")/.."
B="${BPDBENCH:-.venv/bin/bpdbench}"
PROFILE=${PROFILE:-quick}

train() { OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE "$B" "$@" --threads 1; }

case "${1:-}" in
  data) train distill-data --profile "$PROFILE" ;;
  train)
    for name in medusa eagle hydra hydra++ amphista koala; do
      train train-drafter "$name" --profile "$PROFILE"
    done
    train train-drafter koala --adversarial 0.1 --profile "$PROFILE"
    train train-drafter koala-hydra --profile "$PROFILE"
    train train-drafter koala-hydra --adversarial 0.1 --profile "$PROFILE" ;;
  train-full)   # what the full profile was run on here: Medusa-1 and the best quick chain drafter (60 CPU-min each)
    train distill-data --profile full
    for name in medusa hydra; do train train-drafter "$name" --profile full; done ;;
  results) shift; exec "$B" sweep grids/drafters.toml "$@" ;;
  *) echo "usage: $0 data|train|train-full|results [sweep options]" >&2; exit 2 ;;
esac
