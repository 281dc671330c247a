#!/usr/bin/env bash
# Installs twinstep's build dependencies on Debian/Ubuntu (idempotent) and builds it into
# build/ (or $TWINSTEP_BUILD_DIR). CUDA parts are built when nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build pkg-config git libyaml-cpp-dev libsqlite3-dev
          libeigen3-dev libgtest-dev libcli11-dev clang-format sqlite3
          openmpi-bin libopenmpi-dev gnuplot-nox python3 xz-utils)
# Optional: headless Chromium renders the HTML report in a test, which skips without it (Ubuntu
# ships Chromium as a snap, not a .deb).
optional=(chromium)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
fi
for p in "${optional[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" && continue
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if apt-cache show "$p" >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "$p" ||
      echo "setup: optional package $p failed to install; its test will skip"
  else
    echo "setup: optional package $p is not available here; its test will skip"
  fi
done

build_dir="${TWINSTEP_BUILD_DIR:-build}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE="${TWINSTEP_BUILD_TYPE:-RelWithDebInfo}" \
  ${TWINSTEP_CMAKE_ARGS:-}
cmake --build "$build_dir" -j"$(nproc)"
echo "setup: built $build_dir/twinstep"
