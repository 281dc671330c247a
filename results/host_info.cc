#include <unistd.h>

#include <climits>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "results/build_info.h"

namespace twinstep {
namespace {

// Value after the colon of the first line of `path` that starts with `key`, trimmed.
std::string proc_field(const char* path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const size_t begin = line.find_first_not_of(" \t", colon + 1);
    const size_t end = line.find_last_not_of(" \t\r");
    if (begin == std::string::npos) return "";
    return line.substr(begin, end - begin + 1);
  }
  return "";
}

HostInfo read_host_info() {
  HostInfo h{};
  char name[HOST_NAME_MAX + 1] = {};
  h.hostname = gethostname(name, sizeof name - 1) == 0 ? name : "unknown";
  h.cpu_model = proc_field("/proc/cpuinfo", "model name");
  if (h.cpu_model.empty()) h.cpu_model = "unknown";
  h.cores = static_cast<int32_t>(std::thread::hardware_concurrency());
  // "MemTotal:       131891804 kB"
  std::istringstream mem(proc_field("/proc/meminfo", "MemTotal"));
  int64_t kib = 0;
  mem >> kib;
  h.mem_bytes = kib * 1024;
  return h;
}

}  // namespace

const HostInfo& host_info() {
  static const HostInfo info = read_host_info();
  return info;
}

}  // namespace twinstep
