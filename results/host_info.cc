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

// Field 22 (starttime) of /proc/<pid>/stat; "" when unreadable. The command name (field 2) is in
// parentheses and may hold spaces, so fields are counted after its last ')'.
std::string proc_start_time(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return "";
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return "";
  std::istringstream rest(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {  // fields 3 (state) .. 22 (starttime)
    if (!(rest >> field)) return "";
  }
  return field;
}

std::string boot_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return id;
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

std::string this_process_owner() {
  const std::string pid = std::to_string(getpid());
  const std::string boot = boot_id();
  const std::string start = proc_start_time(pid);
  return boot.empty() || start.empty() ? std::string() : boot + "/" + pid + "/" + start;
}

bool process_owner_alive(const std::string& owner) {
  const size_t a = owner.find('/');
  const size_t b = a == std::string::npos ? a : owner.find('/', a + 1);
  if (b == std::string::npos) return false;
  const std::string boot = owner.substr(0, a);
  const std::string pid = owner.substr(a + 1, b - a - 1);
  const std::string start = owner.substr(b + 1);
  if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || start.empty())
    return false;
  const std::string here = boot_id();
  return !here.empty() && boot == here && proc_start_time(pid) == start;
}

}  // namespace twinstep
