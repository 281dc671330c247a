#include "experiments/plot_gnuplot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "policies/error.h"

namespace twinstep {
namespace {

// Runs `command` through the shell; returns its exit status and combined output.
int run_capture(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw Error("cannot start: " + command);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) output->append(buf, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string find_gnuplot() {
  if (const char* env = std::getenv("TWINSTEP_GNUPLOT"); env && *env) {
    if (access(env, X_OK) == 0) return env;
    throw Error(std::string("TWINSTEP_GNUPLOT=") + env + " is not an executable");
  }
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/gnuplot";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  throw Error(
      "gnuplot not found: install gnuplot-nox (apt-get install gnuplot-nox) or set "
      "TWINSTEP_GNUPLOT to its path");
}

std::string png_terminal(const std::string& gnuplot, int width_px, int height_px) {
  static std::map<std::string, bool> has_cairo;  // probed once per gnuplot binary
  auto it = has_cairo.find(gnuplot);
  if (it == has_cairo.end()) {
    std::string out;
    const int rc = run_capture(shell_quote(gnuplot) + " -e 'set terminal pngcairo'", &out);
    it = has_cairo.emplace(gnuplot, rc == 0 && out.find("unknown") == std::string::npos).first;
  }
  const std::string size = std::to_string(width_px) + "," + std::to_string(height_px);
  if (it->second) {
    return "set terminal pngcairo size " + size + " font 'DejaVu Sans,13' linewidth 1.5";
  }
  return "set terminal png size " + size + " font 'DejaVuSans,12'";
}

void run_gnuplot(const std::string& gnuplot, const std::string& script_path) {
  std::string out;
  const int rc = run_capture(shell_quote(gnuplot) + " " + shell_quote(script_path), &out);
  if (rc != 0) {
    throw Error("gnuplot failed on " + script_path + " (exit " + std::to_string(rc) + "): " + out);
  }
}

std::string gp_quote(std::string_view text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') out += '\'';
    out += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return out + "'";
}

}  // namespace twinstep
