#!/usr/bin/env bash
# The CPU-scale reproduction grid (make reproduce) is grids/reference.toml, run by `bpdbench sweep` on a local Ray
# instance: artefacts first, then tune, replay, oracle, analyze and speed cells, two at a time on 2 cores, then every
# table. Resumable: finished cells and finished examples are kept, a failed cell is retried and reported (exit 1).
# Arguments go to sweep: --dry-run, --limit 5 --results DIR (a quick pass, written elsewhere), --threads 2,
# --address auto.
# LIMIT=n and THREADS=n are read as --limit and --threads.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BPDBENCH:-.venv/bin/bpdbench}
args=()
if [ -n "${LIMIT:-}" ]; then args+=(--limit "$LIMIT"); fi
if [ -n "${THREADS:-}" ]; then args+=(--threads "$THREADS"); fi
exec "$B" sweep grids/reference.toml "${args[@]}" "$@"
