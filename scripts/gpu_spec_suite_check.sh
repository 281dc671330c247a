#!/usr/bin/env bash
# The speculative suite against the committed profile, as it stands, on whatever H200 the call
# gets (docs/calibration.md "Speculative suite"): scripts/gpu_spec_suite.sh with the batch-1 trace
# (SPEC_SUITE_TRACE=1), everything it writes packed into OUT_DIR/suite.tar (one file: the device
# returns a few files per call).
#   scripts/gpu_spec_suite_check.sh OUT_DIR
set -uo pipefail
out=${1:?usage: scripts/gpu_spec_suite_check.sh OUT_DIR}
mkdir -p "$out"
status=0
SPEC_SUITE_TRACE=1 bash "$(dirname "$0")/gpu_spec_suite.sh" "$out/suite" || status=1
(cd "$out" && tar cf suite.tar suite && rm -rf suite) || status=1
exit $status
