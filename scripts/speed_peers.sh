#!/usr/bin/env bash
# The speed runs against the peers (results/speed/*-peers, mt_bench-1.5b-sps): grids/peers.toml (arguments go to sweep).
cd "$(dirname "$0")/.." && exec "${BPDBENCH:-.venv/bin/bpdbench}" sweep grids/peers.toml "$@"
