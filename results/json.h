// Small JSON/number text helpers shared by the results writers (no JSON dependency needed: we
// only ever write JSON).
#pragma once

#include <ostream>
#include <string>
#include <string_view>

namespace twinstep {

// Writes s as a JSON string literal: quotes, backslash and control characters escaped; other
// bytes (UTF-8) passed through.
void write_json_string(std::ostream& out, std::string_view s);
std::string json_quote(std::string_view s);

// Shortest text that parses back to the same double ("0.1", "1e+300"). Non-finite values give
// "nan", "inf", "-inf" (callers writing JSON map them to null).
std::string format_double_exact(double v);

// True if s is a JSON number literal (RFC 8259 grammar), e.g. "5", "-0.25", "1e9".
bool is_json_number(std::string_view s);

}  // namespace twinstep
