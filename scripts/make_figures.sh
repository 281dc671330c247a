#!/usr/bin/env bash
# Regenerates every committed figure under docs/figures/ (see docs/figures/README.md).
# Usage: scripts/make_figures.sh [BUILD_DIR]   (default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-build}/twinstep"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Simulated only: the quickstart (lockstep vs run-ahead, the host pin).
"$bin" --db "$work/q.db" run -q experiments/quickstart.yaml >/dev/null
mkdir -p docs/figures/quickstart
"$bin" --db "$work/q.db" plot --experiment quickstart -o docs/figures/quickstart

# Simulated beside measured: the H200 records imported as real runs of the same variants.
"$bin" --db "$work/m.db" run -q experiments/validation/h200_decode.yaml >/dev/null
"$bin" --db "$work/m.db" import results/h200/decode.json --as experiments/validation/h200_decode.yaml
"$bin" --db "$work/m.db" run -q experiments/validation/h200_concurrency.yaml >/dev/null
"$bin" --db "$work/m.db" import results/h200/decode_sweep.json \
  --as experiments/validation/h200_concurrency.yaml
mkdir -p docs/figures/h200-decode docs/figures/h200-concurrency
"$bin" --db "$work/m.db" plot --experiment validation-h200-decode -o docs/figures/h200-decode
"$bin" --db "$work/m.db" plot --experiment validation-h200-concurrency \
  -o docs/figures/h200-concurrency

# Eight ranks, one late host: skew absorbed in the other ranks' collectives.
"$bin" --db "$work/s.db" run -q experiments/seeds/tp8_host_skew.yaml >/dev/null
mkdir -p docs/figures/tp8-skew
"$bin" --db "$work/s.db" plot --experiment seed-tp8-host-skew -o docs/figures/tp8-skew
