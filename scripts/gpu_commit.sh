# Sourced by scripts/gpu_env.sh (and tests/cli/cli_test.sh, which checks it): no side effects.
# gpu_check_commit TWINSTEP_BINARY: with TWINSTEP_COMMIT set, checks that the binary was built as
# that commit (`twinstep --version`; results/build_info.cmake fixes the label at build time). A
# build made before TWINSTEP_COMMIT was exported takes the GPU machine's stale .git and labels
# every run and calibration session with another commit (sessions 27 and 28 relabelled theirs by
# SQL). Prints why and returns 1 on a mismatch.
gpu_check_commit() {
  [ -n "${TWINSTEP_COMMIT:-}" ] || return 0
  local version
  version=$("$1" --version 2>&1)
  case "$version" in
    *"(commit ${TWINSTEP_COMMIT};"*) return 0 ;;
  esac
  echo "$1 reports '$version', not commit $TWINSTEP_COMMIT: build with TWINSTEP_COMMIT exported"
  return 1
}
