#!/usr/bin/env bash
# Float32 certificates into results/certificates/<task>-<method>/: grids/certificates.toml (arguments go to sweep).
cd "$(dirname "$0")/.." && exec "${BPDBENCH:-.venv/bin/bpdbench}" sweep grids/certificates.toml "$@"
