#!/usr/bin/env bash
# The speculative suite on the machine that calibrates it, in one call: scripts/gpu_spec_batches.sh
# (Llama-3-8B's speculative graphs at 8, 16, 32 requests, the refit) into OUT/cal, its profile
# installed as results/profiles/h200-calibrated.yaml in this checkout, then
# scripts/gpu_spec_suite.sh into OUT/suite against it.
#   scripts/gpu_spec_suite_recal.sh OUT_DIR
set -uo pipefail
out=${1:?usage: scripts/gpu_spec_suite_recal.sh OUT_DIR}
here=$(dirname "$0")
status=0
bash "$here/gpu_spec_batches.sh" "$out/cal" || status=1
cp "$out/cal/h200-calibrated.yaml" "$here/../results/profiles/h200-calibrated.yaml" || exit 1
TWINSTEP_PREBUILT=1 bash "$here/gpu_spec_suite.sh" "$out/suite" || status=1
exit $status
