#!/usr/bin/env bash
# Seed corpora for the fuzz targets, from the repository's own files. Usage:
#   fuzz/make_corpus.sh OUT_DIR
# Writes OUT_DIR/experiment/ (every experiment YAML: experiments/**, tests/experiments/good and
# bad, tests/fuzz_regressions/experiment) and OUT_DIR/run_record/, OUT_DIR/results_db/ (the
# regression inputs of those targets plus a few byte patterns; FuzzedDataProvider inputs have
# no natural files).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: make_corpus.sh OUT_DIR}
mkdir -p "$out/experiment" "$out/run_record" "$out/results_db"
n=0
while IFS= read -r -d '' f; do
  cp "$f" "$out/experiment/$(echo "${f#"$src"/}" | tr '/' '_')"
  n=$((n + 1))
done < <(find "$src/experiments" "$src/tests/experiments" "$src/tests/fuzz_regressions/experiment" \
           -name '*.yaml' -print0 2>/dev/null)
for target in run_record results_db; do
  if [ -d "$src/tests/fuzz_regressions/$target" ]; then
    cp "$src/tests/fuzz_regressions/$target"/* "$out/$target/" 2>/dev/null || true
  fi
  head -c 256 /dev/zero >"$out/$target/zeros"
  head -c 256 /dev/zero | tr '\0' '\377' >"$out/$target/ones"
  printf '\001\002\003\004\005\006\007\010%.0s' {1..32} >"$out/$target/counting"
done
echo "seed corpus: $n experiment files in $out/experiment"
