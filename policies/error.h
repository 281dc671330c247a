// Typed errors for recoverable failures (bad configuration, files, database, no device).
// Thrown by library code, caught once at the CLI, printed as "twinstep: <what>".
// Internal invariants use assert, not these.
#pragma once

#include <stdexcept>
#include <string>

namespace twinstep {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A user-facing configuration problem. `where` is "file:line:column" when known.
class ConfigError : public Error {
 public:
  ConfigError(std::string where, const std::string& message)
      : Error(where.empty() ? message : where + ": " + message), where_(std::move(where)) {}
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

}  // namespace twinstep
