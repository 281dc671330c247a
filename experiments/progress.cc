#include "experiments/progress.h"

#include <unistd.h>

#include <cstdio>

namespace twinstep {

Progress::Progress(bool quiet)
    : quiet_(quiet),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_line_(start_ - std::chrono::hours(1)) {}

void Progress::update(int64_t done, int64_t total, const std::string& what) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed_s = std::chrono::duration<double>(now - start_).count();
  const double rate = done > 0 ? double(done) / elapsed_s : 0;
  // No estimate before the first run has finished.
  char eta[32] = "?";
  if (rate > 0) std::snprintf(eta, sizeof eta, "%.0f", double(total - done) / rate);
  // A terminal line at most 10 times a second (a sweep of small runs updates thousands of
  // times), plain lines every 5 s; the last update always.
  const auto period = tty_ ? std::chrono::milliseconds(100) : std::chrono::milliseconds(5000);
  if (done != total && now - last_line_ < period) return;
  last_line_ = now;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K[%lld/%lld] %.1f/s eta %ss  %s", (long long)done,
                 (long long)total, rate, eta, what.c_str());
    line_open_ = true;
  } else {
    std::fprintf(stderr, "twinstep: %lld/%lld done (%.1f/s, eta %s s) %s\n", (long long)done,
                 (long long)total, rate, eta, what.c_str());
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
