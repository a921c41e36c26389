#!/usr/bin/env bash
# The speed runs against the peers (README, "Speed against the peers"), one after another on an otherwise idle
# machine, 2 threads: Spec-Bench (13 categories x 2 prompts) with the paper's methods and the field's drafters;
# MT-Bench with the same plus every trained drafter (chain and tree=4); the 1.5B target with the 0.5B drafting for
# sps beside transformers' assisted generation on the same prompts. Then `bpdbench tables`.
#   bash scripts/speed_peers.sh [spec_bench|mt_bench|1.5b|all]
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BPDBENCH:-.venv/bin/bpdbench}
T=${THREADS:-2}
PEERS="ar,bpd,16best-ngram4,medusa,pld,sps,cascade,hierarchy"
DRAFTERS="eagle,eagle:tree=4,hydra,hydra:tree=4,hydra++,hydra++:tree=4,amphista,amphista:tree=4,koala,koala:tree=4"
what=${1:-all}
if [ "$what" = spec_bench ] || [ "$what" = all ]; then
  $B speed --task spec_bench --per-category 2 --max-new-tokens 64 --repeats 2 --threads "$T" \
    --methods "$PEERS,hf-pld,hf-assisted" --out results/speed/spec_bench-peers --resume
fi
if [ "$what" = mt_bench ] || [ "$what" = all ]; then
  $B speed --task mt_bench --limit 8 --max-new-tokens 64 --repeats 2 --threads "$T" \
    --methods "$PEERS,hf-greedy,hf-pld,hf-assisted,$DRAFTERS" --out results/speed/mt_bench-peers --resume
fi
if [ "$what" = 1.5b ] || [ "$what" = all ]; then
  $B speed --model qwen2.5-coder-1.5b --task mt_bench --limit 8 --max-new-tokens 64 --repeats 2 --threads "$T" \
    --methods ar,sps,hf-greedy,hf-assisted --out results/speed/mt_bench-1.5b-sps --resume
fi
$B tables
