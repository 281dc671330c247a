#!/usr/bin/env bash
# Fails if any C++/CUDA source differs from the repository's .clang-format style.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null || find . -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh')
bad=()
for f in $files; do
  [ -f "$f" ] || continue
  clang-format --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  echo "format: these files differ from .clang-format (run clang-format -i):" >&2
  printf '  %s\n' "${bad[@]}" >&2
  exit 1
fi
echo "format: $(echo $files | wc -w) files ok"
