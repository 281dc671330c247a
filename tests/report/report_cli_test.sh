#!/usr/bin/env bash
# `twinstep plot` and `twinstep report` on the quickstart database; the report rendered offline
# in headless Chromium with every image decoded.
# Usage: report_cli_test.sh TWINSTEP_BINARY SOURCE_DIR
# Exits 77 (ctest SKIP_RETURN_CODE) when gnuplot or chromium is not installed.
set -uo pipefail
bin=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAILED: $1"; }
check() { local what=$1; shift; if "$@"; then ok "$what"; else bad "$what"; fi; }

if ! command -v gnuplot >/dev/null; then
  echo "SKIP: gnuplot not installed (apt-get install gnuplot-nox); figures not tested"
  exit 77
fi
db=$work/q.db
"$bin" --db "$db" run -q "$src/experiments/quickstart.yaml" >/dev/null 2>&1 || { echo "FAILED: quickstart run"; exit 1; }

"$bin" --db "$db" plot -o "$work/figs" >"$work/plot.out" 2>"$work/plot.err"
check "plot exits 0" test $? -eq 0
for f in tpot_itl throughput_vs_tpot accept_length timeline; do
  check "plot wrote $f.png (a PNG)" bash -c "head -c 8 '$work/figs/$f.png' | od -An -c | grep -q 'P   N   G'"
done
check "sim_vs_measured skipped with a reason" grep -q "figure sim_vs_measured skipped: .*no measured" "$work/plot.err"
check "collective_waits skipped with a reason" grep -q "figure collective_waits skipped: .*multi-rank" "$work/plot.err"
check "no PNG for skipped figures" test ! -e "$work/figs/sim_vs_measured.png" -a ! -e "$work/figs/collective_waits.png"

"$bin" --db "$db" report -o "$work/report.html" >/dev/null 2>&1
check "report exits 0" test $? -eq 0
check "report embeds 4 figures" test "$(grep -o 'data:image/png;base64,' "$work/report.html" | wc -l)" = 4
check "report has the compare table" grep -q "<td>tpot_ms_mean</td>" "$work/report.html"
check "report references nothing external" bash -c "! grep -qE '(src|href)=\"(https?:|//)' '$work/report.html'"

chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$chromium" ]; then
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ] || exit 1
  echo "SKIP: chromium not installed (apt-get install chromium); the report was not rendered"
  exit 77
fi
profile=$(mktemp -d)
timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --disable-background-networking \
  --disable-component-update --disable-sync --no-first-run --user-data-dir="$profile" \
  --virtual-time-budget=5000 --dump-dom "file://$work/report.html" >"$work/dom.html" 2>"$work/chromium.err"
rm -rf "$profile"
marker=$(grep -o 'id="image-check"[^>]*' "$work/dom.html")
echo "chromium: $marker"
check "chromium rendered every image (4 of 4)" \
  bash -c "grep -q 'data-loaded=\"4\"' <<<'$marker' && grep -q 'data-total=\"4\"' <<<'$marker'"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
