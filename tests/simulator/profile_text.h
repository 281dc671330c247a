// Test helpers for calibration profile text: the loader's error for a text, and a text with one
// substring replaced (the substring must occur).
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "policies/calibration_profile.h"
#include "policies/error.h"

namespace twinstep::test {

inline std::string profile_error_of(const std::string& text) {
  try {
    parse_calibration_profile(text, "p.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

inline std::string replace_once(std::string s, const std::string& from, const std::string& to) {
  const size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? s : s.replace(at, from.size(), to);
}

}  // namespace twinstep::test
