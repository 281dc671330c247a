# Sourced by scripts/gpu_*.sh: sets `root` (the repository) and, when the machine lacks SQLite's
# header (the device image does), unpacks the libsqlite3-dev .deb kept in .device-deps/ and
# exports TWINSTEP_CMAKE_ARGS pointing CMake at it. A TWINSTEP_CMAKE_ARGS set by the caller wins.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps="$root/.device-deps/root"
if [ ! -f "$deps/usr/include/sqlite3.h" ] && compgen -G "$root/.device-deps/*.deb" >/dev/null; then
  for f in "$root"/.device-deps/*.deb; do dpkg -x "$f" "$deps"; done
fi
if [ -z "${TWINSTEP_CMAKE_ARGS:-}" ] && [ -f "$deps/usr/include/sqlite3.h" ]; then
  TWINSTEP_CMAKE_ARGS="-DSQLite3_INCLUDE_DIR=$deps/usr/include -DSQLite3_LIBRARY=$(ls "$deps"/usr/lib/*/libsqlite3.a | head -1)"
  export TWINSTEP_CMAKE_ARGS
fi

source "$root/scripts/gpu_commit.sh"  # gpu_check_commit

# gpu_build OUT TARGET...: configures `build` (Release, sm_90, TWINSTEP_CMAKE_ARGS) and builds
# the targets, logs in OUT/{configure,build}.log; on failure prints the errors and returns 1.
gpu_build() {
  local log=$1
  shift
  # Built already (scripts/gpu_session.sh builds everything first): concurrent stages must not
  # reconfigure the same build tree.
  [ "${TWINSTEP_PREBUILT:-0}" = 1 ] && return 0
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
    ${TWINSTEP_CMAKE_ARGS:-} >"$log/configure.log" 2>&1 ||
    { echo "configure failed"; tail -30 "$log/configure.log"; return 1; }
  cmake --build "$build" -j"$(nproc)" --target "$@" >"$log/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error" "$log/build.log" | head -40; return 1; }
}
