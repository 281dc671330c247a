// Progress of a long run on stderr: a self-rewriting line on a terminal, plain periodic lines
// otherwise (logs, CI). Results never go here; they go to stdout.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace twinstep {

class Progress {
 public:
  // quiet: print nothing.
  explicit Progress(bool quiet);
  // `done` of `total` units finished; `what` names the current one.
  void update(int64_t done, int64_t total, const std::string& what);
  void finish();
  void message(const std::string& line);
  // A line the user must see even with progress turned off (a skipped backend).
  void warn(const std::string& line);

 private:
  bool quiet_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_line_;  // the last line printed
  bool line_open_ = false;
};

}  // namespace twinstep
