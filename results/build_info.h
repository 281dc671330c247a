// Where a run was produced: the build (recorded at build time, not configure time, so a rebuild
// after a commit records the new sha) and the host.
#pragma once

#include <cstdint>
#include <string>

namespace twinstep {

struct BuildInfo {
  std::string git_sha;   // HEAD of the source tree at build time; "unknown" without git
  bool git_dirty;        // uncommitted changes (tracked or untracked, not ignored) at build time
  std::string compiler;  // "<CMAKE_CXX_COMPILER_ID> <__VERSION__>"
  std::string cuda_version;  // CUDA toolkit found at configure time, or "none"
  std::string nccl_version;  // from nccl.h found at configure time, or "none"
  std::string version;       // twinstep project version
};
const BuildInfo& build_info();

struct HostInfo {
  std::string hostname;
  std::string cpu_model;  // /proc/cpuinfo "model name"; "unknown" if unreadable
  int32_t cores;          // std::thread::hardware_concurrency()
  int64_t mem_bytes;      // /proc/meminfo MemTotal; 0 if unreadable
};
// Read once per process.
const HostInfo& host_info();

// The process running a run (run.owner): "<boot id>/<pid>/<start time>", the start time in clock
// ticks after boot as /proc/<pid>/stat field 22 gives it, so a reused pid is a different owner.
// "" where /proc lacks them (not Linux): such runs are never taken for live ones. Read at each
// call (a forked child is its own owner).
std::string this_process_owner();
// True when `owner` (this_process_owner()'s form) is a process alive now on this machine: the
// same boot, and /proc/<pid>/stat with the same start time. False for "", for a malformed owner
// and for another machine's (whose processes cannot be seen from here).
bool process_owner_alive(const std::string& owner);

}  // namespace twinstep
