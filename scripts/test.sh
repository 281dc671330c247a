#!/usr/bin/env bash
# The test command: set up and build, check formatting, run every test suite (GPU suites skip
# cleanly, GTEST_SKIP, where no GPU is present), then the CPU suites under ASan + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/check_format.sh
ctest --test-dir "${TWINSTEP_BUILD_DIR:-build}" --output-on-failure -j"$(nproc)"
# The CPU suites again under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/).
bash scripts/sanitize.sh
