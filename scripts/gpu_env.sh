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
