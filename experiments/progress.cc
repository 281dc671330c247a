#include "experiments/progress.h"

#include <unistd.h>

#include <cstdio>

namespace twinstep {

Progress::Progress(bool quiet)
    : quiet_(quiet),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_plain_(start_ - std::chrono::hours(1)) {}

void Progress::update(int64_t done, int64_t total, const std::string& what) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed_s = std::chrono::duration<double>(now - start_).count();
  const double rate = done > 0 ? double(done) / elapsed_s : 0;
  const double eta_s = rate > 0 ? double(total - done) / rate : 0;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K[%lld/%lld] %.1f/s eta %.0fs  %s", (long long)done,
                 (long long)total, rate, eta_s, what.c_str());
    line_open_ = true;
  } else if (done == total || now - last_plain_ >= std::chrono::seconds(5)) {
    std::fprintf(stderr, "twinstep: %lld/%lld done (%.1f/s, eta %.0f s) %s\n", (long long)done,
                 (long long)total, rate, eta_s, what.c_str());
    last_plain_ = now;
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (line_open_) std::fputc('\n', stderr);
  line_open_ = false;
}

void Progress::warn(const std::string& line) {
  finish();
  std::fprintf(stderr, "twinstep: %s\n", line.c_str());
}

void Progress::message(const std::string& line) {
  if (quiet_) return;
  finish();
  std::fprintf(stderr, "twinstep: %s\n", line.c_str());
}

}  // namespace twinstep
