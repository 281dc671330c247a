// Helpers shared by the fuzz targets: an invariant check that aborts (so libFuzzer records the
// input as a crash) and a private scratch directory for targets whose code under test reads
// files by path.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

namespace twinstep::fuzz {

// Aborts with "<target>: invariant violated: <what>" when !ok.
inline void require(bool ok, const char* target, const std::string& what) {
  if (!ok) {
    std::fprintf(stderr, "%s: invariant violated: %s\n", target, what.c_str());
    std::abort();
  }
}

// A directory under $TMPDIR (or /tmp) private to this process, created on first use and emptied
// by reset(); removed at exit. Inputs that the code under test opens by path are written here.
class ScratchDir {
 public:
  explicit ScratchDir(const char* target) {
    const char* tmp = std::getenv("TMPDIR");
    path_ = std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
            (std::string(target) + "." + std::to_string(::getpid()));
    reset();
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  void reset() {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  // Writes `bytes` to <dir>/<name> and returns the full path.
  std::string write(const std::string& name, std::string_view bytes) const {
    const std::string p = (path_ / name).string();
    std::ofstream out(p, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.close();
    if (!out) {
      std::fprintf(stderr, "fuzz: cannot write scratch file %s\n", p.c_str());
      std::abort();
    }
    return p;
  }
  std::string path() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace twinstep::fuzz
