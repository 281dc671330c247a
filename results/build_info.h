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

}  // namespace twinstep
