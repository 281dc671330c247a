#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan, coverage for every library) into
# build-fuzz and runs one of them. Usage:
#   scripts/fuzz.sh [TARGET] [SECONDS]     TARGET: experiment | run_record | results_db |
#                                          safetensors | checkpoint | import |
#                                          calibration_profile
#   scripts/fuzz.sh build                  build only
# Corpora live in build-fuzz/corpus/TARGET (seeded by fuzz/make_corpus.sh from the repo's own
# files); crashes are written to build-fuzz/crashes/TARGET/. Every crash becomes a regression
# input under tests/fuzz_regressions/TARGET/, replayed by tests/reliability (ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${TWINSTEP_FUZZ_BUILD_DIR:-build-fuzz}
target=${1:-experiment}
seconds=${2:-600}

if [ ! -f "$build/build.ninja" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTWINSTEP_CUDA=OFF -DTWINSTEP_SANITIZE=ON -DTWINSTEP_FUZZ=ON -DTWINSTEP_TEST_SUITES= \
    -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link"
fi
targets=(fuzz_experiment fuzz_run_record fuzz_results_db fuzz_safetensors fuzz_checkpoint fuzz_import
  fuzz_calibration_profile)
[ "$target" = build ] || targets=("fuzz_$target")
cmake --build "$build" -j"${TWINSTEP_JOBS:-2}" --target "${targets[@]}"
[ "$target" = build ] && exit 0

# Seeds per target run: two fuzzers may start at once.
seeds="$build/seeds.$target"
rm -rf "$seeds"
bash fuzz/make_corpus.sh "$seeds" >/dev/null
mkdir -p "$build/corpus/$target" "$build/crashes/$target"
# -rss_limit_mb / -timeout: an input that makes the loader allocate gigabytes or run for long is
# a finding too. The YAML target gets more: a legal sweep of 1e6 variants takes ~4 GB and about a
# minute under ASan.
limits=(-timeout=30 -rss_limit_mb=2048)
[ "$target" = experiment ] && limits=(-timeout=120 -rss_limit_mb=8192)
exec "$build/fuzz/fuzz_$target" "$build/corpus/$target" "$seeds/$target" \
  -max_total_time="$seconds" "${limits[@]}" -print_final_stats=1 \
  -artifact_prefix="$build/crashes/$target/"
